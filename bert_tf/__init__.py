"""bert_tf: BERT pre-training on ordinary clusters (TensorFlow 2 + Horovod)."""

__version__ = "0.1.0"


class ConfigError(ValueError):
    """A flag, file or value the user gave cannot work; the message names it.

    run/ scripts print these as one line (bert_tf.cli.run); any other exception keeps its
    traceback, because it is a bug or an environment problem, not a wrong input."""
