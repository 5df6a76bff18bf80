"""bert_tf.cli: shared flags take their choices from the library; only the project's own
configuration errors become one-line messages."""
import pytest
from absl import flags

from bert_tf import ConfigError, cli
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


def test_shared_flags_take_their_choices_and_defaults_from_the_library():
    values = flags.FlagValues()
    cli.define_model_preset("base", flag_values=values)
    cli.define_input_format(flag_values=values)
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
