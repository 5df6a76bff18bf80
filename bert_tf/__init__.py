"""bert_tf: BERT pre-training on ordinary clusters (TensorFlow 2 + Horovod)."""

__version__ = "0.1.0"

from bert_tf import quiet_cuda  # noqa: E402  (before anything imports TensorFlow: no CUDA probe noise on CPUs)

quiet_cuda.install()


class ConfigError(ValueError):
    """A flag, file or value the user gave cannot work; the message names it.

    run/ scripts print these as one line (bert_tf.cli.run); any other exception keeps its
    traceback, because it is a bug or an environment problem, not a wrong input."""


def sha256(path) -> str:
    """The SHA-256 of a file, read a MiB at a time (data shards' and checkpoints' checksums)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def knob(default, help, choices=None, required=False, multi=False):
    """A config dataclass field that is also a flag: its default, help text and (for an enum)
    choices in one place. bert_tf.cli.define_config_flags turns every such field into a flag of that
    name. required: the flag must be given (its default is None); multi: a repeatable flag (a list,
    one per use)."""
    import dataclasses

    meta = {
        "help": help,
        "choices": tuple(choices) if choices else None,
        "required": required,
        "multi": multi,
    }
    if isinstance(default, list):  # a list flag's default: each config its own copy
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
