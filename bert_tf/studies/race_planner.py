"""The planner beside a race's runs on emulated nodes (run/recipe_race.py --nodes): its speed for a
finished run, fed the run's own per-rank speed without communication, against the measured one; and
the other way round, the link at which a run's exchange would leave a given scaling efficiency, so a
race "where float16 allreduce is 25% efficient" is set from the machine of the day (its compute
speed moves that link by 2x between sessions of the same machine kind).
"""

from __future__ import annotations

import math
import os

from bert_tf import ConfigError
from bert_tf.artifacts import metrics


def training_intervals(records: list) -> list:
    """The "train" records of intervals with no evaluation inside (an evaluation follows the record
    of its step, so it lands in the next interval) and after the first (compilation): training speed
    alone."""
    out, after_eval = [], True
    for r in records:
        if r.get("kind") == "eval":
            after_eval = True
        elif r.get("kind") == "train":
            if not after_eval:
                out.append(r)
            after_eval = False
    return out


def run_inputs(run_dir: str) -> dict:
    """What the planner needs from a finished run: its comm settings as run (--exchange=auto's
    choice), gradient shapes, batch, sequence length, its per-rank speed without communication
    (compute, wait and optimizer update of its timing split, over its training intervals after a
    compressed exchange's float32 warmup), that exchange's own computation, and the intervals."""
    from bert_tf.model.config import BertConfig
    from bert_tf.parallel.comm import CommConfig, warmup_updates
    from bert_tf.studies import comm_study
    from bert_tf.tools import model_shapes

    records = metrics.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    run = next(r for r in records if r.get("kind") == "run")
    cfg = run.get("resolved", run["config"])
    comm = CommConfig.from_record(cfg["comm"])  # "gradient_compression" (run records) or "exchange"
    warmup = warmup_updates(comm, cfg.get("total_steps", 0)) if comm.compressed else 0
    train = [r for r in training_intervals(records) if r["step"] - cfg["log_interval"] >= warmup]
    if not train:
        raise ConfigError(f"{run_dir}: no training interval without an evaluation to measure")
    shapes = model_shapes.gradient_tensor_shapes(
        BertConfig.from_json_file(os.path.join(run_dir, "bert_config.json")),
        nsp=not cfg["mlm_only"],
    )
    micro, accumulation = cfg["micro_batch_size"], cfg["accumulation_steps"]
    seconds = sum(
        r["compute_seconds"] + r.get("wait_seconds", 0.0) + r["update_seconds"] for r in train
    ) / len(train)
    overhead = (
        comm_study.compression_seconds(shapes, comm.method, comm.powersgd_rank)
        if comm.compressed
        else 0.0
    )
    return {
        "cfg": cfg, "comm": comm, "shapes": shapes, "micro": micro, "accumulation": accumulation,
        "speed": micro * accumulation / seconds, "overhead": overhead, "train": train,
    }  # fmt: skip


def _plan(inputs: dict, nodes: int, rate_gbit: float, link: dict | None, updates: int) -> dict:
    from bert_tf.studies import comm_study

    return comm_study.predict(
        inputs["shapes"], nodes, rate_gbit, inputs["comm"], inputs["speed"], inputs["micro"],
        inputs["accumulation"], inputs["cfg"]["max_seq_length"], link, inputs["overhead"], updates,
    )  # fmt: skip


def planned_vs_measured(
    run_dir: str, nodes: int, rate_gbit: float, link: dict | None = None
) -> dict:
    """The planner's sequences/s for a finished run on `nodes` emulated nodes (one rank each) linked
    at `rate_gbit` (`link`: as comm_study.probe_link measured it), fed the run's own per-rank speed
    without communication, against the speed it measured between evaluations, and that over the
    ranks' own (scaling efficiency)."""
    inputs = run_inputs(run_dir)
    cfg, comm, train, speed = inputs["cfg"], inputs["comm"], inputs["train"], inputs["speed"]
    # bytes averaged over the run, warmup and rounds included
    whole = _plan(inputs, nodes, rate_gbit, link, cfg["total_steps"])
    # measured: the float32 warmup left out
    steady = _plan(inputs, nodes, rate_gbit, link, 1) if comm.compressed else whole
    measured = len(train) / sum(1.0 / r["sequences_per_second"] for r in train)
    return {
        "predicted_sequences_per_second": steady["sequences_per_second"],
        "measured": measured,
        "error": steady["sequences_per_second"] / measured - 1,
        "device_seq_s": speed,
        "predicted_exchange_seconds": steady["allreduce_seconds"],
        "predicted_bytes": whole["gradient_bytes"],
        # what each rank sends: a ring collective's 2(N-1)/N of the allreduce-equivalent bytes
        "predicted_wire_bytes": whole["gradient_bytes"] * 2 * (nodes - 1) / nodes,
        "compression_seconds": inputs["overhead"],
        "scaling_efficiency": measured / (nodes * speed),
    }


def link_for_efficiency(
    run_dir: str, nodes: int, target: float, link: dict | None = None, probed_gbit: float = 0.0
) -> dict:
    """The link rate to set (--link_gbit) at which the planner puts a finished run's exchange (as it
    ran: float16 allreduce for the communication race's baseline) at `target` scaling efficiency on
    `nodes` emulated nodes, fed the run's own per-rank speed without communication (a run on this
    machine's ranks, no links, is enough). `link`, a probe made at `probed_gbit`: its ratio of
    measured to set bandwidth and its per-message cost are taken to hold at the new rate (without
    one the link is its nominal rate with no per-message cost). The efficiency falls as the link
    slows, so a bisection in log-rate finds it."""
    if not 0 < target < 1:
        raise ConfigError(f"a scaling efficiency is in (0, 1), got {target:g}")
    if link and probed_gbit <= 0:
        raise ConfigError("a link probe needs the rate it was made at (--link_gbit)")
    inputs = run_inputs(run_dir)
    ratio = link["effective_gbit"] / probed_gbit if link else 1.0

    def at(gbit):
        probe = dict(link, effective_gbit=gbit * ratio) if link else None
        plan = _plan(inputs, nodes, gbit, probe, 1)
        return plan["sequences_per_second"] / (nodes * inputs["speed"]), plan

    low, high = math.log(1e-6), math.log(1e4)
    if at(math.exp(high))[0] < target:
        raise ConfigError(
            f"{run_dir}: {target:.0%} efficiency is out of reach at any rate (the per-message "
            "cost alone is too slow)"
        )
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if at(math.exp(mid))[0] < target else (low, mid)
    gbit = math.exp(high)
    efficiency, plan = at(gbit)
    update = inputs["micro"] * inputs["accumulation"] / inputs["speed"]
    return {
        "link_gbit": gbit,
        "effective_gbit": gbit * ratio,
        "scaling_efficiency": efficiency,
        "device_seq_s": inputs["speed"],
        "compute_seconds_per_update": update,
        "exchange_seconds_per_update": plan["allreduce_seconds"],
    }
