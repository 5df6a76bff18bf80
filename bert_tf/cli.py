"""What the run/ scripts share: flag definitions for knobs several scripts take (one name,
one meaning, one help text everywhere; choices taken from the library), flags generated from a
config dataclass's fields (`define_config_flags`: each field made with bert_tf.knob carries its
default, help and choices), renamed flags that keep working for one release (`define_renamed`),
and the start-up that turns the project's own configuration errors into one-line messages.

    from bert_tf import cli
    cli.define_config_flags(PretrainConfig)
    cli.define_renamed("batch_size", "micro_batch_size")
    ...
    if __name__ == "__main__":
        cli.run(main)
"""
from __future__ import annotations

import dataclasses
import functools
import sys

from absl import app, flags

from bert_tf import ConfigError
from bert_tf.data import corpus
from bert_tf.parallel import comm

FLAGS = flags.FLAGS


def define_model_preset(default, flag_values=FLAGS):
    from bert_tf.model.config import PRESET_NAMES
    flags.DEFINE_enum("model_preset", default, list(PRESET_NAMES),
                      "Standard model size (google-research/bert and Turc et al. 2019).", flag_values=flag_values)


def define_input_format(flag_values=FLAGS):
    flags.DEFINE_enum("input_format", "auto", ["auto", *corpus.FORMATS],
                      "sentences: one per line, blank line between documents (google); documents: one per "
                      "line; mediawiki: XML dump; wikiextractor: WikiExtractor's <doc> files (a folder of AA/wiki_00 ...); "
                      "jsonl: JSON lines, the text in --text_field; parquet: a row "
                      "per document (Hugging Face datasets' shards); arrow: a datasets.save_to_disk folder; "
                      "auto: parquet for *.parquet, arrow for a folder with state.json, mediawiki if the file "
                      "starts with <mediawiki>, wikiextractor if it starts with <doc id=, jsonl if it starts with { "
                      "or is named *.jsonl/*.json, else sentences. PATH@FORMAT in --input_files gives one file its "
                      "own format.",
                      flag_values=flag_values)
    flags.DEFINE_string("text_field", "text", "JSON lines, Parquet, Arrow: the field that holds a document's text.",
                        flag_values=flag_values)
    flags.DEFINE_string("title_field", "", "Parquet, Arrow: a column whose value becomes each document's first "
                        "sentence (e.g. title for wikimedia/wikipedia); wikiextractor: a <doc> attribute (title, id, "
                        "url); empty: none.", flag_values=flag_values)


def define_corpus_input(flag_values=FLAGS):
    """A corpus to read (run/learn_vocab.py, run/create_pretraining_data.py): files, format,
    casing, and the seeded document-level held-out split both scripts make the same way."""
    flags.DEFINE_list("input_files", None, "Corpus files or globs (comma-separated); .gz/.bz2/.zst read transparently. "
                      "PATH@FORMAT gives one file its own format, e.g. news.txt@documents.", flag_values=flag_values)
    define_input_format(flag_values)
    flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents.", flag_values=flag_values)
    flags.DEFINE_float("heldout_fraction", 0.05, "Fraction of documents held out (evaluation records; the "
                       "vocabulary's UNK-rate measurement).", flag_values=flag_values)
    flags.DEFINE_integer("random_seed", 12345, "Seed of the held-out split (and of instance creation).",
                         flag_values=flag_values)


def define_finetune_start(flag_values=FLAGS):
    """Where a fine-tuning run starts (run/glue.py, run/squad.py): an encoder checkpoint in any format,
    or random weights for the baseline; the vocabulary it was trained with. finetune_start() reads them."""
    flags.DEFINE_string("init_checkpoint", "", "Encoder weights: a pre-training run (its latest checkpoint), an "
                        "export, google-research/bert's bert_model.ckpt or a Hugging Face directory.",
                        flag_values=flag_values)
    flags.DEFINE_bool("random_init", False, "Randomly initialised encoder (the baseline); needs --bert_config_file.",
                      flag_values=flag_values)
    flags.DEFINE_string("bert_config_file", "", "Model config; default: the checkpoint's own.", flag_values=flag_values)
    flags.DEFINE_string("vocab_file", None, "The vocab.txt the encoder was pre-trained with.", flag_values=flag_values)
    flags.DEFINE_bool("do_lower_case", True, "Tokeniser lower-cases.", flag_values=flag_values)


