"""One optimizer update: precision policy, loss scaling, gradient accumulation, the allreduce hook.

An update over `accumulation_steps` micro-batches runs three kinds of function:

    for each micro-batch but the last:  accumulate   (XLA when --xla) grads summed into variables
    on the last micro-batch:            finish       (XLA when --xla) returns (sum + grads) / N
    allreduce(grads)                    plain tf.function: Horovod's collectives cannot be
                                        compiled by XLA, so the gradients leave the compiled
                                        code here, ONCE per update, after accumulation
    apply(grads)                        (XLA when --xla) unscale, skip if not finite, clip, step

`comm.allreduce_every_micro_batch=True` is the naive baseline the communication study starts from:
each micro-batch's gradients are allreduced before being summed (accumulation_steps allreduces
per update instead of one). Same result up to rounding, N times the traffic.

The hot loop never waits for the device: the dropout seed of each micro-batch is derived on the
device from the step variable, and the outputs are tensors the caller sums on the device and
fetches when it logs. `train_step(..., timed=True)` (the loop asks for it once per log interval)
fills `Trainer.timing` with the wall-clock split of that update: compute (forward/backward),
allreduce (including waiting for the slowest rank) and update seconds; it waits for the device
before each clock read, so the split stays honest where kernels run asynchronously (GPUs).

Everything the model computes is float32 at the edges: variables, gradients, losses.
"""
from __future__ import annotations

import dataclasses
import time

import tensorflow as tf

from bert_tf import ConfigError, optimization
from bert_tf.comm import CommConfig

POLICIES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}


