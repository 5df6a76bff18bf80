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
import re

from bert_tf import ConfigError, knob
from bert_tf.parallel import local_plan
from bert_tf.parallel.variance_schedule import variance_updates

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
        "1-bit Adam (--optimizer=adamw) or 1-bit LAMB (--optimizer=lamb) (Tang et al. 2021, Li "
        "et al. 2021): after --compression_warmup_steps float32 updates the variance (and LAMB's "
        "trust ratios) freeze and each rank's momentum travels as signs and one scale per tensor, "
        "error feedback on both sides, alltoall + allgather; about 1/32 of float32's bytes "
        "(bert_tf/parallel/onebit.py). powersgd: bert_tf/parallel/compression.py. auto: the one "
        "the planner predicts fastest to the same held-out accuracy on this job's link, measured "
        "at start-up with the compression's own computation and each method's extra updates as "
        "measured (bert_tf/parallel/auto_exchange.py; needs --ladder_sequences_per_second).",
        choices=EXCHANGES,
    )
    powersgd_rank: int = knob(4, "--exchange=powersgd: the rank of each matrix's factors.")
    powersgd_min_compression_rate: float = knob(
        2.0,
        "--exchange=powersgd: a weight matrix (n x m) travels as factors only if they are this "
        "many times smaller than it, (n + m) x rank x rate < n x m (PyTorch's PowerSGD hook's "
        "test and default); the others, vectors included, travel whole.",
    )
    compression_warmup_steps: int | None = knob(
        None,
        "Updates exchanged uncompressed (float32) before powersgd or onebit starts. Unset: per "
        "method (comm.warmup_updates): onebit 20% of --total_steps (DeepSpeed's advice for 1-bit "
        "Adam/LAMB: 15-25%; the variance is estimated from them, then frozen), powersgd 10%, at "
        "most 100 (the PowerSGD references start compressing after 10-1,000 updates). onebit "
        "needs >= 1 and fewer than --total_steps.",
    )
    onebit_signs: bool = knob(
        True,
        "--exchange=onebit: the momentum travels as signs (1-bit Adam/LAMB). --noonebit_signs is "
        "the control run: everything else as 1-bit (the float32 warmup, the variance and LAMB's "
        "trust ratios frozen after it, the momentum exchanged, not the gradient) but the momentum "
        "averaged exactly in float32, as many bytes as --exchange=none; it tells what the freeze "
        "costs from what the signs cost. The planner counts 1-bit's bytes.",
    )
    onebit_live: str = knob(
        "",
        "--exchange=onebit: a regular expression over variable names; the variables it matches "
        "keep the warmup's treatment for the whole run: their gradients averaged in float32 every "
        "update and their variance live (DeepSpeed OnebitAdam's `non_freeze` parameter groups). "
        "For tensors whose frozen variance misleads, such as a tied word embedding whose rare "
        "tokens' rows froze with the softmax's small gradients (word_embeddings). Empty: none. A "
        "pattern that matches no variable, or every one, is refused at start-up.",
    )
    onebit_variance_kappa: int = knob(
        0,
        "--exchange=onebit, --optimizer=adamw: 0/1 Adam's variance (Lu et al. 2022; DeepSpeed's "
        "var_update_scaler, 16). In the --compression_warmup_steps it is updated at kappa "
        "updates one apart, kappa two apart, four apart, ... (parallel/variance_schedule.py), "
        "which average the gradient in float32; the others send it as signs with error "
        "feedback. Then 1-bit Adam's frozen variance. 0: 1-bit Adam (float32 warmup).",
    )
    local_updates: int = knob(
        0,
        "DiLoCo (bert_tf/parallel/local_sgd.py): each rank takes this many optimizer updates on "
        "its own data, then the ranks average the weights' change in float16 and take an outer "
        "Nesterov step; 0: every update allreduces the gradients. The inner updates are each "
        "rank's own: its --micro_batch_size x --accumulation_steps sequences at the schedule's "
        "--learning_rate (DiLoCo's and OpenDiLoCo's inner batch and learning rate are per worker "
        "too). --save_interval and --eval_interval must be multiples of it.",
    )
    local_group: str = knob(
        "rank",
        "--local_updates: who takes the inner updates together: rank (each rank alone) or node "
        "(the ranks of a node average their gradients every update over the node's own links, as "
        "one DiLoCo worker; only the outer step crosses between nodes).",
        choices=("rank", "node"),
    )
    outer_learning_rate: float = knob(
        0.7,
        "--local_updates: the outer step's learning rate (DiLoCo's 0.7). 1 with --outer_momentum "
        "0 is periodic weight averaging: every H updates the ranks' weights become their mean.",
    )
    outer_momentum: float = knob(
        0.9, "--local_updates: the outer step's Nesterov momentum (DiLoCo's 0.9; 0: none)."
    )
    local_updates_after: int = knob(
        0,
        "--local_updates: the first K updates are ordinary synchronous ones (the gradients "
        "averaged in float32 every update, as --exchange=none); local updates start from update "
        "K's weights. Below --total_steps and a multiple of --local_updates (the ranks agree after "
        "updates K + j x H, where saves and evaluations fall); 0: local from the start (DiLoCo, "
        "OpenDiLoCo).",
    )
    local_fragments: int = knob(
        1,
        "--local_updates: Streaming DiLoCo's fragments. Encoder layer l goes to fragment l mod F, "
        "the other tensors (embeddings, pooler, heads) largest first to the lightest fragment; "
        "fragment f's outer exchange comes every H updates, f x H/F after fragment 0's, so each "
        "carries about 1/F of the model. Must divide --local_updates. With F > 1 every save and "
        "evaluation (after --local_updates_after) first synchronises all fragments.",
    )
    fragment_delay: int = knob(
        0,
        "--local_updates: updates between the start of a fragment's exchange and its outer step "
        "(torchft's fragment_sync_delay, the paper's tau): the exchange runs in a background "
        "thread while the loop trains on. 0: it blocks (DiLoCo). Below --local_updates / "
        "--local_fragments.",
    )
    fragment_update_alpha: float = knob(
        0.0,
        "--local_updates: at a fragment's outer step its weights become (1 - alpha) x the new "
        "global ones + alpha x this rank's own, which include the --fragment_delay updates made "
        "meanwhile (torchft's fragment_update_alpha, its default 0: those updates are dropped). "
        "With alpha > 0 the ranks agree only at saves and evaluations (a full synchronisation).",
    )
    outer_delta_bits: int = knob(
        16,
        "--local_updates: how the weights' change travels. 16: float16 allreduce; 32: float32; 8, "
        "4: int8 or packed int4 codes with one float32 absmax scale per 256 values, each rank's "
        "chunk averaged by the rank that owns it and coded again (alltoall + allgather: half or a "
        "quarter of float16's bytes at any rank count). 8 and 4 bits keep what rounding dropped, "
        "on both sides, for the next exchange (error feedback, restarted at zero by a resume or a "
        "rollback).",
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
        local_plan.check(self)  # --local_updates and its companions
        self._check_onebit()
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
        warmup = self.compression_warmup_steps
        if self.powersgd_min_compression_rate < 1:
            raise ConfigError(
                "--powersgd_min_compression_rate must be >= 1 (1: every matrix whose factors are "
                f"smaller), got {self.powersgd_min_compression_rate:g}"
            )
        if self.powersgd_rank < 1 or (warmup is not None and warmup < 0):
            raise ConfigError(
                f"--powersgd_rank must be >= 1 and --compression_warmup_steps >= 0, got "
                f"{self.powersgd_rank} and {self.compression_warmup_steps}"
            )
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name} must be >= 0, got {value:g}")

    def _check_onebit(self):
        """--noonebit_signs, --onebit_live and --onebit_variance_kappa: only with --exchange=onebit;
        the pattern compiles."""
        if not self.onebit_signs and self.exchange != "onebit":
            raise ConfigError(
                f"--noonebit_signs with --exchange={self.exchange}: it is 1-bit Adam's control "
                "run and needs --exchange=onebit"
            )
        if self.onebit_live and self.exchange != "onebit":
            raise ConfigError(
                f"--onebit_live={self.onebit_live} with --exchange={self.exchange}: it names "
                "1-bit Adam/LAMB's float32 variables and needs --exchange=onebit"
            )
        if self.onebit_variance_kappa and self.exchange != "onebit":
            raise ConfigError(
                f"--onebit_variance_kappa={self.onebit_variance_kappa} with --exchange="
                f"{self.exchange}: it is 0/1 Adam's variance schedule and needs --exchange=onebit"
            )
        if self.onebit_variance_kappa < 0:
            raise ConfigError(
                f"--onebit_variance_kappa must be >= 0, got {self.onebit_variance_kappa}"
            )
        try:
            re.compile(self.onebit_live)
        except re.error as e:
            raise ConfigError(
                f"--onebit_live={self.onebit_live}: not a regular expression ({e})"
            ) from None

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


