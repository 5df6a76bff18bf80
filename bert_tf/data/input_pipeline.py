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

The loop reads an update at a time through one interface, `TrainingInput`: `PerRankInput` here
for static runs, `elastic.SharedStream` for --elastic (every rank reads one shared stream, so the
rank count may change between updates; bert_tf/train/elastic.py says how).
"""

from __future__ import annotations

import glob
import os
from typing import Protocol, runtime_checkable

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.data.records import feature_spec

# Verify every record of a rank's files at start-up when they are this small in total;
# larger inputs get a first-record check, and a corrupt file is named when it is hit.
FULL_VERIFY_BYTES = 1 << 30


def list_files(patterns):
    """Sorted, de-duplicated files matching comma-separated globs; an error names what matched
    nothing."""
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


def record_spec(max_seq_length, max_predictions_per_seq, masked=True, pack=0):
    """The parse spec of the training records: google's features, without the masked_lm_* ones
    when the records are unmasked (--dynamic_masking masks them in the pipeline); with `pack`, the
    packed layout of up to that many instances per row (create_pretraining_data.py --pack)."""
    spec = feature_spec(max_seq_length, max_predictions_per_seq, pack)
    return spec if masked else {k: v for k, v in spec.items() if not k.startswith("masked_lm")}


def parse_features(serialized, spec):
    """Serialized tf.train.Examples (one or a batch) -> features, int64 as int32 (the model's
    ids)."""
    parse = tf.io.parse_single_example if serialized.shape.rank == 0 else tf.io.parse_example
    example = parse(serialized, spec)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}


def records_pack(path):
    """Instances per row of the records in `path`: 0 for google's layout, K for packed rows."""
    try:
        for raw in tf.data.TFRecordDataset(path).take(1):
            features = tf.train.Example.FromString(raw.numpy()).features.feature
            if "instance_ids" not in features:
                return 0
            return len(features["next_sentence_labels"].int64_list.value)
    except tf.errors.DataLossError as e:
        raise ConfigError(f"{path} is truncated or corrupt: {e.message}") from None
    raise ConfigError(f"{path} has no records")


def check_file(
    path, max_seq_length, max_predictions_per_seq, dynamic_masking=False, full=False, pack=0
):
    """Raises ValueError naming the file and feature when records do not fit the run."""
    expected = {
        k: spec.shape[0]
        for k, spec in record_spec(
            max_seq_length, max_predictions_per_seq, masked=not dynamic_masking, pack=pack
        ).items()
    }
    count = 0
    try:
        for raw in tf.data.TFRecordDataset(path):
            if count == 0:
                example = tf.train.Example.FromString(raw.numpy())
                _check_example(path, example, expected, dynamic_masking, pack)
            count += 1
            if not full:
                break
    except tf.errors.DataLossError as e:
        raise ConfigError(
            f"{path} is truncated or corrupt after {count} good records: {e.message}"
        ) from None
    if count == 0:
        raise ConfigError(f"{path} has no records")
    return count


def _check_example(path, example, expected, dynamic_masking, pack):
    """The first record of `path` against the run: its layout (packed or not, masked or not) and
    each feature's length (`expected`: feature -> length)."""
    found = "instance_ids" in example.features.feature and len(
        example.features.feature["next_sentence_labels"].int64_list.value
    )
    if found != pack:
        describe = lambda k: f"packed ({k} instances per row)" if k else "one instance per row"
        raise ConfigError(
            f"{path}: records are {describe(found)}, unlike the run's other files "
            f"({describe(pack)}); give files of one layout"
        )
    if dynamic_masking and "masked_lm_positions" in example.features.feature:
        raise ConfigError(
            f"{path}: records are already masked; train without --dynamic_masking or create the "
            f"data with --dynamic_masking"
        )
    for name, length in expected.items():
        feature = example.features.feature.get(name)
        if feature is None:
            raise ConfigError(
                f"{path}: records lack the feature {name!r}"
                + (
                    " (made with --dynamic_masking? then train with it too)"
                    if name.startswith("masked_lm")
                    else ""
                )
            )
        kind = feature.WhichOneof("kind")
        got = len(getattr(feature, kind).value)
        if got != length:
            flag = {
                "input_ids": "max_seq_length",
                "input_mask": "max_seq_length",
                "segment_ids": "max_seq_length",
                "next_sentence_labels": None,
            }.get(name, "max_predictions_per_seq")
            raise ConfigError(
                f"{path}: feature {name!r} has length {got} but the run expects "
                f"{length}" + (f" (--{flag})" if flag else "")
            )


def records_masked(path) -> bool:
    """Whether the first record of `path` holds masked-LM positions (masked when it was written)."""
    for raw in tf.data.TFRecordDataset(path).take(1):
        return "masked_lm_positions" in tf.train.Example.FromString(raw.numpy()).features.feature
    return False


