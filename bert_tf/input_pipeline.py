"""tf.data input for pre-training: file checks, per-rank sharding, shuffling, dynamic masking.

Ranks never see the same record in an epoch: with at least as many files as ranks, rank r
reads files r, r+N, ... of the sorted list (file-level); otherwise every rank reads all
files and keeps records r, r+N, ... (record-level). Everything is seeded, so a run can
resume at the same input position by skipping the batches it already consumed.
"""
from __future__ import annotations

import glob
import os

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.pretraining_data import feature_spec

# Verify every record of a rank's files at start-up when they are this small in total;
# larger inputs get a first-record check, and a corrupt file is named when it is hit.
FULL_VERIFY_BYTES = 1 << 30


def list_files(patterns):
    """Sorted, de-duplicated files matching comma-separated globs; an error names what matched nothing."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    files = set()
    for pattern in patterns:
        matches = glob.glob(pattern)
        if not matches:
            raise ConfigError(f"no input files match {pattern!r}")
        files.update(matches)
    return sorted(files)


def shard_files(files, rank, size):
    """(files this rank reads, record-level shard or None)."""
    if len(files) >= size:
        return files[rank::size], None
    return files, (rank, size)


def check_file(path, max_seq_length, max_predictions_per_seq, dynamic_masking=False, full=False):
    """Raises ValueError naming the file and feature when records do not fit the run."""
    expected = {k: spec.shape[0] for k, spec in feature_spec(max_seq_length, max_predictions_per_seq).items()}
    if dynamic_masking:
        expected = {k: v for k, v in expected.items() if not k.startswith("masked_lm")}
    count = 0
    try:
        for raw in tf.data.TFRecordDataset(path):
            if count == 0:
                example = tf.train.Example.FromString(raw.numpy())
                if dynamic_masking and "masked_lm_positions" in example.features.feature:
                    raise ConfigError(f"{path}: records are already masked; train without --dynamic_masking "
                                      f"or create the data with --dynamic_masking")
                for name, length in expected.items():
                    feature = example.features.feature.get(name)
                    if feature is None:
                        raise ConfigError(f"{path}: records lack the feature {name!r}"
                                          + (" (made with --dynamic_masking? then train with it too)"
                                             if name.startswith("masked_lm") else ""))
                    kind = feature.WhichOneof("kind")
                    got = len(getattr(feature, kind).value)
                    if got != length:
                        flag = {"input_ids": "max_seq_length", "input_mask": "max_seq_length",
                                "segment_ids": "max_seq_length", "next_sentence_labels": None}.get(
                                    name, "max_predictions_per_seq")
                        raise ConfigError(
                            f"{path}: feature {name!r} has length {got} but the run expects {length}"
                            + (f" (--{flag})" if flag else ""))
            count += 1
            if not full:
                break
    except tf.errors.DataLossError as e:
        raise ConfigError(f"{path} is truncated or corrupt after {count} good records: {e.message}") from None
    if count == 0:
        raise ConfigError(f"{path} has no records")
    return count


def check_files(files, max_seq_length, max_predictions_per_seq, dynamic_masking=False):
    full = sum(os.path.getsize(f) for f in files) <= FULL_VERIFY_BYTES
    for f in files:
        check_file(f, max_seq_length, max_predictions_per_seq, dynamic_masking, full=full)


def find_corrupt_file(files):
    """The first file that cannot be read to the end, or None."""
    for f in files:
        try:
            for _ in tf.data.TFRecordDataset(f):
                pass
        except tf.errors.DataLossError:
            return f
    return None


def _parse(spec):
    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}
    return parse


def dynamic_masker(vocab_size, special_ids, max_predictions_per_seq, masked_lm_prob=0.15, mask_id=None):
    """Returns a batch-level map: unmasked features -> google's masked features, fresh each call.

    Uses tensorflow-text: RandomItemSelector picks up to `max_predictions_per_seq` of the
    real tokens (never [CLS]/[SEP]/[PAD]) at `masked_lm_prob`, MaskValuesChooser makes
    80% of them [MASK], 10% random tokens, 10% unchanged.
    """
    import tensorflow_text as text

    selector = text.RandomItemSelector(
        max_selections_per_batch=max_predictions_per_seq, selection_rate=masked_lm_prob,
        unselectable_ids=list(special_ids))
    chooser = text.MaskValuesChooser(vocab_size, mask_id, mask_token_rate=0.8, random_token_rate=0.1)
    P = max_predictions_per_seq

    def mask(features):
        ids = tf.cast(features["input_ids"], tf.int64)
        lengths = tf.reduce_sum(tf.cast(features["input_mask"], tf.int64), axis=1)
        ragged = tf.RaggedTensor.from_tensor(ids, lengths=lengths)
        masked, positions, originals = text.mask_language_model(ragged, selector, chooser)
        batch = tf.shape(ids)[0]
        out = dict(features)
        out["input_ids"] = tf.cast(masked.to_tensor(0, shape=tf.shape(ids)), tf.int32)
        out["masked_lm_positions"] = tf.cast(positions.to_tensor(0, shape=[batch, P]), tf.int32)
        out["masked_lm_ids"] = tf.cast(originals.to_tensor(0, shape=[batch, P]), tf.int32)
        out["masked_lm_weights"] = tf.ones_like(tf.cast(positions, tf.float32)).to_tensor(0.0, shape=[batch, P])
        return out

    return mask


def make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, rank=0, size=1, seed=0,
                 training=True, masker=None, skip_batches=0, shuffle_buffer=10000):
    """Batches of google-format features (int32 ids) for one rank.

    training: shuffled, repeated forever, `skip_batches` skipped (resume); else one pass in order.
    masker: a `dynamic_masker` for files written with --dynamic_masking.
    """
    my_files, record_shard = shard_files(list(files), rank, size)
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    if masker is not None:
        spec = {k: v for k, v in spec.items() if not k.startswith("masked_lm")}
    ds = tf.data.Dataset.from_tensor_slices(my_files)
    if training:
        ds = ds.shuffle(len(my_files), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(my_files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if record_shard is not None:
        ds = ds.shard(record_shard[1], record_shard[0])
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    ds = ds.map(_parse(spec), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:
        ds = ds.skip(skip_batches)
    if masker is not None:
        ds = ds.map(masker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)
