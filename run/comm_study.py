"""The communication study: what each of the paper's communication optimisations buys, measured
on an emulated cluster (bert_tf/studies/emulated_cluster.py: network namespaces, tbf-shaped links;
root).

    python run/comm_study.py --output_dir=runs/comm_study          # 2 nodes, 1/10/25 Gbit/s
    python run/comm_study.py --node_counts=4 --rates=1 --sweep_fusion_threshold_mb= \
        --sweep_cycle_time_ms= --output_dir=runs/comm_study4

For each node count and link rate, short pre-training jobs (run/pretrain.py, one rank per node)
climb the ladder
    fp32/every-mb   fp32 allreduce of every micro-batch's gradients (the naive baseline)
    fp32/accum      one allreduce per update, after accumulation
    fp16/accum      + fp16 gradient compression (Horovod's default fusion 128 MB, cycle 1 ms)
    fusion=X MB     + fusion threshold sweep (--sweep_fusion_threshold_mb)
    cycle=Y ms      + cycle time sweep (--sweep_cycle_time_ms)
    powersgd/onebit the compressed exchanges with error feedback, when asked (--compressed)
and records per update (first --warmup_updates dropped: XLA compilation): compute, allreduce and
update seconds (rank 0's clock), bytes rank 0's node sent on its link (kernel counter of eth0),
and sequences/s. Beside each measurement, the planner's prediction (bert_tf/tools/planner.py) from
the study's own measured compute speed. Writes study.json, study.png (throughput vs link rate per
configuration) and prints the table. Without root / iproute2 / namespaces it says what is missing,
skips the emulated part and prints only the planner's predictions (give --device_seq_s).

Data: the demo's (scripts/demo.sh makes data/demo); any google-format TFRecords work.
The logic and the flags (StudyConfig) are bert_tf/studies/comm_study.py; this file holds the loop
and the printing. The old names --nodes, --fusion_threshold_mb and --cycle_time_ms (lists here,
single values in run/pretrain.py) work for one release with a warning.
"""

import glob
import json
import os
import sys

from bert_tf import ConfigError, cli
from bert_tf.studies import comm_study, emulated_cluster as ec
from bert_tf.studies.comm_study import StudyConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

cli.define_config_flags(StudyConfig)
cli.define_renamed("batch_size", "micro_batch_size")
cli.define_renamed("nodes", "node_counts")
cli.define_renamed("fusion_threshold_mb", "sweep_fusion_threshold_mb")
cli.define_renamed("cycle_time_ms", "sweep_cycle_time_ms")


def job_command(cfg, checkpoint_dir, comm):
    total = cfg.warmup_updates + cfg.updates
    return [
        sys.executable,
        os.path.join(REPO, "run", "pretrain.py"),
        f"--model_preset={cfg.model_preset}",
        f"--vocab_file={cfg.vocab_file}",
        f"--train_files={cfg.train_files}",
        f"--max_seq_length={cfg.sequence.max_seq_length}",
        f"--max_predictions_per_seq={cfg.sequence.max_predictions_per_seq}",
        f"--micro_batch_size={cfg.micro_batch_size}",
        f"--accumulation_steps={cfg.accumulation_steps}",
        f"--total_steps={total}",
        "--log_interval=1",
        f"--save_interval={total}",
        "--keep_last=1",
        "--learning_rate=1e-4",
        f"--checkpoint_dir={checkpoint_dir}",
        "--network_interface=eth0",
        "--xla" if cfg.xla else "--noxla",
        *comm.as_flags(),
    ]


def job_env():
    """The ranks import the bert_tf beside this script, whatever the installed one is."""
    return {
        **os.environ,
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }


def print_compression_cost(cfg):
    """--compression_cost: what each compressed exchange computes per update of --model_preset,
    here."""
    from bert_tf.model import modeling
    from bert_tf.tools import model_shapes

    shapes = model_shapes.gradient_tensor_shapes(
        modeling.BertConfig.preset(cfg.model_preset, vocab_size=30522)
    )
    for method in cfg.compressed or ["powersgd", "onebit"]:
        seconds = comm_study.compression_seconds(shapes, method)
        print(
            f"{method}: {seconds:.4f} s per update for BERT-{cfg.model_preset} (vocabulary 30,522) "
            "on this machine, in one process",
            flush=True,
        )


