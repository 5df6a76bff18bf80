"""Windowed ("local") self-attention computed in blocks: O(S w) scores instead of O(S^2).

ModernBERT's local layers let query i see key j only when |i - j| <= c, c = local_attention // 2
(modern.window_bias). Cut the sequence into blocks of c tokens: every key that a query of block b
may see lies in blocks b-1, b, b+1, so each query block is scored against those 3c keys only, and
the window, padding and packed-instance masks are made in that blocked layout directly from
input_mask / instance_ids [B, S] (no [S, S] tensor anywhere).

Shapes: B batch, S sequence, N heads, D = H / N, c block (local_attention // 2), K = ceil(S / c)
blocks, P = K c the sequence padded to whole blocks (the padding is masked as keys and cut from the
output).

Numerics: those of layers.attend on modern.window_bias + layers.mask_bias_for, to float rounding.
Scores and softmax run in float32 and masked entries get -10000 added (not -inf), window and
padding summed as the dense biases are (0, -10000 or -20000). A query that sees at least one key
(every non-padding query sees itself) gets the dense weights: the keys the dense path has beyond
these 3c are all masked there, and exp(-10000) is 0 in float32. A query whose every key is masked
(a padding token with only padding in its window) is the exception: dense spreads its weight evenly
over all S keys, blocked over its 3c; nothing reads padding outputs.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from bert_tf.model.layers import dropout


def saves_work(seq, local_attention):
    """Whether blocks beat dense attention at a static sequence length `seq` (None: unknown, dense):
    a query block scores 3c keys, so only when S > 3c."""
    c = local_attention // 2
    return seq is not None and c > 0 and seq > 3 * c


@dataclasses.dataclass(frozen=True)
class WindowMask:
    """A local layer's mask in blocked layout: bias [B, K, 1, c, 3c] (0 where query r of block b may
    attend to key t of blocks b-1, b, b+1; -10000 or -20000 where not), block = c."""

    bias: tf.Tensor
    block: int


def _pad_to_blocks(x, c, fill=0):
    """x [B, S, ...] -> [B, P, ...], P the next multiple of c, `fill` after the end."""
    extra = -x.shape[1] % c
    return tf.pad(x, [[0, 0], [0, extra]] + [[0, 0]] * (x.shape.rank - 2), constant_values=fill)


def _neighbours(x, c, fill=0):
    """x [B, P, ...] -> [B, K, 3c, ...]: for block b, blocks b-1, b and b+1 side by side (`fill`
    before the first and after the last block)."""
    blocks = x.shape[1] // c
    x = tf.pad(x, [[0, 0], [c, c]] + [[0, 0]] * (x.shape.rank - 2), constant_values=fill)
    x = tf.reshape(x, [tf.shape(x)[0], blocks + 2, c, *x.shape[2:]])
    return tf.concat([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def window_mask(input_mask, instance_ids, local_attention):
    """The WindowMask of input_mask [B, S] (1 token, 0 padding) or, for packed rows, instance_ids
    [B, S] (1, 2, ... per instance, 0 padding; input_mask then unused, as in layers.mask_bias_for).
    S must be static."""
    c = local_attention // 2
    if instance_ids is None:
        # Key side only, like mask_bias_for's [B, 1, 1, S]; keys past S count as padding.
        keys = _neighbours(_pad_to_blocks(tf.cast(input_mask, tf.float32), c), c)  # [B, K, 3c]
        seen = keys[:, :, tf.newaxis, :]  # [B, K, 1, 3c]
    else:
        # -1 past S: no instance, not even padding's 0, so padding tokens never see those keys.
        ids = _pad_to_blocks(instance_ids, c, fill=-1)  # [B, P]
        keys = _neighbours(ids, c, fill=-1)  # [B, K, 3c]
        queries = tf.reshape(ids, [tf.shape(ids)[0], -1, c])  # [B, K, c]
        seen = tf.cast(tf.equal(queries[..., tf.newaxis], keys[:, :, tf.newaxis, :]), tf.float32)
    # Query r of a block and key t of its three blocks are c + r - t tokens apart.
    apart = tf.abs(c + tf.range(c)[:, tf.newaxis] - tf.range(3 * c)[tf.newaxis, :])  # [c, 3c]
    near = tf.cast(apart <= c, tf.float32)
    bias = (1.0 - seen) * -10000.0 + (1.0 - near) * -10000.0  # [B, K, c or 1, 3c] + [c, 3c]
    return WindowMask(bias[:, :, tf.newaxis], c)


def attend(q, k, v, mask: WindowMask, dropout_rate, seed, training):
    """Windowed scaled dot-product attention: q, k, v [B, S, N, D] (S static) -> [B, S, N, D];
    layers.attend's contract with a WindowMask for the mask bias."""
    c, seq, heads, size = mask.block, q.shape[1], q.shape[2], q.shape[3]
    batch, blocks = tf.shape(q)[0], -(-seq // c)
    queries = tf.reshape(_pad_to_blocks(q, c), [batch, blocks, c, heads, size])
    keys = _neighbours(_pad_to_blocks(k, c), c)  # [B, K, 3c, N, D]
    values = _neighbours(_pad_to_blocks(v, c), c)
    scores = tf.einsum("bkind,bkjnd->bknij", queries, keys)  # [B, K, N, c, 3c]
    scores = tf.cast(scores, tf.float32) * (1.0 / math.sqrt(size)) + mask.bias
    probs = tf.cast(tf.nn.softmax(scores, axis=-1), q.dtype)
    probs = dropout(probs, dropout_rate, seed, training)
    context = tf.einsum("bknij,bkjnd->bkind", probs, values)  # [B, K, c, N, D]
    return tf.reshape(context, [batch, blocks * c, heads, size])[:, :seq]
