"""The loop's mode objects: `Mode`, the protocol pretraining.train calls at its few hooks, and
`Static`, the mode of a fixed set of ranks (with `StopSignal`, its SIGTERM/SIGINT handling).
elastic.Elastic, the other mode, is bert_tf/train/elastic.py."""

from __future__ import annotations

import os
import signal
from typing import Callable, Protocol, runtime_checkable

from bert_tf.parallel import distributed, exchange_state
from bert_tf.train import divergence
from bert_tf.train.startup import Job


@runtime_checkable
class Mode(Protocol):
    """What differs between a fixed set of ranks (`Static`) and elastic mode (`elastic.Elastic`):
    the rank's view of the run and the hooks the loop calls. Both satisfy it
    (tests/test_pretraining.py)."""

    say: Callable[..., None]  # print on the rank that logs, nothing elsewhere
    size: int  # ranks now
    samples_seen: int  # sequences all ranks consumed before this (re)start
    loss_weight: float  # this rank's share of an update's mean (1.0 when the shares are equal)

    # at every (re)start, before the first record
    def begin(self, step: int) -> None: ...
    # after the run record is written
    def started(self, step: int) -> None: ...
    # the next update's global batch, set
    def update_batch(self, step: int, samples_seen: int) -> int: ...
    # a collective where it says so
    def stop_requested(self, step: int, boundary: bool) -> bool: ...
    # why stop_requested said True
    def stop_reason(self) -> str: ...
    def after_update(self, step: int) -> None: ...
    def commit(self, step: int, samples_seen: int) -> None: ...
    def end(self, step: int) -> None: ...
    # the divergence guard: back to a good state
    def rollback(self, before_step: int | None = None) -> str: ...


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


class Static:
    """The mode object of pretraining.train for a fixed set of ranks (elastic.Elastic is the
    other): nothing to commit or re-form; a SIGTERM/SIGINT that reached any rank saves and stops
    every rank, agreed on every `check_interval` updates and at log and save steps (the only host
    synchronisation between log intervals)."""

    loss_weight = 1.0

    def __init__(self, stop: StopSignal, job: Job, say, check_interval, solo_minutes=None):
        self.stop, self.job, self.say, self.check_interval = stop, job, say, check_interval
        # the limit on the others' wait for rank 0's restore (None: the installed)
        self.solo_minutes = solo_minutes
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
            # static runs read a PerRankInput: it has one
            setattr(self.job.input, "rank_micro_batches", k)
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
        if self.job.outer is not None:  # DiLoCo: the anchor, an outer exchange started or done
            self.job.outer.after_update(step, self.job.trainer.variables)

    def commit(self, step, samples_seen):
        pass

    def end(self, step):
        pass

    def rollback(self, before_step=None) -> str:
        """The divergence guard: rank 0 restores the newest intact checkpoint (of a step before
        `before_step`), every rank takes its state."""
        job = self.job
        if job.outer is not None:  # an outer exchange in flight belongs to the updates undone
            job.outer.discard()
        rank0 = distributed.rank() == 0
        path = job.ckpts.latest(log=self.say, before_step=before_step) if rank0 else None
        # hashing every file, then reading: the others wait, labelled
        if rank0 and path is not None:
            job.ckpts.restore(path)
        distributed.barrier(
            "rank 0's restore of a checkpoint for the divergence guard's rollback",
            self.solo_minutes,
        )
        if distributed.any_rank(rank0 and path is None):
            raise divergence.Diverged(
                f"the run diverged and {job.ckpts.directory} holds no intact checkpoint "
                + (f"before step {before_step}" if before_step is not None else "yet")
                + " to roll back to; lower --learning_rate, or save more often (--save_interval) "
                "and keep more (--keep_last)"
            )
        outer = list(job.outer.variables) if job.outer is not None else []
        distributed.broadcast_variables(job.trainer.state_variables() + outer, root_rank=0)
        # each rank its own buffers of that checkpoint (or zeros, and why)
        if job.trainer.exchange.own():
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