def powersgd_plan(shapes, rank: int, min_rate: float = 2.0) -> list:
    """Indices of the tensors PowerSGD compresses: the matrices whose rank-`rank` factors are more
    than `min_rate` times smaller, (n + m) r min_rate < n m (PyTorch's hook; the original code asks
    the same with its own constant); ConfigError when that leaves none."""
    if rank < 1 or min_rate < 1:
        raise ConfigError(
            f"--powersgd_rank must be >= 1 and --powersgd_min_compression_rate >= 1, got {rank} "
            f"and {min_rate:g}"
        )
    chosen = [
        i
        for i, s in enumerate(shapes)
        if len(s) == 2 and (s[0] + s[1]) * rank * min_rate < s[0] * s[1]
    ]
    if shapes and not chosen:
        largest = max((s for s in shapes if len(s) == 2), key=math.prod, default=None)
        raise ConfigError(
            f"--powersgd_rank={rank} with --powersgd_min_compression_rate={min_rate:g} compresses "
            f"no tensor (the largest matrix is {' x '.join(map(str, largest or ()))}): give a "
            "smaller rank or rate"
        )
    return chosen


def payload_bytes(
    method: str, shapes, size: int, rank: int = 4, min_rate: float = 2.0, live=()
) -> float:
    """What one exchange carries, the whole vector a ring collective moves (none|fp16|powersgd: the
    allreduced tensors; onebit: per tensor, every rank's chunk of signs plus two float32 scales per
    rank, the alltoall's and the allgather's; the tensors at indices `live`, --onebit_live's, as a
    float32 allreduce)."""
    if method == "onebit" and live:
        live = set(live)
        kept = [s for i, s in enumerate(shapes) if i not in live]
        return payload_bytes("onebit", kept, size) + payload_bytes(
            "none", [s for i, s in enumerate(shapes) if i in live], size
        )
    elements = sum(math.prod(s) for s in shapes)
    if method in ("none", "fp16"):
        return elements * (4 if method == "none" else 2)
    if method == "powersgd":
        chosen = set(powersgd_plan(shapes, rank, min_rate))
        return 4 * sum(rank * sum(s) if i in chosen else math.prod(s) for i, s in enumerate(shapes))
    if method == "onebit":
        # per tensor (onebit.py): a chunk of signs per rank, and a float32 scale per rank from
        # each side (the workers' scale of the whole tensor, the servers' of their chunk)
        return sum(size * (onebit_chunk(math.prod(s), size) / 8 + 8) for s in shapes)
    raise ConfigError(f"unknown exchange {method!r}")


