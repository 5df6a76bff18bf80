"""Streaming corpus readers: documents as lists of sentences.

Formats (`FORMATS`):
  sentences  google-research/bert: one sentence per line, a blank line between documents
  documents  one document per line (split into sentences here)
  mediawiki  a MediaWiki XML dump: article text with the markup stripped
  jsonl      JSON lines, one document per line: {"text": ...} (the field is `text_field`)
  parquet    Parquet (Hugging Face datasets' shards, e.g. wikimedia/wikipedia): a row per document, its
             text in column `text_field`, optionally a title in `title_field` (the document's first sentence)
  arrow      a `datasets.save_to_disk` folder (state.json and its Arrow stream files), columns as parquet

`auto` picks parquet for *.parquet files, arrow for a folder with state.json, mediawiki for files that
start with a <mediawiki> element, jsonl for files that start with "{" or are named *.jsonl / *.json
(before .gz/.bz2/.zst), else sentences.

Text files may be plain, .gz, .bz2 or .zst (Zstandard, streamed across frames). Bytes that are not
UTF-8 are replaced by U+FFFD and counted in `ReadStats.bad_bytes_lines`, never fatal. Nothing loads
a whole file: Parquet is read a row group at a time, Arrow a record batch at a time (memory-mapped).

Ranks split the corpus by bytes (`plan_shares`): a rank reads only the documents that begin
in its byte ranges (after a blank line for google format, at a line start for one document
per line, at `<page>` for MediaWiki XML), reading at most READ_BUFFER bytes beyond its last
document; a compressed file is read whole by one rank, except a Wikipedia multistream dump
with its index beside it (`multistream_index`), whose bz2 streams are shared out; Parquet row groups
and Arrow record batches are shared out the same way, whole, to the rank their first byte falls to. A document is
named by its file and byte offset (in a compressed file read whole, by its number in the file;
`read_share`), whatever the rank count.

Sentence splitting rules (`split_sentences`), for text that is not split already:
  a sentence ends at '.', '!' or '?' (plus closing quotes/brackets) followed by white space
  and then an upper-case letter or a digit, optionally behind an opening quote/bracket; a single
  '.' does not end one after a known abbreviation (Mr., Dr., e.g., U.S., No., ...), a single
  capital initial ("J. Smith") or a dotted abbreviation ("i.e.", "U.S.A."). A decimal point is
  never a boundary (no white space follows it). Line breaks in the source are treated as
  spaces, and blank lines always end a sentence (paragraphs).
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

FORMATS = ("sentences", "documents", "mediawiki", "jsonl", "parquet", "arrow")
TABLES = ("parquet", "arrow")           # columnar formats: a row per document, shared by row group / batch
COMPRESSED = (".gz", ".bz2", ".zst")
READ_BUFFER = 1 << 16   # bytes read at a time: a rank reads at most this much past its share's last document


@dataclasses.dataclass
class ReadStats:
    files: int = 0
    documents: int = 0
    sentences: int = 0
    bad_bytes_lines: int = 0    # lines with bytes that were not UTF-8 (replaced)
    skipped_pages: int = 0      # MediaWiki: redirects and non-article namespaces
    bytes_read: int = 0         # bytes read from the files (compressed size for compressed files)
    truncated_pages: int = 0    # MediaWiki: a <page> the file ends inside
    bad_pages: int = 0          # MediaWiki: a <page> that is not valid XML
    bad_json_lines: int = 0     # JSON lines: not JSON, or without a string in the text field
    bad_rows: int = 0           # Parquet/Arrow: a row whose text is not a string (null)
    truncated_files: int = 0    # compressed files that end before their end-of-stream marker
    problems: list = dataclasses.field(default_factory=list)   # "file: byte N: what" for each skipped item


def decompressing(f, path):
    """A binary file object -> one that yields `path`'s uncompressed bytes (by its suffix)."""
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=f, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(f, "rb")
    if path.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(f), READ_BUFFER)
    return f


