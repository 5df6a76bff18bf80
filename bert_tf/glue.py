"""GLUE as distributed: each task's files and columns, its labels, its metrics, the GLUE score, and
the server's submission files.

The layout is the folder the standard GLUE download writes (one folder per task: CoLA, SST-2, MRPC,
STS-B, QQP, MNLI, QNLI, RTE, WNLI, each with train.tsv, dev.tsv, test.tsv; MNLI with dev_matched,
dev_mismatched, test_matched, test_mismatched). Files are tab-separated without quoting; CoLA's
train and dev files have no header row, every other file has one. Test files have no labels and
start with an `index` column, which the submission files repeat.

Metrics as GLUE defines them (Wang et al. 2019): Matthews correlation for CoLA, Pearson and
Spearman correlation for STS-B, F1 of the positive class and accuracy for MRPC and QQP, accuracy for
the rest (MNLI on matched and mismatched dev). A task's score is the mean of its metrics (MNLI: of
matched and mismatched accuracy); the GLUE score is the mean over tasks (`glue_score`), and
`glue_score(..., without=("wnli",))` is the average BERT-style papers report (WNLI left out:
its dev set is adversarial, and BERT predicts the majority class).
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import math
import os

from bert_tf import ConfigError


@dataclasses.dataclass(frozen=True)
class Task:
    name: str                   # the flag's name: cola, sst2, ...
    folder: str                 # its folder in the GLUE download
    labels: tuple               # label strings as in the files (and in submissions); () for regression
    text_columns: tuple         # (first text, second text or None) in train/dev rows
    label_column: int           # in train/dev rows (-1: the last)
    columns: int                # fields per train/dev row (0: any count, as MNLI's train has 12, dev 16)
    test_text_columns: tuple    # in test rows, after which `index` is column 0
    dev_splits: tuple = ("dev",)
    test_splits: tuple = ("test",)
    submission: tuple = ()      # the server's file names, one per test split
    header: bool = True         # train/dev files start with a header row
    metrics: tuple = ("accuracy",)

    @property
    def is_regression(self) -> bool:
        return not self.labels


TASKS = {t.name: t for t in (
    Task("cola", "CoLA", ("0", "1"), (3, None), 1, 4, (1, None), header=False, submission=("CoLA",),
         metrics=("matthews_corr",)),
    Task("sst2", "SST-2", ("0", "1"), (0, None), 1, 2, (1, None), submission=("SST-2",)),
    Task("mrpc", "MRPC", ("0", "1"), (3, 4), 0, 5, (3, 4), submission=("MRPC",), metrics=("f1", "accuracy")),
    Task("stsb", "STS-B", (), (7, 8), -1, 10, (7, 8), submission=("STS-B",), metrics=("pearson", "spearman")),
    Task("qqp", "QQP", ("0", "1"), (3, 4), 5, 6, (1, 2), submission=("QQP",), metrics=("f1", "accuracy")),
    Task("mnli", "MNLI", ("contradiction", "entailment", "neutral"), (8, 9), -1, 0, (8, 9),
         dev_splits=("dev_matched", "dev_mismatched"), test_splits=("test_matched", "test_mismatched"),
         submission=("MNLI-m", "MNLI-mm")),
    Task("qnli", "QNLI", ("entailment", "not_entailment"), (1, 2), 3, 4, (1, 2), submission=("QNLI",)),
    Task("rte", "RTE", ("entailment", "not_entailment"), (1, 2), 3, 4, (1, 2), submission=("RTE",)),
    Task("wnli", "WNLI", ("0", "1"), (1, 2), 3, 4, (1, 2), submission=("WNLI",)),
)}


def parse_tasks(value: str) -> list:
    """--tasks: comma-separated names, or "all"."""
    names = list(TASKS) if value.strip() == "all" else [n.strip().lower() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ConfigError(f"--tasks={value}: unknown task {', '.join(unknown) or '(none)'}; valid: "
                          f"{', '.join(TASKS)} or all")
    return names


@dataclasses.dataclass
class Example:
    guid: str                   # "file:line" (train/dev) or the test file's index
    text_a: str
    text_b: str | None
    label: object               # the label's index (classification), a float (STS-B), None (test)


@dataclasses.dataclass
class Split:
    examples: list
    skipped: int = 0            # QQP's rows with missing fields, reported


def split_path(task: Task, data_dir: str, split: str) -> str:
    return os.path.join(data_dir, task.folder, f"{split}.tsv")


def read_split(task: Task, data_dir: str, split: str) -> Split:
    """One split's examples. A row of the wrong shape or with a label outside the task's set stops
    with the file and line, except QQP's rows with missing fields, which are skipped and counted
    (the distributed train file has a few; the caller reports the count)."""
    path = split_path(task, data_dir, split)
    if not os.path.exists(path):
        raise ConfigError(f"{task.name}: {path} not found (--data_dir is the folder the GLUE download "
                          f"writes, with {task.folder}/{split}.tsv)")
    test = split.startswith("test")
    out = Split([])
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        for line, row in enumerate(rows, start=1):
            if line == 1 and (test or task.header):
                continue
            where = f"{path}:{line}"
            if test:
                a, b = task.test_text_columns
                if len(row) <= max(a, b or 0):
                    raise ConfigError(f"{where}: {len(row)} fields, a {task.name} test row has at least "
                                      f"{max(a, b or 0) + 1}")
                out.examples.append(Example(row[0], row[a], row[b] if b is not None else None, None))
                continue
            a, b = task.text_columns
            need = max(a, b or 0, task.label_column) + 1
            if (task.columns and len(row) != task.columns) or len(row) < need:
                if task.name == "qqp":
                    out.skipped += 1
                    continue
                expected = task.columns or f"at least {need}"
                raise ConfigError(f"{where}: {len(row)} fields, a {task.name} row has {expected}")
            out.examples.append(Example(where, row[a], row[b] if b is not None else None,
                                        _label(task, row[task.label_column], where)))
    if not out.examples:
        raise ConfigError(f"{path}: no examples")
    return out


def _label(task: Task, value: str, where: str):
    if task.is_regression:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where}: {task.name} score {value!r} is not a number") from None
    if value not in task.labels:
        raise ConfigError(f"{where}: {task.name} label {value!r} is not one of {', '.join(task.labels)}")
    return task.labels.index(value)


# -- metrics ------------------------------------------------------------------------------------
def accuracy(labels, predictions) -> float:
    return sum(int(a == b) for a, b in zip(labels, predictions)) / len(labels)


def f1(labels, predictions, positive=1) -> float:
    tp = sum(1 for a, b in zip(labels, predictions) if a == b == positive)
    predicted, actual = sum(1 for b in predictions if b == positive), sum(1 for a in labels if a == positive)
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


METRICS = {"accuracy": accuracy, "f1": f1, "matthews_corr": matthews_corr, "pearson": pearson,
           "spearman": spearman}


def score(task: Task, labels, predictions) -> dict:
    """{metric: value} of one dev split; labels and predictions as label indices (STS-B: floats)."""
    if len(labels) != len(predictions) or not labels:
        raise ValueError(f"{task.name}: {len(predictions)} predictions for {len(labels)} labels")
    return {name: METRICS[name](labels, predictions) for name in task.metrics}


def task_score(task: Task, results: dict) -> float:
    """One number per task: the mean of its metrics over its dev splits. results: {split: {metric: v}}."""
    values = [v for split in task.dev_splits for v in results[split].values()]
    return sum(values) / len(values)


def glue_score(results: dict, without=()) -> float:
    """The mean of the tasks' scores. results: {task name: {split: {metric: value}}}."""
    names = [n for n in results if n not in without]
    if not names:
        raise ValueError("no task to average")
    return sum(task_score(TASKS[n], results[n]) for n in names) / len(names)


def write_submission(task: Task, split: str, examples, predictions, out_dir) -> str:
    """The GLUE server's file for one test split: `index` and `prediction`, label names as in the
    task's files (STS-B: the score, clipped to [0, 5])."""
    name = task.submission[task.test_splits.index(split)]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.tsv")
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        for example, prediction in zip(examples, predictions, strict=True):
            value = f"{min(5.0, max(0.0, float(prediction))):.3f}" if task.is_regression else task.labels[prediction]
            f.write(f"{example.guid}\t{value}\n")
    return path
