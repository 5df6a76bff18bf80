"""Infrequent synchronisation (--local_updates=H): DiLoCo (Douillard et al. 2023, "DiLoCo:
Distributed Low-Communication Training of Language Models").

Each rank takes H optimizer updates on its own data (the inner optimizer: --optimizer with its own
slots, the learning-rate schedule as usual) and sends nothing. Then the ranks average how far their
weights moved since the last synchronisation (the outer gradient: anchor - weights, sent in
float16), and an outer SGD step with Nesterov momentum (--outer_learning_rate 0.7, --outer_momentum
0.9: DiLoCo's values) moves the shared weights (the anchor); every rank starts the next round from
them. One float16 allreduce of the weights per H updates instead of one of the gradients per update.

After a synchronisation every rank holds the same weights; between two they differ by design, so the
loop evaluates and saves only right after one (a stop between two synchronises first). The anchor
and the momentum are checkpoint state, the same on every rank; each rank's inner optimizer slots are
its own, and a resumed run starts every rank from rank 0's.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.parallel import exchange, watchdog
from bert_tf.parallel.comm import RECORD_KEY


class OuterStep(tf.Module):
    """DiLoCo's outer optimizer over `variables` (the trainer's), synchronising every `every`
    updates. As the trainer's GradientExchange (bert_tf/parallel/exchange.py) an update's gradients
    go through `inner` (exchange.Local: each rank its own; an Allreduce over a node's ranks with
    --local_group=node); the anchor and the momentum are its shared state."""

    method = "diloco"

    def __init__(self, variables, learning_rate=0.7, momentum=0.9, every=1, inner=None):
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
        self._sync = tf.function(self._sync_impl, jit_compile=False)  # Horovod's op: never compiled

    # -- the exchange contract: per update, the inner exchange's; the outer step is `sync`
    @property
    def weight(self) -> float:
        return self.inner.weight

    @weight.setter
    def weight(self, value):
        self.inner.weight = value

    def __call__(self, grads, scale=None):
        return self.inner(grads, scale)

    def wait_for_ranks(self):
        return self.inner.wait_for_ranks()

    def own(self) -> list:
        return self.inner.own()

    def shared(self) -> list:
        return [*self.anchor, *self.velocity, self.anchored, self.rounds]

    def reset(self, size) -> str:
        return self.inner.reset(size)

    def attach_clock(self, clock) -> None:
        self.inner.attach_clock(clock)

    def describe(self) -> dict:
        return {RECORD_KEY: self.method, "powersgd_rank": 0, "local_updates": self.every}

    def anchor_to(self, variables):
        """A fresh start (after the broadcast of the initial weights): the first round starts from
        them."""
        for a, v in zip(self.anchor, variables):
            a.assign(v)
        self.anchored.assign(True)

    def due(self, step) -> bool:
        return step % self.every == 0

    def sync(self, variables):
        """The outer step on every rank (a collective): the weights become the new anchor,
        everywhere."""
        with watchdog.watching("the outer step's allreduce of the weights' change"):
            self._sync(variables)

    def _sync_impl(self, variables):
        import horovod.tensorflow as hvd

        deltas = [a - v for a, v in zip(self.anchor, variables)]
        if hvd.size() > 1:
            deltas = hvd.grouped_allreduce(
                deltas, op=hvd.Average, compression=hvd.Compression.fp16, name="outer_delta"
            )
        for a, m, d, v in zip(self.anchor, self.velocity, deltas, variables):
            m.assign(self.momentum * m + d)
            a.assign(a - self.learning_rate * (d + self.momentum * m))  # Nesterov
            v.assign(a)
        self.rounds.assign_add(1)
