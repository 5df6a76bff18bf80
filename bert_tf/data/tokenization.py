"""WordPiece vocabulary (learn, load, write) and tokenisation exactly as google-research/bert's.

Vocabulary layout follows google-research/bert's `vocab.txt`: [PAD] at 0, [unused0..98]
at 1..99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then word pieces.

Tokenisation is google's FullTokenizer, written here from its algorithm (`backend="python"`):
its BasicTokenizer splits text into words (`basic_tokenizer`), then greedy longest-match
WordPiece per word with "##" continuations, a word that cannot be covered or is longer than 100
characters being one [UNK]. A model pre-trained here therefore sees the ids google's and Hugging
Face's tokenizers give the same text.

`backend="rust"` (the default) gives the same ids about 10x faster: the `tokenizers` library's
BertNormalizer/BertPreTokenizer/WordPiece (`huggingface_tokenizer`), which departs from google's
rules on a known set of characters only: private use (Co), the final capital sigma, and about 760
code points its Unicode tables and CJK ranges classify differently from Python's
(`bert_tf.rust_departures`, found by `departures`, which tries every code point); a sentence holding
one of them is tokenised by the Python rules instead.

`backend="tensorflow_text"` is tensorflow-text's FastBertTokenizer: it case-folds with NFKC
(ligatures, ª/º and full-width letters become ASCII), folds Greek final sigma, and treats NUL and
some characters differently, so it disagrees with google's on some text (run/tokenizer_agreement.py
measures all three; figures in docs/results.md, "Tokenizer agreement").
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
import unicodedata

import tensorflow as tf
import tensorflow_text as text

from bert_tf import ConfigError
from bert_tf.data.basic_tokenizer import basic_tokenize

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def google_reserved_tokens(num_unused=99):
    return (
        ["[PAD]"]
        + [f"[unused{i}]" for i in range(num_unused)]
        + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )


LEARNERS = ("tokenizers", "tensorflow_text")


def learn_vocab(
    sentences, vocab_size, lower_case=True, num_unused=99, chunk=1024, learner="tokenizers"
):
    """Learns a WordPiece vocabulary (list of tokens, google's layout) from an iterable of
    sentences: tensorflow-text's bert_vocab_from_dataset, or the `tokenizers` library's BPE
    trainer (Rust, on the words as huggingface_tokenizer normalises and splits them; the same
    vocabulary in every process: bert_tf/data/wordpiece_learning.py)."""
    reserved = google_reserved_tokens(num_unused)
    if vocab_size <= len(reserved) + 100:
        raise ConfigError(
            f"--vocab_size={vocab_size} leaves no room for word pieces after {len(reserved)} "
            f"reserved tokens"
        )
    if learner not in LEARNERS:
        raise ConfigError(f"--learner={learner}: valid are {', '.join(LEARNERS)}")
    if learner == "tokenizers":
        from bert_tf.data import wordpiece_learning

        rules = huggingface_tokenizer(reserved, lower_case, special_tokens_whole=False)
        pieces = wordpiece_learning.learn_pieces(sentences, vocab_size - len(reserved), rules)
        return reserved + pieces
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as learner_module

    dataset = tf.data.Dataset.from_generator(
        lambda: iter(sentences), output_signature=tf.TensorSpec([], tf.string)
    )
    vocab = learner_module.bert_vocab_from_dataset(
        dataset.batch(chunk),
        vocab_size=vocab_size,
        reserved_tokens=reserved,
        bert_tokenizer_params={"lower_case": lower_case},
        learn_params={"max_input_tokens": 10_000_000},
    )
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


BACKENDS = ("tensorflow_text", "rust", "python")


class Tokenizer:
    """Text -> WordPiece ids with a fixed vocabulary, google-research/bert's ids with every backend:
    a library backend (tensorflow_text, rust) tokenises the sentences without a character on which
    its rules depart from google's (`departures`), the Python rules take the others."""

    def __init__(self, vocab, lower_case=True, backend="tensorflow_text", max_chars_per_word=100):
        if backend not in BACKENDS:
            raise ConfigError(f"--tokenizer={backend}: valid are {', '.join(BACKENDS)}")
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.lower_case = lower_case
        self.backend = backend
        self.max_chars_per_word = max_chars_per_word
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.index[t] for t in SPECIAL_TOKENS
        )
        # Words repeat (Zipf): cache each word's pieces.
        self._word_ids = functools.lru_cache(maxsize=1 << 18)(self._wordpiece)

    @classmethod
    def from_file(cls, path, lower_case=True, backend="tensorflow_text"):
        return cls(load_vocab(path), lower_case, backend)

    def __len__(self):
        return len(self.vocab)

    @functools.cached_property
    def _library(self):
        """The library's tokenize: list[str] -> list[list[int]]."""
        if self.backend == "rust":
            tok = huggingface_tokenizer(
                self.vocab, self.lower_case, self.max_chars_per_word, special_tokens_whole=False
            )
            tok.no_truncation()
            return lambda batch: [
                e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)
            ]
        tf_tok = text.FastBertTokenizer(
            vocab=self.vocab,
            token_out_type=tf.int64,
            unknown_token="[UNK]",
            lower_case_nfd_strip_accents=self.lower_case,
            support_detokenization=False,
            max_bytes_per_word=self.max_chars_per_word,
        )
        return lambda batch: tf_tok.tokenize(tf.constant(batch)).to_list()

    def tokenize(self, sentences, chunk=4096):
        """list[str] -> list[list[int]] (word-piece ids, no special tokens)."""
        if self.backend == "python":
            return [self.ids(s) for s in sentences]
        departing = departures(self.backend)
        if departing is None:
            return [self.ids(s) for s in sentences]
        out = [None] * len(sentences)
        easy = []
        for i, s in enumerate(sentences):
            # tensorflow-text counts a word's length in UTF-8 bytes, google in characters: a word of
            # over 25 characters that is not ASCII could be 100 bytes.
            if not departing.intersection(s) and (
                s.isascii() or max(map(len, s.split()), default=0) <= 25
            ):
                easy.append(i)
            else:
                out[i] = self.ids(s)  # holds a character the library treats otherwise
        for k in range(0, len(easy), chunk):
            part = easy[k : k + chunk]
            for i, ids in zip(part, self._library([sentences[i] for i in part])):
                out[i] = list(ids)
        return out

    def ids(self, sentence):
        """One sentence -> word-piece ids, google-research/bert's FullTokenizer rules."""
        out = []
        for word in basic_tokenize(sentence, self.lower_case):
            out.extend(self._word_ids(word))
        return out

    def _wordpiece(self, word):
        """Greedy longest-match-first; the whole word is [UNK] when a piece cannot be matched."""
        if len(word) > self.max_chars_per_word:
            return (self.unk_id,)
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.index:
                    pieces.append(self.index[piece])
                    break
                end -= 1
            if end == start:
                return (self.unk_id,)
            start = end
        return tuple(pieces)

    def tokens(self, sentence):
        """Word-piece strings of one sentence (for tests and inspection)."""
        return [self.vocab[i] for i in self.tokenize([sentence])[0]]


