"""Cost-to-train planner: time and price of a two-phase BERT pre-training on a given cluster.

Model (per optimizer update, per phase):

    N = nodes x devices_per_node ranks, global batch B = micro_batch x accumulation x N
    compute   T_c = B / (N x r)              r: sequences/s of one device running whole updates
                                             (forward, backward, optimizer) at this sequence length
    gradient  G = sum of the gradient tensors' bytes (2 per value with fp16 compression, else 4)
    allreduces per update  a = 1 when gradients are allreduced after accumulation, else accumulation
              (comm.CommConfig.allreduce_every_micro_batch)
    messages  m = Horovod tensor fusion: the tensors packed in order into buffers of at most the
              fusion threshold (a larger tensor goes alone; threshold 0 = one message per tensor)
    The communication settings are a comm.CommConfig; unset fusion threshold and cycle time are
    Horovod's defaults (128 MB, 1 ms), as in a run that does not set them.
    waiting   W = cycle_time / 2 (tensors wait half a Horovod cycle on average before they are sent)
              + m x o            o: software cost per message (negotiation, copies, MPI call)

    flat ring (devices_per_node = 1):
        T_ar = 2 (N-1)/N x G / bw_inter + 2 (N-1) x lat_inter x m + W
    hierarchical (devices_per_node = d > 1, n nodes): reduce-scatter inside the node, allreduce
    of each device's G/d shard across nodes (the node's d shards share its NIC), all-gather inside:
        T_ar = 2 (d-1)/d x G / bw_intra + 2 (n-1)/n x G / bw_inter
               + (2 (d-1) x lat_intra + 2 (n-1) x lat_inter) x m + W

    update time  T = T_c + a x T_ar           (no overlap of communication with computation:
                                               with allreduce after accumulation the gradients
                                               are complete only at the end of the last backward)
    throughput   B / T sequences/s;  scaling efficiency = T_c / T (1 = no communication cost)
    phase time   total sequences / throughput;  cost = time x N x price per device-hour

Preemptible (spot) capacity on top of these phases: bert_tf/tools/spot.py.

Bandwidths are in Gbit/s on input and converted to bytes/s; latencies and o in microseconds.
Not modelled: stragglers, input stalls, and fixed per-update costs beyond those inside r
(they matter when an update has few micro-batches; docs/planner_validation.md measures the miss).
"""

from __future__ import annotations

import dataclasses
import math

from bert_tf import ConfigError
from bert_tf.parallel.exchange_ranking import exchange_choices, rank_exchanges, update_factor
from bert_tf.parallel import local_plan
from bert_tf.parallel.comm import CommConfig, float32_updates, live_indices, payload_bytes


def fusion_messages(tensor_bytes, fusion_threshold_mb) -> int:
    """Messages Horovod sends for one allreduce of all gradients: tensors packed in order into
    buffers of at most the fusion threshold; a tensor larger than it goes alone; 0 = no fusion."""
    if fusion_threshold_mb <= 0:
        return len(tensor_bytes)
    limit, messages, filled = fusion_threshold_mb * 2**20, 0, None
    for b in tensor_bytes:
        if filled is None or filled + b > limit:
            messages, filled = messages + 1, b
        else:
            filled += b
    return messages


