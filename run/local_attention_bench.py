"""Times one local ModernBERT layer's forward and backward under XLA, dense windowed attention
against the blocked one (bert_tf/model/local_attention.py), and its allocator peak; writes
local_attention_bench.json and .md into --output_dir and prints the table.

    python run/local_attention_bench.py --seq_lengths=512,1024
"""

from bert_tf import cli
from bert_tf.studies import local_attention_bench

cli.define_config_flags(local_attention_bench.LocalAttentionBench)


def main(_):
    cfg = cli.config_from_flags(local_attention_bench.LocalAttentionBench)
    report = local_attention_bench.run(cfg)
    print(local_attention_bench.write(report, cfg.output_dir), end="")


if __name__ == "__main__":
    cli.run(main)
