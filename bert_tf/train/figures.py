"""Training's figures and how they add up: one update's tensors (`UpdateOutput`, what
`Trainer.train_step` returns), the metric convention (`is_mean`), an update from its micro-batches
(`sum_metrics`), and a log interval from its updates over all ranks (`IntervalMetrics`, the "train"
records of pretraining.train).

Nothing is fetched from the device before the log step: sums stay tensors until `record`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TypeVar

import tensorflow as tf

from bert_tf.artifacts import metrics
from bert_tf.model.modeling import TensorRecord
from bert_tf.parallel import distributed

R = TypeVar("R", bound=TensorRecord)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateOutput:
    """What `Trainer.train_step` returns: one update's tensors, on the device (nothing fetched).
    `output` is the model's record (modeling.PretrainOutput, finetuning.FinetuneOutput) over this
    rank's micro-batches, means averaged and counts summed (sum_metrics); the rest are the update's
    own, scalars []."""

    output: Any
    grad_norm: tf.Tensor  # of the update's gradients, before clipping
    learning_rate: tf.Tensor
    finite: tf.Tensor  # bool: False when a non-finite gradient skipped the update
    sequences: tf.Tensor  # sequences this rank trained on (int32)
    useful_tokens: tf.Tensor  # their non-padding tokens (int32)
    instances: tf.Tensor | None = None  # packed rows: the instances they held; else None
    loss_scale: tf.Tensor | None = None  # mixed_float16's loss scale; else None

    @property
    def loss(self) -> tf.Tensor:
        return self.output.loss

    def figures(self) -> dict[str, Any]:
        """{name: tensor}: the model's fields and the update's (not `output` itself), None left out;
        what IntervalMetrics sums by name."""
        update = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "output"
        }
        return {**self.output.present(), **{k: v for k, v in update.items() if v is not None}}


def is_mean(key) -> bool:
    """The metric convention: keys ending in "loss" are means (averaged over micro-batches and
    ranks); the rest (correct, weight, count) are counts, summed."""
    return key.endswith("loss")


def sum_metrics(outs: list[R]) -> R:
    """One update's output (a model's TensorRecord) from its micro-batches': each field is_mean says
    is a mean averaged, the rest summed; fields the model leaves None stay None."""
    n = float(len(outs))
    sums = {}
    for key in outs[0].present():
        total = tf.add_n([getattr(o, key) for o in outs])
        sums[key] = total / n if is_mean(key) else total
    return dataclasses.replace(outs[0], **sums)


class IntervalMetrics:
    """Sums one log interval's per-update outputs on the device (no fetch per update) and the
    timed updates' splits on this rank; `record` fetches the sums once, turns them into a
    "train" record (metrics.TrainRecord: losses and accuracies over all ranks) and starts the next
    interval."""

    SUMMED = (
        "loss",
        "mlm_loss",
        "nsp_loss",
        "mlm_correct",
        "mlm_weight",
        "nsp_correct",
        "nsp_count",
        "sequences",
        "useful_tokens",
        "instances",
    )

    def __init__(self, global_batch, seq_length, network_interface="", loss_weight=1.0):
        self.global_batch_size, self.seq_length = global_batch, seq_length
        self.interface = network_interface
        # elastic mode with uneven shares: this rank's losses weighted like its gradients, so the
        # ranks' average is the mean over the whole global batch
        self.loss_weight = loss_weight
        self.tx_start = metrics.read_tx_bytes(network_interface) if network_interface else 0
        self._reset()

    def _reset(self):
        self.start, self.updates, self.sums, self.timing, self.timed = time.time(), 0, {}, {}, 0

    def add(self, out: UpdateOutput, timing):
        """out: one update's outputs (tensors stay on the device); timing: its split, or {}."""
        self.updates += 1
        figures = out.figures()
        for key in self.SUMMED:
            if key in figures:
                weight = self.loss_weight if is_mean(key) else 1.0
                value = tf.cast(figures[key], tf.float64) * weight
                self.sums[key] = self.sums[key] + value if key in self.sums else value
        if timing:
            self.timed += 1
            for key, seconds in timing.items():
                self.timing[key] = self.timing.get(key, 0.0) + seconds

    def record(self, step, out: UpdateOutput) -> metrics.TrainRecord:
        """A collective: every rank calls it at the same step. `out`: the last update's outputs."""
        size = distributed.size()
        total = distributed.sum_across_ranks(self.sums)
        seconds = time.time() - self.start
        n = self.updates
        # a batch warmup's updates are smaller
        trained = float(total.get("sequences", n * self.global_batch_size))
        tx = None
        if self.interface:
            tx_now = metrics.read_tx_bytes(self.interface)
            tx, self.tx_start = (tx_now - self.tx_start) / n, tx_now
        record = metrics.TrainRecord(
            step=step,
            **{key: value / (n * size) for key, value in total.items() if is_mean(key)},
            **metrics.accuracies(total),
            learning_rate=float(out.learning_rate),
            grad_norm=float(out.grad_norm),
            sequences_per_second=trained / seconds,
            tokens_per_second=trained * self.seq_length / seconds,
            # trained, all ranks
            sequences=int(total["sequences"]) if "sequences" in total else None,
            # non-padding tokens (and with packed rows, instances) over all ranks
            **{
                f"{key}_per_second": float(total[key]) / seconds
                for key in ("useful_tokens", "instances")
                if key in total
            },
            **{key: value / self.timed for key, value in self.timing.items()},  # this rank's split
            tx_bytes_per_update=tx,
            loss_scale=None if out.loss_scale is None else float(out.loss_scale),
        )
        self._reset()
        return record
