"""The recipe race: pre-training recipes run one after another on the same machine, same data and
vocabulary, each scored on the same held-out records; their held-out MLM accuracy against wall-clock
time, and the time each takes to reach the others' final accuracy (run/recipe_race.py).

Time is wall-clock from the run record (written when the model is built and restored, before the
first update, so compilation counts) to each evaluation, evaluations included: what a user pays for.
A recipe "reaches" an accuracy where its curve first crosses it, linear between the evaluations on
either side (first_reach).
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap

from bert_tf import ConfigError, knob, knobs
from bert_tf.artifacts import metrics
from bert_tf.studies import race_sweep
from bert_tf.studies.arm_size import SIZE_KEYS, model_size, size_line


@dataclasses.dataclass(frozen=True)
class RaceConfig:
    """run/recipe_race.py's flags; constructing one checks their ranges."""

    recipes: list[str] | None = knob(
        None, "name=flagfile pairs, comma-separated, raced in this order.", required=True
    )
    output_dir: str | None = knobs.output_dir(
        "a folder per recipe, race.json and race.png", required=True
    )
    ranks: int = knob(2, "Processes per recipe on this machine.")
    report_only: bool = knob(False, "Only the report, from runs already in --output_dir.")
    time_budget_hours: float = knob(
        0.0, "Override every recipe's --time_budget_hours (0: each flagfile's own)."
    )
    title: str = knob("", "The plot's title (default: the recipes and this machine's CPU).")
    pretrain_flag: list[str] = knob(
        [],
        "A flag for every recipe's run/pretrain.py, e.g. --pretrain_flag=--seed=2 (repeat it for "
        "more).",
        multi=True,
    )
    nodes: int = knob(
        0,
        "Race on this many emulated nodes, one rank each, joined by shaped links "
        "(bert_tf/studies/emulated_cluster.py; root); 0: --ranks processes on this machine.",
    )
    link_gbit: float = knob(1.0, "--nodes: each node's link rate, Gbit/s.")
    target_accuracy: float = knob(
        0.0, "Also report when each recipe first reaches this held-out MLM accuracy."
    )
    sweep_learning_rates: list[float] | None = knob(
        None,
        "Sweep mode instead of a race: every recipe at each of these rates (at least 5 spanning "
        "30x), each --sweep_warmup_steps and its --sweep_optimizers, under the same "
        "--time_budget_hours, into <output_dir>/<name>/sweep/<setting>; writes sweep.json and "
        "<name>.best.flags for the race (bert_tf/studies/race_sweep.py).",
    )
    sweep_warmup_steps: list[int] | None = knob(
        None, "Sweep mode: the warmup lengths to try, in updates of the recipe's --total_steps."
    )
    sweep_updates: int = knob(
        0,
        "Sweep mode: score every setting after this many updates instead of under "
        "--time_budget_hours, the recipe's schedule kept in shape (its warmup and batch warmup "
        "scaled by sweep_updates / --total_steps). Equal updates do not depend on the machine, so "
        "a sweep may span sessions: a setting whose run already got there is not run again.",
    )
    sweep_optimizers: list[str] | None = knob(
        None, "Sweep mode: name=optimizer+optimizer pairs, e.g. classic=lamb+adamw."
    )
    link_for_efficiency: float = knob(
        0.0,
        "Instead of a race: the --link_gbit at which each recipe's finished run in --output_dir "
        "(one on this machine's ranks, no links, is enough) would have this scaling efficiency on "
        "--nodes emulated nodes, by the planner fed its own speed (studies/race_planner.py).",
    )
    link_probe: str = knob(
        "", "--link_for_efficiency: a race's link.json (its probe), made at --link_gbit."
    )
    seeds: list[int] | None = knob(
        None,
        "Run every recipe once per seed (--seed=k, into <output_dir>/<name>/seed<k>); the report "
        "gives each figure's mean, standard deviation and standard error over the seeds, and the "
        "time to reach another recipe's final accuracy seed by seed.",
    )

    def __post_init__(self):
        for name, low in (
            ("time_budget_hours", 0),
            ("nodes", 0),
            ("link_gbit", 0.001),
            ("target_accuracy", 0),
            ("sweep_updates", 0),
        ):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name} must be >= {low}, got {getattr(self, name)}")
        race_sweep.check(
            self.sweep_learning_rates,
            self.sweep_warmup_steps,
            self.sweep_optimizers,
            self.time_budget_hours,
            updates=self.sweep_updates,
        )
        if self.sweep_learning_rates and (self.nodes or self.seeds):
            raise ConfigError(
                "--sweep_learning_rates runs on this machine with one seed: no --nodes, no --seeds"
            )
        if self.link_for_efficiency and not (0 < self.link_for_efficiency < 1 and self.nodes > 1):
            raise ConfigError(
                f"--link_for_efficiency={self.link_for_efficiency:g} needs a value in (0, 1) and "
                f"--nodes of at least 2, got --nodes={self.nodes}"
            )
        if self.link_probe and not self.link_for_efficiency:
            raise ConfigError("--link_probe is read by --link_for_efficiency only: give both")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"--seeds={','.join(map(str, self.seeds))}: a seed given twice")

    def run_dirs(self, name: str) -> list[str]:
        """A recipe's run folders: <output_dir>/<name>, or one per seed."""
        base = os.path.join(self.output_dir or "", name)
        return [base] if not self.seeds else [os.path.join(base, f"seed{k}") for k in self.seeds]

    def runs(self, recipes: dict[str, str]) -> list[tuple[str, str, int | None, str]]:
        """(name, flagfile, seed, run folder) in the order the race runs them: seed by seed, every
        recipe in each, so a session that ends mid-race leaves whole seeds, and the recipes a seed
        compares ran on one machine."""
        return [
            (name, path, k, self.run_dirs(name)[i])
            for i, k in enumerate(self.seeds or [None])
            for name, path in recipes.items()
        ]


