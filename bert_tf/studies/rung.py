"""One rung of the speed ladder (bert_tf/studies/ladder.py) timed: a bert_tf training
configuration's update on random full rows or on real records, after warm-up (compile) updates, with
what else the machine ran meanwhile; or traced with the TensorFlow profiler. The peer
(run/benchmark.py's keras-hub model) is timed with the same helpers, on the same random rows.
"""

from __future__ import annotations

import dataclasses
import time

from bert_tf.studies import machine_load

TRACED_UPDATES = 3


@dataclasses.dataclass(frozen=True)
class Timing:
    """The shapes every rung is timed at, and how many updates warm up and are timed."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    warmup_updates: int = 2
    updates: int = 5


def random_batch(batch, seq, preds, vocab, seed):
    import numpy as np
    import tensorflow as tf

    r = np.random.RandomState(seed)
    positions = np.sort(
        np.stack([r.choice(np.arange(1, seq), preds, replace=False) for _ in range(batch)]), 1
    )
    return {
        "input_ids": tf.constant(r.randint(104, vocab, (batch, seq)), tf.int32),
        "input_mask": tf.ones((batch, seq), tf.int32),
        "segment_ids": tf.constant(
            np.repeat([[0] * (seq // 2) + [1] * (seq - seq // 2)], batch, 0), tf.int32
        ),
        "masked_lm_positions": tf.constant(positions, tf.int32),
        "masked_lm_ids": tf.constant(r.randint(104, vocab, (batch, preds)), tf.int32),
        "masked_lm_weights": tf.ones((batch, preds), tf.float32),
        "next_sentence_labels": tf.constant(r.randint(0, 2, (batch, 1)), tf.int32),
    }


def timed_updates(step, timing: Timing):
    """{"update_seconds": median of timing.updates calls of step(), "first_update_seconds",
    "compile_seconds_estimate", "machine_load": what other processes and the hypervisor took
    meanwhile (bert_tf/studies/machine_load.py)}."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(timing.warmup_updates - 1):
        step()
    times = []
    with machine_load.Meter() as load:  # what else the machine ran while the updates were timed
        for _ in range(timing.updates):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    median = sorted(times)[len(times) // 2]
    return {
        "update_seconds": median,
        "first_update_seconds": first,
        "compile_seconds_estimate": max(first - median, 0),
        "machine_load": load.result,
    }


def traced_updates(step, profile_dir, timing: Timing):
    """Warm up, then trace TRACED_UPDATES calls of step() with the TensorFlow profiler into
    profile_dir; returns their wall seconds (the profiler's own cost included)."""
    import tensorflow as tf

    for _ in range(timing.warmup_updates):
        step()
    tf.profiler.experimental.start(profile_dir)
    start = time.perf_counter()
    for _ in range(TRACED_UPDATES):
        step()
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    return seconds


def run_rung(
    config,
    timing: Timing,
    precision,
    xla,
    accumulation,
    micro_batch,
    profile_dir="",
    tf32=False,
    fuse=False,
    records=None,
):
    """One rung's timing (timed_updates) on random full rows, or with records=(glob, instances per
    row) on the records' own batches, a new update's worth each call, read before the clock starts;
    then useful_tokens_per_second and instances_per_second count what the timed updates held."""
    import tensorflow as tf

    from bert_tf.model import modeling
    from bert_tf.train import training

    tf.random.set_seed(0)
    model = modeling.BertPretrainer(config)
    trainer = training.Trainer(
        model,
        training.TrainConfig(
            precision=precision,
            xla=xla,
            tf32=tf32,
            fuse=fuse,
            accumulation_steps=accumulation,
            total_steps=10**6,
        ),
    )
    if records:
        return _on_records(trainer, timing, accumulation, micro_batch, records)
    micro = [
        random_batch(
            micro_batch, timing.max_seq_length, timing.max_predictions_per_seq, config.vocab_size, i
        )
        for i in range(accumulation)
    ]
    step = lambda: float(trainer.train_step(micro).loss)
    return traced_updates(step, profile_dir, timing) if profile_dir else timed_updates(step, timing)


def _on_records(trainer, timing: Timing, accumulation, micro_batch, records):
    import tensorflow as tf

    from bert_tf.data import input_pipeline

    pattern, pack = records
    batches = iter(
        input_pipeline.make_dataset(
            input_pipeline.list_files(pattern),
            micro_batch,
            timing.max_seq_length,
            timing.max_predictions_per_seq,
            pack=pack,
        )
    )
    updates = [
        [next(batches) for _ in range(accumulation)]
        for _ in range(timing.warmup_updates + timing.updates)
    ]
    queue = list(updates)
    result = timed_updates(lambda: float(trainer.train_step(queue.pop(0)).loss), timing)
    timed = [mb for update in updates[timing.warmup_updates :] for mb in update]
    seconds = result["update_seconds"] * timing.updates  # the median update, as the rows/s figure
    result["useful_tokens_per_second"] = (
        sum(int(tf.reduce_sum(mb["input_mask"])) for mb in timed) / seconds
    )
    result["instances_per_second"] = (
        sum(
            float(tf.reduce_sum(mb["next_sentence_weights"]))
            if pack
            else int(mb["input_ids"].shape[0])
            for mb in timed
        )
        / seconds
    )
    return result
