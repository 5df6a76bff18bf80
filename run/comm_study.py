"""The communication study: what each of the paper's communication optimisations buys, measured
on an emulated cluster (bert_tf/studies/emulated_cluster.py: network namespaces, tbf-shaped links; root).

    python run/comm_study.py --output_dir=runs/comm_study                  # 2 nodes, 1/10/25 Gbit/s
    python run/comm_study.py --nodes=4 --rates=1 --fusion_threshold_mb= --cycle_time_ms= --output_dir=runs/comm_study4

For each node count and link rate, short pre-training jobs (run/pretrain.py, one rank per node)
climb the ladder
    fp32/every-mb   fp32 allreduce of every micro-batch's gradients (the naive baseline)
    fp32/accum      one allreduce per update, after accumulation
    fp16/accum      + fp16 gradient compression (Horovod's default fusion 128 MB, cycle 1 ms)
    fusion=X MB     + fusion threshold sweep (--fusion_threshold_mb)
    cycle=Y ms      + cycle time sweep (--cycle_time_ms)
    powersgd/onebit the compressed exchanges with error feedback, when asked (--compressed)
and records per update (first --warmup_updates dropped: XLA compilation): compute, allreduce and
update seconds (rank 0's clock), bytes rank 0's node sent on its link (kernel counter of eth0),
and sequences/s. Beside each measurement, the planner's prediction (bert_tf/tools/planner.py) from the
study's own measured compute speed. Writes study.json, study.png (throughput vs link rate per
configuration) and prints the table. Without root / iproute2 / namespaces it says what is missing,
skips the emulated part and prints only the planner's predictions (give --device_seq_s).

Data: the demo's (scripts/demo.sh makes data/demo); any google-format TFRecords work.
The logic is bert_tf/studies/comm_study.py; this file holds the flags, the loop and the printing.
"""

import glob
import json
import os
import sys

from absl import flags

from bert_tf import ConfigError, cli
from bert_tf.studies import comm_study, emulated_cluster as ec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

cli.define_model_preset("small")
flags.DEFINE_string("vocab_file", "data/demo/vocab.txt", "Vocabulary of the records (scripts/demo.sh makes it).")
flags.DEFINE_string("train_files", "data/demo/seq128/train-*", "Training TFRecords.")
cli.define_sequence()
flags.DEFINE_integer("micro_batch_size", 2, "Sequences per rank per forward/backward pass (one micro-batch).")
cli.define_renamed("batch_size", "micro_batch_size")
flags.DEFINE_integer("accumulation_steps", 8, "Micro-batches per update.")
flags.DEFINE_integer("updates", 4, "Measured updates per job.")
flags.DEFINE_integer("warmup_updates", 1, "Updates dropped from the measurement (compilation).")
flags.DEFINE_list("nodes", ["2"], "Emulated node counts (one rank each).")
flags.DEFINE_list("rates", ["1", "10", "25"], "Link rates, Gbit/s.")
flags.DEFINE_list("fusion_threshold_mb", ["0", "1", "16", "64"], "Fusion thresholds to sweep on fp16/accum "
                  "(128 = Horovod's default is the fp16/accum rung itself).")
flags.DEFINE_list("cycle_time_ms", ["5", "10"], "Cycle times to sweep on fp16/accum (1 ms is Horovod's default).")
flags.DEFINE_list("compressed", [], "Compressed exchanges to add to the ladder (--gradient_compression): "
                  "powersgd, onebit.")
flags.register_validator("compressed", lambda v: set(v) <= {"powersgd", "onebit"},
                         "--compressed takes powersgd and/or onebit")
flags.DEFINE_list("rungs", [], "Run only these rungs (labels as printed, e.g. fp32/every-mb,fp16/accum); "
                  "default: all.")
flags.DEFINE_bool("xla", True, "Compile forward/backward and the update with XLA.")
flags.DEFINE_float("device_seq_s", 0.0, "Without an emulated cluster: per-rank sequences/s for the planner.")
flags.DEFINE_integer("job_timeout", 1800, "Seconds before a job is killed (and recorded as failed).")
flags.DEFINE_string("output_dir", "runs/comm_study", "Where study.json, study.png and job folders go.")
flags.DEFINE_bool("compression_cost", False, "Only measure what each --compressed exchange (default: both) adds "
                  "to an update of --model_preset on this machine, in one process, and print it (the planner's "
                  "overhead).")
flags.DEFINE_bool("probe", False, "Internal: run the link probe as one rank of an emulated job.")
FLAGS = flags.FLAGS


def all_rungs():
    return comm_study.rungs([float(x) for x in FLAGS.fusion_threshold_mb], [float(x) for x in FLAGS.cycle_time_ms],
                            FLAGS.compressed)


