"""A model's hyper-parameters (`BertConfig`, google's bert_config.json plus the modern fields) and
the named sizes (presets) of both architectures: "bert" (google-research/bert, model/modeling.py)
and "modern" (ModernBERT's, model/modern.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from bert_tf import ConfigError

# hidden_act values (modeling.ACTIVATIONS implements them).
ACTIVATION_NAMES = ("gelu", "gelu_exact", "relu", "tanh")

# (layers, hidden) of the standard sizes: google-research/bert and Turc et al. 2019.
# heads = hidden / 64, intermediate = 4 * hidden.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}
# The modern family (model/modern.py): ModernBERT-base's and -large's shapes (Warner et al. 2024,
# table 3: 22 x 768 with a GeGLU of 1152, 28 x 1024 with 2624) and, below them, the classic small
# sizes with ModernBERT's 1.5 x hidden GeGLU width; modern-mini-matched's GeGLU of 683
# (8/3 x hidden) gives it BERT-mini's parameters and FLOPs per layer (3 H I = 8 H^2), the
# recipe race's size-matched arm. (layers, hidden, intermediate)
MODERN_PRESETS = {
    "modern-tiny": (2, 128, 192),
    "modern-mini": (4, 256, 384),
    "modern-mini-matched": (4, 256, 683),
    "modern-small": (4, 512, 768),
    "modern-base": (22, 768, 1152),
    "modern-large": (28, 1024, 2624),
}
# What a modern preset sets besides the shape: ModernBERT's released config (no dropout, exact GELU,
# LayerNorm eps 1e-5, a global layer every third, a 128-token window, RoPE theta 160k global / 10k
# local).
MODERN_DEFAULTS = dict(
    architecture="modern",
    hidden_act="gelu_exact",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    layer_norm_eps=1e-5,
    global_attn_every_n_layers=3,
    local_attention=128,
    max_position_embeddings=8192,
)
ARCHITECTURES = ("bert", "modern")
# classifier_pooling: what the modern pooler reads, [CLS] or the masked mean of the sequence output
# (transformers' ModernBertConfig.classifier_pooling)
POOLINGS = ("cls", "mean")
PRESET_NAMES = (*PRESETS, *MODERN_PRESETS)
# --recompute: keep every activation, or recompute each layer's in the backward pass (its input
# kept)
RECOMPUTE = ("none", "layer")


@dataclasses.dataclass
class BertConfig:
    """Hyper-parameters of a BERT model; reads and writes google's `bert_config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    # architecture "modern" (model/modern.py) reads the fields below; "bert" only layer_norm_eps.
    # A classic config leaves them out of its JSON (to_dict), so google's bert_config.json is
    # unchanged.
    architecture: str = "bert"
    layer_norm_eps: float = 1e-12
    global_attn_every_n_layers: int = (
        1  # layer i attends globally when i % n == 0, else in the window
    )
    local_attention: int = 128  # the window: keys within local_attention // 2 of the query
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    # the pooler's input: "cls" (the [CLS] token) or "mean" (the mean over the input mask; modern
    # only: the classic pooler is google's tanh dense on [CLS])
    classifier_pooling: str = "cls"

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size ({self.hidden_size}) is not divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(
                    f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}"
                )
        if self.hidden_act not in ACTIVATION_NAMES:
            raise ConfigError(
                f"BertConfig.hidden_act {self.hidden_act!r} is not one of "
                f"{sorted(ACTIVATION_NAMES)}"
            )
        if self.initializer_range <= 0:
            raise ConfigError(
                f"BertConfig.initializer_range must be positive, got {self.initializer_range!r}"
            )
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"BertConfig.architecture {self.architecture!r} is not one of "
                f"{', '.join(ARCHITECTURES)}"
            )
        if self.classifier_pooling not in POOLINGS:
            raise ConfigError(
                f"BertConfig.classifier_pooling {self.classifier_pooling!r} is not one of "
                f"{', '.join(POOLINGS)}"
            )
        if self.architecture == "modern":
            self._check_modern()
        elif self.classifier_pooling != "cls":
            raise ConfigError(
                f"BertConfig.classifier_pooling {self.classifier_pooling!r} needs "
                "architecture='modern': the classic encoder's pooler is google's tanh dense on "
                "[CLS] only"
            )

    def _check_modern(self):
        head = self.hidden_size // self.num_attention_heads
        if head % 2:
            raise ConfigError(
                f"BertConfig: RoPE rotates pairs of dimensions and needs an even head size; "
                f"hidden_size / num_attention_heads = {self.hidden_size} / "
                f"{self.num_attention_heads} = {head}"
            )
        for name in ("global_attn_every_n_layers", "local_attention"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        for name in ("global_rope_theta", "local_rope_theta", "layer_norm_eps"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"BertConfig.{name} must be positive, got {getattr(self, name)!r}"
                )

    @property
    def modern(self) -> bool:
        return self.architecture == "modern"

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        if name in MODERN_PRESETS:
            layers, hidden, intermediate = MODERN_PRESETS[name]
            values: dict[str, Any] = dict(
                MODERN_DEFAULTS,
                num_hidden_layers=layers,
                hidden_size=hidden,
                num_attention_heads=hidden // 64,
                intermediate_size=intermediate,
            )
            values.update(overrides)
            return cls(**values)
        if name not in PRESETS:
            raise ConfigError(
                f"unknown model preset {name!r}; valid presets: "
                f"{', '.join(list(PRESETS) + list(MODERN_PRESETS))}"
            )
        layers, hidden = PRESETS[name]
        values = dict[str, Any](
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, values: dict) -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown BertConfig fields {unknown}; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str) -> "BertConfig":
        try:
            with _open(path) as f:
                values = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        except OSError as e:
            raise ConfigError(f"model config {path}: {e.strerror or e}") from None
        try:
            return cls.from_dict(values)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        if (
            not self.modern
        ):  # google's fields only, unless a classic model changed one of the others
            defaults = BertConfig()
            for name in MODERN_FIELDS:
                if values[name] == getattr(defaults, name):
                    del values[name]
        return values

    def to_json_file(self, path: str) -> None:
        with _open(path, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def _open(path, mode="r"):
    """A local file with open(); a URL (gs://, s3://, hdfs://) through TensorFlow's file system,
    imported only then, so the config and the planner need no TensorFlow."""
    if "://" not in path:
        return open(path, mode)
    import tensorflow as tf

    return tf.io.gfile.GFile(path, mode)


MODERN_FIELDS = (
    "architecture",
    "layer_norm_eps",
    "global_attn_every_n_layers",
    "local_attention",
    "global_rope_theta",
    "local_rope_theta",
    "classifier_pooling",
)
