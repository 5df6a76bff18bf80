"""Fine-tunes a sentence(-pair) classifier from a pre-trained encoder; k-fold cross-validation;
a probe over a pre-training run's checkpoints. Defaults: the standard BERT recipe
(finetuning.Recipe: AdamW 2e-5, batch 32, 3 epochs, 10% warmup, sequence 128).

    python run/finetune.py --train_file=data/corpus/pang_lee_polarity.cor --kfold=5 \
        --init_checkpoint=runs/demo --vocab_file=data/demo/vocab.txt \
        --output_json=runs/finetune.json
    python run/finetune.py ... --random_init \
        --bert_config_file=runs/demo/bert_config.json            # baseline
    python run/finetune.py ... --probe_checkpoint_dir=runs/demo  # every checkpoint -> metrics.jsonl
    mpirun -np 2 python run/finetune.py ...                      # ranks share every batch
"""

import dataclasses
import json
import os

import numpy as np

from bert_tf import ConfigError, cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """run/finetune.py's flags: the examples, where it starts from, the recipe, and the outputs."""

    train_file: str | None = knob(
        None,
        "Labelled examples (label<TAB>text[<TAB>text_b], CSV, or __label__X text).",
        required=True,
    )
    eval_file: str = knob(
        "", "Held-out examples; without it, --kfold cross-validates on --train_file."
    )
    kfold: int = knob(5, "Folds for cross-validation when there is no --eval_file.")
    start: knobs.FinetuneStart = knobs.FinetuneStart()
    max_seq_length: int = knob(128, "Longer examples are truncated (and counted).")
    epochs: float = knobs.epochs(3.0)
    global_batch_size: int = knob(
        32, "Examples per optimizer update over all ranks (a multiple of the rank count)."
    )
    learning_rate: float = knob(
        2e-5, "AdamW peak learning rate (10% linear warmup, then linear decay)."
    )
    seed: int = knob(0, "Seed for folds, initialisation and order.")
    output_json: str = knobs.output_json("the metrics")
    probe_checkpoint_dir: str = knob(
        "",
        "Run the probe on every checkpoint of this pre-training run and append kind=probe records "
        "to its metrics.jsonl.",
    )


cli.define_config_flags(FinetuneConfig)
cli.define_renamed("batch_size", "global_batch_size")


def cross_validate(cfg, model_config, tokenizer, examples, checkpoint, hvd, label_names):
    """Each fold (or the --eval_file) a classification.Classification through finetuning.run:
    (result, last model)."""
    from bert_tf.parallel import distributed
    from bert_tf.tasks import classification, finetuning

    x, y, truncated = classification.encode(examples, tokenizer, cfg.max_seq_length, label_names)
    labelled = classification.Labelled(x, y)
    if cfg.eval_file:
        ex, ey, t2 = classification.encode(
            classification.read_examples(cfg.eval_file), tokenizer, cfg.max_seq_length, label_names
        )
        data = [(labelled, classification.Labelled(ex, ey))]
        truncated += t2
    else:
        data = [
            (labelled.rows(tr), labelled.rows(te))
            for tr, te in classification.kfold_splits(len(y), cfg.kfold, cfg.seed)
        ]
    recipe = finetuning.Recipe(
        learning_rate=cfg.learning_rate,
        global_batch=cfg.global_batch_size,
        epochs=cfg.epochs,
        max_seq_length=cfg.max_seq_length,
        seed=cfg.seed,
    )
    dist = finetuning.Distributed(
        hvd.rank(),
        hvd.size(),
        distributed.make_gradient_allreduce(False, name="ft"),
        distributed.broadcast_variables,
    )
    folds, model = [], None
    for train, evaluation in data:
        outcome = finetuning.run(
            classification.Classification(label_names, train, evaluation),
            tokenizer,
            model_config,
            checkpoint,
            recipe,
            dist,
        )
        folds.append(classification.report(outcome))
        model = outcome.model
    accuracies = [f["accuracy"] for f in folds]
    return {
        "folds": folds,
        "accuracy_mean": float(np.mean(accuracies)),
        "accuracy_std": float(np.std(accuracies)),
        "truncated": truncated,
        "skipped_lines": examples.skipped,
        "labels": label_names,
        "init": checkpoint.path if hasattr(checkpoint, "path") else checkpoint or "random",
    }, model


def probe(cfg, tokenizer, examples, hvd, label_names):
    """--probe_checkpoint_dir: cross-validates from every checkpoint of a pre-training run, into its
    metrics.jsonl."""
    import tensorflow as tf
    from bert_tf.model import modeling

    state = tf.train.get_checkpoint_state(cfg.probe_checkpoint_dir)
    if not state:
        raise ConfigError(
            f"--probe_checkpoint_dir={cfg.probe_checkpoint_dir}: no checkpoints there"
        )
    config = modeling.BertConfig.from_json_file(
        os.path.join(cfg.probe_checkpoint_dir, "bert_config.json")
    )
    for ckpt in state.all_model_checkpoint_paths:
        result, _ = cross_validate(cfg, config, tokenizer, examples, ckpt, hvd, label_names)
        step = int(ckpt.rsplit("-", 1)[1])
        record = {
            "kind": "probe",
            "step": step,
            "probe_accuracy": result["accuracy_mean"],
            "probe_accuracy_std": result["accuracy_std"],
            "probe_task": os.path.basename(cfg.train_file),
        }
        if hvd.rank() == 0:
            with open(os.path.join(cfg.probe_checkpoint_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            print(
                f"probe step {step}: accuracy {result['accuracy_mean']:.4f} ± "
                f"{result['accuracy_std']:.4f}"
            )


def main(_):
    from bert_tf.data import tokenization
    from bert_tf.parallel import distributed
    from bert_tf.tasks import classification

    cfg = cli.config_from_flags(FinetuneConfig)
    hvd = distributed.init()
    examples = classification.read_examples(cfg.train_file)
    label_names = sorted(set(examples.labels))
    if cfg.probe_checkpoint_dir:
        tokenizer = tokenization.Tokenizer.from_file(cfg.start.vocab_file, cfg.start.do_lower_case)
        probe(cfg, tokenizer, examples, hvd, label_names)
        return
    tokenizer, checkpoint, config = cli.finetune_start(
        cfg.start, cfg.max_seq_length
    )  # read once for all folds
    result, _ = cross_validate(cfg, config, tokenizer, examples, checkpoint, hvd, label_names)
    if hvd.rank() == 0:
        print(
            f"{'random init' if checkpoint is None else checkpoint.path}: accuracy "
            f"{result['accuracy_mean']:.4f} ± {result['accuracy_std']:.4f} over "
            f"{len(result['folds'])} fold(s); {result['truncated']} truncated, "
            f"{result['skipped_lines']} lines skipped"
        )
        if cfg.output_json:
            with open(cfg.output_json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