def predict_only(cfg, result, sizes):
    """Without an emulated cluster: the planner's predictions from --device_seq_s, if given."""
    if cfg.device_seq_s <= 0:
        print("no --device_seq_s given: no planner predictions either")
        return
    for nodes in cfg.node_counts:
        for rate in cfg.rates:
            for label, comm in cfg.ladder():
                p = comm_study.predict(
                    sizes,
                    nodes,
                    rate,
                    comm,
                    cfg.device_seq_s,
                    cfg.micro_batch_size,
                    cfg.accumulation_steps,
                    cfg.sequence.max_seq_length,
                )
                result["rows"].append(
                    {
                        "nodes": nodes,
                        "rate_gbit": rate,
                        "config": label,
                        "predicted_sequences_per_second": p["sequences_per_second"],
                    }
                )
    print_table(result["rows"])


def main(argv):
    cfg = cli.config_from_flags(StudyConfig)
    if cfg.probe:
        link = comm_study.probe_link()
        from bert_tf.parallel import distributed

        if distributed.rank() == 0:
            print(comm_study.PROBE_PREFIX + json.dumps(link), flush=True)
        return
    from bert_tf.data import tokenization
    from bert_tf.tools import model_shapes
    from bert_tf.model import modeling

    if cfg.compression_cost:
        return print_compression_cost(cfg)
    problem = ec.preflight()
    if problem is None:
        check_data(cfg)
    vocab_size = (
        len(tokenization.load_vocab(cfg.vocab_file)) if os.path.exists(cfg.vocab_file) else 30522
    )
    config = modeling.BertConfig.preset(cfg.model_preset, vocab_size=vocab_size)
    sizes = model_shapes.gradient_tensor_shapes(config)  # shapes: the compressed exchanges' plans
    os.makedirs(cfg.output_dir, exist_ok=True)
    result = {
        "command": " ".join(sys.argv),
        "model_preset": cfg.model_preset,
        "vocab_size": vocab_size,
        "parameters": sum(model_shapes.gradient_tensor_sizes(config)),
        "gradient_tensors": len(sizes),
        "batch_size": cfg.micro_batch_size,
        "accumulation_steps": cfg.accumulation_steps,
        "updates": cfg.updates,
        "rows": [],
        "settings": cfg.settings(),
    }
    if problem is not None:
        print(f"emulated part skipped: {problem}", flush=True)
        result["skipped"] = problem
        predict_only(cfg, result, sizes)
        write(cfg, result)
        return
    try:
        measure(cfg, result)
    except (
        comm_study.ProbeError,
        ec.ClusterError,
    ) as e:  # keep what was measured, say how to go on
        write(cfg, result)
        sys.exit(
            f"error: {e} (measurements so far are in {cfg.output_dir}/study.json; run again to "
            "continue)"
        )
    report(cfg, result, sizes)


def check_data(cfg):
    """The vocabulary and the records exist (checked where the jobs will run)."""
    for name in ("vocab_file", "train_files"):
        if not glob.glob(getattr(cfg, name)):
            raise ConfigError(
                f"--{name}={getattr(cfg, name)} matches nothing (scripts/demo.sh makes the demo "
                "data)"
            )


def report(cfg, result, sizes):
    """The measured rows in ladder order, each with the planner's prediction; the goals; study.json
    and study.png."""
    rows = result["rows"]
    order = {label: i for i, (label, _) in enumerate(cfg.all_rungs())}
    rows.sort(key=lambda r: (r["nodes"], r["rate_gbit"], order.get(r["config"], len(order))))
    speed = comm_study.add_predictions(
        rows,
        result.get("links", []),
        dict(cfg.all_rungs()),
        sizes,
        cfg.micro_batch_size,
        cfg.accumulation_steps,
        cfg.sequence.max_seq_length,
    )
    if speed is not None:
        result["device_seq_s"] = speed
    print_table(rows)
    result["goals"] = comm_study.goals(rows)
    print_goals(result["goals"])
    write(cfg, result)
    plot(cfg, rows, os.path.join(cfg.output_dir, "study.png"))


def measure(cfg, result):
    """Runs the probe and the ladder for every node count and rate, keeping an earlier run's
    rows."""
    rows = result["rows"]
    done_rows, done_links = comm_study.previous_results(
        os.path.join(cfg.output_dir, "study.json"), result["settings"]
    )
    env = job_env()
    for nodes in cfg.node_counts:
        for rate in cfg.rates:
            todo = []
            for label, comm in cfg.ladder():
                key = (nodes, rate, label)
                if key in done_rows:
                    rows.append(done_rows[key])
                    print(
                        f"kept from an earlier run of this study: {nodes} nodes, {rate:g} Gbit/s, "
                        f"{label}"
                    )
                else:
                    todo.append((label, comm))
            if (nodes, rate) in done_links:
                result.setdefault("links", []).append(done_links[(nodes, rate)])
            if not todo:
                continue
            with ec.EmulatedCluster(nodes, rate_gbit=rate) as cluster:
                if (nodes, rate) not in done_links:
                    measure_link(cfg, result, cluster, nodes, rate, env)
                for label, comm in todo:
                    measure_rung(cfg, result, cluster, nodes, rate, label, comm, env)


