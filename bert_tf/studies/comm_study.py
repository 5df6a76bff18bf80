"""The communication study's logic (run/comm_study.py is its command line): the ladder of
communication settings, the link probe, short pre-training jobs on an emulated cluster and
the reduction of their metrics, and the planner's predictions calibrated on the study's own
measurements (bert_tf/studies/planner_validation.py judges them).

Nothing is fitted to the BERT jobs' communication times: a prediction takes the per-rank
speed without communication (median over the jobs) and the link as the probe measured it. A
second error per job feeds the planner that job's own speed: fresh processes on one machine
compute at different speeds (oneDNN's matmul peak moved 0.37-0.99 TFLOP/s between processes
on the AMX Xeon), and that error isolates the communication model from the spread.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess

from bert_tf import ConfigError, knob, knobs
from bert_tf.artifacts import metrics
from bert_tf.tools import planner
from bert_tf.studies import emulated_cluster
from bert_tf.parallel.comm import CommConfig

BASELINE = "fp32/every-mb"
FP32_ACCUM = "fp32/accum"


def rungs(fusion_thresholds_mb=(), cycle_times_ms=(), compressed=()):
    """[(label, CommConfig)] in the order of the paper's optimisations, Horovod's defaults
    spelled out (128 MB fusion, 1 ms cycle) so that each job states what it ran with; then the
    compressed exchanges asked for (`compressed`: powersgd, onebit)."""
    out = [
        (BASELINE, CommConfig(allreduce_every_micro_batch=True)),
        (FP32_ACCUM, CommConfig()),
        ("fp16/accum", CommConfig(fp16_allreduce=True)),
    ]
    out += [
        (f"fp16 fusion={mb:g}MB", CommConfig(fp16_allreduce=True, fusion_threshold_mb=mb))
        for mb in fusion_thresholds_mb
    ]
    out += [
        (f"fp16 cycle={ms:g}ms", CommConfig(fp16_allreduce=True, cycle_time_ms=ms))
        for ms in cycle_times_ms
    ]
    # onebit estimates the variance from a float32 update first (training.py); job_metrics drops
    # early updates
    out += [
        (method, CommConfig(exchange=method, compression_warmup_steps=int(method == "onebit")))
        for method in compressed
    ]
    return [(label, comm.resolved()) for label, comm in out]


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """run/comm_study.py's flags; constructing one checks them (counts, rates, rung labels)."""

    model_preset: str = knobs.model_preset("small")
    vocab_file: str = knobs.vocab_file(
        "data/demo/vocab.txt", detail="of the records (scripts/demo.sh makes it)."
    )
    train_files: str = knobs.train_files(
        "data/demo/seq128/train-*", "comma-separated globs (scripts/demo.sh makes the default)."
    )
    sequence: knobs.Sequence = knobs.Sequence()
    micro_batch_size: int = knob(
        2, "Sequences per rank per forward/backward pass (one micro-batch)."
    )
    accumulation_steps: int = knob(8, "Micro-batches per update.")
    updates: int = knob(4, "Measured updates per job.")
    warmup_updates: int = knob(1, "Updates dropped from the measurement (compilation).")
    node_counts: list[int] = knob([2], "Emulated node counts (one rank each).")
    rates: list[float] = knob([1.0, 10.0, 25.0], "Link rates, Gbit/s.")
    sweep_fusion_threshold_mb: list[float] = knob(
        [0.0, 1.0, 16.0, 64.0],
        "Fusion thresholds to sweep on fp16/accum (128 = Horovod's default is the fp16/accum rung "
        "itself).",
    )
    sweep_cycle_time_ms: list[float] = knob(
        [5.0, 10.0], "Cycle times to sweep on fp16/accum (1 ms is Horovod's default)."
    )
    compressed: list[str] = knob(
        [],
        "Compressed exchanges to add to the ladder (--exchange): powersgd, onebit.",
        choices=["powersgd", "onebit"],
    )
    rungs: list[str] = knob(
        [], "Run only these rungs (labels as printed, e.g. fp32/every-mb,fp16/accum); default: all."
    )
    xla: bool = knob(True, "Compile forward/backward and the update with XLA.")
    device_seq_s: float = knob(
        0.0, "Without an emulated cluster: per-rank sequences/s for the planner."
    )
    job_timeout: int = knob(1800, "Seconds before a job is killed (and recorded as failed).")
    output_dir: str = knobs.output_dir(
        "study.json, study.png and the jobs' folders", default="runs/comm_study"
    )
    compression_cost: bool = knob(
        False,
        "Only measure what each --compressed exchange (default: both) adds to an update of "
        "--model_preset on this machine, in one process, and print it (the planner's overhead).",
    )
    probe: bool = knob(False, "Internal: run the link probe as one rank of an emulated job.")

    def __post_init__(self):
        for name in ("micro_batch_size", "accumulation_steps", "updates"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.node_counts or min(self.node_counts) < 2:
            raise ConfigError(f"--node_counts must list counts >= 2, got {self.node_counts}")
        if not self.rates or min(self.rates) <= 0:
            raise ConfigError(f"--rates must list positive Gbit/s, got {self.rates}")
        valid = [label for label, _ in self.all_rungs()]
        unknown = [r for r in self.rungs if r not in valid]
        if unknown:
            raise ConfigError(f"--rungs: unknown {unknown}; valid: {', '.join(valid)}")

    def all_rungs(self):
        return rungs(self.sweep_fusion_threshold_mb, self.sweep_cycle_time_ms, self.compressed)

    def ladder(self):
        """The rungs to run: all of them, or those --rungs names."""
        return (
            [r for r in self.all_rungs() if r[0] in self.rungs] if self.rungs else self.all_rungs()
        )

    def settings(self):
        """What makes two studies' measurements comparable; the micro-batch keeps its old key
        "batch_size", so a study.json written before --micro_batch_size was renamed still has the
        same settings."""
        return {
            "model_preset": self.model_preset,
            "vocab_file": self.vocab_file,
            "train_files": self.train_files,
            "max_seq_length": self.sequence.max_seq_length,
            "max_predictions_per_seq": self.sequence.max_predictions_per_seq,
            "batch_size": self.micro_batch_size,
            "accumulation_steps": self.accumulation_steps,
            "updates": self.updates,
            "warmup_updates": self.warmup_updates,
            "xla": self.xla,
        }


# -- measuring --------------------------------------------------------------------------------
def probe_link(small_tensors=200, big_elements=16 * 2**20, repeats=9):
    """Runs inside every rank of an emulated job: the link as Horovod sees it, apart from BERT.

    per-message cost: `small_tensors` one-float allreduces submitted together, fusion off
    (cycle 0.2 ms); bandwidth: one allreduce of a `big_elements` float32 tensor,
    2(N-1)/N x bytes / seconds. Means over `repeats` rounds, the first dropped (set-up), because
    the jobs report mean seconds per update: on the 2-core machine one 58 MB allreduce over the
    1 Gbit/s emulated link took either 0.53-0.60 s or 0.75-1.05 s from round to round (no qdisc
    drops, no TCP timeouts), and the median of 3 rounds (as before) saw only the fast mode.
    Returns the measurement on every rank, with the big allreduce's fastest and slowest round."""
    import time

    import tensorflow as tf

    from bert_tf.parallel import distributed

    distributed.configure(CommConfig(fusion_threshold_mb=0, cycle_time_ms=0.2))
    distributed.init()
    small = [tf.ones([1]) for _ in range(small_tensors)]
    big = tf.ones([big_elements])
    many = tf.function(lambda xs: distributed.allreduce_sum(xs, name="probe"))
    one = tf.function(lambda x: distributed.allreduce_sum([x], name="probe_big"))
    timings = {"many": [], "one": []}
    for _ in range(repeats):
        for key, fn, arg in (("many", many, small), ("one", one, big)):
            start = time.perf_counter()
            fn(arg)
            timings[key].append(time.perf_counter() - start)
    n = distributed.size()
    seconds = statistics.mean(timings["one"][1:])
    return {
        "message_seconds": statistics.mean(timings["many"][1:]) / small_tensors,
        "big_seconds": seconds,
        "big_seconds_range": [min(timings["one"][1:]), max(timings["one"][1:])],
        "effective_gbit": 2 * (n - 1) / n * big_elements * 4 * 8 / seconds / 1e9,
    }


PROBE_PREFIX = "PROBE "


class ProbeError(RuntimeError):
    """The link probe failed; the message names its log."""


def run_probe(cluster, ranks, command, log_path, timeout, env=None):
    """Runs `command` (a program that prints PROBE_PREFIX + json of probe_link() on rank 0) on
    the emulated cluster; returns that measurement. ProbeError naming the log when it fails twice (a
    launch on emulated nodes can fail before it starts, as run_job's can: seen in CI, exit 1)."""
    for attempt in (1, 2):
        proc = subprocess.run(
            cluster.mpirun_prefix(ranks, extra_env=_forwarded(env)) + command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=emulated_cluster.mpirun_env(env),
        )
        with open(log_path, "a") as f:
            f.write(proc.stdout + proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(PROBE_PREFIX)]
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1][len(PROBE_PREFIX) :])
    raise ProbeError(f"link probe failed twice (exit {proc.returncode}); log: {log_path}")


