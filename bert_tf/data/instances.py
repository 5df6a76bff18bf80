"""Pre-training instances with google-research/bert semantics.

Per document, sentences are packed into segments A and B up to `max_seq_length - 3`
tokens (sometimes shorter, `short_seq_prob`); half the time B is the real continuation
(label 0), half the time it comes from another document (label 1) and the unused
sentences go back to be used later. Unlike google's script, a chunk of a single sentence
is not forced to be a random pair (that skews labels to ~55% random): its actual next
sentence is used, or at the end of a document the sentence is cut into A and B. The pair is
truncated from a random end, then
`[CLS] A [SEP] B [SEP]` is masked: 15% of tokens (`masked_lm_prob`, at most
`max_predictions_per_seq`; whole words with `whole_word_masking`), of which 80% become
[MASK], 10% a random token, 10% stay. `dupe_factor` repeats this with fresh randomness.

Randomness is per document (seed, pass, the document's name: `document_rng`), with separate streams
for segment structure, partner documents and masking, so the instances of a document do not depend
on which process handles it; only a random-next pair's B segment depends on the pool of documents it
is drawn from (and with it that pair's truncation and masks).
"""

from __future__ import annotations

import collections
import dataclasses
import random

import numpy as np

from bert_tf import ConfigError


@dataclasses.dataclass
class InstanceConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    whole_word_masking: bool = False
    random_seed: int = 12345
    mask: bool = True  # False: unmasked sequences for dynamic masking in tf.data
    full_sentences: bool = (
        False  # RoBERTa's FULL-SENTENCES (pack_full_sentences): no A/B pairs, for MLM only
    )
    pack: int = 0  # >= 2: up to this many sentence-pair instances per row (pack_instances)
    fill_rows: bool = False  # with full_sentences: rows cut from the stream, no padding

    def __post_init__(self):
        if self.max_seq_length < 5:
            raise ConfigError(
                f"--max_seq_length={self.max_seq_length} is too small for [CLS] A [SEP] B [SEP] "
                "(needs at least 5: 3 special tokens and 1 token each for A and B)"
            )
        if self.mask and self.max_predictions_per_seq < 1:
            raise ConfigError(
                f"--max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}"
            )
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ConfigError(f"--masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe_factor must be >= 1, got {self.dupe_factor}")
        if self.pack < 0 or self.pack == 1:
            raise ConfigError(
                "--pack must be 0 (one instance per row) or >= 2 (instances per row), got "
                f"{self.pack}"
            )
        if self.fill_rows and not self.full_sentences:
            raise ConfigError(
                "--fill_rows needs --full_sentences: it fills FULL-SENTENCES rows to the end"
            )
        if self.pack and self.full_sentences:
            raise ConfigError(
                "--pack with --full_sentences: a FULL-SENTENCES row is filled up to the first "
                "sentence that does not fit, and packing cannot put whole instances into its end"
            )


@dataclasses.dataclass
class Counts:
    instances: int = 0
    rows: int = 0  # records written (with --pack, several instances each)
    tokens: int = 0  # non-padding tokens in instances (with [CLS]/[SEP])
    masked: int = 0
    maskable: int = 0  # tokens other than [CLS]/[SEP]
    replaced_mask: int = 0
    replaced_random: int = 0
    kept: int = 0
    random_next: int = 0
    clamped: int = 0  # instances whose 15% exceeded max_predictions_per_seq


Instance = collections.namedtuple("Instance", "tokens segment_ids is_random_next positions labels")

_STREAMS = {"structure": 0, "partner": 1, "mask": 2, "heldout": 3, "pack": 4}


def document_rng(seed, dupe, doc_id, stream, chunk=0):
    """A random.Random determined by (seed, pass, document, stream, chunk) only: same in every
    process."""
    state = np.random.SeedSequence([seed, dupe, doc_id, _STREAMS[stream], chunk]).generate_state(2)
    return random.Random(int(state[0]) << 32 | int(state[1]))


