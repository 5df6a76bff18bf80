"""Fine-tuning: labelled text in, a classifier on the pre-trained encoder's pooled output.

Input files (one example per line):
    label<TAB>text                 sentence classification (TSV; .csv with commas)
    label<TAB>text_a<TAB>text_b    sentence-pair classification
    __label__X text                fastText style
Empty or unlabelled lines are skipped and counted; a file with nothing left is an error.

The classifier is `BertClassifier`: the encoder of `modeling.py` (loaded from a pre-training
checkpoint, an export, google-research/bert or Hugging Face; heads dropped) + dropout + a dense
layer. Like the pre-training model it returns a dict of float32 scalars with a "loss" (and counts:
correct, count), so `training.Trainer` (AdamW, warmup, precision, the gradient exchange) trains it
unchanged. `Classification` is the finetuning.FinetuningTask of encoded examples (run/finetune.py's
files, a fold or a held-out file): finetuning.run fine-tunes and scores it.
"""

from __future__ import annotations

import csv
import dataclasses
import os

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.model import modeling
from bert_tf.tasks import finetuning
from bert_tf.tasks.finetuning import (
    load_encoder as load_encoder,
)  # its old home: callers and tests import it here


@dataclasses.dataclass
class Examples:
    labels: list
    texts_a: list
    texts_b: list  # None entries for single sentences
    skipped: int = 0


def read_examples(path) -> Examples:
    if not os.path.isfile(path):
        raise ConfigError(f"input file not found: {path}")
    out = Examples([], [], [])
    delimiter = "," if path.endswith(".csv") else "\t"
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\r\n")
            if line.startswith("__label__"):
                label, _, text = line.partition(" ")
                fields = [label[len("__label__") :], text]
            else:
                fields = next(csv.reader([line], delimiter=delimiter)) if line.strip() else []
            fields = [x.strip() for x in fields]
            if len(fields) < 2 or not fields[0] or not fields[1]:
                out.skipped += 1
                continue
            out.labels.append(fields[0])
            out.texts_a.append(fields[1])
            out.texts_b.append(fields[2] if len(fields) > 2 and fields[2] else None)
    if not out.labels:
        raise ConfigError(
            f"{path}: no labelled examples ({out.skipped} lines skipped as empty or unlabelled)"
        )
    return out


def encode(examples: Examples, tokenizer, max_seq_length, label_names):
    """-> (features dict of int32 arrays, labels int32 [N], number of truncated examples)."""
    unknown = sorted(set(examples.labels) - set(label_names))
    if unknown:
        raise ConfigError(f"labels {unknown} are not among the training labels {label_names}")
    features, truncated = encode_texts(
        examples.texts_a, examples.texts_b, tokenizer, max_seq_length
    )
    labels = np.array([label_names.index(x) for x in examples.labels], np.int32)
    return features, labels, truncated


def encode_texts(texts_a, texts_b, tokenizer, max_seq_length):
    """[CLS] a [SEP] (b [SEP]) as google's run_classifier builds it, the longer text truncated
    first. texts_b: None entries for single sentences. -> (features dict of int32 arrays, truncated
    count)."""
    a = tokenizer.tokenize(list(texts_a))
    b = tokenizer.tokenize([t or "" for t in texts_b])
    n = len(a)
    ids = np.zeros([n, max_seq_length], np.int32)
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    truncated = 0
    for i in range(n):
        tokens_a, tokens_b = list(a[i]), list(b[i]) if texts_b[i] else []
        budget = max_seq_length - (3 if tokens_b else 2)
        if len(tokens_a) + len(tokens_b) > budget:
            truncated += 1
            while len(tokens_a) + len(tokens_b) > budget:
                (tokens_a if len(tokens_a) >= len(tokens_b) else tokens_b).pop()
        row = [tokenizer.cls_id] + tokens_a + [tokenizer.sep_id]
        seg = [0] * len(row)
        if tokens_b:
            row += tokens_b + [tokenizer.sep_id]
            seg += [1] * (len(tokens_b) + 1)
        ids[i, : len(row)], mask[i, : len(row)], segments[i, : len(row)] = row, 1, seg
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}, truncated


class BertClassifier(tf.Module):
    """Encoder -> pooled [B, H] -> dropout -> dense [B, num_labels]; loss, correct and count.
    regression (STS-B): one output, mean squared error against a float "label"."""

    def __init__(self, config: modeling.BertConfig, num_labels: int, regression=False, name=None):
        super().__init__(name=name)
        if regression and num_labels != 1:
            raise ValueError(f"a regression head has 1 output, not {num_labels}")
        self.config, self.regression = config, regression
        self.encoder = modeling.encoder(config)
        self.classifier = modeling.Dense(config.hidden_size, num_labels, config.initializer_range)
        self.dropout_rate = config.hidden_dropout_prob

    def logits(self, features, dtype=tf.float32, seed=None, training=False):
        """[B, num_labels] float32 (regression: [B, 1], the predicted score)."""
        seed = tf.zeros([2], tf.int32) if seed is None else seed
        _, pooled = self.encoder(
            features["input_ids"],
            features["input_mask"],
            features["segment_ids"],
            dtype=dtype,
            seed=seed,
            training=training,
        )
        pooled = modeling.dropout(
            pooled, self.dropout_rate, tf.random.experimental.stateless_fold_in(seed, 7), training
        )
        return tf.cast(self.classifier(pooled), tf.float32)

    def predict(self, features):
        """Label indices [B], or scores [B] for regression."""
        logits = self.logits(features)
        return logits[:, 0] if self.regression else tf.argmax(logits, -1, output_type=tf.int32)

    def __call__(
        self, features, *, dtype=tf.float32, seed=None, training=False
    ) -> finetuning.FinetuneOutput:
        logits = self.logits(features, dtype, seed, training)
        labels = features["label"]
        count = tf.cast(tf.size(labels), tf.float32)
        if self.regression:
            loss = tf.reduce_mean(tf.square(logits[:, 0] - tf.cast(labels, tf.float32)))
            return finetuning.FinetuneOutput(loss=loss, count=count)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        )
        correct = tf.reduce_sum(
            tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)
        )
        return finetuning.FinetuneOutput(loss=loss, correct=correct, count=count)


