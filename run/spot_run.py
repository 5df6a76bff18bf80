"""The spot-cluster run, whole, at a size the tests do not reach: the budget recipe on emulated
nodes with --elastic and a compressed exchange, nodes killed and taken back, the job stopped and
resumed; and the same run without faults, for the held-out accuracy at the end
(bert_tf/studies/spot_run.py; root and iproute2).

    python run/spot_run.py --output_dir=runs/spot \
        --flagfile_for_pretrain=configs/spot_budget.flags --events=kill:3@15,kill:2@47,stop@63

writes <output_dir>/faults and <output_dir>/clean (each a checkpoint folder with metrics.jsonl and
the jobs' logs) and <output_dir>/spot.json: each run's final held-out MLM accuracy, sequences
trained, starts (step, ranks) and wall-clock time, and whether every rank agreed on the weights at
every start and at the end. A study, not a test: it reports what it measured; run it on a quiet
machine.
"""

import json
import os

from bert_tf import cli
from bert_tf.studies import emulated_cluster, spot_run
from bert_tf.studies.spot_run import SpotRunConfig

cli.define_config_flags(SpotRunConfig)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(cfg, name, events):
    """One scenario into <output_dir>/<name>; returns its summary."""
    folder = os.path.abspath(os.path.join(cfg.output_dir, name))
    os.makedirs(folder, exist_ok=True)
    pretrain = [
        f"--flagfile={os.path.join(REPO, cfg.flagfile_for_pretrain)}",
        *cfg.pretrain_flag,
        f"--checkpoint_dir={folder}",
    ]
    with emulated_cluster.EmulatedCluster(cfg.nodes, cfg.link_gbit) as cluster:
        result = spot_run.run(cluster, pretrain, folder, folder, events, timeout=3600)
    return spot_run.summary(result)


def main(_):
    cfg = cli.config_from_flags(SpotRunConfig)
    os.makedirs(cfg.output_dir, exist_ok=True)
    report = {"faults": one_run(cfg, "faults", cfg.parsed_events())}
    if not cfg.skip_clean:
        report["clean"] = one_run(cfg, "clean", [])
    with open(os.path.join(cfg.output_dir, "spot.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name, s in report.items():
        print(f"{name}: {json.dumps(s)}")


if __name__ == "__main__":
    cli.run(main)
