"""How gradients travel between ranks: the one configuration type shared by the trainer
(training.TrainConfig.comm), Horovod's set-up (distributed.configure), the planner and the
communication study. Plain Python: the planner and the study's bookkeeping import it without
TensorFlow or Horovod.

Each field is also the name of its flag in every run/ script that takes them (bert_tf/cli.py
defines them: `cli.define_comm`).
"""
from __future__ import annotations

import dataclasses

from bert_tf import ConfigError, knob

# Horovod 0.28's own values, in force when a field is None and the environment sets nothing.
HOROVOD_FUSION_THRESHOLD_MB = 128.0
HOROVOD_CYCLE_TIME_MS = 1.0


@dataclasses.dataclass(frozen=True)
class CommConfig:
    fp16_allreduce: bool = knob(False, "Send gradients as float16 (Horovod compression).")
    allreduce_every_micro_batch: bool = knob(
        False, "The naive baseline: allreduce each micro-batch's gradients (accumulation_steps allreduces per "
        "update instead of one, after accumulation).")
    fusion_threshold_mb: float | None = knob(
        None, "Horovod tensor-fusion buffer, MB (HOROVOD_FUSION_THRESHOLD; 0: no fusion). Unset: Horovod's "
        f"{HOROVOD_FUSION_THRESHOLD_MB:g} MB; a value in the environment (horovodrun --fusion-threshold-mb) wins "
        "over the flag.")
    cycle_time_ms: float | None = knob(
        None, f"Horovod cycle time, ms (HOROVOD_CYCLE_TIME). Unset: Horovod's {HOROVOD_CYCLE_TIME_MS:g} ms; the "
        "environment wins over the flag.")

    def __post_init__(self):
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name} must be >= 0, got {value:g}")

    def resolved(self) -> "CommConfig":
        """None replaced by Horovod's default (what a run gets when the environment sets nothing)."""
        return dataclasses.replace(
            self,
            fusion_threshold_mb=HOROVOD_FUSION_THRESHOLD_MB if self.fusion_threshold_mb is None
            else self.fusion_threshold_mb,
            cycle_time_ms=HOROVOD_CYCLE_TIME_MS if self.cycle_time_ms is None else self.cycle_time_ms)

    def as_flags(self) -> list:
        """The command-line flags that give a run/ script these settings (None fields left out)."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                out.append(f"--{f.name}" if value else f"--no{f.name}")
            elif value is not None:
                out.append(f"--{f.name}={value:g}")
        return out
