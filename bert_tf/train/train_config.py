"""The update's settings, `TrainConfig` (precision, optimizer, schedule, accumulation, the
exchange's `CommConfig`): plain values and their checks, importable without TensorFlow (the planner
and run/plan.py read them; bert_tf/train/training.py builds the trainer from them)."""

from __future__ import annotations

import dataclasses

from bert_tf import ConfigError, knob
from bert_tf.parallel.comm import CommConfig

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OPTIMIZERS = ("lamb", "adamw")
# polynomial: decay from the end of warmup (google-research/bert's). wsd: warmup-stable-decay, the
# peak held until the last `decay_fraction` of the run, then the decay (the trapezoid of Xing et al.
# 2018 and Hägele et al. 2024, ModernBERT's): a run whose length is only known late (a time budget)
# decays at its end, and the stable phase learns at the peak rate meanwhile.
SCHEDULES = ("polynomial", "wsd")


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
    optimizer: str = knob("lamb", "Optimizer.", choices=OPTIMIZERS)
    learning_rate: float = knob(
        1e-4,
        "Peak learning rate, for the global batch (not scaled with the rank count; "
        "run/pretrain.py's doc says how to scale it with the global batch).",
    )
    warmup_steps: int = knob(0, "Linear warmup updates.")
    total_steps: int = knob(1000, "Optimizer updates in all.")
    decay_power: float = knob(1.0, "Polynomial decay power after warmup (1 = linear).")
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
        "Second-moment decay of AdamW and LAMB (0.98 in the budget recipes: RoBERTa, Liu et al. "
        "2019, for stability at large batches; MosaicBERT, ModernBERT).",
    )
    weight_decay: float = knob(0.01, "Decoupled weight decay (not on LayerNorm or biases).")
    clip_norm: float = knob(1.0, "Global-norm gradient clipping.")
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
        if self.comm.exchange == "onebit" and self.comm.compression_warmup_steps < 1:
            raise ConfigError(
                "--exchange=onebit needs --compression_warmup_steps >= 1: the optimizer's variance "
                "is estimated from those float32 updates, then frozen (1-bit Adam)"
            )
