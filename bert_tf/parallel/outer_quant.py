"""The 8- and 4-bit codes of --outer_delta_bits (bert_tf/parallel/local_sgd.py): a flat float32
vector in blocks of local_plan.BLOCK values, each block scaled by its largest magnitude (absmax) to
the integers -L..L (L = 127 for 8 bits, 7 for 4 bits; round half to even), sent as int8 or as two
4-bit codes per byte (code + 8, low half first), followed by the blocks' float32 scales (absmax / L)
as bytes. One uint8 vector per rank: Horovod gathers it whole (one allgather), and every rank
decodes every rank's vector and averages them. The rounding error of a value is at most half its
block's step, absmax / (2L).

Error feedback (`encode_with_feedback`): each rank adds what its last code dropped to the next
vector it sends, so over rounds the sum of what it sent follows the sum of its true changes (the
difference is the last residual, bounded by one step per value).
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.parallel.local_plan import BLOCK, blocks


def levels(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def code_bytes(elements: int, bits: int, block: int = BLOCK) -> int:
    """Bytes of the codes alone (whole blocks)."""
    return blocks(elements, block) * block * bits // 8


def encode(x, bits: int, block: int = BLOCK):
    """A flat float32 vector -> its uint8 payload (codes, then the scales' bytes)."""
    n = int(x.shape[0])
    count = blocks(n, block)
    padded = tf.reshape(tf.pad(x, [[0, count * block - n]]), [count, block])
    scale = tf.reduce_max(tf.abs(padded), axis=1) / float(levels(bits))
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    q = tf.clip_by_value(tf.round(padded / safe[:, None]), -levels(bits), levels(bits))
    q = tf.reshape(tf.cast(q, tf.int32), [-1])
    if bits == 8:
        codes = tf.bitcast(tf.cast(q, tf.int8), tf.uint8)
    else:
        pairs = tf.reshape(q + 8, [-1, 2])
        codes = tf.cast(pairs[:, 0] + 16 * pairs[:, 1], tf.uint8)
    return tf.concat([codes, tf.reshape(tf.bitcast(scale, tf.uint8), [-1])], 0)


def decode(payloads, elements: int, bits: int, block: int = BLOCK):
    """[R, payload bytes] uint8 (R ranks' payloads) -> [R, elements] float32."""
    ranks = tf.shape(payloads)[0]
    count = blocks(elements, block)
    split = code_bytes(elements, bits, block)
    codes, scale_bytes = payloads[:, :split], payloads[:, split:]
    scale = tf.bitcast(tf.reshape(scale_bytes, [ranks, count, 4]), tf.float32)  # [R, blocks]
    if bits == 8:
        q = tf.cast(tf.bitcast(codes, tf.int8), tf.float32)
    else:
        wide = tf.cast(codes, tf.int32)
        q = tf.cast(tf.stack([wide % 16, wide // 16], axis=2) - 8, tf.float32)
    q = tf.reshape(q, [ranks, count, block]) * scale[:, :, None]
    return tf.reshape(q, [ranks, count * block])[:, :elements]


def encode_with_feedback(x, residual, bits: int, block: int = BLOCK):
    """x plus this rank's residual, encoded; the residual becomes what that code drops. Returns the
    payload (residual: a float32 variable of x's shape, updated here)."""
    corrected = x + residual
    payload = encode(corrected, bits, block)
    residual.assign(corrected - decode(payload[None], int(x.shape[0]), bits, block)[0])
    return payload
