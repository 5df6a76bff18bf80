"""Infrequent synchronisation (--local_updates=H): DiLoCo (Douillard et al. 2023, "DiLoCo:
Distributed Low-Communication Training of Language Models"), optionally streamed (Streaming DiLoCo,
Douillard et al. 2025) and with quantised outer deltas.

Each rank takes H optimizer updates on its own data and sends nothing. These inner updates are the
rank's own: --optimizer with its own slots, on its --micro_batch_size x --accumulation_steps
sequences per update, at the learning-rate schedule's value (DiLoCo and OpenDiLoCo also count the
inner batch and learning rate per worker). Then the ranks average how far their weights moved since
the last synchronisation (the outer gradient: anchor - weights), and an outer SGD step with Nesterov
momentum (--outer_learning_rate 0.7, --outer_momentum 0.9: DiLoCo's values) moves the shared weights
(the anchor); every rank starts the next round from them. Momentum 0 and learning rate 1 make it
periodic weight averaging: the anchor becomes anchor - mean(anchor - weights), the ranks' mean
(to float32 rounding; --outer_delta_bits=32 sends the change unrounded).

The schedule (bert_tf/parallel/local_plan.py, `Schedule`):
- --local_updates_after=K: the first K updates are synchronous data-parallel ones (the gradients
  averaged in float32 every update: `__call__` switches on the trainer's step, so a resume in either
  phase takes the phase from the restored step, alike on every rank); the anchor is taken after
  update K, when every rank holds the same weights.
- --local_fragments=F: the variables split into F fragments (`fragments_of`: encoder layer l in
  fragment l mod F; the other tensors largest first to the lightest fragment). Fragment f's exchange
  starts after updates K + (f+1)H/F + jH, so each carries about 1/F of the model.
- --fragment_delay=τ: an exchange started after update p is sent by a background thread
  (`_Worker`: Horovod's op blocks only the thread that calls it, TensorFlow releases the GIL in
  ops, Horovod's own thread moves the bytes) while the loop trains on; after update p + τ the loop
  waits for it and takes the outer step on that fragment. The fragment's weights then become
  (1 - α) x the new anchor + α x the rank's own weights, which include the τ updates made meanwhile
  (--fragment_update_alpha=α, torchft's merge; α = 0 drops them). τ = 0: the exchange blocks.
- --outer_delta_bits: 16 a float16 allreduce (DiLoCo's transport here from the start), 32 float32,
  8 and 4 absmax-scaled codes in two phases (bert_tf/parallel/outer_quant.py): each rank's chunk k
  of its change to rank k (alltoall), rank k's mean of it coded again and gathered by all, about
  2 (N - 1) / N of one change's codes per rank, as a ring allreduce; error feedback on both sides
  (a rank adds what its last code dropped to its next change, rank k what its last code of the
  mean dropped to its next mean). Those residuals are each rank's own and are not saved: a resume
  or a rollback starts them at zero (as DeepSpeed's 1-bit Adam does on load), losing at most one
  round's rounding.

Agreement: after a plain synchronisation (F = 1, α = 0) every rank holds the same weights; between
two they differ by design, and with fragments (or α > 0) they never all agree on their own. So an
evaluation or a save first makes them agree (`agree`): the exchange in flight completes at once
(α not applied), then every fragment not just synchronised takes a blocking outer step. That is free
at DiLoCo's sync points and costs (F - 1)/F of a model exchange with fragments. A checkpoint
therefore never holds an exchange in flight; the anchor and the momentum are its state, the same on
every rank; each rank's inner optimizer slots are its own, and a resumed run starts every rank from
rank 0's.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import tensorflow as tf

from bert_tf.parallel import exchange, local_plan, outer_quant, watchdog
from bert_tf.parallel.comm import RECORD_KEY


def fragments_of(model, variables, count: int) -> list:
    """`variables`' indices per fragment (local_plan.assign_fragments): the encoder layers of
    `model` (model.encoder.layers, when it has them) strided over `count` fragments."""
    layer = {}
    for index, block in enumerate(getattr(getattr(model, "encoder", None), "layers", [])):
        for v in block.trainable_variables:
            layer[v.ref()] = index
    sizes = [int(tf.size(v)) for v in variables]
    return local_plan.assign_fragments([layer.get(v.ref()) for v in variables], sizes, count)


def make(comm, model, inner=None) -> "OuterStep":
    """The outer step of a CommConfig with --local_updates over `model`'s trainable variables
    (inner: the per-update exchange, None: each rank alone)."""
    variables = model.trainable_variables
    return OuterStep(
        variables,
        comm.outer_learning_rate,
        comm.outer_momentum,
        comm.local_updates,
        inner,
        after=comm.local_updates_after,
        fragments=fragments_of(model, variables, comm.local_fragments),
        delay=comm.fragment_delay,
        alpha=comm.fragment_update_alpha,
        bits=comm.outer_delta_bits,
    )


class _Worker:
    """One daemon thread that runs the exchanges started with a delay, in order (a daemon: a job
    failing with an exchange in flight exits without waiting for a collective that never ends,
    where a ThreadPoolExecutor's worker would be joined at exit)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> Future:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outer-exchange", daemon=True)
            self._thread.start()
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def _run(self):
        while True:
            future, fn, args = self._jobs.get()
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the loop, which raises it
                future.set_exception(e)


class _Host:
    """OuterStep's host-side state, kept out of tf.Module's tracking (not checkpointed, not
    broadcast): the fragments, the step the phase follows, the exchange in flight, which fragments
    agree, and each rank's own error-feedback residuals."""

    def __init__(self, fragments, variables, bits: int, synchronous) -> None:
        self.fragments = [list(f) for f in fragments]
        self.sizes = [sum(int(tf.size(variables[i])) for i in f) for f in self.fragments]
        self.step = None  # the trainer's update count (count_on)
        self.synchronous = synchronous  # the first K updates' allreduce
        self.pending: tuple | None = None  # (fragment, Future of its averaged deltas)
        self.clean = set(range(len(self.fragments)))  # fragments alike on every rank now
        self.worker = _Worker()
        self.waited = 0.0  # seconds the loop spent waiting for exchanges (blocking or in flight)
        # 8, 4 bits: each change cut into one chunk per rank (whole blocks); this rank's residual
        # of every chunk it sends, and of the mean of the chunk it averages
        ranks = _ranks()
        self.chunks = [local_plan.chunk_elements(n, ranks) for n in self.sizes]
        quantised = [(f, c) for f, c in enumerate(self.chunks) if bits < 16]
        self.residuals = [
            tf.Variable(tf.zeros([ranks, c]), trainable=False, name=f"outer_residual_{f}")
            for f, c in quantised
        ]
        self.mean_residuals = [
            tf.Variable(tf.zeros([1, c]), trainable=False, name=f"outer_mean_residual_{f}")
            for f, c in quantised
        ]


def _ranks() -> int:
    import horovod.tensorflow as hvd

    return hvd.size() if hvd.is_initialized() else 1


class OuterStep(tf.Module):
    """DiLoCo's outer optimizer over `variables` (the trainer's), synchronising every `every`
    updates (the module's docstring has the schedule: after, fragments, delay, alpha, bits). As the
    trainer's GradientExchange (bert_tf/parallel/exchange.py) an update's gradients go through
    `inner` (exchange.Local: each rank its own; an Allreduce over a node's ranks with
    --local_group=node), or during the first `after` updates through a float32 allreduce over every
    rank; the anchor and the momentum are its shared state. fragments: lists of `variables`'
    indices (fragments_of), one fragment of all by default. The loop calls `after_update` after
    every update and `agree` before an evaluation or a save."""

    method = "diloco"

    def __init__(
        self,
        variables,
        learning_rate=0.7,
        momentum=0.9,
        every=1,
        inner=None,
        *,
        after=0,
        fragments=None,
        delay=0,
        alpha=0.0,
        bits=16,
    ):
        super().__init__(name="outer_step")
        self.learning_rate, self.momentum, self.every = learning_rate, momentum, every
        self.inner = exchange.Local() if inner is None else inner
        self.anchor = [
            tf.Variable(tf.zeros_like(v), trainable=False, name=f"anchor_{i}")
            for i, v in enumerate(variables)
        ]
        self.velocity = [
            tf.Variable(tf.zeros_like(v), trainable=False, name=f"velocity_{i}")
            for i, v in enumerate(variables)
        ]
        self.anchored = tf.Variable(False, trainable=False, name="anchored")
        self.rounds = tf.Variable(0, dtype=tf.int64, trainable=False, name="rounds")
        fragments = fragments or [list(range(len(variables)))]
        self.schedule = local_plan.Schedule(every, after, len(fragments), delay)
        self.alpha, self.bits = alpha, bits
        synchronous = exchange.Allreduce(name="grad") if after else None
        self._host = _Host(fragments, variables, bits, synchronous)
        # Horovod's ops: never compiled
        self._local = tf.function(self._local_impl, jit_compile=False)
        self._transport = tf.function(self._transport_impl, jit_compile=False)
        self._apply = tf.function(self._apply_impl, jit_compile=False)

    # -- the exchange contract: per update, the inner exchange's (the first K: an allreduce)
    @property
    def weight(self) -> float:
        return self.inner.weight

    @weight.setter
    def weight(self, value):
        self.inner.weight = value
        if self._host.synchronous is not None:
            self._host.synchronous.weight = value

    @property
    def waited(self) -> float:
        """Seconds the loop has spent waiting for outer exchanges: the blocking ones whole, an
        overlapped one only for what was left of it when its delay was up."""
        return self._host.waited

    def count_on(self, step) -> None:
        """The trainer's update count (an int64 variable): the first `after` updates are
        synchronous."""
        self._host.step = step

    def _synchronous_now(self):
        if self._host.step is None:
            raise ValueError("OuterStep(after=K > 0) needs the trainer's step: call count_on")
        return self._host.step < self.schedule.after

    def __call__(self, grads, scale=None):
        if not self.schedule.after:
            return self.inner(grads, scale)
        return tf.cond(
            self._synchronous_now(),
            lambda: self._host.synchronous(grads, scale),
            lambda: self.inner(grads, scale),
        )

    def wait_for_ranks(self):
        if not self.schedule.after:
            return self.inner.wait_for_ranks()
        as_tensor = lambda w: (
            tf.zeros([1]) if w is None else tf.reshape(tf.cast(w, tf.float32), [1])
        )
        return tf.cond(
            self._synchronous_now(),
            lambda: as_tensor(self._host.synchronous.wait_for_ranks()),
            lambda: as_tensor(self.inner.wait_for_ranks()),
        )

    def own(self) -> list:
        return self.inner.own()

    def shared(self) -> list:
        return [*self.anchor, *self.velocity, self.anchored, self.rounds]

    def reset(self, size) -> str:
        for r in (*self._host.residuals, *self._host.mean_residuals):
            r.assign(tf.zeros_like(r))
        return self.inner.reset(size)

    def attach_clock(self, clock) -> None:
        self.inner.attach_clock(clock)

    def describe(self) -> dict:
        return {RECORD_KEY: self.method, "powersgd_rank": 0, "local_updates": self.every}

    # -- the loop's hooks
    def anchor_to(self, variables):
        """A fresh start (after the broadcast of the initial weights), or the end of the
        synchronous updates: the next round starts from them."""
        for a, v in zip(self.anchor, variables):
            a.assign(v)
        self.anchored.assign(True)

    def due(self, step) -> bool:
        """After update `step` every rank holds the same weights without a forced synchronisation:
        during the synchronous updates, and when a plain DiLoCo round (one fragment, α = 0) has
        just completed."""
        s = self.schedule
        if step <= s.after:
            return True
        return s.fragments == 1 and not self.alpha and s.complete_at(step) is not None

    def after_update(self, step, variables):
        """The schedule's work after update `step` (a collective where an exchange starts with no
        delay or completes): the anchor after update K, the exchange in flight completed, the next
        fragment's started."""
        s, host = self.schedule, self._host
        if step <= s.after:
            if s.after and step == s.after:
                self.anchor_to(variables)
            return
        host.clean = set()
        due = s.complete_at(step)  # unless an evaluation or a save completed it early
        if s.delay and due is not None and host.pending is not None and host.pending[0] == due:
            self._complete(variables, self.alpha)
        fragment = s.start_at(step)
        if fragment is not None:
            self._start(fragment, variables)
            if not s.delay:
                self._complete(variables, self.alpha)

    def agree(self, step, variables):
        """Every rank's weights made the same before an evaluation or a save after update `step`
        (a collective): the exchange in flight completed now (without α), then a blocking outer
        step for every fragment not alike already. Nothing to do during the synchronous updates or
        right after a plain DiLoCo round."""
        if step <= self.schedule.after:
            return
        if self._host.pending is not None:
            self._complete(variables, 0.0)
        for f in range(self.schedule.fragments):
            if f not in self._host.clean:
                self._start(f, variables, background=False)
                self._complete(variables, 0.0)

    def sync(self, variables):
        """An outer step on every fragment now (a collective; blocking): the weights become the new
        anchor, everywhere."""
        if self._host.pending is not None:
            self._complete(variables, 0.0)
        for f in range(self.schedule.fragments):
            self._start(f, variables, background=False)
            self._complete(variables, 0.0)

    def discard(self):
        """A rollback (the state restored from a checkpoint next): the exchange in flight awaited
        and dropped, the residuals restarted."""
        if self._host.pending is not None:
            _, future = self._host.pending
            self._host.pending = None
            with watchdog.watching("an outer exchange dropped by a rollback"):
                future.exception()
        self.reset(_ranks())
        self._host.clean = set(range(self.schedule.fragments))

    # -- one fragment's exchange: its change computed (main thread), sent, and the outer step
    def _start(self, fragment, variables, background=None):
        payload = self._local(fragment, variables)
        if background is None:
            background = self.schedule.delay > 0
        if background:
            future = self._host.worker.submit(self._transport, fragment, payload)
        else:
            future, start = Future(), time.perf_counter()
            with watchdog.watching("the outer step's exchange of the weights' change"):
                future.set_result(self._transport(fragment, payload))
            self._host.waited += time.perf_counter() - start
        self._host.pending = (fragment, future)

    def _complete(self, variables, alpha):
        pending = self._host.pending
        assert pending is not None, "no outer exchange in flight"
        fragment, future = pending
        self._host.pending = None
        start = time.perf_counter()
        with watchdog.watching(f"the outer exchange of fragment {fragment}, started earlier"):
            deltas = future.result()
        self._host.waited += time.perf_counter() - start
        self._apply(fragment, deltas, variables, float(alpha))
        if not alpha:
            self._host.clean.add(fragment)

    def _collective_name(self, fragment) -> str:
        return "outer_delta" if self.schedule.fragments == 1 else f"outer_delta_{fragment}"

    def _local_impl(self, fragment, variables):
        """This rank's change of the fragment (anchor - weights): the tensors (16, 32 bits), or
        one uint8 payload per rank's chunk, laid end to end (8, 4 bits; the residual added and
        updated)."""
        deltas = [self.anchor[i] - variables[i] for i in self._host.fragments[fragment]]
        if self.bits >= 16:
            return deltas
        residual = self._host.residuals[fragment]
        flat = tf.concat([tf.reshape(d, [-1]) for d in deltas], 0)
        rows = tf.reshape(tf.pad(flat, [[0, tf.size(residual) - tf.size(flat)]]), residual.shape)
        return tf.reshape(outer_quant.encode_with_feedback(rows, residual, self.bits), [-1])

    def _transport_impl(self, fragment, payload):
        """The ranks' mean change of the fragment, per variable (the background thread's part).
        8, 4 bits: the chunks' codes by alltoall, rank k's mean of chunk k coded again (its own
        residual) and gathered by every rank (outer_quant's docstring)."""
        import horovod.tensorflow as hvd

        ranks, name = _ranks(), self._collective_name(fragment)
        if self.bits >= 16:
            if ranks == 1:
                return list(payload)
            fp16 = hvd.Compression.fp16 if self.bits == 16 else hvd.Compression.none
            return hvd.grouped_allreduce(list(payload), op=hvd.Average, compression=fp16, name=name)
        chunk = self._host.chunks[fragment]
        mine = hvd.alltoall(payload, name=f"{name}_codes") if ranks > 1 else payload
        mean = tf.reduce_mean(
            outer_quant.decode(tf.reshape(mine, [ranks, -1]), chunk, self.bits), 0
        )
        residual = self._host.mean_residuals[fragment]
        coded = outer_quant.encode_with_feedback(mean[None], residual, self.bits)
        every = hvd.allgather(coded, name=f"{name}_means") if ranks > 1 else coded
        flat = tf.reshape(outer_quant.decode(every, chunk, self.bits), [-1])
        out, start = [], 0
        for i in self._host.fragments[fragment]:
            n = int(tf.size(self.anchor[i]))
            out.append(tf.reshape(flat[start : start + n], self.anchor[i].shape))
            start += n
        return out

    def _apply_impl(self, fragment, deltas, variables, alpha):
        """The outer step on the fragment: Nesterov momentum on the anchor, the weights set to it
        (α: merged with this rank's own)."""
        for i, d in zip(self._host.fragments[fragment], deltas):
            a, m, v = self.anchor[i], self.velocity[i], variables[i]
            m.assign(self.momentum * m + d)
            a.assign(a - self.learning_rate * (d + self.momentum * m))  # Nesterov
            v.assign(a if not alpha else (1.0 - alpha) * a + alpha * v)
        self.rounds.assign_add(1)
