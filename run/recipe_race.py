"""The recipe race: pre-training recipes side by side on this machine, held-out MLM accuracy against
wall-clock time (bert_tf/studies/recipe_race.py):

    python run/recipe_race.py \
        --recipes=classic=configs/race_classic.flags,budget=configs/race_budget.flags \
        --output_dir=runs/race

runs each recipe (mpirun -np --ranks run/pretrain.py --flagfile=...) into <output_dir>/<name>, one
after the other, then writes <output_dir>/race.json and race.png and prints each recipe's final
accuracy and the time it takes to reach every other's. --report_only redraws from finished runs. The
recipes must evaluate on the same held-out records (--eval_files, --eval_batches) for the comparison
to mean anything; the race checks that they name the same files.

On an emulated cluster (--nodes, one rank per node, links shaped to --link_gbit; root), the same
race compares ways of exchanging gradients (issue 40; configs/comm_race_*.flags):

    python run/recipe_race.py --nodes=2 --link_gbit=0.1 --target_accuracy=0.085 \
        --output_dir=runs/comm_race2 \
        --recipes=fp16=configs/comm_race_fp16.flags,powersgd=configs/comm_race_powersgd.flags,onebit=configs/comm_race_onebit.flags,diloco=configs/comm_race_diloco.flags

and adds per recipe the bytes rank 0's node sent per update and the planner's prediction of its
speed (fed the run's own compute speed) against the speed measured between evaluations.

--sweep_learning_rates=... (with --sweep_warmup_steps, --sweep_optimizers=classic=lamb+adamw and
--time_budget_hours or --sweep_updates) tunes each recipe with the same effort first and writes
<name>.best.flags for the race (bert_tf/studies/race_sweep.py). With --sweep_updates a sweep stopped
part-way goes on where it stopped when run again.

--link_for_efficiency=0.25 --nodes=4 reports, for each recipe's finished run in --output_dir (a
run on this machine's ranks is enough), the --link_gbit at which its exchange leaves 25% scaling
efficiency on 4 emulated nodes (bert_tf/studies/race_planner.py), with --link_probe=<a race's
link.json> made at --link_gbit to carry that link's measured bandwidth ratio and per-message cost
over:

    python run/recipe_race.py --ranks=4 --pretrain_flag=--total_steps=40 --output_dir=runs/alone \
        --recipes=fp16=configs/comm47_fp16.flags
    python run/recipe_race.py --link_for_efficiency=0.25 --nodes=4 --link_gbit=0.1 \
        --link_probe=docs/runs/comm47/link.json --output_dir=runs/alone \
        --recipes=fp16=configs/comm47_fp16.flags

--seeds=1,2,3 runs every recipe once per seed (<output_dir>/<name>/seed<k>) and reports each
figure's mean, standard deviation and standard error over the seeds (bert_tf/studies/race_seeds.py).
"""

import contextlib
import json
import os
import sys

from bert_tf import ConfigError, cli
from bert_tf.studies.recipe_race import RaceConfig

cli.define_config_flags(RaceConfig)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_recipes(pairs):
    recipes = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--recipes: {pair!r} is not name=flagfile")
        if not os.path.isfile(path):
            raise ConfigError(f"--recipes: {name}'s flagfile {path} not found")
        recipes[name] = path
    return recipes


