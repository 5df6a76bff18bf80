"""--exchange=onebit: 1-bit Adam (Tang et al. 2021) and 1-bit LAMB (Li et al. 2021), the exchange
half; the optimizer half (the frozen variance, LAMB's frozen trust ratios) is
bert_tf/train/optimization.py. The reference is DeepSpeed's OnebitAdam / OnebitLamb and its
compressed_allreduce (deepspeed/runtime/fp16/onebit/{adam,lamb}.py, deepspeed/runtime/comm/nccl.py).

Two stages, on the optimizer's update count (the clock every rank agrees on, compression.py):
- warmup, the first K = comm.warmup_updates updates: the gradients averaged in float32; the
  optimizer is plain Adam / LAMB (LAMB's trust ratios clamped and averaged, 1-bit LAMB's warmup);
- then the variance v is frozen and the MOMENTUM travels, not the gradient. Each rank forms its
  local momentum m_r = b1 m + (1 - b1) g_r from the last update's averaged momentum m (the same on
  every rank) and its own gradient, and m_r goes through one compressed allreduce (below); its
  result is the new m on every rank. To keep the exchange contract (gradients in, gradients out;
  the optimizer updates m itself), the exchange reads the optimizer's m and returns
  g = (m_avg - b1 m) / (1 - b1): the optimizer's own m = b1 m + (1 - b1) g lands on m_avg (up to
  rounding, the same on every rank), and g is 1-bit LAMB's reconstructed gradient for its fresh
  variance.

The compressed allreduce of each tensor, DeepSpeed's math: the tensor is padded with zeros to a
multiple of p x lcm(p, 8) (p ranks; comm.onebit_chunk) and the worker's error added; the worker
scale is its RMS over the padded length (||x||_2 / sqrt(N)); signs (x >= 0: +1, so 0 -> +1) go
by alltoall, chunk k to rank k, the scale to all. Rank k averages its chunk, sum_r (scale_r / p)
sign_r, adds its server error, and sends the signs and the chunk's RMS to all (allgather); each
side keeps what it left out as its error. All tensors travel in ONE alltoall and ONE allgather of
signs (each rank's chunk of every tensor laid side by side) and one allgather of per-tensor scales
per side; the arithmetic per tensor is DeepSpeed's.

Exact zeros: coordinates whose frozen v is exactly 0 (every warmup gradient was 0 there: position
embeddings beyond the sequence length, tokens never seen) are set to 0 after the exchange
(DeepSpeed's exp_avg_mask, derived here): a sign cannot say 0, and a non-zero m over v = 0 would be
a step of m / eps.

Live tensors (--onebit_live, DeepSpeed OnebitAdam's `non_freeze` parameter groups): the variables
the pattern names keep the warmup's treatment after it, their gradients averaged in float32 (one
grouped allreduce beside the signs) and their variance live (the optimizer's `live`); they are not
in the fused sign buffers. For a tensor whose frozen variance misleads: a tied word embedding whose
rare tokens' rows froze with the softmax's small gradients (docs/results.md).

0/1 Adam's variance (--onebit_variance_kappa, Lu et al. 2022; DeepSpeed's ZeroOneAdam in
deepspeed/runtime/fp16/onebit/zoadam.py): in the warmup only the updates of variance_schedule's
schedule average the gradient in float32 (the optimizer's v takes them); the others send the
gradient itself through the compressed allreduce, with the error buffers, and v stays. At the
freeze the buffers restart at zero (DeepSpeed zeroes them there); then as 1-bit Adam. Its local
steps are not built (DeepSpeed's default local_step_scaler keeps their interval at 1 for 32,678
updates). Departures besides those below: its schedule counts real updates from 1 (DeepSpeed's
counts its initialisation call), v's bias correction is 1 - b2^n over v's own n updates.

Departures from DeepSpeed:
- bias correction: kept (bert_tf's Adam/LAMB): m / (1 - b1^t), v / (1 - b2^K) frozen with v;
  DeepSpeed has none. eps 1e-6 (bert_tf's), not 1e-8.
- no dummy first call: K real float32 updates (DeepSpeed's freeze_step counts its initialisation
  call, freeze_step - 1 real ones). The warmup exchanges float32 (DeepSpeed: the engine's dtype).
- clipping: the warmup clips the averaged gradient (training.py, as every exchange); after it each
  rank clips its own gradient before its momentum step (DeepSpeed's order in both stages).
- overflow: the exchange runs, a non-finite result (it reaches every rank) leaves both errors as
  they were and the trainer skips the update; DeepSpeed checks the local gradients first.
- errors persist: each rank's own worker and server errors are written beside every checkpoint and
  read back (exchange_state.py); DeepSpeed resets them on a load. An elastic re-form zeroes them.
- fused collectives (above); 1-bit LAMB: per-tensor scales on both sides, as for Adam, instead of
  one fused vector with per-tensor scaling coefficients fixed at the first compressed step and one
  scale per server chunk (the coefficients exist to equalise tensor magnitudes under one scale;
  a scale per tensor does that at every step).
- the mask is derived from v == 0 at the freeze, not given; weight decay and LAMB's trust ratio
  skip LayerNorm parameters and biases by name (optimization.NO_DECAY), not by param groups.
- gradient accumulation: the mean over micro-batches in both stages (DeepSpeed's compressed stage
  is fed the sum when gradient_accumulation_steps > 1).
- sign bits packed little-endian within a byte (cupy: big-endian): irrelevant within one job.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import exchange
from bert_tf.parallel.comm import RECORD_KEY, live_indices, onebit_chunk, wire_bytes
from bert_tf.parallel.variance_schedule import variance_update

_BITS = tf.constant([1, 2, 4, 8, 16, 32, 64, 128], tf.int32)
# what an exchange-state file says of the buffers (exchange_state.py compares it): the old
# gradient-sign buffers (one vector, chunks per rank) are not these
VARIANT = "momentum, a scale per tensor"


def average(tensors, name, alone=False):
    """The float32 mean over ranks, one grouped allreduce (alone or on one rank: as given)."""
    import horovod.tensorflow as hvd

    if alone or hvd.size() == 1:
        return list(tensors)
    return hvd.grouped_allreduce(list(tensors), op=hvd.Average, name=name)


def pack_signs(x):
    """[..., 8k] float -> [..., k] uint8: bit j of byte i says x[8i + j] >= 0."""
    bits = tf.reshape(tf.cast(x >= 0, tf.int32), tf.concat([tf.shape(x)[:-1], [-1, 8]], 0))
    return tf.cast(tf.reduce_sum(bits * _BITS, -1), tf.uint8)


def signs(packed):
    """pack_signs' inverse: [..., k] uint8 -> [..., 8k] of +-1.0."""
    bits = tf.bitwise.bitwise_and(tf.cast(packed, tf.int32)[..., None], _BITS) > 0
    return tf.reshape(tf.where(bits, 1.0, -1.0), tf.concat([tf.shape(packed)[:-1], [-1]], 0))


