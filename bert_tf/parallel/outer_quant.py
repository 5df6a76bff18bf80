"""The 8- and 4-bit codes of --outer_delta_bits (bert_tf/parallel/local_sgd.py): float32 values in
blocks of local_plan.BLOCK, each block scaled by its largest magnitude (absmax) to the integers
-L..L (L = 127 for 8 bits, 7 for 4 bits; round half to even), sent as int8 or as two 4-bit codes
per byte (code + 8, low half first), followed by the blocks' float32 scales (absmax / L) as bytes.
A row of values makes one uint8 payload. The rounding error of a value is at most half its block's
step, absmax / (2L).

The exchange (local_sgd) runs in two phases, as 1-bit's compressed allreduce and torchft's
quantised allreduce do: each rank's change, cut into one chunk per rank (whole blocks), goes as
codes by alltoall, chunk k to rank k; rank k averages the decoded chunks, codes the mean again and
sends it to all (allgather). Each rank sends 2 (N - 1) chunk payloads, about 2 (N - 1) / N of one
change's codes, like a ring allreduce: the bytes do not grow with the ranks.

Error feedback (`encode_with_feedback`), on both sides: a rank adds what its last code dropped to
the next change it sends, and rank k what its last code of the mean dropped to its next mean, so
over rounds the sum of what was sent follows the sum of the true changes (the difference is the
last residual, bounded by one step per value).
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.parallel.local_plan import BLOCK, blocks


def levels(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def code_bytes(elements: int, bits: int, block: int = BLOCK) -> int:
    """Bytes of the codes alone (whole blocks)."""
    return blocks(elements, block) * block * bits // 8


def encode(rows, bits: int, block: int = BLOCK):
    """[R, n] float32 rows -> [R, payload bytes] uint8 payloads (codes, then the scales' bytes),
    each row padded to whole blocks."""
    count = blocks(int(rows.shape[1]), block)
    ranks = int(rows.shape[0])
    padded = tf.pad(rows, [[0, 0], [0, count * block - int(rows.shape[1])]])
    padded = tf.reshape(padded, [ranks * count, block])
    scale = tf.reduce_max(tf.abs(padded), axis=1) / float(levels(bits))
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    q = tf.clip_by_value(tf.round(padded / safe[:, None]), -levels(bits), levels(bits))
    q = tf.reshape(tf.cast(q, tf.int32), [ranks, -1])
    if bits == 8:
        codes = tf.bitcast(tf.cast(q, tf.int8), tf.uint8)
    else:
        pairs = tf.reshape(q + 8, [ranks, -1, 2])
        codes = tf.cast(pairs[:, :, 0] + 16 * pairs[:, :, 1], tf.uint8)
    scale_bytes = tf.reshape(tf.bitcast(tf.reshape(scale, [ranks, count]), tf.uint8), [ranks, -1])
    return tf.concat([codes, scale_bytes], 1)


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


def encode_with_feedback(rows, residual, bits: int, block: int = BLOCK):
    """[R, n] rows plus this rank's residual (a float32 variable of that shape, updated here to what
    the codes drop), encoded: [R, payload bytes]."""
    corrected = rows + residual
    payloads = encode(corrected, bits, block)
    residual.assign(corrected - decode(payloads, int(rows.shape[1]), bits, block))
    return payloads
