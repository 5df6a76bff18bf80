"""Pre-training: `run(config)`, from flags' values to a trained checkpoint.

Every rank runs the same code. Rank 0 alone writes checkpoints, metrics and progress;
every rank reads checkpoints (elastic mode: rank 0 alone, the others take its state in the first
sync). Order of events:

    PretrainConfig checks its values (before any work) -> resolved() applies --fit_micro_batch
    -> Horovod knobs -> hvd.init
    -> build: check the records, model + optimizer variables, restore (resume) or
       --init_checkpoint, broadcast from rank 0, input at the restored position -> a Job
    -> train: the one loop (accumulate micro-batches, allreduce once, update; log / eval / save /
       stop), with a mode object for what differs: `Static` (fixed ranks, SIGTERM/SIGINT save and
       stop) or elastic.Elastic (--elastic: commits, re-forming, weights digests;
       bert_tf/train/elastic.py)

--elastic: build leaves the agreement to the elastic state's first sync (no collective before it, so
a rank that joins later runs the same code).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from typing import Callable, Protocol, runtime_checkable

import tensorflow as tf

from bert_tf.artifacts import checkpointing, metrics
from bert_tf.parallel import distributed, exchange_state, watchdog
from bert_tf.train import budget, divergence, elastic, training
from bert_tf.train.pretrain_config import PretrainConfig
from bert_tf.train.startup import Job, build


@runtime_checkable
class Mode(Protocol):
    """What differs between a fixed set of ranks (`Static`) and elastic mode (`elastic.Elastic`):
    the rank's view of the run and the hooks the loop calls. Both satisfy it
    (tests/test_pretraining.py)."""

    say: Callable[..., None]  # print on the rank that logs, nothing elsewhere
    size: int  # ranks now
    samples_seen: int  # sequences all ranks consumed before this (re)start
    loss_weight: float  # this rank's share of an update's mean (1.0 when the shares are equal)

    def begin(self, step: int) -> None: ...  # at every (re)start, before the first record
    def started(self, step: int) -> None: ...  # after the run record is written
    def update_batch(
        self, step: int, samples_seen: int
    ) -> int: ...  # the next update's global batch, set
    def stop_requested(
        self, step: int, boundary: bool
    ) -> bool: ...  # a collective where it says so
    def stop_reason(self) -> str: ...  # why stop_requested said True
    def after_update(self, step: int) -> None: ...
    def commit(self, step: int, samples_seen: int) -> None: ...
    def end(self, step: int) -> None: ...
    def rollback(
        self, before_step: int | None = None
    ) -> str: ...  # the divergence guard: back to a good state


class StopSignal:
    """Remembers SIGTERM/SIGINT so the loop can save and leave at the next step boundary; as a
    context manager, puts the handlers that were there before back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def handle(self, signum, frame):
        self.received = signal.Signals(signum).name


