"""Fine-tuning: one loop, `run`, over one contract, `FinetuningTask`, which GLUE
(glue_sweep.GlueTask), SQuAD (squad.SquadTask), labelled text files (classification.Classification)
and the tasks made from a corpus (proof.CorpusPairTask, proof.CorpusSpanTask) implement; the recipe
BERT papers fine-tune with as its defaults.

A task builds its model (a head on `modeling.encoder(config)`: `FinetuningModel`), gives its
training features, predicts (its own typed predictions: label indices, answers) and scores them;
`run` seeds, builds, loads the encoder from `init`, trains with `fine_tune` and returns an
`Outcome`. The model's call returns a `FinetuneOutput` with a float32 "loss", so the Trainer (AdamW,
warmup and linear decay, precision, XLA, the gradient exchange) trains it unchanged. Data-parallel
like pre-training (`Distributed`): every epoch all ranks draw the same permutation of the examples
and rank r trains on rows r, r + size, ...; the gradients are averaged over ranks, so the weights
stay equal (rank 0's initial weights are broadcast first). The pattern is TF Model Garden's `Task`,
without its registries.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Generic,
    Iterable,
    Iterator,
    Protocol,
    TypeVar,
    runtime_checkable,
)

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.model import modeling
from bert_tf.parallel.exchange import GradientExchange
from bert_tf.train import training

if TYPE_CHECKING:
    from bert_tf.artifacts.checkpoint_formats import Checkpoint

Features = dict[
    str, np.ndarray
]  # numpy arrays with the same first dimension, by the name the model reads
P = TypeVar("P")  # a task's predictions


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class FinetuneOutput(modeling.TensorRecord):
    """A fine-tuning head's output: float32 scalars [] over the batch (a TensorRecord: it passes
    through the Trainer's tf.functions and XLA as it is; "loss" a mean, the rest counts, as
    figures.is_mean says)."""

    loss: tf.Tensor  # the mean training loss: what is trained
    correct: tf.Tensor | None = None  # rows classified right (None: a regression or span head)
    count: tf.Tensor | None = None  # rows in the batch (None: not counted)


@runtime_checkable
class FinetuningModel(Protocol):
    """What the loop trains: a tf.Module with a head on `encoder` (modeling.encoder(config), whose
    weights `run` loads from `init`). Called on a batch of training features (the labels among them)
    it returns a FinetuneOutput; predict(features) is the head's output [B, ...] for a batch without
    labels (finetuning.predict batches it)."""

    config: modeling.BertConfig
    encoder: modeling.Encoder
    trainable_variables: Any

    def __call__(
        self,
        features: dict[str, tf.Tensor],
        *,
        dtype: tf.DType = tf.float32,
        seed: int | None = None,
        training: bool = False,
    ) -> FinetuneOutput: ...

    def predict(self, features: dict[str, tf.Tensor]) -> tf.Tensor: ...


@runtime_checkable
class FinetuningTask(Protocol[P]):
    """A fine-tuning task, all the loop knows of it:

    name                       what logs and results call it
    build_model(config)        a FinetuningModel: its head on modeling.encoder(config)
    train_features(tokenizer)  Features to train on, labels included (None: predict with the
                               untrained head)
    predict(model, tokenizer)  its predictions (P, a dataclass of the task's own): the task encodes
                               what it predicts (dev and test splits, SQuAD's windows) and maps the
                               model's output back to its answers
    metrics(predictions)       {name: value} of those predictions (empty when there is nothing to
                               score)
    """

    name: str

    def build_model(self, config: modeling.BertConfig) -> FinetuningModel: ...

    def train_features(self, tokenizer: Any) -> Features | None: ...

    def predict(self, model: FinetuningModel, tokenizer: Any) -> P: ...

    def metrics(self, predictions: P) -> dict[str, float]: ...


@dataclasses.dataclass(frozen=True)
class Distributed:
    """How the ranks train together: this rank, the rank count, the exchange that makes every rank's
    gradients the update's (None: exchange.Local, one process) and the function that makes every
    rank's variables rank 0's (None: none, one process)."""

    rank: int = 0
    size: int = 1
    exchange: GradientExchange | None = None
    broadcast: Callable[[list], Any] | None = None


@dataclasses.dataclass
class Trained:
    """What `fine_tune` did: its updates and the last one's loss."""

    train_steps: int
    final_train_loss: float


@dataclasses.dataclass
class Outcome(Generic[P]):
    """What `run` returns: the task's metrics of its predictions, the predictions, the updates
    trained and the last update's loss (0 and None: untrained), and the model."""

    metrics: dict[str, float]
    predictions: P
    train_steps: int
    final_train_loss: float | None
    model: FinetuningModel


@dataclasses.dataclass
class Recipe:
    """Devlin et al. (2019), appendix A.3, as most BERT papers report GLUE: AdamW, peak learning
    rate 2e-5 (the paper sweeps 5e-5, 3e-5, 2e-5), batch 32, 3 epochs, 10% linear warmup, sequence
    128."""

    learning_rate: float = 2e-5
    global_batch: int = 32  # sequences per update over all ranks
    epochs: float = 3.0
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_seq_length: int = 128
    seed: int = 0
    precision: str = "float32"
    xla: bool = False

    def per_rank_batch(self, size: int) -> int:
        if self.global_batch < 1 or self.global_batch % size:
            raise ConfigError(
                f"batch size {self.global_batch} (sequences per update) is not a positive multiple "
                f"of the {size} ranks"
            )
        return self.global_batch // size


def run(
    task: FinetuningTask[P],
    tokenizer: Any,
    model_config: modeling.BertConfig,
    init: Checkpoint | str | None,
    recipe: Recipe,
    distributed: Distributed | None = None,
) -> Outcome[P]:
    """THE fine-tuning loop: `task`'s model (the TF seed recipe.seed first), its encoder loaded from
    `init` (a read checkpoint_formats.Checkpoint or a path; None: random weights), trained on the
    task's features with `fine_tune` (unless it has none), then the task's predictions and their
    metrics. tokenizer: what the task encodes with, and the vocabulary `init` must have (None: a
    task whose features are encoded already, unchecked)."""
    distributed = distributed or Distributed()
    recipe.per_rank_batch(
        distributed.size
    )  # the batch splits between the ranks: checked before any work
    tf.random.set_seed(recipe.seed)
    model = task.build_model(model_config)
    if init is not None:
        load_encoder(model.encoder, init, len(tokenizer) if tokenizer is not None else None)
    features = task.train_features(tokenizer)
    trained = fine_tune(model, features, recipe, distributed) if features is not None else None
    predictions = task.predict(model, tokenizer)
    return Outcome(
        task.metrics(predictions),
        predictions,
        trained.train_steps if trained else 0,
        trained.final_train_loss if trained else None,
        model,
    )


def load_encoder(
    encoder: modeling.Encoder,
    checkpoint: Checkpoint | str,
    vocab_size: int | None = None,
    vocab_file: str = "",
) -> None:
    """Loads encoder weights (heads ignored) from any checkpoint `checkpoint_formats.read` takes: a
    pre-training run, an export, google-research/bert's or a Hugging Face directory (path or
    read)."""
    from bert_tf.artifacts import checkpoint_formats

    ckpt = (
        checkpoint
        if isinstance(checkpoint, checkpoint_formats.Checkpoint)
        else checkpoint_formats.read(checkpoint)
    )
    checkpoint_formats.check_fits(ckpt, encoder.config, vocab_size, vocab_file)
    checkpoint_formats.assign(encoder, ckpt)


def fine_tune(
    model: FinetuningModel,
    features: Features,
    recipe: Recipe,
    distributed: Distributed | None = None,
) -> Trained:
    """Trains `model` in place on `features` (the labels among them, under the name the model
    reads), each rank recipe.global_batch / size rows per update."""
    distributed = distributed or Distributed()
    rank, size = distributed.rank, distributed.size
    n = len(next(iter(features.values())))
    batch = recipe.per_rank_batch(size)
    steps_per_epoch = n // (batch * size)
    if steps_per_epoch < 1:
        raise ConfigError(
            f"{n} training examples are fewer than one global batch of {batch * size}"
        )
    total = max(1, int(math.ceil(recipe.epochs * steps_per_epoch)))
    config = training.TrainConfig(
        optimizer="adamw",
        learning_rate=recipe.learning_rate,
        precision=recipe.precision,
        xla=recipe.xla,
        warmup_steps=int(total * recipe.warmup_fraction),
        total_steps=total,
        weight_decay=recipe.weight_decay,
        seed=recipe.seed,
    )
    trainer = training.Trainer(model, config, exchange=distributed.exchange, seed_offset=rank)
    if distributed.broadcast:
        distributed.broadcast(trainer.variables)
    loss = 0.0
    for rows in batch_rows(n, batch, total, recipe.seed, rank, size):
        loss = trainer.train_step([{k: tf.constant(v[rows]) for k, v in features.items()}]).loss
    return Trained(total, float(loss))


def batch_rows(
    n: int, batch: int, total: int, seed: int, rank: int = 0, size: int = 1
) -> Iterator[np.ndarray]:
    """This rank's rows for each of `total` updates: every epoch all ranks draw the same permutation
    of the n examples and rank r takes rows r, r + size, ... of it, in batches (a last partial batch
    of an epoch is dropped, as google's run_classifier.py does)."""
    rng = np.random.RandomState(seed)
    steps_per_epoch, step = n // (batch * size), 0
    while step < total:
        mine = rng.permutation(n)[rank::size]
        for s in range(min(steps_per_epoch, total - step)):
            yield mine[s * batch : (s + 1) * batch]
            step += 1


def predict(
    fn: Callable[[dict[str, tf.Tensor]], tf.Tensor], features: Features, chunk: int = 64
) -> np.ndarray:
    """fn(features of a batch) -> [B, ...] tensor, over all rows in order, concatenated."""
    n = len(next(iter(features.values())))
    return np.concatenate(
        [
            fn({k: tf.constant(v[i : i + chunk]) for k, v in features.items()}).numpy()
            for i in range(0, n, chunk)
        ]
    )


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Mean, median, standard deviation (sample, n - 1; 0 for one value), min and max over seeds."""
    values = [float(v) for v in values]
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def export(
    model: FinetuningModel,
    vocab_file: str,
    out_dir: str,
    labels: list[str] | None = None,
    do_lower_case: bool = True,
) -> list[str]:
    """A fine-tuned model in google-research/bert's names (run_classifier.py's output_weights,
    run_squad.py's cls/squad/...) and as a transformers directory that BertForSequenceClassification
    (id2label / label2id; STS-B: regression) or BertForQuestionAnswering loads without conversion.
    model: a classification.BertClassifier (labels: its label names) or a
    squad.BertSpanExtractor."""
    from bert_tf.artifacts import bert_format, checkpoint_formats, checkpointing

    weights = {name: v.numpy() for name, v in checkpointing.module_variables(model).items()}
    if "span/kernel" in weights:
        hf = bert_format.config_to_huggingface(model.config, "BertForQuestionAnswering")
    else:
        hf = bert_format.config_to_huggingface(
            model.config,
            "BertForSequenceClassification",
            labels,
            regression=getattr(model, "regression", False),
        )
    written = checkpoint_formats.write_google(weights, model.config, vocab_file, out_dir)
    return written + checkpoint_formats.write_huggingface(
        weights, model.config, vocab_file, out_dir, do_lower_case, hf
    )
