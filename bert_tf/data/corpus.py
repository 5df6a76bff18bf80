"""Streaming corpus readers: documents as lists of sentences.

Formats (`FORMATS`):
  sentences  google-research/bert: one sentence per line, a blank line between documents
  documents  one document per line (split into sentences here)
  mediawiki  a MediaWiki XML dump: article text with the markup stripped
  jsonl      JSON lines, one document per line: {"text": ...} (the field is `text_field`)
  parquet    Parquet (Hugging Face datasets' shards, e.g. wikimedia/wikipedia): a row per
             document, its text in column `text_field`, optionally a title in `title_field` (the
             document's first sentence)
  arrow      a `datasets.save_to_disk` folder (state.json, Arrow stream files); columns as parquet
  wikiextractor
             WikiExtractor's output: <doc id=... title=...> title, paragraphs </doc> (AA/wiki_00,
             ...); the title line dropped (`title_field`: a <doc> attribute as the first sentence),
             a paragraph per line (rules in `wikiextractor`); its --json output is jsonl

`auto` picks parquet for *.parquet files, arrow for a folder with state.json, mediawiki for files
that start with a <mediawiki> element, wikiextractor for files that start with a <doc ...> line,
jsonl for files that start with "{" or are named *.jsonl / *.json (before .gz/.bz2/.zst), else
sentences. `expand_inputs` turns a folder without state.json into the WikiExtractor files under it.

Text files may be plain, .gz, .bz2 or .zst (Zstandard, streamed across frames). Bytes that are not
UTF-8 are replaced by U+FFFD and counted in `ReadStats.bad_bytes_lines`, never fatal. Nothing loads
a whole file: Parquet is read a row group at a time, Arrow a record batch at a time (memory-mapped).

Ranks split the corpus by bytes (`plan_shares`): a rank reads only the documents that begin
in its byte ranges (after a blank line for google format, at a line start for one document
per line, at `<page>` for MediaWiki XML, at a `<doc` line for WikiExtractor), reading at most
compressed.READ_BUFFER bytes beyond its last document; a compressed file is read whole by one rank,
except a Wikipedia multistream dump with its index beside it (`compressed.multistream_index`), whose
bz2 streams are shared out; Parquet row groups and Arrow record batches are shared out the same way,
whole, to the rank their first byte falls to. A document is named by its file and byte offset (in a
compressed file read whole, by its number in the file; `read_share`), whatever the rank count.

Compressed files are read by `compressed`, Parquet and Arrow by `tables`, WikiExtractor's <doc>s by
`wikiextractor`, and text is cut into sentences by `sentences`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import xml.etree.ElementTree as ET

from bert_tf import ConfigError
from bert_tf.data import compressed, tables, wikiextractor
from bert_tf.data.sentences import split_sentences, wiki_to_sentences

FORMATS = ("sentences", "documents", "mediawiki", "jsonl", "parquet", "arrow", "wikiextractor")
TABLES = ("parquet", "arrow")  # columnar formats: a row per document, shared by row group / batch


@dataclasses.dataclass
class ReadStats:
    files: int = 0
    documents: int = 0
    sentences: int = 0
    bad_bytes_lines: int = 0  # lines with bytes that were not UTF-8 (replaced)
    # MediaWiki: redirects and non-article namespaces; WikiExtractor: <doc>s without text
    skipped_pages: int = 0
    bytes_read: int = 0  # bytes read from the files (compressed size for compressed files)
    # MediaWiki: a <page> the file ends inside; WikiExtractor: a <doc> likewise
    truncated_pages: int = 0
    # MediaWiki: a <page> that is not valid XML; WikiExtractor: a <doc> not closed
    bad_pages: int = 0
    stray_text: int = 0  # WikiExtractor: runs of lines outside <doc> ... </doc> (ignored)
    bad_json_lines: int = 0  # JSON lines: not JSON, or without a string in the text field
    bad_rows: int = 0  # Parquet/Arrow: a row whose text is not a string (null)
    truncated_files: int = 0  # compressed files that end before their end-of-stream marker
    # "file: byte N: what" for each skipped item
    problems: list = dataclasses.field(default_factory=list)


def detect_format(path):
    """parquet (*.parquet), arrow (a save_to_disk folder), mediawiki when the file starts with a
    <mediawiki> element, wikiextractor when it starts with a <doc ...> line, jsonl for JSON lines,
    else sentences."""
    if os.path.isdir(path):
        return "arrow"
    if path.endswith(".parquet"):
        return "parquet"
    with compressed.open_binary(path) as f:
        try:
            head = f.read(4096).lstrip()
        except (EOFError, OSError):  # a truncated compressed file: reading it says so, by name
            head = b""
    if head.startswith(b"<mediawiki") or b"<mediawiki " in head[:200]:
        return "mediawiki"
    if wikiextractor.is_doc_line(head):
        return "wikiextractor"
    stem = next((path[: -len(c)] for c in compressed.COMPRESSED if path.endswith(c)), path)
    return "jsonl" if head.startswith(b"{") or stem.endswith((".jsonl", ".json")) else "sentences"


def expand_inputs(patterns):
    """Globs (each may end in @FORMAT) -> sorted file list; a pattern matching nothing is an error.
    A folder stays a folder when it holds a state.json (datasets.save_to_disk), else it becomes the
    WikiExtractor files under it (AA/wiki_00, ...; wikiextractor.folder_files)."""
    import glob

    files = set()
    for pattern in patterns:
        path, _, fmt = pattern.partition("@")
        matches = glob.glob(path)
        if not matches:
            raise ConfigError(f"input file not found: {path}")
        files.update(f for m in matches for f in _folder_inputs(m + ("@" + fmt if fmt else "")))
    return sorted(files)


def _folder_inputs(spec):
    """[spec], or for a folder without state.json (and not given @arrow) the WikiExtractor files
    under it."""
    path, _, fmt = spec.partition("@")
    markers = ("state.json", "dataset_dict.json")
    arrow = fmt == "arrow" or any(os.path.isfile(os.path.join(path, m)) for m in markers)
    if not os.path.isdir(path) or arrow:
        return [spec]  # an Arrow folder (a DatasetDict's top folder gets its own message there)
    return [f + ("@" + fmt if fmt else "") for f in wikiextractor.folder_files(path)]


def read_documents(
    paths, fmt="auto", stats: ReadStats | None = None, text_field="text", title_field=""
):
    """Yields documents (lists of non-empty sentence strings) from `paths`, in order.

    A path may end in @FORMAT to override `fmt` for that file.
    """
    if not paths:
        raise ConfigError("no input files given")
    for _, doc in read_share(plan_shares(paths, 1, fmt, text_field, title_field)[0], stats):
        yield doc


# ------------------------------------------------------------------------- rank shares
@dataclasses.dataclass(frozen=True)
class Share:
    """Byte range [start, end) of one file: a rank reads the documents that *begin* in it (a
    document that begins inside is read to its end, past `end` if need be). end=None: to the end."""

    file_index: int
    path: str
    fmt: str
    start: int = 0
    end: int | None = None
    text_field: str = "text"  # jsonl, parquet, arrow: the field holding a document's text
    # multistream .bz2: offsets of the bz2 streams in [start, end), from the index; parquet /
    # arrow: the numbers of the row groups / record batches
    streams: tuple = ()
    title_field: str = ""  # parquet, arrow: a column whose value becomes the first sentence;
    # wikiextractor: an attribute of the <doc> tag, likewise


TEXT_SAMPLE = 1 << 16  # bytes of a text file looked at before reading it: is it text at all?


def check_text(path):
    """ConfigError when a text input's first TEXT_SAMPLE bytes (uncompressed) are mostly not UTF-8
    lines or hold NUL bytes: a binary file, or Parquet/Arrow given as text, would otherwise become
    instances of noise."""
    try:
        with compressed.open_binary(path) as f:
            sample = f.read(TEXT_SAMPLE)
    except (EOFError, OSError):
        return  # a truncated compressed file: reading it reports that, with its name
    lines = sample.split(b"\n")[:-1] if len(sample) == TEXT_SAMPLE else sample.split(b"\n")
    bad = 0
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    nul = sample.count(b"\0")
    if lines and (bad > len(lines) // 2 or nul > len(sample) // 100):
        hint = (
            " (a Parquet file: name it *.parquet or add @parquet)"
            if sample.startswith(b"PAR1")
            else " (an Arrow file: give its datasets.save_to_disk folder)"
            if b"ARROW1" in sample[:8] or sample[:4] == b"\xff\xff\xff\xff"
            else ""
        )
        raise ConfigError(
            f"{path}: not text: {bad} of the first {len(lines)} lines are not UTF-8 and {nul} of "
            f"the first {len(sample):,} bytes are NUL{hint}"
        )


def plan_shares(specs, size, fmt="auto", text_field="text", title_field=""):
    """Splits the corpus among `size` ranks by bytes: a list of Shares per rank, in corpus order.

    Plain files are cut at byte offsets (aligned to documents when read); a compressed file
    cannot be entered in the middle, so it goes whole to one rank (the one whose byte range its
    first byte falls in): a single large .bz2 is read and split by one rank only. Units that can be
    entered (multistream bz2 streams, Parquet row groups, Arrow record batches) go whole to the rank
    their first byte falls to.
    """
    files = _input_files(specs, fmt)
    units = {
        path: tables.table_units(path, kind, text_field, title_field)
        if kind in TABLES
        else compressed.read_stream_index(path)
        for path, kind, _ in files
        if kind in TABLES or compressed.multistream_index(path)
    }
    total = sum(n for _, _, n in files)
    bounds = [total * r // size for r in range(size + 1)]  # rank r: bytes [bounds[r], bounds[r+1])
    shares = [[] for _ in range(size)]
    offset = 0
    for i, (path, kind, n) in enumerate(files):
        share = functools.partial(
            Share, i, path, kind, text_field=text_field, title_field=title_field
        )
        if path in units:  # whole units to the rank their first byte falls to
            ranges = _unit_ranges(units[path], kind in TABLES, n, offset, bounds)
            for r, start, end, names in ranges:
                shares[r].append(share(start, end, streams=names))
        elif compressed.is_compressed(path) or n == 0:
            owner = max(r for r in range(size) if bounds[r] <= offset) if n else 0
            shares[owner].append(share())
        else:
            for r in range(size):
                lo, hi = max(bounds[r], offset) - offset, min(bounds[r + 1], offset + n) - offset
                if lo < hi:
                    shares[r].append(share(lo, hi if hi < n else None))
        offset += n
    return shares


def _input_files(specs, fmt):
    """(path, format, size in bytes) of each input file, in corpus order: folders expanded
    (`_folder_inputs`, an Arrow folder into its stream files), formats detected, text checked."""
    files = []
    for spec in (expanded for given in specs for expanded in _folder_inputs(given)):
        path, _, own_fmt = spec.partition("@")
        if not os.path.exists(path):
            raise ConfigError(f"input file not found: {path}")
        kind = own_fmt or fmt
        kind = detect_format(path) if kind == "auto" else kind
        if kind not in FORMATS:
            raise ConfigError(
                f"unknown input format {kind!r} for {path}; valid: auto, {', '.join(FORMATS)}"
            )
        if kind == "arrow":
            files += [(f, kind, os.path.getsize(f)) for f in tables.arrow_folder_files(path)]
        elif os.path.isdir(path):
            raise ConfigError(
                f"{path} is a folder; only a datasets.save_to_disk folder (with state.json) is "
                "read as a whole: give its files, or the folder with @arrow"
            )
        else:
            if kind not in TABLES:
                check_text(path)
            files.append((path, kind, os.path.getsize(path)))
    return files


def _unit_ranges(units, tabular, n, offset, bounds):
    """(rank, start, end, unit names) for each rank that gets units of a file of `n` bytes at
    `offset` in the corpus, a unit going whole to the rank its first byte falls to. units: the bz2
    streams' offsets (named by offset), or for tables (offset, row group / record batch number)."""
    offsets = [o for o, _ in units] if tabular else units
    names = [u for _, u in units] if tabular else offsets
    offsets = offsets + [n]
    for r in range(len(bounds) - 1):
        mine = [j for j, o in enumerate(offsets[:-1]) if bounds[r] <= offset + o < bounds[r + 1]]
        if mine:
            yield r, offsets[mine[0]], offsets[mine[-1] + 1], tuple(names[j] for j in mine)


