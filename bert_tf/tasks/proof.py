"""Does pre-training help? The runs of run/finetune_proof.py: a task made from a corpus's documents
(corpus_tasks) fine-tuned from a start (a read checkpoint, or None for random weights) and scored on dev
(pair tasks: accuracy; span tasks: SQuAD v1.1 F1 and exact match), and the table comparing the two starts
over the seeds.
"""
from __future__ import annotations

import dataclasses
import functools

PAIR_TASKS = {"same_document": ["different", "same"], "word_order": ["kept", "swapped"]}
SPAN_TASKS = ("spans", "odd_word")
TASKS = (*PAIR_TASKS, *SPAN_TASKS)


@dataclasses.dataclass(frozen=True)
class ProofRecipe:
    train_examples: int = 1600      # examples per task to train on
    dev_examples: int = 200         # examples per task to score (from documents not trained on)
    learning_rate: float = 1e-3
    global_batch_size: int = 32     # examples per update (one process)
    epochs: float = 5.0
    max_seq_length: int = 128


def run_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe: ProofRecipe) -> dict:
    """The dev figures of `task` fine-tuned from `checkpoint` (None: random weights) with `seed`."""
    if task in SPAN_TASKS:
        return _span_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe)
    return _pair_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe)


def _pair_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe):
    from bert_tf.tasks import classification, corpus_tasks
    make = getattr(corpus_tasks, task)
    x, y, _ = classification.encode(make(train_docs, recipe.train_examples, seed), tokenizer,
                                    recipe.max_seq_length, PAIR_TASKS[task])
    ex, ey, _ = classification.encode(make(dev_docs, recipe.dev_examples, seed + 1000), tokenizer,
                                      recipe.max_seq_length, PAIR_TASKS[task])
    metrics, _ = classification.train_and_evaluate(
        model_config, PAIR_TASKS[task], (x, y), (ex, ey), init_checkpoint=checkpoint, vocab_size=len(tokenizer),
        epochs=recipe.epochs, batch_size=recipe.global_batch_size, learning_rate=recipe.learning_rate, seed=seed)
    return {"accuracy": metrics["accuracy"]}


def _span_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, model_config, recipe):
    from bert_tf.tasks import corpus_tasks, finetuning, squad, squad_scoring
    make = corpus_tasks.spans if task == "spans" else functools.partial(
        corpus_tasks.odd_word, words=corpus_tasks.vocabulary_words(tokenizer.vocab))
    span_dev = make(dev_docs, recipe.dev_examples, seed + 1000)
    squad_recipe = finetuning.Recipe(learning_rate=recipe.learning_rate, batch_size=recipe.global_batch_size,
                                     epochs=recipe.epochs, max_seq_length=recipe.max_seq_length, seed=seed)
    windows = dict(max_seq_length=recipe.max_seq_length, doc_stride=64, max_query_length=64)
    train_q = squad.examples_of(make(train_docs, recipe.train_examples, seed), "1.1", training=True)
    dev_q = squad.examples_of(span_dev, "1.1", training=False)
    _, predictions, _, _, _ = squad.train_and_predict(train_q, dev_q, tokenizer, model_config, checkpoint,
                                                      squad_recipe, windows, log=lambda *a, **k: None)
    scores = squad_scoring.evaluate(span_dev, predictions, version="1.1")
    return {"f1": scores["f1"], "exact_match": scores["exact_match"]}


def table(runs, tasks) -> str:
    """Markdown: per task and metric, mean ± std over the seeds from each start (accuracy in percent)."""
    from bert_tf.tasks import finetuning
    lines = ["| task | metric | pre-trained | random init |", "|---|---|---|---|"]
    for task in tasks:
        for metric in (("f1", "exact_match") if task in SPAN_TASKS else ("accuracy",)):
            cells = []
            for start in ("pre-trained", "random"):
                s = finetuning.summarize([r[metric] for r in runs if r["task"] == task and r["start"] == start])
                scale = 100 if metric == "accuracy" else 1
                cells.append(f"{scale * s['mean']:.1f} ± {scale * s['std']:.1f}")
            lines.append(f"| {task} | {metric} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
