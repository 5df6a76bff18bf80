"""The recipe race over seeds (run/recipe_race.py --seeds): each recipe's figures as a mean with its
standard deviation and standard error over the seeds, and the time one recipe takes to reach
another's final accuracy, seed k against seed k, so a difference can be read against the noise of
one seed."""

from __future__ import annotations

import json
import os
from typing import Callable

from bert_tf import ConfigError
from bert_tf.studies.arm_size import SIZE_KEYS, size_line
from bert_tf.studies.recipe_race import plot, summarize


def spread(values: list) -> dict:
    """mean, sample standard deviation, standard error, min, max and count of `values` (Nones
    dropped: a seed that never reached)."""
    import statistics

    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"n": 0, "mean": None}
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "sd": sd,
        "se": sd / len(xs) ** 0.5,
        "min": min(xs),
        "max": max(xs),
    }


EMULATED = {
    "bytes_per_update": lambda r: r.get("bytes_per_update"),
    "planned_bytes_per_update": lambda r: r.get("planner", {}).get("predicted_wire_bytes"),
    "planner_error": lambda r: r.get("planner", {}).get("error"),
    "scaling_efficiency": lambda r: r.get("planner", {}).get("scaling_efficiency"),
}


def summarize_seeds(runs: dict, target: float = 0.0) -> dict:
    """{name: [curve of seed 1, seed 2, ...]} (the same seeds, in the same order, for every recipe)
    -> each recipe's figures as `spread`s over the seeds; the time to reach another recipe's final
    accuracy pairs seed k with seed k (`reached`: on how many seeds it did)."""
    counts = {len(curves) for curves in runs.values()}
    if len(counts) != 1:
        raise ConfigError(f"every recipe needs the same seeds: {len(counts)} different counts")
    per_seed = [
        summarize({name: curves[k] for name, curves in runs.items()}, target)
        for k in range(counts.pop())
    ]
    out = {}
    for name in runs:
        rows = [s[name] for s in per_seed]
        row = {
            key: spread([r[key] for r in rows])
            for key in (
                "final_accuracy",
                "seconds",
                "steps",
                "sequences",
                "instances",
                "tokens",
                "sequences_per_second",
            )
        }
        # emulated cluster: what rank 0's node sent, the planner against the measured speed
        for key, read in EMULATED.items():
            values = [read(r) for r in rows]
            if any(v is not None for v in values):
                row[key] = spread(values)
        if target:
            row["target"] = {"accuracy": target, **spread([r["target"]["seconds"] for r in rows])}
        row["reaches"] = {
            other: {
                "seconds": spread([r["reaches"][other]["seconds"] for r in rows]),
                "fraction_of_their_time": spread(
                    [r["reaches"][other]["fraction_of_their_time"] for r in rows]
                ),
                "reached": sum(r["reaches"][other]["seconds"] is not None for r in rows),
            }
            for other in rows[0]["reaches"]
        }
        # the same model on every seed
        row.update({key: rows[0][key] for key in SIZE_KEYS if key in rows[0]})
        out[name] = {"seeds": len(rows), **row}
    return out


def machines(runs: dict) -> list:
    """The machines {name: [curve, ...]} ran on (curve's "device", the run record's), each once;
    runs from before the run record held it are left out."""
    seen = {
        json.dumps(c["device"], sort_keys=True)
        for cs in runs.values()
        for c in cs
        if c.get("device")
    }
    return sorted(seen)


def describe_machine(device: dict) -> str:
    """A device_description() as a title's words: the CPU, its cores and the arithmetic it has."""
    if "gpus" in device:
        return ", ".join(device["gpus"])
    return (
        f"{device.get('cpu', '?')} ({device.get('cpu_count', '?')} cores; "
        f"{', '.join(device.get('cpu_features', []))})"
    )


def ran_on(runs: dict, here: Callable[[], dict]) -> str:
    """Where {name: [curve, ...]} ran, for a plot's title: their machine, or how many there were;
    runs from before run records named it are taken as run here (`here()`: this machine's)."""
    found = machines(runs)
    if len(found) > 1:
        return f"{len(found)} different machines (their minutes do not compare)"
    return describe_machine(json.loads(found[0]) if found else here())


def describe_seeds(summary: dict) -> list:
    """summarize_seeds' lines: mean ± standard deviation (standard error) over the seeds."""

    def pm(s, scale=1.0, fmt=".4f"):
        if s["mean"] is None:
            return "never"
        return f"{s['mean'] / scale:{fmt}} ± {s['sd'] / scale:{fmt}} (s.e. {s['se'] / scale:{fmt}})"

    lines = []
    for name, row in summary.items():
        seeds = f"{row['seeds']} seed{'s' * (row['seeds'] != 1)}"
        lines.append(
            f"{name}: final held-out MLM accuracy {pm(row['final_accuracy'])} over "
            f"{seeds}, after {pm(row['seconds'], 60, '.1f')} min"
        )
        lines += size_line(row)
        if "bytes_per_update" in row:
            planned = row.get("planned_bytes_per_update")
            lines.append(
                f"  {pm(row['bytes_per_update'], 1e6, '.2f')} MB sent per update by rank 0's node"
                + (f" (the planner: {pm(planned, 1e6, '.2f')})" if planned else "")
            )
        if "planner_error" in row:
            lines.append(
                f"  planner {pm(row['planner_error'], 0.01, '.0f')} % off the measured speed; "
                f"scaling efficiency {pm(row['scaling_efficiency'], 0.01, '.0f')} %"
            )
        for other, r in row["reaches"].items():
            if not r["reached"]:
                lines.append(f"  never reaches {other}'s final (0/{row['seeds']} seeds)")
                continue
            lines.append(
                f"  reaches {other}'s final in {pm(r['seconds'], 60, '.1f')} min on "
                f"{r['reached']}/{row['seeds']} seeds ({pm(r['fraction_of_their_time'], 1, '.2f')}"
                f" of {other}'s time)"
            )
    return lines


def write_report(runs: dict, seeds: list, out_dir: str, title: str, target: float = 0.0) -> dict:
    """race.json (every seed's curve and the summary over seeds) and race.png (every seed's curve)
    in out_dir; returns the summary. runs: {name: [curve of each of `seeds`]}."""
    summary = summarize_seeds(runs, target)
    with open(os.path.join(out_dir, "race.json"), "w") as f:
        json.dump({"title": title, "summary_over_seeds": summary, "curves": runs}, f, indent=1)
    # each curve labelled with its seed (--seeds=2 alone is "seed 2", not the first)
    flat = {
        f"{name} seed {k}": curve
        for name, curves in runs.items()
        for k, curve in zip(seeds, curves)
    }
    plot(flat, os.path.join(out_dir, "race.png"), title)
    return summary
