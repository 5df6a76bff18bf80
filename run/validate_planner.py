"""Checks the planner (bert_tf/planner.py) against measurements it was not fitted to.

    python run/validate_planner.py --study=runs/comm_study/study.json

1. NVIDIA's published BERT-large pre-training throughput on 1-32 DGX-2H nodes (TensorFlow2
   BERT README, 21.02 container), predicted from their single-V100 figures and the DGX-2H
   interconnect: 16 V100 per node on NVSwitch (150 GB/s per GPU each way), 8 x 100 Gb/s
   InfiniBand per node; their recipe's batch per GPU and accumulation; fp16 allreduce after
   accumulation with mixed precision, fp32 allreduce with FP32.
2. The emulated-cluster study (run/comm_study.py): its planner predictions use the study's
   measured per-rank speed and the link probe, never the BERT jobs' communication times.
Prints both tables (markdown) with the relative error; exits 1 when a row misses --tolerance.
"""
import json
import os

from absl import app, flags

flags.DEFINE_string("study", "runs/comm_study/study.json", "study.json of run/comm_study.py ('' to skip).")
flags.DEFINE_float("tolerance", 0.25, "Allowed relative error for the rows the goal covers.")
FLAGS = flags.FLAGS

# (nodes, seq, precision, batch per GPU, accumulation, published seq/s) - NVIDIA DeepLearningExamples,
# TensorFlow2/LanguageModeling/BERT/README.md, "Pre-training training performance: Multi-node on
# NVIDIA DGX-2H V100 (16x V100 32GB)".
DGX2H = [
    (1, 128, "mixed", 60, 64, 3528.51), (4, 128, "mixed", 60, 16, 13370.21),
    (16, 128, "mixed", 60, 4, 42697.42), (32, 128, "mixed", 60, 2, 84223.16),
    (1, 512, "mixed", 10, 192, 678.35), (4, 512, "mixed", 10, 96, 2678.29),
    (16, 512, "mixed", 10, 24, 7834.72), (32, 512, "mixed", 10, 6, 18786.93),
    (1, 128, "fp32", 32, 128, 841.72), (4, 128, "fp32", 32, 32, 3060.49),
    (16, 128, "fp32", 32, 8, 10383.57), (32, 128, "fp32", 32, 4, 20094.14),
    (1, 512, "fp32", 4, 256, 180.0), (4, 512, "fp32", 4, 64, 646.76),
    (16, 512, "fp32", 4, 32, 2204.72), (32, 512, "fp32", 4, 16, 4196.15),
]
# One V100-32GB on a DGX-2, same README ("Single-node on NVIDIA DGX-2 V100", 1 GPU rows).
SINGLE_GPU = {(128, "mixed"): 206.5, (128, "fp32"): 49.97, (512, "mixed"): 40.95, (512, "fp32"): 11.06}


def nvidia_rows():
    from bert_tf import modeling, planner
    sizes = planner.gradient_tensor_sizes(modeling.BertConfig.preset("large", vocab_size=30522))
    rows = []
    for nodes, seq, precision, per_gpu, accumulation, published in DGX2H:
        cluster = planner.Cluster(nodes=nodes, devices_per_node=16, inter_gbps=800, inter_latency_us=2,
                                  intra_gbps=1200, intra_latency_us=5)
        global_batch = per_gpu * accumulation * cluster.devices
        phase = planner.Phase(f"seq{seq}", seq, global_batch, global_batch, SINGLE_GPU[(seq, precision)])
        comm = planner.Comm(fp16_compression=precision == "mixed", allreduce_after_accumulation=True,
                            fusion_buffer_mb=128, cycle_time_ms=1.0)
        p = planner.plan_phase(sizes, phase, cluster, comm, accumulation)
        rows.append({"nodes": nodes, "seq": seq, "precision": precision, "accumulation": accumulation,
                     "published": published, "predicted": p["sequences_per_second"],
                     "error": p["sequences_per_second"] / published - 1})
    return rows


def main(_):
    misses = []
    print("| DGX-2H nodes | seq | precision | accumulation | published seq/s | planner seq/s | error |")
    print("|---|---|---|---|---|---|---|")
    for r in nvidia_rows():
        print(f"| {r['nodes']} | {r['seq']} | {r['precision']} | {r['accumulation']} | {r['published']:,.0f} | "
              f"{r['predicted']:,.0f} | {r['error']:+.1%} |")
        if r["nodes"] == 32 and r["precision"] == "mixed" and abs(r["error"]) > FLAGS.tolerance:
            misses.append(f"DGX-2H 32 nodes seq {r['seq']}")
    if FLAGS.study:
        if not os.path.exists(FLAGS.study):
            raise SystemExit(f"error: --study={FLAGS.study} not found (run run/comm_study.py first)")
        with open(FLAGS.study) as f:
            study = json.load(f)
        print(f"\nEmulated cluster, BERT-{study['model_preset']} ({study['parameters'] / 1e6:.1f}M parameters), "
              f"per-rank speed without communication {study.get('device_seq_s', float('nan')):.2f} seq/s")
        print("| nodes | Gbit/s | config | measured seq/s | planner seq/s | error |")
        print("|---|---|---|---|---|---|")
        for r in study["rows"]:
            if "prediction_error" not in r:
                continue
            print(f"| {r['nodes']} | {r['rate_gbit']:g} | {r['config']} | {r['sequences_per_second']:.2f} | "
                  f"{r['predicted_sequences_per_second']:.2f} | {r['prediction_error']:+.1%} |")
            if abs(r["prediction_error"]) > FLAGS.tolerance:
                misses.append(f"emulated {r['nodes']} nodes {r['rate_gbit']:g} Gbit/s {r['config']}")
    if misses:
        raise SystemExit(f"outside {FLAGS.tolerance:.0%}: " + "; ".join(misses))


if __name__ == "__main__":
    app.run(main)