class _ZstdReader(io.RawIOBase):
    """Zstandard frames one after another (zstd -T and pzstd write several), streamed; like gzip and bz2,
    EOFError when the file ends inside a frame (zstandard's own stream reader just stops there)."""

    def __init__(self, f):
        import zstandard
        self.f, self.zstd, self.pending = f, zstandard, b""
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.started = False        # bytes of the current frame have been fed

    def readable(self):
        return True

    def readinto(self, b):
        while not self.pending:
            data = self.f.read(READ_BUFFER)
            if not data:
                if self.started:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                return 0
            while data:
                try:
                    self.pending += self.frame.decompress(data)
                except self.zstd.ZstdError as e:
                    raise EOFError(f"not valid Zstandard data ({e})")
                self.started = not self.frame.eof
                data = self.frame.unused_data if self.frame.eof else b""
                if self.frame.eof:
                    self.frame = self.zstd.ZstdDecompressor().decompressobj()
        n = min(len(b), len(self.pending))
        b[:n], self.pending = self.pending[:n], self.pending[n:]
        return n

    def close(self):
        self.f.close()
        super().close()


def open_binary(path):
    return decompressing(open(path, "rb"), path)


def detect_format(path):
    """parquet (*.parquet), arrow (a save_to_disk folder), mediawiki when the file starts with a <mediawiki>
    element, jsonl for JSON lines, else sentences."""
    if os.path.isdir(path):
        return "arrow"
    if path.endswith(".parquet"):
        return "parquet"
    with open_binary(path) as f:
        try:
            head = f.read(4096).lstrip()
        except (EOFError, OSError):   # a truncated compressed file: reading it says so, with the file's name
            head = b""
    if head.startswith(b"<mediawiki") or b"<mediawiki " in head[:200]:
        return "mediawiki"
    stem = next((path[:-len(c)] for c in COMPRESSED if path.endswith(c)), path)
    return "jsonl" if head.startswith(b"{") or stem.endswith((".jsonl", ".json")) else "sentences"


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


def read_documents(paths, fmt="auto", stats: ReadStats | None = None, text_field="text", title_field=""):
    """Yields documents (lists of non-empty sentence strings) from `paths`, in order.

    A path may end in @FORMAT to override `fmt` for that file.
    """
    if not paths:
        raise ConfigError("no input files given")
    for _, doc in read_share(plan_shares(paths, 1, fmt, text_field, title_field)[0], stats):
        yield doc


# ------------------------------------------------------------------------- rank shares
def is_compressed(path):
    return path.endswith(COMPRESSED)


@dataclasses.dataclass(frozen=True)
class Share:
    """Byte range [start, end) of one file: a rank reads the documents that *begin* in it (a
    document that begins inside is read to its end, past `end` if need be). end=None: to the end."""
    file_index: int
    path: str
    fmt: str
    start: int = 0
    end: int | None = None
    text_field: str = "text"       # jsonl, parquet, arrow: the field holding a document's text
    streams: tuple = ()            # multistream .bz2: offsets of the bz2 streams in [start, end), from the index;
                                   # parquet / arrow: the numbers of the row groups / record batches
    title_field: str = ""          # parquet, arrow: a column whose value becomes the first sentence


TEXT_SAMPLE = 1 << 16      # bytes of a text file looked at before reading it: is it text at all?


