"""The divergence guard: notices a run that has gone wrong and sends it back to its last good state.

Two signs, both checked at log steps (the loop's only host synchronisation between saves), from
values every rank has alike (losses summed over ranks, the non-finite test made after the
allreduce), so every rank decides the same:
  - a spike: the logged loss above `factor` x the median of the last HISTORY healthy intervals, for
    `intervals` logged intervals in a row (a loss that jumps and comes back is left alone);
  - `max_skipped` consecutive skipped updates (non-finite gradients: the loss scale cannot save it).
While either is building up the guard is `suspect` and periodic saves (elastic commits) wait, so the
newest checkpoint is from before the trouble showed. A rollback restores the weights, optimizer,
step and loss scale of that checkpoint (or commit), keeps the input where it is, so the data window
that preceded the spike is skipped, and may scale the learning rate. Damage can begin before the
loss shows it; a run that diverges again before it gets past the last rollback's step goes back one
checkpoint further each time. After `max_rollbacks` the run stops.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from bert_tf import ConfigError, knob

HISTORY = 20  # healthy logged intervals whose median is the reference
MIN_HISTORY = 5  # intervals before the spike test is armed (the first losses fall fast)


class Diverged(ConfigError):
    """The run diverged again after --max_rollbacks rollbacks (a clear stop, not a traceback)."""


@dataclasses.dataclass
class GuardConfig:
    """The guard's settings; their names are the flags' (PretrainConfig inherits them)."""

    divergence_factor: float = knob(
        1.5,
        "Divergence guard: roll back to the last good checkpoint when the logged loss stays above "
        "this x the median of the last 20 healthy intervals (0: off) ...",
    )
    divergence_intervals: int = knob(3, "... for this many logged intervals in a row.")
    max_skipped_updates: int = knob(
        25,
        "Divergence guard: roll back when this many updates in a row were skipped for non-finite "
        "gradients (0: off; checked at log steps).",
    )
    max_rollbacks: int = knob(3, "Stop after this many rollbacks.")
    rollback_lr_scale: float = knob(1.0, "Multiply the learning rate by this at each rollback.")

    def validate(self):
        if self.divergence_factor and self.divergence_factor <= 1:
            raise ConfigError(
                f"--divergence_factor must be 0 (off) or > 1, got {self.divergence_factor}"
            )
        if self.divergence_intervals < 1 or self.max_skipped_updates < 0 or self.max_rollbacks < 0:
            raise ConfigError(
                "--divergence_intervals must be >= 1, --max_skipped_updates and --max_rollbacks >= "
                "0"
            )
        if not 0 < self.rollback_lr_scale <= 1:
            raise ConfigError(
                f"--rollback_lr_scale must be in (0, 1], got {self.rollback_lr_scale}"
            )


class Guard:
    def __init__(self, config: GuardConfig):
        self.config = config
        self.healthy = collections.deque(maxlen=HISTORY)
        self.high = 0  # logged intervals in a row above the threshold
        self.skipping = 0  # consecutive skipped updates at the last check
        self.rollbacks = 0
        self.last = None  # (step the last rollback fired at, step it went back to)

    @property
    def suspect(self) -> bool:
        return self.high > 0 or self.skipping > 0

    def threshold(self):
        if not self.config.divergence_factor or len(self.healthy) < MIN_HISTORY:
            return None
        return self.config.divergence_factor * float(np.median(self.healthy))

    def observe(self, loss: float, consecutive_skips: int) -> str:
        """One logged interval's loss and the updates skipped in a row so far -> why to roll back,
        or ''."""
        c = self.config
        self.skipping = consecutive_skips
        if c.max_skipped_updates and consecutive_skips >= c.max_skipped_updates:
            return f"{consecutive_skips} consecutive updates skipped (non-finite gradients)"
        limit = self.threshold()
        if not math.isfinite(loss) or limit is not None and loss > limit:
            self.high += 1
            if self.high >= c.divergence_intervals:
                median = float(np.median(self.healthy)) if self.healthy else float("nan")
                return (
                    f"loss {loss:.4f} above {c.divergence_factor:g} x the running median "
                    f"{median:.4f} for {self.high} logged intervals"
                )
        else:
            self.high = 0
            self.healthy.append(loss)
        return ""

    def older_than(self, step):
        """Where the next rollback may go: None (the newest checkpoint), or, when the run diverged
        again before it got past where the last rollback fired, only to checkpoints older than that
        one's target (the damage began before anything looked wrong, so the newest checkpoint has it
        too)."""
        if self.last is not None and step <= self.last[0]:
            return self.last[1]
        return None

    def rolled_back(self, reason):
        """Counts a rollback; raises Diverged when there were already --max_rollbacks."""
        self.rollbacks += 1
        if self.rollbacks > self.config.max_rollbacks:
            raise Diverged(
                f"the run diverged again ({reason}) after {self.config.max_rollbacks} rollback(s) "
                f"(--max_rollbacks): stopping; lower --learning_rate or set --rollback_lr_scale"
            )
        self.high = self.skipping = 0

    def landed(self, fired_at, back_to):
        self.last = (fired_at, back_to)
