"""What the speed ladder (bert_tf/studies/ladder.py) leaves behind: ladder.json and ladder.png in
the output folder, the fastest bert_tf configuration as run/pretrain.py flags (--write_flagfile),
and its sequences/s as the device's figure for run/plan.py (--device_figures).
"""

from __future__ import annotations

import json
import os


def report(
    s, ladder, peak_samples, peak_loads, device, micro_batches, headroom, profiles, peak_rss_gb
) -> dict:
    """ladder.json's content: `s` the ladder's BenchmarkConfig, `ladder` its Ladder (rows, peaks,
    FLOPs per sequence)."""
    from bert_tf.studies import matmul_peaks

    hw_peak, hw_dtype, hw_way = matmul_peaks.hardware_peak(ladder.peaks)
    best, peer = ladder.fastest(), ladder.fastest(peer=True)
    seq = s.sequence.max_seq_length
    return {
        "model_preset": s.model_preset,
        "seq_length": seq,
        "batch_size": s.micro_batch_size,
        "flops_per_sequence": ladder.flops_per_seq,
        "device": device,
        "matmul_peak_flops": ladder.peaks,
        "matmul_peak_samples": peak_samples,
        "matmul_peak_machine_load": peak_loads,
        "hardware_peak_flops": hw_peak,
        "hardware_peak_from": [hw_dtype, hw_way],
        "rungs": ladder.rows,
        "ratio_to_keras_hub": best["sequences_per_second"] / peer["sequences_per_second"]
        if best and peer
        else None,
        "input_pipeline_sequences_per_second": headroom,
        "peak_host_memory_gb": peak_rss_gb,
        "cpu_count": os.cpu_count(),
        "tune_batch_sizes": micro_batches,
        "profiles": profiles,
        "command": "python run/benchmark.py "
        + " ".join(
            f"--{k}={v if not isinstance(v, list) else ','.join(map(str, v))}"
            for k, v in (
                ("model_preset", s.model_preset),
                ("max_seq_length", seq),
                *(
                    (k, getattr(s, k))
                    for k in ("micro_batch_size", "accumulation_steps", "updates")
                ),
                ("rungs", s.rungs),
                ("tune_micro_batch_sizes", s.tune_micro_batch_sizes),
            )
        ),
    }


def save(report, s, best):
    """ladder.json and ladder.png into s.output_dir; the flagfile and device figures when asked
    for."""
    os.makedirs(s.output_dir, exist_ok=True)
    with open(os.path.join(s.output_dir, "ladder.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot(report, os.path.join(s.output_dir, "ladder.png"))
    print(f"wrote {s.output_dir}/ladder.json and ladder.png")
    if s.write_flagfile:
        write_flagfile(s.write_flagfile, best, report)
        print(
            f"wrote {s.write_flagfile}: --precision={best['precision']} --xla={best['xla']} "
            f"({best['sequences_per_second']:.2f} seq/s)"
        )
    if s.device_figures:
        from bert_tf.tools import device_figures

        seq = s.sequence.max_seq_length
        device_figures.record_device_figures(
            s.device_figures,
            s.model_preset,
            seq,
            best["sequences_per_second"],
            device=report["device"].get("gpus", [report["device"].get("cpu")])[0],
            **{f"rung_{seq}": best["rung"], f"command_{seq}": report["command"]},
        )
        print(
            f"wrote {s.device_figures}: {best['sequences_per_second']:.2f} seq/s at {seq} "
            f"({best['rung']}); python run/plan.py --model_preset={s.model_preset} "
            f"--device_figures={s.device_figures} takes it"
        )


def write_flagfile(path, best, report):
    """The fastest bert_tf rung as pretrain flags; written to a temporary name, then renamed
    (an interrupted run leaves no half-written flagfile)."""
    lines = [
        f"# run/benchmark.py on {report['device'].get('cpu') or report['device'].get('gpus')}, "
        f"{report['model_preset']} seq {report['seq_length']}: fastest bert_tf rung {best['rung']}",
        f"# command: {report['command']}",
        f"# micro-batch measured {best['batch_size']}"
        + (
            " (fastest of --tune_micro_batch_sizes; --fit_micro_batch keeps the recipe's per-rank "
            "batch)"
            if report.get("tune_batch_sizes")
            else ""
        ),
        f"--precision={best['precision']}",
        *([f"--{'' if best['tf32'] else 'no'}tf32"] if report["device"].get("gpus") else []),
        f"--{'' if best['xla'] else 'no'}xla",
        f"--{'' if best['fuse'] else 'no'}fuse",
        f"--ladder_sequences_per_second={best['sequences_per_second']:.3f}",
    ]
    if report.get(
        "tune_batch_sizes"
    ):  # the micro-batch was tuned: keep the recipe's per-rank batch, split it so
        lines.append(f"--fit_micro_batch={best['batch_size']}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rungs"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.1), 4.5))
    bars = ax.bar(
        [r["rung"].replace(" ", "\n") for r in rows],
        [r["sequences_per_second"] for r in rows],
        color=[
            "tab:orange" if r["peer"] else "tab:gray" if r["diagnostic"] else "tab:blue"
            for r in rows
        ],
    )
    for bar, r in zip(bars, rows):
        ax.annotate(
            f"{r['model_tflops']:.2f} TFLOP/s\nMFU {r['mfu']:.0%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_ylabel("sequences / s")
    dev = report["device"]
    where = (
        ", ".join(dev["gpus"])
        if "gpus" in dev
        else f"{dev['cpu_count']} cores {dev['cpu']} [{' '.join(dev['cpu_features'])}]"
    )
    ax.set_title(
        f"BERT-{report['model_preset']} seq {report['seq_length']} micro-batch "
        f"{report['batch_size']}; orange: keras-hub, gray: diagnostic\n{where}; MFU vs hardware "
        f"peak {report['hardware_peak_flops'] / 1e12:.2f} TFLOP/s",
        fontsize=9,
    )
    ax.tick_params(axis="x", labelsize=8)
    ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
