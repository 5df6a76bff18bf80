"""Compressed gradient exchange with error feedback (--exchange=powersgd|onebit): what replaces
the one allreduce per update (training.Trainer's hook) when the link, not the device, sets the pace.

Both send far fewer bytes than the gradient and keep what the compression left out in an error
buffer that is added to the next update's gradient (error feedback): the part not sent is delayed,
never lost.

- powersgd (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression
  for Distributed Optimization"): each weight matrix's gradient M (n x m, plus its error) travels as
  rank-r factors. P = M Q is averaged over ranks and orthonormalised, Q = M^T P is averaged, the
  update is P Q^T: r(n + m) floats instead of n m, in two grouped allreduces. Q starts where the
  last update left it (warm start: one power iteration per update follows the gradient's leading
  subspace). Vectors and thin matrices (biases, LayerNorm, token types, the next-sentence
  classifier) travel whole in the second one.
- onebit (the compression of Tang et al. 2021, "1-bit Adam", with error compensation on the sending
  and the averaging side as in Zheng, Huang and Kwok 2019, "Communication-Efficient Distributed
  Blockwise Momentum SGD with Error-Feedback"): the gradient as one vector, one chunk per rank; each
  chunk goes as signs (a bit each) and one scale (its mean absolute value) to the rank that owns it
  (alltoall); the owner averages what it got plus its own error, compresses that again and sends it
  to all (allgather). About 1/32 of float32's bytes.

Every rank applies the same update: the averaged factors and the gathered signs are the same numbers
on every rank, and what a rank computes from them is the same arithmetic. A non-finite result
(float16 loss scaling's overflow) leaves the error buffers and Q as they were: Trainer.apply skips
that update and the next starts from the same state. The first --compression_warmup_steps updates
are exchanged uncompressed (their errors stay zero).

One clock: the warmup is counted on `clock`, the optimizer's update count (the trainer attaches it),
which is checkpoint state, broadcast from rank 0 at every start and rolled back with the weights; a
skipped update does not move it, as it does not move 1-bit's variance freeze. So every rank, a
newcomer or one rolled back included, takes the same branch at the same update. State: Q is the same
on every rank; the error buffers are each rank's own and never leave it: each rank writes them to
its own file beside a checkpoint and reads its own back (bert_tf/parallel/exchange_state.py).
`reset` restarts them, the same on every rank (an elastic re-form).
"""

from __future__ import annotations

import math

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import exchange
from bert_tf.parallel.comm import METHODS, RECORD_KEY, onebit_chunk, powersgd_plan, wire_bytes

_BITS = tf.constant([1, 2, 4, 8, 16, 32, 64, 128], tf.int32)


def _mean(tensors, name, alone=False):
    import horovod.tensorflow as hvd

    if alone or hvd.size() == 1:
        return list(tensors)
    return hvd.grouped_allreduce(list(tensors), op=hvd.Average, name=name)


def pack_signs(x):
    """[..., 8k] float -> [..., k] uint8: bit j of byte i says x[8i + j] >= 0."""
    bits = tf.reshape(tf.cast(x >= 0, tf.int32), tf.concat([tf.shape(x)[:-1], [-1, 8]], 0))
    return tf.cast(tf.reduce_sum(bits * _BITS, -1), tf.uint8)


def unpack_signs(packed, scale):
    """pack_signs' inverse times a scale per row: [..., k] uint8, [...] -> [..., 8k] of +-scale."""
    bits = tf.bitwise.bitwise_and(tf.cast(packed, tf.int32)[..., None], _BITS) > 0
    signs = tf.where(bits, 1.0, -1.0)
    return tf.reshape(signs, tf.concat([tf.shape(packed)[:-1], [-1]], 0)) * scale[..., None]


def _compress(x):
    """Signs and the scale that minimises the squared error: the mean absolute value (per row)."""
    return pack_signs(x), tf.reduce_mean(tf.abs(x), -1)


