"""0/1 Adam's variance schedule (Lu et al. 2022, "Maximizing communication efficiency for
large-scale training via 0/1 Adam"; DeepSpeed's ZeroOneAdam in deepspeed/runtime/fp16/onebit/
zoadam.py: its var_interval, var_counter and var_update_scaler). During the warmup the variance is
updated at kappa updates one apart, then kappa two apart, then four apart, ..., so T updates
update it about kappa x log2(T / kappa) times (--onebit_variance_kappa; bert_tf/parallel/onebit.py
and bert_tf/train/optimization.py follow it). TensorFlow is imported inside the functions that
need it: the planner counts float32 updates without it, and importing the optimizer must run no
TensorFlow op before distributed.init sets the thread pools."""

from __future__ import annotations


def variance_blocks(kappa: int, horizon: int = 2**40) -> list:
    """0/1 Adam's variance schedule (--onebit_variance_kappa; DeepSpeed ZeroOneAdam's var_interval
    and var_counter) as blocks (after, interval, last): after update `after`, the variance is
    updated at every multiple of `interval` up to `last`, kappa updates; then the interval doubles.
    Updates count from 1: (0, 1, kappa), (kappa, 2, 3 kappa), ... Blocks up to `horizon`."""
    blocks, after, interval = [], 0, 1
    while after < horizon:
        last = (after // interval + kappa) * interval
        blocks.append((after, interval, last))
        after, interval = last, interval * 2
    return blocks


def variance_updates(t: int, kappa: int) -> int:
    """How many of updates 1..t update the variance under 0/1 Adam's schedule (kappa 0: all)."""
    if not kappa:
        return t
    return sum(
        max(0, min(t, last) // interval - after // interval)
        for after, interval, last in variance_blocks(kappa, max(t, 1))
    )


def variance_count(t, kappa):
    """variance_updates(t, kappa) for an int64 tensor t (kappa 0: t itself)."""
    import tensorflow as tf

    if not kappa:
        return t
    after, interval, last = (tf.constant(c, tf.int64) for c in zip(*variance_blocks(kappa)))
    return tf.reduce_sum(tf.maximum(tf.minimum(t, last) // interval - after // interval, 0))


def variance_update(t, kappa):
    """Whether update t (from 1; an int64 tensor) updates the variance."""
    return variance_count(t, kappa) > variance_count(t - 1, kappa)
