"""Fine-tuning on GLUE, swept: `GlueTask`, a task's splits read from the download, is the
finetuning.FinetuningTask that finetuning.run fine-tunes; `run_task` fine-tunes it once per setting
(`sweep`) and seed and selects on dev (`select`); `markdown` is the tables people compare with
papers.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bert_tf import ConfigError
from bert_tf.tasks.glue import TASKS, Split, TaskInfo, missing_tests, read_split, split_path
from bert_tf.tasks.glue_scoring import glue_score, score, task_score

if TYPE_CHECKING:
    from bert_tf.tasks import finetuning


@dataclasses.dataclass(frozen=True)
class Setting:
    learning_rate: float
    global_batch: int  # sequences per update over all ranks
    epochs: float

    def label(self) -> str:
        return f"lr {self.learning_rate:g}, batch {self.global_batch}, {self.epochs:g} epochs"

    def record(self) -> dict:
        """As glue.json writes it: the global batch under "batch_size", the key readers know."""
        return {
            "learning_rate": self.learning_rate,
            "batch_size": self.global_batch,
            "epochs": self.epochs,
        }

    @classmethod
    def from_record(cls, record: dict) -> "Setting":
        return cls(record["learning_rate"], record["batch_size"], record["epochs"])


def sweep(learning_rates, global_batches, epochs) -> list:
    """Every combination, in the order given (the recipe alone: 2e-5 x 32 x 3)."""
    return [Setting(lr, b, e) for lr in learning_rates for b in global_batches for e in epochs]


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
                f"{split_path(info, data_dir, 'train')} have missing fields: skipped"
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
        by_setting.setdefault(Setting.from_record(run["setting"]), []).append(run)
    summaries = []
    for setting, group in by_setting.items():
        metrics = {
            f"{name}/{m}": finetuning.summarize([g["dev"][name][m] for g in group])
            for name in task.dev_splits
            for m in task.metrics
        }
        summaries.append(
            {
                "setting": setting.record(),
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
                global_batch=setting.global_batch,
                epochs=setting.epochs,
                seed=seed,
            )
            outcome = finetuning.run(glue_task, tokenizer, model_config, init, r, distributed)
            dev = glue_task.scores(outcome.predictions)
            runs.append(
                {
                    "setting": setting.record(),
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
    chosen = max(by_setting[Setting.from_record(best["setting"])], key=lambda g: g["score"])
    out = {"model": kept[Setting.from_record(best["setting"])][1]} if kept is not None else {}
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
            "by": "best median dev score over the seeds; test predictions from its best seed on "
            "dev",
        },
        "runs": [{k: v for k, v in run.items() if k != "test_predictions"} for run in runs],
        "test_predictions": chosen["test_predictions"],
    }


def markdown(results: dict, recipe, seeds) -> str:
    """The tables people compare with papers: per task and setting, dev metrics as mean ± std and
    median over the seeds, then the GLUE score of the selected settings."""
    lines = [
        f"Dev set, {len(seeds)} seed(s) per setting ({', '.join(map(str, seeds))}); sequence "
        f"{recipe.max_seq_length}, warmup {recipe.warmup_fraction:g}, AdamW (weight decay "
        f"{recipe.weight_decay:g}), precision {recipe.precision}. Selection on dev.",
        "",
        "| task | setting | metric | mean ± std | median | selected |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        for summary in result["settings"]:
            chosen = "yes" if summary["setting"] == result["selected"]["setting"] else ""
            label = Setting.from_record(summary["setting"]).label()
            for metric, s in summary["metrics"].items():
                lines.append(
                    f"| {name} | {label} | {metric} | {100 * s['mean']:.2f} ± {100 * s['std']:.2f} "
                    f"| {100 * s['median']:.2f} | {chosen} |"
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
