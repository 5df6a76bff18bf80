"""Dense against blocked windowed attention (model/local_attention.py), measured: forward and
backward of one local ModernBERT layer under XLA, at a few sequence lengths
(run/local_attention_bench.py is its command line).

Scopes: "attention" is the layer's attention module (fused projection, RoPE, attention, output
projection), "layer" the whole pre-norm layer (with the GeGLU feed-forward). Each step builds the
local mask from input_mask [B, S] as the encoder does, runs the scope forward and takes the
gradients of the input and of the scope's variables. Dense and blocked run the same layer on the
same input (max_abs_diff: their outputs' difference), in one fresh process per scope and length.

Time: the median wall time of `timed_steps` calls after `untimed_steps` (the first compiles), the
two paths taking turns. Memory, three ways: xla_buffers_mb, the "Total bytes used" of the compiled
step's XLA buffer assignment (parameters, outputs and every temporary at its planned offset: what
a step allocates, exactly); allocator_peak_mb, the peak of TensorFlow's CPU allocator over one step
above what was live before it (tf.config.experimental.get_memory_info("CPU:0"); it counts the
allocator's whole chunks, so it moves in coarse steps); and score_tensor_mb, the float32 scores,
[B, N, S, S] dense or [B, K, N, c, 3c] blocked, the largest intermediate the path makes.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError, knob, knobs
from bert_tf.model import layers, local_attention, modern
from bert_tf.model.config import BertConfig
from bert_tf.parallel import device

SCOPES = ("attention", "layer")
PATHS = ("dense", "blocked")
LOADS = ("load_average_at_start", "load_average_at_end")


@dataclasses.dataclass(frozen=True)
class LocalAttentionBench:
    """run/local_attention_bench.py's flags."""

    seq_lengths: list[int] = knob([512, 1024], "Sequence lengths to measure.")
    batch_size: int = knob(4, "Sequences per step.")
    hidden_size: int = knob(256, "Hidden size H.")
    num_attention_heads: int = knob(4, "Attention heads N.")
    intermediate_size: int = knob(384, "GeGLU width (scope layer).")
    local_attention: int = knob(128, "The window: keys within local_attention // 2 of a query.")
    scopes: list[str] = knob(list(SCOPES), "What a step runs.", choices=SCOPES)
    untimed_steps: int = knob(2, "Steps before the timed ones (the first compiles).")
    timed_steps: int = knob(11, "Timed steps; the median is reported.")
    output_dir: str = knobs.output_dir(
        "local_attention_bench.json and local_attention_bench.md",
        default="runs/local_attention_bench",
    )

    def __post_init__(self):
        for name in ("batch_size", "hidden_size", "num_attention_heads", "timed_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.untimed_steps < 1:
            raise ConfigError("--untimed_steps must be >= 1: the first step compiles")
        if self.local_attention < 2:
            raise ConfigError(f"--local_attention must be >= 2, got {self.local_attention}")
        if not self.seq_lengths or min(self.seq_lengths) < 1:
            raise ConfigError(f"--seq_lengths must list lengths >= 1, got {self.seq_lengths}")

    def model_config(self) -> BertConfig:
        """A modern config whose layer 1 is local (a global layer every third)."""
        return BertConfig.preset(
            "modern-mini",
            vocab_size=128,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            local_attention=self.local_attention,
        )


def local_mask(path, input_mask, local_window):
    """The local layers' mask of `path`, from input_mask [B, S] as ModernEncoder makes it."""
    if path == "blocked":
        return local_attention.window_mask(input_mask, None, local_window)
    seq = input_mask.shape[1]
    return layers.mask_bias_for(input_mask) + modern.window_bias(seq, local_window)


def step_function(layer, scope, path, local_window):
    """A compiled step: (x [B, S, H], input_mask [B, S], dy [B, S, H]) -> (y, a scalar of the
    gradients, fetched to wait for them)."""
    module = layer.attention if scope == "attention" else layer
    seed = tf.zeros([2], tf.int32)

    def step(x, input_mask, dy):
        positions = tf.broadcast_to(tf.range(x.shape[1])[tf.newaxis], tf.shape(input_mask))
        with tf.GradientTape() as tape:
            tape.watch(x)
            mask = local_mask(path, input_mask, local_window)
            if scope == "attention":
                y = layer.attention(x, mask, positions, seed, True)
            else:
                y = layer(x, (None, mask), positions, seed, True)
            loss = tf.reduce_sum(y * dy)
        grads = tape.gradient(loss, [x, *module.trainable_variables])
        return y, tf.add_n([tf.reduce_sum(g) for g in grads])

    step.__name__ = f"{path}_step"  # names the XLA module, whose buffer assignment is read by it
    return tf.function(step, jit_compile=True)


def allocator_peak_bytes(run):
    """The peak of the CPU allocator's bytes in use during run(), above what was live before; None
    where TensorFlow keeps no such statistics."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except (ValueError, tf.errors.OpError):
        run()
        return None
    run()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def score_bytes(cfg, seq, path):
    """The float32 scores' size: B N S S dense, B N K c 3c blocked."""
    c = cfg.local_attention // 2
    keys = seq if path == "dense" else 3 * c
    rows = seq if path == "dense" else -(-seq // c) * c
    return 4 * cfg.batch_size * cfg.num_attention_heads * rows * keys


def timed_calls(steps, inputs, count):
    """Wall seconds of `count` calls of each step, the paths taking turns (a load that comes and
    goes on a shared machine then falls on both)."""
    seconds = {path: [] for path in steps}
    for _ in range(count):
        for path, step in steps.items():
            started = time.perf_counter()
            step(*inputs)[1].numpy()
            seconds[path].append(time.perf_counter() - started)
    return seconds


def measure_pair(cfg, scope, seq):
    """Dense and blocked at one (scope, sequence length), on one layer and input: their rows."""
    layer = modern.ModernLayer(cfg.model_config(), 1)
    assert layer.local
    r = np.random.RandomState(0)
    shape = [cfg.batch_size, seq, cfg.hidden_size]
    inputs = (
        tf.constant(r.randn(*shape).astype(np.float32)),
        tf.ones([cfg.batch_size, seq], tf.int32),
        tf.constant(r.randn(*shape).astype(np.float32)),
    )
    steps = {path: step_function(layer, scope, path, cfg.local_attention) for path in PATHS}
    outputs, first_call = {}, {}
    for path, step in steps.items():
        started = time.perf_counter()
        outputs[path] = step(*inputs)[0].numpy()
        first_call[path] = time.perf_counter() - started
    timed_calls(steps, inputs, cfg.untimed_steps - 1)
    seconds = timed_calls(steps, inputs, cfg.timed_steps)
    rows = []
    for path, step in steps.items():
        peak = allocator_peak_bytes(lambda: step(*inputs)[1].numpy())
        rows.append(
            {
                "scope": scope,
                "seq": seq,
                "path": path,
                "median_ms": 1000 * statistics.median(seconds[path]),
                "min_ms": 1000 * min(seconds[path]),
                "first_call_s": first_call[path],
                "allocator_peak_mb": None if peak is None else peak / 2**20,
                "score_tensor_mb": score_bytes(cfg, seq, path) / 2**20,
            }
        )
    rows[-1]["max_abs_diff"] = float(np.abs(outputs["dense"] - outputs["blocked"]).max())
    return rows


def xla_bytes(dump_dir, path):
    """'Total bytes used' of the XLA buffer assignment dumped for `path`'s step: what the compiled
    step allocates (parameters, outputs, and every temporary at its planned offset); None if not
    found."""
    totals = []
    for name in glob.glob(os.path.join(dump_dir, f"*{path}_step*buffer-assignment.txt")):
        with open(name) as f:
            found = re.search(r"Total bytes used: (\d+)", f.read())
        if found:
            totals.append(int(found[1]))
    return max(totals) if totals else None


def child_main(argv):
    """The measuring process's entry: argv = [config JSON, scope, seq]; prints its rows."""
    cfg = LocalAttentionBench(**json.loads(argv[0]))
    print(json.dumps(measure_pair(cfg, argv[1], int(argv[2]))))


def measure_in_child(cfg, scope, seq):
    """measure_pair in a fresh process (a fresh allocator, XLA's buffer assignments dumped to a
    temporary folder): its rows, each with xla_buffers_mb."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys\nfrom bert_tf.studies import local_attention_bench as b\n"
    code += "b.child_main(sys.argv[1:])"
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        args = [json.dumps(dataclasses.asdict(cfg)), scope, str(seq)]
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
        )
        if proc.returncode:
            raise RuntimeError(f"{scope} at {seq} tokens failed:\n{proc.stderr[-3000:]}")
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
        for row in rows:
            total = xla_bytes(dump, row["path"])
            row["xla_buffers_mb"] = None if total is None else total / 2**20
    return rows


def run(cfg: LocalAttentionBench) -> dict:
    """Every scope x sequence length, dense and blocked; returns the report (rows and the
    machine)."""
    report = {
        "device": device.device_description(),
        "tensorflow": tf.__version__,
        "load_average_at_start": os.getloadavg(),
        "config": dataclasses.asdict(cfg),
        "rows": [],
    }
    for scope in cfg.scopes:
        for seq in cfg.seq_lengths:
            for row in measure_in_child(cfg, scope, seq):
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    report["load_average_at_end"] = os.getloadavg()
    return report


def markdown(report) -> str:
    """The rows as a markdown table, blocked under its dense row."""
    lines = [
        "| scope | seq | path | median ms/step | min ms | XLA buffers MiB | allocator peak MiB "
        "| scores MiB | blocked vs dense |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mib = lambda value: "n/a" if value is None else f"{value:.1f}"
    dense = {}
    for row in report["rows"]:
        key = (row["scope"], row["seq"])
        versus = ""
        if row["path"] == "dense":
            dense[key] = row
        elif key in dense:
            versus = (
                f"{dense[key]['median_ms'] / row['median_ms']:.2f}x the speed, "
                f"max abs diff {row.get('max_abs_diff', float('nan')):.1e}"
            )
        lines.append(
            f"| {row['scope']} | {row['seq']} | {row['path']} | {row['median_ms']:.1f} | "
            f"{row['min_ms']:.1f} | {mib(row['xla_buffers_mb'])} | "
            f"{mib(row['allocator_peak_mb'])} | {row['score_tensor_mb']:.1f} | {versus} |"
        )
    return "\n".join(lines) + "\n"


def heading(report) -> str:
    """One line: what ran, on what."""
    cfg, machine = report["config"], report["device"]
    load = "/".join(f"{report.get(k, [float('nan')])[0]:.2f}" for k in LOADS)
    return (
        f"One local layer, forward + backward under XLA: batch {cfg['batch_size']}, hidden "
        f"{cfg['hidden_size']}, {cfg['num_attention_heads']} heads, local_attention "
        f"{cfg['local_attention']}; median of {cfg['timed_steps']} steps. "
        f"{machine.get('cpu', machine)} ({machine.get('cpu_count')} cores), TensorFlow "
        f"{report['tensorflow']}, 1-minute load average at start/end {load}.\n"
    )


def write(report, output_dir):
    """output_dir/local_attention_bench.json and .md; returns the markdown."""
    os.makedirs(output_dir, exist_ok=True)
    text = heading(report) + "\n" + markdown(report)
    with open(os.path.join(output_dir, "local_attention_bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(output_dir, "local_attention_bench.md"), "w") as f:
        f.write(text)
    return text