@dataclasses.dataclass
class Cluster:
    nodes: int
    devices_per_node: int
    inter_gbps: float  # per node NIC bandwidth
    inter_latency_us: float = 50.0
    intra_gbps: float = 800.0  # device-to-device inside a node (NVLink ~ 800+, PCIe 3 x16 ~ 100)
    intra_latency_us: float = 5.0
    price_per_device_hour: float = 0.0
    message_overhead_us: float = (
        0.0  # software cost per fused message (negotiation, copies, MPI call)
    )

    def __post_init__(self):
        for name in ("nodes", "devices_per_node"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name in ("inter_gbps", "intra_gbps"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"--{name} must be > 0 (a link with no bandwidth), got {getattr(self, name)}"
                )
        for name in (
            "inter_latency_us",
            "intra_latency_us",
            "price_per_device_hour",
            "message_overhead_us",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")

    @property
    def devices(self):
        return self.nodes * self.devices_per_node


@dataclasses.dataclass
class Phase:
    name: str  # also the prefix of its flags in run/plan.py (phase1, phase2)
    seq_length: int
    total_sequences: float
    global_batch: int
    device_sequences_per_second: float

    def __post_init__(self):
        if self.device_sequences_per_second <= 0:
            raise ConfigError(
                f"{self.name}: per-device throughput must be > 0, got "
                f"{self.device_sequences_per_second}"
            )
        if self.global_batch < 1 or self.total_sequences <= 0:
            raise ConfigError(f"{self.name}: global batch and total sequences must be positive")


def probed_cluster(nodes, link, rate_gbit=None) -> Cluster:
    """`nodes` one-rank nodes on a flat ring at a link as measured (comm_study.probe_link,
    auto_exchange.measure_link): its bandwidth (at most `rate_gbit`, the shaped rate) and
    per-message cost, no further latency."""
    gbit = link["effective_gbit"] if rate_gbit is None else min(rate_gbit, link["effective_gbit"])
    return Cluster(
        nodes, 1, gbit, inter_latency_us=0, message_overhead_us=link["message_seconds"] * 1e6
    )


def allreduce_seconds(gradient_bytes, cluster: Cluster, messages=1, cycle_time_ms=0.0):
    """One allreduce of `gradient_bytes` sent as `messages` fused messages (equations above)."""
    n, d = cluster.nodes, cluster.devices_per_node
    wait = cycle_time_ms * 1e-3 / 2 + messages * cluster.message_overhead_us * 1e-6
    inter_bw = cluster.inter_gbps * 1e9 / 8
    intra_bw = cluster.intra_gbps * 1e9 / 8
    lat_inter, lat_intra = cluster.inter_latency_us * 1e-6, cluster.intra_latency_us * 1e-6
    if cluster.devices == 1:
        return 0.0
    if d == 1:
        N = n
        return (
            2 * (N - 1) / N * gradient_bytes / inter_bw + 2 * (N - 1) * lat_inter * messages + wait
        )
    intra = 2 * (d - 1) / d * gradient_bytes / intra_bw
    inter = 2 * (n - 1) / n * gradient_bytes / inter_bw if n > 1 else 0.0
    return intra + inter + (2 * (d - 1) * lat_intra + 2 * (n - 1) * lat_inter) * messages + wait


def plan_phase(
    tensor_sizes,
    phase: Phase,
    cluster: Cluster,
    comm: CommConfig,
    accumulation: int,
    overhead_seconds=0.0,
    update_factor=1.0,
):
    """tensor_sizes: gradient_tensor_sizes(config), or one number (all parameters in one tensor), or
    gradient_tensor_shapes(config) (which --exchange=powersgd|onebit need). powersgd and onebit:
    seconds and bytes per update averaged over the phase, the float32 warmup included
    (_with_float32_warmup); --local_updates: averaged over the phase too (local_updates_seconds).
    overhead_seconds: a compressed exchange's own computation per update; update_factor: the updates
    it needs for the quality the uncompressed run reaches in 1 (both measured: docs/results.md)."""
    tensor_sizes = [tensor_sizes] if isinstance(tensor_sizes, (int, float)) else tensor_sizes
    shapes = [s for s in tensor_sizes if isinstance(s, tuple)]
    tensor_sizes = [math.prod(s) if isinstance(s, tuple) else s for s in tensor_sizes]
    N = cluster.devices
    _check_batches(phase, N, accumulation)
    if comm.exchange == "auto":
        raise ConfigError("--exchange=auto: resolve it first (planner.exchange_ranking)")
    comm = comm.resolved()
    compute = phase.global_batch / (N * phase.device_sequences_per_second)
    updates = phase.total_sequences / phase.global_batch
    if comm.compressed:
        if len(shapes) != len(tensor_sizes):
            raise ConfigError(
                f"--exchange={comm.exchange}: the plan needs the gradient tensors' shapes "
                "(model_shapes.gradient_tensor_shapes)"
            )
        comm_time, gradient_bytes, messages = compressed_exchange_seconds(shapes, cluster, comm)
        comm_time += overhead_seconds
        if float32_updates(comm, round(updates)):
            comm_time, gradient_bytes = _with_float32_warmup(
                (comm_time, gradient_bytes), tensor_sizes, phase, cluster, comm, accumulation
            )
    elif comm.local_updates:
        local = local_updates_seconds(tensor_sizes, cluster, comm, updates, compute)
        comm_time, gradient_bytes, messages = local
    else:
        comm_time, gradient_bytes, messages = allreduce_exchange_seconds(
            tensor_sizes, cluster, comm, accumulation
        )
    step = compute + comm_time
    throughput = phase.global_batch / step
    seconds = phase.total_sequences * update_factor / throughput
    return {
        "phase": phase.name,
        "compute_seconds": compute,
        "allreduce_seconds": comm_time,
        "update_seconds": step,
        "gradient_bytes": gradient_bytes,
        "messages": messages,
        "sequences_per_second": throughput,
        "scaling_efficiency": compute / step,
        "updates": updates * update_factor,
        "days": seconds / 86400,
        "cost": seconds / 3600 * N * cluster.price_per_device_hour,
    }


def _with_float32_warmup(compressed, tensor_sizes, phase, cluster, comm, accumulation):
    """(seconds, bytes) per update of a compressed exchange averaged over the phase's updates: its
    comm.float32_updates go as a float32 allreduce (computation aside), the rest compressed."""
    updates = phase.total_sequences / phase.global_batch
    share = min(float32_updates(comm, round(updates)) / updates, 1.0)
    # the compression's own settings go with it (a float32 allreduce refuses them)
    plain = dataclasses.replace(comm, exchange="none", onebit_live="", onebit_variance_kappa=0)
    seconds, size, _ = allreduce_exchange_seconds(tensor_sizes, cluster, plain, accumulation)
    return tuple(share * f + (1 - share) * c for f, c in zip((seconds, size), compressed))


def _check_batches(phase: Phase, devices: int, accumulation: int) -> None:
    """The global batch splits evenly over the devices, and each device's over the micro-batches."""
    if phase.global_batch % devices:
        raise ConfigError(
            f"{phase.name}: global batch {phase.global_batch} is not divisible by {devices} "
            f"devices (--{phase.name}_global_batch_size; --nodes x --devices_per_node)"
        )
    if (phase.global_batch // devices) % accumulation:
        raise ConfigError(
            f"{phase.name}: per-device batch {phase.global_batch // devices} is not divisible by "
            f"--{phase.name}_accumulation={accumulation}"
        )


def allreduce_exchange_seconds(tensor_sizes, cluster: Cluster, comm: CommConfig, accumulation: int):
    """(seconds, gradient bytes, messages) per update of an allreduce exchange (none, fp16) of
    tensors of `tensor_sizes` elements; comm resolved."""
    width = 2 if comm.method == "fp16" else 4
    tensor_bytes = [size * width for size in tensor_sizes]
    gradient_bytes = sum(tensor_bytes)
    messages = fusion_messages(tensor_bytes, comm.fusion_threshold_mb)
    allreduces = accumulation if comm.allreduce_every_micro_batch else 1
    seconds = allreduces * allreduce_seconds(gradient_bytes, cluster, messages, comm.cycle_time_ms)
    return seconds, gradient_bytes, messages


def local_updates_seconds(tensor_sizes, cluster: Cluster, comm: CommConfig, updates, compute):
    """(seconds, gradient bytes, messages) per update of --local_updates=H (DiLoCo), averaged over
    the phase's `updates`; comm resolved. The first --local_updates_after updates allreduce their
    float32 gradients; then every H/F updates one of F fragments (--local_fragments) sends its
    share of the weights' change: 16 or 32 bits an allreduce, 8 or 4 bits codes in two phases that
    move what an allreduce of them would (bert_tf/parallel/local_plan.py), of which
    --fragment_delay updates' `compute` hide the time. --local_group=node adds each node's float32
    allreduce every update.
    gradient bytes: what an allreduce of the same wire bytes would carry."""
    N, d = cluster.devices, cluster.devices_per_node
    elements, cycle = sum(tensor_sizes), comm.cycle_time_ms or 0.0  # resolved: never None
    float32 = [4 * size for size in tensor_sizes]
    messages = fusion_messages(float32, comm.fusion_threshold_mb)
    synchronous = allreduce_seconds(sum(float32), cluster, messages, cycle)
    fragment, bits = -(-elements // comm.local_fragments), comm.outer_delta_bits
    if bits in (16, 32):
        exchange = allreduce_seconds(local_plan.payload_bytes(fragment, bits), cluster, 1, cycle)
    else:  # an alltoall of the chunks' codes and an allgather of the means': a ring allreduce's
        chunk = local_plan.payload_bytes(local_plan.chunk_elements(fragment, N), bits)
        exchange = allreduce_seconds(N * chunk, cluster, 2, cycle)
    visible = max(0.0, exchange - comm.fragment_delay * compute)
    after = min(comm.local_updates_after, updates)
    exchanges = (updates - after) / comm.local_updates * comm.local_fragments
    seconds = (after * synchronous + exchanges * visible) / max(updates, 1)
    shapes = [(size,) for size in tensor_sizes]
    wire = local_plan.wire_bytes_per_update(shapes, comm, N, max(round(updates), 1))
    gradient_bytes = wire / (2 * (N - 1) / N) if N > 1 else 0.0
    if comm.local_group == "node" and d > 1:
        # each node one worker: its float32 gradients averaged inside the node every update
        inside = dataclasses.replace(cluster, nodes=1)
        seconds += allreduce_seconds(sum(float32), inside, messages, cycle)
    return seconds, gradient_bytes, messages


def compressed_exchange_seconds(shapes, cluster: Cluster, comm: CommConfig):
    """(seconds, payload bytes, messages) of one powersgd or onebit exchange, computation aside.
    powersgd: two grouped allreduces (the P factors; the Q factors with the uncompressed tensors) of
    its payload, as allreduce_seconds models any allreduce. onebit: an alltoall and an allgather of
    the signs (and of one scale per rank) over all N ranks, no hierarchy: each node's link carries
    its d ranks' (N - d)/N of both, and every rank exchanges with N - 1 others twice for each of the
    two tensors."""
    comm = comm.resolved()
    cycle_ms = comm.cycle_time_ms or 0.0  # resolved: never None
    N, n, d = cluster.devices, cluster.nodes, cluster.devices_per_node
    payload = payload_bytes(
        comm.exchange,
        shapes,
        N,
        comm.powersgd_rank,
        comm.powersgd_min_compression_rate,
        onebit_live(shapes, comm),
    )
    if comm.exchange == "powersgd":
        return allreduce_seconds(payload, cluster, 2, cycle_ms), payload, 2
    if N == 1:
        return 0.0, payload, 4
    inter_bw, intra_bw = cluster.inter_gbps * 1e9 / 8, cluster.intra_gbps * 1e9 / 8
    inter = d * 2 * (N - d) / N * payload / inter_bw if n > 1 else 0.0
    intra = 2 * (d - 1) / N * payload / intra_bw
    lat = cluster.inter_latency_us * 1e-6 if n > 1 else cluster.intra_latency_us * 1e-6
    wait = cycle_ms * 1e-3 / 2 + 4 * cluster.message_overhead_us * 1e-6
    return inter + intra + 4 * (N - 1) * lat + wait, payload, 4


def onebit_live(shapes, comm: CommConfig) -> list:
    """The indices of --onebit_live's tensors among `shapes` (gradient_tensor_shapes' Shapes carry
    the names it matches); [] without it."""
    if comm.exchange != "onebit" or not comm.onebit_live:
        return []
    names = [getattr(s, "name", "") for s in shapes]
    if not any(names):
        raise ConfigError(
            f"--onebit_live={comm.onebit_live}: the plan needs the tensors' names "
            "(model_shapes.gradient_tensor_shapes)"
        )
    return live_indices(names, comm.onebit_live)


def plan(
    tensor_sizes, phases, cluster, comm, accumulation, overhead_seconds=0.0, update_factor=1.0
):
    rows = [
        plan_phase(tensor_sizes, p, cluster, comm, acc, overhead_seconds, update_factor)
        for p, acc in zip(phases, accumulation)
    ]
    return {
        "phases": rows,
        "days": sum(r["days"] for r in rows),
        "cost": sum(r["cost"] for r in rows),
    }


def exchange_ranking(
    shapes, phases, cluster, comm, accumulation, overheads=None, factors=None
) -> list:
    """rank_exchanges over the plan's days for each candidate exchange (exchange_choices);
    overheads: method (any rank) -> seconds of computation a compressed exchange adds per update
    (run/comm_study.py --compression_cost)."""
    comms, overheads = exchange_choices(comm), overheads or {}
    days = {
        label: plan(shapes, phases, cluster, c, accumulation, overheads.get(c.method, 0.0))["days"]
        for label, c in comms.items()
    }
    return rank_exchanges(days, comms, factors)


def best_knob(tensor_sizes, phases, cluster, comm, accumulation):
    """Total days under each single change, best first: which knob helps most. Each exchange counts
    the updates it needs for float16's held-out accuracy (auto_exchange.update_factor; equal updates
    where none was measured)."""

    def days(c, on=cluster):
        return plan(
            tensor_sizes, phases, on, c, accumulation, update_factor=update_factor(c)[0] or 1.0
        )["days"]

    options = {
        "fp16 gradient compression": dataclasses.replace(
            comm, fp16_allreduce=False, exchange="fp16"
        ),
        "allreduce after accumulation": dataclasses.replace(
            comm, allreduce_every_micro_batch=False
        ),
        "fusion buffer 512 MB": dataclasses.replace(comm, fusion_threshold_mb=512),
    }
    # shapes: the compressed exchanges too; they need one exchange per update, so with
    # --allreduce_every_micro_batch they would be two changes, not one
    if all(isinstance(t, tuple) for t in tensor_sizes) and not comm.allreduce_every_micro_batch:
        for method in ("powersgd", "onebit"):
            c = dataclasses.replace(comm, fp16_allreduce=False, exchange=method)
            factor, note = update_factor(c)
            label = f"PowerSGD rank {comm.powersgd_rank}" if method == "powersgd" else "1-bit"
            if factor is not None:  # exchange_ranking lists the others
                options[f"{label} (x{factor:.2f} updates{note}; its computation not counted)"] = c
    results = {name: days(c) for name, c in options.items()}
    faster = dataclasses.replace(cluster, inter_gbps=cluster.inter_gbps * 2.5)
    results[f"network {cluster.inter_gbps:g} -> {cluster.inter_gbps * 2.5:g} Gbit/s"] = days(
        comm, faster
    )
    return days(comm), sorted(((d, name) for name, d in results.items()), key=lambda x: x[0])
