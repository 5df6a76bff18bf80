"""Compressed gradient exchange with error feedback (--exchange=powersgd|onebit): what replaces
the one allreduce per update (training.Trainer's hook) when the link, not the device, sets the pace.
`CompressedExchange(method, ...)` makes either; PowerSGD lives here, 1-bit Adam/LAMB in
bert_tf/parallel/onebit.py.

Both send far fewer bytes than the gradient and keep what the compression left out in an error
buffer that is added to the next update's input (error feedback): the part not sent is delayed,
never lost.

- powersgd (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression
  for Distributed Optimization"): each weight matrix's gradient M (n x m, plus its error) travels as
  rank-r factors. P = M Q is averaged over ranks and orthonormalised, Q = M^T P is averaged, the
  update is P Q^T: r(n + m) floats instead of n m, in two grouped allreduces. Q starts where the
  last update left it (warm start: one power iteration per update follows the gradient's leading
  subspace). Vectors and thin matrices (biases, LayerNorm, token types, the next-sentence
  classifier) travel whole in the second one.
- onebit: 1-bit Adam / 1-bit LAMB (Tang et al. 2021, Li et al. 2021; bert_tf/parallel/onebit.py):
  after a float32 warmup the variance freezes and each rank's momentum travels as signs and one
  scale per tensor, compressed again on the averaging side (alltoall + allgather), error feedback
  on both sides. About 1/32 of float32's bytes.

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

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import exchange
from bert_tf.parallel.comm import METHODS, RECORD_KEY, powersgd_plan, wire_bytes
from bert_tf.parallel.onebit import (  # noqa: F401  (compression.pack_signs etc.: their old home)
    OnebitExchange,
    average as _mean,
    pack_signs,
    unpack_signs,
)


def CompressedExchange(
    method,
    variables,
    rank=4,
    warmup_steps=0,
    seed=0,
    size=1,
    name="grad",
    alone=False,
    clock=None,
    min_rate=2.0,
    onebit_signs=True,
    onebit_live="",
    onebit_variance_kappa=0,
):
    """The compressed exchange --exchange names: PowerSGDExchange (powersgd) or
    onebit.OnebitExchange (onebit; rank, seed and min_rate unused; onebit_signs, onebit_live,
    onebit_variance_kappa: its own)."""
    if method == "onebit":
        return OnebitExchange(
            variables,
            warmup_steps,
            size,
            name,
            alone,
            clock,
            onebit_signs,
            onebit_live,
            onebit_variance_kappa,
        )
    return PowerSGDExchange(
        method, variables, rank, warmup_steps, seed, size, name, alone, clock, min_rate
    )


class PowerSGDExchange(tf.Module):
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
        min_rate=2.0,
    ):
        super().__init__(name=f"{name}_exchange")
        self.min_rate = min_rate  # --powersgd_min_compression_rate
        if method not in METHODS or method == "onebit":
            raise ConfigError(
                f"--exchange={method}: valid compressed methods are {', '.join(METHODS)} "
                "(onebit: onebit.OnebitExchange)"
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
        self.compressed = powersgd_plan(self.shapes, rank, min_rate)
        self.errors = [
            tf.Variable(tf.zeros(self.shapes[i]), trainable=False, name=f"error_{i}")
            for i in self.compressed
        ]
        self.qs = [
            tf.Variable(self._initial_q(k), trainable=False, name=f"q_{i}")
            for k, i in enumerate(self.compressed)
        ]

    def attach_clock(self, clock):
        """Count the warmup on `clock` (an int64 variable someone else advances: the optimizer's
        updates)."""
        self.clock, self._counts_itself = clock, False

    def describe(self) -> dict:
        """What the exchange is, as a checkpoint records it (exchange_state): a resume keeps or
        compares it."""
        return {RECORD_KEY: self.method, "powersgd_rank": self.rank}

    def _initial_q(self, k):
        shape = self.shapes[self.compressed[k]]
        return tf.random.stateless_normal([shape[1], self.rank], seed=[self.seed, k])

    def reset(self, size) -> str:
        """Errors zeroed and Q drawn afresh, on every rank alike (an elastic re-form at `size`
        ranks); says so."""
        for k, (e, q) in enumerate(zip(self.errors, self.qs)):
            e.assign(tf.zeros_like(e))
            q.assign(self._initial_q(k))
        return (
            f"gradient compression: error buffers restarted at zero and Q afresh on all {size} "
            "ranks"
        )

    def own(self) -> list:
        """This rank's own buffers (its error feedback; never sent to another rank)."""
        return list(self.errors)

    def shared(self) -> list:
        """The state every rank holds alike: PowerSGD's Q (rank 0's is broadcast on a resume)."""
        return list(self.qs)

    def wait_for_ranks(self):
        return None if self.alone else exchange.wait_for_ranks(self.tag)

    def wire_bytes(self, size) -> float:
        return wire_bytes(self.method, self.shapes, size, self.rank, self.min_rate)

    def __call__(self, grads, scale=None):
        grads = [g * self.weight for g in grads] if self.weight != 1.0 else list(grads)
        scale = tf.constant(1.0) if scale is None else scale
        compressed = self._powersgd
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
