"""WikiExtractor's output as corpus input (format `wikiextractor`): a folder of subfolders AA, AB,
... each holding wiki_00 ... wiki_99 (or wiki_00.bz2 ... with WikiExtractor -c), each file a run of

    <doc id="12" url="https://en.wikipedia.org/wiki?curid=12" title="Anarchism">
    Anarchism

    Anarchism is a political philosophy ...
    </doc>

How a <doc> becomes a document:
  - the first line after the <doc ...> line is the title WikiExtractor repeats there: it is dropped;
    with --title_field=ATTRIBUTE (title, id, url, revid: an attribute of the <doc> tag) that
    attribute's value becomes the document's first sentence, as the title column does for Parquet;
  - every other line is a paragraph (WikiExtractor writes one per line, blank lines or not between
    them): it is split into sentences by sentences.split_sentences, so a sentence never runs across
    lines; HTML entities are decoded (WikiExtractor 3 escapes &, < and > by default) and lines that
    are nothing but markup tags (`</dl>`, `<poem>` left over from the wikitext) are dropped;
  - a <doc> with no text left (WikiExtractor writes stubs and lists as an empty <doc>) is skipped
    and counted in ReadStats.skipped_pages, like a MediaWiki redirect.
Malformed input is skipped, counted and listed in ReadStats.problems with the file and byte offset,
like MediaWiki pages: a <doc> that the file ends inside (truncated_pages), a <doc> not closed before
the next <doc> begins (bad_pages; the next one is read), text outside <doc> ... </doc> (stray_text,
one count per run of such lines).

Ranks share a plain file by bytes (corpus.plan_shares): a share reads the <doc>s whose `<doc` line
begins in its range, each to its </doc>, so every document is read by exactly one share.
WikiExtractor's --json output (JSON lines with id, url, title, text) is the `jsonl` format, detected
by its leading "{".
"""

from __future__ import annotations

import html
import os
import re

from bert_tf import ConfigError
from bert_tf.data import compressed
from bert_tf.data.sentences import split_sentences

FILE_NAME = re.compile(r"wiki_\d+(" + "|".join(re.escape(c) for c in compressed.COMPRESSED) + r")?")
_OPEN = re.compile(rb"\s*<doc[\s>]")
_ATTRIBUTE = re.compile(r'(\w+)="(.*?)"(?=\s+\w+="|\s*/?>\s*$)')
_ONLY_TAGS = re.compile(r"(?:\s*</?[A-Za-z][^<>]*>)+\s*")


def is_doc_line(raw: bytes) -> bool:
    """Whether a raw line opens a WikiExtractor document (`<doc id=...>`)."""
    return _OPEN.match(raw) is not None


def folder_files(folder):
    """The files WikiExtractor wrote under `folder` (AA/wiki_00, AA/wiki_01.bz2, ...: files named
    wiki_<number>, at any depth), sorted; a folder without any is an error."""
    found = []
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(parent, f) for f in files if FILE_NAME.fullmatch(f)]
    if not found:
        raise ConfigError(
            f"{folder} is a folder with neither WikiExtractor output (AA/wiki_00, AA/wiki_01, ...) "
            "nor a datasets.save_to_disk state.json: give its files (a glob), or the folder of one "
            f"of those"
        )
    return sorted(found)


def attributes(header: str) -> dict:
    """The attributes of a `<doc ...>` line, HTML entities decoded (a title may hold quotes:
    WikiExtractor does not escape them, so a value ends at the quote before the next attribute or
    the closing >)."""
    return {name: html.unescape(value) for name, value in _ATTRIBUTE.findall(header.strip())}


def documents_in_range(share, lines, stats, decode):
    """(byte offset of the <doc> line, sentences) for the <doc>s whose line begins in `share`.
    lines: (offset, raw line) from the first line starting at or after share.start
    (corpus._lines_from); decode: raw line -> str, counting bad bytes."""
    where = "uncompressed byte" if compressed.is_compressed(share.path) else "byte"
    doc = None  # [offset, header, body lines] of the open <doc>
    inside = share.start == 0 or compressed.is_compressed(
        share.path
    )  # False: in the previous share's <doc>
    stray = False  # in a run of text outside any <doc>
    for offset, raw in lines:
        if is_doc_line(raw):
            if doc is not None:
                stats.bad_pages += 1
                stats.problems.append(
                    f"{share.path}: {where} {doc[0]}: <doc> not closed before the next <doc> at "
                    f"{where} {offset}; skipped"
                )
            if share.end is not None and offset >= share.end:
                return
            doc, inside, stray = [offset, decode(raw), []], True, False
        elif not inside:
            continue
        elif doc is not None and raw.strip() != b"</doc>":
            doc[2].append(raw)
        elif doc is not None:
            document, doc = _document(share, doc, stats, decode, where), None
            if document:
                yield document
        elif raw.strip() and not stray:
            stray = True
            stats.stray_text += 1
            stats.problems.append(
                f"{share.path}: {where} {offset}: text outside <doc> ... </doc>: ignored"
            )
    if doc is not None:
        stats.truncated_pages += 1
        stats.problems.append(
            f"{share.path}: {where} {doc[0]}: <doc> not closed before the end of the file; skipped"
        )


def _document(share, doc, stats, decode, where):
    """(offset, sentences) of a closed <doc>, or None when it has no text (counted)."""
    offset, header, body = doc
    sentences = []
    for raw in body[1:]:  # body[0]: the title line
        line = html.unescape(decode(raw))
        if line.strip() and not _ONLY_TAGS.fullmatch(line):
            sentences += split_sentences(line)
    if not sentences:
        stats.skipped_pages += 1
        return None
    if share.title_field:
        found = attributes(header)
        if share.title_field not in found:
            raise ConfigError(
                f"{share.path}: {where} {offset}: the <doc> has no attribute {share.title_field!r} "
                f"(--title_field); its attributes: {', '.join(found) or 'none'}"
            )
        sentences.insert(0, found[share.title_field])
    return offset, sentences
