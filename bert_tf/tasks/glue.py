"""GLUE as distributed: each task's files and columns, its labels, its metrics, the GLUE score, and
the server's submission files.

The layout is the folder the standard GLUE download writes (one folder per task: CoLA, SST-2, MRPC,
STS-B, QQP, MNLI, QNLI, RTE, WNLI, each with train.tsv, dev.tsv, test.tsv; MNLI with dev_matched,
dev_mismatched, test_matched, test_mismatched). Train and dev files are required; a test file may be
missing (many copies of GLUE have none): the task is scored on dev as always, and no submission file
is written for that split (`missing_tests`; said in the log, glue.json and glue.md). Files are
tab-separated without quoting; CoLA's train and dev files have no header row, every other file has
one. Test files have no labels and start with an `index` column, which the submission files repeat.

Metrics as GLUE defines them (Wang et al. 2019): Matthews correlation for CoLA, Pearson and
Spearman correlation for STS-B, F1 of the positive class and accuracy for MRPC and QQP, accuracy for
the rest (MNLI on matched and mismatched dev). A task's score is the mean of its metrics (MNLI: of
matched and mismatched accuracy); the GLUE score is the mean over tasks (`glue_score`), and
`glue_score(..., without=("wnli",))` is the average BERT-style papers report (WNLI left out:
its dev set is adversarial, and BERT predicts the majority class).

`TaskInfo` is a task's metadata (`TASKS`); `GlueTask`, a task's splits read from the download, is
the finetuning.FinetuningTask that finetuning.run fine-tunes, and `run_task` sweeps it over settings
and seeds.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import math
import os
from typing import TYPE_CHECKING

from bert_tf import ConfigError

if TYPE_CHECKING:
    from bert_tf.tasks import finetuning


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
            f"{task.name}: {path} not found (--data_dir is the folder the GLUE download "
            f"writes, with {task.folder}/{split}.tsv)"
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


# -- metrics ------------------------------------------------------------------------------------
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


# -- the protocol -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
    learning_rate: float
    batch_size: int  # sequences per update over all ranks
    epochs: float

    def label(self) -> str:
        return f"lr {self.learning_rate:g}, batch {self.batch_size}, {self.epochs:g} epochs"


def sweep(learning_rates, batch_sizes, epochs) -> list:
    """Every combination, in the order given (the recipe alone: 2e-5 x 32 x 3)."""
    return [Setting(lr, b, e) for lr in learning_rates for b in batch_sizes for e in epochs]


def encode_split(task: TaskInfo, split: Split, tokenizer, max_seq_length):
    """-> (features with "label" where the split has labels, number of truncated examples)."""
    from bert_tf.tasks import classification
    import numpy as np

    examples = split.examples
    features, truncated = classification.encode_texts(
        [e.text_a for e in examples], [e.text_b for e in examples], tokenizer, max_seq_length
    )
    if examples[0].label is not None:
        features["label"] = np.array(
            [e.label for e in examples], np.float32 if task.is_regression else np.int32
        )
    return features, truncated


@dataclasses.dataclass
class GluePredictions:
    """A GlueTask's predictions (label indices; STS-B: scores) per dev split with its labels, and
    per test split."""

    dev: dict[str, list]
    labels: dict[str, list]
    test: dict[str, list]


class GlueTask:
    """One GLUE task as a finetuning.FinetuningTask: its splits (the test splits whose file exists)
    encoded once per tokenizer; a BertClassifier (STS-B: a regressor); dev metrics as GLUE defines
    them and the task's "score"."""

    def __init__(
        self, info: TaskInfo, splits: dict[str, Split], max_seq_length: int, missing_test_files=()
    ):
        self.info, self.name, self.splits, self.max_seq_length = (
            info,
            info.name,
            splits,
            max_seq_length,
        )
        self.tests = [name for name in info.test_splits if name in splits]
        self.missing_test_files = list(missing_test_files)
        self._encoded: tuple | None = None  # (tokenizer, {split: (features, truncated)})

    @classmethod
    def read(cls, info: TaskInfo, data_dir: str, max_seq_length: int, log=print) -> GlueTask:
        """The task's files in `data_dir`; QQP's train rows with missing fields skipped (and
        said)."""
        missing = missing_tests(info, data_dir)
        names = (
            "train",
            *info.dev_splits,
            *(name for name in info.test_splits if name not in missing),
        )
        splits = {name: read_split(info, data_dir, name) for name in names}
        if splits["train"].skipped:
            log(
                f"{info.name}: {splits['train'].skipped} rows of "
                f"{split_path(info, data_dir, 'train')} have missing "
                f"fields: skipped"
            )
        for name in names[1:]:
            if splits[name].skipped:
                raise ConfigError(
                    f"{split_path(info, data_dir, name)}: {splits[name].skipped} rows have missing "
                    f"fields (a score on the rest would not be the task's)"
                )
        return cls(
            info, splits, max_seq_length, [split_path(info, data_dir, name) for name in missing]
        )

    def encoded(self, tokenizer) -> dict:
        """{split: (features, truncated examples)}, "label" among the features of the splits with
        labels."""
        if self._encoded is None or self._encoded[0] is not tokenizer:
            self._encoded = (
                tokenizer,
                {
                    name: encode_split(self.info, split, tokenizer, self.max_seq_length)
                    for name, split in self.splits.items()
                },
            )
        return self._encoded[1]

    def build_model(self, config):
        from bert_tf.tasks import classification

        regression = self.info.is_regression
        return classification.BertClassifier(
            config, 1 if regression else len(self.info.labels), regression=regression
        )

    def train_features(self, tokenizer) -> dict:
        return self.encoded(tokenizer)["train"][0]

    def predict(self, model, tokenizer) -> GluePredictions:
        from bert_tf.tasks import finetuning

        features = {name: f for name, (f, _) in self.encoded(tokenizer).items()}
        out = {
            name: finetuning.predict(
                model.predict, {k: v for k, v in features[name].items() if k != "label"}
            )
            for name in (*self.info.dev_splits, *self.tests)
        }
        dev = self.info.dev_splits
        return GluePredictions(
            {n: out[n].tolist() for n in dev},
            {n: features[n]["label"].tolist() for n in dev},
            {n: out[n].tolist() for n in self.tests},
        )

    def scores(self, p: GluePredictions) -> dict:
        """{dev split: {metric: value}}."""
        return {
            name: score(self.info, p.labels[name], p.dev[name]) for name in self.info.dev_splits
        }

    def metrics(self, predictions: GluePredictions) -> dict[str, float]:
        scores = self.scores(predictions)
        return {
            **{f"{name}/{m}": v for name, d in scores.items() for m, v in d.items()},
            "score": task_score(self.info, scores),
        }


