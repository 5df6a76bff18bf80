"""WordPiece vocabulary (learn, load, write) and tokenisation with tensorflow-text.

Vocabulary layout follows google-research/bert's `vocab.txt`: [PAD] at 0, [unused0..98]
at 1..99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then word pieces. Tokenisation is
tensorflow-text's FastBertTokenizer with google's basic-tokeniser behaviour: lower-casing,
NFD accent stripping, splitting on punctuation and around CJK characters, then greedy
longest-match WordPiece with "##" continuations and [UNK] for words it cannot cover.
"""
from __future__ import annotations

import os
import time

import tensorflow as tf
import tensorflow_text as text

from bert_tf import ConfigError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def google_reserved_tokens(num_unused=99):
    return ["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def learn_vocab(sentences, vocab_size, lower_case=True, num_unused=99, batch_size=1024):
    """Learns a WordPiece vocabulary (list of tokens) from an iterable of sentences."""
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as learner

    reserved = google_reserved_tokens(num_unused)
    if vocab_size <= len(reserved) + 100:
        raise ConfigError(f"--vocab_size={vocab_size} leaves no room for word pieces after "
                          f"{len(reserved)} reserved tokens")
    dataset = tf.data.Dataset.from_generator(lambda: iter(sentences), output_signature=tf.TensorSpec([], tf.string))
    vocab = learner.bert_vocab_from_dataset(
        dataset.batch(batch_size), vocab_size=vocab_size, reserved_tokens=reserved,
        bert_tokenizer_params={"lower_case": lower_case},
        learn_params={"max_input_tokens": 10_000_000})
    return vocab


def write_vocab(tokens, path):
    """Writes one token per line, atomically (a crash never leaves a half-written vocab)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in tokens))
    os.replace(tmp, path)


def load_vocab(path):
    """Reads a vocab.txt; fails naming the file when a special token is missing or duplicated."""
    if not os.path.isfile(path):
        raise ConfigError(f"vocab file not found: {path}")
    with open(path, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f]
    while tokens and tokens[-1] == "":
        tokens.pop()
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise ConfigError(f"vocab file {path} lacks the special token(s) {', '.join(missing)}")
    seen = set()
    for i, t in enumerate(tokens):
        if t in seen:
            raise ConfigError(f"vocab file {path} lists {t!r} twice (line {i + 1})")
        seen.add(t)
    return tokens


class Tokenizer:
    """Text -> WordPiece ids with a fixed vocabulary."""

    def __init__(self, vocab, lower_case=True):
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.lower_case = lower_case
        self._tok = text.FastBertTokenizer(
            vocab=self.vocab, token_out_type=tf.int64, unknown_token="[UNK]",
            lower_case_nfd_strip_accents=lower_case, support_detokenization=False)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (self.index[t] for t in SPECIAL_TOKENS)

    @classmethod
    def from_file(cls, path, lower_case=True):
        return cls(load_vocab(path), lower_case)

    def __len__(self):
        return len(self.vocab)

    def tokenize(self, sentences, batch_size=4096):
        """list[str] -> list[list[int]] (word-piece ids, no special tokens)."""
        out = []
        for i in range(0, len(sentences), batch_size):
            ragged = self._tok.tokenize(tf.constant(sentences[i:i + batch_size]))
            out.extend(ragged.to_list())
        return out

    def tokens(self, sentence):
        """Word-piece strings of one sentence (for tests and inspection)."""
        return [self.vocab[i] for i in self.tokenize([sentence])[0]]


def unk_rate(tokenizer, sentences):
    """Fraction of word pieces that are [UNK] over `sentences`."""
    ids = tokenizer.tokenize(list(sentences))
    total = sum(len(s) for s in ids)
    unk = sum(s.count(tokenizer.unk_id) for s in ids)
    return unk / max(total, 1)


def learn_and_report(sentences, heldout, vocab_size, lower_case=True):
    """Learns a vocabulary and measures its [UNK] rate on held-out sentences."""
    start = time.time()
    vocab = learn_vocab(sentences, vocab_size, lower_case)
    seconds = time.time() - start
    rate = unk_rate(Tokenizer(vocab, lower_case), heldout) if heldout else float("nan")
    return vocab, {"vocab_size": len(vocab), "learn_seconds": seconds, "heldout_unk_rate": rate}
