"""Where the traced updates of a `run/benchmark.py --profile_dir` run spent their time, read again
from its traces (bert_tf/studies/op_profile.py): each side's top op types, the kinds side by side in wall ms
per sequence, and what 1.3x the peer would need.

    python run/profile_report.py --ladder=runs/bench_base_128/ladder.json
"""
import json

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_string("ladder", None, "ladder.json of a run/benchmark.py run made with --profile_dir.")
flags.mark_flag_as_required("ladder")
FLAGS = flags.FLAGS


def main(_):
    from bert_tf.studies import op_profile
    try:
        with open(FLAGS.ladder) as f:
            profiles = json.load(f).get("profiles") or {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"--ladder={FLAGS.ladder}: {e}") from None
    if "bert_tf" not in profiles:
        raise ConfigError(f"--ladder={FLAGS.ladder}: no profiles (run the benchmark with --profile_dir)")
    sides = {side: op_profile.report(p["rung"], p["profile_dir"], p["wall_seconds"], p["sequences"])
             for side, p in profiles.items() if side in ("bert_tf", "keras-hub")}
    op_profile.print_comparison(sides["bert_tf"], sides.get("keras-hub"))


if __name__ == "__main__":
    cli.run(main)
