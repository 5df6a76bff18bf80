"""The plain-Python part of --local_updates (bert_tf/parallel/local_sgd.py): which update does what
(`Schedule`), which variables make up each fragment (`assign_fragments`), the quantised payload's
layout (`payload_bytes`) and the bytes a run sends per update (`wire_bytes_per_update`). No
TensorFlow: the planner and CommConfig's checks import it.

Schedule, counting updates as the loop does (after update s the trainer's step is s):

    updates 1..K (--local_updates_after=K)  synchronous: gradients averaged every update
    after update K                           the anchor is taken (every rank's weights alike)
    fragment f of F (--local_fragments)      its exchange starts after updates
                                             K + (f + 1)·H/F + j·H, j >= 0 (H: --local_updates)
    τ updates later (--fragment_delay)       it completes: the outer step on that fragment

With F = 1 and τ = 0 that is plain DiLoCo: an outer step after updates K + H, K + 2H, ...; a full
cycle of F fragments ends after updates K + j·H (the last fragment's start).
"""

from __future__ import annotations

import dataclasses
import math

from bert_tf import ConfigError

DELTA_BITS = (32, 16, 8, 4)  # --outer_delta_bits: float32, float16, int8 and packed int4 codes
BLOCK = 256  # elements per absmax scale of the 8- and 4-bit codes (a float32 each)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the outer exchanges of --local_updates happen (see the module's docstring); `step` is
    always the number of updates done."""

    every: int  # H
    after: int = 0  # K: synchronous updates first
    fragments: int = 1  # F
    delay: int = 0  # τ

    @property
    def stride(self) -> int:
        """Updates between two fragments' starts: H/F."""
        return self.every // self.fragments

    def synchronous(self, step: int) -> bool:
        """Update step + 1 (0-based `step`) is one of the first K: its gradients are averaged."""
        return step < self.after

    def start_at(self, step: int) -> int | None:
        """The fragment whose exchange starts after update `step`, or None."""
        since = step - self.after
        if since <= 0 or since % self.stride:
            return None
        return (since // self.stride - 1) % self.fragments

    def complete_at(self, step: int) -> int | None:
        """The fragment whose exchange completes after update `step` (started τ updates before),
        or None; with τ = 0 the one that starts there."""
        return self.start_at(step - self.delay)

    def cycle_end(self, step: int) -> bool:
        """After update `step` a full cycle ended: K, or K + j·H."""
        return step >= self.after and (step - self.after) % self.every == 0


def assign_fragments(layer_of: list, sizes: list, count: int) -> list:
    """The variables' indices of each of `count` fragments. layer_of[i]: the encoder layer variable
    i belongs to (None: embeddings, pooler, heads). Layers are strided (layer l in fragment
    l mod count, as Streaming DiLoCo prefers); every other tensor goes, largest first, to the
    fragment with the fewest elements so far, so the exchanges carry about the same bytes.
    ConfigError when a fragment would be empty."""
    fragments: list = [[] for _ in range(count)]
    load = [0] * count
    for i, layer in enumerate(layer_of):
        if layer is not None:
            fragments[layer % count].append(i)
            load[layer % count] += sizes[i]
    rest = sorted((i for i, layer in enumerate(layer_of) if layer is None), key=lambda i: -sizes[i])
    for i in rest:
        f = min(range(count), key=lambda k: (load[k], k))
        fragments[f].append(i)
        load[f] += sizes[i]
    if not all(fragments):
        raise ConfigError(
            f"--local_fragments={count}: the model has too few tensors for that many fragments "
            f"({len(layer_of)} tensors, {sum(1 for x in layer_of if x is not None)} in encoder "
            "layers)"
        )
    return [sorted(f) for f in fragments]


def blocks(elements: int, block: int = BLOCK) -> int:
    return -(-elements // block)


def payload_bytes(elements: int, bits: int, block: int = BLOCK) -> int:
    """What one rank contributes to an exchange of `elements` values: 2 or 4 bytes each (16, 32
    bits), or (8, 4 bits) the codes of whole blocks plus one float32 scale per block."""
    if bits in (16, 32):
        return elements * bits // 8
    return blocks(elements, block) * (block * bits // 8 + 4)


def chunk_elements(elements: int, size: int, block: int = BLOCK) -> int:
    """8 and 4 bits: the values of each rank's chunk of a change of `elements`, whole blocks."""
    return blocks(-(-elements // size), block) * block


def exchange_wire_bytes(elements: int, bits: int, size: int, block: int = BLOCK) -> float:
    """Bytes each rank sends for one outer exchange of `elements` values over `size` ranks, ring
    collectives: 16 and 32 bits an allreduce, 2(N-1)/N of the payload; 8 and 4 bits an alltoall of
    the chunks' codes and an allgather of the means', (N-1) chunk payloads each: about 2(N-1)/N of
    the codes, whatever N."""
    if size < 2:
        return 0.0
    if bits in (16, 32):
        return 2 * (size - 1) / size * payload_bytes(elements, bits, block)
    return 2 * (size - 1) * payload_bytes(chunk_elements(elements, size, block), bits, block)


def wire_bytes_per_update(
    shapes, comm, size: int, total_steps: int, forced_syncs: int = 0
) -> float:
    """Bytes each rank sends per update, averaged over a run of `total_steps` updates, under
    --local_updates (comm: a CommConfig with local_updates > 0): the first K updates a float32
    allreduce of the gradients each, then one outer exchange of the whole model per H updates (F
    exchanges of a fragment each; the scales' padding counted as at most one block per fragment),
    plus `forced_syncs` full synchronisations (a stop between two; with F > 1 every save and
    evaluation after K: each sends the F - 1 fragments not due, (F - 1)/F of the model). Bytes
    inside a node (--local_group=node's per-update allreduce) are not counted."""
    elements = sum(math.prod(s) for s in shapes)
    if size < 2 or not comm.local_updates or total_steps < 1:
        return 0.0
    after = min(comm.local_updates_after, total_steps)
    synchronous = after * 2 * (size - 1) / size * 4 * elements
    fragments, bits = comm.local_fragments, comm.outer_delta_bits
    per_fragment = exchange_wire_bytes(-(-elements // fragments), bits, size)
    rounds = (total_steps - after) // comm.local_updates
    forced = forced_syncs * (max(fragments - 1, 1)) * per_fragment
    return (synchronous + rounds * fragments * per_fragment + forced) / total_steps


def describe(comm) -> str:
    """--local_updates in a few words, for the run's first log line."""
    bits = comm.outer_delta_bits
    form = {32: "float32", 16: "float16"}.get(bits, f"{bits}-bit codes (error feedback)")
    fragments, delay = comm.local_fragments, comm.fragment_delay
    return (
        f"DiLoCo{' (each node one worker)' if comm.local_group == 'node' else ''}: the "
        f"weights' change in {form} every {comm.local_updates} updates (outer learning rate "
        f"{comm.outer_learning_rate:g}, Nesterov momentum {comm.outer_momentum:g})"
        + (
            f", after {comm.local_updates_after} synchronous updates"
            if comm.local_updates_after
            else ""
        )
        + (f", in {fragments} fragments" if fragments > 1 else "")
        + (
            f", each exchange overlapping {delay} updates (alpha {comm.fragment_update_alpha:g})"
            if delay
            else ""
        )
    )


def check(comm) -> None:
    """ConfigError for --local_updates' settings that cannot work together (CommConfig's check)."""
    every, fragments, delay = comm.local_updates, comm.local_fragments, comm.fragment_delay
    if every < 0 or comm.outer_learning_rate <= 0 or not 0 <= comm.outer_momentum < 1:
        raise ConfigError(
            f"--local_updates must be >= 0, --outer_learning_rate > 0 and --outer_momentum in "
            f"[0, 1), got {every}, {comm.outer_learning_rate:g}, {comm.outer_momentum:g}"
        )
    if every and (comm.method != "none" or comm.allreduce_every_micro_batch):
        raise ConfigError(
            f"--local_updates={every} exchanges no gradients (the outer step sends the weights' "
            "change): drop --exchange, --fp16_allreduce and --allreduce_every_micro_batch"
        )
    if comm.local_updates_after < 0:
        raise ConfigError(f"--local_updates_after must be >= 0, got {comm.local_updates_after}")
    if comm.outer_delta_bits not in DELTA_BITS:
        raise ConfigError(
            f"--outer_delta_bits={comm.outer_delta_bits}: valid are "
            f"{', '.join(map(str, DELTA_BITS))}"
        )
    if fragments < 1 or delay < 0 or not 0 <= comm.fragment_update_alpha <= 1:
        raise ConfigError(
            f"--local_fragments must be >= 1, --fragment_delay >= 0 and --fragment_update_alpha in "
            f"[0, 1], got {fragments}, {delay} and {comm.fragment_update_alpha:g}"
        )
    asked = (comm.local_updates_after, fragments, delay, comm.fragment_update_alpha)
    if not every and (asked != (0, 1, 0, 0) or comm.outer_delta_bits != 16):
        raise ConfigError(
            "--local_updates_after, --local_fragments, --fragment_delay, --fragment_update_alpha "
            "and --outer_delta_bits are for --local_updates (DiLoCo): give it"
        )
    if every and (every < fragments or every % fragments):
        raise ConfigError(
            f"--local_updates={every} must be a multiple of --local_fragments={fragments} (and "
            "at least it): fragment f starts f·H/F updates after fragment 0"
        )
    if every and delay >= every // fragments:
        raise ConfigError(
            f"--fragment_delay={delay} must be smaller than --local_updates / --local_fragments = "
            f"{every // fragments}: one fragment's exchange is in flight at a time"
        )
