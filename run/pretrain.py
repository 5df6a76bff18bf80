"""Pre-trains BERT on one or many machines.

    horovodrun -np 16 -hostfile hostfiles/hosts python run/pretrain.py --flagfile=configs/base_phase1.flags \
        --flagfile=node.flags      # optional: run/benchmark.py --write_flagfile=node.flags, once per node type
    mpirun -np 2 python run/pretrain.py --flagfile=configs/demo.flags
    python run/pretrain.py --flagfile=configs/demo.flags          # one process
    horovodrun -np 3 --min-np 2 --max-np 4 --gloo --network-interface eth0 \
        --host-discovery-script 'scripts/discover_hosts.sh hosts.live' \
        python run/pretrain.py --elastic --global_batch=... ...  # elastic: nodes may come and go
    python run/pretrain.py --flagfile=configs/base_phase1.flags --dry_run   # check flags and inputs, then exit

Global batch = --batch_size x --accumulation_steps x ranks. Learning-rate scaling rule: the
learning rate is NOT scaled with the number of ranks; it belongs to the global batch. When you
change the global batch by a factor k, scale --learning_rate by sqrt(k) for LAMB (You et al. 2019)
or by k for AdamW (linear rule), and keep warmup as a fraction of --total_steps.
"""
import dataclasses
import sys

from absl import flags

from bert_tf import cli
from bert_tf.train import optimization, pretraining, training
from bert_tf.train import startup
from bert_tf.train import pretrain_config

D = pretrain_config.PretrainConfig     # the class: its fields' defaults are the flags' defaults
cli.define_model_preset(D.model_preset)
flags.DEFINE_string("bert_config_file", D.bert_config_file, "google-format bert_config.json (instead of a preset).")
flags.DEFINE_string("vocab_file", D.vocab_file, "WordPiece vocab.txt; its size sets the model's vocab_size for presets.")
flags.DEFINE_bool("do_lower_case", D.do_lower_case, "Tokeniser lower-cases (must match the data).")
flags.DEFINE_string("train_files", D.train_files, "Comma-separated globs of training TFRecords.")
flags.DEFINE_string("eval_files", D.eval_files, "Comma-separated globs of held-out TFRecords.")
cli.define_sequence(D.max_seq_length, D.max_predictions_per_seq)
flags.DEFINE_bool("dynamic_masking", D.dynamic_masking, "Records are unmasked; mask in tf.data each epoch.")
flags.DEFINE_float("masked_lm_prob", D.masked_lm_prob, "Masking rate for --dynamic_masking.")
flags.DEFINE_bool("mlm_only", D.mlm_only, "Train the masked-LM objective only (no next-sentence head).")
flags.DEFINE_integer("batch_size", D.batch_size, "Micro-batch per rank, in sequences.")
flags.DEFINE_integer("accumulation_steps", D.accumulation_steps, "Micro-batches per optimizer update (and per allreduce).")
flags.DEFINE_integer("fit_micro_batch", D.fit_micro_batch,
                     "Re-split the per-rank batch (--batch_size x --accumulation_steps) into micro-batches of this "
                     "size, keeping the global batch (run/benchmark.py --tune_batch_sizes writes it); 0: off.")
flags.DEFINE_enum("recompute", D.recompute, ["none", "layer"], "layer: keep only each transformer layer's input "
                  "for the backward pass and run the layer again there (less activation memory, about one more "
                  "forward pass; the same gradients): phase 2 at sequence 512 on small devices.")
flags.DEFINE_enum("optimizer", D.optimizer, list(optimization.OPTIMIZERS), "Optimizer.")
flags.DEFINE_float("learning_rate", D.learning_rate, "Peak learning rate (for the global batch; see the module doc).")
flags.DEFINE_integer("warmup_steps", D.warmup_steps, "Linear warmup updates.")
flags.DEFINE_integer("total_steps", D.total_steps, "Optimizer updates in all.")
flags.DEFINE_float("decay_power", D.decay_power, "Polynomial decay power after warmup (1 = linear).")
flags.DEFINE_float("weight_decay", D.weight_decay, "Decoupled weight decay (not on LayerNorm or biases).")
flags.DEFINE_float("clip_norm", D.clip_norm, "Global-norm gradient clipping.")
flags.DEFINE_enum("precision", D.precision, list(training.POLICIES), "Compute precision policy.")
flags.DEFINE_bool("tf32", D.tf32, "On GPUs with TensorFloat-32 (Ampere and newer), float32 matmuls use it "
                  "(TensorFlow's default); --notf32 for strict float32. No effect on CPUs.")
flags.DEFINE_bool("xla", D.xla, "Compile the whole forward/backward pass with XLA (the update always is).")
flags.DEFINE_bool("fuse", D.fuse, "XLA-fuse the element-wise ops (GELU, LayerNorm, softmax, casts and their gradients) "
                  "between TensorFlow's own matmul kernels: for CPUs, whose AMX/AVX-512 BF16 matmuls XLA does not "
                  "reach. Needs TF_XLA_FLAGS='--tf_xla_auto_jit=fusible --tf_xla_cpu_global_jit' in the environment "
                  "at launch (mpirun -x TF_XLA_FLAGS). Not with --xla. run/benchmark.py's +fuse rungs measure it.")
flags.DEFINE_integer("seed", D.seed, "Seed for initialisation, data order and dropout.")
cli.define_comm()
flags.DEFINE_string("network_interface", D.network_interface,
                    "Log the bytes this node sent on this interface per update (e.g. eth0).")
