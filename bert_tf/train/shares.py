"""The global batch in micro-batches, and each rank's share of it at any rank count (elastic mode's
split, bert_tf/train/elastic.py): arithmetic only, so the config checks and the planner use it
without TensorFlow."""

from __future__ import annotations

from bert_tf import ConfigError


def micro_batches_per_update(global_batch, micro_batch):
    if global_batch < 1 or global_batch % micro_batch:
        raise ConfigError(
            f"--global_batch_size={global_batch} must be a positive multiple of "
            f"--micro_batch_size={micro_batch}"
        )
    return global_batch // micro_batch


def rank_indices(per_update, rank, size):
    """Which of an update's micro-batches rank `rank` of `size` takes (SharedStream
    hands out the same ones)."""
    return range(rank, per_update, size)


def rank_share(per_update, rank, size):
    """(micro-batches this rank takes per update, weight of its average in the ranks' average)."""
    if size > per_update:
        raise ConfigError(
            f"{size} ranks but an update has only {per_update} micro-batches (--global_batch_size "
            f"/ --micro_batch_size): give horovodrun --max-np <= {per_update}, or a smaller "
            "--micro_batch_size"
        )
    mine = len(rank_indices(per_update, rank, size))
    return mine, mine * size / per_update


def describe_share(per_update, micro_batch, size):
    """One log line: how the global batch is split at this size."""
    counts = [len(rank_indices(per_update, r, size)) for r in range(size)]
    split = (
        f"{counts[0]} micro-batches per rank"
        if len(set(counts)) == 1
        else f"{max(counts)} micro-batches on ranks 0-{counts.count(max(counts)) - 1}, "
        f"{min(counts)} on the others (their gradients weighted to an exact mean)"
    )
    return (
        f"{size} ranks: global batch {per_update * micro_batch} = {per_update} micro-batches of "
        f"{micro_batch}, {split}"
    )
