"""How gradients travel between ranks: the one configuration type shared by the trainer
(training.TrainConfig.comm), Horovod's set-up (distributed.configure), the planner and the
communication study. Plain Python: the planner and the study's bookkeeping import it without
TensorFlow or Horovod.

Each field is also the name of its flag in every run/ script that takes them (bert_tf/cli.py
defines them: `cli.define_comm`).
"""

from __future__ import annotations

import dataclasses
import math

from bert_tf import ConfigError, knob

# Horovod 0.28's own values, in force when a field is None and the environment sets nothing.
HOROVOD_FUSION_THRESHOLD_MB = 128.0
HOROVOD_CYCLE_TIME_MS = 1.0
# --exchange (until this release --gradient_compression): none and fp16 are Horovod allreduces;
# powersgd and onebit are bert_tf/parallel/compression.py's exchanges with error feedback; auto is
# resolved to one of them at start-up (bert_tf/parallel/auto_exchange.py)
EXCHANGES = ("none", "fp16", "powersgd", "onebit", "auto")
# The key a metrics record, a checkpoint's JSON and an exchange-state file hold the exchange under:
# the flag's old name, which older versions wrote and read (and tests/test_pretraining.py,
# test_exchange_state.py and test_elastic.py check); readers take "exchange" too (from_record,
# exchange_state.method_of).
RECORD_KEY = "gradient_compression"


