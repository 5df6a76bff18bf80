"""Batch-size warmup (--batch_warmup_sequences): the global batch grows from one micro-batch per
rank to the full --accumulation_steps over the run's first sequences, as ModernBERT (Warner et al.
2024, section 2.2.2) and the budget recipes do: early updates, whose gradients are large and agree,
are cheap, and the full batch is paid for when the gradient noise calls for it (McCandlish et al.
2018).

The update's micro-batches k follow the sequences seen so far: k = ceil(A x seen / N), between 1 and
A, so the batch grows linearly in sequences. The learning rate follows the batch by the square-root
rule for adaptive optimizers (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
Gradient Algorithms"): an update of k of A micro-batches takes sqrt(k / A) of the scheduled rate, so
the noise each update injects matches the full batch's. Everything follows from the step: a resumed
run takes the same batches.

Elastic mode (--elastic) counts the same curve over the global batch's micro-batches and the
sequences of the committed state, not the step: an update's k = `micro_batches_at(samples_seen,
least=ranks)` of the --global_batch_size's micro-batches, at least one per rank of the formation. A
re-form, a rollback or a resume puts `samples_seen` back with the weights, so every rank, a newcomer
too, takes the same k at the same update.
"""

from __future__ import annotations

import math

from bert_tf import ConfigError


class BatchWarmup:
    """micro_batches(step): the update's micro-batches per rank; sequences_before(step): sequences
    all ranks trained on before update `step` (0-based)."""

    def __init__(self, sequences: int, accumulation_steps: int, micro_batch_size: int, ranks: int):
        if sequences and accumulation_steps < 2:
            raise ConfigError(
                f"--batch_warmup_sequences={sequences} needs --accumulation_steps > 1: the batch "
                f"grows by micro-batches, from one per rank to --accumulation_steps"
            )
        self.full = accumulation_steps
        self.per_micro_batch = micro_batch_size * ranks  # sequences one micro-batch per rank adds
        self.sequences = sequences
        self.steps = []  # k of each warmup update
        seen = 0
        while seen < sequences:
            k = self.micro_batches_at(seen)
            self.steps.append(k)
            seen += k * self.per_micro_batch
        self._before = [0]
        for k in self.steps:
            self._before.append(self._before[-1] + k * self.per_micro_batch)

    def micro_batches_at(self, seen: int, least: int = 1) -> int:
        """The micro-batches of an update that starts after `seen` sequences: the curve, at least
        `least`."""
        if seen >= self.sequences:
            return self.full
        return min(self.full, max(least, math.ceil(self.full * seen / self.sequences)))

    def micro_batches(self, step: int) -> int:
        return self.steps[step] if step < len(self.steps) else self.full

    def sequences_before(self, step: int) -> int:
        if step <= len(self.steps):
            return self._before[step]
        return self._before[-1] + (step - len(self.steps)) * self.full * self.per_micro_batch

    def lr_scale(self, step: int) -> float:
        return math.sqrt(self.micro_batches(step) / self.full)

    def describe(self) -> str:
        if not self.steps:
            return "no batch warmup"
        return (
            f"batch warmup: {self.per_micro_batch} -> {self.full * self.per_micro_batch} sequences "
            f"per update over the first {self._before[-1]:,} sequences ({len(self.steps)} "
            f"updates), learning rate x sqrt(batch / full batch)"
        )