def read_share(shares, stats: ReadStats | None = None):
    """Yields (document key, document) for the documents beginning in `shares`; the key
    (file index, byte offset of the document in its file, or its number in a compressed file)
    names a document independently of how the corpus was split."""
    stats = stats if stats is not None else ReadStats()
    for share in shares:
        stats.files += 1
        reader = {
            "sentences": _sentences_in_range,
            "documents": _lines_in_range,
            "mediawiki": _pages_in_range,
            "jsonl": _json_in_range,
            "parquet": tables.table_rows,
            "arrow": tables.table_rows,
            "wikiextractor": _docs_in_range,
        }[share.fmt]
        for number, (offset, doc) in enumerate(reader(share, stats)):
            doc = [s for s in (s.strip() for s in doc) if s]
            if doc:
                stats.documents += 1
                stats.sentences += len(doc)
                # tables: unit << 32 | row
                named_by_offset = share.streams or not compressed.is_compressed(share.path)
                yield (share.file_index, offset if named_by_offset else number), doc


def _lines_from(share, stats):
    """(byte offset, raw line) from the first line that starts at or after share.start."""
    if share.streams:
        yield from compressed.multistream_lines(share.path, share.streams, share.end, stats)
        return
    with compressed.open_counting(share.path, stats) as f:
        offset = 0
        if share.start:
            f.seek(share.start - 1)
            offset = share.start - 1 + len(f.readline())  # to the next line start
        try:
            for line in f:
                yield offset, line
                offset += len(line)
        except EOFError as e:
            corrupt = str(e).startswith("not valid")  # _ZstdReader: bytes that are not Zstandard
            stats.truncated_files += 1
            stats.problems.append(
                f"{share.path}: compressed data ends after {offset} uncompressed bytes "
                + (f"({e})" if corrupt else "without its end-of-stream marker (truncated?)")
                + "; read up to there"
            )