def race_on(cfg, recipes):
    """Runs the recipes (unless --report_only); with --nodes on an emulated cluster, then probes its
    link once (the planner's measured bandwidth and per-message cost, as the communication study
    does) into link.json, which it returns."""
    from bert_tf.studies import comm_study, emulated_cluster, race_launch

    extra = [f"--time_budget_hours={cfg.time_budget_hours}"] if cfg.time_budget_hours else []
    extra += cfg.pretrain_flag + (["--network_interface=eth0"] if cfg.nodes else [])
    link_path = os.path.join(cfg.output_dir, "link.json")
    if not cfg.nodes:
        cluster = contextlib.nullcontext()
    elif cfg.report_only and os.path.exists(link_path):
        return json.load(open(link_path))
    else:
        cluster = emulated_cluster.EmulatedCluster(cfg.nodes, cfg.link_gbit)
    with cluster:
        mpirun = cluster.mpirun_prefix(cfg.nodes) if cfg.nodes else None
        for name, path, k, run_dir in cfg.runs(recipes) if not cfg.report_only else ():
            if not race_launch.to_run(run_dir):
                print(f"{run_dir}: finished earlier, not run again", flush=True)
                continue
            race_launch.launch(
                os.path.abspath(path),
                os.path.abspath(run_dir),
                cfg.nodes or cfg.ranks,
                extra + ([] if k is None else [f"--seed={k}"]),
                mpirun=mpirun,
            )
        if not cfg.nodes:
            return None
        probe = [sys.executable, os.path.join(REPO, "run", "comm_study.py"), "--probe"]
        link = comm_study.run_probe(
            cluster, cfg.nodes, probe, os.path.join(cfg.output_dir, "probe.txt"), 1200
        )
    with open(link_path, "w") as f:
        json.dump(link, f)
    print(
        f"link probe, {cfg.nodes} nodes at {cfg.link_gbit:g} Gbit/s: {json.dumps(link)}", flush=True
    )
    return link


def report_links(cfg, recipes):
    """--link_for_efficiency: the link each finished run's exchange needs for that efficiency."""
    from bert_tf.studies import race_planner

    link = None
    if cfg.link_probe:
        try:
            link = json.load(open(cfg.link_probe))
        except (OSError, ValueError) as e:
            raise ConfigError(f"--link_probe={cfg.link_probe}: {e}") from None
    for name in recipes:
        for run_dir in cfg.run_dirs(name):
            if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                raise ConfigError(f"{run_dir}: no finished run (metrics.jsonl) to measure")
            got = race_planner.link_for_efficiency(
                run_dir, cfg.nodes, cfg.link_for_efficiency, link, cfg.link_gbit if link else 0.0
            )
            print(
                f"{run_dir}: {got['scaling_efficiency']:.0%} scaling efficiency on {cfg.nodes} "
                f"nodes at --link_gbit={got['link_gbit']:.3g} (effective "
                f"{got['effective_gbit']:.3g} Gbit/s); per rank {got['device_seq_s']:.2f} seq/s "
                "without communication: an "
                f"update computes in {got['compute_seconds_per_update']:.1f} s and exchanges in "
                f"{got['exchange_seconds_per_update']:.1f} s",
                flush=True,
            )


def this_machine() -> dict:
    from bert_tf.parallel import device

    return device.device_description()


def sweep(cfg, recipes):
    """Sweep mode: every recipe's settings run (unless --report_only), then sweep.json and each
    recipe's best flagfile."""
    from bert_tf.studies import race_launch, race_sweep, recipe_race

    race_sweep.check(
        cfg.sweep_learning_rates,
        cfg.sweep_warmup_steps,
        cfg.sweep_optimizers,
        cfg.time_budget_hours,
        recipes,
        updates=cfg.sweep_updates,
    )
    scores, missing = {}, []
    for name, path in recipes.items():
        scores[name] = {}
        recipe = recipe_race.read_flagfile(path, REPO)
        for setting in race_sweep.settings(
            name, cfg.sweep_learning_rates, cfg.sweep_warmup_steps, cfg.sweep_optimizers
        ):
            key = race_sweep.label(setting)
            run_dir = os.path.join(cfg.output_dir, name, "sweep", key)
            if cfg.sweep_updates:
                run = race_sweep.scaled(recipe, setting, cfg.sweep_updates)
            else:
                run = {**setting, "time_budget_hours": cfg.time_budget_hours}
            if (
                cfg.report_only
                and cfg.sweep_updates
                and not race_sweep.finished(run_dir, cfg.sweep_updates, set_aside=False)
            ):
                missing.append(f"{name}/{key}")  # a sweep part-way: report what has finished
                continue
            if not cfg.report_only and not (
                cfg.sweep_updates and race_sweep.finished(run_dir, cfg.sweep_updates)
            ):
                race_launch.launch(
                    os.path.abspath(path),
                    os.path.abspath(run_dir),
                    cfg.ranks,
                    cfg.pretrain_flag + race_sweep.flags(run),
                )
            scores[name][key] = (setting, recipe_race.curve(run_dir))
    report_sweep(cfg, scores, recipes, missing)


