"""The pre-training TFRecord schema: google-research/bert's feature names, dtypes and shapes
(`feature_spec`), so files made by either tool are interchangeable, the packed layout's extra
features (`PACKED_FEATURES`), instances serialized to it, and the shard files they are written to.
The writer (pretraining_data) and the reader (input_pipeline) both take the layout from here.
"""

from __future__ import annotations

import os

import tensorflow as tf


def feature_spec(max_seq_length, max_predictions_per_seq, pack=0):
    """google-research/bert's parse spec for pre-training TFRecords; with `pack` (up to that many
    instances per row, instances.pack_instances) the packed layout: next_sentence_labels [pack] and
    the features that keep the instances apart (PACKED_FEATURES)."""
    L, P = max_seq_length, max_predictions_per_seq
    spec = {
        "input_ids": tf.io.FixedLenFeature([L], tf.int64),
        "input_mask": tf.io.FixedLenFeature([L], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([L], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([P], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([P], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([P], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([max(pack, 1)], tf.int64),
    }
    if pack:
        spec.update(
            {
                "position_ids": tf.io.FixedLenFeature([L], tf.int64),
                "instance_ids": tf.io.FixedLenFeature([L], tf.int64),
                "next_sentence_positions": tf.io.FixedLenFeature([pack], tf.int64),
                "next_sentence_weights": tf.io.FixedLenFeature([pack], tf.float32),
            }
        )
    return spec


# A packed row's extra features: each token's position within its instance, its instance (1, 2, ...;
# 0 is padding), and per instance slot the [CLS] position and whether the slot holds an instance.
PACKED_FEATURES = (
    "position_ids",
    "instance_ids",
    "next_sentence_positions",
    "next_sentence_weights",
)


def _int64(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def serialize(instance, config) -> bytes:
    """One instances.Instance as a tf.train.Example in google's layout (padded to max lengths);
    config: an instances.InstanceConfig."""
    L, P = config.max_seq_length, config.max_predictions_per_seq
    n = len(instance.tokens)
    features = {
        "input_ids": _int64(instance.tokens + [0] * (L - n)),
        "input_mask": _int64([1] * n + [0] * (L - n)),
        "segment_ids": _int64(instance.segment_ids + [0] * (L - n)),
        "next_sentence_labels": _int64([int(instance.is_random_next)]),
    }
    if config.mask:
        k = len(instance.positions)
        features["masked_lm_positions"] = _int64(instance.positions + [0] * (P - k))
        features["masked_lm_ids"] = _int64(instance.labels + [0] * (P - k))
        features["masked_lm_weights"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (P - k))
        )
    # deterministic: map fields in key order, so the same instance gives the same bytes in every
    # process
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(
        deterministic=True
    )


def serialize_packed(row, config) -> bytes:
    """One packed row (instances.pack_instances) as a tf.train.Example: the instances one after the
    other, each with its own positions 0, 1, ... and instance id, masked positions shifted to the
    row."""
    L, P, K = config.max_seq_length, config.max_predictions_per_seq, config.pack
    tokens, segments, positions, instance_ids, mlm_positions, mlm_ids, cls_positions, labels = (
        [] for _ in range(8)
    )
    for number, inst in enumerate(row, 1):
        start = len(tokens)
        cls_positions.append(start)
        labels.append(int(inst.is_random_next))
        tokens += inst.tokens
        segments += inst.segment_ids
        positions += range(len(inst.tokens))
        instance_ids += [number] * len(inst.tokens)
        mlm_positions += [start + p for p in inst.positions]
        mlm_ids += inst.labels
    n, k, m = len(tokens), len(mlm_positions), len(row)
    if n > L or k > P or m > K:
        raise ValueError(
            f"a packed row of {m} instances has {n} tokens and {k} predictions (limits {L}, {P}, "
            f"{K})"
        )
    features = {
        "input_ids": _int64(tokens + [0] * (L - n)),
        "input_mask": _int64([1] * n + [0] * (L - n)),
        "segment_ids": _int64(segments + [0] * (L - n)),
        "position_ids": _int64(positions + [0] * (L - n)),
        "instance_ids": _int64(instance_ids + [0] * (L - n)),
        "next_sentence_positions": _int64(cls_positions + [0] * (K - m)),
        "next_sentence_labels": _int64(labels + [0] * (K - m)),
        "next_sentence_weights": tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * m + [0.0] * (K - m))
        ),
    }
    if config.mask:
        features["masked_lm_positions"] = _int64(mlm_positions + [0] * (P - k))
        features["masked_lm_ids"] = _int64(mlm_ids + [0] * (P - k))
        features["masked_lm_weights"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (P - k))
        )
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(
        deterministic=True
    )


class ShardWriter:
    """One TFRecord file, written as `.tmp` and renamed only by `close()`: a failed or killed
    creation never leaves a half-written shard under a final name."""

    def __init__(self, path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self.writer = tf.io.TFRecordWriter(path + ".tmp")
        self.count = 0

    def write(self, record: bytes):
        self.writer.write(record)
        self.count += 1

    def close(self):
        self.writer.close()
        os.replace(self.path + ".tmp", self.path)
        return self.path

    def abort(self):
        self.writer.close()
        if os.path.exists(self.path + ".tmp"):
            os.remove(self.path + ".tmp")
