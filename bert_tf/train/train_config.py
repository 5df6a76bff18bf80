"""The update's settings, `TrainConfig` (precision, optimizer, schedule, accumulation, the
exchange's `CommConfig`): plain values and their checks, importable without TensorFlow (the planner
and run/plan.py read them; bert_tf/train/training.py builds the trainer from them)."""

from __future__ import annotations

import dataclasses

from bert_tf import ConfigError, knob
from bert_tf.parallel.comm import ONEBIT_WARMUP_SHARE, CommConfig, warmup_updates

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# lamb: LAMB (You et al. 2019; NVIDIA's BERT recipe). adamw: AdamW (google-research/bert's).
# stable_adamw: AdamW with per-tensor update clipping (Wortsman et al. 2023; ModernBERT's). The
# update of each, and the weight decay's convention: bert_tf/train/optimization.py.
OPTIMIZERS = ("lamb", "adamw", "stable_adamw")
# polynomial: decay from the end of warmup (google-research/bert's). wsd: warmup-stable-decay, the
# peak held until the last `decay_fraction` of the run, then the decay (the trapezoid of Xing et al.
# 2018 and Hägele et al. 2024, ModernBERT's): a run whose length is only known late (a time budget)
# decays at its end, and the stable phase learns at the peak rate meanwhile.
SCHEDULES = ("polynomial", "wsd")
# The decay's curve over its progress p from 0 to 1 (optimization.learning_rate): linear, (1 - p) to
# the power --decay_power; 1-sqrt, 1 - sqrt(p) (Hägele et al. 2024; ModernBERT's final decay).
DECAY_SHAPES = ("linear", "1-sqrt")