def _decode(raw, stats):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.bad_bytes_lines += 1
        return raw.decode("utf-8", errors="replace")


def _lines_in_range(share, stats):
    """One document per line: the lines that start in the range."""
    for offset, raw in _lines_from(share, stats):
        if share.end is not None and offset >= share.end:
            return
        line = _decode(raw, stats).rstrip("\r\n")
        if line.strip():
            yield offset, split_sentences(line)


def _json_in_range(share, stats):
    """JSON lines: the text field of each line that starts in the range."""
    import json

    for number, (offset, raw) in enumerate(_lines_from(share, stats)):
        if share.end is not None and offset >= share.end:
            return
        if not raw.strip():
            continue
        where = f"line {number + 1}" if compressed.is_compressed(share.path) else f"byte {offset}"
        try:
            text = json.loads(raw)
        except ValueError as e:
            stats.bad_json_lines += 1
            stats.problems.append(f"{share.path}: {where}: not valid JSON ({e})")
            continue
        text = text.get(share.text_field) if isinstance(text, dict) else None
        if not isinstance(text, str):
            stats.bad_json_lines += 1
            stats.problems.append(f"{share.path}: {where}: no string field {share.text_field!r}")
            continue
        yield offset, split_sentences(text)


def _docs_in_range(share, stats):
    """WikiExtractor: the <doc>s whose `<doc` line starts in the range (rules in
    bert_tf/data/wikiextractor.py)."""
    return wikiextractor.documents_in_range(
        share, _lines_from(share, stats), stats, lambda raw: _decode(raw, stats)
    )


