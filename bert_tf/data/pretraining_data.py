"""Pre-training instances with google-research/bert semantics, written as TFRecords.

Per document, sentences are packed into segments A and B up to `max_seq_length - 3`
tokens (sometimes shorter, `short_seq_prob`); half the time B is the real continuation
(label 0), half the time it comes from another document (label 1) and the unused
sentences go back to be used later. Unlike google's script, a chunk of a single sentence
is not forced to be a random pair (that skews labels to ~55% random): its actual next
sentence is used, or at the end of a document the sentence is cut into A and B. The pair is truncated from a random end, then
`[CLS] A [SEP] B [SEP]` is masked: 15% of tokens (`masked_lm_prob`, at most
`max_predictions_per_seq`; whole words with `whole_word_masking`), of which 80% become
[MASK], 10% a random token, 10% stay. `dupe_factor` repeats this with fresh randomness.

Feature names, dtypes and shapes are exactly google's (`feature_spec`), so files made by
either tool are interchangeable. Randomness is per document (seed, pass, the document's name),
with separate streams for segment structure, partner documents and masking, so the
instances of a document do not depend on which process handles it (documents are named by
file and byte offset): N ranks together write the same instances as one process, except the
random-next pairs, whose B segment comes from the rank's current window of documents (and with it
their truncation and masks).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import random

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError, sha256  # noqa: F401  (pretraining_data.sha256: the shards' checksums)


def feature_spec(max_seq_length, max_predictions_per_seq, pack=0):
    """google-research/bert's parse spec for pre-training TFRecords; with `pack` (up to that many
    instances per row, `pack_instances`) the packed layout: next_sentence_labels [pack] and the
    features that keep the instances apart (PACKED_FEATURES)."""
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
        spec.update({
            "position_ids": tf.io.FixedLenFeature([L], tf.int64),
            "instance_ids": tf.io.FixedLenFeature([L], tf.int64),
            "next_sentence_positions": tf.io.FixedLenFeature([pack], tf.int64),
            "next_sentence_weights": tf.io.FixedLenFeature([pack], tf.float32),
        })
    return spec


# A packed row's extra features: each token's position within its instance, its instance (1, 2, ...;
# 0 is padding), and per instance slot the [CLS] position and whether the slot holds an instance.
PACKED_FEATURES = ("position_ids", "instance_ids", "next_sentence_positions", "next_sentence_weights")


@dataclasses.dataclass
class InstanceConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    whole_word_masking: bool = False
    random_seed: int = 12345
    mask: bool = True            # False: unmasked sequences for dynamic masking in tf.data
    full_sentences: bool = False  # RoBERTa's FULL-SENTENCES (pack_full_sentences): no A/B pairs, for MLM only
    pack: int = 0                # >= 2: up to this many sentence-pair instances per row (pack_instances)

    def __post_init__(self):
        if self.max_seq_length < 5:
            raise ConfigError(f"--max_seq_length={self.max_seq_length} is too small for "
                              f"[CLS] A [SEP] B [SEP] (needs at least 5: 3 special tokens and 1 token each for A and B)")
        if self.mask and self.max_predictions_per_seq < 1:
            raise ConfigError(f"--max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ConfigError(f"--masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe_factor must be >= 1, got {self.dupe_factor}")
        if self.pack < 0 or self.pack == 1:
            raise ConfigError(f"--pack must be 0 (one instance per row) or >= 2 (instances per row), got {self.pack}")
        if self.pack and self.full_sentences:
            raise ConfigError("--pack with --full_sentences: FULL-SENTENCES rows are already full (no padding to fill)")


@dataclasses.dataclass
class Counts:
    instances: int = 0
    rows: int = 0                  # records written (with --pack, several instances each)
    tokens: int = 0                # non-padding tokens in instances (with [CLS]/[SEP])
    masked: int = 0
    maskable: int = 0              # tokens other than [CLS]/[SEP]
    replaced_mask: int = 0
    replaced_random: int = 0
    kept: int = 0
    random_next: int = 0
    clamped: int = 0               # instances whose 15% exceeded max_predictions_per_seq


# Documents a rank holds at a time (tokenised, with their instances): bounds memory; random-next
# partners are drawn from the same window, as google draws them from all documents of a run.
DOCUMENT_WINDOW = 2000

# What de-duplication left out (bert_tf.data.dedup), per part, rank and in total.
DEDUP_COUNTS = ("duplicate_documents", "documents_emptied", "repeated_lines_removed")

Instance = collections.namedtuple("Instance", "tokens segment_ids is_random_next positions labels")


_STREAMS = {"structure": 0, "partner": 1, "mask": 2, "heldout": 3, "pack": 4}


def _rng(seed, dupe, doc_id, stream, chunk=0):
    """A random.Random determined by (seed, pass, document, stream, chunk) only: same in every process."""
    state = np.random.SeedSequence([seed, dupe, doc_id, _STREAMS[stream], chunk]).generate_state(2)
    return random.Random(int(state[0]) << 32 | int(state[1]))


def create_instances(doc_index, documents, config: InstanceConfig, special, vocab_size, word_starts=None,
                     dupe=0, doc_id=None, counts: Counts | None = None):
    """Instances from documents[doc_index] (a list of token-id lists) for one dupe pass.

    `documents` is the pool partner segments are drawn from; `doc_id` (default doc_index)
    is the document's corpus-wide number, which seeds its randomness; `special` maps
    CLS/SEP/MASK to ids; `word_starts[id]` is False for "##" pieces (whole-word masking).
    """
    counts = counts if counts is not None else Counts()
    doc_id = doc_index if doc_id is None else doc_id
    rng = _rng(config.random_seed, dupe, doc_id, "structure")
    rng_partner = _rng(config.random_seed, dupe, doc_id, "partner")
    document = documents[doc_index]
    max_num_tokens = config.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk, chunk_len, i, chunk_index = [], 0, 0, 0
    while i < len(document):
        chunk.append(document[i])
        chunk_len += len(document[i])
        if i == len(document) - 1 or chunk_len >= target_seq_length:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                is_random_next = rng.random() < 0.5 and len(documents) > 1
                if not is_random_next and len(chunk) == 1:
                    # google makes every one-sentence chunk a random pair, which skews the
                    # labels above 50%: continue with the actual next sentence, or at the end
                    # of the document cut the sentence itself into A and its continuation B.
                    if i + 1 < len(document):
                        i += 1
                        chunk.append(document[i])
                    elif len(chunk[0]) >= 2:
                        cut = rng.randint(1, len(chunk[0]) - 1)
                        chunk = [chunk[0][:cut], chunk[0][cut:]]
                    else:
                        is_random_next = len(documents) > 1
                tokens_a = [t for seg in chunk[:a_end] for t in seg]
                if is_random_next:
                    target_b_length = target_seq_length - len(tokens_a)
                    other = doc_index
                    for _ in range(10):
                        other = rng_partner.randrange(len(documents))
                        if other != doc_index:
                            break
                    other_doc = documents[other]
                    start = rng_partner.randrange(len(other_doc)) if other_doc else 0
                    tokens_b = []
                    for seg in other_doc[start:]:
                        tokens_b.extend(seg)
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(chunk) - a_end           # put the unused sentences back
                else:
                    tokens_b = [t for seg in chunk[a_end:] for t in seg]
                # truncation and masking draw from a stream of their own per chunk: a random partner
                # (drawn from this rank's documents) changes only its own instance, not the next ones
                rng_mask = _rng(config.random_seed, dupe, doc_id, "mask", chunk_index)
                chunk_index += 1
                _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng_mask)
                if tokens_a and tokens_b:
                    tokens = [special["CLS"]] + tokens_a + [special["SEP"]] + tokens_b + [special["SEP"]]
                    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                    positions, labels = ([], [])
                    if config.mask:
                        positions, labels = mask_tokens(tokens, config, special, vocab_size, rng_mask,
                                                        word_starts, counts)
                    counts.instances += 1
                    counts.tokens += len(tokens)
                    counts.random_next += int(is_random_next)
                    instances.append(Instance(tokens, segment_ids, is_random_next, positions, labels))
            chunk, chunk_len = [], 0
        i += 1
    return instances


def pack_full_sentences(members, state, config: InstanceConfig, special, vocab_size, word_starts=None, dupe=0,
                        counts: Counts | None = None, flush=False):
    """RoBERTa's FULL-SENTENCES instances (Liu et al. 2019, section 4.2): [CLS], then whole consecutive
    sentences up to max_seq_length - 2 tokens, running on across document boundaries with a [SEP] between
    documents, then [SEP]; one segment, no next-sentence pairing (is_random_next is always False, the
    records' next_sentence_labels 0: pre-train them with --mlm_only). A sentence longer than a whole
    sequence is cut to fit.

    members: [(document seed, token-id lists)] in corpus order; `state` (a dict, empty at first) carries
    the unfinished sequence into the next call, so windows pack as one stream; flush: end the stream.
    Masking draws from the stream of the sequence's first document and its number among that document's
    sequences, so the instances do not depend on the window size."""
    counts = counts if counts is not None else Counts()
    limit = config.max_seq_length - 2
    body = state.setdefault("body", [])
    instances = []

    def emit():
        rng_mask = _rng(config.random_seed, dupe, state["seed"], "mask", state["chunk"])
        state["chunk"] += 1
        tokens = [special["CLS"]] + body + [special["SEP"]]
        positions, labels = ([], [])
        if config.mask:
            positions, labels = mask_tokens(tokens, config, special, vocab_size, rng_mask, word_starts, counts)
        counts.instances += 1
        counts.tokens += len(tokens)
        instances.append(Instance(tokens, [0] * len(tokens), False, positions, labels))
        body.clear()

    for seed, document in members:
        if body:                                   # a document boundary inside a sequence
            if len(body) + 2 > limit:
                emit()
            else:
                body.append(special["SEP"])
        for sentence in document:
            if not sentence:
                continue
            if body and len(body) + len(sentence) > limit:
                emit()
            if not body and state.get("seed") != seed:
                state["seed"], state["chunk"] = seed, 0
            body.extend(sentence[:limit - len(body)])
    if flush and body:
        emit()
    return instances


def _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """google's truncation (a token off the front or back of the longer segment, at random, until the pair
    fits), counted on indices and cut once: linear in the length, where deleting from a list's front
    one token at a time took minutes for a document that is one enormous sentence."""
    ends = [[0, len(tokens_a)], [0, len(tokens_b)]]
    while (ends[0][1] - ends[0][0]) + (ends[1][1] - ends[1][0]) > max_num_tokens:
        longer = ends[0] if ends[0][1] - ends[0][0] > ends[1][1] - ends[1][0] else ends[1]
        if rng.random() < 0.5:
            longer[0] += 1
        else:
            longer[1] -= 1
    for tokens, (start, end) in zip((tokens_a, tokens_b), ends):
        del tokens[end:]
        del tokens[:start]


def mask_tokens(tokens, config, special, vocab_size, rng, word_starts=None, counts: Counts | None = None):
    """Masks `tokens` in place. Returns (positions, original ids), sorted by position."""
    counts = counts if counts is not None else Counts()
    skip = (special["CLS"], special["SEP"])
    reserved = set(special.values()) | {0}
    groups = []
    for i, t in enumerate(tokens):
        if t in skip:
            continue
        if config.whole_word_masking and groups and word_starts is not None and not word_starts[t] \
                and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    maskable = sum(len(g) for g in groups)
    counts.maskable += maskable
    wanted = max(1, int(round(maskable * config.masked_lm_prob)))
    num_to_predict = min(config.max_predictions_per_seq, wanted)
    counts.clamped += int(wanted > config.max_predictions_per_seq)
    rng.shuffle(groups)
    chosen = []
    for group in groups:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(group) > num_to_predict:
            continue
        chosen.extend(group)
    labels = {}
    for pos in chosen:
        labels[pos] = tokens[pos]
        r = rng.random()
        if r < 0.8:
            tokens[pos] = special["MASK"]
            counts.replaced_mask += 1
        elif r < 0.9:
            counts.kept += 1
        else:
            token = rng.randrange(vocab_size)
            while token in reserved:              # a random *word*: never [CLS], [SEP], [MASK], [PAD]
                token = rng.randrange(vocab_size)
            tokens[pos] = token
            counts.replaced_random += 1
    counts.masked += len(chosen)
    positions = sorted(labels)
    return positions, [labels[p] for p in positions]


def pack_instances(instances, config: InstanceConfig, rng=None):
    """Rows of up to config.pack instances, each row at most max_seq_length tokens and
    max_predictions_per_seq masked positions: best-fit decreasing (longest instance first, into the
    open row it fills most tightly). Short instances fill the padding of others (Krell et al. 2021,
    "Efficient Sequence Packing without Cross-contamination", arXiv 2107.02027); the attention mask
    `instance_ids` keeps them apart. Returns a list of rows (lists of instances), shuffled by `rng`
    so that row length does not follow file order."""
    L, P = config.max_seq_length, config.max_predictions_per_seq
    order = sorted(range(len(instances)), key=lambda i: -len(instances[i].tokens))
    rows, free = [], [[] for _ in range(L + 1)]      # free[s]: open rows with exactly s tokens free
    for i in order:
        inst = instances[i]
        n, k = len(inst.tokens), len(inst.positions)
        placed = None
        for space in range(n, L + 1):
            for j in range(len(free[space]) - 1, -1, -1):
                r = free[space][j]
                if sum(len(x.positions) for x in rows[r]) + k <= P:
                    placed = free[space].pop(j)
                    break
            if placed is not None:
                break
        if placed is None:
            placed, space = len(rows), L
            rows.append([])
        rows[placed].append(inst)
        if len(rows[placed]) < config.pack and space - n > 0:
            free[space - n].append(placed)
    if rng is not None:
        rng.shuffle(rows)
    return rows


def _int64(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def serialize(instance: Instance, config: InstanceConfig) -> bytes:
    """One tf.train.Example in google's layout (padded to max lengths)."""
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
        features["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (P - k)))
    # deterministic: map fields in key order, so the same instance gives the same bytes in every process
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(deterministic=True)


def serialize_packed(row, config: InstanceConfig) -> bytes:
    """One packed row (`pack_instances`) as a tf.train.Example: the instances one after the other, each
    with its own positions 0, 1, ... and instance id, masked positions shifted to the row."""
    L, P, K = config.max_seq_length, config.max_predictions_per_seq, config.pack
    tokens, segments, positions, instance_ids, mlm_positions, mlm_ids, cls_positions, labels = ([] for _ in range(8))
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
        raise ValueError(f"a packed row of {m} instances has {n} tokens and {k} predictions (limits {L}, {P}, {K})")
    features = {
        "input_ids": _int64(tokens + [0] * (L - n)),
        "input_mask": _int64([1] * n + [0] * (L - n)),
        "segment_ids": _int64(segments + [0] * (L - n)),
        "position_ids": _int64(positions + [0] * (L - n)),
        "instance_ids": _int64(instance_ids + [0] * (L - n)),
        "next_sentence_positions": _int64(cls_positions + [0] * (K - m)),
        "next_sentence_labels": _int64(labels + [0] * (K - m)),
        "next_sentence_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * m + [0.0] * (K - m))),
    }
    if config.mask:
        features["masked_lm_positions"] = _int64(mlm_positions + [0] * (P - k))
        features["masked_lm_ids"] = _int64(mlm_ids + [0] * (P - k))
        features["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (P - k)))
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(deterministic=True)


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


def fingerprint(input_files, input_format, tokenizer, config, size, num_shards, heldout_fraction, window,
                text_field="text", title_field="", dedup_documents=False, dedup_lines=0):
    """What a shard's content depends on: a completed shard is reused only when all of it is unchanged."""
    import hashlib

    from bert_tf.data import corpus
    inputs = []
    for spec in input_files:
        path = spec.partition("@")[0]
        files = corpus.arrow_folder_files(path) if os.path.isdir(path) else [path]   # a save_to_disk folder
        inputs.append([spec, *[(os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]])
    key = {"inputs": inputs, "format": input_format, "config": dataclasses.asdict(config), "ranks": size,
           "shards_per_rank": num_shards, "heldout_fraction": heldout_fraction, "window": window, "text_field": text_field,
           "title_field": title_field, "dedup_documents": dedup_documents, "dedup_lines": dedup_lines,
           "vocab": hashlib.sha256("\n".join(tokenizer.vocab).encode()).hexdigest(),
           "lower_case": tokenizer.lower_case}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def read_completed(part_path, key):
    """The part's summary when it says the part is complete for `key` and its files are intact."""
    try:
        with open(part_path) as f:
            part = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    if part.get("fingerprint") != key:
        return None
    for path, digest in part["sha256"].items():
        if not os.path.exists(path) or sha256(path) != digest:
            return None
    return part


def split_heldout(num_documents, heldout_fraction, seed):
    """Deterministic split of a list of documents (run/learn_vocab.py): a boolean mask, True = held out."""
    rng = np.random.RandomState(seed)
    return rng.random_sample(num_documents) < heldout_fraction


def document_seed(key):
    """An int naming a document by (file index, offset), the same whatever the rank count."""
    file_index, offset = key
    return file_index << 64 | offset


def is_heldout(doc_seed, heldout_fraction, seed):
    """Document-level held-out split, seeded per document (independent of the rank count)."""
    return heldout_fraction > 0 and _rng(seed, 0, doc_seed, "heldout").random() < heldout_fraction


def _windows(documents, size):
    window = []
    for item in documents:
        window.append(item)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def create_pretraining_data(input_files, input_format, tokenizer, output_dir, config: InstanceConfig,
                            rank=0, size=1, num_shards=1, heldout_fraction=0.0, window=DOCUMENT_WINDOW,
                            text_field="text", title_field="", dedup_documents=False, dedup_lines=0, comm=None,
                            log=print):
    """Reads, tokenises and writes this rank's share of the corpus, in bounded memory; restartable.

    The corpus is cut by bytes into size x num_shards parts (`corpus.plan_shares`); rank r makes
    parts r*num_shards ... (r+1)*num_shards-1, each into `train-r<rank>-<i>-of-<n>.tfrecord` (and
    `eval-...` for held-out documents) plus `part-r<rank>-<i>-of-<n>.json`, its summary with the
    shards' SHA-256, written last. Run again with the same arguments, a part whose summary,
    arguments and checksums match is skipped; any other part is made again from its start.

    A part reads only the documents that begin in its byte ranges and handles them `window`
    documents at a time: tokenised together, instances made (random partners drawn from the same
    window) and written before the next window is read, so memory does not grow with the corpus.
    A document's randomness and held-out membership follow from its file and byte offset, so for
    a seed the output is deterministic, and the instances whose B segment is the real
    continuation are the same for every rank count (random-next partners depend on the window).

    With `dedup_documents` or `dedup_lines`, all ranks first agree over `comm` (collective: every
    rank calls this) which documents are later copies and which lines repeat `dedup_lines` times or
    more (`bert_tf.data.dedup`), and those are left out before the held-out split.
    Returns this rank's summary dict.
    """
    import time
    from bert_tf.data import corpus

    start = time.time()
    if dedup_lines < 0 or dedup_lines == 1:
        raise ConfigError(f"--dedup_lines={dedup_lines} would remove every line" if dedup_lines == 1 else
                          f"--dedup_lines must be 0 (off) or >= 2, got {dedup_lines}")
    os.makedirs(output_dir, exist_ok=True)
    parts = corpus.plan_shares(input_files, size * num_shards, input_format, text_field, title_field)
    key = fingerprint(input_files, input_format, tokenizer, config, size, num_shards, heldout_fraction, window,
                      text_field, title_field, dedup_documents, dedup_lines)
    summary = {"rank": rank, "shares": [], "documents": 0, "sentences": 0, "tokens": 0, "unk": 0,
               "bad_bytes_lines": 0, "bytes_read": 0, "skipped_pages": 0, "problems": [], "files": {},
               "parts_reused": 0, **{k: 0 for k in DEDUP_COUNTS}}
    decisions = None
    if dedup_documents or dedup_lines:
        from bert_tf.data import dedup
        t = time.time()
        mine = [sh for i in range(num_shards) for sh in parts[rank * num_shards + i]]
        decisions = dedup.decide(corpus.read_share(mine, corpus.ReadStats()), comm, dedup_documents, dedup_lines)
        summary["dedup_seconds"] = time.time() - t
        summary["distinct_repeated_lines"] = len(decisions.repeated_lines)
    counts = {}
    for i in range(num_shards):
        name = f"r{rank:03d}-{i:04d}-of-{num_shards:04d}"
        part_path = os.path.join(output_dir, f"part-{name}.json")
        part = read_completed(part_path, key)
        if part is not None:
            summary["parts_reused"] += 1
            log(f"rank {rank}: part {name} complete (summary and checksums match), skipped")
        else:
            part = _create_part(parts[rank * num_shards + i], tokenizer, output_dir, name, config,
                                heldout_fraction, window, decisions)
            part["fingerprint"] = key
            part["sha256"] = {path: sha256(path) for path in part["files"].values()}
            tmp = part_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(part, f, indent=1)
            os.replace(tmp, part_path)                     # the part counts as done only now
        for k in ("documents", "sentences", "tokens", "unk", "bad_bytes_lines", "bytes_read", "skipped_pages",
                  *DEDUP_COUNTS):
            summary[k] += part.get(k, 0)
        summary["shares"] += part["shares"]
        summary["problems"] += part["problems"]
        for split, path in part["files"].items():
            summary["files"].setdefault(split, []).append(path)
            c = counts.setdefault(split, Counts())
            for field, value in part[split].items():
                setattr(c, field, getattr(c, field) + value)
    for split, c in counts.items():
        summary[split] = dataclasses.asdict(c)
    summary["unk_rate"] = summary.pop("unk") / max(summary["tokens"], 1)
    summary["seconds"] = time.time() - start
    if not summary["documents"] and size == 1:
        raise ConfigError(f"no text found in {', '.join(input_files)} (empty corpus?)")
    if not summary["documents"]:   # with several ranks, an error only if no rank found any (the caller's check)
        summary["problems"].append(f"rank {rank}: no document begins in its share "
                                   f"({'more ranks than documents' if summary['shares'] else 'no bytes assigned'})")
    return summary


def _create_part(shares, tokenizer, output_dir, name, config, heldout_fraction, window, decisions=None):
    """One part: the documents beginning in `shares` -> train/eval shards named by `name`."""
    from bert_tf.data import corpus

    stats = corpus.ReadStats()
    special = {"CLS": tokenizer.cls_id, "SEP": tokenizer.sep_id, "MASK": tokenizer.mask_id}
    word_starts = [not t.startswith("##") for t in tokenizer.vocab]
    part = {"shares": [[sh.path, sh.start, sh.end] for sh in shares], "documents": 0, "sentences": 0,
            "tokens": 0, "unk": 0, "files": {}, **{k: 0 for k in DEDUP_COUNTS}}

    def kept(documents):
        for key, doc in documents:
            if decisions is not None:
                doc, why, removed = decisions.apply(key, doc)
                part["repeated_lines_removed"] += removed
                if why:
                    part["duplicate_documents" if why == "duplicate" else "documents_emptied"] += 1
                    continue
            yield key, doc
    counts = {"train": Counts(), "eval": Counts()}
    writers = {}
    running = {}               # full_sentences: (split, dupe) -> the sequence that runs into the next window

    def write(split, records):
        for record in records:
            writers[split].write(record)
            counts[split].rows += 1

    def write_full_sentences(split, members, dupe, flush=False):
        write(split, (serialize(inst, config) for inst in pack_full_sentences(
            members, running.setdefault((split, dupe), {}), config, special, len(tokenizer), word_starts, dupe,
            counts[split], flush)))

    try:
        for docs in _windows(kept(corpus.read_share(shares, stats)), window):
            # tokenise the window's sentences in one batch, then regroup by document
            flat = tokenizer.tokenize([s for _, d in docs for s in d])
            pools, k = {"train": [], "eval": []}, 0
            for key, d in docs:
                tokens = [t for t in flat[k:k + len(d)] if t]
                k += len(d)
                part["documents"] += 1
                part["sentences"] += len(d)
                part["tokens"] += sum(len(t) for t in tokens)
                part["unk"] += sum(t.count(tokenizer.unk_id) for t in tokens)
                seed = document_seed(key)
                pools["eval" if is_heldout(seed, heldout_fraction, config.random_seed) else "train"].append(
                    (seed, tokens))
            for split, members in pools.items():
                if not members:
                    continue
                if split not in writers:
                    writers[split] = ShardWriter(os.path.join(output_dir, f"{split}-{name}.tfrecord"))
                pool = [tokens for _, tokens in members]
                for dupe in range(config.dupe_factor):
                    if config.full_sentences:
                        write_full_sentences(split, members, dupe)
                        continue
                    instances = [inst for j, (seed, _) in enumerate(members)
                                 for inst in create_instances(j, pool, config, special, len(tokenizer), word_starts,
                                                              dupe=dupe, doc_id=seed, counts=counts[split])]
                    if config.pack:    # a window's instances packed together; rows shuffled per window and pass
                        rows = pack_instances(instances, config, _rng(config.random_seed, dupe, members[0][0], "pack"))
                        write(split, (serialize_packed(row, config) for row in rows))
                    else:
                        write(split, (serialize(inst, config) for inst in instances))
        for split, dupe in sorted(running):
            write_full_sentences(split, [], dupe, flush=True)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    for split, writer in writers.items():
        part["files"][split] = writer.close()
        part[split] = dataclasses.asdict(counts[split])
    part.update(bad_bytes_lines=stats.bad_bytes_lines, bytes_read=stats.bytes_read,
                skipped_pages=stats.skipped_pages, problems=stats.problems)
    return part


def summarize(summaries, max_seq_length=None):
    """Totals over ranks and the derived rates printed at the end of creation (with max_seq_length, the
    fraction of the rows' token slots that is padding)."""
    total = {k: sum(s.get(k, 0) for s in summaries)
             for k in ("documents", "sentences", "tokens", "bad_bytes_lines", *DEDUP_COUNTS)}
    if "distinct_repeated_lines" in summaries[0]:
        total["distinct_repeated_lines"] = summaries[0]["distinct_repeated_lines"]   # the same set on every rank
    total["unk_rate"] = sum(s["unk_rate"] * s["tokens"] for s in summaries) / max(total["tokens"], 1)
    total["seconds"] = max(s["seconds"] for s in summaries)
    for split in ("train", "eval"):
        parts = [s[split] for s in summaries if split in s]
        if not parts:
            continue
        c = {k: sum(p[k] for p in parts) for k in parts[0]}
        c["mean_masked_fraction"] = c["masked"] / max(c["maskable"], 1)
        c["nsp_random_fraction"] = c["random_next"] / max(c["instances"], 1)
        c["instances_per_row"] = c["instances"] / max(c["rows"], 1)
        if max_seq_length:
            c["padding_fraction"] = 1 - c["tokens"] / max(c["rows"] * max_seq_length, 1)
        c["instances_per_second"] = c["instances"] / max(total["seconds"], 1e-9)
        total[split] = c
    total["per_rank_instances_per_second"] = [
        sum(s[k]["instances"] for k in ("train", "eval") if k in s) / max(s["seconds"], 1e-9) for s in summaries]
    return total
