"""GLUE's metrics and scores as GLUE defines them (Wang et al. 2019): Matthews correlation for
CoLA, Pearson and Spearman correlation for STS-B, F1 of the positive class and accuracy for MRPC and
QQP, accuracy for the rest (MNLI on matched and mismatched dev). A task's score is the mean of its
metrics (MNLI: of matched and mismatched accuracy); the GLUE score is the mean over tasks
(`glue_score`), and `glue_score(..., without=("wnli",))` is the average BERT-style papers report
(WNLI left out: its dev set is adversarial, and BERT predicts the majority class).
"""

from __future__ import annotations

import collections
import math

from bert_tf.tasks.glue import TASKS, TaskInfo


def accuracy(labels, predictions) -> float:
    return sum(int(a == b) for a, b in zip(labels, predictions)) / len(labels)


def f1(labels, predictions, positive=1) -> float:
    tp = sum(1 for a, b in zip(labels, predictions) if a == b == positive)
    predicted, actual = (
        sum(1 for b in predictions if b == positive),
        sum(1 for a in labels if a == positive),
    )
    return 2 * tp / (predicted + actual) if predicted + actual else 0.0


def matthews_corr(labels, predictions) -> float:
    """Binary Matthews correlation; 0 when a row or column of the confusion matrix is empty."""
    counts = collections.Counter(zip(labels, predictions))
    tp, tn, fp, fn = counts[(1, 1)], counts[(0, 0)], counts[(0, 1)], counts[(1, 0)]
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pearson(x, y) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else 0.0


def ranks(values) -> list:
    """1-based ranks, ties sharing the mean of their ranks (as Spearman's correlation needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x, y) -> float:
    return pearson(ranks(x), ranks(y))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_corr": matthews_corr,
    "pearson": pearson,
    "spearman": spearman,
}


def score(task: TaskInfo, labels, predictions) -> dict:
    """{metric: value} of one dev split; labels and predictions as label indices (STS-B: floats)."""
    if len(labels) != len(predictions) or not labels:
        raise ValueError(f"{task.name}: {len(predictions)} predictions for {len(labels)} labels")
    return {name: METRICS[name](labels, predictions) for name in task.metrics}


def task_score(task: TaskInfo, results: dict) -> float:
    """One number per task: the mean of its metrics over its dev splits. results: {split: {metric:
    v}}."""
    values = [v for split in task.dev_splits for v in results[split].values()]
    return sum(values) / len(values)


def glue_score(results: dict, without=()) -> float:
    """The mean of the tasks' scores. results: {task name: {split: {metric: value}}}."""
    names = [n for n in results if n not in without]
    if not names:
        raise ValueError("no task to average")
    return sum(task_score(TASKS[n], results[n]) for n in names) / len(names)