def compute_dtype(policy: str) -> tf.DType:
    if policy not in POLICIES:
        raise ConfigError(f"unknown precision policy {policy!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[policy]


class LossScale(tf.Module):
    """Dynamic loss scale for float16: halve on a non-finite step, double after a run of good ones."""

    def __init__(self, initial=2.0 ** 15, growth_interval=2000, name=None):
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


@dataclasses.dataclass
class TrainConfig:
    precision: str = "float32"
    xla: bool = False
    accumulation_steps: int = 1
    optimizer: str = "lamb"
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    total_steps: int = 1000
    decay_power: float = 1.0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0
    comm: CommConfig = dataclasses.field(default_factory=CommConfig)

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raises ConfigError naming the flag of the first impossible value (subclasses extend it)."""
        compute_dtype(self.precision)
        if self.optimizer not in optimization.OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(optimization.OPTIMIZERS)}")
        if self.accumulation_steps < 1:
            raise ConfigError(f"--accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.total_steps < 1:
            raise ConfigError(f"--total_steps must be >= 1, got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) must be in [0, total_steps={self.total_steps}]")
        if self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate must be positive, got {self.learning_rate}")


def identity_allreduce(grads):
    return grads


class Trainer:
    """Holds the model, optimizer and loss scale, and runs updates.

    `allreduce(list_of_grads) -> list_of_grads` averages gradients across workers; the
    default (one process) returns them unchanged. `seed_offset` separates the dropout
    streams of different ranks.
    """

    def __init__(self, model, config: TrainConfig, allreduce=identity_allreduce, seed_offset=0):
        self.model = model
        self.config = config
        self.dtype = compute_dtype(config.precision)
        self.variables = list(model.trainable_variables)
        self.optimizer = optimization.Optimizer(self.variables, config.optimizer, config.weight_decay)
        self.loss_scale = LossScale() if config.precision == "mixed_float16" else None
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.micro_batches = config.accumulation_steps    # per update on this rank (elastic: resize)
        self.accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables] \
            if self.micro_batches > 1 else []
        self.seed_offset = seed_offset
        self._apply = tf.function(self._apply_impl, jit_compile=bool(config.xla))
        self._compile(allreduce)
        self.timing = {}

    def _compile(self, allreduce):
        """The functions that depend on micro_batches and on the allreduce (new ones retrace)."""
        config, jit = self.config, bool(self.config.xla)
        # micro-batch indices as device tensors made once: no Python value enters the hot loop
        self._indices = [tf.constant(i, tf.int64) for i in range(self.micro_batches)]
        self.seed_stride = self.micro_batches     # dropout streams per update
        self._accumulate = tf.function(self._accumulate_impl, jit_compile=jit)
        self._finish = tf.function(self._finish_impl, jit_compile=jit)
        self._allreduce = tf.function(allreduce)
        if config.comm.allreduce_every_micro_batch:
            self._local = tf.function(self._gradients, jit_compile=jit)
            self._add = tf.function(self._add_impl, jit_compile=jit)
            self._mean = tf.function(self._mean_impl, jit_compile=jit)

    def resize(self, indices, per_update, allreduce):
        """Elastic mode, after the rank count changed: this rank now takes micro-batches `indices` of
        the update's `per_update`, and the allreduce (rank count, weight) changes; every variable
        stays. Dropout is keyed by those indices instead of by rank, so an update draws the same masks
        at any rank count and one replayed after a failure repeats the lost one. Retraces (and with
        --xla recompiles) the forward/backward only when the number of micro-batches changed."""
        indices = list(indices)
        if len(indices) == self.micro_batches:
            self._allreduce = tf.function(allreduce)
        else:
            self.micro_batches = len(indices)
            if len(indices) > 1 and not self.accumulators:
                self.accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
            self._compile(allreduce)
        self.seed_offset, self.seed_stride = 0, per_update
        self._indices = [tf.constant(i, tf.int64) for i in indices]

    def checkpoint_items(self) -> dict:
        """The trainer's state: what a checkpoint holds to resume exactly, and what every rank
        takes from rank 0 at the start (state_variables). Accumulators are zero between updates."""
        items = {"model": self.model, "optimizer": self.optimizer, "step": self.step,
                 "skipped_steps": self.skipped_steps}
        if self.loss_scale is not None:
            items["loss_scale"] = self.loss_scale
        return items

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
            loss = out["loss"]
            if self.loss_scale is not None:
                loss = loss * self.loss_scale.scale
        grads = tape.gradient(loss, self.variables)
        return [tf.convert_to_tensor(g) for g in grads], out

    def _accumulate_impl(self, features, seed):
        grads, out = self._gradients(features, seed)
        for acc, g in zip(self.accumulators, grads):
            acc.assign_add(g)
        return out

    def _finish_impl(self, features, seed):
        grads, out = self._gradients(features, seed)
        n = self.micro_batches
        if n > 1:
            grads = [(acc + g) / n for acc, g in zip(self.accumulators, grads)]
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))
        return grads, out

    def _add_impl(self, grads):
        for acc, g in zip(self.accumulators, grads):
            acc.assign_add(g)

    def _mean_impl(self):
        grads = [acc / self.micro_batches for acc in self.accumulators]
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))
        return grads

    def _apply_impl(self, grads):
        c = self.config
        if self.loss_scale is not None:
            grads = [g / self.loss_scale.scale for g in grads]
        grad_norm = tf.linalg.global_norm(grads)
        finite = tf.math.is_finite(grad_norm)
        lr = optimization.learning_rate(self.step, c.learning_rate, c.warmup_steps, c.total_steps, c.decay_power)

        def update():
            clipped, _ = tf.clip_by_global_norm(grads, c.clip_norm, use_norm=grad_norm)
            self.optimizer.apply(clipped, self.variables, lr)
            return tf.constant(0, tf.int64)

        def skip():  # a non-finite gradient never touches the weights or the optimizer slots
            return tf.constant(1, tf.int64)

        self.skipped_steps.assign_add(tf.cond(finite, update, skip))
        if self.loss_scale is not None:
            self.loss_scale.update(finite)
        self.step.assign_add(1)
        return {"grad_norm": grad_norm, "learning_rate": lr, "finite": finite}

    # -- one update -----------------------------------------------------------------------
    def micro_batch_seed(self, index):
        """The stateless dropout seed [seed and rank (0 in elastic mode), update * seed_stride + index],
        computed by device ops from the step variable, nothing fetched (index: an int64 tensor)."""
        stream = (self.step * self.seed_stride + index) % (2 ** 31 - 1)
        base = tf.constant((self.config.seed * 7919 + self.seed_offset) % (2 ** 31 - 1), tf.int32)
        return tf.stack([base, tf.cast(stream, tf.int32)])

    def train_step(self, micro_batches, timed=False):
        """micro_batches: `self.micro_batches` feature dicts. Returns per-update metrics (tensors,
        not fetched). timed: measure the compute / allreduce / update split into `self.timing`
        (waits for the device three times; otherwise `self.timing` is {})."""
        n = self.micro_batches
        if len(micro_batches) != n:
            raise ValueError(f"expected {n} micro-batches, got {len(micro_batches)}")
        clock = _device_clock if timed else (lambda: 0.0)
        start = clock()
        if self.config.comm.allreduce_every_micro_batch:
            grads, outs, comm = self._allreduce_each(micro_batches, clock)
        else:
            outs = [self._accumulate(mb, self.micro_batch_seed(i)) for i, mb in zip(self._indices, micro_batches[:-1])]
            grads, last = self._finish(micro_batches[-1], self.micro_batch_seed(self._indices[n - 1]))
            outs.append(last)
            comm_start = clock()
            grads = self._allreduce(grads)  # <- the one allreduce per update, after accumulation
            comm = clock() - comm_start
        update_start = clock()
        info = self._apply(grads)
        end = clock()
        self.timing = {"compute_seconds": update_start - start - comm, "allreduce_seconds": comm,
                       "update_seconds": end - update_start} if timed else {}
        metrics = sum_metrics(outs)
        metrics.update(info)
        if self.loss_scale is not None:
            metrics["loss_scale"] = self.loss_scale.scale.read_value()
        return metrics


    def _allreduce_each(self, micro_batches, clock):
        """The baseline: allreduce every micro-batch's gradients, then average them."""
        outs, comm = [], 0.0
        n = len(micro_batches)
        for i, mb in zip(self._indices, micro_batches):
            grads, out = self._local(mb, self.micro_batch_seed(i))
            comm_start = clock()
            grads = self._allreduce(grads)
            comm += clock() - comm_start
            outs.append(out)
            if n > 1:
                self._add(grads)
        return (self._mean() if n > 1 else grads), outs, comm


def _device_clock():
    """perf_counter once the device has finished what was queued (asynchronous GPU kernels)."""
    tf.test.experimental.sync_devices()
    return time.perf_counter()


def sum_metrics(outs):
    """Loss terms averaged over micro-batches; counts (correct, weight) summed."""
    n = float(len(outs))
    metrics = {}
    for key in outs[0]:
        total = tf.add_n([o[key] for o in outs])
        metrics[key] = total / n if key.endswith("loss") else total
    return metrics