def run(cfg: PretrainConfig, log=print):
    """Pre-trains; returns (trainer, final metrics dict). `cfg` is what was asked; the run uses
    cfg.resolved(), and its run record holds both."""
    asked, cfg = cfg, cfg.resolved()
    if cfg.elastic:
        elastic.check_launch()  # before hvd.init: without an elastic launch it would wait forever
    knobs = distributed.configure(
        cfg.comm, cfg.horovod_timeline or None, cfg.horovod_autotune, cfg.elastic
    )
    hvd = distributed.init(cfg.intra_op_threads, cfg.inter_op_threads)
    say = log if distributed.rank() == 0 else metrics.silent
    say(distributed.describe(hvd))
    if (
        not cfg.elastic and distributed.size() > 1
    ):  # elastic mode: Horovod re-forms without the lost rank
        watchdog.install(
            cfg.comm.collective_timeout_minutes,
            distributed.rank(),
            distributed.size(),
            None if "://" in cfg.checkpoint_dir else os.path.join(cfg.checkpoint_dir, ".watchdog"),
        )
    job = build(cfg, say, asked)
    if not cfg.elastic and distributed.size() > 1 and distributed.rank() == 0:
        _warn_on_save_time(cfg, job, say)
    say("horovod: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in knobs.items()))
    try:
        if cfg.elastic:
            return job.trainer, elastic.Elastic(cfg, job, log).run(
                lambda mode: train(cfg, job, mode)
            )
        with StopSignal() as stop:
            return job.trainer, train(
                cfg, job, Static(stop, job, say, cfg.stop_check_interval, solo_minutes(cfg))
            )
    finally:
        job.writer.close()


def solo_minutes(cfg: PretrainConfig) -> float:
    """The limit on the other ranks' wait for rank 0's solo work (a save, a restore):
    watchdog.solo_minutes."""
    return watchdog.solo_minutes(cfg.comm.collective_timeout_minutes, cfg.comm.save_timeout_minutes)


def _warn_on_save_time(cfg: PretrainConfig, job: Job, say):
    """Rank 0, at start-up: a warning when the latest checkpoint's JSON says a save took longer than
    the other ranks may wait for it (watchdog.timeout_warning); its figure carries on into the next
    checkpoint's JSON."""
    latest = job.ckpts.manager.latest_checkpoint if job.ckpts.manager is not None else None
    seconds = checkpointing.read_extra(latest).get("save_seconds") if latest else None
    if seconds:
        job.checkpoint_extra.setdefault("save_seconds", seconds)
    warning = watchdog.timeout_warning(
        cfg.comm.collective_timeout_minutes, cfg.comm.save_timeout_minutes, seconds
    )
    if warning:
        say(warning)


class IntervalMetrics:
    """Sums one log interval's per-update outputs on the device (no fetch per update) and the
    timed updates' splits on this rank; `record` fetches the sums once, turns them into a
    "train" record (metrics.TrainRecord: losses and accuracies over all ranks) and starts the next
    interval."""

    SUMMED = (
        "loss",
        "mlm_loss",
        "nsp_loss",
        "mlm_correct",
        "mlm_weight",
        "nsp_correct",
        "nsp_count",
        "sequences",
        "useful_tokens",
        "instances",
    )

    def __init__(self, global_batch, seq_length, network_interface="", loss_weight=1.0):
        self.global_batch_size, self.seq_length, self.interface = (
            global_batch,
            seq_length,
            network_interface,
        )
        # elastic mode with uneven shares: this rank's losses weighted like its gradients, so the
        # ranks' average is the mean over the whole global batch
        self.loss_weight = loss_weight
        self.tx_start = metrics.read_tx_bytes(network_interface) if network_interface else 0
        self._reset()

    def _reset(self):
        self.start, self.updates, self.sums, self.timing, self.timed = time.time(), 0, {}, {}, 0

    def add(self, out: training.UpdateOutput, timing):
        """out: one update's outputs (tensors stay on the device); timing: its split, or {}."""
        self.updates += 1
        figures = out.figures()
        for key in self.SUMMED:
            if key in figures:
                value = tf.cast(figures[key], tf.float64) * (
                    self.loss_weight if training.is_mean(key) else 1.0
                )
                self.sums[key] = self.sums[key] + value if key in self.sums else value
        if timing:
            self.timed += 1
            for key, seconds in timing.items():
                self.timing[key] = self.timing.get(key, 0.0) + seconds

    def record(self, step, out: training.UpdateOutput) -> metrics.TrainRecord:
        """A collective: every rank calls it at the same step. `out`: the last update's outputs."""
        size = distributed.size()
        total = distributed.sum_across_ranks(self.sums)
        seconds = time.time() - self.start
        n = self.updates
        trained = float(
            total.get("sequences", n * self.global_batch_size)
        )  # a batch warmup's updates are smaller
        tx = None
        if self.interface:
            tx_now = metrics.read_tx_bytes(self.interface)
            tx, self.tx_start = (tx_now - self.tx_start) / n, tx_now
        record = metrics.TrainRecord(
            step=step,
            **{key: value / (n * size) for key, value in total.items() if training.is_mean(key)},
            **metrics.accuracies(total),
            learning_rate=float(out.learning_rate),
            grad_norm=float(out.grad_norm),
            sequences_per_second=trained / seconds,
            tokens_per_second=trained * self.seq_length / seconds,
            sequences=int(total["sequences"])
            if "sequences" in total
            else None,  # trained, all ranks
            # non-padding tokens (and with packed rows, instances) over all ranks
            **{
                f"{key}_per_second": float(total[key]) / seconds
                for key in ("useful_tokens", "instances")
                if key in total
            },
            **{key: value / self.timed for key, value in self.timing.items()},  # this rank's split
            tx_bytes_per_update=tx,
            loss_scale=None if out.loss_scale is None else float(out.loss_scale),
        )
        self._reset()
        return record


class Static:
    """The mode object of `train` for a fixed set of ranks (elastic.Elastic is the other): nothing
    to commit or re-form; a SIGTERM/SIGINT that reached any rank saves and stops every rank, agreed
    on every `check_interval` updates and at log and save steps (the only host synchronisation
    between log intervals)."""

    loss_weight = 1.0

    def __init__(self, stop: StopSignal, job: Job, say, check_interval, solo_minutes=None):
        self.stop, self.job, self.say, self.check_interval = stop, job, say, check_interval
        self.solo_minutes = (
            solo_minutes  # the limit on the others' wait for rank 0's restore (None: the installed)
        )
        self.samples_seen, self.size = job.samples_seen, distributed.size()

    def begin(self, step):
        pass

    def started(self, step):
        pass

    def update_batch(self, step, samples_seen) -> int:
        """The global batch of update `step` (0-based); with a batch warmup, its micro-batches set
        on the trainer and the input first (train/batch_warmup.py)."""
        warmup, trainer = self.job.warmup, self.job.trainer
        if warmup is None:
            return self.job.global_batch
        k = warmup.micro_batches(step)
        if k != trainer.rank_micro_batches:
            trainer.set_share(range(k), k, trainer.exchange, trainer.seed_offset)
            setattr(
                self.job.input, "rank_micro_batches", k
            )  # static runs read a PerRankInput: it has one
            trainer.batch_lr_scale.assign(warmup.lr_scale(step))
        return k * warmup.per_micro_batch

    def stop_requested(self, step, boundary) -> bool:
        """A collective on check steps: True on every rank when one received a signal."""
        return (boundary or step % self.check_interval == 0) and distributed.any_rank(
            self.stop.received is not None
        )

    def stop_reason(self) -> str:
        return self.stop.received or "a signal to another rank"

    def after_update(self, step):
        outer = self.job.outer
        if outer is not None and outer.due(step):  # DiLoCo: the ranks' weights agree again
            outer.sync(self.job.trainer.variables)

    def commit(self, step, samples_seen):
        pass

    def end(self, step):
        pass

    def rollback(self, before_step=None) -> str:
        """The divergence guard: rank 0 restores the newest intact checkpoint (of a step before
        `before_step`), every rank takes its state."""
        job = self.job
        rank0 = distributed.rank() == 0
        path = job.ckpts.latest(log=self.say, before_step=before_step) if rank0 else None
        if (
            rank0 and path is not None
        ):  # hashing every file, then reading: the others wait, labelled
            job.ckpts.restore(path)
        distributed.barrier(
            "rank 0's restore of a checkpoint for the divergence guard's rollback",
            self.solo_minutes,
        )
        if distributed.any_rank(rank0 and path is None):
            raise divergence.Diverged(
                f"the run diverged and {job.ckpts.directory} holds no intact checkpoint "
                + (f"before step {before_step}" if before_step is not None else "yet")
                + " to roll back to; lower --learning_rate, or save more often "
                "(--save_interval) and keep more (--keep_last)"
            )
        outer = list(job.outer.variables) if job.outer is not None else []
        distributed.broadcast_variables(job.trainer.state_variables() + outer, root_rank=0)
        if (
            job.trainer.exchange.own()
        ):  # each rank its own buffers of that checkpoint (or zeros, and why)
            self.say(
                exchange_state.restore(
                    job.trainer,
                    job.ckpts.directory,
                    int(job.trainer.step.numpy()),
                    distributed.rank(),
                    distributed.size(),
                    distributed.gather_bytes,
                    distributed.broadcast_variables,
                )
            )
        return os.path.basename(path) if rank0 and path is not None else "rank 0's checkpoint"


def train(cfg: PretrainConfig, job: Job, mode: Mode) -> dict:
    """The loop, from the restored step to --total_steps or a stop; returns the last record.
    `mode` (Static or elastic.Elastic) supplies the rank's view (say, size, samples_seen,
    loss_weight) and the hooks where the modes differ; elastic mode runs it again after every
    re-forming."""
    trainer, writer = job.trainer, job.writer
    start_step = step = int(trainer.step.numpy())
    _begin(job, mode, step)
    say, samples_seen = mode.say, mode.samples_seen
    interval = IntervalMetrics(
        job.global_batch, cfg.max_seq_length, cfg.network_interface, mode.loss_weight
    )
    last: metrics.TrainRecord | None = None
    plan = (
        budget.Budget(cfg.time_budget_hours, cfg.warmup_steps, cfg.total_steps, warmup=job.warmup)
        if cfg.time_budget_hours
        else None
    )
    end_step = cfg.total_steps if plan is None else sys.maxsize  # a budget ends on the clock
    why, spent = "", False  # a stop of our own: the budget or the target
    job.clock.start()
    while step < end_step:
        # Host synchronisation only at log, save and stop-check steps and elastic commits (GPU
        # kernels run ahead).
        logging = (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.total_steps
        saving = (step + 1) % cfg.save_interval == 0
        batch = mode.update_batch(step, samples_seen)
        interval.loss_weight = mode.loss_weight  # a batch warmup's shares change it (elastic mode)
        watchdog.at(f"update {step + 1}")
        out = trainer.train_step(job.input.next_update(), timed=logging)
        step += 1
        samples_seen += batch
        interval.add(out, trainer.timing)
        stopping = mode.stop_requested(step, logging or saving)
        if (
            plan is not None
            and (logging or saving or step % cfg.stop_check_interval == 0)
            and distributed.any_rank(plan.spent(job.clock))
        ):
            stopping, spent, why = True, True, f"the time budget ({cfg.time_budget_hours:g} h)"
        if logging or stopping:
            last = _log_interval(
                job, mode, interval.record(step, out), step, samples_seen, plan, start_step
            )
            reason = job.guard.observe(last.loss, int(trainer.consecutive_skips.numpy()))
            if reason and not stopping:
                step = rollback(cfg, job, mode, reason, step)
                interval = IntervalMetrics(
                    job.global_batch, cfg.max_seq_length, cfg.network_interface, mode.loss_weight
                )
                if plan is not None:
                    plan.mark = (
                        step,
                        job.clock.elapsed(),
                    )  # the rate from here (the step went back)
                continue
        mode.after_update(step)
        if (
            cfg.eval_interval
            and step % cfg.eval_interval == 0
            and step != cfg.total_steps
            and not spent
        ):
            evaluation = job.evaluate(step)
            writer.write(evaluation)
            if target_reached(cfg, job, evaluation, step, say):
                stopping, why = True, "the target MLM accuracy"
        # while the guard suspects a spike, periodic saves and commits wait: the newest stays a good
        # one
        if (
            step % cfg.save_interval == 0
            and not job.guard.suspect
            or step == cfg.total_steps
            or stopping
        ):
            _save(cfg, job, mode, step, samples_seen)
        if stopping:
            say(f"stopping at step {step} on {why or mode.stop_reason()}")
            break
        if not job.guard.suspect:
            mode.commit(step, samples_seen)
    return _finish(
        cfg,
        job,
        mode,
        step,
        last,
        stopped_early=step < cfg.total_steps and not why if plan is None else not spent,
        evaluate=step == cfg.total_steps or spent,
    )


def _save(cfg: PretrainConfig, job: Job, mode: Mode, step, samples_seen):
    """A checkpoint (rank 0 writes it; the collectives before it run on every rank)."""
    if job.outer is not None and not job.outer.due(
        step
    ):  # a stop between synchronisations: one more
        job.outer.sync(job.trainer.variables)
    job.input.capture(job.position, samples_seen)  # static: a collective
    # every rank's own error buffers to its own file (no collective), before rank 0 names the
    # checkpoint
    exchange_state.save_own(
        job.trainer, cfg.checkpoint_dir, step, distributed.rank(), mode.size, cfg.keep_last
    )
    job.clock.stamp()
    start = time.monotonic()
    path = job.ckpts.save(
        step,
        {
            "step": step,
            "samples_seen": samples_seen,
            "ranks": mode.size,
            "exchange": exchange_state.record(job.trainer.config.comm),
            **job.checkpoint_extra,
        },
    )
    if path:
        seconds = time.monotonic() - start
        job.checkpoint_extra["save_seconds"] = round(
            seconds, 3
        )  # in the next one's JSON, for a resumed run
        mode.say(f"saved {path} in {seconds:.1f} s")
    if (
        not cfg.elastic and mode.size > 1
    ):  # the others wait for it here, labelled, under the solo work's limit
        distributed.barrier(f"rank 0's save of checkpoint {step}", solo_minutes(cfg))


def _begin(job: Job, mode: Mode, step):
    """A (re)start: the mode's view, the run record, and the loaded model's held-out figures when
    continued pre-training starts from --init_checkpoint."""
    mode.begin(step)
    job.writer.write({**job.run_record, "step": step, "ranks": mode.size})
    mode.started(step)
    if job.started_from_init and job.eval_files and step == 0:
        first = job.evaluate(step)
        job.writer.write(first)
        accuracy = float("nan") if first.eval_mlm_accuracy is None else first.eval_mlm_accuracy
        mode.say(
            f"held-out before training: MLM accuracy {accuracy:.4f}, MLM loss "
            f"{first.eval_mlm_loss:.4f}"
        )


def _log_interval(
    job: Job, mode: Mode, last: metrics.TrainRecord, step, samples_seen, plan, start_step
) -> metrics.TrainRecord:
    """A log step: the interval's record completed, the budget's schedule re-predicted (rank 0's
    prediction, on every rank), written and shown."""
    trainer = job.trainer
    last = dataclasses.replace(
        last,
        skipped_steps=int(trainer.skipped_steps.numpy()),
        samples_seen=samples_seen,
        ranks=mode.size,
    )
    if plan is not None:
        trainer.schedule.assign(plan.schedule(plan.predict(step, start_step, job.clock)))
        distributed.broadcast_variables([trainer.schedule], root_rank=0)
        last = dataclasses.replace(last, budget_predicted_steps=float(trainer.schedule[1].numpy()))
    job.writer.write(last)
    job.writer.progress(step, int(trainer.schedule[1].numpy()), last, start_step)
    return last


def _finish(
    cfg: PretrainConfig,
    job: Job,
    mode: Mode,
    step,
    last: metrics.TrainRecord | None,
    stopped_early,
    evaluate,
) -> dict:
    """After the loop: the mode's end, the final held-out evaluation, the ladder comparison. Returns
    the last train record as a dict (as metrics.jsonl holds it) with the final eval_ figures and
    stopped_early."""
    say = mode.say
    mode.end(step)
    summary = metrics.as_dict(last) if last is not None else {}
    if job.eval_files and evaluate:
        final_eval = job.evaluate(step)
        job.writer.write(final_eval)
        target_reached(cfg, job, final_eval, step, say)
        summary.update(
            {k: v for k, v in metrics.as_dict(final_eval).items() if k.startswith("eval_")}
        )
    summary["stopped_early"] = stopped_early
    if cfg.ladder_sequences_per_second and "sequences_per_second" in summary:
        say(
            f"measured {summary['sequences_per_second'] / mode.size:.2f} seq/s per rank (last "
            "interval) vs "
            f"the ladder's {cfg.ladder_sequences_per_second:.2f} for this configuration"
        )
    return summary


def target_reached(cfg, job, evaluation, step, say) -> bool:
    """--target_mlm_accuracy: True (and the time to train logged) when this evaluation reaches
    it."""
    accuracy = evaluation.eval_mlm_accuracy or 0.0
    if not cfg.target_mlm_accuracy or accuracy < cfg.target_mlm_accuracy:
        return False
    seconds = job.clock.elapsed()
    job.writer.write(
        {
            "kind": "target",
            "step": step,
            "target_mlm_accuracy": cfg.target_mlm_accuracy,
            "eval_mlm_accuracy": accuracy,
            "time_to_train_seconds": seconds,
        }
    )
    say(
        f"target reached: held-out MLM accuracy {accuracy:.4f} >= {cfg.target_mlm_accuracy:g} at "
        f"step {step}; "
        f"time to train {metrics.hms(seconds)} ({seconds:.1f} s from the first update, evaluations "
        "included)"
    )
    return True


def rollback(cfg, job, mode, reason, step) -> int:
    """The divergence guard fired at `step`: back to the last good state (mode.rollback), the input
    left where it is (the window since then is skipped), the learning rate scaled; returns the step
    now."""
    bound = job.guard.older_than(step)
    job.guard.rolled_back(reason)  # raises Diverged after --max_rollbacks
    start = time.time()
    target = mode.rollback(bound)
    trainer = job.trainer
    trainer.lr_scale.assign(trainer.lr_scale * cfg.rollback_lr_scale)
    trainer.consecutive_skips.assign(0)
    back = int(trainer.step.numpy())
    job.guard.landed(step, back)
    seconds = time.time() - start
    scale = float(trainer.lr_scale.numpy())
    mode.say(
        f"divergence guard: {reason} at step {step}: rolled back to {target} (step {back}) in "
        f"{seconds:.1f} s; "
        f"{step - back} updates undone, the data they read skipped; learning rate x{scale:g} "
        f"(rollback {job.guard.rollbacks} of at most {cfg.max_rollbacks})"
    )
    job.writer.write(
        {
            "kind": "rollback",
            "step": back,
            "from_step": step,
            "reason": reason,
            "target": target,
            "seconds": seconds,
            "lr_scale": scale,
            "rollbacks": job.guard.rollbacks,
        }
    )
    return back
