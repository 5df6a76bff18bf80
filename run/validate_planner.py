"""Checks the planner (bert_tf/tools/planner.py) against measurements it was not fitted to.

    python run/validate_planner.py --study=runs/comm_study/study.json

1. NVIDIA's published BERT-large pre-training throughput on 1-32 DGX-2H nodes (TensorFlow2
   BERT README, 21.02 container), predicted from their single-V100 figures and the DGX-2H
   interconnect (bert_tf.studies.planner_validation.nvidia_rows).
2. The emulated-cluster study (run/comm_study.py): its planner predictions use the study's
   measured per-rank speed and the link probe, never the BERT jobs' communication times.
Prints both tables (markdown) with the relative error; exits 1 when a row misses --tolerance.
"""

import json
import os

from bert_tf import ConfigError, cli
from bert_tf.model.config import BertConfig
from bert_tf.tools import model_shapes
from bert_tf.studies import planner_validation

cli.define_config_flags(planner_validation.PlannerValidation)


def main(_):
    cfg = cli.config_from_flags(planner_validation.PlannerValidation)
    rows = planner_validation.nvidia_rows(
        model_shapes.gradient_tensor_sizes(BertConfig.preset("large", vocab_size=30522))
    )
    print(
        "| DGX-2H nodes | seq | precision | accumulation | published seq/s | planner seq/s | error "
        "|"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['nodes']} | {r['seq']} | {r['precision']} | {r['accumulation']} | "
            f"{r['published']:,.0f} | {r['predicted']:,.0f} | {r['error']:+.1%} |"
        )
    misses = planner_validation.nvidia_misses(rows, cfg.tolerance)
    if cfg.study:
        if not os.path.exists(cfg.study):
            raise ConfigError(f"--study={cfg.study} not found (run run/comm_study.py first)")
        with open(cfg.study) as f:
            study = json.load(f)
        print(
            f"\nEmulated cluster, BERT-{study['model_preset']} ({study['parameters'] / 1e6:.1f}M "
            f"parameters), per-rank speed without communication "
            f"{study.get('device_seq_s', float('nan')):.2f} seq/s"
        )
        print(
            "| nodes | Gbit/s | config | measured seq/s | planner seq/s (median speed) | error | "
            "error, own speed (judged) |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in study["rows"]:
            if "prediction_error" in r:
                print(
                    f"| {r['nodes']} | {r['rate_gbit']:g} | {r['config']} | "
                    f"{r['sequences_per_second']:.2f} | {r['predicted_sequences_per_second']:.2f} "
                    f"| {r['prediction_error']:+.1%} | {planner_validation.study_error(r):+.1%} |"
                )
        misses += planner_validation.study_misses(study, cfg.tolerance)
    if misses:
        raise SystemExit(f"outside {cfg.tolerance:.0%}: " + "; ".join(misses))


if __name__ == "__main__":
    cli.run(main)