def select(summaries: list) -> dict:
    """The setting to report: the best median dev score over its seeds (a median, so one lucky seed
    does not pick it); the first of equals."""
    return max(summaries, key=lambda s: s["score"]["median"])


def _summaries(task: TaskInfo, runs):
    """(a summary per setting: its score and dev metrics over the seeds, {Setting: its runs})."""
    from bert_tf.tasks import finetuning

    by_setting = {}
    for run in runs:
        by_setting.setdefault(Setting(**run["setting"]), []).append(run)
    summaries = []
    for setting, group in by_setting.items():
        metrics = {
            f"{name}/{m}": finetuning.summarize([g["dev"][name][m] for g in group])
            for name in task.dev_splits
            for m in task.metrics
        }
        summaries.append(
            {
                "setting": dataclasses.asdict(setting),
                "score": finetuning.summarize([g["score"] for g in group]),
                "metrics": metrics,
            }
        )
    return summaries, by_setting


def run_task(
    task: TaskInfo,
    data_dir,
    tokenizer,
    model_config,
    init,
    settings,
    seeds,
    recipe,
    distributed: finetuning.Distributed | None = None,
    log=print,
    keep_model=False,
) -> dict:
    """Fine-tunes `task` (a GlueTask through finetuning.run) once per setting and seed, scores every
    dev split, and keeps the test predictions of the selected run (for the test splits whose file
    exists; the others are listed in "missing_test_files"): the setting with the best median dev
    score over the seeds, and within it the seed with the best dev score (selection on dev, as
    papers report dev results). init: a read checkpoint (checkpoint_formats.read) or None for random
    initialisation. recipe: the other fine-tuning settings (finetuning.Recipe). distributed:
    finetuning.Distributed (None: one process). keep_model: the selected run's model is returned too
    ("model"), for finetuning.export."""
    from bert_tf.tasks import finetuning

    glue_task = GlueTask.read(task, data_dir, recipe.max_seq_length, log)
    glue_task.encoded(tokenizer)  # every split encoded before any training
    runs, kept = [], {}  # kept: the best seed's model of each setting (keep_model)
    for setting in settings:
        for seed in seeds:
            r = dataclasses.replace(
                recipe,
                learning_rate=setting.learning_rate,
                global_batch=setting.batch_size,
                epochs=setting.epochs,
                seed=seed,
            )
            outcome = finetuning.run(glue_task, tokenizer, model_config, init, r, distributed)
            dev = glue_task.scores(outcome.predictions)
            runs.append(
                {
                    "setting": dataclasses.asdict(setting),
                    "seed": seed,
                    "dev": dev,
                    "score": outcome.metrics["score"],
                    "train_steps": outcome.train_steps,
                    "final_train_loss": outcome.final_train_loss,
                    "test_predictions": outcome.predictions.test,
                }
            )
            if keep_model and (setting not in kept or runs[-1]["score"] > kept[setting][0]):
                kept[setting] = (runs[-1]["score"], outcome.model)
            log(
                f"{task.name}: {setting.label()}, seed {seed}: "
                + "; ".join(
                    f"{name} " + ", ".join(f"{m} {v:.4f}" for m, v in d.items())
                    for name, d in dev.items()
                )
            )
    return _result(glue_task, tokenizer, runs, kept if keep_model else None)


