"""The recipe race's sweep mode (run/recipe_race.py --sweep_learning_rates=...): before two recipes
are raced, each gets the same tuning effort. Every recipe runs at every learning rate, every
warmup length and, where given, every optimizer of its own, all under the same
--time_budget_hours, or all for the same --sweep_updates. Each setting is scored by its final
held-out MLM accuracy at that budget (its held-out loss breaks a tie, as on the unigram plateau).
The best setting of each recipe is written as a flagfile, <output_dir>/<name>.best.flags (its
flagfile, then the setting), for the race that follows. A baseline raced at a rate nobody tuned
says little about the recipe that beats it."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil

from bert_tf import ConfigError
from bert_tf.artifacts import metrics

# a sweep this narrow cannot tell a good rate from a lucky one (issue 49: at least 5 rates over 30x)
MIN_RATES, MIN_SPAN = 5, 30.0


def check(rates, warmups, optimizers, budget_hours, recipes=None, updates=0):
    """Start-up checks of the sweep's flags; optimizers: ["name=opt+opt", ...]."""
    if not rates:
        if warmups or optimizers or updates:
            raise ConfigError(
                "--sweep_warmup_steps, --sweep_optimizers and --sweep_updates need "
                "--sweep_learning_rates"
            )
        return
    if len(set(rates)) < MIN_RATES or max(rates) / min(rates) < MIN_SPAN or min(rates) <= 0:
        raise ConfigError(
            f"--sweep_learning_rates={','.join(f'{r:g}' for r in rates)}: give at least "
            f"{MIN_RATES} different positive rates spanning at least {MIN_SPAN:g}x"
        )
    if bool(budget_hours) == bool(updates):
        raise ConfigError(
            "--sweep_learning_rates needs one budget, --time_budget_hours or --sweep_updates: "
            f"every setting is scored at the same one (given {budget_hours:g} h and {updates} "
            "updates)"
        )
    for name in per_recipe_optimizers(optimizers):
        if recipes is not None and name not in recipes:
            raise ConfigError(
                f"--sweep_optimizers: {name!r} is not one of --recipes ({', '.join(recipes)})"
            )


def per_recipe_optimizers(pairs) -> dict:
    """["classic=lamb+adamw", ...] -> {"classic": ["lamb", "adamw"]}."""
    out = {}
    for pair in pairs or []:
        name, sep, kinds = pair.partition("=")
        if not sep or not name or not kinds:
            raise ConfigError(f"--sweep_optimizers: {pair!r} is not name=optimizer+optimizer")
        out[name] = kinds.split("+")
    return out


def settings(name: str, rates, warmups, optimizers) -> list[dict]:
    """A recipe's settings, each {flag: value}: every rate x warmup x its optimizers."""
    kinds = per_recipe_optimizers(optimizers).get(name, [None])
    out = []
    for rate, warmup, kind in itertools.product(rates, warmups or [None], kinds):
        setting = {"learning_rate": rate}
        if warmup is not None:
            setting["warmup_steps"] = warmup
        if kind is not None:
            setting["optimizer"] = kind
        out.append(setting)
    return out


def label(setting: dict) -> str:
    """A setting's folder name and label, e.g. "learning_rate=0.001,warmup_steps=50"."""
    return ",".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items()
    )


def flags(setting: dict) -> list[str]:
    return [f"--{k}={v}" for k, v in setting.items()]


def scaled(recipe: dict, setting: dict, updates: int) -> dict:
    """--sweep_updates: `setting` run for `updates` updates in the shape of the recipe's schedule
    (recipe: its flagfile's {flag: value}). Its --total_steps become `updates`, its warmup (the
    setting's or its own) and batch warmup shrink by the same factor, and no time budget stretches
    them. The best setting is written unscaled, for the race's own --total_steps."""
    total = int(recipe.get("total_steps") or 0)
    if total <= 0:
        raise ConfigError("--sweep_updates: the recipe's flagfile sets no --total_steps to scale")
    out = {**setting, "total_steps": updates, "time_budget_hours": 0}
    for name in ("warmup_steps", "batch_warmup_sequences"):
        value = int(setting.get(name, recipe.get(name)) or 0)
        if value:
            out[name] = max(1, round(value * updates / total))
    return out


def finished(run_dir: str, updates: int, set_aside: bool = True) -> bool:
    """Whether a setting's run reached `updates` (its last held-out evaluation); an unfinished one
    (a session that ended mid-run) is moved to <run_dir>.interrupted to be run again whole, unless
    not set_aside (a report)."""
    # a run killed mid-write may end in half a line: read as a growing file
    records = metrics.read_metrics(os.path.join(run_dir, "metrics.jsonl"), growing=True)
    steps = [0] + [r["step"] for r in records if r.get("kind") == "eval"]
    if max(steps) >= updates:
        return True
    if set_aside:
        move_aside(run_dir)
    return False


