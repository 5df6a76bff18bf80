"""Elastic pre-training: ranks may leave (a preempted node) or join between updates; training goes on.

    horovodrun -np 3 --min-np 2 --max-np 4 --gloo --network-interface eth0 \
        --host-discovery-script 'scripts/discover_hosts.sh hosts.live' \
        python run/pretrain.py --elastic --global_batch=... --elastic_commit_interval=10 ...

Horovod's elastic driver (horovodrun, Gloo controller) runs the discovery script every second, starts
ranks on new hosts, and blacklists hosts whose ranks failed. This module is the rank's side:

- `TrainingState` is what survives a failure: every variable of `Trainer.checkpoint_items()` (weights,
  optimizer slots, loss scale, step), the samples seen and the shared input stream's position, copied
  to host memory by `commit()` every --elastic_commit_interval updates. When a collective fails (a peer
  died or became unreachable), every survivor puts the committed copy back, Horovod re-forms the ring
  without the lost ranks, and rank 0 (the oldest survivor) broadcasts the state, so a newcomer
  receives it too; training continues at the committed update.
- The global batch never changes: the recipe's `--global_batch` is `micro_batches` micro-batches of
  `--batch_size`; with `size` ranks, rank r takes micro-batches r, r + size, ... of each update
  (input_pipeline.SharedStream), so ranks take ceil or floor(micro_batches / size) of them. Each rank
  averages its own micro-batches and the allreduce averages ranks, so a rank's average is weighted by
  `its micro-batches x size / micro_batches` before the allreduce: the update is the exact mean over
  all `global_batch` sequences for any size (weight 1 when size divides micro_batches). The learning
  rate therefore never changes. Every resize is logged (and written to metrics.jsonl, kind "elastic").
- Disk checkpoints continue as before (rank 0, every --save_interval), holding the shared stream's
  position, so a total loss resumes on any number of ranks.
"""
from __future__ import annotations

import os
import re

from bert_tf import ConfigError

# A TensorFlow error from a collective: Horovod's own words, or Gloo's (a peer's recv timing out names
# only our op, e.g. "grad_43", and gloo/transport/tcp/...).
COLLECTIVE_FAILURE = re.compile(r"horovod|gloo", re.IGNORECASE)

