"""Predicts the days and cost of a two-phase BERT pre-training on a cluster (model in bert_tf/tools/planner.py).

    python run/plan.py --model_preset=large --nodes=4 --devices_per_node=4 --inter_gbps=10 \
        --phase1_device_seq_s=206.5 --phase2_device_seq_s=40.95 --price_per_device_hour=2.5

Defaults are NVIDIA's LAMB recipe for BERT-large (phase 1: 7,506 updates x 61,440 sequences at
128; phase 2: 1,668 x 30,720 at 512; fp16 allreduce after accumulation) and their single-V100
throughputs, mixed precision (206.5 and 40.95 sequences/s): NVIDIA DeepLearningExamples,
TensorFlow2/LanguageModeling/BERT/README.md, 21.02 container. Measure your own device's with
run/benchmark.py.

With --spot_price_per_device_hour it also prices preemptible capacity: on demand, spot with a restart
from the last checkpoint after each preemption, and spot with elastic training (bert_tf/train/elastic.py),
and says which is cheapest (equations in bert_tf/tools/planner.py):

    python run/plan.py --model_preset=large --price_per_device_hour=2.48 --spot_price_per_device_hour=0.74 \
        --mtbp_hours=24
"""
import json

from absl import flags

from bert_tf import ConfigError, cli
from bert_tf.parallel import auto_exchange, comm
from bert_tf.model.config import BertConfig
from bert_tf.tools import memory, planner

cli.define_model_preset("large")
flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size.")
flags.DEFINE_integer("nodes", 4, "Nodes.")
flags.DEFINE_integer("devices_per_node", 4, "GPUs (ranks) per node.")
flags.DEFINE_float("inter_gbps", 10.0, "Node-to-node bandwidth per node, Gbit/s.")
flags.DEFINE_float("inter_latency_us", 50.0, "Node-to-node latency per message hop, microseconds.")
flags.DEFINE_float("message_overhead_us", 0.0, "Software cost per fused allreduce message, microseconds "
                   "(run/comm_study.py's link probe measures it; 136 us on this project's CPU machine).")
flags.DEFINE_float("intra_gbps", 800.0, "Device-to-device bandwidth inside a node, Gbit/s (PCIe 3 x16 ~100).")
flags.DEFINE_float("price_per_device_hour", 0.0, "Price of one device-hour (any currency).")
flags.DEFINE_float("phase1_device_seq_s", 206.5, "Phase-1 sequences/s of one device (default: V100, BERT-large, fp16).")
flags.DEFINE_float("phase2_device_seq_s", 40.95, "Phase-2 sequences/s of one device (default: V100, BERT-large, fp16).")
flags.DEFINE_float("phase1_sequences", 7506 * 61440, "Phase-1 total sequences.")
flags.DEFINE_float("phase2_sequences", 1668 * 30720, "Phase-2 total sequences.")
flags.DEFINE_integer("phase1_global_batch_size", 61440, "Phase-1 sequences per optimizer update, all devices.")
flags.DEFINE_integer("phase2_global_batch_size", 30720, "Phase-2 sequences per optimizer update, all devices.")
cli.define_renamed("phase1_global_batch", "phase1_global_batch_size")
cli.define_renamed("phase2_global_batch", "phase2_global_batch_size")
flags.DEFINE_integer("phase1_accumulation", 64, "Phase-1 accumulation steps.")
flags.DEFINE_integer("phase2_accumulation", 192, "Phase-2 accumulation steps.")
cli.define_comm(comm.CommConfig(gradient_compression="fp16"))
flags.DEFINE_float("spot_price_per_device_hour", 0.0, "Spot (preemptible) price of one device-hour; > 0 adds the "
                   "on-demand / spot + checkpoint restart / spot + elastic comparison.")
flags.DEFINE_float("mtbp_hours", 24.0, "Mean time between preemptions of one node, hours (default: GCP preemptible "
                   "VMs are always stopped within 24 h, cloud.google.com/compute/docs/instances/preemptible).")
