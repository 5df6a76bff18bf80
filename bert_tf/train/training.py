"""One optimizer update: precision policy, loss scaling, gradient accumulation, the gradient
exchange.

`train_step` is one update over this rank's `rank_micro_batches` micro-batches
(--accumulation_steps; elastic mode sets its share with `set_share`); its public pieces are
`gradients` and `apply`:

    gradients(micro_batches):
      for each micro-batch but the last:  accumulate   (XLA when --xla) grads summed into variables
      on the last micro-batch:            finish       (XLA when --xla) returns (sum + grads) / N
    exchange(grads)                     plain tf.function: Horovod's collectives cannot be
                                        compiled by XLA, so the gradients leave the compiled
                                        code here, ONCE per update, after accumulation
    apply(grads)                        (XLA always: no matmul in it) unscale, skip if not
                                        finite, clip, step

--fuse compiles `accumulate` and `finish` with jit_compile=None under XLA auto-clustering of fusible
ops (FUSION_FLAGS, set at launch): the matmuls stay TensorFlow kernels, the element-wise work
between them is compiled and fused.

`comm.allreduce_every_micro_batch=True` is the naive baseline the communication study starts from:
each micro-batch's gradients are allreduced before being summed (accumulation_steps allreduces
per update instead of one). The same mean up to rounding (with --exchange=fp16, N float16
roundings per update instead of one), N times the traffic.

The hot loop never waits for the device: the dropout seed of each micro-batch is derived on the
device from the step variable, and the outputs are tensors the caller sums on the device and
fetches when it logs. `train_step(..., timed=True)` (the loop asks for it once per log interval)
fills `Trainer.timing` with the wall-clock split of that update: compute (forward/backward), wait
(for the slowest rank to reach the exchange: its `wait_for_ranks` barrier,
bert_tf/parallel/exchange.py), allreduce (the gradients on the link) and update seconds; it waits
for the device before each clock read, so the split stays honest where kernels run asynchronously
(GPUs).

Variables, losses and the update are float32; gradients are float32 out of the compiled code (with
--exchange=fp16 the allreduce sends, sums and divides them in float16; under mixed_float16 they
still carry the loss scale until `apply` unscales them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel.comm import live_indices
from bert_tf.parallel.exchange import Local, as_exchange
from bert_tf.train import optimization
from bert_tf.train.figures import UpdateOutput, sum_metrics
from bert_tf.parallel import watchdog
from bert_tf.train.train_config import PRECISIONS, TrainConfig  # noqa: F401  (training.TrainConfig: its old home)

POLICIES = dict(zip(PRECISIONS, (tf.float32, tf.bfloat16, tf.float16)))


def compute_dtype(policy: str) -> tf.DType:
    if policy not in POLICIES:
        raise ConfigError(f"unknown precision policy {policy!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[policy]


class LossScale(tf.Module):
    """Dynamic loss scale for float16: halve on a non-finite step, double after a run of good
    ones."""

    def __init__(self, initial=2.0**15, growth_interval=2000, name=None):
        super().__init__(name=name)
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.growth_interval = growth_interval

    def update(self, finite):
        def grow():
            full = self.good_steps + 1 >= self.growth_interval
            self.scale.assign(tf.where(full, self.scale * 2.0, self.scale))
            self.good_steps.assign(tf.where(full, tf.constant(0, tf.int64), self.good_steps + 1))

        def shrink():
            self.scale.assign(tf.maximum(self.scale / 2.0, 1.0))
            self.good_steps.assign(0)

        tf.cond(finite, grow, shrink)


# XLA auto-clustering restricted to the ops TensorFlow calls fusible (element-wise, reductions,
# softmax, shape ops), on CPUs too. Matmuls stay TensorFlow kernels: oneDNN runs them on AMX /
# AVX-512 BF16, which XLA's CPU backend in TF 2.21 does not reach (docs/results.md, "Fusion").
# TensorFlow reads TF_XLA_FLAGS once, early: it has to be in the environment when the process
# starts.
FUSION_FLAGS = ("--tf_xla_auto_jit=fusible", "--tf_xla_cpu_global_jit")
FUSION_ENV = f"TF_XLA_FLAGS='{' '.join(FUSION_FLAGS)}'"


def fusion_enabled() -> bool:
    return all(f in os.environ.get("TF_XLA_FLAGS", "").split() for f in FUSION_FLAGS)


class Trainer:
    """Holds the model, optimizer and loss scale, and runs updates.

    `exchange` (a GradientExchange, bert_tf/parallel/exchange.py; a plain function of the gradients
    also does) makes every rank's gradients the update's; the default (one process, exchange.Local)
    returns them unchanged. `seed_offset` separates the dropout streams of different ranks.
    """

    def __init__(self, model, config: TrainConfig, exchange=None, seed_offset=0):
        self.model = model
        self.config = config
        self.dtype = compute_dtype(config.precision)
        # Process-wide in TensorFlow; set per trainer so each benchmark rung gets its own. No effect
        # on CPUs.
        tf.config.experimental.enable_tensor_float_32_execution(config.tf32)
        self.variables = list(model.trainable_variables)
        self.optimizer = optimization.Optimizer(
            self.variables, config.optimizer, config.weight_decay, beta_2=config.adam_beta2
        )
        self.frozen_trust = None  # 1-bit LAMB's (use_exchange)
        self.loss_scale = LossScale() if config.precision == "mixed_float16" else None
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        # the divergence guard's view (not checkpointed): skips in a row, and its learning-rate
        # scale
        self.consecutive_skips = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="consecutive_skips"
        )
        self.lr_scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="lr_scale")
        # a batch warmup's learning-rate factor for the update's smaller batch
        # (train/batch_warmup.py)
        self.batch_lr_scale = tf.Variable(
            1.0, dtype=tf.float32, trainable=False, name="batch_lr_scale"
        )
        # the schedule's warmup and length in updates: the recipe's, or a time budget's prediction
        self.schedule = tf.Variable(
            [float(config.warmup_steps), float(config.total_steps)],
            trainable=False,
            name="schedule",
        )
        self.accumulators = []
        self.use_exchange(Local() if exchange is None else exchange)
        self.rank_micro_batches = 0  # this rank's micro-batches per update: set_share
        self._compiled = {}  # rank_micro_batches -> its compiled forward/backward pieces
        if config.fuse and not fusion_enabled():
            raise ConfigError(
                f"--fuse needs {FUSION_ENV} in the environment when the process starts (TensorFlow "
                "reads it once, early): export it, and pass it on (mpirun -x TF_XLA_FLAGS)"
            )
        # the update has no matmul: always compiled, XLA fuses LAMB's per-variable element-wise work
        self.apply = tf.function(self._apply, jit_compile=True)
        self.set_share(
            range(config.accumulation_steps), config.accumulation_steps, self.exchange, seed_offset
        )
        self.timing = {}

    def use_exchange(self, exchange, comm=None):
        """The trainer's exchange from now on (set_share puts it to work). A compressed exchange
        counts its warmup on the optimizer's updates, the clock every rank agrees on
        (compression.py). comm: settings replacing the config's (elastic mode's agreed choice)."""
        self.exchange = as_exchange(exchange)
        self.exchange.attach_clock(self.optimizer.iterations)
        if comm is not None and comm != self.config.comm:
            self.config = dataclasses.replace(self.config, comm=comm)
            self.apply = tf.function(self._apply, jit_compile=True)  # the freeze is read in tracing
        # --exchange=onebit: 1-bit Adam/LAMB's freeze (optimization.py), its momentum sent
        # (parallel/onebit.py: the exchange reads the optimizer's m)
        c, opt = self.config, self.optimizer
        opt.freeze_variance_after = optimization.onebit_warmup(c)
        if opt.freeze_variance_after:  # --onebit_live: the same variables as the exchange's
            names = [v.name for v in self.variables]
            opt.live = frozenset(live_indices(names, c.comm.onebit_live))
            opt.variance_kappa = c.comm.onebit_variance_kappa
        if opt.freeze_variance_after and opt.kind == "lamb" and self.frozen_trust is None:
            self.frozen_trust = optimization.FrozenTrust(self.variables)
        if hasattr(self.exchange, "attach_optimizer"):
            self.exchange.attach_optimizer(opt, c.clip_norm)

    @property
    def jit(self):
        """jit_compile of the forward/backward: True (--xla), None (--fuse: auto-clustering decides)
        or False."""
        return True if self.config.xla else None if self.config.fuse else False

    def _clusters(self):
        """A plain step keeps out of auto-clustering (jit_compile=False alone does not) where the
        process has it on: the ladder times plain rungs beside --fuse ones."""
        return (
            tf.xla.experimental.jit_scope(compile_ops=False)
            if self.jit is False
            else contextlib.nullcontext()
        )

    def set_share(self, indices, per_update, exchange, seed_offset=0):
        """This rank's share of an update: it trains micro-batches `indices` of the update's
        `per_update`, and `exchange` (a GradientExchange) averages gradients across ranks. Dropout
        is keyed by (seed + seed_offset, update x per_update + index): the constructor passes every
        index of its --accumulation_steps and seed_offset=rank (each rank its own stream); elastic
        mode passes the micro-batches' places in the global update and 0, so an update draws the
        same masks at any rank count and one replayed after a failure repeats the lost one.
        Accumulators are zeroed (an update cut short by a failure leaves nothing behind). Retraces
        (with --xla recompiles) the forward/backward only when this rank's number of micro-batches
        changes."""
        indices = list(indices)
        if not indices:
            raise ValueError("a rank's share of an update needs at least one micro-batch")
        jit = self.jit
        if len(indices) != self.rank_micro_batches:
            self.rank_micro_batches = len(indices)
            if self.rank_micro_batches > 1 and not self.accumulators:
                self.accumulators = [
                    tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables
                ]
            # one compiled set per share size: an elastic batch warmup goes back and forth between a
            # few
            if self.rank_micro_batches not in self._compiled:
                impls = [self._accumulate_impl, self._finish_impl]
                if self.config.comm.allreduce_every_micro_batch:
                    impls += [self._local_impl, self._add_impl, self._mean_impl]
                self._compiled[self.rank_micro_batches] = [
                    tf.function(f, jit_compile=jit) for f in impls
                ]
            compiled = self._compiled[self.rank_micro_batches]
            self._accumulate, self._finish = compiled[:2]
            if self.config.comm.allreduce_every_micro_batch:
                self._local, self._add, self._mean = compiled[2:]
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))
        self.exchange = as_exchange(exchange)
        self._allreduce = tf.function(
            self.exchange, jit_compile=False
        )  # Horovod's ops: never compiled
        self._wait_for_ranks = tf.function(self.exchange.wait_for_ranks, jit_compile=False)
        self.indices, self.per_update, self.seed_offset = indices, per_update, seed_offset
        # micro-batch indices as device tensors made once: no Python value enters the hot loop
        self._index_tensors = [tf.constant(i, tf.int64) for i in indices]

    def checkpoint_items(self) -> dict:
        """The trainer's state: what a checkpoint holds to resume exactly, and what every rank
        takes from rank 0 at the start (state_variables). Accumulators are zero between updates."""
        items = {
            "model": self.model,
            "optimizer": self.optimizer,
            "step": self.step,
            "skipped_steps": self.skipped_steps,
        }
        if self.frozen_trust is not None:
            items["onebit_lamb"] = self.frozen_trust
        if self.loss_scale is not None:
            items["loss_scale"] = self.loss_scale
        return items  # an exchange's own buffers are each rank's own: exchange_state.py writes them

    def state_variables(self) -> list:
        """Every variable of checkpoint_items(), for the broadcast from rank 0."""
        out = []
        for item in self.checkpoint_items().values():
            out += [item] if isinstance(item, tf.Variable) else list(item.variables)
        return out

    # -- compiled pieces ------------------------------------------------------------------
    def _gradients(self, features, seed):
        with tf.GradientTape() as tape:
            out = self.model(features, dtype=self.dtype, seed=seed, training=True)
            loss = out.loss
            if self.loss_scale is not None:
                loss = loss * self.loss_scale.scale
        # zeros for variables the loss does not reach (a span head leaves the pooler out)
        grads = tape.gradient(
            loss, self.variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return [tf.convert_to_tensor(g) for g in grads], out

    def _accumulate_impl(self, features, seed):
        with self._clusters():
            grads, out = self._gradients(features, seed)
            for acc, g in zip(self.accumulators, grads):
                acc.assign_add(g)
            return out

    def _finish_impl(self, features, seed):
        with self._clusters():
            grads, out = self._gradients(features, seed)
            n = self.rank_micro_batches
            if n > 1:
                grads = [(acc + g) / n for acc, g in zip(self.accumulators, grads)]
                for acc in self.accumulators:
                    acc.assign(tf.zeros_like(acc))
            return grads, out

    def _local_impl(self, features, seed):
        with self._clusters():
            return self._gradients(features, seed)

    def _add_impl(self, grads):
        with self._clusters():
            for acc, g in zip(self.accumulators, grads):
                acc.assign_add(g)

    def _mean_impl(self):
        with self._clusters():
            grads = [acc / self.rank_micro_batches for acc in self.accumulators]
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))
            return grads

    def _apply(self, grads):
        """`apply` (always XLA-compiled): unscale, skip if not finite, clip, one optimizer step."""
        c = self.config
        if self.loss_scale is not None:
            grads = [g / self.loss_scale.scale for g in grads]
        grad_norm = optimization.global_norm(grads)
        finite = tf.math.is_finite(grad_norm)
        lr = optimization.learning_rate(
            self.step,
            c.learning_rate,
            self.schedule[0],
            self.schedule[1],
            c.decay_power,
            decay_fraction=c.decay_fraction if c.schedule == "wsd" else None,
            shape=c.decay_shape,
        )
        lr = lr * self.lr_scale * self.batch_lr_scale

        def update():
            clipped = grads  # --clip_norm=0: none (StableAdamW clips its updates instead)
            if c.clip_norm:
                clipped, _ = tf.clip_by_global_norm(grads, c.clip_norm, use_norm=grad_norm)
            if c.clip_norm and getattr(self.exchange, "optimizer", None) is self.optimizer:
                frozen = self.optimizer.frozen()  # 1-bit: each rank clipped its own gradient
                clipped = [tf.where(frozen, g, k) for g, k in zip(grads, clipped)]
            self.optimizer.apply(clipped, self.variables, lr, self.frozen_trust)
            return tf.constant(0, tf.int64)

        def skip():  # a non-finite gradient never touches the weights or the optimizer slots
            return tf.constant(1, tf.int64)

        skipped = tf.cond(finite, update, skip)
        self.skipped_steps.assign_add(skipped)
        self.consecutive_skips.assign((self.consecutive_skips + skipped) * skipped)
        if self.loss_scale is not None:
            self.loss_scale.update(finite)
        self.step.assign_add(1)
        return {"grad_norm": grad_norm, "learning_rate": lr, "finite": finite}

    # -- one update -----------------------------------------------------------------------
    def micro_batch_seed(self, index):
        """The stateless dropout seed [seed and seed_offset, update x per_update + index]
        (set_share), computed by device ops from the step variable, nothing fetched (index: an int
        or int64 tensor)."""
        stream = (self.step * self.per_update + tf.cast(index, tf.int64)) % (2**31 - 1)
        base = tf.constant((self.config.seed * 7919 + self.seed_offset) % (2**31 - 1), tf.int32)
        return tf.stack([base, tf.cast(stream, tf.int32)])

    def gradients(self, micro_batches):
        """This rank's mean gradient over its micro-batches (`rank_micro_batches` feature dicts),
        before any allreduce, and each micro-batch's outputs."""
        n = self.rank_micro_batches
        if len(micro_batches) != n:
            raise ValueError(f"expected {n} micro-batches, got {len(micro_batches)}")
        seeds = [self.micro_batch_seed(i) for i in self._index_tensors]
        outs = [self._accumulate(mb, seed) for mb, seed in zip(micro_batches[:-1], seeds[:-1])]
        grads, last = self._finish(micro_batches[-1], seeds[-1])
        return grads, outs + [last]

    def train_step(self, micro_batches, timed=False) -> UpdateOutput:
        """One update: gradients, the allreduce, apply. micro_batches: `self.rank_micro_batches`
        feature dicts. Returns its UpdateOutput (tensors, not fetched). timed: measure the compute /
        allreduce / update split into `self.timing` (waits for the device three times; otherwise
        `self.timing` is {})."""
        clock = _device_clock if timed else (lambda: 0.0)
        start = clock()
        if self.config.comm.allreduce_every_micro_batch:
            grads, outs, (wait, comm) = self._allreduce_each(micro_batches, clock, timed)
        else:
            grads, outs = self.gradients(micro_batches)
            wait, comm_start = self._wait(clock, timed), clock()
            with watchdog.watching("the gradient allreduce"):
                if self.loss_scale is not None:  # an exchange's buffers keep unscaled values
                    grads = self._allreduce(grads, self.loss_scale.scale.read_value())
                else:
                    grads = self._allreduce(
                        grads
                    )  # <- the one allreduce per update, after accumulation
            comm = clock() - comm_start
        update_start = clock()
        info = self.apply(grads)
        end = clock()
        self.timing = (
            {
                "compute_seconds": update_start - start - wait - comm,
                "wait_seconds": wait,
                "allreduce_seconds": comm,
                "update_seconds": end - update_start,
            }
            if timed
            else {}
        )
        packed = "next_sentence_weights" in micro_batches[0]
        return UpdateOutput(
            output=sum_metrics(outs),
            grad_norm=info["grad_norm"],
            learning_rate=info["learning_rate"],
            finite=info["finite"],
            # sequences this rank trained on (a count): what the logged throughput and batch checks
            # use
            sequences=tf.add_n([tf.shape(mb["input_ids"])[0] for mb in micro_batches]),
            # what the rows held: non-padding tokens, and instances where rows are packed
            useful_tokens=tf.add_n([tf.reduce_sum(mb["input_mask"]) for mb in micro_batches]),
            instances=tf.add_n([tf.reduce_sum(mb["next_sentence_weights"]) for mb in micro_batches])
            if packed
            else None,
            loss_scale=self.loss_scale.scale.read_value() if self.loss_scale is not None else None,
        )

    def _wait(self, clock, timed):
        """Seconds spent waiting for every rank to reach the allreduce (timed updates only: the
        barrier is one more collective, which untimed updates do not pay)."""
        if not timed:
            return 0.0
        start = clock()
        with watchdog.watching("the barrier before the gradient allreduce"):
            self._wait_for_ranks()
        return clock() - start

    def _allreduce_each(self, micro_batches, clock, timed):
        """The baseline: allreduce every micro-batch's gradients, then average them. Returns the
        mean gradients, the outputs and (wait, allreduce) seconds."""
        n = self.rank_micro_batches
        if len(micro_batches) != n:
            raise ValueError(f"expected {n} micro-batches, got {len(micro_batches)}")
        outs, wait, comm = [], 0.0, 0.0
        for i, mb in zip(self._index_tensors, micro_batches):
            grads, out = self._local(mb, self.micro_batch_seed(i))
            wait += self._wait(clock, timed)
            comm_start = clock()
            with watchdog.watching("a micro-batch's gradient allreduce"):
                grads = self._allreduce(grads)
            comm += clock() - comm_start
            outs.append(out)
            if n > 1:
                self._add(grads)
        return (self._mean() if n > 1 else grads), outs, (wait, comm)


def _device_clock():
    """perf_counter once the device has finished what was queued (asynchronous GPU kernels)."""
    tf.test.experimental.sync_devices()
    return time.perf_counter()