def read_flagfile(path: str, root: str = ".") -> dict:
    """A flagfile's --name=value lines as {name: value}, following nested --flagfile= lines
    (relative to `root`, where the race runs) in order, so a later line overrides an earlier one as
    absl does."""
    values = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise ConfigError(f"flagfile {path}: {e.strerror}") from e
    for line in map(str.strip, lines):
        if not line.startswith("--"):
            continue
        name, _, value = line[2:].partition("=")
        if name == "flagfile":
            values.update(read_flagfile(os.path.join(root, value), root))
        else:
            values[name] = value
    return values


def curve(run_dir: str) -> dict:
    """A finished run's evaluations: {"seconds", "step", "samples_seen", "accuracy", "loss"} lists,
    its sequences per second (the mean of its logged intervals) and the CPU it ran on."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise ConfigError(f"{path} not found: the recipe {os.path.basename(run_dir)!r} has not run")
    records = metrics.read_metrics(path)
    runs = [r for r in records if r.get("kind") == "run"]
    if not runs:
        raise ConfigError(f"{path} holds no run record")
    t0 = runs[0]["time"]
    keys = ("seconds", "step", "samples_seen", "instances", "tokens", "accuracy", "loss")
    out: dict = {key: [] for key in keys}
    train = [r for r in records if r.get("kind") == "train"]
    seen = trained_counts(train)
    for r in records:
        if r.get("kind") == "eval" and "eval_mlm_accuracy" in r:
            at = seen.get(r["step"]) or seen[max(k for k in seen if k <= r["step"])]
            out["seconds"].append(r["time"] - t0)
            out["step"].append(r["step"])
            for key, value in zip(("samples_seen", "instances", "tokens"), at):
                out[key].append(value)
            out["accuracy"].append(r["eval_mlm_accuracy"])
            out["loss"].append(r.get("eval_mlm_loss", float("nan")))
    if not out["accuracy"]:
        raise ConfigError(
            f"{path} holds no held-out evaluation: run the recipe with --eval_files and "
            "--eval_interval"
        )
    rates = [r["sequences_per_second"] for r in train if "sequences_per_second" in r]
    out["sequences_per_second"] = (
        sum(rates[1:]) / max(len(rates) - 1, 1) if len(rates) > 1 else (rates or [0])[0]
    )
    out.update(model_size(run_dir, runs[0]))
    out["device"] = runs[0].get("device")  # since 2026-12-07
    sent = [r["tx_bytes_per_update"] for r in train[1:] if "tx_bytes_per_update" in r]
    if sent:  # --network_interface: what rank 0's node sent, evaluations included
        out["bytes_per_update"] = sum(sent) / len(sent)
    return out


def trained_counts(train: list) -> dict:
    """{step: (rows, instances, tokens) trained on up to it} from the train records: rows from
    samples_seen, an interval's instances and non-padding tokens from its rows by the ratio of its
    rates (a packed row holds several instances; a row without instances_per_second holds one, one
    without useful_tokens_per_second counts its padding)."""
    counts, rows, instances, tokens = {0: (0, 0.0, 0.0)}, 0, 0.0, 0.0
    for r in train:
        new = r.get("samples_seen", rows) - rows
        rate = r.get("sequences_per_second") or 0.0
        per_row = r.get("instances_per_second", rate) / rate if rate else 1.0
        tokens_per_row = r.get("useful_tokens_per_second", r.get("tokens_per_second", 0.0))
        rows, instances = rows + new, instances + new * per_row
        tokens += new * (tokens_per_row / rate if rate else 0.0)
        counts[r["step"]] = (rows, round(instances, 1), round(tokens))
    return counts


def first_reach(run: dict, accuracy: float):
    """(seconds, updates) when the curve first reaches `accuracy`, or (None, None): linear between
    the evaluation before and the first one at or above it (read off the grid, a recipe evaluated
    every 2 minutes could only gain or lose whole intervals); at the first evaluation when that one
    is already above it (nothing before it to interpolate from)."""
    points = list(zip(run["seconds"], run["step"], run["accuracy"]))
    for i, (s, n, a) in enumerate(points):
        if a < accuracy:
            continue
        if i == 0 or a == accuracy:
            return s, n
        s0, n0, a0 = points[i - 1]
        share = (accuracy - a0) / (a - a0)
        return s0 + share * (s - s0), n0 + share * (n - n0)
    return None, None


def time_to_reach(run: dict, accuracy: float):
    """Seconds to the first evaluation at or above `accuracy`, or None."""
    return first_reach(run, accuracy)[0]


def summarize(runs: dict, target: float = 0.0) -> dict:
    """{name: curve} -> each recipe's final figures, the time it takes to reach every other's final
    accuracy and (`target`) the time to that accuracy."""
    summary = {}
    for name, run in runs.items():
        row = {
            "final_accuracy": run["accuracy"][-1],
            "seconds": run["seconds"][-1],
            "steps": run["step"][-1],
            "sequences": run["samples_seen"][-1],
            "instances": run["instances"][-1],
            "tokens": run["tokens"][-1],
            "sequences_per_second": run["sequences_per_second"],
            "reaches": {},
        }
        row.update({key: run[key] for key in ("bytes_per_update", "planner") if key in run})
        row.update({key: run[key] for key in SIZE_KEYS if key in run})
        if target:
            row["target"] = {"accuracy": target, "seconds": time_to_reach(run, target)}
        for other, theirs in runs.items():
            if other != name:
                reached, updates = first_reach(run, theirs["accuracy"][-1])
                # update_factor: the updates it took over theirs (the planner's
                # MEASURED_UPDATE_FACTORS)
                row["reaches"][other] = {
                    "accuracy": theirs["accuracy"][-1],
                    "seconds": reached,
                    "updates": updates,
                    "fraction_of_their_time": reached / theirs["seconds"][-1] if reached else None,
                    "update_factor": updates / theirs["step"][-1] if reached else None,
                }
        summary[name] = row
    return summary


def plot(runs: dict, path: str, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # left: at equal sequences (rows trained on, whatever the batch schedule); right: wall-clock
    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, run in runs.items():
        style = {"marker": "o", "markersize": 3, "label": name}
        by_update.plot([n / 1e3 for n in run["samples_seen"]], run["accuracy"], **style)
        by_time.plot([s / 60 for s in run["seconds"]], run["accuracy"], **style)
    by_update.set_xlabel("thousand sequences trained on (all ranks)")
    by_time.set_xlabel("wall-clock minutes (start-up, compilation and evaluations included)")
    by_update.set_ylabel("held-out MLM accuracy (the same 15% masks)")
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=9)  # several recipes and a CPU
    for ax in (by_update, by_time):
        ax.grid(alpha=0.3)
    by_time.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(runs: dict, out_dir: str, title: str, target: float = 0.0) -> dict:
    """race.json (curves and summary) and race.png in out_dir; returns the summary."""
    summary = summarize(runs, target)
    with open(os.path.join(out_dir, "race.json"), "w") as f:
        json.dump({"title": title, "summary": summary, "curves": runs}, f, indent=1)
    plot(runs, os.path.join(out_dir, "race.png"), title)
    return summary


def describe(summary: dict) -> list:
    """Lines for the console and docs/results.md."""
    lines = []
    for name, row in summary.items():
        lines.append(
            f"{name}: final held-out MLM accuracy {row['final_accuracy']:.4f} after "
            f"{row['seconds'] / 60:.1f} min ({row['steps']} updates, {row['sequences']:,} "
            f"sequences (rows) = {row['instances']:,.0f} instances and {row['tokens']:,} tokens, "
            f"{row['sequences_per_second']:.1f} seq/s)"
        )
        lines += size_line(row)
        if "bytes_per_update" in row:
            planned = row.get("planner", {}).get("predicted_wire_bytes")
            lines.append(
                f"  {row['bytes_per_update'] / 1e6:.2f} MB sent per update by rank 0's node"
                + (f" (the planner: {planned / 1e6:.2f})" if planned is not None else "")
            )
        if "planner" in row:
            p = row["planner"]
            lines.append(
                f"  planner: {p['predicted_sequences_per_second']:.1f} seq/s against "
                f"{p['measured']:.1f} measured between evaluations ({p['error']:+.0%}; compute "
                f"{p['device_seq_s']:.1f} seq/s per rank, measured; scaling efficiency "
                f"{p['scaling_efficiency']:.0%})"
            )
        if "target" in row:
            seconds = row["target"]["seconds"]
            lines.append(
                f"  reaches {row['target']['accuracy']:.4f} "
                f"{f'in {seconds / 60:.1f} min' if seconds else 'never'}"
            )
        for other, r in row["reaches"].items():
            when = (
                f"in {r['seconds'] / 60:.1f} min ({r['fraction_of_their_time']:.2f} of {other}'s "
                f"time), after {r['updates']:.0f} updates (x{r['update_factor']:.2f} {other}'s)"
                if r["seconds"]
                else "never"
            )
            lines.append(f"  reaches {other}'s final {r['accuracy']:.4f} {when}")
    return lines
