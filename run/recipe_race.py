"""The recipe race: pre-training recipes side by side on this machine, held-out MLM accuracy against
wall-clock time (bert_tf/studies/recipe_race.py):

    python run/recipe_race.py --recipes=classic=configs/race_classic.flags,budget=configs/race_budget.flags \
        --output_dir=runs/race

runs each recipe (mpirun -np --ranks run/pretrain.py --flagfile=...) into <output_dir>/<name>, one after
the other, then writes <output_dir>/race.json and race.png and prints each recipe's final accuracy and the
time it takes to reach every other's. --report_only redraws from finished runs. The recipes must evaluate
on the same held-out records (--eval_files, --eval_batches) for the comparison to mean anything; the race
checks that they name the same files.

On an emulated cluster (--nodes, one rank per node, links shaped to --link_gbit; root), the same race
compares ways of exchanging gradients (issue 40; configs/comm_race_*.flags):

    python run/recipe_race.py --nodes=2 --link_gbit=0.1 --target_accuracy=0.085 --output_dir=runs/comm_race2 \
        --recipes=fp16=configs/comm_race_fp16.flags,powersgd=configs/comm_race_powersgd.flags,onebit=configs/comm_race_onebit.flags,diloco=configs/comm_race_diloco.flags

and adds per recipe the bytes rank 0's node sent per update and the planner's prediction of its speed (fed
the run's own compute speed) against the speed measured between evaluations.
"""
import contextlib
import json
import os
import sys

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_list("recipes", None, "name=flagfile pairs, comma-separated, raced in this order.")
flags.DEFINE_string("output_dir", None, "A folder per recipe, race.json and race.png.")
flags.DEFINE_integer("ranks", 2, "Processes per recipe on this machine.")
flags.DEFINE_bool("report_only", False, "Only the report, from runs already in --output_dir.")
flags.DEFINE_float("time_budget_hours", 0, "Override every recipe's --time_budget_hours (0: each flagfile's own).",
                   lower_bound=0)
flags.DEFINE_string("title", "", "The plot's title (default: the recipes and this machine's CPU).")
flags.DEFINE_multi_string("pretrain_flag", [], "A flag for every recipe's run/pretrain.py, e.g. "
                          "--pretrain_flag=--seed=2 (repeat it for more).")
flags.DEFINE_integer("nodes", 0, "Race on this many emulated nodes, one rank each, joined by shaped links "
                     "(bert_tf/studies/emulated_cluster.py; root); 0: --ranks processes on this machine.", lower_bound=0)
flags.DEFINE_float("link_gbit", 1.0, "--nodes: each node's link rate, Gbit/s.", lower_bound=0.001)
flags.DEFINE_float("target_accuracy", 0.0, "Also report when each recipe first reaches this held-out MLM accuracy.",
                   lower_bound=0)
flags.mark_flags_as_required(["recipes", "output_dir"])
FLAGS = flags.FLAGS
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


def race_on(recipes):
    """Runs the recipes (unless --report_only); with --nodes on an emulated cluster, then probes its link once
    (the planner's measured bandwidth and per-message cost, as the communication study does) into
    link.json, which it returns."""
    from bert_tf.studies import comm_study, emulated_cluster, recipe_race
    extra = [f"--time_budget_hours={FLAGS.time_budget_hours}"] if FLAGS.time_budget_hours else []
    extra += FLAGS.pretrain_flag + (["--network_interface=eth0"] if FLAGS.nodes else [])
    link_path = os.path.join(FLAGS.output_dir, "link.json")
    if not FLAGS.nodes:
        cluster = contextlib.nullcontext()
    elif FLAGS.report_only and os.path.exists(link_path):
        return json.load(open(link_path))
    else:
        cluster = emulated_cluster.EmulatedCluster(FLAGS.nodes, FLAGS.link_gbit)
    with cluster:
        mpirun = cluster.mpirun_prefix(FLAGS.nodes) if FLAGS.nodes else None
        for name, path in recipes.items() if not FLAGS.report_only else ():
            recipe_race.launch(os.path.abspath(path), os.path.abspath(os.path.join(FLAGS.output_dir, name)),
                               FLAGS.nodes or FLAGS.ranks, extra, mpirun=mpirun)
        if not FLAGS.nodes:
            return None
        probe = [sys.executable, os.path.join(REPO, "run", "comm_study.py"), "--probe"]
        link = comm_study.run_probe(cluster, FLAGS.nodes, probe, os.path.join(FLAGS.output_dir, "probe.txt"), 1200)
    with open(link_path, "w") as f:
        json.dump(link, f)
    print(f"link probe, {FLAGS.nodes} nodes at {FLAGS.link_gbit:g} Gbit/s: {json.dumps(link)}", flush=True)
    return link


def main(_):
    from bert_tf.parallel import device
    from bert_tf.studies import recipe_race
    recipes = parse_recipes(FLAGS.recipes)
    settings = {name: recipe_race.read_flagfile(path, REPO) for name, path in recipes.items()}
    shared = {name: (s.get("eval_files"), s.get("eval_batches")) for name, s in settings.items()}
    if len(set(shared.values())) > 1 or not all(all(v) for v in shared.values()):
        raise ConfigError(f"--recipes must evaluate on the same held-out records (--eval_files, --eval_batches): "
                          f"{shared}")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    link = race_on(recipes)
    runs = {}
    for name in recipes:
        runs[name] = recipe_race.curve(os.path.join(FLAGS.output_dir, name))
        if FLAGS.nodes:
            runs[name]["planner"] = recipe_race.planned_vs_measured(os.path.join(FLAGS.output_dir, name), FLAGS.nodes,
                                                                    FLAGS.link_gbit, link)
    cpu = device.device_description()
    where = (f"{FLAGS.nodes} emulated nodes at {FLAGS.link_gbit:g} Gbit/s" if FLAGS.nodes else f"{FLAGS.ranks} ranks")
    title = FLAGS.title or (f"{' vs '.join(recipes)}: {where} on {cpu.get('cpu', 'a GPU node')} "
                            f"({cpu.get('cpu_count', '?')} cores; {', '.join(cpu.get('cpu_features', []))})")
    summary = recipe_race.write_report(runs, FLAGS.output_dir, title, FLAGS.target_accuracy)
    print("\n".join(recipe_race.describe(summary)))
    print(f"wrote {os.path.join(FLAGS.output_dir, 'race.json')} and race.png")


if __name__ == "__main__":
    cli.run(main)