def ladder():
    """The rungs to run: all of them, or those --rungs names."""
    return [r for r in all_rungs() if r[0] in FLAGS.rungs] if FLAGS.rungs else all_rungs()


def job_command(checkpoint_dir, comm):
    total = FLAGS.warmup_updates + FLAGS.updates
    return [sys.executable, os.path.join(REPO, "run", "pretrain.py"),
            f"--model_preset={FLAGS.model_preset}", f"--vocab_file={FLAGS.vocab_file}",
            f"--train_files={FLAGS.train_files}", f"--max_seq_length={FLAGS.max_seq_length}",
            f"--max_predictions_per_seq={FLAGS.max_predictions_per_seq}",
            f"--micro_batch_size={FLAGS.micro_batch_size}", f"--accumulation_steps={FLAGS.accumulation_steps}",
            f"--total_steps={total}", "--log_interval=1",
            f"--save_interval={total}", "--keep_last=1", "--learning_rate=1e-4", f"--checkpoint_dir={checkpoint_dir}",
            "--network_interface=eth0", "--xla" if FLAGS.xla else "--noxla", *comm.as_flags()]


def job_env():
    """The ranks import the bert_tf beside this script, whatever the installed one is."""
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}


def check_flags():
    for name in ("micro_batch_size", "accumulation_steps", "updates"):
        if FLAGS[name].value < 1:
            raise ConfigError(f"--{name} must be >= 1, got {FLAGS[name].value}")
    try:
        nodes = [int(n) for n in FLAGS.nodes]
        rates = [float(r) for r in FLAGS.rates]
        valid = [label for label, _ in all_rungs()]
    except ValueError as e:
        raise ConfigError(f"--nodes/--rates/--fusion_threshold_mb/--cycle_time_ms must be numbers: {e}") from None
    if not nodes or min(nodes) < 2:
        raise ConfigError(f"--nodes must list counts >= 2, got {FLAGS.nodes}")
    if not rates or min(rates) <= 0:
        raise ConfigError(f"--rates must list positive Gbit/s, got {FLAGS.rates}")
    unknown = [r for r in FLAGS.rungs if r not in valid]
    if unknown:
        raise ConfigError(f"--rungs: unknown {unknown}; valid: {', '.join(valid)}")
    return nodes, rates


def print_compression_cost():
    """--compression_cost: what each compressed exchange computes per update of --model_preset, here."""
    from bert_tf.model import modeling
    from bert_tf.tools import planner
    shapes = planner.gradient_tensor_shapes(modeling.BertConfig.preset(FLAGS.model_preset, vocab_size=30522))
    for method in FLAGS.compressed or ["powersgd", "onebit"]:
        seconds = comm_study.compression_seconds(shapes, method)
        print(f"{method}: {seconds:.4f} s per update for BERT-{FLAGS.model_preset} (vocabulary 30,522) on this "
              f"machine, in one process", flush=True)