flags.DEFINE_integer("intra_op_threads", D.intra_op_threads, "CPU threads per rank for one op (0: the node's "
                     "cores / its ranks).")
flags.DEFINE_integer("inter_op_threads", D.inter_op_threads, "CPU threads per rank running ops side by side "
                     "(0: 2).")
flags.DEFINE_string("horovod_timeline", D.horovod_timeline, "Write Horovod's timeline JSON here.")
flags.DEFINE_bool("horovod_autotune", D.horovod_autotune, "Let Horovod tune fusion threshold and cycle time.")
flags.DEFINE_string("checkpoint_dir", D.checkpoint_dir, "Checkpoints, metrics.jsonl, TensorBoard; resumes from here.")
flags.DEFINE_string("init_checkpoint", D.init_checkpoint, "Start the model from this checkpoint (phase 2); "
                    "fresh optimizer and schedule. Ignored when --checkpoint_dir has a checkpoint.")
flags.DEFINE_integer("save_interval", D.save_interval, "Save every N updates (and at the end and on SIGTERM/SIGINT).")
flags.DEFINE_integer("keep_last", D.keep_last, "Checkpoints to keep.")
flags.DEFINE_integer("log_interval", D.log_interval, "Progress line every N updates.")
flags.DEFINE_string("wandb_project", D.wandb_project, "Also log what TensorBoard gets to this Weights & Biases "
                    "project (rank 0; needs `pip install wandb`); TensorBoard stays.")
flags.DEFINE_enum("wandb_mode", D.wandb_mode, ["online", "offline"], "offline: no network; the run goes to "
                  "<checkpoint_dir>/wandb/offline-run-*, for `wandb sync` later.")
flags.DEFINE_integer("stop_check_interval", D.stop_check_interval,
                     "Ranks agree on a SIGTERM/SIGINT every N updates (and at log and save steps): the only "
                     "host synchronisation between log intervals.")
flags.DEFINE_integer("eval_interval", D.eval_interval, "Held-out evaluation every N updates (0: only at the end).")
flags.DEFINE_integer("eval_batches", D.eval_batches, "Limit evaluation to N batches per rank (0: all).")
flags.DEFINE_float("ladder_sequences_per_second", D.ladder_sequences_per_second,
                   "run/benchmark.py's sequences/s for this configuration (its --write_flagfile sets it): "
                   "logged next to the measured figure.")
flags.DEFINE_bool("elastic", D.elastic, "Elastic mode: ranks may leave and join (horovodrun --host-discovery-script "
                  "... --gloo; bert_tf/train/elastic.py). Needs --global_batch.")
flags.DEFINE_integer("global_batch", D.global_batch, "Elastic mode: sequences per update, kept whatever the rank "
                     "count (each rank's micro-batches per update follow from it).")
flags.DEFINE_integer("elastic_commit_interval", D.elastic_commit_interval,
                     "Elastic mode: commit the state to memory every N updates (a lost rank costs the updates "
                     "since the last commit).")
flags.DEFINE_float("divergence_factor", D.divergence_factor, "Divergence guard: roll back to the last good "
                   "checkpoint when the logged loss stays above this x the median of the last 20 healthy intervals "
                   "(0: off) ...")
flags.DEFINE_integer("divergence_intervals", D.divergence_intervals, "... for this many logged intervals in a row.")
flags.DEFINE_integer("max_skipped_updates", D.max_skipped_updates, "Divergence guard: roll back when this many "
                     "updates in a row were skipped for non-finite gradients (0: off; checked at log steps).")
flags.DEFINE_integer("max_rollbacks", D.max_rollbacks, "Stop after this many rollbacks.")
flags.DEFINE_float("rollback_lr_scale", D.rollback_lr_scale, "Multiply the learning rate by this at each rollback.")
flags.DEFINE_float("time_budget_hours", D.time_budget_hours, "End the run on the clock: the learning-rate "
                   "schedule (the recipe's shape) is stretched over the updates this many hours hold, predicted from "
                   "the measured rate; a restart spends what is left (0: end at --total_steps).")
flags.DEFINE_float("target_mlm_accuracy", D.target_mlm_accuracy, "Stop at the first evaluation (--eval_interval) "
                   "whose held-out MLM accuracy reaches this, and log the time to train (0: off).")
flags.DEFINE_bool("dry_run", False, "Check the flags, vocabulary, --init_checkpoint, every record file and that "
                  "--checkpoint_dir can be written, print what the run would be, and exit: no Horovod, no model, "
                  "nothing written.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    cfg = pretrain_config.PretrainConfig(comm=cli.comm_config(), **{
        f.name: FLAGS[f.name].value for f in dataclasses.fields(pretrain_config.PretrainConfig) if f.name != "comm"})
    if FLAGS.dry_run:
        startup.dry_run(cfg)
        return
    _, last = pretraining.run(cfg)
    from bert_tf.dist import distributed
    if distributed.rank() == 0 and "eval_mlm_accuracy" in last:
        print(f"held-out MLM accuracy {last['eval_mlm_accuracy']:.4f}  vs  always the most frequent masked token "
              f"{last.get('eval_most_frequent_token_accuracy', float('nan')):.4f}  "
              f"(NSP accuracy {last.get('eval_nsp_accuracy', float('nan')):.4f})", flush=True)


if __name__ == "__main__":
    cli.run(main)
