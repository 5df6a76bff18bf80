"""GLUE as distributed: each task's files and columns, its labels, and the server's submission
files.

The layout is the folder the standard GLUE download writes (one folder per task: CoLA, SST-2, MRPC,
STS-B, QQP, MNLI, QNLI, RTE, WNLI, each with train.tsv, dev.tsv, test.tsv; MNLI with dev_matched,
dev_mismatched, test_matched, test_mismatched). Train and dev files are required; a test file may be
missing (many copies of GLUE have none): the task is scored on dev as always, and no submission file
is written for that split (`missing_tests`; said in the log, glue.json and glue.md). Files are
tab-separated without quoting; CoLA's train and dev files have no header row, every other file has
one. Test files have no labels and start with an `index` column, which the submission files repeat.

`TaskInfo` is a task's metadata (`TASKS`), `read_split` a split's examples, `write_submission` the
server's file for a test split. glue_scoring scores the dev predictions as GLUE does; glue_sweep
fine-tunes a task (`GlueTask`) over settings and seeds.
"""

from __future__ import annotations

import csv
import dataclasses
import os

from bert_tf import ConfigError


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """A GLUE task's metadata: where its files are, their columns, its labels and metrics."""

    name: str  # the flag's name: cola, sst2, ...
    folder: str  # its folder in the GLUE download
    labels: tuple  # label strings as in the files (and in submissions); () for regression
    text_columns: tuple  # (first text, second text or None) in train/dev rows
    label_column: int  # in train/dev rows (-1: the last)
    columns: int  # fields per train/dev row (0: any count, as MNLI's train has 12, dev 16)
    test_text_columns: tuple  # in test rows, after which `index` is column 0
    dev_splits: tuple = ("dev",)
    test_splits: tuple = ("test",)
    submission: tuple = ()  # the server's file names, one per test split
    header: bool = True  # train/dev files start with a header row
    metrics: tuple = ("accuracy",)

    @property
    def is_regression(self) -> bool:
        return not self.labels


TASKS = {
    t.name: t
    for t in (
        TaskInfo(
            "cola",
            "CoLA",
            ("0", "1"),
            (3, None),
            1,
            4,
            (1, None),
            header=False,
            submission=("CoLA",),
            metrics=("matthews_corr",),
        ),
        TaskInfo("sst2", "SST-2", ("0", "1"), (0, None), 1, 2, (1, None), submission=("SST-2",)),
        TaskInfo(
            "mrpc",
            "MRPC",
            ("0", "1"),
            (3, 4),
            0,
            5,
            (3, 4),
            submission=("MRPC",),
            metrics=("f1", "accuracy"),
        ),
        TaskInfo(
            "stsb",
            "STS-B",
            (),
            (7, 8),
            -1,
            10,
            (7, 8),
            submission=("STS-B",),
            metrics=("pearson", "spearman"),
        ),
        TaskInfo(
            "qqp",
            "QQP",
            ("0", "1"),
            (3, 4),
            5,
            6,
            (1, 2),
            submission=("QQP",),
            metrics=("f1", "accuracy"),
        ),
        TaskInfo(
            "mnli",
            "MNLI",
            ("contradiction", "entailment", "neutral"),
            (8, 9),
            -1,
            0,
            (8, 9),
            dev_splits=("dev_matched", "dev_mismatched"),
            test_splits=("test_matched", "test_mismatched"),
            submission=("MNLI-m", "MNLI-mm"),
        ),
        TaskInfo(
            "qnli",
            "QNLI",
            ("entailment", "not_entailment"),
            (1, 2),
            3,
            4,
            (1, 2),
            submission=("QNLI",),
        ),
        TaskInfo(
            "rte",
            "RTE",
            ("entailment", "not_entailment"),
            (1, 2),
            3,
            4,
            (1, 2),
            submission=("RTE",),
        ),
        TaskInfo("wnli", "WNLI", ("0", "1"), (1, 2), 3, 4, (1, 2), submission=("WNLI",)),
    )
}


def parse_tasks(value: str) -> list:
    """--tasks: comma-separated names, or "all"."""
    names = (
        list(TASKS)
        if value.strip() == "all"
        else [n.strip().lower() for n in value.split(",") if n.strip()]
    )
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ConfigError(
            f"--tasks={value}: unknown task {', '.join(unknown) or '(none)'}; valid: "
            f"{', '.join(TASKS)} or all"
        )
    return names