# Measured on this project's emulated cluster (3 nodes, tiny model, CPU; docs/results.md, tests/test_elastic.py):
# a GPU cluster's restart adds XLA compilation and a larger checkpoint to read: give your own figures.
flags.DEFINE_float("restart_minutes", planner.MEASURED_RESTART_MINUTES,
                   "Time a kill-and-restart from the last checkpoint loses beyond the updates since it: "
                   "start-up, restore, first update (default: measured on the emulated cluster).")
flags.DEFINE_float("elastic_minutes", planner.MEASURED_ELASTIC_MINUTES,
                   "Time an elastic event loses: detection + restore + first update at the new size "
                   "(default: measured on the emulated cluster).")
flags.DEFINE_float("join_minutes", planner.MEASURED_JOIN_MINUTES,
                   "Time the ranks wait when a replacement node joins (default: measured on the emulated cluster).")
flags.DEFINE_float("replacement_minutes", 10.0, "Minutes until a preempted node is replaced (an assumption: "
                   "launch and boot of a spot instance; measure yours).")
flags.DEFINE_integer("save_interval", 200, "Updates between checkpoints (configs/large_phase1.flags).")
flags.DEFINE_integer("elastic_commit_interval", 10, "Updates between elastic commits (run/pretrain.py's default).")
flags.DEFINE_float("host_copy_gbytes_per_s", 10.0, "Device-to-host copy bandwidth of a commit, GB/s "
                   "(PCIe 3.0 x16: 15.75 GB/s theoretical).")
flags.DEFINE_float("powersgd_seconds", 0.0, "Computation one PowerSGD exchange adds per update on this device, s "
                   "(run/comm_study.py --compression_cost measures it); 0: not counted.")
flags.DEFINE_float("onebit_seconds", 0.0, "Computation one 1-bit exchange adds per update on this device, s "
                   "(run/comm_study.py --compression_cost); 0: not counted.")
flags.DEFINE_string("output_json", "", "Write the plan here.")
flags.DEFINE_string("device_figures", "", "JSON of this device's measured figures (run/benchmark.py --device_figures, "
                    "scripts/gpu_check.sh): its phase1/phase2_device_seq_s and intra_gbps replace the defaults; "
                    "flags given on the command line still win.")
flags.DEFINE_integer("phase1_micro_batch_size", 64, "Phase-1 sequences per device per micro-batch (memory "
                     "estimate).")
flags.DEFINE_integer("phase2_micro_batch_size", 16, "Phase-2 sequences per device per micro-batch (memory "
                     "estimate).")
cli.define_renamed("phase1_micro_batch", "phase1_micro_batch_size")
cli.define_renamed("phase2_micro_batch", "phase2_micro_batch_size")
flags.DEFINE_enum("precision", "mixed_float16", ["float32", "mixed_float16", "mixed_bfloat16"],
                  "Activation precision of the memory estimate.")
flags.DEFINE_enum("recompute", "none", ["none", "layer"], "run/pretrain.py --recompute, for the memory estimate.")
flags.DEFINE_float("device_memory_gb", 0.0, "Memory of one device, GiB (an 80 GB A100 has 80 GiB): a warning when "
                   "the estimate for the chosen --recompute, the gradient exchange's state in it, exceeds it; "
                   "0: unknown, no check.")
flags.DEFINE_list("exchange_memory", [], "Rank counts, e.g. 16,64: print the gradient exchange's state per rank "
                  "(steady, at a save, at a resume; per-rank files against the old gather on rank 0) for every "
                  "exchange and --model_preset at each, and nothing else (memory.exchange_state_bytes).")
FLAGS = flags.FLAGS