def _result(glue_task: GlueTask, tokenizer, runs: list, kept: dict | None) -> dict:
    """run_task's result: the summaries, the selected setting and seed, the runs, the selected test
    predictions."""
    summaries, by_setting = _summaries(glue_task.info, runs)
    best = select(summaries)
    chosen = max(by_setting[Setting(**best["setting"])], key=lambda g: g["score"])
    out = {"model": kept[Setting(**best["setting"])][1]} if kept is not None else {}
    encoded = glue_task.encoded(tokenizer)
    return {
        **out,
        "task": glue_task.name,
        "examples": {name: len(s.examples) for name, s in glue_task.splits.items()},
        "truncated": {name: t for name, (_, t) in encoded.items() if t},
        "train_rows_skipped": glue_task.splits["train"].skipped,
        "settings": summaries,
        "missing_test_files": glue_task.missing_test_files,
        "selected": {
            "setting": best["setting"],
            "seed": chosen["seed"],
            "by": "best median dev score over "
            "the seeds; test predictions from its best seed on dev",
        },
        "runs": [{k: v for k, v in run.items() if k != "test_predictions"} for run in runs],
        "test_predictions": chosen["test_predictions"],
    }


def markdown(results: dict, recipe, seeds) -> str:
    """The tables people compare with papers: per task and setting, dev metrics as mean ± std and
    median over the seeds, then the GLUE score of the selected settings."""
    lines = [
        f"Dev set, {len(seeds)} seed(s) per setting ({', '.join(map(str, seeds))}); sequence "
        f"{recipe.max_seq_length}, warmup {recipe.warmup_fraction:g}, AdamW "
        f"(weight decay {recipe.weight_decay:g}), precision {recipe.precision}. Selection on dev.",
        "",
        "| task | setting | metric | mean ± std | median | selected |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        for summary in result["settings"]:
            chosen = "yes" if summary["setting"] == result["selected"]["setting"] else ""
            label = Setting(**summary["setting"]).label()
            for metric, s in summary["metrics"].items():
                lines.append(
                    f"| {name} | {label} | {metric} | {100 * s['mean']:.2f} ± {100 * s['std']:.2f} "
                    "| "
                    f"{100 * s['median']:.2f} | {chosen} |"
                )
    selected = {
        name: {
            split: {
                m: next(s for s in r["settings"] if s["setting"] == r["selected"]["setting"])[
                    "metrics"
                ][f"{split}/{m}"]["median"]
                for m in TASKS[name].metrics
            }
            for split in TASKS[name].dev_splits
        }
        for name, r in results.items()
    }
    lines += [
        "",
        f"GLUE score over these {len(selected)} task(s), medians of the selected settings: "
        f"{100 * glue_score(selected):.2f}",
    ]
    if "wnli" in selected and len(selected) > 1:
        lines.append(
            "without WNLI (as BERT reports its average): "
            f"{100 * glue_score(selected, without=('wnli',)):.2f}"
        )
    missing = {
        name: r["missing_test_files"] for name, r in results.items() if r.get("missing_test_files")
    }
    if missing:
        lines += [
            "",
            "No test file, so no submission file: "
            + "; ".join(f"{name} ({', '.join(paths)})" for name, paths in missing.items()),
        ]
    return "\n".join(lines) + "\n"
