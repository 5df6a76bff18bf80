"""The speed ladder's configuration (bert_tf/studies/ladder.py climbs it): the rungs' names (RUNGS;
the CPU and GPU ladders), run/benchmark.py's flags (BenchmarkConfig) and every check that can fail
before an hour of measuring (check_rungs, check_settings).
"""

from __future__ import annotations

import dataclasses
import os

from bert_tf import ConfigError, knob, knobs
from bert_tf.studies.rung import Timing

# tf32: float32 with TensorFloat-32 matmuls (GPUs from Ampere on); fp32 is then strict float32.
PRECISION = {
    "fp32": "float32",
    "bf16": "mixed_bfloat16",
    "fp16": "mixed_float16",
    "tf32": "float32",
}
DTYPE_NAME = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
PRECISION_RUNGS = [*PRECISION, *(f"{p}+{way}" for way in ("xla", "fuse") for p in PRECISION)]
RUNGS = [*PRECISION_RUNGS, "best+accum", "best-dropout", "keras-hub"]
# Without a GPU, XLA's CPU backend misses the bf16 matrix units, so both ways are timed; on a GPU,
# XLA fuses around cuBLAS and float16/bfloat16 use the tensor cores: the fast rungs first.
CPU_RUNGS = [
    "fp32",
    "fp32+xla",
    "fp32+fuse",
    "bf16",
    "bf16+xla",
    "bf16+fuse",
    "fp16",
    "fp16+xla",
    "best+accum",
    "best-dropout",
    "keras-hub",
]
GPU_RUNGS = [
    "fp16+xla",
    "bf16+xla",
    "tf32+xla",
    "fp32+xla",
    "fp16",
    "best+accum",
    "best-dropout",
    "keras-hub",
]


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """run/benchmark.py's flags. rungs: the ladder to climb (None: the device's, default_rungs;
    run/benchmark.py resolves it before ladder.run)."""

    model_preset: str = knobs.model_preset("base")
    sequence: knobs.Sequence = knobs.Sequence()
    vocab_size: int = knob(30522, "Vocabulary size.")
    micro_batch_size: int = knob(8, "Sequences per forward/backward pass (one micro-batch).")
    tune_micro_batch_sizes: list[int] = knob(
        [],
        "Also time the fastest bert_tf rung at these micro-batches (the flagfile then names the "
        "fastest per sequence).",
    )
    accumulation_steps: int = knob(4, "Micro-batches per update on the accumulation rung.")
    warmup_updates: int = knob(2, "Updates not timed (compilation).")
    updates: int = knob(5, "Timed updates per rung.")
    rungs: list[str] | None = knob(
        None,
        "Rungs to run (default: the CPU ladder, or the GPU ladder where TensorFlow sees a GPU; see "
        "CPU_RUNGS and GPU_RUNGS in bert_tf/studies/ladder_config.py).",
    )
    peak_seconds: float = knob(3.0, "Seconds per matmul-peak measurement (each dtype, both ways).")
    peak_size: int = knob(2048, "n of the n x n x n matmul the peak is measured with.")
    peak_repeats: int = knob(
        3, "Times each matmul peak is measured (the best counts; the spread is reported)."
    )
    output_dir: str = knobs.output_dir("ladder.json and ladder.png", default="runs/benchmark")
    train_files: str = knobs.train_files(
        "",
        "comma-separated globs; also measure input_pipeline.make_dataset alone on them (static and "
        "dynamic masking, sequences/s per rank) next to the model's consumption; needs "
        "--vocab_file.",
    )
    vocab_file: str = knobs.vocab_file(
        "", detail="of --train_files (dynamic masking's special and [MASK] ids)."
    )
    rung_train_files: list[str] = knob(
        [],
        "After the ladder, train the fastest bert_tf rung on batches of these TFRecord globs (each "
        "glob a rung: one made without and one with create_pretraining_data.py --pack) and report "
        "useful (non-padding) tokens/s and instances/s next to rows/s.",
    )
    input_seconds: float = knob(5.0, "Seconds per input-pipeline measurement.")
    profile_dir: str = knob(
        "",
        "After the ladder, trace 3 updates of the fastest bert_tf rung and of keras-hub's fastest "
        "with the TensorFlow profiler into DIR/bert_tf and DIR/keras-hub (TensorBoard's profile "
        "tab reads them) and print where each spends its time, by kind of op.",
    )
    write_flagfile: str = knob(
        "", "Write the fastest bert_tf configuration here as run/pretrain.py flags."
    )
    device_figures: str = knob(
        "",
        "Add the fastest bert_tf rung's sequences/s to this JSON as the device's phase-1 (sequence "
        "128) or phase-2 (512) speed, for run/plan.py --device_figures.",
    )

    def timing(self) -> Timing:
        return Timing(
            self.sequence.max_seq_length,
            self.sequence.max_predictions_per_seq,
            self.warmup_updates,
            self.updates,
        )


