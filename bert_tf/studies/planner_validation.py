"""The planner (bert_tf/tools/planner.py) checked against measurements it was not fitted to
(run/validate_planner.py is its command line, docs/planner_validation.md its results): the
communication study's rows (run/comm_study.py), judged by the prediction fed each job's own
per-rank speed, and NVIDIA's published BERT-large throughput on 1-32 DGX-2H nodes, predicted from
their single-GPU figures and the DGX-2H interconnect.
"""

from __future__ import annotations

import dataclasses

from bert_tf import knob
from bert_tf.tools import planner
from bert_tf.parallel.comm import CommConfig


def study_error(row):
    """The error a study row is judged by: the prediction fed the job's own per-rank speed (it tests
    the communication model; fresh processes compute at different speeds on one machine, which moves
    the median-fed `prediction_error`), or the median-fed one for rows from before it existed."""
    return row.get("prediction_error_own_compute", row.get("prediction_error"))


def study_misses(study, tolerance):
    """Labels of the study rows whose prediction (study_error) misses by more than `tolerance`."""
    return [
        f"emulated {r['nodes']} nodes {r['rate_gbit']:g} Gbit/s {r['config']}"
        for r in study["rows"]
        if study_error(r) is not None and abs(study_error(r)) > tolerance
    ]


# -- the planner against NVIDIA's published figures ---------------------------------------------
# (nodes, seq, precision, batch per GPU, accumulation, published seq/s): NVIDIA
# DeepLearningExamples, TensorFlow2/LanguageModeling/BERT/README.md (21.02 container), "Pre-training
# training performance: Multi-node on NVIDIA DGX-2H V100 (16x V100 32GB)".
DGX2H = [
    (1, 128, "mixed", 60, 64, 3528.51),
    (4, 128, "mixed", 60, 16, 13370.21),
    (16, 128, "mixed", 60, 4, 42697.42),
    (32, 128, "mixed", 60, 2, 84223.16),
    (1, 512, "mixed", 10, 192, 678.35),
    (4, 512, "mixed", 10, 96, 2678.29),
    (16, 512, "mixed", 10, 24, 7834.72),
    (32, 512, "mixed", 10, 6, 18786.93),
    (1, 128, "fp32", 32, 128, 841.72),
    (4, 128, "fp32", 32, 32, 3060.49),
    (16, 128, "fp32", 32, 8, 10383.57),
    (32, 128, "fp32", 32, 4, 20094.14),
    (1, 512, "fp32", 4, 256, 180.0),
    (4, 512, "fp32", 4, 64, 646.76),
    (16, 512, "fp32", 4, 32, 2204.72),
    (32, 512, "fp32", 4, 16, 4196.15),
]
# One V100-32GB on a DGX-2, same README ("Single-node on NVIDIA DGX-2 V100", 1 GPU rows).
SINGLE_GPU = {
    (128, "mixed"): 206.5,
    (128, "fp32"): 49.97,
    (512, "mixed"): 40.95,
    (512, "fp32"): 11.06,
}


def nvidia_rows(tensor_sizes):
    """The planner's BERT-large throughput for each DGX2H row, from SINGLE_GPU and the DGX-2H
    interconnect (NVSwitch 150 GB/s per GPU each way, 8 x 100 Gb/s InfiniBand per node), with
    NVIDIA's batch and accumulation, allreduce after accumulation, fp16 allreduce for mixed
    precision. tensor_sizes: model_shapes.gradient_tensor_sizes of BERT-large (vocab 30522)."""
    rows = []
    for nodes, seq, precision, per_gpu, accumulation, published in DGX2H:
        cluster = planner.Cluster(
            nodes=nodes,
            devices_per_node=16,
            inter_gbps=800,
            inter_latency_us=2,
            intra_gbps=1200,
            intra_latency_us=5,
        )
        global_batch = per_gpu * accumulation * cluster.devices
        phase = planner.Phase(
            f"seq{seq}", seq, global_batch, global_batch, SINGLE_GPU[(seq, precision)]
        )
        comm = CommConfig(exchange="fp16" if precision == "mixed" else "none")
        p = planner.plan_phase(tensor_sizes, phase, cluster, comm, accumulation)
        rows.append(
            {
                "nodes": nodes,
                "seq": seq,
                "precision": precision,
                "accumulation": accumulation,
                "published": published,
                "predicted": p["sequences_per_second"],
                "error": p["sequences_per_second"] / published - 1,
            }
        )
    return rows


def nvidia_misses(rows, tolerance):
    """The rows the goal covers (32 nodes, mixed precision) that miss by more than `tolerance`."""
    return [
        f"DGX-2H 32 nodes seq {r['seq']}"
        for r in rows
        if r["nodes"] == 32 and r["precision"] == "mixed" and abs(r["error"]) > tolerance
    ]


@dataclasses.dataclass(frozen=True)
class PlannerValidation:
    """run/validate_planner.py's flags: the study to check the planner against, and the error
    allowed."""

    study: str = knob("runs/comm_study/study.json", "study.json of run/comm_study.py ('' to skip).")
    tolerance: float = knob(0.25, "Allowed relative error for the rows the goal covers.")