def main(_):
    if FLAGS.device_figures:
        figures = planner.read_device_figures(FLAGS.device_figures, FLAGS.model_preset)
        used = {k: figures[k] for k in (*planner.DEVICE_FIGURES, *planner.LINK_FIGURES)
                if k in figures and not FLAGS[k].present}
        for key, value in used.items():
            setattr(FLAGS, key, value)
        print(f"measured figures from {FLAGS.device_figures} ({figures.get('device', 'device not named')}): "
              + ", ".join(f"{k}={v:g}" for k, v in used.items()))
    config = BertConfig.preset(FLAGS.model_preset, vocab_size=FLAGS.vocab_size)
    shapes = planner.gradient_tensor_shapes(config)
    if FLAGS.exchange_memory:
        print_exchange_memory(shapes, FLAGS.exchange_memory)
        return
    params = sum(planner.gradient_tensor_sizes(config))
    cluster = planner.Cluster(FLAGS.nodes, FLAGS.devices_per_node, FLAGS.inter_gbps, FLAGS.inter_latency_us,
                              FLAGS.intra_gbps, price_per_device_hour=FLAGS.price_per_device_hour,
                              message_overhead_us=FLAGS.message_overhead_us)
    phases = [planner.Phase("phase1", 128, FLAGS.phase1_sequences, FLAGS.phase1_global_batch_size,
                            FLAGS.phase1_device_seq_s),
              planner.Phase("phase2", 512, FLAGS.phase2_sequences, FLAGS.phase2_global_batch_size,
                            FLAGS.phase2_device_seq_s)]
    settings = cli.comm_config()
    accumulation = [FLAGS.phase1_accumulation, FLAGS.phase2_accumulation]
    overheads = {"powersgd": FLAGS.powersgd_seconds, "onebit": FLAGS.onebit_seconds}
    ranking = planner.exchange_ranking(shapes, phases, cluster, settings, accumulation, overheads)
    asked = settings.gradient_compression
    if asked == "auto":
        settings = auto_exchange.exchange_choices(settings)[ranking[0]["method"]]
    factor, note = auto_exchange.update_factor(settings)
    result = planner.plan(shapes, phases, cluster, settings, accumulation, overheads.get(settings.method, 0.0),
                          1.0 if factor is None else factor)
    base, knobs = planner.best_knob(shapes, phases, cluster, settings, accumulation)
    print(f"BERT-{FLAGS.model_preset}: {params / 1e6:.1f}M parameters; {cluster.nodes} nodes x "
          f"{cluster.devices_per_node} devices, {cluster.inter_gbps:g} Gbit/s between nodes")
    for r in result["phases"]:
        print(f"{r['phase']}: update {r['update_seconds']:.3f} s = compute {r['compute_seconds']:.3f} + gradients "
              f"{r['allreduce_seconds']:.3f}; {r['sequences_per_second']:.0f} seq/s, scaling efficiency "
              f"{r['scaling_efficiency']:.1%}; {r['days']:.2f} days, cost {r['cost']:.0f}")
    print(f"total: {result['days']:.2f} days, cost {result['cost']:.0f}"
          + (f", {settings.method} taking x{factor:.2f} the updates{note} for the same held-out accuracy"
             if factor not in (None, 1.0) else "")
          + (f"; {settings.method} never reached float16's held-out accuracy in the race" if factor is None else ""))
    print(f"gradient exchange for this link, fastest to the same held-out accuracy first: "
          f"{auto_exchange.describe_ranking(ranking)}" + (f"; --gradient_compression=auto: {ranking[0]['method']}"
                                                          if asked == "auto" else ""))
    print_memory(config, phases, accumulation, memory.exchange_state_bytes(shapes, settings, cluster.devices))
    print("single changes, best first: " + "; ".join(f"{name}: {days:.2f} days" for days, name in knobs))
    spot = preemptible(result, cluster, params) if FLAGS.spot_price_per_device_hour > 0 else None
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump({"plan": result, "knobs": knobs, "parameters": params, "preemptible": spot,
                       "exchanges": ranking}, f, indent=1)


