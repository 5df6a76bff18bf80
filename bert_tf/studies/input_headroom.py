"""Input-pipeline headroom: what `input_pipeline.make_dataset` delivers alone, per rank, so it can
be set next to what the model consumes (run/benchmark.py --train_files). A pipeline that cannot run
well ahead of the model starves GPUs: plan for >= 10x the fastest rung's sequences/s. Measurement
only; the pipeline itself lives in input_pipeline.py.
"""

from __future__ import annotations

import time

from bert_tf.data import input_pipeline, tokenization


def sequences_per_second(
    files,
    micro_batch,
    max_seq_length,
    max_predictions_per_seq,
    masker=None,
    seconds=5.0,
    warmup_batches=10,
) -> float:
    """Sequences/s one rank's training dataset yields with nothing consuming it (shuffle, parse,
    batch and, with `masker`, dynamic masking), after `warmup_batches` fill the buffers."""
    batches = iter(
        input_pipeline.make_dataset(
            files, micro_batch, max_seq_length, max_predictions_per_seq, masker=masker
        )
    )
    for _ in range(warmup_batches):
        next(batches)
    count, start = 0, time.perf_counter()
    while count == 0 or time.perf_counter() - start < seconds:
        next(batches)
        count += 1
    return count * micro_batch / (time.perf_counter() - start)


def measure(
    patterns, vocab_file, micro_batch, max_seq_length, max_predictions_per_seq, seconds=5.0
) -> dict:
    """{"static": seq/s, "dynamic": seq/s}: the records as written, and re-masked each batch
    (dynamic masking parses only the unmasked fields, so any record file measures its cost)."""
    files = input_pipeline.list_files(patterns)
    tokenizer = tokenization.Tokenizer.from_file(vocab_file)
    masker = input_pipeline.dynamic_masker(
        len(tokenizer),
        [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id],
        max_predictions_per_seq,
        mask_id=tokenizer.mask_id,
    )
    return {
        "static": sequences_per_second(
            files, micro_batch, max_seq_length, max_predictions_per_seq, seconds=seconds
        ),
        "dynamic": sequences_per_second(
            files, micro_batch, max_seq_length, max_predictions_per_seq, masker, seconds=seconds
        ),
    }
