"""De-duplication at data creation: exact duplicate documents and repeated lines, over all ranks.

A document is a duplicate when its normalised text (lower case, white space collapsed) equals that
of an earlier document in corpus order (input file order, then position in the file): the first copy
is kept, whatever the rank count. A line (an item the reader yields: a sentence of a google-format
file, a line of a document, a sentence split from a JSON/Parquet text) is boilerplate when its
normalised text occurs at least `min_line_repeats` times in the documents that are kept; every copy
is removed, and a document left without lines is dropped.

Decided before any record is written, by a read-only pass over each rank's share that keeps 8-byte
hashes only (one per document and per line). Hashes go to the rank that owns them (hash mod ranks),
which finds the later copies and sums the line counts, and the answers come back: the decision is a
function of the corpus alone, so a restarted job (or one with another rank count) makes the same
one. Memory per rank: 8 bytes per line and 32 per document of its share, plus what it owns.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np


def normalise(text):
    return " ".join(text.lower().split())


def line_hash(text):
    return int.from_bytes(
        hashlib.blake2b(normalise(text).encode(), digest_size=8).digest(), "little"
    )


class Solo:
    """The collective calls `decide` makes, for one process (mpi4py's COMM_WORLD has the same)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def alltoall(self, items):
        return items

    def allgather(self, item):
        return [item]


@dataclasses.dataclass
class Decisions:
    """What this rank drops: its duplicate documents (by document key) and the boilerplate lines (by
    hash)."""

    duplicate_keys: set
    repeated_lines: set
    min_line_repeats: int = 0

    def apply(self, key, doc):
        """(the document's kept lines, or None if it is dropped; why: '', 'duplicate' or 'emptied';
        lines removed)."""
        if key in self.duplicate_keys:
            return None, "duplicate", 0
        if not self.repeated_lines:
            return doc, "", 0
        kept = [s for s in doc if line_hash(s) not in self.repeated_lines]
        return (kept or None), ("" if kept else "emptied"), len(doc) - len(kept)


def decide(documents, comm=None, documents_too=True, min_line_repeats=0) -> Decisions:
    """Collective over `comm` (every rank calls it with its own (key, lines) documents, in corpus
    order)."""
    comm = comm or Solo()
    size = comm.Get_size()
    keys, doc_hashes, lines, bounds = [], [], [], [0]
    for key, doc in documents:
        hashes = [line_hash(s) for s in doc]
        keys.append(key)
        doc_hashes.append(
            int.from_bytes(
                hashlib.blake2b(np.array(hashes, np.uint64).tobytes(), digest_size=8).digest(),
                "little",
            )
        )
        lines.extend(hashes)
        bounds.append(len(lines))
    duplicate = np.zeros(len(keys), bool)
    if documents_too:
        h = np.array(doc_hashes, np.uint64)
        file_index = np.array([k[0] for k in keys], np.uint64)
        offset = np.array([k[1] for k in keys], np.uint64)
        local = np.arange(len(keys), dtype=np.uint64)
        owner = h % np.uint64(size)
        got = comm.alltoall(
            [tuple(a[owner == r] for a in (h, file_index, offset, local)) for r in range(size)]
        )
        source = np.concatenate([np.full(len(g[0]), r, np.int64) for r, g in enumerate(got)])
        h, file_index, offset, local = (np.concatenate([g[i] for g in got]) for i in range(4))
        order = np.lexsort((offset, file_index, h))  # by hash, then corpus order
        h, source, local = h[order], source[order], local[order]
        later = np.r_[False, h[1:] == h[:-1]]  # a copy with an earlier twin
        back = comm.alltoall([local[later & (source == r)] for r in range(size)])
        duplicate[np.concatenate(back).astype(np.int64)] = True
    repeated = set()
    if min_line_repeats:
        kept = np.array(
            [x for i in np.flatnonzero(~duplicate) for x in lines[bounds[i] : bounds[i + 1]]],
            np.uint64,
        )
        u, c = np.unique(kept, return_counts=True)
        owner = u % np.uint64(size)
        got = comm.alltoall([(u[owner == r], c[owner == r]) for r in range(size)])
        u, inverse = np.unique(np.concatenate([g[0] for g in got]), return_inverse=True)
        totals = np.bincount(
            inverse, weights=np.concatenate([g[1] for g in got]).astype(np.float64)
        )
        for part in comm.allgather(u[totals >= min_line_repeats]):
            repeated.update(int(x) for x in part)
    return Decisions({keys[i] for i in np.flatnonzero(duplicate)}, repeated, min_line_repeats)