# What horovodrun sets for the ranks of an elastic job (horovod/runner/gloo_run.py).
ELASTIC_LAUNCH = {"HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "gloo"}


def check_launch(environ=None, gloo_built=None):
    """Raises ConfigError when this process was not started by an elastic horovodrun (Gloo controller)."""
    environ = os.environ if environ is None else environ
    if gloo_built is None:
        import horovod.tensorflow as hvd
        gloo_built = hvd.gloo_built()
    if not gloo_built:
        raise ConfigError("--elastic needs Horovod built with Gloo (horovodrun --check-build lists it; "
                          "scripts/setup.sh builds it unless BERT_TF_HOROVOD_GLOO=0)")
    if environ.get("HOROVOD_ELASTIC") != "1":
        raise ConfigError("--elastic needs an elastic launch: horovodrun -np N --min-np MIN --max-np MAX --gloo "
                          "--host-discovery-script SCRIPT python run/pretrain.py --elastic ... (HOROVOD_ELASTIC is "
                          "not set: this process was started by mpirun, by horovodrun without "
                          "--host-discovery-script/--min-np, or directly)")
    if environ.get("HOROVOD_CONTROLLER") != "gloo":
        raise ConfigError(f"--elastic needs Horovod's Gloo controller (horovodrun --gloo); this rank has "
                          f"HOROVOD_CONTROLLER={environ.get('HOROVOD_CONTROLLER', '(unset)')}")


def micro_batches_per_update(global_batch, batch_size):
    if global_batch < 1 or global_batch % batch_size:
        raise ConfigError(f"--global_batch={global_batch} must be a positive multiple of --batch_size={batch_size}")
    return global_batch // batch_size


def rank_micro_batches(micro_batches, rank, size):
    """Which of an update's micro-batches rank `rank` of `size` takes (input_pipeline.SharedStream
    hands out the same ones)."""
    return range(rank, micro_batches, size)


def rank_share(micro_batches, rank, size):
    """(micro-batches this rank takes per update, weight of its average in the ranks' average)."""
    if size > micro_batches:
        raise ConfigError(f"{size} ranks but an update has only {micro_batches} micro-batches (--global_batch / "
                          f"--batch_size): give horovodrun --max-np <= {micro_batches}, or a smaller --batch_size")
    mine = len(rank_micro_batches(micro_batches, rank, size))
    return mine, mine * size / micro_batches


def describe_share(micro_batches, batch_size, size):
    """One log line: how the global batch is split at this size."""
    counts = [len(rank_micro_batches(micro_batches, r, size)) for r in range(size)]
    split = f"{counts[0]} micro-batches per rank" if len(set(counts)) == 1 else \
        f"{max(counts)} micro-batches on ranks 0-{counts.count(max(counts)) - 1}, {min(counts)} on the others " \
        f"(their gradients weighted to an exact mean)"
    return (f"{size} ranks: global batch {micro_batches * batch_size} = {micro_batches} micro-batches of "
            f"{batch_size}, {split}")


def make_state(variables, stream, samples_seen):
    """A TrainingState (Horovod imported here: the module's pure functions need no Horovod)."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HorovodInternalError
    from bert_tf import distributed

    class TrainingState(ObjectState):
        """Variables, the shared stream's position and `samples_seen`, committed to host memory.

        Horovod's own TensorFlowState does not broadcast variables in eager TensorFlow 2 (its sync
        broadcasts only with a v1 session), so a newcomer would keep its fresh weights: this one does."""

        def __init__(self):
            self.variables, self.stream = variables, stream
            self._values = [v.numpy() for v in variables]
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                             samples_seen=samples_seen, stream_state=stream.state())

        def save(self):
            self._values = [v.numpy() for v in self.variables]
            self.stream_state = self.stream.state()
            super().save()

        def restore(self):
            for v, value in zip(self.variables, self._values):
                v.assign(value)
            super().restore()
            self.stream.restore(self.stream_state)

        def sync(self):
            try:
                distributed.broadcast_variables(self.variables, root_rank=0)
                self._values = [v.numpy() for v in self.variables]
                super().sync()                      # samples_seen and the stream's position, from rank 0
            except tf.errors.OpError as e:          # a rank lost during the sync: roll back, re-form again
                if not COLLECTIVE_FAILURE.search(e.message or ""):
                    raise
                raise HorovodInternalError(e) from e
            self.stream.restore(self.stream_state)

    return TrainingState()


def run(func, log=print):
    """hvd.elastic.run for our loop: a failed collective (any TensorFlow error naming Horovod or Gloo,
    eager or in a tf.function) is a HorovodInternalError: restore the commit, re-form, sync, go on.
    Every rank says why it stops and that it waits (Horovod's wait for --min-np ranks is silent)."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    waiting = ("waiting for Horovod to re-form the ranks (at least horovodrun --min-np of them; it gives up "
               "after --elastic-timeout, 600 s by default)")

    def wrapper(state, *args, **kwargs):
        rank = hvd.rank()
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if not COLLECTIVE_FAILURE.search(e.message or ""):
                raise
            lines = [line.strip() for line in (e.message or "").splitlines()
                     if COLLECTIVE_FAILURE.search(line) and 'File "' not in line]
            reason = (lines or ["?"])[-1][:300]
            log(f"elastic: rank {rank}: a collective failed ({type(e).__name__}: {reason}); rolling back to the "
                f"last commit, {waiting}", flush=True)
            raise HorovodInternalError(e) from e
        except HorovodInternalError as e:
            log(f"elastic: rank {rank}: a collective failed ({e}); rolling back to the last commit, {waiting}",
                flush=True)
            raise
        except HostsUpdatedInterrupt as e:
            log(f"elastic: rank {rank}: hosts {'removed' if e.skip_sync else 'added'}; {waiting}", flush=True)
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return run_fn(wrapper, reset)
