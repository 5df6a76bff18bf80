"""The cost-to-train planner: arithmetic on hand-computed cases, bad input, the model's tensors,
and NVIDIA's published multi-node throughput reproduced from their single-GPU figures."""
import dataclasses
import math
import re
import shlex
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.model import modeling
from bert_tf.tools import device_figures, memory, planner, spot
from bert_tf.tools import model_shapes
from bert_tf.studies import planner_validation
from bert_tf.parallel.comm import CommConfig
from conftest import REPO, mpi_env


def test_gradient_tensors_match_the_model():
    for preset in ("tiny", "base", "modern-tiny", "modern-mini"):
        config = modeling.BertConfig.preset(preset, vocab_size=1000 if "tiny" in preset else 30522)
        model = modeling.BertPretrainer(config)
        sizes = [int(v.shape.num_elements()) for v in model.trainable_variables]
        assert sorted(model_shapes.gradient_tensor_sizes(config)) == sorted(sizes)
        assert sorted(model_shapes.gradient_tensor_shapes(config)) == sorted(tuple(v.shape) for v in model.trainable_variables)
        named = sorted((s.name, tuple(s)) for s in model_shapes.gradient_tensor_shapes(config))   # --onebit_live's names
        assert named == sorted((v.name.split(":")[0], tuple(v.shape)) for v in model.trainable_variables)
        assert model_shapes.parameter_count(config) == sum(sizes)
        # the transformer layers alone (the race's size-matched arms): the encoder's layers' variables
        in_layers = [v for layer in model.encoder.layers for v in layer.trainable_variables]
        assert in_layers and model_shapes.encoder_parameter_count(config) == sum(
            int(v.shape.num_elements()) for v in in_layers)


def test_diloco_sends_the_float16_weights_change_once_every_h_updates():
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("mini", vocab_size=30522))
    phase = planner.Phase("p", 128, 512 * 1600, 512, 100.0)                # 1,600 updates: 200 rounds of 8
    cluster = planner.Cluster(4, 1, 1.0, inter_latency_us=0)
    fp16 = planner.plan_phase(shapes, phase, cluster, CommConfig(exchange="fp16", cycle_time_ms=0), 1)
    diloco = planner.plan_phase(shapes, phase, cluster, CommConfig(local_updates=8, cycle_time_ms=0), 1)
    assert diloco["allreduce_seconds"] == pytest.approx(fp16["allreduce_seconds"] / 8)
    assert diloco["gradient_bytes"] == pytest.approx(fp16["gradient_bytes"] / 8)
    assert diloco["compute_seconds"] == fp16["compute_seconds"]
    # --local_group=node on 2 nodes x 2 devices: the node's float32 gradients averaged inside it every update, on top
    two = planner.Cluster(2, 2, 1.0, inter_latency_us=0, intra_gbps=100.0, intra_latency_us=0)
    by_rank = planner.plan_phase(shapes, phase, two, CommConfig(local_updates=8, cycle_time_ms=0), 1)
    by_node = planner.plan_phase(shapes, phase, two, CommConfig(local_updates=8, local_group="node", cycle_time_ms=0), 1)
    float32 = 4 * sum(model_shapes.gradient_tensor_sizes(modeling.BertConfig.preset("mini", vocab_size=30522)))
    inside = 2 * (2 - 1) / 2 * float32 / (100e9 / 8)
    assert by_node["allreduce_seconds"] == pytest.approx(by_rank["allreduce_seconds"] + inside, rel=1e-9)
    with pytest.raises(ConfigError, match="--local_group=node: valid are rank and node, and node is for --local_updates"):
        CommConfig(local_group="node")