def _previous_line_is_blank(path, line_start):
    """Whether the line before the one starting at `line_start` is blank (or there is none)."""
    if line_start == 0:
        return True
    with open(path, "rb") as f:
        f.seek(max(0, line_start - 4096))
        before = f.read(line_start - max(0, line_start - 4096))
    return not before[:-1].rsplit(b"\n", 1)[-1].strip()


def _sentences_in_range(share, stats):
    """google format: documents (blank-line separated) whose first line starts in the range."""
    doc, doc_start, between = [], None, None
    for offset, raw in _lines_from(share, stats):
        if between is None:  # the first line: does a document start here?
            between = compressed.is_compressed(share.path) or _previous_line_is_blank(
                share.path, offset
            )
        line = _decode(raw, stats).rstrip("\r\n")
        if not line.strip():
            if doc:
                yield doc_start, doc
            doc, between = [], True
            continue
        if between:
            if share.end is not None and offset >= share.end:
                return
            doc_start, between = offset, False
        if doc_start is not None:
            doc.append(line)  # lines before the first blank belong to the previous rank's document
    if doc:
        yield doc_start, doc


def _pages_in_range(share, stats):
    """MediaWiki XML: the <page> elements whose tag starts in the range, each parsed on its own."""
    page, page_start = None, None
    for offset, raw in _lines_from(share, stats):
        at = raw.find(b"<page>")
        if page is None and at >= 0:
            if share.end is not None and not share.streams and offset + at >= share.end:
                return
            page, page_start, raw = [], offset + at, raw[at:]
        if page is None:
            continue
        end = raw.find(b"</page>")
        if end < 0:
            page.append(raw)
            continue
        page.append(raw[: end + len(b"</page>")])
        doc = _page_to_document(b"".join(page), share.path, page_start, stats)
        page = None
        if doc:
            yield page_start, doc
    if page is not None:
        stats.truncated_pages += 1
        stats.problems.append(
            f"{share.path}: byte {page_start}: <page> not closed before the end of the file"
        )


def _page_to_document(xml_bytes, path, offset, stats):
    try:
        elem = ET.fromstring(xml_bytes)
    except ET.ParseError as e:
        stats.bad_pages += 1
        stats.problems.append(f"{path}: byte {offset}: page is not valid XML ({e})")
        return None
    ns = (elem.findtext("ns") or "").strip()
    text = elem.findtext("revision/text") or ""
    redirect = elem.find("redirect") is not None or text.lstrip().lower().startswith("#redirect")
    if ns == "0" and not redirect:
        return wiki_to_sentences(text)
    stats.skipped_pages += 1
    return None
