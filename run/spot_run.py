"""The spot-cluster run, whole, at a size the tests do not reach: the budget recipe on emulated nodes with
--elastic and a compressed exchange, nodes killed and taken back, the job stopped and resumed; and the same
run without faults, for the held-out accuracy at the end (bert_tf/studies/spot_run.py; root and iproute2).

    python run/spot_run.py --output_dir=runs/spot --flagfile_for_pretrain=configs/spot_budget.flags \
        --events=kill:3@15,kill:2@47,stop@63

writes <output_dir>/faults and <output_dir>/clean (each a checkpoint folder with metrics.jsonl and the jobs'
logs) and <output_dir>/spot.json: each run's final held-out MLM accuracy, sequences trained, starts (step,
ranks) and wall-clock time, and whether every rank agreed on the weights at every start and at the end.
A study, not a test: it reports what it measured; run it on a quiet machine.
"""
import json
import os

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_string("output_dir", None, "faults/, clean/ and spot.json go here.")
flags.DEFINE_string("flagfile_for_pretrain", "configs/spot_budget.flags", "run/pretrain.py's flagfile (--elastic).")
flags.DEFINE_multi_string("pretrain_flag", [], "More run/pretrain.py flags, e.g. --pretrain_flag=--seed=2.")
flags.DEFINE_list("events", ["kill:3@15", "kill:2@47", "stop@63"], "kill:NODE@UPDATE or stop@UPDATE, in order.")
flags.DEFINE_integer("nodes", 4, "Emulated nodes, one rank each.", lower_bound=2)
flags.DEFINE_float("link_gbit", 1.0, "Each node's link, Gbit/s.", lower_bound=0.001)
flags.DEFINE_bool("skip_clean", False, "Only the run with faults.")
flags.mark_flags_as_required(["output_dir"])
FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(name, events):
    """One scenario into <output_dir>/<name>; returns its summary."""
    from bert_tf.studies import emulated_cluster, spot_run
    folder = os.path.abspath(os.path.join(FLAGS.output_dir, name))
    os.makedirs(folder, exist_ok=True)
    pretrain = [f"--flagfile={os.path.join(REPO, FLAGS.flagfile_for_pretrain)}", *FLAGS.pretrain_flag,
                f"--checkpoint_dir={folder}"]
    with emulated_cluster.EmulatedCluster(FLAGS.nodes, FLAGS.link_gbit) as cluster:
        result = spot_run.run(cluster, pretrain, folder, folder, events, timeout=3600)
    return spot_run.summary(result)


def main(_):
    from bert_tf.studies import spot_run
    try:
        events = spot_run.parse_events(FLAGS.events)
    except ValueError as e:
        raise ConfigError(f"--events: {e}") from None
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    report = {"faults": one_run("faults", events)}
    if not FLAGS.skip_clean:
        report["clean"] = one_run("clean", [])
    with open(os.path.join(FLAGS.output_dir, "spot.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name, s in report.items():
        print(f"{name}: {json.dumps(s)}")


if __name__ == "__main__":
    cli.run(main)
