"""Fine-tunes a sentence(-pair) classifier from a pre-trained encoder; k-fold cross-validation;
a probe over a pre-training run's checkpoints. Defaults: the standard BERT recipe (finetuning.Recipe:
AdamW 2e-5, batch 32, 3 epochs, 10% warmup, sequence 128).

    python run/finetune.py --train_file=data/corpus/pang_lee_polarity.cor --kfold=5 \
        --init_checkpoint=runs/demo --vocab_file=data/demo/vocab.txt --output_json=runs/finetune.json
    python run/finetune.py ... --random_init --bert_config_file=runs/demo/bert_config.json   # baseline
    python run/finetune.py ... --probe_checkpoint_dir=runs/demo    # every checkpoint -> metrics.jsonl
    mpirun -np 2 python run/finetune.py ...                         # ranks share every batch
"""
import json
import os

import numpy as np
from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_string("train_file", None, "Labelled examples (label<TAB>text[<TAB>text_b], CSV, or __label__X text).")
flags.DEFINE_string("eval_file", "", "Held-out examples; without it, --kfold cross-validates on --train_file.")
flags.DEFINE_integer("kfold", 5, "Folds for cross-validation when there is no --eval_file.")
flags.DEFINE_string("init_checkpoint", "", "Pre-training checkpoint (path, or a folder: its latest), an export, "
                    "google-research/bert's bert_model.ckpt or a Hugging Face directory "
                    "(config.json + model.safetensors).")
flags.DEFINE_bool("random_init", False, "Randomly initialised encoder (the baseline); needs --bert_config_file.")
flags.DEFINE_string("bert_config_file", "", "Model config; default: the checkpoint's own "
                    "(bert_config.json / config.json).")
flags.DEFINE_string("vocab_file", None, "The vocab.txt the encoder was pre-trained with.")
flags.DEFINE_bool("do_lower_case", True, "Tokeniser lower-cases.")
flags.DEFINE_integer("max_seq_length", 128, "Longer examples are truncated (and counted).")
flags.DEFINE_integer("epochs", 3, "Passes over the training examples.")
flags.DEFINE_integer("global_batch_size", 32, "Examples per optimizer update over all ranks (a multiple of the rank "
                     "count).")
cli.define_renamed("batch_size", "global_batch_size")
flags.DEFINE_float("learning_rate", 2e-5, "AdamW peak learning rate (10% linear warmup, then linear decay).")
flags.DEFINE_integer("seed", 0, "Seed for folds, initialisation and order.")
flags.DEFINE_string("output_json", "", "Write the metrics here.")
flags.DEFINE_string("probe_checkpoint_dir", "", "Run the probe on every checkpoint of this pre-training run and "
                    "append kind=probe records to its metrics.jsonl.")
flags.mark_flags_as_required(["train_file", "vocab_file"])
FLAGS = flags.FLAGS


def cross_validate(model_config, tokenizer, examples, checkpoint, hvd, label_names):
    from bert_tf.parallel import distributed
    from bert_tf.tasks import classification, finetuning
    x, y, truncated = classification.encode(examples, tokenizer, FLAGS.max_seq_length, label_names)
    if FLAGS.eval_file:
        ev = classification.read_examples(FLAGS.eval_file)
        ex, ey, t2 = classification.encode(ev, tokenizer, FLAGS.max_seq_length, label_names)
        splits, data = [(None, None)], [((x, y), (ex, ey))]
        truncated += t2
    else:
        splits = classification.kfold_splits(len(y), FLAGS.kfold, FLAGS.seed)
        data = [(({k: v[tr] for k, v in x.items()}, y[tr]), ({k: v[te] for k, v in x.items()}, y[te]))
                for tr, te in splits]
    folds = []
    for train, evaluation in data:
        metrics, model = classification.train_and_evaluate(
            model_config, label_names, train, evaluation, init_checkpoint=checkpoint, vocab_size=len(tokenizer),
            epochs=FLAGS.epochs, batch_size=finetuning.Recipe(batch_size=FLAGS.global_batch_size).per_rank_batch(hvd.size()),
            learning_rate=FLAGS.learning_rate, seed=FLAGS.seed,
            allreduce=distributed.make_gradient_allreduce(False, name="ft"),
            broadcast=distributed.broadcast_variables, rank=hvd.rank(), size=hvd.size())
        folds.append(metrics)
    accuracies = [f["accuracy"] for f in folds]
    return {"folds": folds, "accuracy_mean": float(np.mean(accuracies)), "accuracy_std": float(np.std(accuracies)),
            "truncated": truncated, "skipped_lines": examples.skipped, "labels": label_names,
            "init": checkpoint.path if hasattr(checkpoint, "path") else checkpoint or "random"}, model


def main(_):
    from bert_tf.data import tokenization
    from bert_tf.parallel import distributed
    from bert_tf.model import modeling
    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.tasks import classification
    hvd = distributed.init()
    tokenizer = tokenization.Tokenizer.from_file(FLAGS.vocab_file, FLAGS.do_lower_case)
    examples = classification.read_examples(FLAGS.train_file)
    label_names = sorted(set(examples.labels))
    if FLAGS.probe_checkpoint_dir:
        import tensorflow as tf
        state = tf.train.get_checkpoint_state(FLAGS.probe_checkpoint_dir)
        if not state:
            raise ConfigError(f"--probe_checkpoint_dir={FLAGS.probe_checkpoint_dir}: no checkpoints there")
        config = modeling.BertConfig.from_json_file(os.path.join(FLAGS.probe_checkpoint_dir, "bert_config.json"))
        for ckpt in state.all_model_checkpoint_paths:
            result, _ = cross_validate(config, tokenizer, examples, ckpt, hvd, label_names)
            step = int(ckpt.rsplit("-", 1)[1])
            record = {"kind": "probe", "step": step, "probe_accuracy": result["accuracy_mean"],
                      "probe_accuracy_std": result["accuracy_std"], "probe_task": os.path.basename(FLAGS.train_file)}
            if hvd.rank() == 0:
                with open(os.path.join(FLAGS.probe_checkpoint_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"probe step {step}: accuracy {result['accuracy_mean']:.4f} ± {result['accuracy_std']:.4f}")
        return
    checkpoint = None
    if FLAGS.init_checkpoint and not FLAGS.random_init:
        checkpoint = checkpoint_formats.read(FLAGS.init_checkpoint)   # any format; read once for all folds
    elif not FLAGS.random_init:
        raise ConfigError("give --init_checkpoint, or --random_init for the baseline")
    if FLAGS.bert_config_file:
        config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
    elif checkpoint is not None and checkpoint.config is not None:
        config = checkpoint.config
    else:
        raise ConfigError("--random_init needs --bert_config_file" if checkpoint is None else
                          f"{checkpoint.path} has no bert_config.json beside it: give --bert_config_file")
    if checkpoint is not None:
        checkpoint_formats.check_fits(checkpoint, config, len(tokenizer), FLAGS.vocab_file, FLAGS.max_seq_length)
    result, _ = cross_validate(config, tokenizer, examples, checkpoint, hvd, label_names)
    if hvd.rank() == 0:
        print(f"{'random init' if checkpoint is None else checkpoint.path}: accuracy {result['accuracy_mean']:.4f} ± "
              f"{result['accuracy_std']:.4f} over {len(result['folds'])} fold(s); "
              f"{result['truncated']} truncated, {result['skipped_lines']} lines skipped")
        if FLAGS.output_json:
            with open(FLAGS.output_json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