def huggingface_tokenizer(
    vocab, lower_case=True, max_chars_per_word=100, special_tokens_whole=True
):
    """Our vocabulary and rules as a `tokenizers` (Rust) Tokenizer: what tokenizer.json holds, so
    that transformers' fast AutoTokenizer, text-embeddings-inference and transformers.js read an
    export. Built from the parts google's rules map to (BertNormalizer, BertPreTokenizer, WordPiece,
    and the [CLS] A [SEP] B [SEP] template with segment ids 0/1); tests/test_checkpoint_formats.py
    checks its ids."""
    from tokenizers import (
        Tokenizer as RustTokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    index = {t: i for i, t in enumerate(vocab)}
    tok = RustTokenizer(
        models.WordPiece(
            vocab=index, unk_token="[UNK]", max_input_chars_per_word=max_chars_per_word
        )
    )
    # strip_accents=None follows lowercase, as google's BasicTokenizer does (NFD + drop Mn only when
    # lower-casing).
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower_case
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = ("[CLS]", index["[CLS]"]), ("[SEP]", index["[SEP]"])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[cls, sep],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    if (
        special_tokens_whole
    ):  # "[MASK]" in a fill-mask prompt is one token; in corpus text google's "[", "mask", "]"
        tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


SPECIAL_TOKENS_MAP = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def write_tokenizer_files(
    vocab_file, out_dir, do_lower_case=True, model_max_length=512, model_input_names=None
) -> list:
    """vocab.txt, tokenizer.json (the fast tokenizer: huggingface_tokenizer), tokenizer_config.json
    and special_tokens_map.json: what AutoTokenizer, text-embeddings-inference and transformers.js
    look for. model_input_names: what the tokenizer returns (ModernBERT takes no token_type_ids)."""
    os.makedirs(out_dir, exist_ok=True)
    vocab = load_vocab(vocab_file)
    huggingface_tokenizer(vocab, do_lower_case).save(os.path.join(out_dir, "tokenizer.json"))
    # strip_accents None: follow do_lower_case, as google's tokenizer does.
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        **SPECIAL_TOKENS_MAP,
    }
    if model_input_names:
        config["model_input_names"] = model_input_names
    for name, content in (
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", SPECIAL_TOKENS_MAP),
    ):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(content, f, indent=2)
            f.write("\n")
    copy_vocab(vocab_file, out_dir)
    return ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def copy_vocab(vocab_file, out_dir):
    """vocab_file as out_dir/vocab.txt (an export's vocabulary), unless it is that file already."""
    target = os.path.join(out_dir, "vocab.txt")
    if not (os.path.exists(target) and os.path.samefile(vocab_file, target)):
        shutil.copyfile(vocab_file, target)


