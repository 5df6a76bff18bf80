"""The `tokenizers` library's trainer made to learn WordPiece pieces the same way in every process
(tokenization.learn_vocab's default learner)."""

from __future__ import annotations

from bert_tf import ConfigError


def learn_pieces(sentences, size: int, rules) -> list:
    """WordPiece's pieces by the `tokenizers` library's BPE trainer, the same in every process.

    Its WordPieceTrainer numbers the "##" pieces in hash-map order, which changes from process to
    process, and merges that tie on counts are broken by those numbers: the same text gave other
    ids and, at 3,000 tokens, other pieces (huggingface/tokenizers#1794). Here each character is
    sent as one of two private-use code points, word-initial or not, numbered in order of first
    appearance, so the trainer sees no "##" to number and every tie breaks the same way. `rules`:
    a `tokenizers` Tokenizer whose normalizer and pre-tokenizer split the words first
    (tokenization.huggingface_tokenizer: google's rules), as they did inside the trainer.
    """
    from tokenizers import Tokenizer as RustTokenizer, models, pre_tokenizers, trainers

    normalize, split = rules.normalizer.normalize_str, rules.pre_tokenizer.pre_tokenize_str
    chars: list = []  # character number -> character
    number: dict = {}  # character -> its number
    spelt: dict = {}  # word -> the word as the trainer sees it

    def encode(word):
        if word not in spelt:
            for c in word:
                if c not in number:
                    if len(chars) == _PRIVATE_CHARS:
                        raise ConfigError(
                            f"the corpus has more than {_PRIVATE_CHARS:,} distinct characters, "
                            "more than the `tokenizers` learner can number: use "
                            "--learner=tensorflow_text"
                        )
                    number[c] = len(chars)
                    chars.append(c)
            first, *rest = (number[c] for c in word)
            spelt[word] = chr(_PRIVATE + 2 * first) + "".join(
                chr(_PRIVATE + 2 * r + 1) for r in rest
            )
        return spelt[word]

    def lines():
        for sentence in sentences:
            yield " ".join(encode(w) for w, _ in split(normalize(sentence)))

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(lines(), trainers.BpeTrainer(vocab_size=size, show_progress=False))
    pieces = []
    for token, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        codes = [ord(c) - _PRIVATE for c in token]
        pieces.append(("##" if codes[0] % 2 else "") + "".join(chars[c // 2] for c in codes))
    return pieces


# Planes 15 and 16, the supplementary private-use areas, as one range of code points.
_PRIVATE, _PRIVATE_CHARS = 0xF0000, (0x10FFFE - 0xF0000) // 2
