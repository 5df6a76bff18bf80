"""The communication study: what each of the paper's communication optimisations buys, measured
on an emulated cluster (bert_tf/emulated_cluster.py: network namespaces, tbf-shaped links; root).

    python run/comm_study.py --output_dir=runs/comm_study                  # 2 nodes, 1/10/25 Gbit/s
    python run/comm_study.py --nodes=4 --rates=1 --fusion_mb= --cycle_ms= --output_dir=runs/comm_study4

For each node count and link rate, short pre-training jobs (run/pretrain.py, one rank per node)
climb the ladder
    fp32/every-mb   fp32 allreduce of every micro-batch's gradients (the naive baseline)
    fp32/accum      one allreduce per update, after accumulation
    fp16/accum      + fp16 gradient compression (Horovod's default fusion 128 MB, cycle 1 ms)
    fusion=X MB     + fusion threshold sweep (--fusion_mb)
    cycle=Y ms      + cycle time sweep (--cycle_ms)
and records per update (first --warmup_updates dropped: XLA compilation): compute, allreduce and
update seconds (rank 0's clock), bytes rank 0's node sent on its link (kernel counter of eth0),
and sequences/s. Beside each measurement, the planner's prediction (bert_tf/planner.py) from the
study's own measured compute speed. Writes study.json, study.png (throughput vs link rate per
configuration) and prints the table. Without root / iproute2 / namespaces it says what is missing,
skips the emulated part and prints only the planner's predictions (give --device_seq_s).

Data: the demo's (scripts/demo.sh makes data/demo); any google-format TFRecords work.
"""
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_string("model_preset", "small", "Model size of the jobs.")
flags.DEFINE_string("vocab_file", "data/demo/vocab.txt", "Vocabulary of the records (scripts/demo.sh makes it).")
flags.DEFINE_string("train_files", "data/demo/seq128/train-*", "Training TFRecords.")
flags.DEFINE_integer("max_seq_length", 128, "Sequence length of the records.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked positions per record.")
flags.DEFINE_integer("batch_size", 2, "Micro-batch per rank.")
flags.DEFINE_integer("accumulation_steps", 8, "Micro-batches per update.")
flags.DEFINE_integer("updates", 4, "Measured updates per job.")
flags.DEFINE_integer("warmup_updates", 1, "Updates dropped from the measurement (compilation).")
flags.DEFINE_list("nodes", ["2"], "Emulated node counts (one rank each).")
flags.DEFINE_list("rates", ["1", "10", "25"], "Link rates, Gbit/s.")
flags.DEFINE_list("fusion_mb", ["0", "1", "16", "64"], "Fusion thresholds to sweep on fp16/accum "
                  "(128 = Horovod's default is the fp16/accum rung itself).")
flags.DEFINE_list("cycle_ms", ["5", "10"], "Cycle times to sweep on fp16/accum (1 ms is Horovod's default).")
flags.DEFINE_list("rungs", [], "Run only these rungs (labels as printed, e.g. fp32/every-mb,fp16/accum); "
                  "default: all.")
flags.DEFINE_bool("xla", True, "Compile forward/backward and the update with XLA.")
flags.DEFINE_float("device_seq_s", 0.0, "Without an emulated cluster: per-rank sequences/s for the planner.")
flags.DEFINE_integer("job_timeout", 1800, "Seconds before a job is killed (and recorded as failed).")
flags.DEFINE_string("output_dir", "runs/comm_study", "Where study.json, study.png and job folders go.")
flags.DEFINE_bool("probe", False, "Internal: run the link probe as one rank of an emulated job.")
FLAGS = flags.FLAGS


def ladder():
    """The rungs to run: all of them, or those --rungs names."""
    return [r for r in all_rungs() if r[0] in FLAGS.rungs] if FLAGS.rungs else all_rungs()


def all_rungs():
    """(label, planner.Comm) in the order of the paper's optimisations. Comm's defaults, 128 MB
    fusion and a 1 ms cycle, are Horovod's."""
    from bert_tf.planner import Comm
    rungs = [("fp32/every-mb", Comm(fp16_compression=False, allreduce_after_accumulation=False)),
             ("fp32/accum", Comm(fp16_compression=False)),
             ("fp16/accum", Comm(fp16_compression=True))]
    rungs += [(f"fp16 fusion={mb}MB", Comm(fusion_buffer_mb=float(mb))) for mb in FLAGS.fusion_mb]
    rungs += [(f"fp16 cycle={ms}ms", Comm(cycle_time_ms=float(ms))) for ms in FLAGS.cycle_ms]
    return rungs


