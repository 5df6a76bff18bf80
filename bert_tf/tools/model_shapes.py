"""The model's trainable variables without building it: each one's shape and name, in google's
layout order, for both architectures (tested against modeling.BertPretrainer). The planner counts
gradient bytes with them, 1-bit's --onebit_live matches their names, and the recipe race reads an
arm's size from them."""

from __future__ import annotations

import math

from bert_tf.model.config import BertConfig


class Shape(tuple):
    """A gradient tensor's shape that also carries its variable's name (the model's, without ":0";
    names repeat: every Dense has a kernel and a bias), which --onebit_live matches."""

    name: str

    def __new__(cls, dims, name=""):
        shape = super().__new__(cls, dims)
        shape.name = name
        return shape


def _dense(n: int, m: int) -> list:
    return [((n, m), "kernel"), ((m,), "bias")]


def layer_shapes(config: BertConfig, i: int) -> list:
    """(shape, name) of transformer layer i's variables: bert_tf/model/modern.py's have no biases
    and a GeGLU, and its first layer no attention norm (the embeddings' norm serves)."""
    H, I = config.hidden_size, config.intermediate_size
    shapes: list
    if config.architecture == "modern":
        shapes = [((H,), "gamma")] * (i > 0)
        shapes += [((H, 3 * H), "kernel"), ((H, H), "kernel"), ((H,), "gamma")]
        return shapes + [((H, 2 * I), "kernel"), ((I, H), "kernel")]
    norm = [((H,), "gamma"), ((H,), "beta")]
    return _dense(H, H) * 4 + norm + _dense(H, I) + _dense(I, H) + norm


def gradient_tensor_shapes(config: BertConfig, nsp: bool = True) -> list:
    """The shape of every trainable variable of modeling.BertPretrainer (one gradient tensor each,
    so one Horovod allreduce each), listed in google's layout order (embeddings, layers, pooler,
    heads), each a Shape named as the model's variable. The same shapes and names as the model's
    (tested), not in its order (tf.Module sorts attributes by name); the order only moves where
    fusion_messages cuts the buffers, and Horovod itself fuses the tensors in the order they are
    ready."""
    H, V = config.hidden_size, config.vocab_size
    layers = [s for i in range(config.num_hidden_layers) for s in layer_shapes(config, i)]
    norm: list = [((H,), "gamma"), ((H,), "beta")]
    shapes: list
    if config.architecture == "modern":  # bert_tf/model/modern.py: no biases, no positions, GeGLU
        shapes = [((V, H), "word_embeddings"), ((H,), "gamma")] + layers
        shapes += [((H,), "gamma"), ((H, H), "kernel"), ((H,), "gamma")]  # final norm, pooler
        shapes += [((H, H), "kernel"), ((H,), "gamma"), ((V,), "mlm_output_bias")]  # MLM head
        shapes += _dense(H, 2) if nsp else []
        return [Shape(*s) for s in shapes]
    shapes = [((V, H), "word_embeddings")]
    shapes += [((config.max_position_embeddings, H), "position_embeddings")]
    shapes += [((config.type_vocab_size, H), "token_type_embeddings")] + norm + layers
    shapes += _dense(H, H)  # pooler
    shapes += _dense(H, H) + norm + [((V,), "mlm_output_bias")]  # MLM transform, LayerNorm, bias
    shapes += _dense(H, 2) if nsp else []
    return [Shape(*s) for s in shapes]


def gradient_tensor_sizes(config: BertConfig, nsp: bool = True) -> list:
    """Element count of each of gradient_tensor_shapes."""
    return [math.prod(s) for s in gradient_tensor_shapes(config, nsp)]


def parameter_count(config: BertConfig, nsp: bool = True) -> int:
    """Trainable parameters of modeling.BertPretrainer (tested against the model)."""
    return sum(gradient_tensor_sizes(config, nsp))


def encoder_parameter_count(config: BertConfig) -> int:
    """Parameters of the transformer layers alone (no embeddings, pooler or heads): what sets the
    compute per token, for matching sizes across architectures (the recipe race's arms)."""
    layers = range(config.num_hidden_layers)
    return sum(math.prod(shape) for i in layers for shape, _ in layer_shapes(config, i))
