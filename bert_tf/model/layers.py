"""The building blocks both encoders share (modeling.py's BERT, modern.py's ModernBERT):
activations, dense and norm layers, stateless dropout, scaled dot-product attention, the attention
mask, and running a stack of layers with optional recomputation; and `Encoder`, the contract both
encoders keep.

Precision: variables are float32 and cast to the compute dtype where used; softmax, LayerNorm and
the activations' transcendental parts run in float32. Shapes: B batch, S sequence, H hidden, N
heads, D = H / N.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import tensorflow as tf

from bert_tf.model.config import ACTIVATION_NAMES, BertConfig


@runtime_checkable
class Encoder(Protocol):
    """What a task head and a checkpoint reader may use of an encoder (modeling.BertEncoder,
    modern.ModernEncoder):

        sequence, pooled = encoder(input_ids, input_mask, segment_ids, dtype=, seed=, training=,
                                   position_ids=None, instance_ids=None)
                                            # [B, S, H], [B, H]; compute dtype
        encoder.pool(sequence, positions=None, input_mask=None, instance_ids=None)
                                            # the pooler on [CLS] (or a modern one's mean over
                                            # the mask or instance): [B, H], or [B, K, H] at
                                            # positions [B, K]
        encoder.config                      # the BertConfig it was built from
        encoder.trainable_variables         # tf.Module's: what a checkpoint holds, in a fixed order

    segment_ids are taken by both and ignored by the modern one (no token types); packed rows pass
    position_ids and instance_ids [B, S] (1, 2, ... per instance, 0 for padding) and attention stays
    within an instance."""

    config: BertConfig

    def __call__(
        self,
        input_ids,
        input_mask,
        segment_ids,
        *,
        dtype=tf.float32,
        seed=None,
        training=False,
        position_ids=None,
        instance_ids=None,
    ) -> tuple: ...

    def pool(self, sequence_output, positions=None, *, input_mask=None, instance_ids=None): ...

    @property
    def trainable_variables(self): ...


def _float32(activation):
    """activation computed in float32, returned in the input dtype: TensorFlow's CPU tanh on
    bfloat16 runs about 1.6x slower than on float32 (the GELU of one BERT-base layer, forward and
    backward, 23.4 ms in bfloat16 against 14.3 ms through float32 with the casts;
    docs/results.md)."""
    return lambda x: tf.cast(activation(tf.cast(x, tf.float32)), x.dtype)


ACTIVATIONS = {
    # google-research/bert's "gelu" is the tanh approximation.
    "gelu": _float32(lambda x: tf.nn.gelu(x, approximate=True)),
    "gelu_exact": _float32(lambda x: tf.nn.gelu(x, approximate=False)),
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES


def truncated_normal(shape, stddev):
    return tf.random.truncated_normal(shape, stddev=stddev)


def dropout(x, rate, seed, training):
    """Stateless inverted dropout; `seed` is an int32 [2] tensor.

    Each element draws 16 random bits, two per 32-bit Philox output: the generator is most of
    dropout's cost (measured on CPU: 5.4 ms against 9.4 ms for one float per element on an
    [8, 12, 128, 128] tensor). The drop probability is rate rounded to a multiple of 2^-16 and the
    kept values are scaled by the exact inverse of what is kept, so the expectation is unchanged.
    """
    if not training or rate == 0.0:
        return x
    threshold = int(round(rate * 65536))
    n = tf.size(x)
    words = tf.random.stateless_uniform(
        [(n + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:n]
    keep = tf.reshape(halves >= tf.constant(threshold, tf.uint16), tf.shape(x))
    return tf.where(keep, x * tf.cast(65536 / (65536 - threshold), x.dtype), tf.zeros_like(x))


class Dense(tf.Module):
    """y = x @ kernel + bias over the last axis; kernel [in, out]; bias=False: no bias (modern)."""

    def __init__(self, in_dim, out_dim, stddev, name=None, bias=True):
        super().__init__(name=name)
        self.kernel = tf.Variable(truncated_normal([in_dim, out_dim], stddev), name="kernel")
        if bias:
            self.bias = tf.Variable(tf.zeros([out_dim]), name="bias")

    def _add_bias(self, y):
        return y + tf.cast(self.bias, y.dtype) if hasattr(self, "bias") else y

    def __call__(self, x):
        # A 2-D matmul on [B*S, in]: einsum's gradient with "..." took 100x longer on CPU.
        kernel = tf.cast(self.kernel, x.dtype)
        if x.shape.rank == 2:
            return self._add_bias(tf.matmul(x, kernel))
        lead = tf.shape(x)[:-1]
        y = self._add_bias(tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel))
        return tf.reshape(y, tf.concat([lead, [kernel.shape[1]]], 0))


class LayerNorm(tf.Module):
    """LayerNorm over the last axis, computed in float32, returned in the input dtype; bias=False:
    no beta."""

    def __init__(self, dim, name=None, eps=1e-12, bias=True):
        super().__init__(name=name)
        self.eps = eps
        self.gamma = tf.Variable(tf.ones([dim]), name="gamma")
        if bias:
            self.beta = tf.Variable(tf.zeros([dim]), name="beta")

    def __call__(self, x):
        x32 = tf.cast(x, tf.float32)
        mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
        y = (x32 - mean) * tf.math.rsqrt(var + self.eps) * self.gamma
        if hasattr(self, "beta"):
            y = y + self.beta
        return tf.cast(y, x.dtype)


def attend(q, k, v, mask_bias, dropout_rate, seed, training):
    """Scaled dot-product attention: q, k, v [B, S, N, D], mask_bias [B, 1, S or 1, S] -> [B, S, N,
    D]; scores and softmax in float32."""
    scores = tf.einsum("bsnd,btnd->bnst", q, k)  # [B, N, S, S]
    scores = tf.cast(scores, tf.float32) * (1.0 / math.sqrt(q.shape[-1])) + mask_bias
    probs = tf.cast(tf.nn.softmax(scores, axis=-1), q.dtype)
    probs = dropout(probs, dropout_rate, seed, training)
    return tf.einsum("bnst,btnd->bsnd", probs, v)


def mask_bias_for(input_mask, instance_ids=None):
    """0 where a query may attend to a key, -10000 where not: [B, 1, 1, S] from the padding mask, or
    [B, 1, S, S] for packed rows (instance_ids [B, S]: 1, 2, ... per instance, 0 for padding; each
    instance attends to itself only; padding attends to padding, whose outputs nothing reads)."""
    if instance_ids is None:
        return (1.0 - tf.cast(input_mask, tf.float32))[:, tf.newaxis, tf.newaxis, :] * -10000.0
    same = tf.equal(instance_ids[:, :, tf.newaxis], instance_ids[:, tf.newaxis, :])
    return (1.0 - tf.cast(same, tf.float32))[:, tf.newaxis] * -10000.0


def run_layers(layers, x, seeds, recompute, call):
    """x through `layers` (call(layer, x, seed)); recompute: each layer again in the backward
    pass."""
    for i, layer in enumerate(layers):
        if recompute:
            x = tf.recompute_grad(lambda h, layer=layer, s=seeds[i]: call(layer, h, s))(x)
        else:
            x = call(layer, x, seeds[i])
    return x
