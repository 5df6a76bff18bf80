"""Streaming corpus readers: documents as lists of sentences.

Formats (`FORMATS`):
  sentences  google-research/bert: one sentence per line, a blank line between documents
  documents  one document per line (split into sentences here)
  mediawiki  a MediaWiki XML dump: article text with the markup stripped

`auto` picks mediawiki for files that start with a <mediawiki> element, else sentences.

Files may be plain, .gz or .bz2. Bytes that are not UTF-8 are replaced by U+FFFD and
counted in `ReadStats.bad_bytes_lines`, never fatal. Nothing loads a whole file.

Sentence splitting rules (`split_sentences`), for text that is not split already:
  a sentence ends at '.', '!' or '?' (plus closing quotes/brackets) followed by white space
  and then an upper-case letter, a digit or an opening quote/bracket; except after
  a known abbreviation (Mr., Dr., e.g., U.S., No., ...), a single capital initial ("J. Smith"),
  or a number with a decimal point. Line breaks in the source are treated as spaces, and
  blank lines always end a sentence (paragraphs).
"""
from __future__ import annotations

import bz2
import dataclasses
import gzip
import html
import io
import os
import re
import xml.etree.ElementTree as ET

from bert_tf import ConfigError

FORMATS = ("sentences", "documents", "mediawiki")


@dataclasses.dataclass
class ReadStats:
    files: int = 0
    documents: int = 0
    sentences: int = 0
    bad_bytes_lines: int = 0    # lines with bytes that were not UTF-8 (replaced)
    skipped_pages: int = 0      # MediaWiki: redirects and non-article namespaces


def open_binary(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def read_lines(path, stats: ReadStats):
    """Decoded lines (without newline) of a possibly compressed file."""
    with open_binary(path) as f:
        for raw in f:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("utf-8", errors="replace")
                stats.bad_bytes_lines += 1
            yield line.rstrip("\r\n")


def detect_format(path):
    """mediawiki when the file starts with a <mediawiki> element, else sentences."""
    with open_binary(path) as f:
        head = f.read(4096).lstrip()
    return "mediawiki" if head.startswith(b"<mediawiki") or b"<mediawiki " in head[:200] else "sentences"


def expand_inputs(patterns):
    """Globs (each may end in @FORMAT) -> sorted file list; a pattern matching nothing is an error."""
    import glob
    files = set()
    for pattern in patterns:
        path, _, fmt = pattern.partition("@")
        matches = glob.glob(path)
        if not matches:
            raise ConfigError(f"input file not found: {path}")
        files.update(m + ("@" + fmt if fmt else "") for m in matches)
    return sorted(files)


def read_documents(paths, fmt="auto", stats: ReadStats | None = None):
    """Yields documents (lists of non-empty sentence strings) from `paths`, in order.

    A path may end in @FORMAT to override `fmt` for that file.
    """
    stats = stats if stats is not None else ReadStats()
    if not paths:
        raise ConfigError("no input files given")
    for spec in paths:
        path, _, own_fmt = spec.partition("@")
        if not os.path.isfile(path):
            raise ConfigError(f"input file not found: {path}")
        kind = own_fmt or fmt
        kind = detect_format(path) if kind == "auto" else kind
        if kind not in FORMATS:
            raise ConfigError(f"unknown input format {kind!r} for {path}; valid: auto, {', '.join(FORMATS)}")
        stats.files += 1
        reader = {"sentences": _sentence_per_line, "documents": _document_per_line,
                  "mediawiki": _mediawiki}[kind]
        for doc in reader(path, stats):
            doc = [s for s in (s.strip() for s in doc) if s]
            if doc:
                stats.documents += 1
                stats.sentences += len(doc)
                yield doc


def _sentence_per_line(path, stats):
    doc = []
    for line in read_lines(path, stats):
        if line.strip():
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _document_per_line(path, stats):
    for line in read_lines(path, stats):
        if line.strip():
            yield split_sentences(line)


# ------------------------------------------------------------------------- sentence splitting
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "no", "nos", "vol", "fig",
    "e.g", "i.e", "cf", "al", "approx", "inc", "ltd", "co", "corp", "gen", "gov", "sen", "rep", "lt",
    "col", "sgt", "capt", "u.s", "u.k", "u.n", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
    "sept", "oct", "nov", "dec", "ca", "c", "p", "pp", "ed", "eds", "rev", "est",
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
            before = paragraph[start:m.start(1)]
            last_word = before.split()[-1] if before.split() else ""
            if m.group(1).startswith(".") and len(m.group(1).rstrip("\"')]")) == 1:
                word = last_word.lower().strip("(\"'")
                if word in _ABBREVIATIONS or re.fullmatch(r"[A-Z]", last_word.strip("(\"'")) \
                        or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):
                    continue
            sentences.append(paragraph[start:end].strip())
            start = m.end()
        if paragraph[start:].strip():
            sentences.append(paragraph[start:].strip())
    return sentences


# ------------------------------------------------------------------------- MediaWiki
_NON_ARTICLE_LINK = re.compile(r"^\s*:?\s*(file|image|category|media|wikipedia|template|help|portal|"
                               r"user|special|draft|module|wp|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)


def _mediawiki(path, stats):
    with open_binary(path) as f:
        stream = io.TextIOWrapper(f, encoding="utf-8", errors="replace")
        ns, text, redirect = None, None, False
        for event, elem in ET.iterparse(stream, events=("end",)):
            tag = elem.tag.rsplit("}", 1)[-1]
            if tag == "ns":
                ns = (elem.text or "").strip()
            elif tag == "redirect":
                redirect = True
            elif tag == "text":
                text = elem.text or ""
            elif tag == "page":
                if ns == "0" and not redirect and not text.lstrip().lower().startswith("#redirect"):
                    doc = wiki_to_sentences(text)
                    if doc:
                        yield doc
                else:
                    stats.skipped_pages += 1
                ns, text, redirect = None, None, False
                elem.clear()


def _remove_nested(text, open_, close):
    """Removes balanced open_...close spans, innermost first (templates, tables)."""
    pattern = re.compile(re.escape(open_) + r"(?:(?!" + re.escape(open_) + r").)*?" + re.escape(close), re.S)
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
    text = re.sub(r"<(gallery|math|timeline|score|source|syntaxhighlight|pre|code)\b.*?</\1>", "",
                  text, flags=re.I | re.S)
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
            lines += ["", heading.group(2), ""]       # a heading is a sentence of its own
        elif stripped.startswith(("|", "!", "{", "}")):
            continue                                     # leftovers of tables and templates
        else:
            lines.append(re.sub(r"^[*#:;]+\s*", "", stripped))
    text = "\n".join(lines)
    text = re.sub(r"\(\s*[,;]?\s*\)", "", text)          # "( )" left by removed templates
    text = text.replace("[[", "").replace("]]", "").replace("{{", "").replace("}}", "")
    return text


def wiki_to_sentences(wikitext):
    return split_sentences(strip_wiki_markup(wikitext))