def run_job(
    cluster, ranks, command, folder, timeout, warmup_updates, sequences_per_rank_update, env=None
):
    """Runs one pre-training job (`command`: run/pretrain.py and its flags, writing its metrics to
    `folder`) on the emulated cluster; returns job_metrics() or {"error": ...}. A job that fails
    before its first update (a launch failure) is tried once more."""
    for attempt in (1, 2):
        result = _run_job_once(
            cluster, ranks, command, folder, timeout, warmup_updates, sequences_per_rank_update, env
        )
        if (
            "error" not in result
            or attempt == 2
            or os.path.exists(os.path.join(folder, "metrics.jsonl"))
        ):
            return result
        print(f"retrying {folder}: {result['error']}", flush=True)


def _run_job_once(
    cluster, ranks, command, folder, timeout, warmup_updates, sequences_per_rank_update, env
):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(folder, "log.txt"), "w") as log:
        proc = subprocess.Popen(
            cluster.mpirun_prefix(ranks, extra_env=_forwarded(env)) + command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=emulated_cluster.mpirun_env(env),
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": f"timed out after {timeout} s (log: {folder}/log.txt)"}
    if code != 0:
        return {"error": f"exited {code} (log: {folder}/log.txt)"}
    records = [
        r
        for r in metrics.read_metrics(os.path.join(folder, "metrics.jsonl"))
        if r["kind"] == "train"
    ]
    for path in glob.glob(os.path.join(folder, "ckpt-*")):  # keep logs and metrics, not weights
        os.remove(path)
    return job_metrics(records, warmup_updates, sequences_per_rank_update * ranks)


def _forwarded(env):
    """Variables of `env` that mpirun must hand to the ranks and that mpirun_prefix, which
    forwards them from this process's environment, would miss."""
    return tuple(
        var
        for var in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")
        if env and var in env and var not in os.environ
    )


def job_metrics(train_records, warmup_updates, global_batch):
    """One job's per-update figures from its "train" records (one per update: --log_interval=1),
    the first `warmup_updates` dropped (XLA compilation): mean compute, allreduce, update seconds
    and bytes sent, and wait (for the slowest rank before each allreduce: 0 in records from before
    it was measured); sequences/s over the measured updates; mean wall seconds per update."""
    measured = train_records[warmup_updates:]
    if not measured:
        return {"error": "no measured updates"}
    out = {
        k: statistics.mean(r[k] for r in measured)
        for k in ("compute_seconds", "allreduce_seconds", "update_seconds", "tx_bytes_per_update")
    }
    out["wait_seconds"] = statistics.mean(r.get("wait_seconds", 0.0) for r in measured)
    out["sequences_per_second"] = len(measured) / sum(
        1.0 / r["sequences_per_second"] for r in measured
    )
    out["step_seconds"] = statistics.mean(
        global_batch / r["sequences_per_second"] for r in measured
    )
    return out


def previous_results(path, settings):
    """Rows and link probes of an earlier study.json at `path` with the same settings, keyed
    (nodes, rate, config) and (nodes, rate): a study run again measures only what is missing
    or failed. ({}, {}) when there is none or its settings differ."""
    if not os.path.exists(path):
        return {}, {}
    with open(path) as f:
        old = json.load(f)
    if old.get("settings") != settings:
        print(f"{path}: earlier study with other settings; measuring everything again")
        return {}, {}
    rows = {(r["nodes"], r["rate_gbit"], r["config"]): r for r in old["rows"] if "error" not in r}
    links = {(link["nodes"], link["rate_gbit"]): link for link in old.get("links", [])}
    return rows, links


def compression_seconds(shapes, method, powersgd_rank=4, repeats=5) -> float:
    """auto_exchange.compression_seconds in a process of its own (Horovod initialised here): the
    planner's overhead_seconds."""
    from bert_tf.parallel import auto_exchange, distributed

    distributed.init()
    return auto_exchange.compression_seconds(shapes, method, powersgd_rank, repeats)


# -- predicting -------------------------------------------------------------------------------
def predict(
    tensor_sizes,
    nodes,
    rate_gbit,
    comm,
    device_seq_s,
    micro_batch,
    accumulation_steps,
    seq_length,
    link=None,
    overhead_seconds=0.0,
    updates=1,
):
    """The planner's figures for one rung on `nodes` emulated nodes (one rank each). `link` (from
    the probe) calibrates the emulated link: its measured bandwidth and per-message cost replace
    the nominal rate and zero latency. overhead_seconds: a compressed exchange's own computation.
    updates: the run's length, over which a float32 warmup or local rounds are averaged (1: one
    update, the compressed exchange's steady state)."""
    if link:
        cluster = planner.probed_cluster(nodes, link, rate_gbit)
    else:
        cluster = planner.Cluster(nodes, 1, rate_gbit, inter_latency_us=0)
    batch = micro_batch * accumulation_steps * nodes
    phase = planner.Phase("study", seq_length, batch * updates, batch, device_seq_s)
    return planner.plan_phase(
        tensor_sizes, phase, cluster, comm, accumulation_steps, overhead_seconds
    )


def device_seq_s(rows, sequences_per_rank_update):
    """Per-rank sequences/s without communication, median over the measured jobs: the planner's
    compute speed, from the study itself. Compute + optimizer update + the wait for the slowest
    rank: rank 0's log holds rank 0's times, and the planner's compute is the slowest rank's (the
    one every allreduce waits for); without the wait a straggler's time counts as link time."""
    return statistics.median(
        sequences_per_rank_update
        / (r["compute_seconds"] + r.get("wait_seconds", 0.0) + r["update_seconds"])
        for r in rows
    )


def add_predictions(rows, links, comms, tensor_sizes, micro_batch, accumulation_steps, seq_length):
    """Adds to each measured row the planner's prediction and its error, the speed-up over the
    baseline and fp16's bytes relative to fp32/accum; returns the calibrated device_seq_s (None
    without measurements). prediction_error_own_compute: the same prediction fed the row's own
    per-rank speed. links: the probe results; comms: {label: CommConfig}."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return None
    speed = device_seq_s(ok, micro_batch * accumulation_steps)
    links = {(link["nodes"], link["rate_gbit"]): link for link in links}

    def planned(r, per_rank_speed):  # the planner's figures for row r's rung, link and speed
        return predict(
            tensor_sizes,
            r["nodes"],
            r["rate_gbit"],
            comms[r["config"]],
            per_rank_speed,
            micro_batch,
            accumulation_steps,
            seq_length,
            links.get((r["nodes"], r["rate_gbit"])),
        )

    for r in ok:
        p = planned(r, speed)
        r["predicted_sequences_per_second"] = p["sequences_per_second"]
        r["predicted_allreduce_seconds"] = p["allreduce_seconds"]
        r["prediction_error"] = p["sequences_per_second"] / r["sequences_per_second"] - 1
        p = planned(r, device_seq_s([r], micro_batch * accumulation_steps))
        r["prediction_error_own_compute"] = (
            p["sequences_per_second"] / r["sequences_per_second"] - 1
        )
    for r in ok:
        base, fp32 = _same_link(ok, r, BASELINE), _same_link(ok, r, FP32_ACCUM)
        if base:
            r["speedup_vs_baseline"] = r["sequences_per_second"] / base["sequences_per_second"]
        if fp32 and r["config"].startswith("fp16"):
            r["bytes_vs_fp32_accum"] = r["tx_bytes_per_update"] / fp32["tx_bytes_per_update"]
    return speed


def _same_link(rows, row, config):
    """The row measured with `config` at `row`'s node count and rate, or None."""
    return next(
        (
            r
            for r in rows
            if r["nodes"] == row["nodes"]
            and r["rate_gbit"] == row["rate_gbit"]
            and r["config"] == config
        ),
        None,
    )


def goals(rows):
    """Per node count and rate: the full set (accumulation + fp16 + the best fusion/cycle setting
    measured) vs the fp32 per-micro-batch baseline, and fp16's bytes vs fp32 (median)."""
    ok = [r for r in rows if "error" not in r]
    out = []
    for nodes, rate in sorted({(r["nodes"], r["rate_gbit"]) for r in ok}):
        here = [r for r in ok if r["nodes"] == nodes and r["rate_gbit"] == rate]
        base = [r for r in here if r["config"] == BASELINE]
        full = [r for r in here if r["config"].startswith("fp16")]
        if not base or not full:
            continue
        best = max(full, key=lambda r: r["sequences_per_second"])
        ratios = [r["bytes_vs_fp32_accum"] for r in full if "bytes_vs_fp32_accum" in r]
        out.append(
            {
                "nodes": nodes,
                "rate_gbit": rate,
                "best_config": best["config"],
                "speedup": best["sequences_per_second"] / base[0]["sequences_per_second"],
                "fp16_bytes_ratio": statistics.median(ratios) if ratios else None,
            }
        )
    return out
