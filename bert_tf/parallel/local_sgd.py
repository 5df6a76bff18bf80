"""Infrequent synchronisation (--local_updates=H): DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models").

Each rank takes H optimizer updates on its own data (the inner optimizer: --optimizer with its own slots,
the learning-rate schedule as usual) and sends nothing. Then the ranks average how far their weights moved
since the last synchronisation (the outer gradient: anchor - weights, sent in float16), and an outer SGD
step with Nesterov momentum (--outer_learning_rate 0.7, --outer_momentum 0.9: DiLoCo's values) moves the
shared weights (the anchor); every rank starts the next round from them. One float16 allreduce of the
weights per H updates instead of one of the gradients per update.

After a synchronisation every rank holds the same weights; between two they differ by design, so the loop
evaluates and saves only right after one (a stop between two synchronises first). The anchor and the
momentum are checkpoint state, the same on every rank; each rank's inner optimizer slots are its own, and a
resumed run starts every rank from rank 0's.
"""
from __future__ import annotations

import tensorflow as tf

from bert_tf.parallel import watchdog


class OuterStep(tf.Module):
    """DiLoCo's outer optimizer over `variables` (the trainer's), synchronising every `every` updates."""

    def __init__(self, variables, learning_rate=0.7, momentum=0.9, every=1):
        super().__init__(name="outer_step")
        self.learning_rate, self.momentum, self.every = learning_rate, momentum, every
        self.anchor = [tf.Variable(tf.zeros_like(v), trainable=False, name=f"anchor_{i}")
                       for i, v in enumerate(variables)]
        self.velocity = [tf.Variable(tf.zeros_like(v), trainable=False, name=f"velocity_{i}")
                         for i, v in enumerate(variables)]
        self.anchored = tf.Variable(False, trainable=False, name="anchored")
        self.rounds = tf.Variable(0, dtype=tf.int64, trainable=False, name="rounds")
        self._sync = tf.function(self._sync_impl, jit_compile=False)    # Horovod's op: never compiled

    def anchor_to(self, variables):
        """A fresh start (after the broadcast of the initial weights): the first round starts from them."""
        for a, v in zip(self.anchor, variables):
            a.assign(v)
        self.anchored.assign(True)

    def due(self, step) -> bool:
        return step % self.every == 0

    def sync(self, variables):
        """The outer step on every rank (a collective): the weights become the new anchor, everywhere."""
        with watchdog.watching("the outer step's allreduce of the weights' change"):
            self._sync(variables)

    def _sync_impl(self, variables):
        import horovod.tensorflow as hvd
        deltas = [a - v for a, v in zip(self.anchor, variables)]
        if hvd.size() > 1:
            deltas = hvd.grouped_allreduce(deltas, op=hvd.Average, compression=hvd.Compression.fp16,
                                           name="outer_delta")
        for a, m, d, v in zip(self.anchor, self.velocity, deltas, variables):
            m.assign(self.momentum * m + d)
            a.assign(a - self.learning_rate * (d + self.momentum * m))      # Nesterov
            v.assign(a)
        self.rounds.assign_add(1)