class CompressedExchange(tf.Module):
    """A GradientExchange (bert_tf/parallel/exchange.py): exchange(grads, scale=None) -> the
    averaged (compressed) gradients, the same on every rank. scale: the loss scale the gradients
    carry (the error buffers keep unscaled values, so a changing scale does not corrupt them).
    weight: this rank's gradients are multiplied by it first (elastic mode's uneven shares)."""

    def __init__(
        self,
        method,
        variables,
        rank=4,
        warmup_steps=0,
        seed=0,
        size=1,
        name="grad",
        alone=False,
        clock=None,
    ):
        super().__init__(name=f"{name}_exchange")
        if method not in METHODS:
            raise ConfigError(
                f"--exchange={method}: valid compressed methods are {', '.join(METHODS)}"
            )
        self.method, self.rank, self.warmup_steps, self.seed, self.tag = (
            method,
            rank,
            warmup_steps,
            seed,
            name,
        )
        self.alone = (
            alone  # the computation only, no collective (its cost, measured in one rank of a job)
        )
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.weight = 1.0
        # the updates so far: the trainer's optimizer's count (attach_clock); alone, the exchange
        # counts its calls
        self.clock, self._counts_itself = (
            tf.Variable(0, dtype=tf.int64, trainable=False, name="calls"),
            True,
        )
        if clock is not None:
            self.attach_clock(clock)
        if method == "powersgd":
            self.compressed = powersgd_plan(self.shapes, rank)
            self.errors = [
                tf.Variable(tf.zeros(self.shapes[i]), trainable=False, name=f"error_{i}")
                for i in self.compressed
            ]
            self.qs = [
                tf.Variable(self._initial_q(k), trainable=False, name=f"q_{i}")
                for k, i in enumerate(self.compressed)
            ]
        else:
            self.elements = sum(math.prod(s) for s in self.shapes)
            self.error = tf.Variable(tf.zeros([self.elements]), trainable=False, name="error")
            # the averaging side's error: this rank's chunk, whose length depends on the rank count
            self.server_error = tf.Variable(
                tf.zeros([onebit_chunk(self.elements, size)]),
                trainable=False,
                shape=tf.TensorShape([None]),
                name="server_error",
            )

    def attach_clock(self, clock):
        """Count the warmup on `clock` (an int64 variable someone else advances: the optimizer's
        updates)."""
        self.clock, self._counts_itself = clock, False

    def describe(self) -> dict:
        """What the exchange is, as a checkpoint records it (exchange_state): a resume keeps or
        compares it."""
        return {
            RECORD_KEY: self.method,
            "powersgd_rank": self.rank if self.method == "powersgd" else 0,
        }

    def _initial_q(self, k):
        shape = self.shapes[self.compressed[k]]
        return tf.random.stateless_normal([shape[1], self.rank], seed=[self.seed, k])

    def reset(self, size) -> str:
        """Errors zeroed and Q drawn afresh, on every rank alike (an elastic re-form at `size`
        ranks); says so."""
        if self.method == "powersgd":
            for k, (e, q) in enumerate(zip(self.errors, self.qs)):
                e.assign(tf.zeros_like(e))
                q.assign(self._initial_q(k))
        else:
            self.error.assign(tf.zeros_like(self.error))
            self.server_error.assign(tf.zeros([onebit_chunk(self.elements, size)]))
        fresh = " and Q afresh" if self.method == "powersgd" else ""
        return f"gradient compression: error buffers restarted at zero{fresh} on all {size} ranks"

    def own(self) -> list:
        """This rank's own buffers (its error feedback; never sent to another rank)."""
        return list(self.errors) if self.method == "powersgd" else [self.error, self.server_error]

    def shared(self) -> list:
        """The state every rank holds alike: PowerSGD's Q (rank 0's is broadcast on a resume)."""
        return list(self.qs) if self.method == "powersgd" else []

    def wait_for_ranks(self):
        return None if self.alone else exchange.wait_for_ranks(self.tag)

    def wire_bytes(self, size) -> float:
        return wire_bytes(self.method, self.shapes, size, self.rank)

    def __call__(self, grads, scale=None):
        grads = [g * self.weight for g in grads] if self.weight != 1.0 else list(grads)
        scale = tf.constant(1.0) if scale is None else scale
        compressed = self._powersgd if self.method == "powersgd" else self._onebit
        if self.warmup_steps:
            out = tf.cond(
                self.clock < self.warmup_steps,
                lambda: _mean(grads, f"{self.tag}_warmup", self.alone),
                lambda: compressed(grads, scale),
            )
        else:
            out = compressed(grads, scale)
        if self._counts_itself:
            self.clock.assign_add(1)
        return out

    def _powersgd(self, grads, scale):
        ms = [grads[i] / scale + e for i, e in zip(self.compressed, self.errors)]
        ps = _mean([tf.matmul(m, q) for m, q in zip(ms, self.qs)], f"{self.tag}_psgd_p", self.alone)
        ps = [tf.linalg.qr(p)[0] for p in ps]  # orthonormal columns (zero columns stay finite)
        plain = [i for i in range(len(grads)) if i not in self.compressed]
        qs = [tf.matmul(m, p, transpose_a=True) for m, p in zip(ms, ps)]
        reduced = _mean(qs + [grads[i] / scale for i in plain], f"{self.tag}_psgd_q", self.alone)
        qs, rest = reduced[: len(qs)], reduced[len(qs) :]
        approx = [tf.matmul(p, q, transpose_b=True) for p, q in zip(ps, qs)]
        out = [None] * len(grads)
        for i, a in zip(self.compressed, approx):
            out[i] = a * scale
        for i, r in zip(plain, rest):
            out[i] = r * scale
        finite = tf.math.is_finite(tf.linalg.global_norm(out))
        for e, m, a in zip(self.errors, ms, approx):
            e.assign(tf.where(finite, m - a, e))
        for old, new in zip(self.qs, qs):
            old.assign(tf.where(finite, new, old))
        return out

    def _onebit(self, grads, scale):
        import horovod.tensorflow as hvd

        size = 1 if self.alone else hvd.size()
        chunk = onebit_chunk(self.elements, size)
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0) / scale + self.error
        blocks = tf.reshape(tf.pad(flat, [[0, size * chunk - self.elements]]), [size, chunk])
        signs, scales = _compress(blocks)
        sent = tf.reshape(unpack_signs(signs, scales), [-1])[: self.elements]
        if size > 1:
            signs = hvd.alltoall(signs, name=f"{self.tag}_onebit_signs")
            scales = hvd.alltoall(scales, name=f"{self.tag}_onebit_scales")
        mine = tf.reduce_mean(unpack_signs(signs, scales), 0) + self.server_error
        signs, scale_mine = _compress(mine)
        kept = mine - unpack_signs(signs, scale_mine)
        signs, scales = signs[None], scale_mine[None]
        if size > 1:
            signs = hvd.allgather(signs, name=f"{self.tag}_onebit_gather_signs")
            scales = hvd.allgather(scales, name=f"{self.tag}_onebit_gather_scales")
        total = tf.reshape(unpack_signs(signs, scales), [-1])[: self.elements]
        finite = tf.math.is_finite(tf.reduce_sum(tf.abs(total)))
        self.error.assign(tf.where(finite, flat - sent, self.error))
        self.server_error.assign(tf.where(finite, kept, self.server_error))
        out, start = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            out.append(tf.reshape(total[start : start + n], shape) * scale)
            start += n
        return out