def measure_link(cfg, result, cluster, nodes, rate, env):
    """The link probe on `nodes` nodes at `rate` Gbit/s, added to result["links"]."""
    link = comm_study.run_probe(
        cluster,
        nodes,
        [sys.executable, os.path.abspath(__file__), "--probe"],
        os.path.join(cfg.output_dir, f"probe_n{nodes}_r{rate:g}.txt"),
        cfg.job_timeout,
        env,
    )
    result.setdefault("links", []).append({"nodes": nodes, "rate_gbit": rate, **link})
    print(f"link probe, {nodes} nodes at {rate:g} Gbit/s: {json.dumps(link)}", flush=True)


def measure_rung(cfg, result, cluster, nodes, rate, label, comm, env):
    """One rung's job; its row goes into result["rows"] and study.json at once (a study cut short
    keeps what it measured)."""
    folder = os.path.join(
        cfg.output_dir, f"n{nodes}_r{rate:g}_{label.replace('/', '_').replace(' ', '_')}"
    )
    row = {
        "nodes": nodes,
        "rate_gbit": rate,
        "config": label,
        "flags": comm.as_flags(),
        **comm_study.run_job(
            cluster,
            nodes,
            job_command(cfg, folder, comm),
            folder,
            cfg.job_timeout,
            cfg.warmup_updates,
            cfg.micro_batch_size * cfg.accumulation_steps,
            env,
        ),
    }
    result["rows"].append(row)
    print(json.dumps(row), flush=True)
    write(cfg, result)


def print_goals(goals):
    for goal in goals:
        ratio = goal["fp16_bytes_ratio"]
        print(
            f"{goal['nodes']} nodes at {goal['rate_gbit']:g} Gbit/s: full set "
            f"({goal['best_config']}) {goal['speedup']:.2f}x the fp32 per-micro-batch baseline "
            "(goal >= 1.8x at 1 Gbit/s); fp16 bytes per update "
            + (f"{ratio:.3f}x fp32 (goal 0.50 +- 0.02)" if ratio is not None else "n/a")
        )


def print_table(rows):
    head = (
        f"{'nodes':>5} {'Gbit/s':>6}  {'config':<18} {'seq/s':>7} {'speedup':>7} {'compute':>8} "
        f"{'wait':>6} {'allreduce':>9} {'MB/update':>9} {'bytes':>6} {'planner':>8} {'error':>6} "
        f"{'own':>6}"
    )
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['nodes']:>5} {r['rate_gbit']:>6g}  {r['config']:<18} failed: {r['error']}")
            continue

        def fmt(key, spec, scale=1.0):
            width = int(spec.lstrip("+").split(".")[0])
            return format(r[key] * scale, spec) if key in r else "-".rjust(width)

        print(
            f"{r['nodes']:>5} {r['rate_gbit']:>6g}  {r['config']:<18} "
            f"{fmt('sequences_per_second', '7.2f')} {fmt('speedup_vs_baseline', '6.2f')}x "
            f"{fmt('compute_seconds', '7.2f')}s {fmt('wait_seconds', '5.2f')}s "
            f"{fmt('allreduce_seconds', '8.2f')}s {fmt('tx_bytes_per_update', '9.1f', 1e-6)} "
            f"{fmt('bytes_vs_fp32_accum', '6.3f')} {fmt('predicted_sequences_per_second', '8.2f')} "
            f"{fmt('prediction_error', '+6.0%')} {fmt('prediction_error_own_compute', '+6.0%')}"
        )


def write(cfg, result):
    with open(os.path.join(cfg.output_dir, "study.json"), "w") as f:
        json.dump(result, f, indent=1)


def plot(cfg, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    node_counts = sorted({r["nodes"] for r in ok})
    fig, axes = plt.subplots(
        1, len(node_counts), figsize=(6.5 * len(node_counts), 4.5), squeeze=False
    )
    for ax, nodes in zip(axes[0], node_counts):
        labels = [
            label
            for label, _ in cfg.ladder()
            if any(r["config"] == label and r["nodes"] == nodes for r in ok)
        ]
        for label in labels:
            pts = sorted(
                (r["rate_gbit"], r["sequences_per_second"])
                for r in ok
                if r["config"] == label and r["nodes"] == nodes
            )
            style = "-o" if "fusion" not in label and "cycle" not in label else ":."
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("link rate per node (Gbit/s)")
        ax.set_ylabel("sequences/s")
        ax.set_title(
            f"{nodes} emulated nodes, BERT-{cfg.model_preset}, "
            f"{cfg.micro_batch_size}x{cfg.accumulation_steps} seq/rank/update"
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    cli.run(main)
