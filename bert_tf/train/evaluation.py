"""Held-out evaluation during pre-training: masked-LM loss and accuracy (NSP too), and the accuracy
of always predicting the most frequent masked token, summed over every rank's share."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import tensorflow as tf

from bert_tf.artifacts import metrics
from bert_tf.data import input_pipeline
from bert_tf.parallel import distributed
from bert_tf.train.figures import is_mean


def make_evaluator(
    trainer, cfg, eval_files, vocab_size, masker, pack=0
) -> Callable[[int], metrics.EvalRecord]:
    """Returns evaluate(step) -> metrics.EvalRecord with held-out MLM loss/accuracy, NSP accuracy,
    and the accuracy of always predicting the most frequent masked token (a data-only baseline)."""
    if not eval_files:
        return _no_eval_files
    forward = tf.function(
        lambda f: trainer.model(f, dtype=trainer.dtype, training=False), jit_compile=False
    )

    def evaluate(step):
        dataset = input_pipeline.make_dataset(
            eval_files,
            cfg.micro_batch_size,
            cfg.max_seq_length,
            cfg.eval_predictions(),
            distributed.rank(),
            distributed.size(),
            training=False,
            masker=masker,
            pack=pack,
        )
        if cfg.eval_batches:
            dataset = dataset.take(cfg.eval_batches)
        sums, label_counts = {}, np.zeros([vocab_size], np.float64)
        for features in dataset:
            _add_batch(sums, label_counts, forward(features), features)
        total = distributed.sum_across_ranks(sums)
        # the most frequent masked token over all ranks' eval labels
        label_counts = distributed.sum_array_across_ranks(label_counts, name="eval_label_counts")
        return _eval_record(step, total, label_counts)

    return evaluate


def _add_batch(sums: dict, label_counts: np.ndarray, out, features) -> None:
    """One eval batch into this rank's sums (means weighted by the batch, counts as they are) and
    its masked labels into label_counts [vocab_size]."""
    n = float(tf.shape(features["input_ids"])[0])
    for key, value in out.present().items():
        if key != "loss":
            sums[key] = sums.get(key, 0.0) + float(value) * (n if is_mean(key) else 1.0)
    sums["sequences"] = sums.get("sequences", 0.0) + n
    ids = tf.boolean_mask(features["masked_lm_ids"], features["masked_lm_weights"] > 0).numpy()
    np.add.at(label_counts, ids, 1)


def _eval_record(step: int, total: dict, label_counts: np.ndarray) -> metrics.EvalRecord:
    """The held-out record from the sums and label counts over all ranks."""
    acc = metrics.accuracies(total)
    found = label_counts.any()
    n, p = total.get("mlm_weight", 0.0), acc.get("mlm_accuracy")
    return metrics.EvalRecord(
        step=step,
        eval_mlm_loss=total.get("mlm_loss", 0.0) / max(total.get("sequences", 0.0), 1.0),
        eval_sequences=total.get("sequences", 0.0),
        eval_mlm_accuracy=acc.get("mlm_accuracy"),
        eval_nsp_accuracy=acc.get("nsp_accuracy"),
        eval_nsp_loss=total["nsp_loss"] / max(total["sequences"], 1.0)
        if "nsp_loss" in total
        else None,
        eval_most_frequent_token=int(label_counts.argmax()) if found else None,
        eval_most_frequent_token_accuracy=label_counts.max() / max(n, 1.0) if found else None,
        eval_mlm_predictions=n if n else None,
        eval_mlm_accuracy_se=math.sqrt(p * (1.0 - p) / n) if n and p is not None else None,
    )


def _no_eval_files(step: int) -> metrics.EvalRecord:
    """The evaluator of a run without --eval_files, which the loop never calls (it asks for eval
    files first)."""
    raise ValueError("no --eval_files: nothing to evaluate")
