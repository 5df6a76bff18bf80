"""Optimizers (LAMB, AdamW, StableAdamW) with decoupled weight decay, and the learning-rate
schedule.

All three keep float32 slots `m`, `v` beside each variable and a step counter, `tf.Variable`s
tracked by `tf.train.Checkpoint` under the same names: a checkpoint of one restores into another.
Weight decay (and, for LAMB, the layer-wise trust ratio) skips LayerNorm parameters and biases, as
google-research/bert does.

Update for step t (g: gradient, w: weight, lr: the learning rate at t, wd: --weight_decay):
    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
    u = m_hat / (sqrt(v_hat) + eps) + wd * w       (m_hat, v_hat bias-corrected)
    AdamW:       w -= lr * u
    LAMB:        w -= lr * r * u,  r = ||w|| / ||u|| when both norms are > 0, else 1
    StableAdamW: w -= lr / max(1, RMS) * u,  RMS = sqrt(mean(g^2 / max(v_hat, eps^2))) per tensor

Weight decay: wd*w is part of u, so the learning rate multiplies it: a step shrinks a weight by
lr * wd * w (times r for LAMB, over max(1, RMS) for StableAdamW), the decay of
google-research/bert's AdamWeightDecayOptimizer, torch.optim.AdamW and optimi's default
(decouple_lr=False). MosaicBERT's and ModernBERT's optimizers (composer's DecoupledAdamW, optimi's
StableAdamW with decouple_lr=True) decouple it from the rate instead: a step shrinks w by
(lr / peak lr) * wd'. The same decay here is wd = wd' / peak lr: ModernBERT's wd' = 1e-5 at its
peak 8e-4 is wd = 1.25e-2.

StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models", Algorithm 2; optimi's StableAdamW, which ModernBERT trains with): AdamW
with Adafactor's update clipping, tensor by tensor: the learning rate over max(1, RMS), RMS from
this step's gradient against the bias-corrected v that includes it, eps^2 its floor. optimi folds
the bias corrections into the betas (its m and v are m_hat and v_hat): the same update up to
rounding. It replaces gradient clipping (ModernBERT clips none: --clip_norm=0).

freeze_variance_after=K (--exchange=onebit): from update K+1 on, v and its bias correction stay
as they were after update K (1-bit Adam, Tang et al. 2021). Adam's per-coordinate scale cannot be
estimated from sign-compressed gradients (every value +-the chunk's mean magnitude); with v fixed
the update is linear in the gradient, so error feedback's promise (the compressed gradients' sum
follows the true one) carries over to the weights. Not for StableAdamW, whose clipping reads each
step's g^2 (train_config refuses the pair).
"""

from __future__ import annotations

import re

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.train.train_config import DECAY_SHAPES, OPTIMIZERS

# Variable names (not module paths) carry the role: LayerNorm has gamma/beta, every Dense a bias.
NO_DECAY = re.compile(r"(gamma|beta|bias)")


def learning_rate(
    step,
    peak,
    warmup_steps,
    total_steps,
    power=1.0,
    end=0.0,
    decay_fraction=None,
    shape="linear",
):
    """Linear warmup to `peak`, then the decay to `end` at `total_steps` (numbers, or tensors that
    change while training: a time budget's predicted step count). decay_fraction (wsd): the decay
    starts that share of total_steps before the end (not before warmup ends); until then, `peak`.
    shape (--decay_shape), p the decay's progress from 0 to 1:
      linear  (peak - end) * (1 - p)^power + end: polynomial, google-research/bert's at power 1
      1-sqrt  (peak - end) * (1 - sqrt(p)) + end: Hägele et al. 2024's cooldown, ModernBERT's
              OneMinusSqrtScheduler (src/scheduler.py; its alpha_f is end / peak); power unused."""
    if shape not in DECAY_SHAPES:
        raise ConfigError(f"--decay_shape={shape}: valid are {', '.join(DECAY_SHAPES)}")
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
    left = (1.0 - progress) ** power if shape == "linear" else 1.0 - tf.sqrt(progress)
    decayed = (peak - end) * left + end
    return tf.where(step < warmup_steps, peak * step / warmup, decayed)


def total(x):
    """sum(x). XLA's CPU backend reduces a whole tensor on one thread (the squares of BERT-base's
    weights: 85 ms); a matrix's rows summed by a matmul with ones run on all cores (21 ms;
    docs/results.md). Not on a GPU, where reductions are fast and a float32 matmul may run in
    TF32."""
    if (
        x.shape.rank == 2
        and x.shape[0] is not None
        and x.shape[0] > 1
        and not tf.config.list_logical_devices("GPU")
    ):
        return tf.reduce_sum(tf.matmul(x, tf.ones([x.shape[1], 1], x.dtype)))
    return tf.reduce_sum(x)


def squared_norm(x):
    """sum(x^2), by `total`."""
    return total(tf.square(x))


def norm(x):
    return tf.sqrt(squared_norm(x))


def global_norm(xs):
    """tf.linalg.global_norm by squared_norm."""
    return tf.sqrt(tf.add_n([squared_norm(tf.cast(x, tf.float32)) for x in xs]))


class Optimizer(tf.Module):
    """LAMB, AdamW or StableAdamW over a fixed list of variables (built eagerly, before any
    tf.function)."""

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
        """One update; `grads` already averaged over ranks (and clipped, if --clip_norm)."""
        t = tf.cast(self.iterations + 1, tf.float32)
        correction_1 = 1.0 - tf.pow(self.beta_1, t)
        frozen = None
        if self.freeze_variance_after:
            if self.kind == "stable_adamw":
                raise ValueError("stable_adamw with a frozen variance (--exchange=onebit)")
            frozen = self.iterations >= self.freeze_variance_after
            t = tf.minimum(t, float(self.freeze_variance_after))
        correction_2 = 1.0 - tf.pow(self.beta_2, t)
        for g, w, m, v, decay in zip(grads, variables, self.m, self.v, self.decay):
            m.assign(self.beta_1 * m + (1.0 - self.beta_1) * g)
            v_next = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(g)
            v.assign(v_next if frozen is None else tf.where(frozen, v, v_next))
            v_hat = v / correction_2
            update = (m / correction_1) / (tf.sqrt(v_hat) + self.epsilon)
            if decay and self.weight_decay:
                update += self.weight_decay * w
            if self.kind == "lamb" and decay:
                w_norm, u_norm = norm(w), norm(update)
                ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
                update *= ratio
            elif self.kind == "stable_adamw":
                update *= self.update_clipping(g, v_hat)
            w.assign_sub(lr * update)
        self.iterations.assign_add(1)

    def update_clipping(self, g, v_hat):
        """StableAdamW's factor on this tensor's learning rate: 1 / max(1, RMS), RMS =
        sqrt(mean(g^2 / max(v_hat, eps^2))) (optimi's _single_param_stableadamw). At the first
        update v_hat = g^2, so RMS <= 1: only a gradient larger than its history is clipped."""
        ratio = tf.square(g) / tf.maximum(v_hat, self.epsilon**2)
        rms = tf.sqrt(total(ratio) / tf.cast(tf.size(g), tf.float32))
        return 1.0 / tf.maximum(1.0, rms)