def rung_flags(comm):
    """run/pretrain.py's flags for a rung's communication settings."""
    return (["--fp16_allreduce" if comm.fp16_compression else "--nofp16_allreduce",
             f"--fusion_threshold_mb={comm.fusion_buffer_mb:g}", f"--cycle_time_ms={comm.cycle_time_ms:g}"]
            + ([] if comm.allreduce_after_accumulation else ["--allreduce_every_micro_batch"]))


def job_flags(checkpoint_dir):
    total = FLAGS.warmup_updates + FLAGS.updates
    return [f"--model_preset={FLAGS.model_preset}", f"--vocab_file={FLAGS.vocab_file}",
            f"--train_files={FLAGS.train_files}", f"--max_seq_length={FLAGS.max_seq_length}",
            f"--max_predictions_per_seq={FLAGS.max_predictions_per_seq}", f"--batch_size={FLAGS.batch_size}",
            f"--accumulation_steps={FLAGS.accumulation_steps}", f"--total_steps={total}", "--log_interval=1",
            f"--save_interval={total}", "--keep_last=1", "--learning_rate=1e-4", f"--checkpoint_dir={checkpoint_dir}",
            "--network_interface=eth0", "--xla" if FLAGS.xla else "--noxla"]


def run_job(cluster, ranks, extra, folder):
    """Runs one job on the emulated cluster; returns its averaged per-update measurements. A job
    that fails before its first update (a launch failure) is tried once more."""
    for attempt in (1, 2):
        result = _run_once(cluster, ranks, extra, folder)
        if "error" not in result or attempt == 2 or os.path.exists(os.path.join(folder, "metrics.jsonl")):
            return result
        print(f"retrying {folder}: {result['error']}", flush=True)


def _run_once(cluster, ranks, extra, folder):
    from bert_tf import metrics
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    cmd = cluster.mpirun_prefix(ranks) + [sys.executable, os.path.join(REPO, "run", "pretrain.py"),
                                          *job_flags(folder), *extra]
    with open(os.path.join(folder, "log.txt"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=FLAGS.job_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": f"timed out after {FLAGS.job_timeout} s (log: {folder}/log.txt)"}
    if code != 0:
        return {"error": f"exited {code} (log: {folder}/log.txt)"}
    records = [r for r in metrics.read_metrics(os.path.join(folder, "metrics.jsonl")) if r["kind"] == "train"]
    measured = records[FLAGS.warmup_updates:]
    if not measured:
        return {"error": "no measured updates"}
    for path in glob.glob(os.path.join(folder, "ckpt-*")):        # keep logs and metrics, not weights
        os.remove(path)
    mean = {k: statistics.mean(r[k] for r in measured)
            for k in ("compute_seconds", "allreduce_seconds", "update_seconds", "tx_bytes_per_update")}
    seconds = sum(1.0 / r["sequences_per_second"] for r in measured)      # per sequence, summed
    mean["sequences_per_second"] = len(measured) / seconds
    mean["step_seconds"] = statistics.mean(FLAGS.batch_size * FLAGS.accumulation_steps * ranks
                                           / r["sequences_per_second"] for r in measured)
    return mean


def probe():
    """Runs inside the ranks (--probe): the link as Horovod sees it, apart from BERT.

    per-message cost: 200 one-float allreduces submitted together with fusion off (cycle 0.2 ms)
    bandwidth: allreduce of one 64 MB tensor, 2(N-1)/N x bytes / seconds
    """
    import time
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    os.environ["HOROVOD_CYCLE_TIME"] = "0.2"
    import tensorflow as tf

    import horovod.tensorflow as hvd
    hvd.init()
    small = [tf.ones([1]) for _ in range(200)]
    big = tf.ones([16 * 2 ** 20])
    many = tf.function(lambda xs: [hvd.allreduce(x, op=hvd.Sum, name=f"probe_{i}") for i, x in enumerate(xs)])
    one = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="probe_big"))
    timings = {"many": [], "one": []}
    for rep in range(4):
        for key, fn, arg in (("many", many, small), ("one", one, big)):
            start = time.perf_counter()
            fn(arg)
            timings[key].append(time.perf_counter() - start)
    n = hvd.size()
    per_message = statistics.median(timings["many"][1:]) / len(small)
    seconds = statistics.median(timings["one"][1:])
    if hvd.rank() == 0:
        print("PROBE " + json.dumps({"message_seconds": per_message, "big_seconds": seconds,
                                     "effective_gbit": 2 * (n - 1) / n * big.shape[0] * 4 * 8 / seconds / 1e9}),
              flush=True)