@dataclasses.dataclass
class TrainConfig:
    precision: str = knob("float32", "Compute precision policy.", choices=PRECISIONS)
    tf32: bool = knob(
        True,
        "On GPUs with TensorFloat-32 (Ampere and newer), float32 matmuls use it (TensorFlow's "
        "default); --notf32 for strict float32. No effect on CPUs.",
    )
    xla: bool = knob(
        False, "Compile the whole forward/backward pass with XLA (the update always is)."
    )
    fuse: bool = knob(
        False,
        "XLA-fuse the element-wise ops (GELU, LayerNorm, softmax, casts and their gradients) "
        "between TensorFlow's own matmul kernels: for CPUs, whose AMX/AVX-512 BF16 matmuls XLA "
        "does not reach. Needs TF_XLA_FLAGS='--tf_xla_auto_jit=fusible --tf_xla_cpu_global_jit' in "
        "the environment at launch (mpirun -x TF_XLA_FLAGS). Not with --xla. run/benchmark.py's "
        "+fuse rungs measure it.",
    )
    accumulation_steps: int = knob(1, "Micro-batches per optimizer update (and per allreduce).")
    optimizer: str = knob(
        "lamb",
        "Optimizer: lamb (LAMB), adamw (AdamW) or stable_adamw (AdamW whose learning rate each "
        "tensor divides by max(1, RMS of g^2 / v): Wortsman et al. 2023's update clipping, "
        "ModernBERT's optimizer; it replaces gradient clipping, see --clip_norm). "
        "bert_tf/train/optimization.py.",
        choices=OPTIMIZERS,
    )
    learning_rate: float = knob(
        1e-4,
        "Peak learning rate, for the global batch (not scaled with the rank count; "
        "run/pretrain.py's doc says how to scale it with the global batch).",
    )
    warmup_steps: int = knob(0, "Linear warmup updates.")
    total_steps: int = knob(1000, "Optimizer updates in all.")
    decay_power: float = knob(
        1.0,
        "--decay_shape=linear: the decay's power, (1 - progress)^power (1: linear; 0.5: the "
        "classic recipe's, NVIDIA's).",
    )
    decay_shape: str = knob(
        "linear",
        "The decay's curve over its progress p (0 to 1): linear ((1 - p)^--decay_power) or 1-sqrt "
        "(1 - sqrt(p): Hägele et al. 2024's cooldown, ModernBERT's final decay; not "
        "--decay_power=0.5, which is sqrt(1 - p)). Both end at 0 (ModernBERT's at 0.001 x the "
        "peak).",
        choices=DECAY_SHAPES,
    )
    schedule: str = knob(
        "polynomial",
        "Learning rate after warmup: polynomial (decay from the end of warmup to --total_steps, "
        "google-research/bert's) or wsd (warmup-stable-decay: the peak held, then the decay over "
        "the last --decay_fraction of the run; with --time_budget_hours, of the predicted run).",
        choices=SCHEDULES,
    )
    decay_fraction: float = knob(
        0.2,
        "--schedule=wsd: the share of the run's updates spent decaying (0.2: Hägele et al. 2024's "
        "cooldown).",
    )
    adam_beta2: float = knob(
        0.999,
        "Second-moment decay (beta2) of the optimizer (0.98 in the budget recipes: RoBERTa, Liu et "
        "al. 2019, for stability at large batches; MosaicBERT's and ModernBERT's too). beta1 is "
        "0.9 and epsilon 1e-6, theirs as well.",
    )
    weight_decay: float = knob(
        0.01,
        "Weight decay, decoupled from the gradient's moments (AdamW's) and scaled by the learning "
        "rate: each update shrinks a weight w by lr_t * weight_decay * w (LAMB: times its trust "
        "ratio; stable_adamw: over its update clipping), as google-research/bert and "
        "torch.optim.AdamW do. Not on LayerNorm parameters or biases. ModernBERT's and "
        "MosaicBERT's optimizers scale their weight decay wd' by lr_t / peak lr instead (fully "
        "decoupled): the same decay here is wd' / peak lr (ModernBERT's 1e-5 at 8e-4: 1.25e-2).",
    )
    clip_norm: float = knob(
        1.0,
        "Global-norm gradient clipping; 0: none (ModernBERT's with --optimizer=stable_adamw, whose "
        "update clipping replaces it).",
    )
    seed: int = knob(0, "Seed for initialisation, data order and dropout.")
    comm: CommConfig = dataclasses.field(
        default_factory=CommConfig
    )  # its fields are flags of their own

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raises ConfigError naming the flag of the first impossible value (subclasses extend
        it)."""
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"unknown precision policy {self.precision!r}; valid: {', '.join(PRECISIONS)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}"
            )
        if self.fuse and self.xla:
            raise ConfigError(
                "--fuse with --xla: --xla compiles the whole step already; give one of them"
            )
        if self.accumulation_steps < 1:
            raise ConfigError(f"--accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.total_steps < 1:
            raise ConfigError(f"--total_steps must be >= 1, got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ConfigError(
                f"warmup_steps ({self.warmup_steps}) must be in [0, total_steps={self.total_steps}]"
            )
        if self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate must be positive, got {self.learning_rate}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"--schedule={self.schedule}: valid are {', '.join(SCHEDULES)}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"--decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if not 0 < self.adam_beta2 < 1:
            raise ConfigError(f"--adam_beta2 must be in (0, 1), got {self.adam_beta2}")
        if self.clip_norm < 0:
            raise ConfigError(f"--clip_norm must be >= 0 (0: no clipping), got {self.clip_norm}")
        self.validate_decay()
        self.validate_compression_warmup()

    def validate_decay(self):
        if self.decay_shape not in DECAY_SHAPES:
            raise ConfigError(
                f"--decay_shape={self.decay_shape}: valid are {', '.join(DECAY_SHAPES)}"
            )
        if self.decay_shape == "1-sqrt" and self.decay_power != 1:
            raise ConfigError(
                f"--decay_power={self.decay_power:g} with --decay_shape=1-sqrt: the power shapes "
                "the linear decay only; give one of them"
            )

    def validate_compression_warmup(self):
        """1-bit Adam / 1-bit LAMB: their optimizer, and a float32 warmup inside the run (PowerSGD:
        a warmup inside the run too)."""
        warmup = self.comm.compression_warmup_steps
        if self.comm.exchange == "powersgd" and warmup is not None and warmup >= self.total_steps:
            raise ConfigError(
                f"--exchange=powersgd: the float32 warmup (--compression_warmup_steps={warmup}) is "
                f"not shorter than the run (--total_steps={self.total_steps}): nothing would be "
                "compressed"
            )
        if self.comm.exchange != "onebit":
            return
        if self.optimizer not in ("adamw", "lamb"):
            raise ConfigError(
                f"--exchange=onebit with --optimizer={self.optimizer}: --exchange=onebit is 1-bit "
                "Adam (--optimizer=adamw) or 1-bit LAMB (--optimizer=lamb), which freeze the "
                "variance the optimizer's update divides by; use adamw or lamb, or another "
                "--exchange"
            )
        if self.comm.onebit_variance_kappa and self.optimizer != "adamw":
            raise ConfigError(
                f"--onebit_variance_kappa={self.comm.onebit_variance_kappa} with --optimizer="
                f"{self.optimizer}: 0/1 Adam's variance schedule is Adam's (--optimizer=adamw); "
                "1-bit LAMB's frozen trust ratios need a variance updated at every warmup update"
            )
        warmup = warmup_updates(self.comm, self.total_steps)
        if warmup < 1:
            raise ConfigError(
                "--exchange=onebit needs --compression_warmup_steps >= 1: the optimizer's variance "
                "is estimated from those float32 updates, then frozen (1-bit Adam)"
            )
        if warmup >= self.total_steps:
            raise ConfigError(
                f"--exchange=onebit: the float32 warmup (--compression_warmup_steps={warmup}) is "
                f"not shorter than the run (--total_steps={self.total_steps}): nothing would be "
                "compressed; give fewer warmup updates or more updates (unset, the warmup is "
                f"{ONEBIT_WARMUP_SHARE:.0%} of --total_steps)"
            )