def print_memory(config, phases, accumulation, exchange):
    """Memory per device of each phase, the exchange's state (memory.exchange_state_bytes) in it; a warning when
    the chosen --recompute's exceeds --device_memory_gb."""
    micro_batches = (FLAGS.phase1_micro_batch_size, FLAGS.phase2_micro_batch_size)
    for phase, micro, acc in zip(phases, micro_batches, accumulation):
        for recompute in ("none", "layer"):
            m = memory.memory_bytes(config, phase.seq_length, micro, FLAGS.precision, recompute, acc,
                                     exchange=exchange["steady"])
            print(f"{phase.name} memory per device, micro-batch {micro} at {phase.seq_length}, {FLAGS.precision}, "
                  f"--recompute={recompute}{' (chosen)' if recompute == FLAGS.recompute else ''}: "
                  f"{m['total'] / 2**30:.1f} GiB = state {m['state'] / 2**30:.1f} + activations "
                  f"{m['activations'] / 2**30:.1f} + gradient exchange {m['exchange'] / 2**30:.1f}")
            warning = memory.memory_warning(phase.name, m, FLAGS.device_memory_gb)
            if warning and recompute == FLAGS.recompute:
                print(warning)


def print_exchange_memory(shapes, ranks_list):
    """--exchange_memory: the table of docs/results.md, "Exchange state per rank at 16 and 64 ranks"."""
    try:
        ranks_list = [int(r) for r in ranks_list]
    except ValueError:
        raise ConfigError(f"--exchange_memory={','.join(ranks_list)}: give rank counts, e.g. 16,64") from None
    if min(ranks_list) < 1:
        raise ConfigError(f"--exchange_memory: rank counts must be >= 1, got {min(ranks_list)}")
    gib = 2 ** 30
    print(f"BERT-{FLAGS.model_preset} (vocab {FLAGS.vocab_size}): gradient exchange state per rank, GiB. Per-rank "
          "files: steady (device) | save: host copy = own file | resume: own file read | shared part, which rank 0 "
          "writes (Q in its file, DiLoCo's in the checkpoint). Old gather: rank 0 at a save | every rank after a "
          "resume")
    for r in memory.exchange_state_table(shapes, ranks_list):
        print(f"{r['ranks']:5d} ranks  {r['method']:16s} {r['steady'] / gib:7.2f} | {r['save_host'] / gib:6.2f} | "
              f"{r['resume_host'] / gib:6.2f} | {r['checkpoint'] / gib:6.2f}   old: {r['old_save_rank0'] / gib:7.2f} "
              f"| {r['old_resume'] / gib:7.2f}")


def preemptible(result, cluster, params):
    """On demand against spot capacity with restarts or elastic training: printed, and returned."""
    pre = planner.Preemption(FLAGS.price_per_device_hour, FLAGS.spot_price_per_device_hour, FLAGS.mtbp_hours,
                             FLAGS.restart_minutes, FLAGS.elastic_minutes, FLAGS.join_minutes,
                             FLAGS.replacement_minutes, FLAGS.save_interval, FLAGS.elastic_commit_interval,
                             FLAGS.host_copy_gbytes_per_s)
    spot = planner.preemptible(result["phases"], cluster, pre, params)
    print(f"preemptible capacity: a node preempted every {FLAGS.mtbp_hours:g} h on average "
          f"({cluster.nodes / FLAGS.mtbp_hours:.3g} preemptions per hour), replaced in "
          f"{FLAGS.replacement_minutes:g} min; restart {FLAGS.restart_minutes:.2f} min + half of "
          f"{FLAGS.save_interval} updates, elastic {FLAGS.elastic_minutes:.2f} + join {FLAGS.join_minutes:.2f} "
          f"min + half of {FLAGS.elastic_commit_interval} updates")
    for name, r in spot.items():
        print(f"  {name:26s} {r['days']:8.2f} days  cost {r['cost']:10.0f}")
    best, close = planner.cheapest(spot)
    print(f"cheapest: {best}" + (f" ({', '.join(close)} within 1%)" if close else ""))
    return spot


if __name__ == "__main__":
    cli.run(main)