def full_sentence_folders(files):
    """The folders of `files` whose summary.json says they hold FULL-SENTENCES instances (no
    sentence pairs: run/create_pretraining_data.py --full_sentences)."""
    import json

    found = []
    for folder in sorted({os.path.dirname(f) for f in files}):
        path = os.path.join(folder, "summary.json")
        if os.path.isfile(path):
            with open(path) as f:
                if json.load(f).get("total", {}).get("config", {}).get("full_sentences"):
                    found.append(folder)
    return found


def check_files(files, max_seq_length, max_predictions_per_seq, dynamic_masking=False):
    """Checks every file against the run; returns their layout (records_pack), the same for all."""
    full = sum(os.path.getsize(f) for f in files) <= FULL_VERIFY_BYTES
    pack = records_pack(files[0])
    for f in files:
        check_file(
            f, max_seq_length, max_predictions_per_seq, dynamic_masking, full=full, pack=pack
        )
    return pack


def find_corrupt_file(files):
    """The first file that cannot be read to the end, or None."""
    for f in files:
        try:
            for _ in tf.data.TFRecordDataset(f):
                pass
        except tf.errors.DataLossError:
            return f
    return None


class MaskingRate:
    """--masked_lm_prob_end: the dynamic masker's rate as a variable the tf.data map reads at each
    batch, moved linearly from `start` at update 0 to `end` at the schedule's last update (Ankner
    et al. 2023, arXiv:2305.15096: 30% -> 15%; mmBERT steps 30 -> 15 -> 5% across its phases).
    The loop moves it at each log step, where it reads the schedule's length anyway (a time budget
    re-predicts it), so it changes in steps of --log_interval updates; batches already prefetched
    keep the rate they were masked at, and a resume replays them (they are in the iterator's saved
    state) before masking at the restored step's rate."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        with tf.device("/CPU:0"):  # where tf.data runs the masker
            self.variable = tf.Variable(start, dtype=tf.float32, trainable=False, name="mlm_rate")

    def at(self, step: int, total_steps: int) -> float:
        return self.start + (self.end - self.start) * min(1.0, step / max(total_steps, 1))

    def follow(self, step: int, total_steps: int) -> float:
        rate = self.at(step, total_steps)
        self.variable.assign(rate)
        return rate


def dynamic_masker(
    vocab_size, special_ids, max_predictions_per_seq, masked_lm_prob=0.15, mask_id=None
):
    """Returns a batch-level map: unmasked features -> google's masked features, fresh each call.

    Uses tensorflow-text: RandomItemSelector picks up to `max_predictions_per_seq` of the
    real tokens (never [CLS]/[SEP]/[PAD]) at `masked_lm_prob` (a float, or a MaskingRate's
    variable, read at each batch), MaskValuesChooser makes 80% of them [MASK], 10% random
    tokens, 10% unchanged.
    """
    import tensorflow_text as text

    selector = text.RandomItemSelector(
        max_selections_per_batch=max_predictions_per_seq,
        selection_rate=masked_lm_prob,
        unselectable_ids=list(special_ids),
    )
    chooser = text.MaskValuesChooser(
        vocab_size, mask_id, mask_token_rate=0.8, random_token_rate=0.1
    )
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
        out["masked_lm_weights"] = tf.ones_like(tf.cast(positions, tf.float32)).to_tensor(
            0.0, shape=[batch, P]
        )
        return out

    return mask


def serialized_records(
    files,
    seed=0,
    training=True,
    shuffle_buffer=10000,
    read=tf.data.TFRecordDataset,
    record_shard=None,
):
    """The records of `files`, serialized. training: the files reshuffled every pass and the records
    through a seeded buffer, repeated forever; else one pass in order. record_shard: (index, count),
    keep every count-th record from index (shard_files' record-level sharding)."""
    ds = tf.data.Dataset.from_tensor_slices(files)
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(
        read,
        cycle_length=min(4, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if record_shard is not None:
        ds = ds.shard(record_shard[1], record_shard[0])
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    return ds


def make_dataset(
    files,
    micro_batch,
    max_seq_length,
    max_predictions_per_seq,
    rank=0,
    size=1,
    seed=0,
    training=True,
    masker=None,
    shuffle_buffer=10000,
    read=tf.data.TFRecordDataset,
    pack=0,
):
    """Batches of google-format features (int32 ids) for one rank (packed rows: pack = instances per
    row).

    training: shuffled, repeated forever; else one pass in order.
    masker: a `dynamic_masker` for files written with --dynamic_masking.
    read: path -> dataset of serialized records (tests pass one that counts what it decodes).
    """
    my_files, record_shard = shard_files(list(files), rank, size)
    spec = record_spec(max_seq_length, max_predictions_per_seq, masked=masker is None, pack=pack)
    ds = serialized_records(my_files, seed, training, shuffle_buffer, read, record_shard)
    ds = ds.map(
        lambda record: parse_features(record, spec),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    ds = ds.batch(micro_batch, drop_remainder=training)
    if masker is not None:
        ds = ds.map(masker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    # The dynamic masker's random ops keep state outside the pipeline: a saved position restores the
    # records exactly, their fresh masks are drawn anew (no warning at every save).
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.prefetch(tf.data.AUTOTUNE).with_options(without_autotune_thread(options))


def without_autotune_thread(options: tf.data.Options | None = None) -> tf.data.Options:
    """tf.data's autotuning off: AUTOTUNE parallelism becomes the core count and the prefetch
    buffer grows by the legacy rule. With it on, an iterator's destructor waits for the autotune
    thread's timed sleep (TF 2.21: 10-35 s, in about half of the cases measured), so every process
    under Horovod lingered after training and each evaluation's pass waited as long. The tiny
    model's pipeline gives the same rows/s either way here (21k vs 20-21k rows/s at sequence 64)."""
    options = options or tf.data.Options()
    options.autotune.enabled = False
    return options


def iterator_state(iterator) -> bytes:
    """A tf.data iterator's position (file offsets, shuffle buffer, seeds) as bytes."""
    return tf.io.serialize_tensor(iterator._serialize_to_tensors()["_STATE"]).numpy()


def restore_iterator(iterator, state: bytes):
    iterator._restore_from_tensors({"_STATE": tf.io.parse_tensor(state, tf.variant)})


@runtime_checkable
class TrainingInput(Protocol):
    """What the pre-training loop reads: `PerRankInput` (static runs) and `elastic.SharedStream`
    (--elastic) both satisfy it (tests/test_pretraining.py)."""

    def next_update(self) -> list:
        """This rank's micro-batches of the next update (feature dicts)."""

    def capture(self, position: "InputPosition", samples_seen: int) -> None:
        """Store the position into `position` before a save (a collective where the input says
        so)."""

    def resume(self, position: "InputPosition") -> bool:
        """Continue from a restored `position`; False when it does not apply (a fresh pass
        follows)."""


class PerRankInput:
    """Static runs' input: this rank's `make_dataset` pipeline; an update is its next
    `rank_micro_batches` batches (--accumulation_steps). Its position is every rank's iterator
    state, gathered to the checkpoint writer."""

    def __init__(self, dataset, rank_micro_batches, gather, rank=0, size=1):
        """gather(bytes) -> [every rank's bytes] (a collective: distributed.gather_bytes); rank,
        size: whose pipeline this is (`make_dataset`'s)."""
        self.dataset, self.rank_micro_batches, self.gather = dataset, rank_micro_batches, gather
        self.rank, self.size = rank, size
        self.iterator = iter(dataset)

    def next_update(self):
        return [next(self.iterator) for _ in range(self.rank_micro_batches)]

    def capture(self, position, samples_seen):
        """A collective: every rank calls it before a save."""
        position.store(samples_seen, self.gather(iterator_state(self.iterator)), shared=False)

    def resume(self, position) -> bool:
        """Puts this rank's iterator at the saved position; False when the saved states do not apply
        (nothing saved, another rank count, or elastic mode's shared stream)."""
        states = position.states()
        if (
            position.is_shared()
            or len(states) != self.size
            or int(position.ranks.numpy()) != self.size
        ):
            return False
        restore_iterator(self.iterator, states[self.rank])
        return True


class InputPosition(tf.Module):
    """The training input's position, as checkpoint variables (module docstring: what resume keeps).

    samples_seen: sequences consumed by all ranks; ranks: the rank count that saved it; shared: the
    states are elastic mode's one shared-stream state (any rank count resumes it), else
    iterator_states[r] is rank r's. A state holds the records in the shuffle buffer, so a checkpoint
    grows by about ranks x shuffle_buffer x record size (16 x 10,000 x ~1.2 KB at sequence 128).
    """

    # elastic checkpoints written before the `shared` variable marked the shared stream with ranks =
    # -1
    _OLD_SHARED_RANKS = -1

    def __init__(self):
        super().__init__(name="input_position")
        self.samples_seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_seen")
        self.ranks = tf.Variable(0, dtype=tf.int64, trainable=False, name="ranks")
        self.shared = tf.Variable(False, trainable=False, name="shared")
        self.iterator_states = tf.Variable(
            tf.zeros([0], tf.string),
            shape=tf.TensorShape([None]),
            trainable=False,
            name="iterator_states",
        )

    def store(self, samples_seen, states, shared, ranks=None):
        self.samples_seen.assign(samples_seen)
        self.ranks.assign(len(states) if ranks is None else ranks)
        self.shared.assign(shared)
        self.iterator_states.assign(tf.constant(list(states), tf.string))

    def states(self) -> list:
        return list(self.iterator_states.numpy())

    def is_shared(self) -> bool:
        return bool(self.shared.numpy()) or int(self.ranks.numpy()) == self._OLD_SHARED_RANKS

    def saved_by(self) -> str:
        """Who saved it, for the log line of a fresh pass."""
        if self.is_shared():
            return "elastic mode's shared stream"
        ranks = int(self.ranks.numpy())
        return f"{ranks} ranks" if ranks else "an unknown number of ranks"