def unpack_signs(packed, scale):
    """pack_signs' inverse times a scale per row: [..., k] uint8, [...] -> [..., 8k] of +-scale."""
    return signs(packed) * scale[..., None]


def all_finite(tensors):
    """True when no element of any tensor is inf or NaN."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


class Layout:
    """Where each tensor lies in the fused buffers at `size` ranks: tensor t, n_t elements, padded
    to N_t = size x c_t (c_t = comm.onebit_chunk); a [size, C] block holds chunk k of every tensor
    in row k, side by side (C = sum c_t: what a rank serves)."""

    def __init__(self, shapes, size: int):
        self.shapes, self.size = [tuple(s) for s in shapes], size
        self.elements = [math.prod(s) for s in self.shapes]
        self.chunks = [onebit_chunk(n, size) for n in self.elements]
        self.served = sum(self.chunks)
        self.padded = size * self.served
        self.tensor_of = tf.constant(np.repeat(np.arange(len(self.chunks)), self.chunks), tf.int32)

    def blocks(self, tensors):
        """The tensors as one [size, C] block."""
        parts = [
            tf.reshape(tf.pad(tf.reshape(x, [-1]), [[0, self.size * c - n]]), [self.size, c])
            for x, n, c in zip(tensors, self.elements, self.chunks)
        ]
        return tf.concat(parts, 1)

    def tensors(self, blocks):
        """blocks' inverse: the tensors, padding dropped."""
        parts = tf.split(blocks, self.chunks, axis=1)
        return [
            tf.reshape(tf.reshape(p, [-1])[:n], s)
            for p, n, s in zip(parts, self.elements, self.shapes)
        ]

    def per_element(self, scales):
        """[..., T] scales per tensor -> [..., C]: each element's tensor's."""
        return tf.gather(scales, self.tensor_of, axis=-1)

    def rms(self, squares, lengths):
        """[C] squares -> [T]: sqrt(sum over each tensor's part / its length). A reduction per
        tensor (a tree: a segment sum adds one element at a time, 1e-4 off over a large tensor)."""
        sums = tf.stack([tf.reduce_sum(part) for part in tf.split(squares, self.chunks)])
        return tf.sqrt(sums / tf.constant(lengths, tf.float32))