def report_sweep(cfg, scores, recipes, missing):
    """sweep.json, the flagfiles and sweep.png from the settings run so far; the rest named."""
    from bert_tf.studies import race_seeds, race_sweep

    table = race_sweep.report(scores, recipes, cfg.output_dir)
    print("\n".join(race_sweep.describe(table)))
    budget = (
        f"{cfg.sweep_updates} updates each"
        if cfg.sweep_updates
        else f"{cfg.time_budget_hours} h each"
    )
    curves = {name: [curve for _, curve in runs.values()] for name, runs in scores.items()}
    where = race_seeds.ran_on(curves, this_machine)
    race_sweep.plot(
        table,
        os.path.join(cfg.output_dir, "sweep.png"),
        f"recipe race sweep, {budget}, {cfg.ranks} ranks on {where}",
    )
    if missing:
        print(f"not yet run ({len(missing)}): {', '.join(missing)}")
    print(
        f"wrote {os.path.join(cfg.output_dir, 'sweep.json')}, sweep.png, <name>.best.flags and "
        "<name>.finalist<k>.flags"
    )


def main(_):
    cfg = cli.config_from_flags(RaceConfig)
    from bert_tf.studies import race_planner, race_seeds, recipe_race

    recipes = parse_recipes(cfg.recipes)
    settings = {name: recipe_race.read_flagfile(path, REPO) for name, path in recipes.items()}
    shared = {name: (s.get("eval_files"), s.get("eval_batches")) for name, s in settings.items()}
    if len(set(shared.values())) > 1 or not all(all(v) for v in shared.values()):
        raise ConfigError(
            f"--recipes must evaluate on the same held-out records (--eval_files, --eval_batches): "
            f"{shared}"
        )
    os.makedirs(cfg.output_dir, exist_ok=True)
    if cfg.sweep_learning_rates:
        sweep(cfg, recipes)
        return
    if cfg.link_for_efficiency:
        report_links(cfg, recipes)
        return
    link = race_on(cfg, recipes)
    runs = {}
    for name in recipes:
        runs[name] = [recipe_race.curve(run_dir) for run_dir in cfg.run_dirs(name)]
        for run_dir, run in zip(cfg.run_dirs(name), runs[name]) if cfg.nodes else ():
            run["planner"] = race_planner.planned_vs_measured(
                run_dir, cfg.nodes, cfg.link_gbit, link
            )
    machines = race_seeds.machines(runs)
    if len(machines) > 1:  # a race spanning sessions: each session may have had another machine
        print(
            f"WARNING: these runs ran on {len(machines)} machines, so their minutes do not "
            f"compare: {'; '.join(machines)}",
            flush=True,
        )
    where = (
        f"{cfg.nodes} emulated nodes at {cfg.link_gbit:g} Gbit/s"
        if cfg.nodes
        else f"{cfg.ranks} ranks"
    )
    title = (
        cfg.title or f"{' vs '.join(recipes)}: {where} on {race_seeds.ran_on(runs, this_machine)}"
    )
    if cfg.seeds:
        summary = race_seeds.write_report(
            runs, cfg.seeds, cfg.output_dir, title, cfg.target_accuracy
        )
        print("\n".join(race_seeds.describe_seeds(summary)))
    else:
        one = {name: curves[0] for name, curves in runs.items()}
        summary = recipe_race.write_report(one, cfg.output_dir, title, cfg.target_accuracy)
        print("\n".join(recipe_race.describe(summary)))
    print(f"wrote {os.path.join(cfg.output_dir, 'race.json')} and race.png")


if __name__ == "__main__":
    cli.run(main)
