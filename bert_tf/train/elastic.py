"""Elastic pre-training: ranks may leave (a preempted node) or join between updates; training
goes on.

    horovodrun -np 3 --min-np 2 --max-np 4 --gloo --network-interface eth0 \
        --host-discovery-script 'scripts/discover_hosts.sh hosts.live' \
        python run/pretrain.py --elastic --global_batch_size=... --elastic_commit_interval=10 ...

Horovod's elastic driver (horovodrun, Gloo controller) runs the discovery script every second,
starts ranks on new hosts, and blacklists hosts whose ranks failed. This module is the rank's side,
all of it; pretraining.train is the one loop, and `Elastic` is the mode object it calls at its few
hooks. It reaches Horovod only through distributed.ElasticWorld (a test passes a stand-in).

- `TrainingState` is what survives a failure: every variable of `Trainer.checkpoint_items()`
  (weights, optimizer slots, loss scale, step, skipped steps), the samples seen and the shared input
  stream's position, copied to host memory by `commit()` every --elastic_commit_interval updates and
  at the end. When a collective fails (a peer died or became unreachable), every survivor puts the
  committed copy back, Horovod re-forms the ring without the lost ranks, and rank 0 (the oldest
  survivor) broadcasts the state, so a newcomer receives it too; training continues at the committed
  update (`Elastic.run`).
- The global batch never changes: --global_batch_size is `per_update` micro-batches of
  --micro_batch_size; with `size` ranks, rank r takes micro-batches r, r + size, ... of each update
  (`SharedStream`), so ranks take ceil or floor(per_update / size) of them. Each rank averages its
  own micro-batches and the allreduce averages ranks, so a rank's average is weighted by `its
  micro-batches x size / per_update` before the allreduce: the update is the exact mean over all
  `global_batch` sequences for any size (weight 1 when size divides per_update). The learning rate
  therefore never changes. Every resize is logged; after every (re)start, after its first update and
  at the end, metrics.jsonl gets an "elastic" record with every rank's weights digest (they must be
  equal).
- `SharedStream`: every rank reads the same single stream of serialized micro-batches, whose order
  depends on the seed and the files only (never on the rank count); update u takes the next
  `per_update` of it and rank r parses and trains on its share. All ranks' streams are at the same
  position after every update, so one state (the committed one, or the one in the checkpoint) puts
  any number of ranks at the same place. Guarantee: the micro-batches behind the committed weights
  are exactly the stream's first `samples_seen / micro_batch`, in order, each in one update; a
  failure rolls weights and stream back to the commit together, so the lost updates' micro-batches
  are read again, none skipped, none counted twice. The price: every rank reads (not parses) all
  records, `size` times the I/O of sharded files.
- Disk checkpoints continue as before (rank 0, every --save_interval, no collective), holding the
  shared stream's position, so a total loss resumes on any number of ranks.
"""

from __future__ import annotations

import hashlib
import os
import re

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.artifacts import metrics
from bert_tf.data import input_pipeline
from bert_tf.parallel import distributed, exchange_state
from bert_tf.parallel.exchange import Local
from bert_tf.train.shares import describe_share, micro_batches_per_update, rank_indices, rank_share

# A TensorFlow error from a collective: Horovod's own words, or Gloo's (a peer's recv timing out
# names only our op, e.g. "grad_43", and gloo/transport/tcp/...).
COLLECTIVE_FAILURE = re.compile(r"horovod|gloo", re.IGNORECASE)


# What horovodrun sets for the ranks of an elastic job (horovod/runner/gloo_run.py).
def check_launch(environ=None, gloo_built=None):
    """Raises ConfigError when this process was not started by an elastic horovodrun (Gloo
    controller)."""
    environ = os.environ if environ is None else environ
    if gloo_built is None:
        gloo_built = distributed.gloo_built()
    if not gloo_built:
        raise ConfigError(
            "--elastic needs Horovod built with Gloo (horovodrun --check-build lists it; "
            "scripts/setup.sh builds it unless BERT_TF_HOROVOD_GLOO=0)"
        )
    if environ.get("HOROVOD_ELASTIC") != "1":
        raise ConfigError(
            "--elastic needs an elastic launch: horovodrun -np N --min-np MIN --max-np MAX --gloo "
            "--host-discovery-script SCRIPT python run/pretrain.py --elastic ... (HOROVOD_ELASTIC "
            "is not set: this process was started by mpirun, by horovodrun without "
            "--host-discovery-script/--min-np, or directly)"
        )
    if environ.get("HOROVOD_CONTROLLER") != "gloo":
        raise ConfigError(
            f"--elastic needs Horovod's Gloo controller (horovodrun --gloo); this rank has "
            f"HOROVOD_CONTROLLER={environ.get('HOROVOD_CONTROLLER', '(unset)')}"
        )


