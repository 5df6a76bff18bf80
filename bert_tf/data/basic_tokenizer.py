"""google-research/bert's BasicTokenizer: text -> words, the step before WordPiece
(bert_tf.data.tokenization), written here from its algorithm.

Drop NUL, U+FFFD and control/format characters (Unicode Cc, Cf; tab and newlines are white space),
map white space (incl. Zs) to ' ', put spaces around CJK ideographs, split on white space; when
lower-casing: str.lower() then NFD and drop combining marks (Mn); split off every punctuation
character (Unicode P*, and ASCII symbols such as $ + < = > ^ ` |). ASCII text takes a shortcut
with the same result.
"""

from __future__ import annotations

import re
import unicodedata


def _is_cjk(cp):
    # CJK Unified Ideographs and extensions, compatibility ideographs (not Hangul or kana: those are
    # written with spaces, as google's tokenizer assumes).
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_punctuation(ch):
    cp = ord(ch)
    # All non-alphanumeric ASCII counts, including symbols ($, +, ^, `) that Unicode does not call
    # P*.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


# ASCII text needs none of the Unicode steps: drop the C0 controls and DEL (Cc), split off
# punctuation.
_ASCII_CONTROLS = {cp: None for cp in [*range(32), 127] if chr(cp) not in "\t\n\r"}
_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def basic_tokenize(sentence, lower_case=True):
    """google-research/bert's BasicTokenizer: text -> words (before WordPiece)."""
    if sentence.isascii():
        sentence = sentence.translate(_ASCII_CONTROLS)
        return _ASCII_PUNCTUATION.sub(r" \1 ", sentence.lower() if lower_case else sentence).split()
    return _basic_tokenize_unicode(sentence, lower_case)


def _basic_tokenize_unicode(sentence, lower_case):
    chars = []
    for ch in sentence:
        cp = ord(ch)
        if ch in " \t\n\r":
            chars.append(" ")
            continue
        cat = unicodedata.category(ch)
        if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf"):
            continue
        if cat == "Zs":
            chars.append(" ")
        elif _is_cjk(cp):
            chars.extend((" ", ch, " "))
        else:
            chars.append(ch)
    words = []
    for word in "".join(chars).split():
        if lower_case:
            word = "".join(
                c
                for c in unicodedata.normalize("NFD", word.lower())
                if unicodedata.category(c) != "Mn"
            )
        current = []
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
    return " ".join(words).split()
