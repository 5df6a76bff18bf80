"""Fine-tuning: the one loop that trains a head on the pre-trained encoder, for run/finetune.py and
run/glue.py, with the recipe BERT papers fine-tune with as its defaults.

The model is any tf.Module whose call returns a dict with a float32 "loss" (classification.
BertClassifier: classification or regression), so `training.Trainer` (AdamW, warmup and linear
decay, precision, XLA, the allreduce hook) trains it unchanged. Data-parallel like pre-training:
every epoch all ranks draw the same permutation of the examples and rank r trains on rows r, r +
size, ...; the gradients are averaged over ranks, so the weights stay equal (rank 0's initial
weights are broadcast first).
"""
from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.train import training


@dataclasses.dataclass
class Recipe:
    """Devlin et al. (2019), appendix A.3, as most BERT papers report GLUE: AdamW, peak learning
    rate 2e-5 (the paper sweeps 5e-5, 3e-5, 2e-5), batch 32, 3 epochs, 10% linear warmup, sequence 128."""
    learning_rate: float = 2e-5
    batch_size: int = 32              # sequences per update over all ranks
    epochs: float = 3.0
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_seq_length: int = 128
    seed: int = 0
    precision: str = "float32"
    xla: bool = False

    def per_rank_batch(self, size: int) -> int:
        if self.batch_size < 1 or self.batch_size % size:
            raise ConfigError(f"batch size {self.batch_size} (sequences per update) is not a positive multiple of "
                              f"the {size} ranks")
        return self.batch_size // size


def fine_tune(model, features: dict, recipe: Recipe, rank=0, size=1, allreduce=None, broadcast=None,
              per_rank_batch=None) -> dict:
    """Trains `model` in place. features: numpy arrays with the same first dimension (the labels
    among them, under the name the model reads). per_rank_batch: overrides recipe.batch_size / size.
    Returns {"train_steps", "final_train_loss"}."""
    n = len(next(iter(features.values())))
    batch = per_rank_batch or recipe.per_rank_batch(size)
    steps_per_epoch = n // (batch * size)
    if steps_per_epoch < 1:
        raise ConfigError(f"{n} training examples are fewer than one global batch of {batch * size}")
    total = max(1, int(math.ceil(recipe.epochs * steps_per_epoch)))
    config = training.TrainConfig(optimizer="adamw", learning_rate=recipe.learning_rate, precision=recipe.precision,
                                  xla=recipe.xla, warmup_steps=int(total * recipe.warmup_fraction),
                                  total_steps=total, weight_decay=recipe.weight_decay, seed=recipe.seed)
    trainer = training.Trainer(model, config, allreduce or training.identity_allreduce, seed_offset=rank)
    if broadcast:
        broadcast(trainer.variables)
    out = {}
    for rows in batch_rows(n, batch, total, recipe.seed, rank, size):
        out = trainer.train_step([{k: tf.constant(v[rows]) for k, v in features.items()}])
    return {"train_steps": total, "final_train_loss": float(out["loss"])}


def batch_rows(n, batch, total, seed, rank=0, size=1):
    """This rank's rows for each of `total` updates: every epoch all ranks draw the same permutation of
    the n examples and rank r takes rows r, r + size, ... of it, in batches (a last partial batch of
    an epoch is dropped, as google's run_classifier.py does)."""
    rng = np.random.RandomState(seed)
    steps_per_epoch, step = n // (batch * size), 0
    while step < total:
        mine = rng.permutation(n)[rank::size]
        for s in range(min(steps_per_epoch, total - step)):
            yield mine[s * batch:(s + 1) * batch]
            step += 1


def predict(fn, features: dict, batch_size=64) -> np.ndarray:
    """fn(features of a batch) -> [B, ...] tensor, over all rows in order, concatenated."""
    n = len(next(iter(features.values())))
    return np.concatenate([fn({k: tf.constant(v[i:i + batch_size]) for k, v in features.items()}).numpy()
                           for i in range(0, n, batch_size)])


def summarize(values) -> dict:
    """Mean, median, standard deviation (sample, n - 1; 0 for one value), min and max over seeds."""
    values = [float(v) for v in values]
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values),
            "n": len(values)}


def export(model, vocab_file, out_dir, labels=None, do_lower_case=True) -> list:
    """A fine-tuned model in google-research/bert's names (run_classifier.py's output_weights, run_squad.py's
    cls/squad/...) and as a transformers directory that BertForSequenceClassification (id2label /
    label2id; STS-B: regression) or BertForQuestionAnswering loads without conversion. model: a
    classification.BertClassifier (labels: its label names) or a squad.BertSpanExtractor."""
    from bert_tf.artifacts import checkpoint_formats, checkpointing
    weights = {name: v.numpy() for name, v in checkpointing.module_variables(model).items()}
    if "span/kernel" in weights:
        hf = checkpoint_formats.config_to_huggingface(model.config, "BertForQuestionAnswering")
    else:
        hf = checkpoint_formats.config_to_huggingface(model.config, "BertForSequenceClassification", labels,
                                                      regression=getattr(model, "regression", False))
    written = checkpoint_formats.write_google(weights, model.config, vocab_file, out_dir)
    return written + checkpoint_formats.write_huggingface(weights, model.config, vocab_file, out_dir, do_lower_case, hf)