def run_probe(cluster, ranks, log_path):
    cmd = cluster.mpirun_prefix(ranks) + [sys.executable, os.path.abspath(__file__), "--probe"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FLAGS.job_timeout)
    with open(log_path, "w") as f:
        f.write(proc.stdout + proc.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"link probe failed (exit {proc.returncode}); log: {log_path}")
    return json.loads(lines[-1][6:])


def predict(tensor_sizes, nodes, rate, comm, device_seq_s, link=None):
    """The planner's throughput for one rung. `link` (from the probe) calibrates the emulated link:
    its measured bandwidth and per-message cost replace the nominal rate and zero latency."""
    from bert_tf import planner
    if link:
        cluster = planner.Cluster(nodes, 1, min(rate, link["effective_gbit"]), inter_latency_us=0,
                                  message_overhead_us=link["message_seconds"] * 1e6)
    else:
        cluster = planner.Cluster(nodes, 1, rate, inter_latency_us=0)
    batch = FLAGS.batch_size * FLAGS.accumulation_steps * nodes
    phase = planner.Phase("study", FLAGS.max_seq_length, batch, batch, device_seq_s)
    return planner.plan_phase(tensor_sizes, phase, cluster, comm, FLAGS.accumulation_steps)


def check_flags():
    from bert_tf import modeling
    if FLAGS.model_preset not in modeling.PRESETS:
        raise ValueError(f"--model_preset={FLAGS.model_preset}: valid: {', '.join(modeling.PRESETS)}")
    for name in ("batch_size", "accumulation_steps", "updates"):
        if FLAGS[name].value < 1:
            raise ValueError(f"--{name} must be >= 1, got {FLAGS[name].value}")
    try:
        nodes = [int(n) for n in FLAGS.nodes]
        rates = [float(r) for r in FLAGS.rates]
        fusion, cycle = [float(x) for x in FLAGS.fusion_mb], [float(x) for x in FLAGS.cycle_ms]
    except ValueError as e:
        raise ValueError(f"--nodes/--rates/--fusion_mb/--cycle_ms must be numbers: {e}")
    if any(x < 0 for x in fusion) or any(x <= 0 for x in cycle):
        raise ValueError(f"--fusion_mb must be >= 0 and --cycle_ms > 0, got {FLAGS.fusion_mb} and {FLAGS.cycle_ms}")
    if not nodes or min(nodes) < 2:
        raise ValueError(f"--nodes must list counts >= 2, got {FLAGS.nodes}")
    if not rates or min(rates) <= 0:
        raise ValueError(f"--rates must list positive Gbit/s, got {FLAGS.rates}")
    if FLAGS.rungs:
        valid = [label for label, _ in all_rungs()]
        unknown = [r for r in FLAGS.rungs if r not in valid]
        if unknown:
            raise ValueError(f"--rungs: unknown {unknown}; valid: {', '.join(valid)}")
    return nodes, rates


def main(argv):
    if FLAGS.probe:
        return probe()
    from bert_tf import emulated_cluster as ec
    from bert_tf import modeling, planner, tokenization
    try:
        nodes_list, rates = check_flags()
    except ValueError as e:
        sys.exit(f"error: {e}")
    problem = ec.preflight()
    if problem is None:
        for name in ("vocab_file", "train_files"):
            if not glob.glob(FLAGS[name].value):
                sys.exit(f"error: --{name}={FLAGS[name].value} matches nothing (scripts/demo.sh makes the demo data)")
    vocab_size = len(tokenization.load_vocab(FLAGS.vocab_file)) if os.path.exists(FLAGS.vocab_file) else 30522
    config = modeling.BertConfig.preset(FLAGS.model_preset, vocab_size=vocab_size)
    sizes = planner.gradient_tensor_sizes(config)
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    result = {"command": " ".join(sys.argv), "model_preset": FLAGS.model_preset, "vocab_size": vocab_size,
              "parameters": sum(sizes), "gradient_tensors": len(sizes), "batch_size": FLAGS.batch_size,
              "accumulation_steps": FLAGS.accumulation_steps, "updates": FLAGS.updates, "rows": [],
              "settings": settings()}
    if problem is not None:
        print(f"emulated part skipped: {problem}", flush=True)
        result["skipped"] = problem
        if FLAGS.device_seq_s <= 0:
            print("no --device_seq_s given: no planner predictions either")
        else:
            for nodes in nodes_list:
                for rate in rates:
                    for label, comm in ladder():
                        p = predict(sizes, nodes, rate, comm, FLAGS.device_seq_s)
                        result["rows"].append({"nodes": nodes, "rate_gbit": rate, "config": label,
                                               "predicted_sequences_per_second": p["sequences_per_second"]})
            print_table(result["rows"])
        write(result)
        return
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        measure(result, nodes_list, rates)
    except (RuntimeError, ec.ClusterError) as e:
        write(result)
        sys.exit(f"error: {e} (measurements so far are in {FLAGS.output_dir}/study.json; run again to continue)")
    rows = result["rows"]
    order = {label: i for i, (label, _) in enumerate(all_rungs())}
    rows.sort(key=lambda r: (r["nodes"], r["rate_gbit"], order.get(r["config"], len(order))))
    add_predictions(result, sizes)
    print_table(rows)
    goals(result)
    write(result)
    plot(rows, os.path.join(FLAGS.output_dir, "study.png"))