def wire_bytes(
    method: str, shapes, size: int, rank: int = 4, min_rate: float = 2.0, live=()
) -> float:
    """Bytes each rank sends per update with ring collectives: 2(N-1)/N of the payload (an
    allreduce, or an alltoall and an allgather of (N-1)/N each)."""
    if size < 2:
        return 0.0
    return 2 * (size - 1) / size * payload_bytes(method, shapes, size, rank, min_rate, live)


def live_indices(names, pattern: str) -> list:
    """--onebit_live: the indices of the variables whose names `pattern` matches (re.search; a
    TensorFlow name's ":0" left out); ConfigError when it matches none."""
    if not pattern:
        return []
    names = [name.split(":")[0] for name in names]
    regex = re.compile(pattern)
    chosen = [i for i, name in enumerate(names) if regex.search(name)]
    if not chosen:
        shown = ", ".join(list(names)[:3])
        raise ConfigError(
            f"--onebit_live={pattern} matches no variable (there are {len(names)}, such as {shown})"
        )
    return chosen


def onebit_chunk(elements: int, size: int) -> int:
    """Elements per rank's chunk of one tensor under --exchange=onebit: DeepSpeed's padding, the
    tensor rounded up to a multiple of size x lcm(size, 8), split evenly (whole bytes of signs)."""
    block = size * math.lcm(size, 8)
    return block * math.ceil(elements / block) // size


# 1-bit Adam/LAMB's float32 warmup when --compression_warmup_steps is unset: this share of the run
# (DeepSpeed's tutorials: 15-25% of the total steps as a start).
ONEBIT_WARMUP_SHARE = 0.2


# PowerSGD's float32 warmup when --compression_warmup_steps is unset: this share of the run, at most
# POWERSGD_WARMUP updates (the original code's default start; PyTorch's hook advises about 10% of
# the run, and not less than the learning rate's warmup).
POWERSGD_WARMUP_SHARE, POWERSGD_WARMUP = 0.1, 100


def warmup_updates(comm: CommConfig, total_steps: int) -> int:
    """The updates exchanged in float32 before the compressed exchange starts: the flag when given,
    else the method's default (onebit: ONEBIT_WARMUP_SHARE of total_steps, at least 1; 0 when
    total_steps is 0, unknown: the trainer's optimizer then sets it, onebit.attach_optimizer;
    powersgd: POWERSGD_WARMUP_SHARE of total_steps, at most POWERSGD_WARMUP)."""
    if comm.compression_warmup_steps is not None:
        return comm.compression_warmup_steps
    if comm.method == "onebit":
        return max(1, int(ONEBIT_WARMUP_SHARE * total_steps)) if total_steps else 0
    if comm.method == "powersgd":
        return min(POWERSGD_WARMUP, int(POWERSGD_WARMUP_SHARE * total_steps))
    return 0


def float32_updates(comm: CommConfig, total_steps: int) -> int:
    """The updates of a run whose gradients go as a float32 allreduce: the compression warmup's
    (comm.warmup_updates), with --onebit_variance_kappa only its variance updates."""
    warmup = min(warmup_updates(comm, total_steps), total_steps) if comm.compressed else 0
    if comm.method == "onebit":
        return variance_updates(warmup, comm.onebit_variance_kappa)
    return warmup


def run_wire_bytes(comm: CommConfig, shapes, size: int, total_steps: int) -> float:
    """Bytes each rank sends per update averaged over a run of total_steps updates, the float32
    updates included: (float32 x float32's + the others x the method's) / total."""
    warmup = float32_updates(comm, total_steps)
    compressed = wire_bytes(
        comm.method, shapes, size, comm.powersgd_rank, comm.powersgd_min_compression_rate
    )
    plain = wire_bytes("none", shapes, size)
    return (warmup * plain + (total_steps - warmup) * compressed) / max(total_steps, 1)