def make_shared_stream(
    files, micro_batch, seed=0, shuffle_buffer=10000, read=tf.data.TFRecordDataset
):
    """The shared stream's dataset: serialized micro-batches of `micro_batch` records, the files
    reshuffled every pass and the records through a seeded buffer, repeated forever. It has no rank
    or size in it, so every rank builds the same one."""
    ds = input_pipeline.serialized_records(sorted(files), seed, True, shuffle_buffer, read)
    ds = ds.batch(micro_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return ds.with_options(input_pipeline.without_autotune_thread())


class SharedStream:
    """One rank's copy of the shared stream (module docstring), with the loop's input interface:
    `next_update()` reads an update's micro-batches and returns this rank's share (`set_share`),
    parsed; `capture` / `resume` keep its position in a checkpoint's InputPosition; `state` /
    `restore` are the position as bytes (the same position on every rank after the same updates; the
    bytes also hold what each rank happens to have prefetched, so they may differ)."""

    def __init__(
        self, dataset, max_seq_length, max_predictions_per_seq, masker=None, per_update=1, pack=0
    ):
        spec = input_pipeline.record_spec(
            max_seq_length, max_predictions_per_seq, masked=masker is None, pack=pack
        )

        def parse(serialized):
            features = input_pipeline.parse_features(serialized, spec)
            return masker(features) if masker is not None else features

        self.dataset, self.parse = dataset, tf.function(parse)
        self.iterator = iter(dataset)
        self.set_share(0, 1, per_update)

    def set_share(self, rank, size, per_update=None):
        """From now on this rank is `rank` of `size`, an update `per_update` micro-batches (None: as
        before)."""
        self.rank, self.size = rank, size
        self.per_update = per_update or self.per_update

    def next_update(self):
        """This rank's share of the next `per_update` micro-batches (every rank reads all of them):
        micro-batches rank, rank + size, ... (rank_indices)."""
        mine = []
        for m in range(self.per_update):
            serialized = next(self.iterator)
            if m % self.size == self.rank:
                mine.append(self.parse(serialized))
        return mine

    def state(self) -> bytes:
        return input_pipeline.iterator_state(self.iterator)

    def restore(self, state: bytes):
        self.iterator = iter(self.dataset)
        input_pipeline.restore_iterator(self.iterator, state)

    def capture(self, position, samples_seen):
        """No collective: every rank's stream is at the same place; the writer's state is saved."""
        position.store(samples_seen, [self.state()], shared=True, ranks=self.size)

    def resume(self, position) -> bool:
        """Puts the stream at the saved shared position; False when the checkpoint holds per-rank
        states."""
        if not position.is_shared():
            return False
        self.restore(position.states()[0])
        return True


def weights_digest(variables) -> str:
    """A short hash of the variables' bytes on this rank (ranks must agree on it)."""
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


class TrainingState:
    """What a failure rolls back to: the variables, the stream's position and `samples_seen`,
    committed to host memory. Horovod's own TensorFlowState does not broadcast variables in eager
    TensorFlow 2 (its sync broadcasts only with a v1 session), so a newcomer would keep its fresh
    weights: this one broadcasts them (`sync`)."""

    def __init__(self, variables, stream: SharedStream, samples_seen, world, exchange=None):
        self.variables, self.stream, self.world = variables, stream, world
        self.samples_seen = samples_seen
        # the exchange the job trains with (exchange_state.record), rank 0's at a sync
        self.exchange = exchange
        # rank 0 restored a checkpoint, no formation started since: its errors are in its files
        self.from_checkpoint = samples_seen > 0
        self.save()

    def save(self):
        self._values = [v.numpy() for v in self.variables]
        self._saved = (self.samples_seen, self.stream.state())

    def commit(self, samples_seen):
        """Save, then a collective: raises world.HostsUpdated on every rank when hosts changed."""
        self.samples_seen = samples_seen
        self.save()
        self.world.check_host_updates()

    def restore_weights(self):
        """The divergence guard's rollback: the variables of the last commit, the stream left where
        it is."""
        for v, value in zip(self.variables, self._values):
            v.assign(value)

    def restore(self):
        """Back to the last commit (this rank's own copy): its weights and its stream position."""
        self.restore_weights()
        self.samples_seen = self._saved[0]
        self.stream.restore(self._saved[1])

    def sync(self):
        """A collective: every rank takes rank 0's committed state (a newcomer its first)."""
        self.world.broadcast_variables(self.variables)
        self._values = [v.numpy() for v in self.variables]
        self._saved, self.exchange, self.from_checkpoint = self.world.broadcast_object(
            (self._saved, self.exchange, self.from_checkpoint)
        )
        self.samples_seen = self._saved[0]
        self.stream.restore(self._saved[1])


def is_collective_failure(error, world) -> bool:
    """A lost peer: Horovod's error, or a TensorFlow op error naming Horovod or Gloo (eager or
    inside a tf.function; a peer's recv timing out names only our op and gloo/transport/tcp/...)."""
    return isinstance(error, world.Failure) or (
        isinstance(error, tf.errors.OpError)
        and bool(COLLECTIVE_FAILURE.search(error.message or ""))
    )


def _failure_reason(error) -> str:
    message = str(getattr(error, "message", None) or error)
    lines = [
        line.strip()
        for line in message.splitlines()
        if COLLECTIVE_FAILURE.search(line) and 'File "' not in line
    ]
    return f"{type(error).__name__}: {(lines or [message.strip() or '?'])[-1][:300]}"


class Elastic:
    """The mode object of pretraining.train for --elastic: where an update's micro-batches come from
    (the shared stream's share), the commit, re-forming, the digest checks, who writes. `run(train)`
    runs the loop until it ends, re-forming after each failure or host change."""

    WAITING = (
        "waiting for Horovod to re-form the ranks (at least horovodrun --min-np of them; it gives "
        "up after --elastic-timeout, 600 s by default)"
    )

    def __init__(self, cfg, job, log=print, world=None):
        self.cfg, self.job, self.log = cfg, job, log
        self.world = world if world is not None else distributed.ElasticWorld()
        self.per_update = micro_batches_per_update(cfg.global_batch_size, cfg.micro_batch_size)
        # DiLoCo's anchor and momentum
        outer = list(job.outer.variables) if job.outer is not None else []
        self.state = TrainingState(
            job.trainer.state_variables() + outer,
            job.input,
            job.samples_seen,
            self.world,
            job.exchange_record,
        )
        self.rank, self.size, self.say, self.loss_weight = 0, 1, metrics.silent, 1.0
        self.samples_seen = self.start_step = 0
        self.micro = self.per_update  # the update's micro-batches (fewer during a batch warmup)

    # -- the loop's hooks ---------------------------------------------------------------------
    def begin(self, step):
        """At every (re)start, after the state's sync: the exchange agreed, this rank's share and
        role at the new size. The first formation of a job resumed from a checkpoint takes each
        rank's own error buffers back; every re-form restarts them, on every rank alike (rank 0's
        state says which, a newcomer included)."""
        job = self.job
        self.rank, self.size = self.world.rank(), self.world.size()
        self.say = self.log if self.rank == 0 else metrics.silent
        self.samples_seen, self.start_step = self.state.samples_seen, step
        self._agree_exchange()
        exchange = job.trainer.exchange
        if exchange.own() and self.state.from_checkpoint:  # rank 0's view, the same on every rank
            self.say(
                exchange_state.restore(
                    job.trainer,
                    self.cfg.checkpoint_dir,
                    step,
                    self.rank,
                    self.size,
                    self.world.gather_bytes,
                    self.world.broadcast_variables,
                )
            )
        elif exchange.own():
            self.say(exchange.reset(self.size))
        self.state.from_checkpoint = False
        if job.outer is not None and not bool(job.outer.anchored.numpy()):
            job.outer.anchor_to(job.trainer.variables)  # a fresh DiLoCo job: the synced weights
        self.micro = 0
        self.update_batch(step, self.samples_seen)
        job.writer.set_active(self.rank == 0)
        job.ckpts.set_writer(self.rank == 0)
        self.say(
            f"elastic: {describe_share(self.per_update, self.cfg.micro_batch_size, self.size)}; "
            f"from step {step} ({self.samples_seen} samples seen), committing every "
            f"{self.cfg.elastic_commit_interval} updates"
        )

    def _agree_exchange(self):
        """The job's exchange, the same on every rank: the one rank 0's state holds (the
        checkpoint's, or chosen at an earlier start), else the named one, else `auto`'s measurement
        on this formation's link."""
        trainer, cfg = self.job.trainer, self.cfg
        comm, note = exchange_state.settle_choice(cfg.comm, self.state.exchange, self._choose)
        self.state.exchange = exchange_state.record(comm)
        changed = exchange_state.record(trainer.config.comm) != self.state.exchange
        if note and (changed or self.state.from_checkpoint):  # a re-form keeps it silently
            self.say(note)
        # an allreduce is made for each share (update_batch): this formation's, with its weight
        if changed and comm.compressed:
            made = distributed.make_gradient_exchange(
                comm, trainer.variables, cfg.seed, "grad", cfg.total_steps
            )
            trainer.use_exchange(made, comm)
        elif changed:
            trainer.use_exchange(Local(), comm)

    def _choose(self):
        from bert_tf.parallel import auto_exchange

        cfg = self.cfg
        return auto_exchange.resolve(
            cfg.comm,
            self.job.trainer.model.config,
            not cfg.mlm_only,
            cfg.micro_batch_size,
            max(1, self.per_update // self.size),
            cfg.max_seq_length,
            cfg.ladder_sequences_per_second,
            self.say,
        )

    def update_batch(self, step, samples_seen) -> int:
        """The global batch of the next update: --global_batch_size, or during a batch warmup the
        curve's micro- batches at the committed sequences (at least one per rank); this rank's share
        set when it changes."""
        warmup, trainer = self.job.warmup, self.job.trainer
        micro = self.per_update
        if warmup is not None:
            micro = warmup.micro_batches_at(samples_seen, least=self.size)
        if micro != self.micro:
            self.micro = micro
            _, self.loss_weight = rank_share(micro, self.rank, self.size)
            exchange = trainer.exchange
            # one with state keeps it (DiLoCo: each rank its own updates)
            if exchange.own() or exchange.shared():
                exchange.weight = self.loss_weight
            else:  # an allreduce: this formation's, with this rank's weight
                exchange = self.world.gradient_allreduce(
                    trainer.config.comm.method == "fp16", self.loss_weight
                )
            trainer.set_share(rank_indices(micro, self.rank, self.size), self.per_update, exchange)
            self.job.input.set_share(self.rank, self.size, micro)
            trainer.batch_lr_scale.assign((micro / self.per_update) ** 0.5)
        return micro * self.cfg.micro_batch_size

    def started(self, step):
        self._agree(step, "start")

    def stop_requested(self, step, boundary) -> bool:
        return False  # no stop handlers: a signal to a rank is its node leaving

    def stop_reason(self) -> str:
        return ""  # stop_requested never says True

    def after_update(self, step):
        outer = self.job.outer
        if outer is not None:  # DiLoCo (one fragment, no delay here): the ranks agree when due
            outer.after_update(step, self.job.trainer.variables)
        # the weights agree after the first update, or under DiLoCo after the first synchronisation
        first = (
            step == self.start_step + 1
            if outer is None
            else outer.due(step) and step - self.start_step <= outer.every
        )
        if first:
            self._agree(step, "first update" if outer is None else "first synchronisation")

    def commit(self, step, samples_seen):
        if step % self.cfg.elastic_commit_interval == 0 or step == self.cfg.total_steps:
            self.state.commit(samples_seen)  # may raise world.HostsUpdated: the ranks re-form
            if self.cfg.elastic_verify_commits:
                self._agree(step, "commit")

    def end(self, step):
        self._agree(step, "end")

    def rollback(self, before_step=None) -> str:
        """The divergence guard: every rank back to its copy of the last commit (they are equal);
        there is only one, so `before_step` cannot take it further back."""
        self.state.restore_weights()
        if self.job.trainer.exchange.own():  # its residuals belong to the updates undone
            self.say(self.job.trainer.exchange.reset(self.size))
        return "the last elastic commit"

    def _agree(self, step, event):
        """A collective: every rank's weights digest, written by rank 0; a disagreement stops the
        job."""
        mine = weights_digest(self.job.trainer.model.variables).encode()
        digests = [d.decode() for d in self.world.gather_bytes(mine)]
        self.job.writer.write(
            {
                "kind": "elastic",
                "event": event,
                "step": step,
                "ranks": self.size,
                "weights_digests": digests,
                "samples_seen": self.state.samples_seen,
            }
        )
        if len(set(digests)) != 1:
            raise RuntimeError(
                f"elastic: ranks disagree on the weights after {event} at step {step}: {digests}"
            )
        self.say(
            f"elastic: {event} at step {step}: all {len(digests)} ranks hold the same weights "
            f"({digests[0]})"
        )

    # -- the retries --------------------------------------------------------------------------
    def run(self, train):
        """train(self) until it returns. A failed collective: put the commit back, re-form, take
        rank 0's state, go on. Hosts changed at a commit: re-form (and sync when a host was added).
        Every rank says why it stops and that it waits (Horovod's wait for --min-np ranks is
        silent)."""
        self.world.listen()
        skip_sync = False
        while True:
            rank = self.world.rank()
            try:
                if not skip_sync:
                    self.state.sync()
                return train(self)
            except self.world.HostsUpdated as e:
                self.log(
                    f"elastic: rank {rank}: hosts {'removed' if e.skip_sync else 'added'}; "
                    f"{self.WAITING}",
                    flush=True,
                )
                skip_sync = e.skip_sync
            except Exception as e:  # noqa: BLE001 - only collective failures are retried, the rest re-raised
                if not is_collective_failure(e, self.world):
                    raise
                self.log(
                    f"elastic: rank {rank}: a collective failed ({_failure_reason(e)}); rolling "
                    f"back to the last commit, {self.WAITING}",
                    flush=True,
                )
                self.state.restore()
                skip_sync = False
            self.world.reset()
