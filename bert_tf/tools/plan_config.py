"""run/plan.py's settings: `PlanConfig`, one field per flag (bert_tf.cli generates the flags from
it).

Defaults are NVIDIA's LAMB recipe for BERT-large and their single-V100 throughputs (run/plan.py's
docstring); the cluster and phases they describe are bert_tf/tools/planner.py's, the preemption
model bert_tf/tools/spot.py's.
No TensorFlow, no absl.
"""

from __future__ import annotations

import dataclasses

from bert_tf import ConfigError, knob, knobs
from bert_tf.model.config import RECOMPUTE
from bert_tf.parallel.comm import CommConfig
from bert_tf.tools import planner, spot
from bert_tf.train.train_config import PRECISIONS


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """The model, the cluster, the two phases of the recipe, the gradient exchange, preemptible
    capacity and the memory estimate's settings."""

    model_preset: str = knobs.model_preset("large")
    vocab_size: int = knob(30522, "Vocabulary size.")
    # the cluster
    nodes: int = knob(4, "Nodes.")
    devices_per_node: int = knob(4, "GPUs (ranks) per node.")
    inter_gbps: float = knob(10.0, "Node-to-node bandwidth per node, Gbit/s.")
    inter_latency_us: float = knob(50.0, "Node-to-node latency per message hop, microseconds.")
    message_overhead_us: float = knob(
        0.0,
        "Software cost per fused allreduce message, microseconds (run/comm_study.py's link probe "
        "measures it; 136 us on this project's CPU machine).",
    )
    intra_gbps: float = knob(
        800.0, "Device-to-device bandwidth inside a node, Gbit/s (PCIe 3 x16 ~100)."
    )
    price_per_device_hour: float = knob(0.0, "Price of one device-hour (any currency).")
    device_figures: str = knob(
        "",
        "JSON of this device's measured figures (run/benchmark.py --device_figures, "
        "scripts/gpu_check.sh): its phase1/phase2_device_seq_s and intra_gbps replace the "
        "defaults; flags given on the command line still win.",
    )
    # the phases
    phase1_device_seq_s: float = knob(
        206.5, "Phase-1 sequences/s of one device (default: V100, BERT-large, fp16)."
    )
    phase2_device_seq_s: float = knob(
        40.95, "Phase-2 sequences/s of one device (default: V100, BERT-large, fp16)."
    )
    phase1_sequences: float = knob(float(7506 * 61440), "Phase-1 total sequences.")
    phase2_sequences: float = knob(float(1668 * 30720), "Phase-2 total sequences.")
    phase1_global_batch_size: int = knob(
        61440, "Phase-1 sequences per optimizer update, all devices."
    )
    phase2_global_batch_size: int = knob(
        30720, "Phase-2 sequences per optimizer update, all devices."
    )
    phase1_accumulation: int = knob(64, "Phase-1 accumulation steps.")
    phase2_accumulation: int = knob(192, "Phase-2 accumulation steps.")
    # the gradient exchange
    comm: CommConfig = CommConfig(exchange="fp16")
    powersgd_seconds: float = knob(
        0.0,
        "Computation one PowerSGD exchange adds per update on this device, s (run/comm_study.py "
        "--compression_cost measures it); 0: not counted.",
    )
    onebit_seconds: float = knob(
        0.0,
        "Computation one 1-bit exchange adds per update on this device, s (run/comm_study.py "
        "--compression_cost); 0: not counted.",
    )
    # preemptible capacity
    spot_price_per_device_hour: float = knob(
        0.0,
        "Spot (preemptible) price of one device-hour; > 0 adds the on-demand / spot + checkpoint "
        "restart / spot + elastic comparison.",
    )
    mtbp_hours: float = knob(
        24.0,
        "Mean time between preemptions of one node, hours (default: GCP preemptible VMs are always "
        "stopped within 24 h, cloud.google.com/compute/docs/instances/preemptible).",
    )
    # Measured on this project's emulated cluster (3 nodes, tiny model, CPU; docs/results.md,
    # tests/test_elastic.py): a GPU cluster's restart adds XLA compilation and a larger checkpoint
    # to read: give your own figures.
    restart_minutes: float = knob(
        spot.MEASURED_RESTART_MINUTES,
        "Time a kill-and-restart from the last checkpoint loses beyond the updates since it: "
        "start-up, restore, first update (default: measured on the emulated cluster).",
    )
    elastic_minutes: float = knob(
        spot.MEASURED_ELASTIC_MINUTES,
        "Time an elastic event loses: detection + restore + first update at the new size (default: "
        "measured on the emulated cluster).",
    )
    join_minutes: float = knob(
        spot.MEASURED_JOIN_MINUTES,
        "Time the ranks wait when a replacement node joins (default: measured on the emulated "
        "cluster).",
    )
    replacement_minutes: float = knob(
        10.0,
        "Minutes until a preempted node is replaced (an assumption: launch and boot of a spot "
        "instance; measure yours).",
    )
    save_interval: int = knob(200, "Updates between checkpoints (configs/large_phase1.flags).")
    elastic_commit_interval: int = knob(
        10, "Updates between elastic commits (run/pretrain.py's default)."
    )
    host_copy_gbytes_per_s: float = knob(
        10.0,
        "Device-to-host copy bandwidth of a commit, GB/s (PCIe 3.0 x16: 15.75 GB/s theoretical).",
    )
    # the memory estimate
    phase1_micro_batch_size: int = knob(
        64, "Phase-1 sequences per device per micro-batch (memory estimate)."
    )
    phase2_micro_batch_size: int = knob(
        16, "Phase-2 sequences per device per micro-batch (memory estimate)."
    )
    precision: str = knob(
        "mixed_float16", "Activation precision of the memory estimate.", choices=PRECISIONS
    )
    recompute: str = knob(
        "none", "run/pretrain.py --recompute, for the memory estimate.", choices=RECOMPUTE
    )
    device_memory_gb: float = knob(
        0.0,
        "Memory of one device, GiB (an 80 GB A100 has 80 GiB): a warning when the estimate for the "
        "chosen --recompute, the gradient exchange's state in it, exceeds it; 0: unknown, no "
        "check.",
    )
    # rank counts as given, checked by exchange_memory_ranks (the message names the flag and an
    # example)
    exchange_memory: list[str] = knob(
        [],
        "Rank counts, e.g. 16,64: print the gradient exchange's state per rank (steady, at a save, "
        "at a resume; per-rank files against the old gather on rank 0) for every exchange and "
        "--model_preset at each, and nothing else (memory.exchange_state_bytes).",
    )
    output_json: str = knobs.output_json("the plan")

    def __post_init__(self):
        self.exchange_memory_ranks()

    def exchange_memory_ranks(self) -> list[int]:
        try:
            ranks = [int(r) for r in self.exchange_memory]
        except ValueError:
            raise ConfigError(
                f"--exchange_memory={','.join(self.exchange_memory)}: give rank counts, e.g. 16,64"
            ) from None
        if ranks and min(ranks) < 1:
            raise ConfigError(f"--exchange_memory: rank counts must be >= 1, got {min(ranks)}")
        return ranks

    def cluster(self) -> planner.Cluster:
        return planner.Cluster(
            self.nodes,
            self.devices_per_node,
            self.inter_gbps,
            self.inter_latency_us,
            self.intra_gbps,
            price_per_device_hour=self.price_per_device_hour,
            message_overhead_us=self.message_overhead_us,
        )

    def phases(self) -> list[planner.Phase]:
        return [
            planner.Phase(
                "phase1",
                128,
                self.phase1_sequences,
                self.phase1_global_batch_size,
                self.phase1_device_seq_s,
            ),
            planner.Phase(
                "phase2",
                512,
                self.phase2_sequences,
                self.phase2_global_batch_size,
                self.phase2_device_seq_s,
            ),
        ]

    def accumulation(self) -> list[int]:
        return [self.phase1_accumulation, self.phase2_accumulation]

    def micro_batches(self) -> tuple[int, int]:
        return self.phase1_micro_batch_size, self.phase2_micro_batch_size

    def preemption(self) -> spot.Preemption:
        return spot.Preemption(
            self.price_per_device_hour,
            self.spot_price_per_device_hour,
            self.mtbp_hours,
            self.restart_minutes,
            self.elastic_minutes,
            self.join_minutes,
            self.replacement_minutes,
            self.save_interval,
            self.elastic_commit_interval,
            self.host_copy_gbytes_per_s,
        )