def move_aside(run_dir: str) -> None:
    """A run cut short, moved to <run_dir>.interrupted (replacing an older one) to run again."""
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir + ".interrupted", ignore_errors=True)
        os.rename(run_dir, run_dir + ".interrupted")


FINALISTS = 2  # per recipe: the same second-stage effort for each


def finalists(rows: list) -> list:
    """A recipe's FINALISTS settings for the second stage, from `rows` best first: the best of each
    optimizer it swept (classic: LAMB and AdamW), then its next best; a diverged setting (loss or
    accuracy not a number) only if nothing else is left. A short sweep ranks settings by where
    they stand after its budget; the finalists are raced again at the race's own length
    (docs/pretraining.md), so a rate that only starts slowly is not dropped on the first figure."""
    sound = [
        r for r in rows if math.isfinite(r["final_loss"]) and math.isfinite(r["final_accuracy"])
    ]
    ordered = sound + [r for r in rows if r not in sound]
    picked: list = []
    for optimizer in dict.fromkeys(r["setting"].get("optimizer") for r in sound):
        picked.append(next(r for r in sound if r["setting"].get("optimizer") == optimizer))
    picked += [r for r in ordered if r not in picked]
    return picked[:FINALISTS]


def report(scores: dict, recipes: dict, out_dir: str) -> dict:
    """scores: {name: {label: (setting, curve)}} -> sweep.json (every setting's final accuracy, best
    first), <name>.best.flags and <name>.finalist<k>.flags for each recipe; returns {name: rows
    best first}."""
    table = {}
    for name, runs in scores.items():
        if not runs:  # --report_only part-way through a sweep: nothing of this recipe has run
            continue
        rows = [
            {
                "setting": setting,
                "label": key,
                "final_accuracy": curve["accuracy"][-1],
                "final_loss": curve["loss"][-1],
                "steps": curve["step"][-1],
                "seconds": curve["seconds"][-1],
            }
            for key, (setting, curve) in runs.items()
        ]
        # a tie in accuracy (the unigram plateau) is broken by the held-out loss; a diverged run
        # (its loss not a number) goes last
        table[name] = sorted(
            rows,
            key=lambda r: (
                -r["final_accuracy"] if math.isfinite(r["final_accuracy"]) else math.inf,
                r["final_loss"] if math.isfinite(r["final_loss"]) else math.inf,
            ),
        )
        picks = [("best", table[name][0])]
        picks += [(f"finalist{k}", row) for k, row in enumerate(finalists(table[name]), 1)]
        for kind, row in picks:
            with open(os.path.join(out_dir, f"{name}.{kind}.flags"), "w") as f:
                f.write(
                    f"# {kind} of {len(rows)} settings (run/recipe_race.py's sweep, sweep.json)\n"
                )
                f.write(
                    "\n".join(
                        [f"--flagfile={os.path.abspath(recipes[name])}", *flags(row["setting"])]
                    )
                    + "\n"
                )
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump(table, f, indent=1)
    return table


def describe(table: dict) -> list:
    lines = []
    for name, rows in table.items():
        lines.append(
            f"{name}: {len(rows)} settings, best first (final held-out MLM accuracy, loss)"
        )
        lines += [
            f"  {r['final_accuracy']:.4f}  {r['final_loss']:.3f}  {r['label']}  "
            f"({r['steps']} updates, {r['seconds'] / 60:.1f} min)"
            for r in rows
        ]
        lines.append(
            f"  finalists ({name}.finalist<k>.flags): "
            + "; ".join(r["label"] for r in finalists(rows))
        )
    return lines


def plot(table: dict, path: str, title: str):
    """sweep.png: each setting's final held-out loss and accuracy against its learning rate, a line
    per recipe, optimizer and warmup (a tuned baseline shows its optimum inside the rates swept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_loss, by_accuracy) = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    lines: dict = {}
    for name, rows in table.items():
        for r in rows:
            s = r["setting"]
            rest = [f"{k} {v}" for k, v in s.items() if k != "learning_rate"]
            key = " ".join([name, *rest])
            lines.setdefault(key, []).append(
                (s["learning_rate"], r["final_loss"], r["final_accuracy"])
            )
    for key, points in sorted(lines.items()):
        points.sort()
        rates = [p[0] for p in points]
        style = {"marker": "o", "markersize": 4, "label": key}
        by_loss.plot(rates, [p[1] for p in points], **style)  # a diverged run's NaN leaves a gap
        by_accuracy.plot(rates, [p[2] for p in points], **style)
    by_loss.set_ylabel("final held-out MLM loss")
    by_accuracy.set_ylabel("final held-out MLM accuracy")
    rates = sorted({p[0] for points in lines.values() for p in points})
    for ax in (by_loss, by_accuracy):
        ax.set_xscale("log")
        ax.minorticks_off()  # the rates swept as the ticks: log-scale minor labels overlap
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3)
    if lines:
        by_accuracy.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
