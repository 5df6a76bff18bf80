"""The recipe race: pre-training recipes side by side on this machine, held-out MLM accuracy against
wall-clock time (bert_tf/tools/recipe_race.py):

    python run/recipe_race.py --recipes=classic=configs/race_classic.flags,budget=configs/race_budget.flags \
        --output_dir=runs/race

runs each recipe (mpirun -np --ranks run/pretrain.py --flagfile=...) into <output_dir>/<name>, one after
the other, then writes <output_dir>/race.json and race.png and prints each recipe's final accuracy and the
time it takes to reach every other's. --report_only redraws from finished runs. The recipes must evaluate
on the same held-out records (--eval_files, --eval_batches) for the comparison to mean anything; the race
checks that they name the same files.
"""
import os

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_list("recipes", None, "name=flagfile pairs, comma-separated, raced in this order.")
flags.DEFINE_string("output_dir", None, "A folder per recipe, race.json and race.png.")
flags.DEFINE_integer("ranks", 2, "Processes per recipe on this machine.")
flags.DEFINE_bool("report_only", False, "Only the report, from runs already in --output_dir.")
flags.DEFINE_float("time_budget_hours", 0, "Override every recipe's --time_budget_hours (0: each flagfile's own).",
                   lower_bound=0)
flags.DEFINE_string("title", "", "The plot's title (default: the recipes and this machine's CPU).")
flags.mark_flags_as_required(["recipes", "output_dir"])
FLAGS = flags.FLAGS


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


def main(_):
    from bert_tf.dist import device
    from bert_tf.tools import recipe_race
    recipes = parse_recipes(FLAGS.recipes)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    settings = {name: recipe_race.read_flagfile(path, repo) for name, path in recipes.items()}
    shared = {name: (s.get("eval_files"), s.get("eval_batches")) for name, s in settings.items()}
    if len(set(shared.values())) > 1 or not all(all(v) for v in shared.values()):
        raise ConfigError(f"--recipes must evaluate on the same held-out records (--eval_files, --eval_batches): {shared}")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    runs = {}
    for name, path in recipes.items():
        run_dir = os.path.join(FLAGS.output_dir, name)
        if not FLAGS.report_only:
            extra = [f"--time_budget_hours={FLAGS.time_budget_hours}"] if FLAGS.time_budget_hours else []
            recipe_race.launch(os.path.abspath(path), os.path.abspath(run_dir), FLAGS.ranks, extra)
        runs[name] = recipe_race.curve(run_dir)
    cpu = device.device_description()
    title = FLAGS.title or (f"{' vs '.join(recipes)}: {FLAGS.ranks} ranks on {cpu.get('cpu', 'a GPU node')} "
                            f"({cpu.get('cpu_count', '?')} cores; {', '.join(cpu.get('cpu_features', []))})")
    summary = recipe_race.write_report(runs, FLAGS.output_dir, title)
    print("\n".join(recipe_race.describe(summary)))
    print(f"wrote {os.path.join(FLAGS.output_dir, 'race.json')} and race.png")


if __name__ == "__main__":
    cli.run(main)