def check_text(path):
    """ConfigError when a text input's first TEXT_SAMPLE bytes (uncompressed) are mostly not UTF-8 lines or
    hold NUL bytes: a binary file, or Parquet/Arrow given as text, would otherwise become instances of noise."""
    try:
        with open_binary(path) as f:
            sample = f.read(TEXT_SAMPLE)
    except (EOFError, OSError):
        return                     # a truncated compressed file: reading it reports that, with its name
    lines = sample.split(b"\n")[:-1] if len(sample) == TEXT_SAMPLE else sample.split(b"\n")
    bad = 0
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    nul = sample.count(b"\0")
    if lines and (bad > len(lines) // 2 or nul > len(sample) // 100):
        hint = (" (a Parquet file: name it *.parquet or add @parquet)" if sample.startswith(b"PAR1") else
                " (an Arrow file: give its datasets.save_to_disk folder)" if b"ARROW1" in sample[:8] or
                sample[:4] == b"\xff\xff\xff\xff" else "")
        raise ConfigError(f"{path}: not text: {bad} of the first {len(lines)} lines are not UTF-8 and {nul} of "
                          f"the first {len(sample):,} bytes are NUL{hint}")


def plan_shares(specs, size, fmt="auto", text_field="text", title_field=""):
    """Splits the corpus among `size` ranks by bytes: a list of Shares per rank, in corpus order.

    Plain files are cut at byte offsets (aligned to documents when read); a compressed file
    cannot be entered in the middle, so it goes whole to one rank (the one whose byte range its
    first byte falls in): a single large .bz2 is read and split by one rank only. Units that can be
    entered (multistream bz2 streams, Parquet row groups, Arrow record batches) go whole to the rank
    their first byte falls to.
    """
    files = []
    for spec in specs:
        path, _, own_fmt = spec.partition("@")
        if not os.path.exists(path):
            raise ConfigError(f"input file not found: {path}")
        kind = own_fmt or fmt
        kind = detect_format(path) if kind == "auto" else kind
        if kind not in FORMATS:
            raise ConfigError(f"unknown input format {kind!r} for {path}; valid: auto, {', '.join(FORMATS)}")
        if kind == "arrow":
            files += [(f, kind, os.path.getsize(f)) for f in arrow_folder_files(path)]
        elif os.path.isdir(path):
            raise ConfigError(f"{path} is a folder; only a datasets.save_to_disk folder (with state.json) is read "
                              f"as a whole: give its files, or the folder with @arrow")
        else:
            if kind not in TABLES:
                check_text(path)
            files.append((path, kind, os.path.getsize(path)))
    units = {path: table_units(path, kind, text_field, title_field) if kind in TABLES else read_stream_index(path)
             for path, kind, _ in files if kind in TABLES or multistream_index(path)}
    total = sum(n for _, _, n in files)
    bounds = [total * r // size for r in range(size + 1)]      # rank r owns global bytes [bounds[r], bounds[r+1])
    shares = [[] for _ in range(size)]
    offset = 0
    for i, (path, kind, n) in enumerate(files):
        if path in units:          # whole units to the rank their first byte falls to
            offsets = [o for o, _ in units[path]] if kind in TABLES else units[path]
            names = [u for _, u in units[path]] if kind in TABLES else offsets
            offsets = offsets + [n]
            for r in range(size):
                mine = [j for j, o in enumerate(offsets[:-1]) if bounds[r] <= offset + o < bounds[r + 1]]
                if mine:
                    shares[r].append(Share(i, path, kind, offsets[mine[0]], offsets[mine[-1] + 1], text_field,
                                           tuple(names[j] for j in mine), title_field))
        elif is_compressed(path) or n == 0:
            owner = max(r for r in range(size) if bounds[r] <= offset) if n else 0
            shares[owner].append(Share(i, path, kind, text_field=text_field))
        else:
            for r in range(size):
                lo, hi = max(bounds[r], offset) - offset, min(bounds[r + 1], offset + n) - offset
                if lo < hi:
                    shares[r].append(Share(i, path, kind, lo, hi if hi < n else None, text_field))
        offset += n
    return shares


def read_share(shares, stats: ReadStats | None = None):
    """Yields (document key, document) for the documents beginning in `shares`; the key
    (file index, byte offset of the document in its file, or its number in a compressed file)
    names a document independently of how the corpus was split."""
    stats = stats if stats is not None else ReadStats()
    for share in shares:
        stats.files += 1
        reader = {"sentences": _sentences_in_range, "documents": _lines_in_range, "mediawiki": _pages_in_range,
                  "jsonl": _json_in_range, "parquet": _table_rows, "arrow": _table_rows}[share.fmt]
        for number, (offset, doc) in enumerate(reader(share, stats)):
            doc = [s for s in (s.strip() for s in doc) if s]
            if doc:
                stats.documents += 1
                stats.sentences += len(doc)
                named_by_offset = share.streams or not is_compressed(share.path)   # tables: unit << 32 | row
                yield (share.file_index, offset if named_by_offset else number), doc


class _CountingReader(io.RawIOBase):
    """Counts the bytes read from a file (ReadStats.bytes_read: what a rank really read)."""

    def __init__(self, f, stats):
        self.f, self.stats = f, stats

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.f.seek(offset, whence)

    def tell(self):
        return self.f.tell()

    def readinto(self, b):
        n = self.f.readinto(b)
        self.stats.bytes_read += n or 0
        return n

    def close(self):
        self.f.close()
        super().close()


# ------------------------------------------------------------------------- Parquet and Arrow
def arrow_folder_files(folder):
    """The Arrow stream files of a `datasets.save_to_disk` folder, from its state.json."""
    import json
    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        hint = (" (a DatasetDict: give one split's folder, e.g. train/)"
                if os.path.isfile(os.path.join(folder, "dataset_dict.json")) else "")
        raise ConfigError(f"{folder}: no state.json: not a datasets.save_to_disk folder{hint}")
    try:
        with open(state) as f:
            files = [os.path.join(folder, entry["filename"]) for entry in json.load(f)["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{state}: not the layout datasets.save_to_disk writes (a list '_data_files' of "
                          f"{{'filename': ...}}; another datasets version?): {e!r}")
    for path in files:
        if not os.path.isfile(path):
            raise ConfigError(f"{state} names {path}, which does not exist")
    return files


def _open_table(path, kind):
    """(pyarrow reader, memory map or None) for a Parquet file or an Arrow stream file; errors name the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        if kind == "parquet":
            return pq.ParquetFile(path), None
        mapped = pa.memory_map(path)
        return pa.ipc.open_stream(mapped), mapped
    except (pa.ArrowException, OSError) as e:
        what = "Parquet" if kind == "parquet" else "an Arrow stream (datasets.save_to_disk)"
        raise ConfigError(f"{path}: not a readable {what} file (corrupt or truncated?): {e}")


def _check_columns(path, schema, text_field, title_field):
    import pyarrow as pa
    for field in filter(None, (text_field, title_field)):
        if field not in schema.names:
            raise ConfigError(f"{path}: no column {field!r} (--text_field/--title_field); its columns: "
                              f"{', '.join(schema.names)}")
        if not (pa.types.is_string(schema.field(field).type) or pa.types.is_large_string(schema.field(field).type)):
            raise ConfigError(f"{path}: column {field!r} holds {schema.field(field).type}, not text")


def table_units(path, kind, text_field, title_field):
    """[(byte offset, unit number)]: a Parquet file's row groups (offset of its first column chunk) or an
    Arrow stream's record batches (offset in the memory-mapped file), after checking the columns."""
    import pyarrow as pa
    reader, mapped = _open_table(path, kind)
    _check_columns(path, reader.schema_arrow if kind == "parquet" else reader.schema, text_field, title_field)
    if kind == "parquet":
        meta = reader.metadata
        return [(min(c.dictionary_page_offset or c.data_page_offset for c in
                     (meta.row_group(g).column(k) for k in range(meta.num_columns))), g)
                for g in range(meta.num_row_groups) if meta.row_group(g).num_rows]
    units, offset = [], mapped.tell()
    while True:
        try:
            reader.read_next_batch()
        except StopIteration:
            return units
        except pa.ArrowException as e:
            raise ConfigError(f"{path}: the Arrow stream breaks off in record batch {len(units)} (truncated?): {e}")
        units.append((offset, len(units)))
        offset = mapped.tell()


def _table_rows(share, stats):
    """(unit << 32 | row, sentences) for the rows of the share's row groups / record batches."""
    reader, _ = _open_table(share.path, share.fmt)
    columns = [c for c in (share.text_field, share.title_field) if c]
    stats.bytes_read += share.end - share.start
    if share.fmt == "parquet":
        batches = ((g, reader.read_row_group(g, columns=columns)) for g in share.streams)
    else:
        wanted = set(share.streams)
        batches = ((number, batch) for number, batch in enumerate(reader) if number in wanted)
    for unit, table in batches:
        texts = table.column(share.text_field).to_pylist()
        titles = table.column(share.title_field).to_pylist() if share.title_field else [None] * len(texts)
        for row, (text, title) in enumerate(zip(texts, titles)):
            if not isinstance(text, str):
                stats.bad_rows += 1
                stats.problems.append(f"{share.path}: row {row} of {'row group' if share.fmt == 'parquet' else 'record batch'} "
                                      f"{unit}: {share.text_field!r} is {text!r}, not text; skipped")
                continue
            yield unit << 32 | row, ([title] if title else []) + split_sentences(text)


def multistream_index(path):
    """Wikipedia's index beside a multistream dump (…-multistream.xml.bz2 -> …-multistream-index.txt.bz2), or None."""
    if not path.endswith("multistream.xml.bz2"):
        return None
    index = path[:-len(".xml.bz2")] + "-index.txt.bz2"
    return index if os.path.isfile(index) else None


def read_stream_index(path):
    """Sorted offsets of the bz2 streams of a multistream dump, from its index (offset:page id:title
    lines); the first stream (the <siteinfo> header) is at 0. A mismatch is an error: reading
    with wrong offsets would be wrong."""
    index = multistream_index(path)
    offsets = {0}
    with bz2.open(index, "rb") as f:
        for number, line in enumerate(f, 1):
            head = line.split(b":", 1)[0]
            if not head.strip().isdigit():
                raise ConfigError(f"{index}: line {number} is not offset:page id:title: {line[:80]!r}")
            offsets.add(int(head))
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        for o in sorted(offsets):
            f.seek(o)
            if o >= size or f.read(3) != b"BZh":
                raise ConfigError(f"{index} does not match {path}: no bz2 stream starts at byte {o}")
    return sorted(offsets)


def _stream_lines(share, stats):
    """(offset, raw line) of the pages in a multistream share: each stream decompressed on its own;
    offsets are stream offset * 2**32 + offset inside the stream (a name, not a position)."""
    bounds = list(share.streams) + [share.end]
    with open(share.path, "rb") as f:
        for start, end in zip(bounds, bounds[1:]):
            f.seek(start)
            data = f.read(end - start)
            stats.bytes_read += len(data)
            chunks = []
            while data:                    # usually one stream; the last also holds the closing </mediawiki>
                decompressor = bz2.BZ2Decompressor()
                try:
                    chunks.append(decompressor.decompress(data))
                except OSError as e:
                    raise ConfigError(f"{share.path}: byte {start}: the stream the index names is not valid bz2 ({e})")
                if not decompressor.eof:
                    raise ConfigError(f"{share.path}: byte {start}: the stream does not end before the next index "
                                      f"offset {end} (index and dump do not match, or the dump is truncated)")
                data = decompressor.unused_data
            text = b"".join(chunks)
            inside = 0
            for line in io.BytesIO(text):
                yield start << 32 | inside, line
                inside += len(line)


def _lines_from(share, stats):
    """(byte offset, raw line) from the first line that starts at or after share.start."""
    if share.streams:
        yield from _stream_lines(share, stats)
        return
    f = decompressing(io.BufferedReader(_CountingReader(open(share.path, "rb"), stats), READ_BUFFER), share.path)
    with f:
        offset = 0
        if share.start:
            f.seek(share.start - 1)
            offset = share.start - 1 + len(f.readline())       # to the next line start
        try:
            for line in f:
                yield offset, line
                offset += len(line)
        except EOFError as e:
            corrupt = str(e).startswith("not valid")          # _ZstdReader: bytes that are not Zstandard
            stats.truncated_files += 1
            stats.problems.append(f"{share.path}: compressed data ends after {offset} uncompressed bytes "
                                  + (f"({e})" if corrupt else "without its end-of-stream marker (truncated?)")
                                  + "; read up to there")


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
        where = f"line {number + 1}" if is_compressed(share.path) else f"byte {offset}"
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
        if between is None:       # the first line: does a document start here?
            between = is_compressed(share.path) or _previous_line_is_blank(share.path, offset)
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
            doc.append(line)      # lines before the first blank belong to the previous rank's document
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
        page.append(raw[:end + len(b"</page>")])
        doc = _page_to_document(b"".join(page), share.path, page_start, stats)
        page = None
        if doc:
            yield page_start, doc
    if page is not None:
        stats.truncated_pages += 1
        stats.problems.append(f"{share.path}: byte {page_start}: <page> not closed before the end of the file")


def _page_to_document(xml_bytes, path, offset, stats):
    try:
        elem = ET.fromstring(xml_bytes)
    except ET.ParseError as e:
        stats.bad_pages += 1
        stats.problems.append(f"{path}: byte {offset}: page is not valid XML ({e})")
        return None
    ns = (elem.findtext("ns") or "").strip()
    text = elem.findtext("revision/text") or ""
    if ns == "0" and elem.find("redirect") is None and not text.lstrip().lower().startswith("#redirect"):
        return wiki_to_sentences(text)
    stats.skipped_pages += 1
    return None


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


MARKUP = ("{{", "}}", "[[", "]]", "|", "<ref", "&lt;", "&gt;", "&amp;")


def markup_fraction(sentences):
    """Fraction of sentences that still contain a MediaWiki markup string (MARKUP): how well
    strip_wiki_markup cleans real articles."""
    sentences = list(sentences)
    return sum(any(m in s for m in MARKUP) for s in sentences) / max(len(sentences), 1)