def default_rungs(gpu: bool, fusion: bool):
    """The ladder for this device; the +fuse rungs only where the process started with
    auto-clustering on (training.FUSION_ENV), and main says so when it leaves them out."""
    return [r for r in (GPU_RUNGS if gpu else CPU_RUNGS) if fusion or not r.endswith("+fuse")]


def check_rungs(rungs, gpu=False, fusion=False):
    """Everything about --rungs but whether the peer can be imported (run/benchmark.py checks
    that)."""
    from bert_tf.train import training

    unknown = [r for r in rungs if r not in RUNGS]
    if unknown:
        raise ConfigError(
            f"--rungs: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(RUNGS)}"
        )
    if not rungs:
        raise ConfigError("--rungs is empty")
    if not gpu and any(r.startswith("tf32") for r in rungs):
        raise ConfigError(
            "--rungs: tf32 needs a GPU with TensorFloat-32 (Ampere or newer); TensorFlow sees no "
            "GPU here"
        )
    if not fusion and any(r.endswith("+fuse") for r in rungs):
        raise ConfigError(
            f"--rungs: the +fuse rungs need {training.FUSION_ENV} in the environment when the "
            "benchmark starts (TensorFlow reads it once, early); the other rungs keep out of it"
        )
    if "best-dropout" in rungs and not any(
        r in rungs[: rungs.index("best-dropout")] for r in PRECISION_RUNGS
    ):
        raise ConfigError("--rungs: best-dropout needs a bert_tf rung before it")


def check_writable(path, flag="write_flagfile"):
    """Fails before an hour of measuring if the file could not be written at the end."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"--{flag}={path}: directory {directory} does not exist")
    if (
        os.path.isdir(path)
        or not os.access(directory, os.W_OK)
        or (os.path.exists(path) and not os.access(path, os.W_OK))
    ):
        raise ConfigError(f"--{flag}={path}: not writable")


def check_settings(s: BenchmarkConfig):
    """(tuned micro-batches, [(records glob, instances per row)]), after every check that can fail
    before an hour of measuring: micro-batches, output files, the plan's sequence lengths, input
    files."""
    from bert_tf.data import input_pipeline
    from bert_tf.tools import device_figures

    if s.rungs is None:
        raise ValueError(
            "the ladder needs its rungs resolved (default_rungs): run/benchmark.py does it"
        )
    micro_batches = list(s.tune_micro_batch_sizes)
    if any(b < 1 for b in micro_batches) or s.micro_batch_size < 1:
        raise ConfigError(
            f"--micro_batch_size/--tune_micro_batch_sizes must be >= 1, got {s.micro_batch_size}, "
            f"{micro_batches}"
        )
    for flag in ("write_flagfile", "device_figures"):
        if getattr(s, flag):
            check_writable(getattr(s, flag), flag)
            if not any(r in PRECISION_RUNGS for r in s.rungs):
                raise ConfigError(f"--{flag} needs at least one bert_tf precision rung in --rungs")
    if s.device_figures:
        if s.sequence.max_seq_length not in device_figures.DEVICE_FIGURES.values():
            raise ConfigError(
                f"--device_figures: the plan's phases run at sequence 128 and 512, not "
                f"--max_seq_length={s.sequence.max_seq_length}"
            )
        if os.path.exists(s.device_figures):
            device_figures.read_device_figures(
                s.device_figures, s.model_preset
            )  # one it can add to
    seq = s.sequence
    records = []
    # (glob, instances per row), checked before an hour of measuring
    for pattern in s.rung_train_files:
        files = input_pipeline.list_files(pattern)
        records.append(
            (
                pattern,
                input_pipeline.check_files(files, seq.max_seq_length, seq.max_predictions_per_seq),
            )
        )
    if s.train_files:
        if not s.vocab_file:
            raise ConfigError("--train_files needs --vocab_file")
        input_pipeline.check_files(
            input_pipeline.list_files(s.train_files),
            seq.max_seq_length,
            seq.max_predictions_per_seq,
        )
    return micro_batches, records
