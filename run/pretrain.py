"""Pre-trains BERT on one or many machines.

    horovodrun -np 16 -hostfile hostfiles/hosts python run/pretrain.py \
        --flagfile=configs/base_phase1.flags \
        --flagfile=node.flags      # optional, once per node type:
                                   # run/benchmark.py --write_flagfile=node.flags
    mpirun -np 2 python run/pretrain.py --flagfile=configs/demo.flags
    python run/pretrain.py --flagfile=configs/demo.flags          # one process
    horovodrun -np 3 --min-np 2 --max-np 4 --gloo --network-interface eth0 \
        --host-discovery-script 'scripts/discover_hosts.sh hosts.live' \
        python run/pretrain.py --elastic --global_batch_size=... ...  # nodes may come and go
    # check flags and inputs, then exit:
    python run/pretrain.py --flagfile=configs/base_phase1.flags --dry_run

Global batch (one optimizer update, all ranks) = --micro_batch_size (one rank, one forward/backward)
x --accumulation_steps x ranks; elastic mode fixes it with --global_batch_size. Learning-rate
scaling rule: the learning rate is NOT scaled with the number of ranks; it belongs to the global
batch. When you change the global batch by a factor k, scale --learning_rate by sqrt(k) for LAMB
(You et al. 2019) or by k for AdamW (linear rule), and keep warmup as a fraction of --total_steps.
"""

import dataclasses
import sys

from bert_tf import cli, knob
from bert_tf.train import preflight, pretraining
from bert_tf.train.pretrain_config import PretrainConfig


@dataclasses.dataclass(frozen=True)
class PretrainRun:
    """run/pretrain.py's flags: the run's settings (PretrainConfig, a flag per field) and whether to
    run it."""

    # no default run (--checkpoint_dir and --vocab_file have none): the flags give the config, or a
    # test does
    config: PretrainConfig = None  # type: ignore[assignment]
    dry_run: bool = knob(
        False,
        "Check the flags, vocabulary, --init_checkpoint, every record file and that "
        "--checkpoint_dir can be written, print what the run would be, and exit: no Horovod, no "
        "model, nothing written.",
    )


cli.define_config_flags(PretrainRun)  # every field is a flag: its type, default and help live there
cli.define_renamed("batch_size", "micro_batch_size")
cli.define_renamed("global_batch", "global_batch_size")
cli.define_renamed("gradient_compression", "exchange")
cli.define_synonym("fp16_allreduce", "exchange", "fp16")  # the old bool flag: --exchange=fp16


def main(argv):
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    run = cli.config_from_flags(PretrainRun)
    if run.dry_run:
        preflight.dry_run(run.config)
        return
    _, last = pretraining.run(run.config)
    from bert_tf.parallel import distributed

    if distributed.rank() == 0 and "eval_mlm_accuracy" in last:
        nan = float("nan")
        print(
            f"held-out MLM accuracy {last['eval_mlm_accuracy']:.4f} (s.e. "
            f"{last.get('eval_mlm_accuracy_se', nan):.4f} over "
            f"{last.get('eval_mlm_predictions', 0):,.0f} masked tokens)  vs  always the most "
            f"frequent masked token {last.get('eval_most_frequent_token_accuracy', nan):.4f}  "
            f"(NSP accuracy {last.get('eval_nsp_accuracy', nan):.4f})",
            flush=True,
        )


if __name__ == "__main__":
    cli.run(main)
