"""Predicts the days and cost of a two-phase BERT pre-training on a cluster (model in
bert_tf/tools/planner.py).

    python run/plan.py --model_preset=large --nodes=4 --devices_per_node=4 --inter_gbps=10 \
        --phase1_device_seq_s=206.5 --phase2_device_seq_s=40.95 --price_per_device_hour=2.5

Defaults are NVIDIA's LAMB recipe for BERT-large (phase 1: 7,506 updates x 61,440 sequences at
128; phase 2: 1,668 x 30,720 at 512; fp16 allreduce after accumulation) and their single-V100
throughputs, mixed precision (206.5 and 40.95 sequences/s): NVIDIA DeepLearningExamples,
TensorFlow2/LanguageModeling/BERT/README.md, 21.02 container. Measure your own device's with
run/benchmark.py.

With --spot_price_per_device_hour it also prices preemptible capacity: on demand, spot with a
restart from the last checkpoint after each preemption, and spot with elastic training
(bert_tf/train/elastic.py), and says which is cheapest (equations in bert_tf/tools/spot.py):

    python run/plan.py --model_preset=large --price_per_device_hour=2.48 \
        --spot_price_per_device_hour=0.74 --mtbp_hours=24
"""

import dataclasses
import json

from absl import flags

from bert_tf import cli
from bert_tf.parallel import auto_exchange
from bert_tf.model.config import BertConfig
from bert_tf.tools import device_figures, memory, planner, spot
from bert_tf.tools import model_shapes
from bert_tf.tools.plan_config import PlanConfig

cli.define_config_flags(PlanConfig)  # every field is a flag: its type, default and help live there
cli.define_renamed("phase1_global_batch", "phase1_global_batch_size")
cli.define_renamed("phase2_global_batch", "phase2_global_batch_size")
cli.define_renamed("phase1_micro_batch", "phase1_micro_batch_size")
cli.define_renamed("phase2_micro_batch", "phase2_micro_batch_size")
cli.define_renamed("gradient_compression", "exchange")
cli.define_synonym("fp16_allreduce", "exchange", "fp16")  # the old bool flag: --exchange=fp16


def with_device_figures(cfg: PlanConfig) -> PlanConfig:
    """--device_figures' measured figures in place of the defaults; a flag given on the command line
    wins."""
    figures = device_figures.read_device_figures(cfg.device_figures, cfg.model_preset)
    used = {
        k: figures[k]
        for k in (*device_figures.DEVICE_FIGURES, *device_figures.LINK_FIGURES)
        if k in figures and not flags.FLAGS[k].present
    }
    print(
        f"measured figures from {cfg.device_figures} "
        f"({figures.get('device', 'device not named')}): "
        + ", ".join(f"{k}={v:g}" for k, v in used.items())
    )
    return dataclasses.replace(cfg, **used)


def main(_):
    cfg = cli.config_from_flags(PlanConfig)
    if cfg.device_figures:
        cfg = with_device_figures(cfg)
    config = BertConfig.preset(cfg.model_preset, vocab_size=cfg.vocab_size)
    shapes = model_shapes.gradient_tensor_shapes(config)
    if cfg.exchange_memory:
        print_exchange_memory(cfg, shapes)
        return
    params = sum(model_shapes.gradient_tensor_sizes(config))
    cluster, phases, settings = cfg.cluster(), cfg.phases(), cfg.comm
    accumulation = cfg.accumulation()
    overheads = {"powersgd": cfg.powersgd_seconds, "onebit": cfg.onebit_seconds}
    ranking = planner.exchange_ranking(shapes, phases, cluster, settings, accumulation, overheads)
    asked = settings.exchange
    if asked == "auto":
        settings = auto_exchange.exchange_choices(settings)[ranking[0]["method"]]
    factor, note = auto_exchange.update_factor(settings)
    overhead, updates = overheads.get(settings.method, 0.0), 1.0 if factor is None else factor
    result = planner.plan(shapes, phases, cluster, settings, accumulation, overhead, updates)
    base, knobs = planner.best_knob(shapes, phases, cluster, settings, accumulation)
    print(
        f"BERT-{cfg.model_preset}: {params / 1e6:.1f}M parameters; {cluster.nodes} nodes x "
        f"{cluster.devices_per_node} devices, {cluster.inter_gbps:g} Gbit/s between nodes"
    )
    print_plan(result, settings.method, factor, note)
    print(
        f"gradient exchange for this link, fastest to the same held-out accuracy first: "
        f"{auto_exchange.describe_ranking(ranking)}"
        + (f"; --exchange=auto: {ranking[0]['method']}" if asked == "auto" else "")
    )
    print_memory(
        cfg, config, phases, memory.exchange_state_bytes(shapes, settings, cluster.devices)
    )
    print(
        "single changes, best first: "
        + "; ".join(f"{name}: {days:.2f} days" for days, name in knobs)
    )
    capacity = None
    if cfg.spot_price_per_device_hour > 0:
        capacity = preemptible(cfg, result, cluster, params)
    if cfg.output_json:
        output = {
            "plan": result,
            "knobs": knobs,
            "parameters": params,
            "preemptible": capacity,
            "exchanges": ranking,
        }
        with open(cfg.output_json, "w") as f:
            json.dump(output, f, indent=1)


