"""Optimizers (LAMB, AdamW) with decoupled weight decay, and the learning-rate schedule.

Both keep float32 slots `m`, `v` beside each variable and a step counter; all are
`tf.Variable`s tracked by `tf.train.Checkpoint`. Weight decay (and, for LAMB, the
layer-wise trust ratio) skips LayerNorm parameters and biases, as google-research/bert does.

Update for step t (g: gradient, w: weight, lr: learning rate):
    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
    u = m_hat / (sqrt(v_hat) + eps) + wd * w       (m_hat, v_hat bias-corrected)
    AdamW: w -= lr * u
    LAMB:  w -= lr * r * u,  r = ||w|| / ||u|| when both norms are > 0, else 1

freeze_variance_after=K (--exchange=onebit): from update K+1 on, v and its bias correction stay
as they were after update K (1-bit Adam, Tang et al. 2021). Adam's per-coordinate scale cannot be
estimated from sign-compressed gradients (every value +-the chunk's mean magnitude); with v fixed
the update is linear in the gradient, so error feedback's promise (the compressed gradients' sum
follows the true one) carries over to the weights.
"""

from __future__ import annotations

import re

import tensorflow as tf

from bert_tf.train.train_config import OPTIMIZERS

# Variable names (not module paths) carry the role: LayerNorm has gamma/beta, every Dense a bias.
NO_DECAY = re.compile(r"(gamma|beta|bias)")


def learning_rate(step, peak, warmup_steps, total_steps, power=1.0, end=0.0, decay_fraction=None):
    """Linear warmup to `peak`, then polynomial decay to `end` at `total_steps` (numbers, or tensors
    that change while training: a time budget's predicted step count). decay_fraction (wsd): the
    decay starts that share of total_steps before the end (not before warmup ends); until then,
    `peak`."""
    step = tf.cast(step, tf.float32)
    warmup_steps = tf.cast(warmup_steps, tf.float32)
    total_steps = tf.cast(total_steps, tf.float32)
    warmup = tf.maximum(warmup_steps, 1.0)
    decay_start = (
        warmup_steps
        if decay_fraction is None
        else tf.maximum(warmup_steps, total_steps * (1.0 - decay_fraction))
    )
    decay_steps = tf.maximum(total_steps - decay_start, 1.0)
    progress = tf.clip_by_value((step - decay_start) / decay_steps, 0.0, 1.0)
    decayed = (peak - end) * (1.0 - progress) ** power + end
    return tf.where(step < warmup_steps, peak * step / warmup, decayed)


def squared_norm(x):
    """sum(x^2). XLA's CPU backend reduces a whole tensor on one thread (BERT-base's weights: 85
    ms); a matrix's rows summed by a matmul with ones run on all cores (21 ms; docs/results.md). Not
    on a GPU, where reductions are fast and a float32 matmul may run in TF32."""
    if (
        x.shape.rank == 2
        and x.shape[0] is not None
        and x.shape[0] > 1
        and not tf.config.list_logical_devices("GPU")
    ):
        return tf.reduce_sum(tf.matmul(tf.square(x), tf.ones([x.shape[1], 1], x.dtype)))
    return tf.reduce_sum(tf.square(x))


def norm(x):
    return tf.sqrt(squared_norm(x))


def global_norm(xs):
    """tf.linalg.global_norm by squared_norm."""
    return tf.sqrt(tf.add_n([squared_norm(tf.cast(x, tf.float32)) for x in xs]))


class Optimizer(tf.Module):
    """LAMB or AdamW over a fixed list of variables (built eagerly, before any tf.function)."""

    def __init__(
        self,
        variables,
        kind="lamb",
        weight_decay=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        freeze_variance_after=0,
        name=None,
    ):
        super().__init__(name=name)
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}")
        self.kind = kind
        self.weight_decay = weight_decay
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.freeze_variance_after = freeze_variance_after  # 0: never
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False, name="m") for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in variables]
        self.decay = [NO_DECAY.search(v.name) is None for v in variables]

    def apply(self, grads, variables, lr):
        """One update; `grads` already averaged over ranks and clipped."""
        t = tf.cast(self.iterations + 1, tf.float32)
        correction_1 = 1.0 - tf.pow(self.beta_1, t)
        frozen = None
        if self.freeze_variance_after:
            frozen = self.iterations >= self.freeze_variance_after
            t = tf.minimum(t, float(self.freeze_variance_after))
        correction_2 = 1.0 - tf.pow(self.beta_2, t)
        for g, w, m, v, decay in zip(grads, variables, self.m, self.v, self.decay):
            m.assign(self.beta_1 * m + (1.0 - self.beta_1) * g)
            v_next = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(g)
            v.assign(v_next if frozen is None else tf.where(frozen, v, v_next))
            update = (m / correction_1) / (tf.sqrt(v / correction_2) + self.epsilon)
            if decay and self.weight_decay:
                update += self.weight_decay * w
            if self.kind == "lamb" and decay:
                w_norm, u_norm = norm(w), norm(update)
                ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
                update *= ratio
            w.assign_sub(lr * update)
        self.iterations.assign_add(1)