def main(argv):
    if FLAGS.probe:
        link = comm_study.probe_link()
        from bert_tf.parallel import distributed
        if distributed.rank() == 0:
            print(comm_study.PROBE_PREFIX + json.dumps(link), flush=True)
        return
    from bert_tf.data import tokenization
    from bert_tf.model import modeling
    from bert_tf.tools import planner
    if FLAGS.compression_cost:
        return print_compression_cost()
    nodes_list, rates = check_flags()
    problem = ec.preflight()
    if problem is None:
        for name in ("vocab_file", "train_files"):
            if not glob.glob(FLAGS[name].value):
                raise ConfigError(f"--{name}={FLAGS[name].value} matches nothing (scripts/demo.sh makes the demo data)")
    vocab_size = len(tokenization.load_vocab(FLAGS.vocab_file)) if os.path.exists(FLAGS.vocab_file) else 30522
    config = modeling.BertConfig.preset(FLAGS.model_preset, vocab_size=vocab_size)
    sizes = planner.gradient_tensor_shapes(config)      # shapes: the compressed exchanges' plans need them
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    result = {"command": " ".join(sys.argv), "model_preset": FLAGS.model_preset, "vocab_size": vocab_size,
              "parameters": sum(planner.gradient_tensor_sizes(config)), "gradient_tensors": len(sizes), "batch_size": FLAGS.micro_batch_size,
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
                        p = comm_study.predict(sizes, nodes, rate, comm, FLAGS.device_seq_s, FLAGS.micro_batch_size,
                                               FLAGS.accumulation_steps, FLAGS.max_seq_length)
                        result["rows"].append({"nodes": nodes, "rate_gbit": rate, "config": label,
                                               "predicted_sequences_per_second": p["sequences_per_second"]})
            print_table(result["rows"])
        write(result)
        return
    try:
        measure(result, nodes_list, rates)
    except (comm_study.ProbeError, ec.ClusterError) as e:       # keep what was measured, say how to go on
        write(result)
        sys.exit(f"error: {e} (measurements so far are in {FLAGS.output_dir}/study.json; run again to continue)")
    rows = result["rows"]
    order = {label: i for i, (label, _) in enumerate(all_rungs())}
    rows.sort(key=lambda r: (r["nodes"], r["rate_gbit"], order.get(r["config"], len(order))))
    speed = comm_study.add_predictions(rows, result.get("links", []), dict(all_rungs()), sizes, FLAGS.micro_batch_size,
                                       FLAGS.accumulation_steps, FLAGS.max_seq_length)
    if speed is not None:
        result["device_seq_s"] = speed
    print_table(rows)
    result["goals"] = comm_study.goals(rows)
    print_goals(result["goals"])
    write(result)
    plot(rows, os.path.join(FLAGS.output_dir, "study.png"))


def measure(result, nodes_list, rates):
    """Runs the probe and the ladder for every node count and rate, keeping an earlier run's rows."""
    rows = result["rows"]
    done_rows, done_links = comm_study.previous_results(os.path.join(FLAGS.output_dir, "study.json"),
                                                        result["settings"])
    env = job_env()
    for nodes in nodes_list:
        for rate in rates:
            todo = []
            for label, comm in ladder():
                key = (nodes, rate, label)
                if key in done_rows:
                    rows.append(done_rows[key])
                    print(f"kept from an earlier run of this study: {nodes} nodes, {rate:g} Gbit/s, {label}")
                else:
                    todo.append((label, comm))
            if (nodes, rate) in done_links:
                result.setdefault("links", []).append(done_links[(nodes, rate)])
            if not todo:
                continue
            with ec.EmulatedCluster(nodes, rate_gbit=rate) as cluster:
                if (nodes, rate) not in done_links:
                    link = comm_study.run_probe(cluster, nodes, [sys.executable, os.path.abspath(__file__), "--probe"],
                                                os.path.join(FLAGS.output_dir, f"probe_n{nodes}_r{rate:g}.txt"),
                                                FLAGS.job_timeout, env)
                    result.setdefault("links", []).append({"nodes": nodes, "rate_gbit": rate, **link})
                    print(f"link probe, {nodes} nodes at {rate:g} Gbit/s: {json.dumps(link)}", flush=True)
                for label, comm in todo:
                    folder = os.path.join(FLAGS.output_dir, f"n{nodes}_r{rate:g}_{label.replace('/', '_').replace(' ', '_')}")
                    row = {"nodes": nodes, "rate_gbit": rate, "config": label, "flags": comm.as_flags(),
                           **comm_study.run_job(cluster, nodes, job_command(folder, comm), folder, FLAGS.job_timeout,
                                                FLAGS.warmup_updates, FLAGS.micro_batch_size * FLAGS.accumulation_steps,
                                                env)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    write(result)


def settings():
    """What makes two studies' measurements comparable; the micro-batch keeps its old key "batch_size", so
    a study.json written before --micro_batch_size was renamed still has the same settings."""
    names = ("model_preset", "vocab_file", "train_files", "max_seq_length", "max_predictions_per_seq",
             "micro_batch_size", "accumulation_steps", "updates", "warmup_updates", "xla")
    return {"batch_size" if name == "micro_batch_size" else name: FLAGS[name].value for name in names}


def print_goals(goals):
    for goal in goals:
        ratio = goal["fp16_bytes_ratio"]
        print(f"{goal['nodes']} nodes at {goal['rate_gbit']:g} Gbit/s: full set ({goal['best_config']}) "
              f"{goal['speedup']:.2f}x the fp32 per-micro-batch baseline (goal >= 1.8x at 1 Gbit/s); fp16 bytes "
              "per update " + (f"{ratio:.3f}x fp32 (goal 0.50 +- 0.02)" if ratio is not None else "n/a"))


def print_table(rows):
    head = (f"{'nodes':>5} {'Gbit/s':>6}  {'config':<18} {'seq/s':>7} {'speedup':>7} {'compute':>8} "
            f"{'wait':>6} {'allreduce':>9} {'MB/update':>9} {'bytes':>6} {'planner':>8} {'error':>6} {'own':>6}")
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
              f"{fmt('wait_seconds', '5.2f')}s {fmt('allreduce_seconds', '8.2f')}s {fmt('tx_bytes_per_update', '9.1f', 1e-6)} "
              f"{fmt('bytes_vs_fp32_accum', '6.3f')} {fmt('predicted_sequences_per_second', '8.2f')} "
              f"{fmt('prediction_error', '+6.0%')} {fmt('prediction_error_own_compute', '+6.0%')}")


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
                     f"{FLAGS.micro_batch_size}x{FLAGS.accumulation_steps} seq/rank/update")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    cli.run(main)
