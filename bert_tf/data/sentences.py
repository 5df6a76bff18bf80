"""Sentence splitting, and the plain text of MediaWiki articles (documents become lists of
sentences).

Sentence splitting rules (`split_sentences`), for text that is not split already:
  a sentence ends at '.', '!' or '?' (plus closing quotes/brackets) followed by white space
  and then an upper-case letter or a digit, optionally behind an opening quote/bracket; a single
  '.' does not end one after a known abbreviation (Mr., Dr., e.g., U.S., No., ...), a single
  capital initial ("J. Smith") or a dotted abbreviation ("i.e.", "U.S.A."). A decimal point is
  never a boundary (no white space follows it). Line breaks in the source are treated as
  spaces, and blank lines always end a sentence (paragraphs).
"""

from __future__ import annotations

import html
import re

_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sr",
    "jr",
    "st",
    "mt",
    "vs",
    "etc",
    "no",
    "nos",
    "vol",
    "fig",
    "e.g",
    "i.e",
    "cf",
    "al",
    "approx",
    "inc",
    "ltd",
    "co",
    "corp",
    "gen",
    "gov",
    "sen",
    "rep",
    "lt",
    "col",
    "sgt",
    "capt",
    "u.s",
    "u.k",
    "u.n",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "ca",
    "c",
    "p",
    "pp",
    "ed",
    "eds",
    "rev",
    "est",
}
_BOUNDARY = re.compile(r"""([.!?]+["')\]]*)\s+(?=["'(\[]?[A-Z0-9])""")


def split_sentences(text):
    """Rule-based sentence splitter (rules in the module docstring)."""
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        start = 0
        for m in _BOUNDARY.finditer(paragraph):
            end = m.end(1)
            before = paragraph[start : m.start(1)]
            last_word = before.split()[-1] if before.split() else ""
            if m.group(1).startswith(".") and len(m.group(1).rstrip("\"')]")) == 1:
                word = last_word.lower().strip("(\"'")
                if (
                    word in _ABBREVIATIONS
                    or re.fullmatch(r"[A-Z]", last_word.strip("(\"'"))
                    or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)
                ):
                    continue
            sentences.append(paragraph[start:end].strip())
            start = m.end()
        if paragraph[start:].strip():
            sentences.append(paragraph[start:].strip())
    return sentences


# ------------------------------------------------------------------------- MediaWiki
_NON_ARTICLE_LINK = re.compile(
    r"^\s*:?\s*(file|image|category|media|wikipedia|template|help|portal|"
    r"user|special|draft|module|wp|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.I,
)


def _remove_nested(text, open_, close):
    """Removes balanced open_...close spans, innermost first (templates, tables)."""
    pattern = re.compile(
        re.escape(open_) + r"(?:(?!" + re.escape(open_) + r").)*?" + re.escape(close), re.S
    )
    while True:
        text, n = pattern.subn("", text)
        if not n:
            return text


def _link_text(m):
    inner = m.group(1)
    if _NON_ARTICLE_LINK.match(inner):
        return ""
    return inner.split("|")[-1]


def strip_wiki_markup(text):
    """Plain article text from wikitext: templates, tables, refs, files and categories
    dropped, links reduced to their text, headings kept as their own paragraphs."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>/]*/>", "", text, flags=re.I)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.I | re.S)
    text = re.sub(
        r"<(gallery|math|timeline|score|source|syntaxhighlight|pre|code)\b.*?</\1>",
        "",
        text,
        flags=re.I | re.S,
    )
    text = _remove_nested(text, "{{", "}}")
    text = _remove_nested(text, "{|", "|}")
    text = re.sub(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]", r"\1", text)
    # File/Category links may contain links in their captions: resolve innermost links first.
    # Inside a link, single brackets are text; only "[[" and "]]" nest.
    innermost = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\]))*?)\]\]", re.S)
    while True:
        text, n = innermost.subn(_link_text, text)
        if not n:
            break
    text = re.sub(r"https?://\S+", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"__[A-Z]+__", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = html.unescape(text)
    lines = []
    for line in text.split("\n"):
        stripped = line.strip()
        heading = re.fullmatch(r"(=+)\s*(.*?)\s*\1", stripped)
        if heading:
            lines += ["", heading.group(2), ""]  # a heading is a sentence of its own
        elif stripped.startswith(("|", "!", "{", "}")):
            continue  # leftovers of tables and templates
        else:
            lines.append(re.sub(r"^[*#:;]+\s*", "", stripped))
    text = "\n".join(lines)
    text = re.sub(r"\(\s*[,;]?\s*\)", "", text)  # "( )" left by removed templates
    text = text.replace("[[", "").replace("]]", "").replace("{{", "").replace("}}", "")
    return text


def wiki_to_sentences(wikitext):
    return split_sentences(strip_wiki_markup(wikitext))


MARKUP = ("{{", "}}", "[[", "]]", "|", "<ref", "&lt;", "&gt;", "&amp;")


def markup_fraction(sentences):
    """Fraction of sentences that still contain a MediaWiki markup string (MARKUP): how well
    strip_wiki_markup cleans real articles."""
    sentences = list(sentences)
    return sum(any(m in s for m in MARKUP) for s in sentences) / max(len(sentences), 1)
