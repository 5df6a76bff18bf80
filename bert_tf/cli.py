"""What the run/ scripts share: flags generated from config dataclasses (`define_config_flags`: each
field made with bert_tf.knob carries its default, help and choices; a field holding another config
is a group of flags, e.g. bert_tf.knobs.CorpusInput), renamed flags that keep working for one
release (`define_renamed`; a bool flag that stood for another's value: `define_synonym`), and the
start-up that turns the project's own configuration errors into one-line messages. No run/ script
defines a flag by hand.

    from bert_tf import cli
    cli.define_config_flags(PretrainConfig)
    cli.define_renamed("batch_size", "micro_batch_size")
    ...
    def main(argv):
        cfg = cli.config_from_flags(PretrainConfig)
    if __name__ == "__main__":
        cli.run(main)
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any, TypeVar

from absl import app, flags

from bert_tf import ConfigError
from bert_tf.parallel import comm

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from bert_tf import knobs
    from bert_tf.artifacts.checkpoint_formats import Checkpoint
    from bert_tf.data.tokenization import Tokenizer
    from bert_tf.model.modeling import BertConfig

FLAGS = flags.FLAGS
T = TypeVar("T")
C = TypeVar("C", bound="DataclassInstance")  # a config dataclass


def finetune_start(
    start: knobs.FinetuneStart, max_seq_length: int | None
) -> tuple[Tokenizer, Checkpoint | None, BertConfig]:
    """(tokenizer, read checkpoint or None, model config) from a knobs.FinetuneStart, checked
    against each other (vocabulary size, sequence length) before any training."""
    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.data import tokenization
    from bert_tf.model import modeling

    tokenizer = tokenization.Tokenizer.from_file(start.vocab_file, start.do_lower_case)
    if start.random_init:
        if not start.bert_config_file:
            raise ConfigError("--random_init needs --bert_config_file")
        return tokenizer, None, modeling.BertConfig.from_json_file(start.bert_config_file)
    if not start.init_checkpoint:
        raise ConfigError("give --init_checkpoint, or --random_init for the baseline")
    init = checkpoint_formats.read(start.init_checkpoint)
    config = (
        modeling.BertConfig.from_json_file(start.bert_config_file)
        if start.bert_config_file
        else init.config
    )
    if config is None:
        raise ConfigError(f"{init.path} has no model config beside it: give --bert_config_file")
    checkpoint_formats.check_fits(
        init, config, len(tokenizer), start.vocab_file or "", max_seq_length
    )
    return tokenizer, init, config


def define_comm(
    defaults: comm.CommConfig = comm.CommConfig(), flag_values: flags.FlagValues = FLAGS
) -> None:
    """The fields of comm.CommConfig, one flag each (defaults: this script's); read them back with
    comm_config()."""
    define_config_flags(comm.CommConfig, flag_values, defaults=defaults)


def comm_config(flag_values: flags.FlagValues = FLAGS) -> comm.CommConfig:
    return config_from_flags(comm.CommConfig, flag_values)


def _flag_kind(hint: Any) -> tuple[str, type]:
    """(kind, item type) of a field's annotation: kind in bool, int, float, str, list; None-able
    scalars allowed."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]  # X | None: a flag of X whose default is None
    if typing.get_origin(hint) is list:
        return "list", typing.get_args(hint)[0]
    if hint in (bool, int, float, str):
        return hint.__name__, hint
    raise TypeError(f"no flag type for {hint}")


_DEFINE: dict[str, Callable[..., Any]] = {
    "bool": flags.DEFINE_bool,
    "int": flags.DEFINE_integer,
    "float": flags.DEFINE_float,
    "str": flags.DEFINE_string,
}


def define_config_flags(
    cls: type[DataclassInstance],
    flag_values: flags.FlagValues = FLAGS,
    defaults: Any = None,
    skip: Container[str] = (),
) -> None:
    """One flag per field of the config dataclass `cls`, named as the field, with its type, default
    (or `defaults`' value), help and choices (bert_tf.knob). A field holding another config
    dataclass (a group: CommConfig, CorpusInput, ...) gives that group's flags under their own
    names. Read them back with config_from_flags."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        default: Any = (
            getattr(defaults, field.name)
            if defaults is not None
            else field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        if dataclasses.is_dataclass(hints[field.name]):
            define_config_flags(hints[field.name], flag_values, defaults=default)
            continue
        if "help" not in field.metadata:
            raise TypeError(
                f"{cls.__name__}.{field.name} has no help text: declare it with bert_tf.knob"
            )
        meta = field.metadata
        kind, item = _flag_kind(hints[field.name])
        if kind == "list":
            define = flags.DEFINE_multi_string if meta["multi"] else flags.DEFINE_list
            define(
                field.name,
                None if default is None else [str(v) for v in default],
                meta["help"],
                flag_values=flag_values,
            )
        elif meta["choices"]:
            flags.DEFINE_enum(
                field.name, default, list(meta["choices"]), meta["help"], flag_values=flag_values
            )
        else:
            _DEFINE[kind](field.name, default, meta["help"], flag_values=flag_values)
        if meta["required"]:
            flags.mark_flag_as_required(field.name, flag_values=flag_values)


def _flag_value(field: dataclasses.Field, hint: Any, flag_values: flags.FlagValues) -> Any:
    value = flag_values[field.name].value
    kind, item = _flag_kind(hint)
    if kind != "list" or value is None:
        return value
    try:
        items = [item(v) for v in value]
    except ValueError as e:
        raise ConfigError(
            f"--{field.name}={','.join(value)}: each value must be a {item.__name__} ({e})"
        ) from None
    choices = field.metadata["choices"]
    if choices and any(v not in choices for v in items):
        raise ConfigError(
            f"--{field.name}={','.join(value)}: each value must be one of {', '.join(choices)}"
        )
    return items


def config_from_flags(
    cls: type[C], flag_values: flags.FlagValues = FLAGS, skip: Container[str] = ()
) -> C:
    """An instance of `cls` (which checks its values) from define_config_flags' flags."""
    hints = typing.get_type_hints(cls)
    values = {
        f.name: (
            config_from_flags(hints[f.name], flag_values)
            if dataclasses.is_dataclass(hints[f.name])
            else _flag_value(f, hints[f.name], flag_values)
        )
        for f in dataclasses.fields(cls)
        if f.name not in skip
    }
    return cls(**values)


_RENAMED = []  # (old name, new name, flag values)


def define_renamed(old: str, new: str, flag_values: flags.FlagValues = FLAGS) -> None:
    """--old, the name --new had until this release: it keeps working for one release, with a
    warning naming --new; giving both is a start-up error naming both (apply_renamed)."""
    target = flag_values[new]
    flags.DEFINE(
        target.parser,
        old,
        None,
        f"Deprecated: the old name of --{new}; use --{new}.",
        flag_values=flag_values,
        serializer=target.serializer,
    )
    _RENAMED.append((old, new, flag_values))


_SYNONYMS = []  # (old bool flag, new name, the value the old flag stands for, flag values)


def define_synonym(old: str, new: str, value: str, flag_values: flags.FlagValues = FLAGS) -> None:
    """--old, a bool flag (already defined) that meant --new=value until this release: it keeps
    working for one release, with a warning naming --new=value, and sets --new to value when --new
    is not given (apply_renamed)."""
    if old not in flag_values or new not in flag_values:
        raise KeyError(f"define --{old} and --{new} first")
    _SYNONYMS.append((old, new, value, flag_values))


def apply_renamed(warn: Callable[[str], object] | None = None) -> None:
    """Moves each renamed flag's value to its new name (a warning each); both given: ConfigError.
    Then each synonym given (define_synonym): a warning, and its value to the new name unless that
    is given."""
    warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))
    for old, new, flag_values in _RENAMED:
        if not flag_values[old].present:
            continue
        if flag_values[new].present:
            raise ConfigError(
                f"--{old} and --{new} both given: --{old} is the old name of --{new} (deprecated); "
                f"keep --{new} only"
            )
        warn(
            f"warning: --{old} is deprecated and goes in the next release: use --{new} "
            f"({flag_values[new].help.split('.')[0]})"
        )
        flag_values[new].value = flag_values[old].value
    for old, new, value, flag_values in _SYNONYMS:
        if not (flag_values[old].present and flag_values[old].value):
            continue
        warn(f"warning: --{old} is deprecated and goes in the next release: use --{new}={value}")
        if not flag_values[new].present and not any(
            flag_values[o].present for o, n, v in _RENAMED if n == new and v is flag_values
        ):
            flag_values[
                new
            ].value = value  # given too: the config's own check says whether they agree


def one_line_errors(main: Callable[[list[str]], T]) -> Callable[[list[str]], T]:
    """main, with a ConfigError turned into `error: <message>` and exit status 1. Every other
    exception propagates with its traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str]) -> T:
        try:
            apply_renamed()
            return main(argv)
        except ConfigError as e:
            sys.exit(f"error: {e}")

    return wrapped


def run(main: Callable[[list[str]], Any]) -> None:
    """absl's app.run(main) with one_line_errors."""
    app.run(one_line_errors(main))
