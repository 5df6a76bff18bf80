"""Wall-clock training: a time budget that the learning-rate schedule follows, and time to a target.

`--time_budget_hours=H` keeps the recipe's schedule shape (warmup the recipe's fraction of its
updates, then its decay) but stretches it over the updates that H hours hold: at every log step the
measured rate of this run predicts the step count at the end of the budget (as Cramming does,
Geiping and Goldstein 2022), rank 0's prediction goes to every rank, and the run stops, saves and
evaluates when the budget is spent. The rate is counted in sequences, not updates: under a batch
warmup (--batch_warmup_sequences) the early updates are small and fast, so the sequences the rest of
the budget holds are turned into updates at the warmup's batch sizes (updates_for_sequences); the
learning-rate warmup and decay then land where the flags say, whatever the batch does. The seconds
trained so far are in the checkpoint (RunClock), so a restarted job spends only what is left.
`--target_mlm_accuracy` stops at the first evaluation that reaches it and reports MLPerf's figure,
the time to train: wall-clock from the first update, evaluations included.
"""

from __future__ import annotations

import time

import tensorflow as tf

from bert_tf.artifacts import metrics


class RunClock(tf.Module):
    """Seconds of training over all runs of a job (a checkpoint item): what the budget and time to
    target count. Runs from the first update of each run; evaluations and saves count, start-up
    not."""

    def __init__(self):
        super().__init__(name="clock")
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="seconds")
        self.base, self.t0 = 0.0, None

    def start(self):
        self.base, self.t0 = float(self.seconds.numpy()), time.time()

    def elapsed(self) -> float:
        return self.base + (time.time() - self.t0 if self.t0 is not None else 0.0)

    def stamp(self):
        """Before a save: the checkpoint holds the seconds so far."""
        self.seconds.assign(self.elapsed())


class Budget:
    """warmup: the run's BatchWarmup (None without one: every update is the full batch)."""

    def __init__(self, hours, warmup_steps, total_steps, warmup=None):
        self.seconds = hours * 3600.0
        self.warmup_fraction = warmup_steps / max(total_steps, 1)
        self.warmup = warmup
        self.mark = None  # (step, seconds) at the first prediction: the rate is measured from there

    def sequences_before(self, step) -> int:
        """Sequences trained before update `step`, in full batches without a batch warmup."""
        return step if self.warmup is None else self.warmup.sequences_before(step)

    def predict(self, step, start_step, clock: RunClock) -> float:
        """Updates the budget holds: those done plus the rest of the budget at this run's rate in
        sequences per second, measured from the first prediction on (the first interval holds the
        compilation) or, at the first, from the run's first update; the sequences turned into
        updates at the batch warmup's sizes."""
        now = clock.elapsed()
        since_step, since = self.mark or (start_step, clock.base)
        if self.mark is None:
            self.mark = (step, now)
        trained = self.sequences_before(step) - self.sequences_before(since_step)
        rate = trained / (now - since) if now > since else 0.0
        more = updates_for_sequences(self.warmup, step, max(self.seconds - now, 0.0) * rate)
        return max(float(step + more), step + 1.0)

    def schedule(self, predicted_steps) -> list:
        """[warmup, total] for the trainer's schedule variable."""
        return [self.warmup_fraction * predicted_steps, predicted_steps]

    def spent(self, clock: RunClock) -> bool:
        return clock.elapsed() >= self.seconds


def updates_for_sequences(warmup, step, sequences) -> float:
    """The updates from update `step` (0-based) on that train `sequences` sequences, the last one a
    fraction: an update at step s takes warmup.micro_batches(s) x warmup.per_micro_batch sequences,
    after the warmup the full batch. Without a warmup (None) sequences are counted in full batches
    (Budget)."""
    if warmup is None:
        return float(sequences)
    full = warmup.full * warmup.per_micro_batch
    s = step
    while s < len(warmup.steps):  # the warmup's updates left, one at a time: exact
        size = warmup.micro_batches(s) * warmup.per_micro_batch
        if sequences < size:
            return s - step + sequences / size
        sequences -= size
        s += 1
    return s - step + sequences / full


def planned_hours(cfg, size, local_size, global_batch, model_config):
    """The planner's hours for --total_steps at the ladder's measured seq/s per rank (None without
    one), with `size // local_size` nodes on 10 Gbit/s (the network is not measured at start-up)."""
    if not cfg.ladder_sequences_per_second:
        return None
    # the cost model; only a budgeted run with a ladder figure needs it
    from bert_tf.tools import model_shapes, planner

    parameters_sizes = model_shapes.gradient_tensor_shapes(model_config, nsp=not cfg.mlm_only)
    nodes = max(size // max(local_size, 1), 1)
    cluster = planner.Cluster(nodes=nodes, devices_per_node=max(size // nodes, 1), inter_gbps=10.0)
    phase = planner.Phase(
        "run",
        cfg.max_seq_length,
        cfg.total_steps * global_batch,
        global_batch,
        cfg.ladder_sequences_per_second,
    )
    row = planner.plan_phase(parameters_sizes, phase, cluster, cfg.comm, 1)
    return row["days"] * 24


def budget_plan(cfg, size, local_size, global_batch, model_config, spent_seconds) -> str:
    """The start-up line of a budgeted run: the planner's hours for --total_steps, and whether they
    fit."""
    hours = planned_hours(cfg, size, local_size, global_batch, model_config)
    text = (
        f"time budget {cfg.time_budget_hours:g} h ({metrics.hms(spent_seconds)} spent by earlier "
        f"runs): the learning-rate schedule follows the clock, stretched over the updates it holds"
    )
    if hours is None:
        return text + (
            "; no --ladder_sequences_per_second (run/benchmark.py) to predict --total_steps from: "
            "the first log interval measures the rate"
        )
    text += (
        f"; the planner gives {hours:.2f} h for --total_steps={cfg.total_steps} at the ladder's "
        f"{cfg.ladder_sequences_per_second:.2f} seq/s per rank (10 Gbit/s between nodes assumed)"
    )
    if hours > cfg.time_budget_hours:
        text += (
            ". WARNING: they will not fit: about "
            f"{cfg.total_steps * cfg.time_budget_hours / hours:,.0f} updates will"
        )
    return text