@dataclasses.dataclass(frozen=True)
class CommConfig:
    fp16_allreduce: bool = knob(
        False,
        "Deprecated, goes in the next release: the old synonym of --exchange=fp16 (float16 "
        "allreduce); use --exchange=fp16.",
    )
    allreduce_every_micro_batch: bool = knob(
        False,
        "The naive baseline: allreduce each micro-batch's gradients (accumulation_steps allreduces "
        "per update instead of one, after accumulation).",
    )
    fusion_threshold_mb: float | None = knob(
        None,
        "Horovod tensor-fusion buffer, MB (HOROVOD_FUSION_THRESHOLD; 0: no fusion). Unset: "
        f"Horovod's {HOROVOD_FUSION_THRESHOLD_MB:g} MB; a value in the environment (horovodrun "
        "--fusion-threshold-mb) wins over the flag.",
    )
    cycle_time_ms: float | None = knob(
        None,
        f"Horovod cycle time, ms (HOROVOD_CYCLE_TIME). Unset: Horovod's {HOROVOD_CYCLE_TIME_MS:g} "
        "ms; the environment wins over the flag.",
    )
    exchange: str = knob(
        "none",
        "How gradients cross ranks, once per update: none, fp16, powersgd, onebit or auto. none: a "
        "float32 allreduce. fp16: a float16 allreduce (half the bytes). powersgd: each weight "
        "matrix as rank --powersgd_rank factors, error feedback (Vogels et al. 2019). onebit: "
        "signs and one scale per chunk, error feedback on both sides, alltoall + allgather; 1/32 "
        "of float32's bytes; the optimizer's variance frozen after --compression_warmup_steps, as "
        "1-bit Adam's. powersgd and onebit: bert_tf/parallel/compression.py. auto: the one the "
        "planner predicts fastest to the same held-out accuracy on this job's link, measured at "
        "start-up with the compression's own computation and each method's extra updates as "
        "measured (bert_tf/parallel/auto_exchange.py; needs --ladder_sequences_per_second).",
        choices=EXCHANGES,
    )
    powersgd_rank: int = knob(4, "--exchange=powersgd: the rank of each matrix's factors.")
    compression_warmup_steps: int = knob(
        0,
        "Updates exchanged uncompressed (float32) before powersgd or onebit starts (1-bit Adam's "
        "warmup; onebit needs >= 1: the optimizer's variance comes from them).",
    )
    local_updates: int = knob(
        0,
        "DiLoCo (bert_tf/parallel/local_sgd.py): each rank takes this many optimizer updates on "
        "its own data, then the ranks average the weights' change in float16 and take an outer "
        "Nesterov step; 0: every update allreduces the gradients. --save_interval and "
        "--eval_interval must be multiples of it.",
    )
    local_group: str = knob(
        "rank",
        "--local_updates: who takes the inner updates together: rank (each rank alone) or node "
        "(the ranks of a node average their gradients every update over the node's own links, as "
        "one DiLoCo worker; only the outer step crosses between nodes).",
        choices=("rank", "node"),
    )
    outer_learning_rate: float = knob(
        0.7, "--local_updates: the outer step's learning rate (DiLoCo's 0.7)."
    )
    outer_momentum: float = knob(
        0.9, "--local_updates: the outer step's Nesterov momentum (DiLoCo's 0.9)."
    )
    collective_timeout_minutes: float = knob(
        30.0,
        "A rank waiting this long in a collective (another rank frozen, unreachable or stopped) "
        "ends the job with an error naming the collective and the rank that did not arrive "
        "(bert_tf/parallel/watchdog.py); 0: wait for ever. Static runs (elastic mode handles lost "
        "ranks itself).",
    )
    save_timeout_minutes: float = knob(
        60.0,
        "How long the other ranks wait for rank 0's solo work (writing and hashing a checkpoint, a "
        "rollback's restore) while it shows signs of life, before ending the job (the longer of "
        "this and --collective_timeout_minutes; 0: wait for ever). Static runs.",
    )

    def __post_init__(self):
        if self.exchange not in EXCHANGES:
            raise ConfigError(f"--exchange={self.exchange}: valid are {', '.join(EXCHANGES)}")
        if self.fp16_allreduce and self.exchange not in ("none", "fp16"):
            raise ConfigError(
                f"--fp16_allreduce with --exchange={self.exchange}: they disagree "
                "(--fp16_allreduce is --exchange=fp16); give one"
            )
        if self.exchange in ("powersgd", "onebit", "auto") and self.allreduce_every_micro_batch:
            raise ConfigError(
                f"--exchange={self.exchange} with --allreduce_every_micro_batch: error feedback "
                "works on one exchange per update"
            )
        if (
            self.local_updates < 0
            or self.outer_learning_rate <= 0
            or not 0 <= self.outer_momentum < 1
        ):
            raise ConfigError(
                f"--local_updates must be >= 0, --outer_learning_rate > 0 and --outer_momentum in "
                f"[0, 1), got {self.local_updates}, {self.outer_learning_rate:g}, "
                f"{self.outer_momentum:g}"
            )
        if self.local_updates and (self.method != "none" or self.allreduce_every_micro_batch):
            raise ConfigError(
                f"--local_updates={self.local_updates} exchanges no gradients (the outer step "
                "sends the weights' change in float16): drop --exchange, --fp16_allreduce and "
                "--allreduce_every_micro_batch"
            )
        if self.local_group not in ("rank", "node") or (
            self.local_group == "node" and not self.local_updates
        ):
            raise ConfigError(
                f"--local_group={self.local_group}: valid are rank and node, and node is for "
                "--local_updates (DiLoCo's workers)"
            )
        if self.collective_timeout_minutes < 0:
            raise ConfigError(
                f"--collective_timeout_minutes must be >= 0 (0: no timeout), got "
                f"{self.collective_timeout_minutes:g}"
            )
        if self.save_timeout_minutes < 0:
            raise ConfigError(
                f"--save_timeout_minutes must be >= 0 (0: wait for ever), got "
                f"{self.save_timeout_minutes:g}"
            )
        if self.powersgd_rank < 1 or self.compression_warmup_steps < 0:
            raise ConfigError(
                f"--powersgd_rank must be >= 1 and --compression_warmup_steps >= 0, got "
                f"{self.powersgd_rank} and {self.compression_warmup_steps}"
            )
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name} must be >= 0, got {value:g}")

    @property
    def method(self) -> str:
        """The gradient exchange in force: --exchange, with the old --fp16_allreduce read as
        fp16."""
        return "fp16" if self.fp16_allreduce else self.exchange

    @property
    def compressed(self) -> bool:
        """An exchange with error feedback (state to checkpoint), not a Horovod allreduce."""
        return self.exchange in ("powersgd", "onebit")

    def resolved(self) -> "CommConfig":
        """None replaced by Horovod's default (what a run gets when the environment sets
        nothing)."""
        return dataclasses.replace(
            self,
            fusion_threshold_mb=HOROVOD_FUSION_THRESHOLD_MB
            if self.fusion_threshold_mb is None
            else self.fusion_threshold_mb,
            cycle_time_ms=HOROVOD_CYCLE_TIME_MS
            if self.cycle_time_ms is None
            else self.cycle_time_ms,
        )

    def as_flags(self) -> list:
        """The command-line flags that give a run/ script these settings (None fields left out)."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                out.append(f"--{f.name}" if value else f"--no{f.name}")
            elif isinstance(value, float):
                out.append(f"--{f.name}={value:g}")
            elif value is not None:
                out.append(f"--{f.name}={value}")
        return out

    def as_record(self) -> dict:
        """The fields as a JSON record holds them: dataclasses.asdict, `exchange` under
        RECORD_KEY."""
        return {
            (RECORD_KEY if k == "exchange" else k): v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_record(cls, values: dict) -> "CommConfig":
        """The CommConfig of a record's dict: as_record's (or an older version's), or
        dataclasses.asdict's."""
        values = dict(values)
        if RECORD_KEY in values:
            values.setdefault("exchange", values.pop(RECORD_KEY))
        return cls(**values)


# -- what each method sends (plain Python: the planner uses it without TensorFlow)
# --------------------------
METHODS = ("powersgd", "onebit")
MIN_SIDE = 16  # thinner matrices (token types, classifiers) and vectors go uncompressed


def powersgd_plan(shapes, rank: int) -> list:
    """Indices of the tensors PowerSGD compresses (2-D, both sides >= MIN_SIDE); ConfigError when
    --powersgd_rank exceeds one's smaller side."""
    if rank < 1:
        raise ConfigError(f"--powersgd_rank must be >= 1, got {rank}")
    chosen = [i for i, s in enumerate(shapes) if len(s) == 2 and min(s) >= MIN_SIDE]
    for i in chosen:
        if rank > min(shapes[i]):
            raise ConfigError(
                f"--powersgd_rank={rank} is larger than the smaller side of a {shapes[i][0]} x "
                f"{shapes[i][1]} weight matrix: give at most {min(shapes[i])}"
            )
    return chosen


def payload_bytes(method: str, shapes, size: int, rank: int = 4) -> float:
    """What one exchange carries, the whole vector a ring collective moves (none|fp16|powersgd: the
    allreduced tensors; onebit: every rank's chunk of signs plus one float32 scale per rank)."""
    elements = sum(math.prod(s) for s in shapes)
    if method in ("none", "fp16"):
        return elements * (4 if method == "none" else 2)
    if method == "powersgd":
        chosen = set(powersgd_plan(shapes, rank))
        return 4 * sum(rank * sum(s) if i in chosen else math.prod(s) for i, s in enumerate(shapes))
    if method == "onebit":
        return size * (onebit_chunk(elements, size) / 8 + 4)
    raise ConfigError(f"unknown exchange {method!r}")


def wire_bytes(method: str, shapes, size: int, rank: int = 4) -> float:
    """Bytes each rank sends per update with ring collectives: 2(N-1)/N of the payload (an
    allreduce, or an alltoall and an allgather of (N-1)/N each)."""
    if size < 2:
        return 0.0
    return 2 * (size - 1) / size * payload_bytes(method, shapes, size, rank)


def onebit_chunk(elements: int, size: int) -> int:
    """Elements per rank's chunk: the vector split evenly, rounded up to whole bytes of signs."""
    return 8 * math.ceil(elements / (8 * size))
