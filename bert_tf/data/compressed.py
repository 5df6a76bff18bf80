"""Compressed corpus files, read as streams: .gz, .bz2 and .zst (Zstandard, across frames), and the
bz2 streams of a Wikipedia multistream dump, which its index lets ranks share out
(corpus.plan_shares). A file that ends inside a compressed stream raises EOFError when read, like
gzip and bz2 do."""

from __future__ import annotations

import bz2
import gzip
import io
import os

from bert_tf import ConfigError

COMPRESSED = (".gz", ".bz2", ".zst")
READ_BUFFER = (
    1 << 16
)  # bytes read at a time: a rank reads at most this much past its share's last document


def is_compressed(path):
    return path.endswith(COMPRESSED)


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
    """Zstandard frames one after another (zstd -T and pzstd write several), streamed; like gzip and
    bz2, EOFError when the file ends inside a frame (zstandard's own stream reader just stops
    there)."""

    def __init__(self, f):
        import zstandard

        self.f, self.zstd, self.pending = f, zstandard, b""
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.started = False  # bytes of the current frame have been fed

    def readable(self):
        return True

    def readinto(self, b):
        while not self.pending:
            data = self.f.read(READ_BUFFER)
            if not data:
                if self.started:
                    raise EOFError(
                        "compressed file ended before the end-of-stream marker was reached"
                    )
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


def open_counting(path, stats):
    """`path`'s uncompressed bytes, buffered, counting the bytes read from disk in
    stats.bytes_read."""
    return decompressing(
        io.BufferedReader(_CountingReader(open(path, "rb"), stats), READ_BUFFER), path
    )


def multistream_index(path):
    """Wikipedia's index beside a multistream dump (…-multistream.xml.bz2 ->
    …-multistream-index.txt.bz2), or None."""
    if not path.endswith("multistream.xml.bz2"):
        return None
    index = path[: -len(".xml.bz2")] + "-index.txt.bz2"
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
                raise ConfigError(
                    f"{index}: line {number} is not offset:page id:title: {line[:80]!r}"
                )
            offsets.add(int(head))
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        for o in sorted(offsets):
            f.seek(o)
            if o >= size or f.read(3) != b"BZh":
                raise ConfigError(
                    f"{index} does not match {path}: no bz2 stream starts at byte {o}"
                )
    return sorted(offsets)


def multistream_lines(path, streams, end, stats):
    """(offset, raw line) of a multistream dump's bz2 streams that start at `streams` (the last ends
    at `end`), each stream decompressed on its own; offsets are stream offset * 2**32 + offset
    inside the stream (a name, not a position)."""
    bounds = list(streams) + [end]
    with open(path, "rb") as f:
        for start, stop in zip(bounds, bounds[1:]):
            f.seek(start)
            data = f.read(stop - start)
            stats.bytes_read += len(data)
            chunks = []
            while data:  # usually one stream; the last also holds the closing </mediawiki>
                decompressor = bz2.BZ2Decompressor()
                try:
                    chunks.append(decompressor.decompress(data))
                except OSError as e:
                    raise ConfigError(
                        f"{path}: byte {start}: the stream the index names is not valid bz2 ({e})"
                    )
                if not decompressor.eof:
                    raise ConfigError(
                        f"{path}: byte {start}: the stream does not end before the next index "
                        f"offset {stop} (index and dump do not match, or the dump is truncated)"
                    )
                data = decompressor.unused_data
            text = b"".join(chunks)
            inside = 0
            for line in io.BytesIO(text):
                yield start << 32 | inside, line
                inside += len(line)