def create_instances(
    doc_index,
    documents,
    config: InstanceConfig,
    special,
    vocab_size,
    word_starts=None,
    dupe=0,
    doc_id=None,
    counts: Counts | None = None,
):
    """Instances from documents[doc_index] (a list of token-id lists) for one dupe pass.

    `documents` is the pool partner segments are drawn from; `doc_id` (default doc_index)
    is the document's corpus-wide number, which seeds its randomness; `special` maps
    CLS/SEP/MASK to ids; `word_starts[id]` is False for "##" pieces (whole-word masking).
    """
    counts = counts if counts is not None else Counts()
    doc_id = doc_index if doc_id is None else doc_id
    rng = document_rng(config.random_seed, dupe, doc_id, "structure")
    rng_partner = document_rng(config.random_seed, dupe, doc_id, "partner")
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
                tokens_a, tokens_b, is_random_next, i = _segments(
                    doc_index, documents, chunk, i, target_seq_length, rng, rng_partner
                )
                # truncation and masking draw from a stream of their own per chunk: a random partner
                # (drawn from this rank's documents) changes only its own instance, not the next
                # ones
                rng_mask = document_rng(config.random_seed, dupe, doc_id, "mask", chunk_index)
                chunk_index += 1
                instance = _pair_instance(
                    tokens_a,
                    tokens_b,
                    is_random_next,
                    config,
                    special,
                    vocab_size,
                    rng_mask,
                    word_starts,
                    counts,
                )
                if instance is not None:
                    instances.append(instance)
            chunk, chunk_len = [], 0
        i += 1
    return instances


def _segments(doc_index, documents, chunk, i, target_seq_length, rng, rng_partner):
    """(tokens A, tokens B, is_random_next, i) for the chunk of sentences that ends at sentence i of
    documents[doc_index]; the returned i is past a sentence taken in as B, or back before the
    sentences a random B leaves unused."""
    document = documents[doc_index]
    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
    is_random_next = rng.random() < 0.5 and len(documents) > 1
    if not is_random_next and len(chunk) == 1:
        # google makes every one-sentence chunk a random pair, which skews the
        # labels above 50%: continue with the actual next sentence, or at the end
        # of the document cut the sentence itself into A and its continuation B.
        if i + 1 < len(document):
            i += 1
            chunk = chunk + [document[i]]
        elif len(chunk[0]) >= 2:
            cut = rng.randint(1, len(chunk[0]) - 1)
            chunk = [chunk[0][:cut], chunk[0][cut:]]
        else:
            is_random_next = len(documents) > 1
    tokens_a = [t for seg in chunk[:a_end] for t in seg]
    if not is_random_next:
        return tokens_a, [t for seg in chunk[a_end:] for t in seg], False, i
    tokens_b = _random_segment(doc_index, documents, target_seq_length - len(tokens_a), rng_partner)
    return tokens_a, tokens_b, True, i - (len(chunk) - a_end)  # put the unused sentences back


def _random_segment(doc_index, documents, target_b_length, rng_partner):
    """A random next segment: sentences from a random start in another document, up to the
    length."""
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
    return tokens_b


def _pair_instance(
    tokens_a, tokens_b, is_random_next, config, special, vocab_size, rng_mask, word_starts, counts
):
    """[CLS] A [SEP] B [SEP], truncated and masked; None when truncation leaves a segment empty."""
    _truncate_pair(tokens_a, tokens_b, config.max_seq_length - 3, rng_mask)
    if not (tokens_a and tokens_b):
        return None
    tokens = [special["CLS"]] + tokens_a + [special["SEP"]] + tokens_b + [special["SEP"]]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    counts.random_next += int(is_random_next)
    return _instance(
        tokens,
        segment_ids,
        is_random_next,
        config,
        special,
        vocab_size,
        rng_mask,
        word_starts,
        counts,
    )


def _instance(
    tokens, segment_ids, is_random_next, config, special, vocab_size, rng_mask, word_starts, counts
):
    """An Instance of `tokens`, masked (config.mask) with rng_mask, and counted."""
    positions, labels = ([], [])
    if config.mask:
        positions, labels = mask_tokens(
            tokens, config, special, vocab_size, rng_mask, word_starts, counts
        )
    counts.instances += 1
    counts.tokens += len(tokens)
    return Instance(tokens, segment_ids, is_random_next, positions, labels)


