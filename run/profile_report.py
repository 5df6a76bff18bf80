"""Where the traced updates of a `run/benchmark.py --profile_dir` run spent their time, read again
from its traces (bert_tf/studies/op_profile.py): each side's top op types, the kinds side by side in
wall ms per sequence, and what 1.3x the peer would need.

    python run/profile_report.py --ladder=runs/bench_base_128/ladder.json
"""

import json

from bert_tf import ConfigError, cli
from bert_tf.studies import op_profile

cli.define_config_flags(op_profile.ProfileReport)


def main(_):
    cfg = cli.config_from_flags(op_profile.ProfileReport)
    try:
        with open(cfg.ladder) as f:
            profiles = json.load(f).get("profiles") or {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"--ladder={cfg.ladder}: {e}") from None
    if "bert_tf" not in profiles:
        raise ConfigError(
            f"--ladder={cfg.ladder}: no profiles (run the benchmark with --profile_dir)"
        )
    sides = {
        side: op_profile.report(p["rung"], p["profile_dir"], p["wall_seconds"], p["sequences"])
        for side, p in profiles.items()
        if side in ("bert_tf", "keras-hub")
    }
    op_profile.print_comparison(sides["bert_tf"], sides.get("keras-hub"))


if __name__ == "__main__":
    cli.run(main)