def print_plan(result, method, factor, note):
    """Each phase's update time, throughput, days and cost, then the total, with the updates the
    exchange `method` takes over float16's (factor, note: auto_exchange.update_factor)."""
    for r in result["phases"]:
        print(
            f"{r['phase']}: update {r['update_seconds']:.3f} s = compute "
            f"{r['compute_seconds']:.3f} + gradients {r['allreduce_seconds']:.3f}; "
            f"{r['sequences_per_second']:.0f} seq/s, scaling efficiency "
            f"{r['scaling_efficiency']:.1%}; {r['days']:.2f} days, cost {r['cost']:.0f}"
        )
    if factor is None:
        updates = f"; {method} never reached float16's held-out accuracy in the race"
    elif factor != 1.0:
        updates = (
            f", {method} taking x{factor:.2f} the updates{note} for the same held-out accuracy"
        )
    else:
        updates = ""
    print(f"total: {result['days']:.2f} days, cost {result['cost']:.0f}{updates}")


def print_memory(cfg, config, phases, exchange):
    """Memory per device of each phase, the exchange's state (memory.exchange_state_bytes) in it; a
    warning when the chosen --recompute's exceeds --device_memory_gb."""
    for phase, micro, acc in zip(phases, cfg.micro_batches(), cfg.accumulation()):
        for recompute in ("none", "layer"):
            m = memory.memory_bytes(
                config,
                phase.seq_length,
                micro,
                cfg.precision,
                recompute,
                acc,
                exchange=exchange["steady"],
            )
            print(
                f"{phase.name} memory per device, micro-batch {micro} at {phase.seq_length}, "
                f"{cfg.precision}, "
                f"--recompute={recompute}{' (chosen)' if recompute == cfg.recompute else ''}: "
                f"{m['total'] / 2**30:.1f} GiB = state {m['state'] / 2**30:.1f} + activations "
                f"{m['activations'] / 2**30:.1f} + gradient exchange {m['exchange'] / 2**30:.1f}"
            )
            warning = memory.memory_warning(phase.name, m, cfg.device_memory_gb)
            if warning and recompute == cfg.recompute:
                print(warning)


def print_exchange_memory(cfg, shapes):
    """--exchange_memory: the table of docs/results.md, "Exchange state per rank at 16 and 64
    ranks"."""
    gib = 2**30
    print(
        f"BERT-{cfg.model_preset} (vocab {cfg.vocab_size}): gradient exchange state per rank, GiB. "
        "Per-rank files: steady (device) | save: host copy = own file | resume: own file read | "
        "shared part, which rank 0 writes (Q in its file, DiLoCo's in the checkpoint). Old gather: "
        "rank 0 at a save | every rank after a resume"
    )
    for r in memory.exchange_state_table(shapes, cfg.exchange_memory_ranks()):
        print(
            f"{r['ranks']:5d} ranks  {r['method']:16s} {r['steady'] / gib:7.2f} | "
            f"{r['save_host'] / gib:6.2f} | {r['resume_host'] / gib:6.2f} | "
            f"{r['checkpoint'] / gib:6.2f}   old: {r['old_save_rank0'] / gib:7.2f} | "
            f"{r['old_resume'] / gib:7.2f}"
        )


def preemptible(cfg, result, cluster, params):
    """On demand against spot capacity with restarts or elastic training: printed, and returned."""
    options = spot.preemptible(result["phases"], cluster, cfg.preemption(), params)
    print(
        f"preemptible capacity: a node preempted every {cfg.mtbp_hours:g} h on average "
        f"({cluster.nodes / cfg.mtbp_hours:.3g} preemptions per hour), replaced in "
        f"{cfg.replacement_minutes:g} min; restart {cfg.restart_minutes:.2f} min + half of "
        f"{cfg.save_interval} updates, elastic {cfg.elastic_minutes:.2f} + join "
        f"{cfg.join_minutes:.2f} min + half of {cfg.elastic_commit_interval} updates"
    )
    for name, r in options.items():
        print(f"  {name:26s} {r['days']:8.2f} days  cost {r['cost']:10.0f}")
    best, close = spot.cheapest(options)
    print(f"cheapest: {best}" + (f" ({', '.join(close)} within 1%)" if close else ""))
    return options


if __name__ == "__main__":
    cli.run(main)
