"""The gradient exchange: how the ranks come to agree on an update, as one contract.

Every way bert_tf moves gradients is a GradientExchange: a Horovod allreduce in float32 or float16
(`Allreduce`), no collective at all (`Local`: one process, or DiLoCo's inner updates), PowerSGD and
1-bit Adam/LAMB with error feedback (compression.CompressedExchange), and DiLoCo's outer step
(local_sgd.OuterStep, which exchanges nothing per update and the weights' change every H updates).
The trainer, the loop, checkpoints and elastic re-forms use only what the contract names:

    exchange(grads, scale=None) -> grads   the update's gradients, the same on every rank (scale:
                                           the loss scale they carry; an exchange with buffers keeps
                                           them unscaled)
    exchange.wait_for_ranks()              returns when every rank has reached it (timed updates
                                           split the wait for a straggler from the time on the
                                           link); None: no collective
    exchange.own()                         state that is this rank's own (error feedback): each rank
                                           saves its own file (exchange_state.py)
    exchange.shared()                      state every rank holds alike: checkpointed, broadcast on
                                           a resume
    exchange.reset(size) -> str            a re-form at `size` ranks: own state restarted alike
                                           everywhere
    exchange.attach_clock(clock)           count a warmup on the optimizer's updates
    exchange.describe() -> dict            what a checkpoint records of it
    exchange.method, exchange.weight       its name (--exchange's value, or diloco), and the factor
                                           this rank's gradients take first (elastic mode's uneven
                                           shares)

One exchange reaches further: 1-bit Adam/LAMB (onebit.OnebitExchange) sends the momentum, so it also
has attach_optimizer(optimizer, clip_norm), which the trainer calls when present: it reads the
optimizer's momentum and returns the gradient that moves it to the averaged one.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from bert_tf.parallel.comm import RECORD_KEY


@runtime_checkable
class GradientExchange(Protocol):
    method: str
    weight: float

    def __call__(self, grads: list, scale: Any = None) -> list: ...

    def wait_for_ranks(self) -> Any: ...

    def own(self) -> list: ...

    def shared(self) -> list: ...

    def reset(self, size: int) -> str: ...

    def attach_clock(self, clock: Any) -> None: ...

    def describe(self) -> dict: ...


class Stateless:
    """The parts of the contract an exchange without buffers shares: nothing to save, reset or
    count."""

    method = "none"
    weight = 1.0

    def own(self) -> list:
        return []

    def shared(self) -> list:
        return []

    def reset(self, size: int) -> str:
        return ""

    def attach_clock(self, clock: Any) -> None:
        pass

    def describe(self) -> dict:
        return {RECORD_KEY: self.method, "powersgd_rank": 0}


class Local(Stateless):
    """No collective: the gradients stay this rank's own (one process; DiLoCo's inner updates),
    whatever its share of the update."""

    def __call__(self, grads: list, scale: Any = None) -> list:
        return list(grads)

    def wait_for_ranks(self) -> None:
        return None


class Allreduce(Stateless):
    """The gradients averaged over the ranks of `process_set` (all by default) by Horovod, one
    allreduce op per tensor: Horovod's background thread fuses those ready in the same cycle into
    buffers of HOROVOD_FUSION_THRESHOLD bytes (tensor fusion). fp16: sent, summed and divided in
    float16."""

    def __init__(
        self, fp16: bool = False, name: str = "grad", weight: float = 1.0, process_set: Any = None
    ) -> None:
        self.method = "fp16" if fp16 else "none"
        self.name, self.weight, self._process_set = name, weight, process_set

    @property
    def process_set(self) -> Any:
        import horovod.tensorflow as hvd

        return self._process_set or hvd.global_process_set

    def __call__(self, grads: list, scale: Any = None) -> list:
        import horovod.tensorflow as hvd

        if self.weight != 1.0:
            grads = [g * self.weight for g in grads]
        if self.process_set.size() == 1:
            return list(grads)
        compression = hvd.Compression.fp16 if self.method == "fp16" else hvd.Compression.none
        return [
            hvd.allreduce(
                g,
                op=hvd.Average,
                compression=compression,
                name=f"{self.name}_{i}",
                process_set=self.process_set,
            )
            for i, g in enumerate(grads)
        ]

    def wait_for_ranks(self) -> Any:
        return wait_for_ranks(self.name, self._process_set)


class Function(Stateless):
    """A plain function grads -> grads taken as an exchange without state (tests' fake worlds)."""

    def __init__(self, function: Callable[[list], list]) -> None:
        self.function = function

    def __call__(self, grads: list, scale: Any = None) -> list:
        return self.function(grads)

    def wait_for_ranks(self) -> None:
        return None


def as_exchange(exchange: GradientExchange | Callable[[list], list]) -> GradientExchange:
    """`exchange` itself when it keeps the contract; a plain function wrapped in Function."""
    if isinstance(exchange, GradientExchange):
        return exchange
    if callable(exchange):
        return Function(exchange)
    raise TypeError(f"{exchange!r} is neither a GradientExchange nor a function of the gradients")


def wait_for_ranks(name: str, process_set: Any = None) -> Any:
    """A one-float allreduce: returns once every rank of the set has reached it (None: no other
    rank)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if not hvd.is_initialized():
        return None
    process_set = process_set or hvd.global_process_set
    if process_set.size() > 1:
        return hvd.allreduce(
            tf.zeros([1]), op=hvd.Sum, name=f"{name}_wait", process_set=process_set
        )
    return None
