"""tf.data input for pre-training: file checks, per-rank sharding, shuffling, dynamic masking.

Ranks never see the same record in an epoch: with at least as many files as ranks, rank r
reads files r, r+N, ... of the sorted list (file-level); otherwise every rank reads all
files and keeps records r, r+N, ... (record-level).

Resume (`InputPosition`): every rank's tf.data iterator state (file offsets, shuffle buffer,
seeds, epoch) is saved inside the TensorFlow checkpoint, so restoring seeks instead of
re-reading: its cost does not grow with the position. On the same rank count the resumed
input continues exactly (no record twice, none skipped). On another rank count the saved
states do not apply: the input starts a fresh pass, reshuffled with a seed taken from the
step; ranks are disjoint in it and each record is read once per pass, but records the old
ranks read in their unfinished pass can be read again (at most once more each).

Elastic mode (`SharedStream`, run/pretrain.py --elastic) reads differently, so that the rank count
may change between any two updates: every rank reads the same single stream of serialized
micro-batches, whose order depends on the seed and the files only (never on the rank count); update
u takes the next `size x accumulation` micro-batches of it (whatever the size is at u) and rank r
parses and trains on micro-batches r, r + size, ... of those. All ranks' streams are at the same
position after every update, so one state (the committed one, or the one in the checkpoint) puts
any number of ranks at the same place. Guarantee: the micro-batches that went into the committed
weights are exactly the first `samples_seen / batch_size` micro-batches of the stream, in order,
each in one update; a failure rolls weights and stream back to the commit together, so the
micro-batches read by the lost updates are read again (replayed), none is skipped, none counted
twice. The price: every rank reads (not parses) all records, `size` times the I/O of sharded files.
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
                 training=True, masker=None, shuffle_buffer=10000, read=tf.data.TFRecordDataset):
    """Batches of google-format features (int32 ids) for one rank.

    training: shuffled, repeated forever; else one pass in order.
    masker: a `dynamic_masker` for files written with --dynamic_masking.
    read: path -> dataset of serialized records (tests pass one that counts what it decodes).
    """
    my_files, record_shard = shard_files(list(files), rank, size)
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    if masker is not None:
        spec = {k: v for k, v in spec.items() if not k.startswith("masked_lm")}
    ds = tf.data.Dataset.from_tensor_slices(my_files)
    if training:
        ds = ds.shuffle(len(my_files), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(read, cycle_length=min(4, len(my_files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if record_shard is not None:
        ds = ds.shard(record_shard[1], record_shard[0])
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    ds = ds.map(_parse(spec), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=training)
    if masker is not None:
        ds = ds.map(masker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    # The dynamic masker's random ops keep state outside the pipeline: a saved position restores the
    # records exactly, their fresh masks are drawn anew (no warning at every save).
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def make_shared_stream(files, batch_size, seed=0, shuffle_buffer=10000, read=tf.data.TFRecordDataset):
    """Elastic mode's stream (module docstring): serialized micro-batches of `batch_size` records,
    the files reshuffled every pass and the records through a seeded buffer, repeated forever. It has
    no rank or size in it, so every rank builds the same one."""
    files = sorted(files)
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().interleave(read, cycle_length=min(4, len(files)), num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=True)
    ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


class SharedStream:
    """One rank's copy of elastic mode's shared stream (module docstring): `next_update` takes an
    update's micro-batches and returns this rank's share, parsed; `state` / `restore` are the
    position as bytes (the same position on every rank after the same updates; the bytes also hold
    what each rank happens to have prefetched, so they may differ)."""

    def __init__(self, dataset, max_seq_length, max_predictions_per_seq, masker=None):
        spec = feature_spec(max_seq_length, max_predictions_per_seq)
        if masker is not None:
            spec = {k: v for k, v in spec.items() if not k.startswith("masked_lm")}

        def parse(serialized):
            example = tf.io.parse_example(serialized, spec)
            features = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}
            return masker(features) if masker is not None else features

        self.dataset = dataset
        self.parse = tf.function(parse)
        self.iterator = iter(dataset)

    def next_update(self, rank, size, micro_batches):
        """This rank's share of the next `micro_batches` micro-batches (all ranks read all of them):
        micro-batches rank, rank + size, ... (elastic.rank_micro_batches)."""
        mine = []
        for m in range(micro_batches):
            serialized = next(self.iterator)
            if m % size == rank:
                mine.append(self.parse(serialized))
        return mine

    def state(self) -> bytes:
        return tf.io.serialize_tensor(self.iterator._serialize_to_tensors()["_STATE"]).numpy()

    def restore(self, state: bytes):
        self.iterator = iter(self.dataset)
        self.iterator._restore_from_tensors({"_STATE": tf.io.parse_tensor(state, tf.variant)})


class InputPosition(tf.Module):
    """The training input's position, as checkpoint variables (module docstring: what resume keeps).

    samples_seen: sequences consumed by all ranks; ranks: the rank count that saved it;
    iterator_states[r]: rank r's serialized tf.data iterator, gathered to the writer at each save.
    Elastic mode saves its one SharedStream state instead, with ranks = SHARED (any rank count resumes it).
    A state holds the records in the shuffle buffer, so a checkpoint grows by about
    ranks x shuffle_buffer x record size (16 x 10,000 x ~1.2 KB at sequence length 128).
    """

    SHARED = -1

    def __init__(self):
        super().__init__(name="input_position")
        self.samples_seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_seen")
        self.ranks = tf.Variable(0, dtype=tf.int64, trainable=False, name="ranks")
        self.iterator_states = tf.Variable(tf.zeros([0], tf.string), shape=tf.TensorShape([None]),
                                           trainable=False, name="iterator_states")

    def capture(self, iterator, samples_seen, gather):
        """A collective: every rank calls it before a save; `gather(bytes) -> [bytes of each rank]`."""
        state = tf.io.serialize_tensor(iterator._serialize_to_tensors()["_STATE"]).numpy()
        states = gather(state)
        self.samples_seen.assign(samples_seen)
        self.ranks.assign(len(states))
        self.iterator_states.assign(tf.constant(states, tf.string))

    def capture_shared(self, stream: SharedStream, samples_seen):
        """Elastic mode, no collective: every rank's stream is at the same place; the writer saves its own."""
        self.samples_seen.assign(samples_seen)
        self.ranks.assign(self.SHARED)
        self.iterator_states.assign(tf.constant([stream.state()], tf.string))

    def resume_shared(self, stream: SharedStream) -> bool:
        """Puts `stream` at the saved shared position; False when the checkpoint holds per-rank states."""
        if int(self.ranks.numpy()) != self.SHARED:
            return False
        stream.restore(self.iterator_states[0].numpy())
        return True

    def resume(self, iterator, rank, size):
        """Puts `iterator` (fresh, same pipeline) at the saved position of `rank`; returns False
        when the saved states do not apply (nothing saved, or another rank count)."""
        if int(self.ranks.numpy()) != size or int(tf.size(self.iterator_states)) != size:
            return False
        state = tf.io.parse_tensor(self.iterator_states[rank], tf.variant)
        iterator._restore_from_tensors({"_STATE": state})
        return True