def compressed_allreduce(tensors, worker_error, server_error, layout: Layout, tag, alone=False):
    """DeepSpeed's compressed_allreduce of each tensor (the module's docstring), all tensors fused.
    Returns (the average as tensors, the new worker error [size x C], the new server error [C])."""
    import horovod.tensorflow as hvd

    p, collective = layout.size, layout.size > 1 and not alone
    x = layout.blocks(tensors) + tf.reshape(worker_error, [p, layout.served])
    worker_scale = layout.rms(tf.reduce_sum(tf.square(x), 0), [p * c for c in layout.chunks])
    packed = pack_signs(x)
    sent = signs(packed) * layout.per_element(worker_scale)
    scales = worker_scale[None]
    if collective:
        packed = hvd.alltoall(packed, name=f"{tag}_onebit_signs")
        scales = hvd.allgather(scales, name=f"{tag}_onebit_scales")
    mine = tf.reduce_sum(signs(packed) * layout.per_element(scales / p), 0) + server_error
    server_scale = layout.rms(tf.square(mine), layout.chunks)
    packed = pack_signs(mine)
    kept = mine - signs(packed) * layout.per_element(server_scale)
    packed, scales = packed[None], server_scale[None]
    if collective:
        packed = hvd.allgather(packed, name=f"{tag}_onebit_gather_signs")
        scales = hvd.allgather(scales, name=f"{tag}_onebit_gather_scales")
    total = signs(packed) * layout.per_element(scales)
    return layout.tensors(total), tf.reshape(x - sent, [-1]), kept