def kfold_splits(n, k, seed):
    """k (train, test) index arrays: test folds are disjoint and cover range(n)."""
    order = np.random.RandomState(seed).permutation(n)
    folds = np.array_split(order, k)
    return [
        (np.sort(np.concatenate([f for j, f in enumerate(folds) if j != i])), np.sort(folds[i]))
        for i in range(k)
    ]


def binary_f1(labels, predictions, positive=1):
    tp = int(np.sum((predictions == positive) & (labels == positive)))
    fp = int(np.sum((predictions == positive) & (labels != positive)))
    fn = int(np.sum((predictions != positive) & (labels == positive)))
    return 2 * tp / max(2 * tp + fp + fn, 1)


@dataclasses.dataclass
class Labelled:
    """Encoded examples (`encode`): the model's features and their label indices [N]."""

    features: dict[str, np.ndarray]
    labels: np.ndarray

    def rows(self, index) -> Labelled:
        return Labelled({k: v[index] for k, v in self.features.items()}, self.labels[index])


@dataclasses.dataclass
class Predicted:
    """A classification's predictions: the label index predicted for every evaluation example, and
    its label."""

    predicted: np.ndarray
    labels: np.ndarray


@dataclasses.dataclass
class Classification:
    """finetuning.FinetuningTask: sentence(-pair) classification of encoded examples (the tokenizer
    is not needed again), a BertClassifier over `label_names`; accuracy, and the F1 of label 1 with
    two labels."""

    label_names: list
    train: Labelled
    evaluation: Labelled
    name: str = "classification"

    def build_model(self, config: modeling.BertConfig) -> BertClassifier:
        return BertClassifier(config, len(self.label_names))

    def train_features(self, tokenizer=None) -> dict[str, np.ndarray]:
        return {**self.train.features, "label": self.train.labels}

    def predict(self, model, tokenizer=None) -> Predicted:
        return Predicted(
            finetuning.predict(model.predict, self.evaluation.features), self.evaluation.labels
        )

    def metrics(self, predictions: Predicted) -> dict[str, float]:
        metrics = {
            "accuracy": float(np.mean(predictions.predicted == predictions.labels)),
            "eval_examples": int(len(predictions.labels)),
        }
        if len(self.label_names) == 2:
            metrics["f1"] = binary_f1(predictions.labels, predictions.predicted)
        return metrics


def report(outcome: finetuning.Outcome) -> dict:
    """A classification run's figures as run/finetune.py writes them (each fold's): its metrics and
    training."""
    metrics = dict(outcome.metrics)
    first = {k: metrics.pop(k) for k in ("accuracy", "eval_examples")}
    return {
        **first,
        "train_steps": outcome.train_steps,
        "final_train_loss": outcome.final_train_loss,
        **metrics,
    }


def train_and_evaluate(
    model_config,
    label_names,
    train,
    evaluation,
    init_checkpoint=None,
    vocab_size=None,
    epochs=3,
    per_rank_batch=32,
    learning_rate=2e-5,
    warmup_fraction=0.1,
    seed=0,
    precision="float32",
    exchange=None,
    broadcast=None,
    rank=0,
    size=1,
):
    """finetuning.run on a Classification (encoder from `init_checkpoint`, else random), for callers
    of the older shape. train / evaluation: (features dict of numpy arrays, labels). per_rank_batch:
    examples per rank per update. exchange: the gradient exchange (a GradientExchange), broadcast:
    rank 0's variables to all, for a finetuning.Distributed. vocab_size: checked against the
    checkpoint's. Returns (report's metrics, model)."""
    from bert_tf.artifacts import checkpoint_formats

    init = None
    if init_checkpoint:
        init = (
            init_checkpoint
            if isinstance(init_checkpoint, checkpoint_formats.Checkpoint)
            else checkpoint_formats.read(init_checkpoint)
        )
        if vocab_size is not None:
            checkpoint_formats.check_fits(init, model_config, vocab_size)
    task = Classification(label_names, Labelled(*train), Labelled(*evaluation))
    recipe = finetuning.Recipe(
        learning_rate=learning_rate,
        global_batch=per_rank_batch * size,
        epochs=epochs,
        warmup_fraction=warmup_fraction,
        seed=seed,
        precision=precision,
    )
    outcome = finetuning.run(
        task,
        None,
        model_config,
        init,
        recipe,
        finetuning.Distributed(rank, size, exchange, broadcast),
    )
    return report(outcome), outcome.model


class ServingEncoder(tf.Module):
    """SavedModel signature: token ids [B, S] (int32) -> sequence_output [B, S, H], pooled_output
    [B, H]."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="input_ids"),
            tf.TensorSpec([None, None], tf.int32, name="input_mask"),
            tf.TensorSpec([None, None], tf.int32, name="segment_ids"),
        ]
    )
    def serve(self, input_ids, input_mask, segment_ids):
        sequence, pooled = self.encoder(input_ids, input_mask, segment_ids)
        return {"sequence_output": sequence, "pooled_output": pooled}
