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

freeze_variance_after=K (--exchange=onebit; bert_tf/parallel/onebit.py sends the momentum): the
optimizer half of 1-bit Adam (Tang et al. 2021) and 1-bit LAMB (Li et al. 2021), DeepSpeed's
OnebitAdam / OnebitLamb (deepspeed/runtime/fp16/onebit/). Updates 1..K are the warmup: AdamW as
above; LAMB with its ratio r clamped to [ONEBIT_LAMB min_coeff, max_coeff] and averaged into a
per-tensor coefficient c = coeff_beta c + (1 - coeff_beta) r (from 0, skipped where r is 1). From
update K+1 on, v and its bias correction stay as they were after update K, and the gradient given is
the one the exchange reconstructed from the averaged momentum (m lands on it). 1-bit LAMB's trust
ratio is then c x factor, factor = max over the tensor of (sqrt(v_hat) + eps) / (sqrt(v_fresh_hat) +
eps), v_fresh = copy of v at K, then updated with the reconstructed g^2; blended toward 1 by min(1,
||u - wd w|| / ||u||) under weight decay, clamped to [factor_min, factor_max] and to
+-factor_threshold of the last factor (FrozenTrust holds c, the last factor and v_fresh). Departures
from DeepSpeed: bias correction (DeepSpeed has none; v_fresh's is 1 - b2^t), eps 1e-6, LayerNorm and
biases skip weight decay and the trust ratio by name, and a coefficient the warmup never set (a
resume from a checkpoint without FrozenTrust) is taken from the first frozen update's clamped ratio,
v_fresh from v. Not for StableAdamW, whose clipping reads each step's g^2 (train_config refuses the
pair). `live` (--onebit_live's indices): those variables keep the warmup's update after it, v live
with its correction 1 - b2^t (DeepSpeed OnebitAdam's `non_freeze` groups).
"""

from __future__ import annotations

import re

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import variance_schedule
from bert_tf.parallel.comm import warmup_updates
from bert_tf.train.train_config import DECAY_SHAPES, OPTIMIZERS

# Variable names (not module paths) carry the role: LayerNorm has gamma/beta, every Dense a bias.
NO_DECAY = re.compile(r"(gamma|beta|bias)")
# 1-bit LAMB's constants: DeepSpeed OnebitLamb's defaults
ONEBIT_LAMB = dict(
    max_coeff=10.0,
    min_coeff=0.01,
    coeff_beta=0.9,
    factor_max=4.0,
    factor_min=0.5,
    factor_threshold=0.1,
)


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


def onebit_warmup(config) -> int:
    """freeze_variance_after for a TrainConfig: 1-bit's float32 updates under --exchange=onebit
    (comm.warmup_updates), else 0."""
    if config.comm.method != "onebit":
        return 0
    return warmup_updates(config.comm, config.total_steps)


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
        # --onebit_variance_kappa: 0/1 Adam's variance, updated before the freeze only at the
        # updates onebit.variance_update names (0: at every one, 1-bit Adam's)
        self.variance_kappa = 0
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False, name="m") for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in variables]
        self.decay = [NO_DECAY.search(v.name) is None for v in variables]
        # --onebit_live's variables (indices): after the freeze their variance stays live
        self.live: frozenset = frozenset()

    def frozen(self):
        """Past 1-bit's warmup (a bool tensor): the variance frozen, the momentum exchanged."""
        return self.iterations >= self.freeze_variance_after

    def apply(self, grads, variables, lr, trust=None):
        """One update; `grads` already averaged over ranks (and clipped, if --clip_norm). trust:
        1-bit LAMB's FrozenTrust (with freeze_variance_after and kind lamb)."""
        if self.freeze_variance_after:
            return self._apply_onebit(grads, variables, lr, trust)
        t = tf.cast(self.iterations + 1, tf.float32)
        correction_1 = 1.0 - tf.pow(self.beta_1, t)
        correction_2 = 1.0 - tf.pow(self.beta_2, t)
        for g, w, m, v, decay in zip(grads, variables, self.m, self.v, self.decay):
            m.assign(self.beta_1 * m + (1.0 - self.beta_1) * g)
            v.assign(self.beta_2 * v + (1.0 - self.beta_2) * tf.square(g))
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

    def _apply_onebit(self, grads, variables, lr, trust):
        if self.kind not in ("adamw", "lamb") or (self.kind == "lamb" and trust is None):
            raise ValueError(
                f"--exchange=onebit: no 1-bit {self.kind} (or LAMB without FrozenTrust)"
            )
        step, kappa = self.iterations + 1, self.variance_kappa
        t = tf.cast(step, tf.float32)
        # the variance's own count of updates (0/1 Adam's fewer), for its bias correction
        counted = tf.cast(
            variance_schedule.variance_count(tf.minimum(step, self.freeze_variance_after), kappa),
            tf.float32,
        )
        corrections = (
            1.0 - tf.pow(self.beta_1, t),
            1.0 - tf.pow(self.beta_2, counted),
            1.0 - tf.pow(self.beta_2, t),  # v_fresh's, and a live tensor's
        )
        moves = variance_schedule.variance_update(step, kappa) if kappa else tf.constant(True)
        tf.cond(
            self.frozen(),
            lambda: self._onebit_step(grads, variables, lr, trust, corrections, True),
            lambda: self._onebit_step(grads, variables, lr, trust, corrections, False, moves),
        )
        self.iterations.assign_add(1)

    def _onebit_step(self, grads, variables, lr, trust, corrections, frozen, moves=None):
        """One update of 1-bit Adam/LAMB, in the warmup or (frozen) after it. moves: whether the
        variance takes this warmup update's gradient (0/1 Adam: only at its schedule's)."""
        correction_1, frozen_correction_2, live_correction_2 = corrections
        for i, (g, w, m, v, decay) in enumerate(zip(grads, variables, self.m, self.v, self.decay)):
            live = not frozen or i in self.live  # --onebit_live: Adam's own variance throughout
            m.assign(self.beta_1 * m + (1.0 - self.beta_1) * g)
            fresh = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(g)
            if i in self.live:
                v.assign(fresh)
                v_hat = v / live_correction_2
            elif live:  # the warmup: every update (1-bit Adam) or the schedule's (0/1 Adam)
                v.assign(tf.where(moves, fresh, v))
                v_hat = v / frozen_correction_2
            else:
                v_hat = v / frozen_correction_2
            plain = (m / correction_1) / (tf.sqrt(v_hat) + self.epsilon)
            update = plain + self.weight_decay * w if decay and self.weight_decay else plain
            if self.kind == "lamb" and decay:
                if not live:
                    update *= trust.frozen_ratio(i, g, w, v, plain, update, self, corrections)
                else:
                    update *= trust.warmup_ratio(i, w, update)
            w.assign_sub(lr * update)
        return tf.constant(0)

    def update_clipping(self, g, v_hat):
        """StableAdamW's factor on this tensor's learning rate: 1 / max(1, RMS), RMS =
        sqrt(mean(g^2 / max(v_hat, eps^2))) (optimi's _single_param_stableadamw). At the first
        update v_hat = g^2, so RMS <= 1: only a gradient larger than its history is clipped."""
        ratio = tf.square(g) / tf.maximum(v_hat, self.epsilon**2)
        rms = tf.sqrt(total(ratio) / tf.cast(tf.size(g), tf.float32))
        return 1.0 / tf.maximum(1.0, rms)


class FrozenTrust(tf.Module):
    """1-bit LAMB's per-tensor state (optimization's docstring): the warmup's averaged coefficient,
    the last factor and v_fresh. Its own checkpoint item ("onebit_lamb"), which older checkpoints
    lack, so the optimizer's variables stay those of every other run."""

    def __init__(self, variables, name="onebit_lamb"):
        super().__init__(name=name)
        self.coeff = [tf.Variable(0.0, trainable=False, name="coeff") for _ in variables]
        self.last_factor = [tf.Variable(1.0, trainable=False, name="last") for _ in variables]
        self.fresh = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in variables]

    def clamped_ratio(self, w, update):
        """||w|| / ||u|| clamped to [min_coeff, max_coeff]; 1 when either norm is 0."""
        w_norm, u_norm = norm(w), norm(update)
        ratio = tf.clip_by_value(
            w_norm / tf.maximum(u_norm, 1e-30), ONEBIT_LAMB["min_coeff"], ONEBIT_LAMB["max_coeff"]
        )
        return tf.where((w_norm > 0) & (u_norm > 0), ratio, 1.0)

    def warmup_ratio(self, i, w, update):
        """The warmup's ratio, averaged into tensor i's coefficient unless it is 1."""
        ratio, beta = self.clamped_ratio(w, update), ONEBIT_LAMB["coeff_beta"]
        c = self.coeff[i]
        c.assign(tf.where(ratio != 1.0, beta * c + (1.0 - beta) * ratio, c))
        return ratio

    def frozen_ratio(self, i, g, w, v, plain, update, optimizer, corrections):
        """The frozen coefficient times the fresh-variance factor (DeepSpeed OnebitLamb's); g: the
        gradient the exchange reconstructed from the averaged momentum."""
        k, eps, beta_2 = ONEBIT_LAMB, optimizer.epsilon, optimizer.beta_2
        fresh = self.fresh[i]
        start = tf.reduce_max(fresh) == 0.0  # the first frozen update: from a copy of v
        fresh.assign(beta_2 * tf.where(start, v, fresh) + (1.0 - beta_2) * tf.square(g))
        ratios = (tf.sqrt(v / corrections[1]) + eps) / (tf.sqrt(fresh / corrections[2]) + eps)
        factor, u_norm = tf.reduce_max(ratios), norm(update)
        blend = tf.minimum(1.0, norm(plain) / tf.maximum(u_norm, 1e-30))  # 1 without weight decay
        factor = tf.where(u_norm > 0, blend * factor + 1.0 - blend, factor)
        factor = tf.clip_by_value(factor, k["factor_min"], k["factor_max"])
        last = self.last_factor[i]
        factor = tf.clip_by_value(
            factor, last * (1.0 - k["factor_threshold"]), last * (1.0 + k["factor_threshold"])
        )
        last.assign(factor)
        c = self.coeff[i]
        c.assign(tf.where(c > 0, c, self.clamped_ratio(w, update)))
        return c * factor
