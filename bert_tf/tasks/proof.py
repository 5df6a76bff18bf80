"""Does pre-training help? The runs of run/finetune_proof.py: a task made from a corpus's documents
(corpus_tasks) fine-tuned from a start (a read checkpoint, or None for random weights) and scored on
dev (pair tasks: accuracy; span tasks: SQuAD v1.1 F1 and exact match), and the table comparing the
two starts over the seeds. The tasks are finetuning.FinetuningTasks (`CorpusPairTask`,
`CorpusSpanTask`): each makes its examples from the documents with the tokenizer the loop gives it,
and is then a classification.Classification or a squad.SquadTask.
"""

from __future__ import annotations

import dataclasses
import functools

PAIR_TASKS = {"same_document": ["different", "same"], "word_order": ["kept", "swapped"]}
SPAN_TASKS = ("spans", "odd_word")
TASKS = (*PAIR_TASKS, *SPAN_TASKS)


@dataclasses.dataclass(frozen=True)
class ProofRecipe:
    train_examples: int = 1600  # examples per task to train on
    dev_examples: int = 200  # examples per task to score (from documents not trained on)
    learning_rate: float = 1e-3
    global_batch_size: int = 32  # examples per update (one process)
    epochs: float = 5.0
    max_seq_length: int = 128


def metric_names(task) -> tuple:
    return ("f1", "exact_match") if task in SPAN_TASKS else ("accuracy",)


def run_task(
    task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe: ProofRecipe
) -> dict:
    """The dev figures of `task` fine-tuned from `checkpoint` (None: random weights) with `seed`."""
    from bert_tf.tasks import finetuning

    kind = CorpusSpanTask if task in SPAN_TASKS else CorpusPairTask
    finetuning_recipe = finetuning.Recipe(
        learning_rate=recipe.learning_rate,
        global_batch=recipe.global_batch_size,
        epochs=recipe.epochs,
        max_seq_length=recipe.max_seq_length,
        seed=seed,
    )
    outcome = finetuning.run(
        kind(task, train_docs, dev_docs, seed, recipe),
        tokenizer,
        model_config,
        checkpoint,
        finetuning_recipe,
    )
    return {name: outcome.metrics[name] for name in metric_names(task)}


class _FromDocuments:
    """A corpus task: its training examples drawn from `train_docs` with `seed`, its dev examples
    from `dev_docs` with seed + 1000 (recipe: how many, how long); the FinetuningTask members but
    build_model are those of the task `make` returns, made once per tokenizer."""

    def __init__(
        self, name: str, train_docs, dev_docs, seed: int, recipe: ProofRecipe = ProofRecipe()
    ):
        self.name, self.train_docs, self.dev_docs, self.seed, self.recipe = (
            name,
            train_docs,
            dev_docs,
            seed,
            recipe,
        )
        self._made: tuple | None = None  # (tokenizer, the task made with it)

    def make(self, tokenizer):
        raise NotImplementedError

    def made(self, tokenizer):
        if self._made is None or self._made[0] is not tokenizer:
            self._made = (tokenizer, self.make(tokenizer))
        return self._made[1]

    def train_features(self, tokenizer):
        return self.made(tokenizer).train_features(tokenizer)

    def predict(self, model, tokenizer):
        return self.made(tokenizer).predict(model, tokenizer)

    def metrics(self, predictions) -> dict[str, float]:
        if self._made is None:
            raise ValueError(
                f"{self.name}: no examples made yet (metrics of predictions this task did not make)"
            )
        return self._made[1].metrics(predictions)


class CorpusPairTask(_FromDocuments):
    """same_document or word_order (corpus_tasks): sentence pairs, classified."""

    def build_model(self, config):
        from bert_tf.tasks import classification

        return classification.BertClassifier(config, len(PAIR_TASKS[self.name]))

    def make(self, tokenizer):
        from bert_tf.tasks import classification, corpus_tasks

        make, labels, r = getattr(corpus_tasks, self.name), PAIR_TASKS[self.name], self.recipe
        train = classification.encode(
            make(self.train_docs, r.train_examples, self.seed), tokenizer, r.max_seq_length, labels
        )
        dev = classification.encode(
            make(self.dev_docs, r.dev_examples, self.seed + 1000),
            tokenizer,
            r.max_seq_length,
            labels,
        )
        return classification.Classification(
            labels,
            classification.Labelled(*train[:2]),
            classification.Labelled(*dev[:2]),
            self.name,
        )


class CorpusSpanTask(_FromDocuments):
    """spans or odd_word (corpus_tasks): questions in SQuAD v1.1's layout, answered and scored as
    SQuAD is."""

    def build_model(self, config):
        from bert_tf.tasks import squad

        return squad.BertSpanExtractor(config)

    def make(self, tokenizer):
        from bert_tf.tasks import corpus_tasks, squad

        make = (
            corpus_tasks.spans
            if self.name == "spans"
            else functools.partial(
                corpus_tasks.odd_word, words=corpus_tasks.vocabulary_words(tokenizer.vocab)
            )
        )
        dev = make(self.dev_docs, self.recipe.dev_examples, self.seed + 1000)
        train = make(self.train_docs, self.recipe.train_examples, self.seed)
        return squad.SquadTask(
            squad.examples_of(dev, "1.1", training=False),
            squad.examples_of(train, "1.1", training=True),
            squad.Windowing(self.recipe.max_seq_length, doc_stride=64, max_query_length=64),
            dataset=dev,
            log=lambda *a, **k: None,
            name=self.name,
        )


def table(runs, tasks) -> str:
    """Markdown: per task and metric, mean ± std over the seeds from each start (accuracy in
    percent)."""
    from bert_tf.tasks import finetuning

    lines = ["| task | metric | pre-trained | random init |", "|---|---|---|---|"]
    for task in tasks:
        for metric in metric_names(task):
            cells = []
            for start in ("pre-trained", "random"):
                s = finetuning.summarize(
                    [r[metric] for r in runs if r["task"] == task and r["start"] == start]
                )
                scale = 100 if metric == "accuracy" else 1
                cells.append(f"{scale * s['mean']:.1f} ± {scale * s['std']:.1f}")
            lines.append(f"| {task} | {metric} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