def _private_use(cp):
    return 0xE000 <= cp <= 0xF8FF or cp >= 0xF0000


def scan_departures(backend):
    """Code points (private use aside) where `backend`'s library gives other ids than the
    Python rules, cased or uncased: each tried inside a word, alone and after a word, with a
    vocabulary holding every word the Python rules make of the probes (so a different word is a
    different id, not [UNK] on both sides). About a minute and 5 GB per backend. -> [(first, last),
    ...]"""
    probes = [
        f"ab{chr(cp)}cd X{chr(cp)} y {chr(cp)}"
        for cp in range(0x110000)
        if not 0xD800 <= cp < 0xE000 and not _private_use(cp)
    ]
    bad = set()
    for lower_case in (True, False):
        words = dict.fromkeys(w for p in probes for w in basic_tokenize(p, lower_case))
        tok = Tokenizer(
            google_reserved_tokens() + [w for w in words if w not in SPECIAL_TOKENS],
            lower_case,
            backend,
        )
        got = [
            ids
            for k in range(0, len(probes), 1 << 16)
            for ids in tok._library(probes[k : k + (1 << 16)])
        ]
        bad |= {ord(p[2]) for p, ids in zip(probes, got) if tok.ids(p) != list(ids)}
    ranges = []
    for cp in sorted(bad):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return [tuple(r) for r in ranges]


def library_versions(backend):
    """What a departure table depends on: the library's version and Python's Unicode tables."""
    if backend == "rust":
        import tokenizers

        return tokenizers.__version__, unicodedata.unidata_version
    return text.__version__, unicodedata.unidata_version


@functools.lru_cache(maxsize=None)
def departures(backend):
    """The characters `backend` hands to the Python rules (a frozenset of str): private use and the
    ranges bert_tf.data.tokenizer_departures lists for it; None when that table was scanned for
    other library or Unicode versions than these (then every sentence takes the Python rules, with a
    warning)."""
    import warnings

    from bert_tf.data import tokenizer_departures

    table = tokenizer_departures.TABLES[backend]
    if library_versions(backend) != table["versions"]:
        warnings.warn(
            f"bert_tf.data.tokenizer_departures lists {backend}'s departures for versions "
            f"{table['versions']}, not {library_versions(backend)}: tokenising with the (slower) "
            f"Python rules; `python run/tokenizer_agreement.py --write_departures` scans again"
        )
        return None
    chars = {chr(cp) for first, last in table["ranges"] for cp in range(first, last + 1)}
    chars |= {chr(cp) for cp in (*range(0xE000, 0xF900), *range(0xF0000, 0x110000))}
    return frozenset(chars)


def unk_rate(tokenizer, sentences):
    """Fraction of word pieces that are [UNK] over `sentences`."""
    ids = tokenizer.tokenize(list(sentences))
    total = sum(len(s) for s in ids)
    unk = sum(s.count(tokenizer.unk_id) for s in ids)
    return unk / max(total, 1)


def learn_and_report(sentences, heldout, vocab_size, lower_case=True, learner="tokenizers"):
    """Learns a vocabulary and measures its [UNK] rate on held-out sentences."""
    start = time.time()
    vocab = learn_vocab(sentences, vocab_size, lower_case, learner=learner)
    seconds = time.time() - start
    tok = Tokenizer(vocab, lower_case)
    rate = unk_rate(tok, heldout) if heldout else float("nan")
    words = sum(len(basic_tokenize(s, lower_case)) for s in heldout)
    pieces = sum(map(len, tok.tokenize(list(heldout))))
    return vocab, {
        "vocab_size": len(vocab),
        "learn_seconds": seconds,
        "heldout_unk_rate": rate,
        "learner": learner,
        "heldout_pieces_per_word": pieces / max(words, 1),
    }
