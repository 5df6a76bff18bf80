"""Fine-tunes a BERT on SQuAD v1.1 or v2.0, writes predictions.json (and null_odds.json for v2.0) as the
official evaluation scripts read them, and scores them the way those scripts do.

    python run/squad.py --version=1.1 --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
        --init_checkpoint=runs/base_phase2 --vocab_file=vocab.txt --output_dir=runs/squad11
    python run/squad.py --version=2.0 --train_file=train-v2.0.json --predict_file=dev-v2.0.json ...
    mpirun -np 2 python run/squad.py ...                      # data-parallel, like pre-training

Defaults: Devlin et al. (2019), section 4.2: 3 epochs, learning rate 5e-5, batch 32, windows of 384
tokens every 128, questions of at most 64. Writes eval.json (exact match and F1 in %, v2.0 with
HasAns/NoAns and the best no-answer thresholds) beside the predictions.
"""
import json
import os

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_enum("version", "1.1", ["1.1", "2.0"], "SQuAD version (2.0: unanswerable questions).")
flags.DEFINE_string("train_file", "", "SQuAD JSON to fine-tune on (empty: predict with an untrained span head, "
                    "the floor a fine-tuned one must beat).")
flags.DEFINE_string("predict_file", None, "SQuAD JSON to predict and score.")
cli.define_finetune_start()
flags.DEFINE_integer("max_seq_length", 384, "Tokens per window: [CLS] question [SEP] context [SEP].")
flags.DEFINE_integer("doc_stride", 128, "A long context's next window starts this many tokens later.")
flags.DEFINE_integer("max_query_length", 64, "Longer questions are cut to this many tokens (and counted).")
flags.DEFINE_float("learning_rate", 5e-5, "AdamW peak learning rate.")
flags.DEFINE_integer("global_batch_size", 32, "Windows per optimizer update over all ranks.")
cli.define_renamed("batch_size", "global_batch_size")
flags.DEFINE_float("epochs", 3.0, "Passes over the training windows.")
flags.DEFINE_float("warmup_fraction", 0.1, "Linear warmup over this fraction of the updates, then linear decay.")
flags.DEFINE_integer("seed", 0, "Seed for the head's initialisation, order and dropout.")
flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16", "mixed_float16"], "Compute precision.")
flags.DEFINE_bool("xla", False, "Compile the forward/backward pass and the update with XLA.")
flags.DEFINE_integer("n_best_size", 20, "Spans considered per window and kept per question.")
flags.DEFINE_integer("max_answer_length", 30, "Longest answer, in tokens.")
flags.DEFINE_float("null_score_diff_threshold", 0.0, "v2.0: answer \"\" when the no-answer score exceeds the best "
                   "span's by more than this (eval.json's best_f1_thresh tunes it on dev).")
flags.DEFINE_string("output_dir", None, "predictions.json, null_odds.json, nbest_predictions.json, eval.json.")
flags.DEFINE_bool("export_model", False, "Also write the fine-tuned model to <output_dir>/model/: google-research/"
                  "bert's names (cls/squad/...) and a transformers BertForQuestionAnswering directory.")
flags.mark_flags_as_required(["predict_file", "vocab_file", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
    from bert_tf.parallel import distributed
    from bert_tf.tasks import finetuning, squad, squad_scoring
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    tokenizer, init, config = cli.finetune_start(FLAGS.max_seq_length)
    recipe = finetuning.Recipe(learning_rate=FLAGS.learning_rate, batch_size=FLAGS.global_batch_size, epochs=FLAGS.epochs,
                               warmup_fraction=FLAGS.warmup_fraction, max_seq_length=FLAGS.max_seq_length,
                               seed=FLAGS.seed, precision=FLAGS.precision, xla=FLAGS.xla)
    window_flags = dict(max_seq_length=FLAGS.max_seq_length, doc_stride=FLAGS.doc_stride,
                        max_query_length=FLAGS.max_query_length)
    hvd = distributed.init()
    rank, size = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *a, **k: None)
    # every input read before any training
    predict_examples = squad.read_examples(FLAGS.predict_file, FLAGS.version, training=False, log=log)
    train_examples = squad.read_examples(FLAGS.train_file, FLAGS.version, training=True, log=log) \
        if FLAGS.train_file else None
    model, predictions, null_odds, nbest, report = squad.train_and_predict(
        train_examples, predict_examples, tokenizer, config, init, recipe, window_flags, FLAGS.version,
        FLAGS.n_best_size, FLAGS.max_answer_length, FLAGS.null_score_diff_threshold,
        (rank, size, distributed.make_gradient_allreduce(False, name="squad"), distributed.broadcast_variables), log)
    if rank != 0:
        return
    squad.write_predictions(FLAGS.output_dir, predictions, null_odds, nbest, FLAGS.version)
    if FLAGS.export_model:
        finetuning.export(model, FLAGS.vocab_file, os.path.join(FLAGS.output_dir, "model"),
                          do_lower_case=FLAGS.do_lower_case)
    with open(FLAGS.predict_file, encoding="utf-8") as f:
        dataset = json.load(f)["data"]
    scores = squad_scoring.evaluate(dataset, predictions, null_odds if FLAGS.version == "2.0" else None,
                                    version=FLAGS.version)
    report = {"version": FLAGS.version, "scores": scores, **report, "init": init.path if init is not None else "random"}
    with open(os.path.join(FLAGS.output_dir, "eval.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("SQuAD " + FLAGS.version + ": " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in scores.items()), flush=True)


if __name__ == "__main__":
    cli.run(main)