def test_local_updates_plan_counts_the_synchronous_start_the_bits_and_the_overlap():
    """--local_updates_after=K: K float32 allreduces first; 4 bits: the codes in two phases; F fragments
    with --fragment_delay=τ: each exchange 1/F of the change, τ updates of compute hiding it."""
    sizes = model_shapes.gradient_tensor_sizes(modeling.BertConfig.preset("mini", vocab_size=30522))
    elements, N = sum(sizes), 4
    phase = planner.Phase("p", 128, 64 * 400, 64, 8.0)                    # 400 updates, 2 s of compute each
    cluster = planner.Cluster(N, 1, 0.1, inter_latency_us=0)
    row = lambda **kw: planner.plan_phase(sizes, phase, cluster, CommConfig(cycle_time_ms=0, fusion_threshold_mb=0, **kw), 1)
    bandwidth = 0.1e9 / 8
    float32 = planner.allreduce_seconds(4 * elements, cluster, len(sizes))
    plain = row(local_updates=20)
    fp16_exchange = planner.allreduce_seconds(2 * elements, cluster, 1)
    assert plain["allreduce_seconds"] == pytest.approx(fp16_exchange / 20)
    started = row(local_updates=20, local_updates_after=40)
    assert started["allreduce_seconds"] == pytest.approx((40 * float32 + 18 * fp16_exchange) / 400)
    chunk = lambda n: -(-(-(-n // N)) // 256) * (128 + 4)               # a rank's chunk of n values, coded
    four = row(local_updates=20, outer_delta_bits=4)
    assert four["allreduce_seconds"] == pytest.approx(2 * (N - 1) * chunk(elements) / bandwidth / 20)
    streamed = row(local_updates=20, local_fragments=4, fragment_delay=1, outer_delta_bits=4)
    quarter = 2 * (N - 1) * chunk(-(-elements // 4)) / bandwidth
    assert streamed["allreduce_seconds"] == pytest.approx(4 * max(0.0, quarter - 2.0) / 20)
    assert streamed["allreduce_seconds"] < four["allreduce_seconds"] / 2   # 2 s of compute hide most of each quarter


def test_the_exchange_fastest_to_the_same_accuracy_depends_on_the_link():
    """Each exchange's time x the updates it needs for float16's held-out accuracy (measured in the race): on a slow
    link PowerSGD, on a fast one float16; 1-bit, which never reached it, listed last and never chosen."""
    from bert_tf.parallel import auto_exchange
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("base", vocab_size=30522))
    phases = [planner.Phase("p", 128, 4096 * 1000, 4096, 1400.0)]
    comm = CommConfig(exchange="auto", cycle_time_ms=0)
    factor = auto_exchange.update_factor(CommConfig(exchange="powersgd"))[0]
    assert factor > 1
    for gbit, best in ((1.0, "powersgd rank "), (100.0, "fp16")):
        rows = planner.exchange_ranking(shapes, phases, planner.Cluster(4, 4, gbit), comm, [4])
        assert rows[0]["method"].startswith(best) and rows[-1]["method"] == "onebit", rows
        assert rows[-1]["to_quality"] is None
        by = {r["method"]: r for r in rows}
        assert by["powersgd rank 4"]["to_quality"] == pytest.approx(by["powersgd rank 4"]["seconds"] * factor)
        assert by["fp16"]["to_quality"] == by["fp16"]["seconds"] < by["none"]["seconds"]
    # every measured PowerSGD rank is a candidate, and the user's own rank too
    assert {"powersgd rank 4", "powersgd rank 8", "powersgd rank 16"} <= set(
        auto_exchange.exchange_choices(dataclasses.replace(comm, powersgd_rank=16)))
    # its own computation counts: enough of it and float16 wins on the slow link too
    slow = planner.exchange_ranking(shapes, phases, planner.Cluster(4, 4, 1.0), comm, [4], {"powersgd": 60.0})
    assert slow[0]["method"] == "fp16"
    # a rank not measured takes the nearest measured one's factor, and says so
    assert auto_exchange.update_factor(CommConfig(exchange="powersgd", powersgd_rank=32)) == \
        (auto_exchange.MEASURED_UPDATE_FACTORS["powersgd"][8], " (rank 8's)")
    with pytest.raises(ConfigError, match="resolve it first"):
        planner.plan(shapes, phases, planner.Cluster(4, 4, 1.0), comm, [4])
    # in a job: the same ranking over seconds per sequence, at the link it measured
    link = {"effective_gbit": 0.05, "message_seconds": 1e-3}
    mini = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("mini", vocab_size=30522))
    cost = {"powersgd rank 4": 0.01, "powersgd rank 8": 0.02}
    chosen, rows = auto_exchange.choose(comm, mini, 4, link, cost, 50.0, 16, 1, 128)
    assert chosen.exchange == "powersgd" and rows[0]["method"] == f"powersgd rank {chosen.powersgd_rank}"
    assert chosen.cycle_time_ms == 0
    fast = dict(link, effective_gbit=100.0)
    assert auto_exchange.choose(comm, mini, 4, fast, cost, 50.0, 16, 1, 128)[0].method == "fp16"


def test_compressed_exchanges_by_hand():
    """The plan of --exchange=powersgd|onebit: the bytes comm.wire_bytes counts, sent at the link's
    rate; 1-bit's alltoall puts every rank of a node on its link, PowerSGD's allreduces do not."""
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("base", vocab_size=30522))
    elements = sum(model_shapes.gradient_tensor_sizes(modeling.BertConfig.preset("base", vocab_size=30522)))
    phase = planner.Phase("p", 128, 1e6, 4096, 1000.0)
    flat = planner.Cluster(4, 1, 10.0, inter_latency_us=0)
    # per compressed update (onebit's float32 warmup, averaged in by default: tests/test_onebit_adam.py)
    comms = {m: CommConfig(exchange=m, cycle_time_ms=0, compression_warmup_steps=0)
             for m in ("fp16", "powersgd", "onebit")}
    rows = {m: planner.plan_phase(shapes, phase, flat, c, 1) for m, c in comms.items()}
    bw = 10e9 / 8
    assert rows["fp16"]["allreduce_seconds"] == pytest.approx(1.5 * 2 * elements / bw, rel=1e-3)
    from bert_tf.parallel import comm as comm_module
    for m in ("powersgd", "onebit"):       # a flat ring: what each rank sends, at the link's rate
        assert rows[m]["allreduce_seconds"] == pytest.approx(comm_module.wire_bytes(m, shapes, 4) / bw, rel=1e-3)
        assert rows["fp16"]["allreduce_seconds"] / rows[m]["allreduce_seconds"] > 8
    # 4 nodes of 4 devices: fp16 goes hierarchically (each node's link carries one shard's worth), 1-bit not
    nodes = planner.Cluster(4, 4, 10.0, inter_latency_us=0, intra_gbps=1e6)
    fp16 = planner.plan_phase(shapes, phase, nodes, comms["fp16"], 1)["allreduce_seconds"]
    onebit = planner.plan_phase(shapes, phase, nodes, comms["onebit"], 1)["allreduce_seconds"]
    assert fp16 / onebit == pytest.approx(16 / 4, rel=0.01)
    # its own computation and the extra updates it needs, when measured, count
    slow = planner.plan_phase(shapes, phase, flat, comms["onebit"], 1, overhead_seconds=0.5, update_factor=1.2)
    assert slow["update_seconds"] == pytest.approx(rows["onebit"]["update_seconds"] + 0.5)
    assert slow["days"] == pytest.approx(rows["onebit"]["days"] * 1.2 * slow["update_seconds"]
                                         / rows["onebit"]["update_seconds"])
    with pytest.raises(ConfigError, match="needs the gradient tensors' shapes"):
        planner.plan_phase(1e8, phase, flat, comms["onebit"], 1)


def test_fusion_packs_tensors_in_order_into_buffers():
    mb = 2 ** 20
    tensors = [60 * mb, 50 * mb, 200 * mb, 10 * mb, 10 * mb]
    # [60] [50] [200 alone: larger than the buffer] [10 + 10]
    assert planner.fusion_messages(tensors, 100) == 4
    assert planner.fusion_messages(tensors, 0) == 5           # no fusion: one message per tensor
    assert planner.fusion_messages(tensors, 1000) == 1


def test_flat_ring_allreduce_by_hand():
    # 4 nodes x 1 device, 8 Gbit/s = 1e9 B/s, 100 us latency, 1 GB in one message:
    # 2*3/4 * 1e9 / 1e9 = 1.5 s, plus 2*3 hops * 100 us = 0.6 ms
    cluster = planner.Cluster(nodes=4, devices_per_node=1, inter_gbps=8, inter_latency_us=100)
    assert planner.allreduce_seconds(1e9, cluster, messages=1) == pytest.approx(1.5006)
    # 4 messages: 4 x the latency; + half a 2 ms cycle + 4 x 50 us software cost per message
    assert planner.allreduce_seconds(1e9, cluster, messages=4) == pytest.approx(1.5024)
    cluster.message_overhead_us = 50
    assert planner.allreduce_seconds(1e9, cluster, messages=4, cycle_time_ms=2) == pytest.approx(1.5036)


def test_hierarchical_allreduce_by_hand():
    # 2 nodes x 4 devices: intra 2*3/4 * 1e9 / 1e10 = 0.15 s; inter 2*1/2 * 1e9 / 1e9 = 1.0 s; no latency
    cluster = planner.Cluster(nodes=2, devices_per_node=4, inter_gbps=8, inter_latency_us=0,
                              intra_gbps=80, intra_latency_us=0)
    assert planner.allreduce_seconds(1e9, cluster) == pytest.approx(1.15)


def test_phase_plan_by_hand():
    # 2 nodes x 1 device at 100 seq/s, global batch 400 (accumulation 2): compute 400 / 200 = 2 s.
    # 250M parameters in fp16 = 5e8 bytes: allreduce 2*1/2 * 5e8 / 1e9 = 0.5 s (8 Gbit/s, no latency).
    cluster = planner.Cluster(nodes=2, devices_per_node=1, inter_gbps=8, inter_latency_us=0, price_per_device_hour=3)
    phase = planner.Phase("p", 128, total_sequences=400 * 86400 / 2.5, global_batch=400, device_sequences_per_second=100)
    once = planner.plan_phase(250e6, phase, cluster, CommConfig(fp16_allreduce=True, fusion_threshold_mb=1024, cycle_time_ms=0), accumulation=2)
    assert once["update_seconds"] == pytest.approx(2.5) and once["scaling_efficiency"] == pytest.approx(0.8)
    assert once["days"] == pytest.approx(1.0) and once["cost"] == pytest.approx(24 * 2 * 3)
    every = planner.plan_phase(250e6, phase, cluster, CommConfig(allreduce_every_micro_batch=True,
                                                                 fusion_threshold_mb=1024, cycle_time_ms=0),
                               accumulation=2)
    assert every["update_seconds"] == pytest.approx(2 + 2 * 1.0)     # fp32 and one allreduce per micro-batch


@pytest.mark.slow
@pytest.mark.parametrize("flag,message", [
    ("--inter_gbps=0", "error: --inter_gbps must be > 0"),
    ("--phase1_accumulation=7", "error: phase1: per-device batch 3840 is not divisible by --phase1_accumulation=7"),
    ("--phase2_global_batch_size=30721", "error: phase2: global batch 30721 is not divisible by 16 devices "
                                         "(--phase2_global_batch_size; --nodes x --devices_per_node)"),
    ("--exchange_memory=16,x", "error: --exchange_memory=16,x: give rank counts, e.g. 16,64"),
])
def test_plan_cli_names_the_flag_of_an_impossible_input(flag, message):
    proc = subprocess.run([sys.executable, str(REPO / "run" / "plan.py"), flag], env=mpi_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr                   # a configuration error is one line


@pytest.mark.slow
def test_plan_cli_keeps_the_traceback_of_an_error_that_is_not_a_configuration_error(tmp_path):
    out = tmp_path / "missing_folder" / "plan.json"
    proc = subprocess.run([sys.executable, str(REPO / "run" / "plan.py"), f"--output_json={out}"], env=mpi_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "FileNotFoundError" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("kwargs,message", [
    (dict(inter_gbps=0), "--inter_gbps must be > 0"),
    (dict(nodes=0), "--nodes must be >= 1"),
    (dict(message_overhead_us=-1), "--message_overhead_us must be >= 0"),
])
def test_impossible_cluster_names_the_flag(kwargs, message):
    values = dict(nodes=2, devices_per_node=1, inter_gbps=10)
    values.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        planner.Cluster(**values)


def test_impossible_communication_settings_name_the_flag():
    with pytest.raises(ConfigError, match="--fusion_threshold_mb must be >= 0"):
        CommConfig(fusion_threshold_mb=-1)
    with pytest.raises(ConfigError, match="--cycle_time_ms must be >= 0"):
        CommConfig(cycle_time_ms=-1)


def test_unset_fusion_and_cycle_plan_as_horovods_defaults():
    cluster = planner.Cluster(nodes=2, devices_per_node=1, inter_gbps=8)
    phase = planner.Phase("p", 128, 1e6, 64, 100)
    unset = planner.plan_phase(1e8, phase, cluster, CommConfig(), 1)
    explicit = planner.plan_phase(1e8, phase, cluster, CommConfig(fusion_threshold_mb=128, cycle_time_ms=1), 1)
    other = planner.plan_phase(1e8, phase, cluster, CommConfig(fusion_threshold_mb=128, cycle_time_ms=5), 1)
    assert unset == explicit and other["allreduce_seconds"] > unset["allreduce_seconds"]


def test_batch_not_divisible_names_the_problem():
    cluster = planner.Cluster(nodes=3, devices_per_node=1, inter_gbps=10)
    phase = planner.Phase("phase1", 128, 1e6, 1000, 100)
    with pytest.raises(ConfigError, match="global batch 1000 is not divisible by 3 devices"):
        planner.plan_phase(1e8, phase, cluster, CommConfig(), 1)


def test_reproduces_nvidia_dgx2h_32_nodes_within_25_percent():
    """run/validate_planner.py (docs/planner_validation.md): NVIDIA's published 32 x 16 V100
    throughput from their single-GPU figures and the DGX-2H interconnect, mixed precision."""
    rows = planner_validation.nvidia_rows(model_shapes.gradient_tensor_sizes(modeling.BertConfig.preset("large", vocab_size=30522)))
    goal = [r for r in rows if r["nodes"] == 32 and r["precision"] == "mixed"]
    assert [r["seq"] for r in goal] == [128, 512]
    for r in goal:
        assert abs(r["error"]) <= 0.25, r
    assert planner_validation.nvidia_misses(rows, 0.25) == []
    # and a row that misses is reported
    assert planner_validation.nvidia_misses([dict(r, error=r["error"] + 0.3) for r in rows], 0.25) == [
        "DGX-2H 32 nodes seq 128", "DGX-2H 32 nodes seq 512"]


def test_preemptible_capacity_by_hand():
    # 4 nodes x 4 devices; one phase of 100 h with 36 s updates (u = 0.01 h); a node preempted every 40 h
    # on average: 4 / 40 = 0.1 preemptions per hour.
    cluster = planner.Cluster(nodes=4, devices_per_node=4, inter_gbps=10)
    rows = [{"days": 100 / 24, "update_seconds": 36.0}]
    pre = spot.Preemption(price_on_demand=3, price_spot=1, mtbp_hours=40, restart_minutes=10, elastic_minutes=3,
                             join_minutes=3, replacement_minutes=20, save_interval=100, elastic_commit_interval=10)
    # 1.5e9 parameters: a commit copies 12 x 1.5e9 B at 10 GB/s = 1.8 s, every 10 x 36 s: 0.5% more time
    out = spot.preemptible(rows, cluster, pre, parameters=1.5e9)
    assert out["on-demand"]["days"] * 24 == pytest.approx(100)
    assert out["on-demand"]["cost"] == pytest.approx(100 * 16 * 3)
    # restart: 10 min + 20 min + 100 / 2 x 0.01 h = 1 h per preemption: 100 / (1 - 0.1 x 1)
    assert out["spot + checkpoint restart"]["days"] * 24 == pytest.approx(100 / 0.9)
    # elastic: 3 + 3 min + 10 / 2 x 0.01 h + 20 min / 4 nodes = 0.2333 h per preemption
    assert out["spot + elastic"]["days"] * 24 == pytest.approx(100 * 1.005 / (1 - 0.1 * (0.1 + 0.05 + 1 / 12)))
    # the preempted node is not billed for its 20 min: 0.1 x (1/3) / 4 of the node-hours
    billed = 1 - 0.1 * (1 / 3) / 4
    assert out["spot + checkpoint restart"]["cost"] == pytest.approx(100 / 0.9 * 16 * 1 * billed)
    assert out["spot + elastic"]["cost"] == pytest.approx(100 * 1.005 / (1 - 0.1 * (0.1 + 0.05 + 1 / 12)) * 16 * billed)
    # a node every 4 h: restarts lose 1 h per 1 h of progress: the run never ends
    worse = spot.preemptible(rows, cluster, dataclasses.replace(pre, mtbp_hours=4), parameters=1.5e9)
    assert worse["spot + checkpoint restart"]["days"] == float("inf")
    assert worse["spot + elastic"]["days"] < float("inf")


def test_impossible_preemption_inputs_name_the_flag():
    values = dict(price_on_demand=3, price_spot=1, mtbp_hours=40, restart_minutes=10, elastic_minutes=3,
                  join_minutes=3, replacement_minutes=20, save_interval=100, elastic_commit_interval=10)
    for change, message in ((dict(mtbp_hours=0), "--mtbp_hours must be > 0"),
                            (dict(restart_minutes=-1), "--restart_minutes must be >= 0"),
                            (dict(elastic_commit_interval=0), "--elastic_commit_interval must be >= 1")):
        with pytest.raises(ConfigError, match=message):
            spot.Preemption(**{**values, **change})


def test_cheapest_names_the_options_within_one_percent():
    options = {"a": {"cost": 100.0}, "b": {"cost": 100.9}, "c": {"cost": 101.1}}
    assert spot.cheapest(options) == ("a", ["b"])
    assert spot.cheapest({**options, "a": {"cost": 102.0}}) == ("b", ["c"])      # 102 > 1.01 x 100.9


def test_memory_estimate_follows_korthikanti_and_recomputation_keeps_only_layer_inputs():
    config = modeling.BertConfig.preset("base", vocab_size=30522)
    plain = memory.memory_bytes(config, 128, 32, "mixed_float16", "none", accumulation=1)
    per_layer = 128 * 32 * 768 * (34 + 5 * 12 * 128 / 768)           # s*b*h*(34 + 5as/h), 16-bit activations
    assert plain["activations"] == 12 * per_layer == 1_660_944_384
    assert plain["state"] == 16 * model_shapes.parameter_count(config)
    layer = memory.memory_bytes(config, 128, 32, "mixed_float16", "layer", accumulation=1)
    assert layer["activations"] == 12 * 128 * 32 * 768 * 2 + per_layer and layer["state"] == plain["state"]
    fp32 = memory.memory_bytes(config, 512, 4, "float32", "none", accumulation=4)
    assert fp32["activations"] == 12 * 512 * 4 * 768 * (34 + 5 * 12 * 512 / 768) * 2
    assert fp32["state"] == 20 * model_shapes.parameter_count(config)         # + the accumulators


def test_exchange_state_per_rank_by_hand():
    """Per rank: powersgd's errors of the compressed matrices and Q, onebit's error of every element and of its
    chunk, DiLoCo's anchor and velocity; the old gather put ranks x a rank's own buffers on rank 0 at a save and on
    every rank after a resume; the new per-rank files hold one rank's own, whatever the rank count."""
    shapes = [(100, 20), (20,), (2, 20), (30, 40)]               # (2, 20): its factors are not 2x smaller, sent whole
    elements = 2000 + 20 + 40 + 1200
    psgd = memory.exchange_state_bytes(shapes, CommConfig(exchange="powersgd", powersgd_rank=4), 8)
    assert psgd["own"] == 4 * (2000 + 1200) and psgd["shared"] == 4 * 4 * (20 + 40)
    assert psgd["steady"] == psgd["own"] + psgd["shared"]
    assert psgd["save_host"] == psgd["file"] == psgd["resume_host"] == psgd["own"]
    assert psgd["resume_device"] == 4 * 2000                    # one buffer at a time: the largest
    assert psgd["old_save_rank0"] == psgd["old_resume"] == 8 * psgd["own"]
    for ranks in (1, 8, 64):
        onebit = memory.exchange_state_bytes(shapes, CommConfig(exchange="onebit"), ranks)
        # each tensor padded to a multiple of ranks x lcm(ranks, 8) (DeepSpeed's): its chunk is 1/ranks of that
        block = ranks * math.lcm(ranks, 8)
        chunk = sum(block * math.ceil(math.prod(s) / block) // ranks for s in shapes)
        assert onebit["own"] == 4 * (ranks * chunk + chunk) and onebit["shared"] == 0
        assert onebit["resume_device"] == 4 * ranks * chunk and ranks * chunk >= elements
        assert onebit["old_resume"] == ranks * onebit["own"]
    diloco = memory.exchange_state_bytes(shapes, CommConfig(local_updates=4), 8)
    assert diloco["own"] == 0 and diloco["shared"] == diloco["checkpoint"] == diloco["steady"] == 2 * 4 * elements
    quantised = memory.exchange_state_bytes(shapes, CommConfig(local_updates=4, outer_delta_bits=4), 8)
    chunk = -(-(-(-elements // 8)) // 256) * 256                                  # a rank's chunk, whole blocks
    assert quantised["own"] == 4 * (8 + 1) * chunk >= 4 * elements                  # every chunk it sends + its mean's
    assert quantised["steady"] == quantised["own"] + 2 * 4 * elements
    assert quantised["file"] == quantised["save_host"] == 0                              # never saved
    for plain in (CommConfig(), CommConfig(exchange="fp16"), CommConfig(fp16_allreduce=True)):
        assert set(memory.exchange_state_bytes(shapes, plain, 8).values()) == {0, 8}    # nothing but "ranks"
    with pytest.raises(ConfigError, match="resolve it first"):
        memory.exchange_state_bytes(shapes, CommConfig(exchange="auto"), 8)
    # the estimate of the old gather: about 7 GB per rank for BERT-base on 16 ranks, 85 GB for large on 64
    rows = {}
    for preset, ranks in (("base", 16), ("large", 64)):
        shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset(preset, vocab_size=30522))
        rows[preset] = {r["method"]: r for r in memory.exchange_state_table(shapes, [ranks])}
    assert [r["old_save_rank0"] / 1e9 for r in rows["base"].values()] == pytest.approx([0, 0, 7.04, 7.04, 7.49, 0],
                                                                                       abs=0.01)
    assert [r["old_resume"] / 1e9 for r in rows["large"].values()] == pytest.approx([0, 0, 85.98, 85.98, 87.60, 0],
                                                                                    abs=0.01)
    assert list(rows["large"]) == ["none", "fp16", "powersgd rank 4", "powersgd rank 8", "onebit", "DiLoCo"]
    assert rows["large"]["DiLoCo"]["steady"] == 8 * model_shapes.parameter_count(
        modeling.BertConfig.preset("large", vocab_size=30522))


def test_memory_per_device_counts_the_exchange_state_and_warns_past_the_device():
    config = modeling.BertConfig.preset("base", vocab_size=30522)
    shapes = model_shapes.gradient_tensor_shapes(config)
    exchange = memory.exchange_state_bytes(shapes, CommConfig(exchange="onebit"), 16)["steady"]
    plain = memory.memory_bytes(config, 128, 32, "mixed_float16", "none", accumulation=4)
    onebit = memory.memory_bytes(config, 128, 32, "mixed_float16", "none", accumulation=4, exchange=exchange)
    assert onebit["total"] == plain["total"] + exchange and onebit["exchange"] == exchange > 0
    between = (plain["total"] + onebit["total"]) / 2 / 2 ** 30      # GiB: fits without the exchange, not with it
    assert memory.memory_warning("phase1", plain, between) == ""
    assert memory.memory_warning("phase1", onebit, 0) == ""      # 0: the device's memory unknown
    warning = memory.memory_warning("phase1", onebit, between)
    assert warning.startswith(f"warning: phase1 needs {onebit['total'] / 2**30:.1f} GiB per device (the gradient "
                              f"exchange's state {exchange / 2**30:.1f} GiB of it), more than "
                              f"--device_memory_gb={between:g}")
    assert "--phase1_micro_batch_size" in warning


@pytest.mark.slow
def test_plan_cli_warns_when_the_exchange_state_overflows_the_device_and_prints_the_table():
    config = modeling.BertConfig.preset("base", vocab_size=30522)
    shapes = model_shapes.gradient_tensor_shapes(config)
    exchange = memory.exchange_state_bytes(shapes, CommConfig(exchange="powersgd"), 16)["steady"]
    plain = memory.memory_bytes(config, 128, 64, "mixed_float16", "none", accumulation=64)["total"]
    between = round((plain + exchange / 2) / 2 ** 30, 3)            # phase 1 fits without the exchange only
    command = [sys.executable, str(REPO / "run" / "plan.py"), "--model_preset=base", "--exchange=powersgd"]
    proc = subprocess.run(command + [f"--device_memory_gb={between}"], env=mpi_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"gradient exchange {exchange / 2**30:.1f}" in proc.stdout
    assert f"warning: phase1 needs {(plain + exchange) / 2**30:.1f} GiB per device" in proc.stdout, proc.stdout
    assert f"more than --device_memory_gb={between:g}" in proc.stdout
    proc = subprocess.run(command + ["--exchange_memory=16,64"], env=mpi_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len([line for line in lines if " ranks  " in line]) == 12 and "warning" not in proc.stdout
    assert any(line.startswith("   64 ranks  onebit") and "old:   26.76 |   26.76" in line for line in lines), lines


@pytest.mark.slow
def test_measured_device_figures_are_recorded_per_phase_checked_and_taken_by_the_plan(tmp_path):
    path = tmp_path / "gpu_check.json"
    device_figures.record_device_figures(str(path), "base", 128, 512.5, device="NVIDIA A100", rung_128="fp16+xla")
    figures = device_figures.record_device_figures(str(path), "base", 512, 101.25, rung_512="fp16+xla")
    assert figures == device_figures.read_device_figures(str(path), "base")
    assert figures["phase1_device_seq_s"] == 512.5 and figures["phase2_device_seq_s"] == 101.25
    assert figures["device"] == "NVIDIA A100" and sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json"]
    with pytest.raises(ConfigError, match="not 64"):
        device_figures.record_device_figures(str(path), "base", 64, 1.0)
    with pytest.raises(ConfigError, match=r"measured on BERT-base, but the plan is for BERT-large \(--model_preset\)"):
        device_figures.read_device_figures(str(path), "large")
    for text, message in (('{"model_preset": "base", "phase1_device_seq_s": -3}', "must be a positive number"),
                          ('{"model_preset": "base"}', "no phase1_device_seq_s or phase2_device_seq_s"),
                          ("{not json", "not JSON")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=rf"--device_figures={bad}: .*{message}"):
            device_figures.read_device_figures(str(bad), "base")
    with pytest.raises(ConfigError, match="No such file"):
        device_figures.read_device_figures(str(tmp_path / "none.json"), "base")
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, str(REPO / "run" / "plan.py"), "--model_preset=base",
                           f"--device_figures={path}", "--phase2_device_seq_s=50", f"--output_json={out}",
                           "--exchange=auto"],
                          env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"measured figures from {path} (NVIDIA A100): phase1_device_seq_s=512.5" in proc.stdout
    import json
    phases = {p["phase"]: p for p in json.loads(out.read_text())["plan"]["phases"]}
    # compute time per update = global batch / (ranks x device speed): the file's 512.5 at 128, the flag's 50 at 512
    assert phases["phase1"]["compute_seconds"] == pytest.approx(61440 / 16 / 512.5)
    assert phases["phase2"]["compute_seconds"] == pytest.approx(30720 / 16 / 50)
    # --exchange=auto at LAMB's large batches on 10 Gbit/s: float16 allreduce, and the ranking says why
    exchanges = json.loads(out.read_text())["exchanges"]
    methods = [r["method"] for r in exchanges]
    assert methods[0] == "fp16" and methods[-1] == "onebit", methods
    assert sorted(methods[1:-1]) == ["none", "powersgd rank 4", "powersgd rank 8"], methods
    assert "fastest to the same held-out accuracy first: fp16: " in proc.stdout
    assert proc.stdout.rstrip().count("--exchange=auto: fp16") == 1


def test_the_plans_in_planner_validation_md_run_and_give_its_table():
    """docs/planner_validation.md's section 4 shows four run/plan.py commands and a table of what they print
    (days, cost, scaling efficiency with and without the optimisations): each command runs (the ones with
    --allreduce_every_micro_batch used to fail on a compressed candidate) and prints the table's figures."""
    doc = (REPO / "docs" / "planner_validation.md").read_text()
    commands = [line for line in doc.splitlines() if line.startswith("python run/plan.py ")]
    assert len(commands) == 4, commands
    rows = re.findall(r"^\| BERT-(large|base) \| [^|]+ \| ([^|]+) \| ([^|]+) \|$", doc, re.M)
    expected = [cell for _, with_, without in rows for cell in (with_, without)]
    assert len(expected) == 4, rows
    for command, cell in zip(commands, expected):
        days, cost, first, second = re.search(r"([\d.]+) days, cost ([\d,]+)\**\s*\(\D*(\d+)% / (\d+)%", cell).groups()
        proc = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=REPO, env=mpi_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert f"total: {days} days, cost {cost.replace(',', '')}" in proc.stdout, (command, proc.stdout[-2000:])
        efficiencies = re.findall(r"scaling efficiency ([\d.]+)%", proc.stdout)
        assert len(efficiencies) == 2 and all(abs(float(e) - int(shown)) <= 0.5 for e, shown in
                                              zip(efficiencies, (first, second))), (command, efficiencies)


def test_the_geglu_feed_forward_counts_its_gate_and_modern_mini_matched_is_bert_mini_sized():
    """A modern layer's GeGLU runs three H x I matmuls (value, gate, output), the classic's two; with it counted,
    modern-mini-matched (GeGLU 683 = 8/3 x 256) has BERT-mini's FLOPs per sequence and non-embedding parameters
    within 1%, where modern-mini has 80% of the FLOPs (the recipe race's arms, issue 49)."""
    from bert_tf.tools import flops

    def per_sequence(name):
        return flops.forward_flops_per_sequence(modeling.BertConfig.preset(name, vocab_size=30522), 128, 20, nsp=False)

    def non_embedding(name):
        return model_shapes.encoder_parameter_count(modeling.BertConfig.preset(name, vocab_size=30522))

    config = modeling.BertConfig.preset("modern-mini", vocab_size=30522)
    classic = dataclasses.replace(config, architecture="bert")
    S, H, I = 128, config.hidden_size, config.intermediate_size
    assert per_sequence("modern-mini") - flops.forward_flops_per_sequence(classic, 128, 20, nsp=False) == \
        config.num_hidden_layers * 2 * S * H * I                      # the gate's matmul, per layer
    assert per_sequence("modern-mini-matched") / per_sequence("mini") == pytest.approx(1.0, abs=0.01)
    assert non_embedding("modern-mini-matched") / non_embedding("mini") == pytest.approx(1.0, abs=0.01)
    assert per_sequence("modern-mini") / per_sequence("mini") == pytest.approx(0.80, abs=0.01)
    # the figures: 6.82 and 4.98 MFLOP per token in the layers, 3.16 M and 2.23 M parameters
    assert [round(flops.encoder_flops_per_token(modeling.BertConfig.preset(n), 128) / 1e6, 2)
            for n in ("mini", "modern-mini", "modern-mini-matched")] == [6.82, 4.98, 6.82]
    assert [round(non_embedding(n) / 1e6, 2) for n in ("mini", "modern-mini")] == [3.16, 2.23]