def pack_full_sentences(
    members,
    state,
    config: InstanceConfig,
    special,
    vocab_size,
    word_starts=None,
    dupe=0,
    counts: Counts | None = None,
    flush=False,
):
    """RoBERTa's FULL-SENTENCES instances (Liu et al. 2019, section 4.2): [CLS], then whole
    consecutive sentences up to max_seq_length - 2 tokens, running on across document boundaries
    with a [SEP] between documents, then [SEP]; one segment, no next-sentence pairing
    (is_random_next is always False, the records' next_sentence_labels 0: pre-train them with
    --mlm_only). A sentence longer than a whole sequence is cut to fit. config.fill_rows fills every
    sequence: the sentence that does not fit is cut, its rest begins the next one (the corpus as one
    stream cut into rows, as ModernBERT trains; whole sentences pad ~14% of a Wikipedia row).

    members: [(document seed, token-id lists)] in corpus order; `state` (a dict, empty at first)
    carries the unfinished sequence into the next call, so windows pack as one stream; flush: end
    the stream. Masking draws from the stream of the sequence's first document and its number among
    that document's sequences, so the instances do not depend on the window size."""
    counts = counts if counts is not None else Counts()
    limit = config.max_seq_length - 2
    body = state.setdefault("body", [])
    instances: list = []

    def emit():
        instances.append(
            _full_sentence_instance(state, config, special, vocab_size, word_starts, dupe, counts)
        )

    def start(seed):
        if not body and state.get("seed") != seed:
            state["seed"], state["chunk"] = seed, 0

    for seed, document in members:
        if body:  # a document boundary inside a sequence
            if len(body) + (1 if config.fill_rows else 2) > limit:
                emit()
            else:
                body.append(special["SEP"])
        for sentence in filter(None, document):
            if not config.fill_rows:
                if body and len(body) + len(sentence) > limit:
                    emit()
                start(seed)
                body.extend(sentence[: limit - len(body)])
                continue
            while sentence:
                start(seed)
                room = limit - len(body)
                body.extend(sentence[:room])
                sentence = sentence[room:]
                if len(body) == limit:
                    emit()
    if flush and body:
        emit()
    return instances


def _full_sentence_instance(state, config, special, vocab_size, word_starts, dupe, counts):
    """The sequence in state["body"] as an Instance (masked with its document's stream), the body
    emptied."""
    body = state["body"]
    rng_mask = document_rng(config.random_seed, dupe, state["seed"], "mask", state["chunk"])
    state["chunk"] += 1
    tokens = [special["CLS"]] + body + [special["SEP"]]
    body.clear()
    return _instance(
        tokens, [0] * len(tokens), False, config, special, vocab_size, rng_mask, word_starts, counts
    )


def _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """google's truncation (a token off the front or back of the longer segment, at random, until
    the pair fits), counted on indices and cut once: linear in the length, where deleting from a
    list's front one token at a time took minutes for a document that is one enormous sentence."""
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


def mask_tokens(
    tokens, config, special, vocab_size, rng, word_starts=None, counts: Counts | None = None
):
    """Masks `tokens` in place. Returns (positions, original ids), sorted by position."""
    counts = counts if counts is not None else Counts()
    skip = (special["CLS"], special["SEP"])
    reserved = set(special.values()) | {0}
    groups = []
    for i, t in enumerate(tokens):
        if t in skip:
            continue
        if (
            config.whole_word_masking
            and groups
            and word_starts is not None
            and not word_starts[t]
            and groups[-1][-1] == i - 1
        ):
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
            while token in reserved:  # a random *word*: never [CLS], [SEP], [MASK], [PAD]
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
    rows: list[list] = []
    free: list[list[int]] = [
        [] for _ in range(L + 1)
    ]  # free[s]: open rows with exactly s tokens free
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