@dataclasses.dataclass
class Example:
    guid: str  # "file:line" (train/dev) or the test file's index
    text_a: str
    text_b: str | None
    label: object  # the label's index (classification), a float (STS-B), None (test)


@dataclasses.dataclass
class Split:
    examples: list
    skipped: int = 0  # QQP's rows with missing fields, reported


def split_path(task: TaskInfo, data_dir: str, split: str) -> str:
    return os.path.join(data_dir, task.folder, f"{split}.tsv")


def missing_tests(task: TaskInfo, data_dir: str) -> list:
    """The task's test splits whose file is not in `data_dir` (no submission for them; dev is
    scored)."""
    return [
        split for split in task.test_splits if not os.path.exists(split_path(task, data_dir, split))
    ]


def check_files(names, data_dir) -> dict:
    """Reads every file of the tasks `names` (before any training): a missing or malformed train or
    dev file stops (ConfigError naming it), a test file may be missing. -> {task: [paths of missing
    test files]} for the tasks with any."""
    missing = {}
    for name in names:
        task = TASKS[name]
        absent = missing_tests(task, data_dir)
        for split in ("train", *task.dev_splits, *(s for s in task.test_splits if s not in absent)):
            read_split(task, data_dir, split)
        if absent:
            missing[name] = [split_path(task, data_dir, split) for split in absent]
    return missing


def read_split(task: TaskInfo, data_dir: str, split: str) -> Split:
    """One split's examples. A row of the wrong shape or with a label outside the task's set stops
    with the file and line, except QQP's rows with missing fields, which are skipped and counted
    (the distributed train file has a few; the caller reports the count)."""
    path = split_path(task, data_dir, split)
    if not os.path.exists(path):
        raise ConfigError(
            f"{task.name}: {path} not found (--data_dir is the folder the GLUE download writes, "
            f"with {task.folder}/{split}.tsv)"
        )
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
                    raise ConfigError(
                        f"{where}: {len(row)} fields, a {task.name} test row has at least "
                        f"{max(a, b or 0) + 1}"
                    )
                out.examples.append(
                    Example(row[0], row[a], row[b] if b is not None else None, None)
                )
                continue
            a, b = task.text_columns
            need = max(a, b or 0, task.label_column) + 1
            if (task.columns and len(row) != task.columns) or len(row) < need:
                if task.name == "qqp":
                    out.skipped += 1
                    continue
                expected = task.columns or f"at least {need}"
                raise ConfigError(f"{where}: {len(row)} fields, a {task.name} row has {expected}")
            out.examples.append(
                Example(
                    where,
                    row[a],
                    row[b] if b is not None else None,
                    _label(task, row[task.label_column], where),
                )
            )
    if not out.examples:
        raise ConfigError(f"{path}: no examples")
    return out


def _label(task: TaskInfo, value: str, where: str):
    if task.is_regression:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where}: {task.name} score {value!r} is not a number") from None
    if value not in task.labels:
        raise ConfigError(
            f"{where}: {task.name} label {value!r} is not one of {', '.join(task.labels)}"
        )
    return task.labels.index(value)


def write_submissions(task: TaskInfo, data_dir, result: dict, out_dir) -> list:
    """The server's files for the test splits `result` (run_task's) has predictions for: their
    paths."""
    return [
        write_submission(
            task, split, read_split(task, data_dir, split).examples, predictions, out_dir
        )
        for split, predictions in result["test_predictions"].items()
    ]


def write_submission(task: TaskInfo, split: str, examples, predictions, out_dir) -> str:
    """The GLUE server's file for one test split: `index` and `prediction`, label names as in the
    task's files (STS-B: the score, clipped to [0, 5])."""
    name = task.submission[task.test_splits.index(split)]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.tsv")
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        for example, prediction in zip(examples, predictions, strict=True):
            value = (
                f"{min(5.0, max(0.0, float(prediction))):.3f}"
                if task.is_regression
                else task.labels[prediction]
            )
            f.write(f"{example.guid}\t{value}\n")
    return path