def finetune_start(max_seq_length, flag_values=FLAGS):
    """(tokenizer, read checkpoint or None, model config) from define_finetune_start's flags, checked
    against each other (vocabulary size, sequence length) before any training."""
    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.data import tokenization
    from bert_tf.model import modeling
    f = flag_values
    tokenizer = tokenization.Tokenizer.from_file(f.vocab_file, f.do_lower_case)
    init = None
    if f.random_init:
        if not f.bert_config_file:
            raise ConfigError("--random_init needs --bert_config_file")
    elif f.init_checkpoint:
        init = checkpoint_formats.read(f.init_checkpoint)
    else:
        raise ConfigError("give --init_checkpoint, or --random_init for the baseline")
    config = modeling.BertConfig.from_json_file(f.bert_config_file) if f.bert_config_file else init.config
    if config is None:
        raise ConfigError(f"{init.path} has no model config beside it: give --bert_config_file")
    if init is not None:
        checkpoint_formats.check_fits(init, config, len(tokenizer), f.vocab_file, max_seq_length)
    return tokenizer, init, config


def define_sequence(max_seq_length=128, max_predictions_per_seq=20, flag_values=FLAGS):
    flags.DEFINE_integer("max_seq_length", max_seq_length, "Tokens per sequence, with [CLS] and [SEP]s.",
                         flag_values=flag_values)
    flags.DEFINE_integer("max_predictions_per_seq", max_predictions_per_seq, "Masked positions per sequence.",
                         flag_values=flag_values)


def define_comm(defaults: comm.CommConfig = comm.CommConfig(), flag_values=FLAGS):
    """The fields of comm.CommConfig, one flag each (defaults: this script's); read them back with comm_config()."""
    define_config_flags(comm.CommConfig, flag_values, defaults=defaults)


def comm_config(flag_values=FLAGS) -> comm.CommConfig:
    return comm.CommConfig(**{name: flag_values[name].value for name in comm.CommConfig.__dataclass_fields__})


_DEFINE = {"bool": flags.DEFINE_bool, "int": flags.DEFINE_integer, "float": flags.DEFINE_float,
           "float | None": flags.DEFINE_float, "str": flags.DEFINE_string}


def define_config_flags(cls, flag_values=FLAGS, defaults=None, skip=()):
    """One flag per field of the config dataclass `cls`, named as the field, with its type, default (or
    `defaults`' value), help and choices (bert_tf.knob). A field holding a CommConfig becomes
    define_comm's flags. Read them back with config_from_flags."""
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.type == "CommConfig":
            define_comm(flag_values=flag_values)
            continue
        if "help" not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} has no help text: declare it with bert_tf.knob")
        default = getattr(defaults, field.name) if defaults is not None else field.default
        help_text, choices = field.metadata["help"], field.metadata["choices"]
        if choices:
            flags.DEFINE_enum(field.name, default, list(choices), help_text, flag_values=flag_values)
        else:
            _DEFINE[field.type](field.name, default, help_text, flag_values=flag_values)


def config_from_flags(cls, flag_values=FLAGS, skip=()):
    """An instance of `cls` (which checks its values) from define_config_flags' flags."""
    values = {f.name: (comm_config(flag_values) if f.type == "CommConfig" else flag_values[f.name].value)
              for f in dataclasses.fields(cls) if f.name not in skip}
    return cls(**values)


_RENAMED = []   # (old name, new name, flag values)


def define_renamed(old, new, flag_values=FLAGS):
    """--old, the name --new had until this release: it keeps working for one release, with a
    warning naming --new; giving both is a start-up error naming both (apply_renamed)."""
    target = flag_values[new]
    flags.DEFINE(target.parser, old, None, f"Deprecated: the old name of --{new}; use --{new}.",
                 flag_values=flag_values, serializer=target.serializer)
    _RENAMED.append((old, new, flag_values))


def apply_renamed(warn=None):
    """Moves each renamed flag's value to its new name (a warning each); both given: ConfigError."""
    warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))
    for old, new, flag_values in _RENAMED:
        if not flag_values[old].present:
            continue
        if flag_values[new].present:
            raise ConfigError(f"--{old} and --{new} both given: --{old} is the old name of --{new} "
                              f"(deprecated); keep --{new} only")
        warn(f"warning: --{old} is deprecated and goes in the next release: use --{new} "
             f"({flag_values[new].help.split('.')[0]})")
        flag_values[new].value = flag_values[old].value


def one_line_errors(main):
    """main, with a ConfigError turned into `error: <message>` and exit status 1. Every other
    exception propagates with its traceback."""
    @functools.wraps(main)
    def wrapped(argv):
        try:
            apply_renamed()
            return main(argv)
        except ConfigError as e:
            sys.exit(f"error: {e}")
    return wrapped


def run(main):
    """absl's app.run(main) with one_line_errors."""
    app.run(one_line_errors(main))