class OnebitExchange(tf.Module):
    """A GradientExchange (bert_tf/parallel/exchange.py) for 1-bit Adam/LAMB. The trainer attaches
    its optimizer (attach_optimizer: its momentum m, beta_1, variance v, the warmup length); alone
    (no optimizer: a cost measurement, a test) it keeps a momentum of its own with beta_1 0.9 and
    no mask. weight: this rank's gradients are multiplied by it first (elastic mode's shares)."""

    method = "onebit"

    def __init__(
        self,
        variables,
        warmup_steps=0,
        size=1,
        name="grad",
        alone=False,
        clock=None,
        signs=True,
        live="",
        kappa=0,
    ):
        super().__init__(name=f"{name}_exchange")
        self.warmup_steps, self.tag, self.alone = warmup_steps, name, alone
        self.signs = signs  # False: --noonebit_signs, the momentum averaged exactly (the control)
        # --onebit_variance_kappa: 0/1 Adam's warmup, float32 only at the variance's updates
        self.kappa = kappa
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        # --onebit_live: these tensors' gradients are averaged in float32 after the warmup too
        self.live_pattern = live
        self.live = live_indices([v.name for v in variables], live)
        if len(self.live) == len(self.shapes):
            raise ConfigError(
                f"--onebit_live={live} matches every variable: nothing is left to send as signs "
                "(that is --exchange=none)"
            )
        self.frozen_shapes = [s for i, s in enumerate(self.shapes) if i not in self.live]
        self.weight = 1.0
        self.optimizer, self.clip_norm, self.beta_1 = None, 0.0, 0.9
        self._own_momentum = None
        self.clock, self._counts_itself = (
            tf.Variable(0, dtype=tf.int64, trainable=False, name="calls"),
            True,
        )
        if clock is not None:
            self.attach_clock(clock)
        layout = Layout(self.frozen_shapes, size)
        # this rank's own errors; their lengths follow the rank count (reset)
        self.error = tf.Variable(
            tf.zeros([layout.padded]), trainable=False, shape=tf.TensorShape([None]), name="error"
        )
        self.server_error = tf.Variable(
            tf.zeros([layout.served]),
            trainable=False,
            shape=tf.TensorShape([None]),
            name="server_error",
        )

    def attach_clock(self, clock):
        """Count the warmup on `clock` (the optimizer's updates)."""
        self.clock, self._counts_itself = clock, False

    def attach_optimizer(self, optimizer, clip_norm=0.0):
        """The trainer's optimizer: its m is the momentum sent, its v (frozen) gives the mask, its
        freeze_variance_after the warmup; clip_norm: each rank's gradient is clipped to it before
        its momentum step (after the warmup; before it, the trainer clips the average). An optimizer
        that freezes nothing (a trainer not configured for --exchange=onebit) is not 1-bit Adam's:
        the exchange keeps its own momentum and warmup."""
        if not optimizer.freeze_variance_after:
            return
        self.optimizer, self.clip_norm = optimizer, clip_norm
        self.beta_1, self.warmup_steps = optimizer.beta_1, optimizer.freeze_variance_after

    def describe(self) -> dict:
        described = {RECORD_KEY: self.method, "powersgd_rank": 0, "onebit": VARIANT}
        if self.live_pattern:  # absent when unset: files written before the flag still match
            described["onebit_live"] = self.live_pattern
        if self.kappa:
            described["onebit_variance_kappa"] = self.kappa
        return described

    def reset(self, size) -> str:
        layout = Layout(self.frozen_shapes, size)
        self.error.assign(tf.zeros([layout.padded]))
        self.server_error.assign(tf.zeros([layout.served]))
        return f"gradient compression: error buffers restarted at zero on all {size} ranks"

    def own(self) -> list:
        """This rank's own buffers (its error feedback; never sent to another rank)."""
        return [self.error, self.server_error]

    def shared(self) -> list:
        return []

    def wait_for_ranks(self):
        return None if self.alone else exchange.wait_for_ranks(self.tag)

    def wire_bytes(self, size) -> float:
        if not self.signs:  # the control: a float32 allreduce
            return wire_bytes("none", self.shapes, size)
        return wire_bytes(self.method, self.shapes, size, live=self.live)

    def momentum(self) -> list:
        """m of the last update (the same on every rank): the optimizer's, or the exchange's own."""
        if self.optimizer is not None:
            return list(self.optimizer.m)
        if self._own_momentum is None:
            with tf.init_scope():
                self._own_momentum = [
                    tf.Variable(tf.zeros(s), trainable=False, name="m") for s in self.shapes
                ]
        return self._own_momentum

    def __call__(self, grads, scale=None):
        grads = [g * self.weight for g in grads] if self.weight != 1.0 else list(grads)
        scale = tf.constant(1.0) if scale is None else scale
        if self.warmup_steps:
            out = tf.cond(
                self.clock < self.warmup_steps,
                lambda: self._warmup(grads, scale),
                lambda: self._compressed(grads, scale),
            )
        else:
            out = self._compressed(grads, scale)
        if self.optimizer is None:  # the optimizer's m update, on the exchange's own m
            finite = all_finite(out)
            for m, g in zip(self.momentum(), out):
                m.assign(tf.where(finite, self.beta_1 * m + (1.0 - self.beta_1) * g / scale, m))
        if self._counts_itself:
            self.clock.assign_add(1)
        return out

    def _warmup(self, grads, scale):
        """An update of the warmup: the gradients averaged in float32; with kappa (0/1 Adam) only
        at the variance's updates, the others' gradients sent as signs."""

        def plain():
            return average(grads, f"{self.tag}_warmup", self.alone)

        if not self.kappa:
            return plain()
        return tf.cond(  # the float32 allreduce inside its branch: the sign updates skip it
            variance_update(self.clock + 1, self.kappa),
            plain,
            lambda: self._compressed(grads, scale, momentum=False),
        )

    def _compressed(self, grads, scale, momentum=True):
        """After the warmup, the momentum as signs (returned as the gradient it implies); with
        momentum=False (0/1 Adam's warmup) the gradient itself."""
        import horovod.tensorflow as hvd

        layout = Layout(self.frozen_shapes, 1 if self.alone else hvd.size())
        grads = [g / scale for g in grads]
        if self.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm)
        b1, previous = self.beta_1, self.momentum()
        frozen = [i for i in range(len(grads)) if i not in self.live]
        if momentum:
            local = [b1 * previous[i] + (1.0 - b1) * grads[i] for i in frozen]
        else:
            local = [grads[i] for i in frozen]
        # the errors of 0/1 Adam's gradient signs do not carry into the momentum's (DeepSpeed
        # zeroes them at the freeze); without kappa they are still zero there
        fresh = tf.logical_and(momentum, self.clock <= self.warmup_steps)
        worker, server = (tf.where(fresh, 0.0, e) for e in (self.error, self.server_error))
        if self.signs:
            averaged, error, server_error = compressed_allreduce(
                local, worker, server, layout, self.tag, self.alone
            )
        else:  # the control: the same momentum, averaged exactly; the errors stay zero
            averaged = average(local, f"{self.tag}_momentum", self.alone)
            error, server_error = self.error, self.server_error
        if self.optimizer is not None:  # exact zeros stay zero (the frozen v is 0 only there)
            v = [self.optimizer.v[i] for i in frozen]
            averaged = [tf.where(v > 0, a, 0.0) for v, a in zip(v, averaged)]
        out = [None] * len(grads)
        for i, a in zip(frozen, averaged):
            out[i] = ((a - b1 * previous[i]) / (1.0 - b1) if momentum else a) * scale
        live = []  # --onebit_live: the gradient itself, averaged in float32
        if self.live:
            live = average([grads[i] for i in self.live], f"{self.tag}_live", self.alone)
            for i, g in zip(self.live, live):
                out[i] = g * scale
        finite = all_finite(list(averaged) + list(live))  # an overflow anywhere: errors kept
        self.error.assign(tf.where(finite, error, self.error))
        self.server_error.assign(tf.where(finite, server_error, self.server_error))
        return out