def measure(result, nodes_list, rates):
    """Runs the probe and the ladder for every node count and rate, keeping an earlier run's rows."""
    from bert_tf import emulated_cluster as ec
    rows = result["rows"]
    done_rows, done_links = previous_results(result["settings"])
    for nodes in nodes_list:
        for rate in rates:
            todo = []
            for label, comm in ladder():
                key = (nodes, rate, label)
                if key in done_rows:
                    rows.append(done_rows[key])
                    print(f"kept from an earlier run of this study: {nodes} nodes, {rate:g} Gbit/s, {label}")
                else:
                    todo.append((label, rung_flags(comm)))
            if (nodes, rate) in done_links:
                result.setdefault("links", []).append(done_links[(nodes, rate)])
            if not todo:
                continue
            with ec.EmulatedCluster(nodes, rate_gbit=rate) as cluster:
                if (nodes, rate) not in done_links:
                    link = run_probe(cluster, nodes, os.path.join(FLAGS.output_dir, f"probe_n{nodes}_r{rate:g}.txt"))
                    result.setdefault("links", []).append({"nodes": nodes, "rate_gbit": rate, **link})
                    print(f"link probe, {nodes} nodes at {rate:g} Gbit/s: {json.dumps(link)}", flush=True)
                for label, extra in todo:
                    folder = os.path.join(FLAGS.output_dir, f"n{nodes}_r{rate:g}_{label.replace('/', '_').replace(' ', '_')}")
                    row = {"nodes": nodes, "rate_gbit": rate, "config": label, "flags": extra,
                           **run_job(cluster, nodes, extra, folder)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    write(result)


def settings():
    """What makes two studies' measurements comparable."""
    return {name: FLAGS[name].value for name in ("model_preset", "vocab_file", "train_files", "max_seq_length",
                                                  "max_predictions_per_seq", "batch_size", "accumulation_steps",
                                                  "updates", "warmup_updates", "xla")}


def previous_results(current):
    """Rows and link probes of an earlier study in --output_dir with the same settings: a study
    run again (after a crash, or with more rates/rungs) measures only what is missing or failed."""
    path = os.path.join(FLAGS.output_dir, "study.json")
    if not os.path.exists(path):
        return {}, {}
    with open(path) as f:
        old = json.load(f)
    if old.get("settings") != current:
        print(f"{path}: earlier study with other settings; measuring everything again")
        return {}, {}
    rows = {(r["nodes"], r["rate_gbit"], r["config"]): r for r in old["rows"] if "error" not in r}
    links = {(l["nodes"], l["rate_gbit"]): l for l in old.get("links", [])}
    return rows, links


def add_predictions(result, sizes):
    """Planner vs measurement: the per-rank speed without communication (compute + optimizer update)
    is the median measured over all jobs;
    the link is the probe's measurement (nothing fitted to the BERT jobs themselves)."""
    ok = [r for r in result["rows"] if "error" not in r]
    if not ok:
        return
    per_rank = FLAGS.batch_size * FLAGS.accumulation_steps
    device_seq_s = statistics.median(per_rank / (r["compute_seconds"] + r["update_seconds"]) for r in ok)
    result["device_seq_s"] = device_seq_s
    links = {(l["nodes"], l["rate_gbit"]): l for l in result.get("links", [])}
    comms = dict(all_rungs())
    for r in ok:
        p = predict(sizes, r["nodes"], r["rate_gbit"], comms[r["config"]], device_seq_s,
                    links.get((r["nodes"], r["rate_gbit"])))
        r["predicted_sequences_per_second"] = p["sequences_per_second"]
        r["predicted_allreduce_seconds"] = p["allreduce_seconds"]
        r["prediction_error"] = p["sequences_per_second"] / r["sequences_per_second"] - 1
    for r in ok:
        base = [b for b in ok if b["nodes"] == r["nodes"] and b["rate_gbit"] == r["rate_gbit"]
                and b["config"] == "fp32/every-mb"]
        fp32 = [b for b in ok if b["nodes"] == r["nodes"] and b["rate_gbit"] == r["rate_gbit"]
                and b["config"] == "fp32/accum"]
        if base:
            r["speedup_vs_baseline"] = r["sequences_per_second"] / base[0]["sequences_per_second"]
        if fp32 and r["config"].startswith("fp16"):
            r["bytes_vs_fp32_accum"] = r["tx_bytes_per_update"] / fp32[0]["tx_bytes_per_update"]


def goals(result):
    """The issue's goals, per node count and rate: the full set (accumulation + fp16 + the best
    fusion/cycle setting measured) vs the fp32 per-micro-batch baseline; fp16 bytes vs fp32."""
    ok = [r for r in result["rows"] if "error" not in r]
    result["goals"] = []
    for nodes, rate in sorted({(r["nodes"], r["rate_gbit"]) for r in ok}):
        here = [r for r in ok if r["nodes"] == nodes and r["rate_gbit"] == rate]
        base = [r for r in here if r["config"] == "fp32/every-mb"]
        full = [r for r in here if r["config"].startswith("fp16")]
        if not base or not full:
            continue
        best = max(full, key=lambda r: r["sequences_per_second"])
        ratios = [r["bytes_vs_fp32_accum"] for r in full if "bytes_vs_fp32_accum" in r]
        goal = {"nodes": nodes, "rate_gbit": rate, "best_config": best["config"],
                "speedup": best["sequences_per_second"] / base[0]["sequences_per_second"],
                "fp16_bytes_ratio": statistics.median(ratios) if ratios else None}
        result["goals"].append(goal)
        print(f"{nodes} nodes at {rate:g} Gbit/s: full set ({best['config']}) {goal['speedup']:.2f}x the fp32 "
              f"per-micro-batch baseline (goal >= 1.8x at 1 Gbit/s); fp16 bytes per update "
              + (f"{goal['fp16_bytes_ratio']:.3f}x fp32 (goal 0.50 +- 0.02)" if ratios else "n/a"))


def print_table(rows):
    head = (f"{'nodes':>5} {'Gbit/s':>6}  {'config':<18} {'seq/s':>7} {'speedup':>7} {'compute':>8} "
            f"{'allreduce':>9} {'MB/update':>9} {'bytes':>6} {'planner':>8} {'error':>6}")
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['nodes']:>5} {r['rate_gbit']:>6g}  {r['config']:<18} failed: {r['error']}")
            continue

        def fmt(key, spec, scale=1.0):
            width = int(spec.lstrip("+").split(".")[0])
            return format(r[key] * scale, spec) if key in r else "-".rjust(width)
        print(f"{r['nodes']:>5} {r['rate_gbit']:>6g}  {r['config']:<18} {fmt('sequences_per_second', '7.2f')} "
              f"{fmt('speedup_vs_baseline', '6.2f')}x {fmt('compute_seconds', '7.2f')}s "
              f"{fmt('allreduce_seconds', '8.2f')}s {fmt('tx_bytes_per_update', '9.1f', 1e-6)} "
              f"{fmt('bytes_vs_fp32_accum', '6.3f')} {fmt('predicted_sequences_per_second', '8.2f')} "
              f"{fmt('prediction_error', '+6.0%')}")


def write(result):
    with open(os.path.join(FLAGS.output_dir, "study.json"), "w") as f:
        json.dump(result, f, indent=1)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if "error" not in r]
    node_counts = sorted({r["nodes"] for r in ok})
    fig, axes = plt.subplots(1, len(node_counts), figsize=(6.5 * len(node_counts), 4.5), squeeze=False)
    for ax, nodes in zip(axes[0], node_counts):
        labels = [label for label, _ in ladder() if any(r["config"] == label and r["nodes"] == nodes for r in ok)]
        for label in labels:
            pts = sorted((r["rate_gbit"], r["sequences_per_second"]) for r in ok
                         if r["config"] == label and r["nodes"] == nodes)
            style = "-o" if "fusion" not in label and "cycle" not in label else ":."
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("link rate per node (Gbit/s)")
        ax.set_ylabel("sequences/s")
        ax.set_title(f"{nodes} emulated nodes, BERT-{FLAGS.model_preset}, "
                     f"{FLAGS.batch_size}x{FLAGS.accumulation_steps} seq/rank/update")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
