"""bert_tf.cli: shared flags take their choices from the library; only the project's own
configuration errors become one-line messages."""
import dataclasses

import pytest
from absl import flags

from bert_tf import ConfigError, cli, knob, knobs
from bert_tf.data import corpus
from bert_tf.model import modeling
from bert_tf.parallel.comm import CommConfig


def test_a_configuration_error_becomes_one_line_and_exit_status_1():
    def main(argv):
        raise ConfigError("--batch_size must be >= 1, got 0")
    with pytest.raises(SystemExit) as exit_:
        cli.one_line_errors(main)(["prog"])
    assert exit_.value.code == "error: --batch_size must be >= 1, got 0"      # sys.exit(str): status 1


@pytest.mark.parametrize("error", [ValueError("a TensorFlow shape error"), FileNotFoundError("x"), KeyError("k")])
def test_any_other_error_propagates_with_its_traceback(error):
    def main(argv):
        raise error
    with pytest.raises(type(error)) as raised:
        cli.one_line_errors(main)(["prog"])
    assert raised.value is error and raised.value.__traceback__ is not None


@dataclasses.dataclass(frozen=True)
class _Shared:
    model_preset: str = knobs.model_preset("base")
    reading: knobs.CorpusFormat = knobs.CorpusFormat()


def test_shared_flags_take_their_choices_and_defaults_from_the_library():
    values = flags.FlagValues()
    cli.define_config_flags(_Shared, flag_values=values)
    cli.define_comm(CommConfig(fp16_allreduce=True), flag_values=values)
    values(["prog", "--fusion_threshold_mb=0", "--allreduce_every_micro_batch"])
    assert values["model_preset"].parser.enum_values == list(modeling.PRESET_NAMES)
    assert values["input_format"].parser.enum_values == ["auto", *corpus.FORMATS]
    assert cli.comm_config(values) == CommConfig(fp16_allreduce=True, allreduce_every_micro_batch=True,
                                                 fusion_threshold_mb=0.0)


def test_comm_config_round_trips_through_its_flags():
    for comm in (CommConfig(), CommConfig(True, True, 16.0, 5.0), CommConfig(fp16_allreduce=True).resolved()):
        values = flags.FlagValues()
        cli.define_comm(flag_values=values)
        values(["prog", *comm.as_flags()])
        assert cli.comm_config(values) == comm


@dataclasses.dataclass(frozen=True)
class _Script:
    corpus: knobs.CorpusInput = knobs.CorpusInput()
    sequence: knobs.Sequence = knobs.Sequence(max_seq_length=384)
    ranks: list[int] = knob([16, 64], "Rank counts.")
    method: list[str] = knob(["none"], "Methods.", choices=["none", "fp16"])
    extra: list[str] = knob([], "Repeatable.", multi=True)
    vocab_file: str | None = knobs.vocab_file(required=True)


def test_a_config_of_groups_round_trips_through_its_flags_with_the_scripts_defaults():
    values = flags.FlagValues()
    cli.define_config_flags(_Script, flag_values=values)
    values(["prog", "--vocab_file=v.txt", "--input_files=a.txt,b@documents", "--input_format=jsonl",
            "--ranks=2,4", "--extra=x", "--extra=y"])
    cfg = cli.config_from_flags(_Script, values)
    assert cfg == _Script(corpus=knobs.CorpusInput(input_files=["a.txt", "b@documents"],
                                                   reading=knobs.CorpusFormat(input_format="jsonl")),
                          ranks=[2, 4], extra=["x", "y"], vocab_file="v.txt")
    assert cfg.sequence.max_seq_length == 384 and values["max_seq_length"].default == 384


@pytest.mark.parametrize("argv, message", [
    (["--ranks=2,x"], "--ranks=2,x: each value must be a int"),
    (["--method=none,bf16"], "--method=none,bf16: each value must be one of none, fp16"),
])
def test_a_list_flag_of_the_wrong_type_or_choice_names_the_flag(argv, message):
    values = flags.FlagValues()
    cli.define_config_flags(_Script, flag_values=values)
    values(["prog", "--vocab_file=v.txt", *argv])
    with pytest.raises(ConfigError, match=message):
        cli.config_from_flags(_Script, values)


def test_a_required_knob_is_a_required_flag():
    values = flags.FlagValues()
    cli.define_config_flags(_Script, flag_values=values)
    with pytest.raises(flags.IllegalFlagValueError, match="vocab_file"):
        values(["prog"])
        values.validate_all_flags()


_COLLECT = r'''
import importlib.util, json, pathlib, sys
from absl import flags
base, seen = set(flags.FLAGS), {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("script_" + pathlib.Path(path).stem, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    for name in sorted(set(flags.FLAGS) - base):
        flag = flags.FLAGS[name]
        if not flag.help.startswith("Deprecated: the old name of"):      # an alias kept for one release
            seen.setdefault(name, []).append([pathlib.Path(path).name, type(flag.parser).__name__, flag.help])
        delattr(flags.FLAGS, name)
print(json.dumps(seen))
'''


def test_no_run_script_defines_a_flag_by_hand_and_a_flag_name_has_one_type_and_meaning_everywhere():
    """Every run/ script's flags come from config dataclasses (bert_tf.knob); a name two scripts share has the
    same parser (type) in both, and the names bert_tf/knobs.py fixes (corpus, records, vocabulary, folders and
    files written, epochs) the same meaning: their help says it before any detail of the script's."""
    import json
    import subprocess
    import sys

    from conftest import REPO
    scripts = sorted((REPO / "run").glob("*.py"))
    by_hand = [p.name for p in scripts if "DEFINE" in p.read_text() or "mark_flag" in p.read_text()]
    assert not by_hand, by_hand
    out = subprocess.run([sys.executable, "-c", _COLLECT, *map(str, scripts)], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) > 100                                  # the scripts' flags were collected
    types = {name: uses for name, uses in seen.items() if len({t for _, t, _ in uses}) > 1}
    assert not types, json.dumps(types, indent=1)
    # the names the knobs module fixes: one meaning, the help's words before any script-specific detail
    meaning = {name: uses for name, uses in seen.items() if name in knobs.FIXED_MEANINGS
               and len({h.split(":")[0] for _, _, h in uses}) > 1}
    assert not meaning, json.dumps(meaning, indent=1)
    assert set(knobs.FIXED_MEANINGS) <= set(seen)
