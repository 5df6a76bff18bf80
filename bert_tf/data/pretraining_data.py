"""Pre-training data creation: a rank's share of the corpus read (corpus), tokenised a window of
documents at a time, made into instances (instances) and written as TFRecords (records), part by
part, restartable.

The corpus is cut by bytes into ranks x shards-per-rank parts (`corpus.plan_shares`); rank r makes
parts r*num_shards ... (r+1)*num_shards-1, each into `train-r<rank>-<i>-of-<n>.tfrecord` (and
`eval-...` for held-out documents) plus `part-r<rank>-<i>-of-<n>.json`, its summary with the
shards' SHA-256, written last. Run again with the same arguments, a part whose summary, arguments
and checksums match is skipped; any other part is made again from its start.

A part reads only the documents that begin in its byte ranges and handles them a window of documents
at a time: tokenised together, instances made (random partners drawn from the same window) and
written before the next window is read (part_writer), so memory does not grow with the corpus.

Documents are named by file and byte offset, and an instance's randomness and a document's held-out
membership follow from its document, so for a seed the output is deterministic and N ranks together
write the same instances as one process, except the random-next pairs, whose B segment comes from
the rank's current window of documents (and with it their truncation and masks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np

from bert_tf import ConfigError, sha256
from bert_tf.data import corpus
from bert_tf.data.instances import Counts, InstanceConfig, document_rng
from bert_tf.data.part_writer import PartWriter

# Documents a rank holds at a time (tokenised, with their instances): bounds memory; random-next
# partners are drawn from the same window, as google draws them from all documents of a run.
DOCUMENT_WINDOW = 2000

# What de-duplication left out (bert_tf.data.dedup), per part, rank and in total.
DEDUP_COUNTS = ("duplicate_documents", "documents_emptied", "repeated_lines_removed")


def fingerprint(
    input_files,
    input_format,
    tokenizer,
    config,
    size,
    num_shards,
    heldout_fraction,
    window,
    text_field="text",
    title_field="",
    dedup_documents=False,
    dedup_lines=0,
):
    """What a shard's content depends on: a completed shard is reused only when all of it is
    unchanged."""
    import hashlib

    from bert_tf.data import tables

    inputs = []
    for spec in input_files:
        path = spec.partition("@")[0]
        files = (
            tables.arrow_folder_files(path) if os.path.isdir(path) else [path]
        )  # a save_to_disk folder
        inputs.append([spec, *[(os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]])
    key = {
        "inputs": inputs,
        "format": input_format,
        "config": dataclasses.asdict(config),
        "ranks": size,
        "shards_per_rank": num_shards,
        "heldout_fraction": heldout_fraction,
        "window": window,
        "text_field": text_field,
        "title_field": title_field,
        "dedup_documents": dedup_documents,
        "dedup_lines": dedup_lines,
        "vocab": hashlib.sha256("\n".join(tokenizer.vocab).encode()).hexdigest(),
        "lower_case": tokenizer.lower_case,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def read_completed(part_path, key):
    """The part's summary when it says the part is complete for `key` and its files are intact."""
    try:
        with open(part_path) as f:
            part = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    if part.get("fingerprint") != key:
        return None
    for path, digest in part["sha256"].items():
        if not os.path.exists(path) or sha256(path) != digest:
            return None
    return part


def split_heldout(num_documents, heldout_fraction, seed):
    """Deterministic split of a list of documents (run/learn_vocab.py): a boolean mask, True = held
    out."""
    rng = np.random.RandomState(seed)
    return rng.random_sample(num_documents) < heldout_fraction


def document_seed(key):
    """An int naming a document by (file index, offset), the same whatever the rank count."""
    file_index, offset = key
    return file_index << 64 | offset


def is_heldout(doc_seed, heldout_fraction, seed):
    """Document-level held-out split, seeded per document (independent of the rank count)."""
    return (
        heldout_fraction > 0
        and document_rng(seed, 0, doc_seed, "heldout").random() < heldout_fraction
    )


def _windows(documents, size):
    window = []
    for item in documents:
        window.append(item)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def create_pretraining_data(
    input_files,
    input_format,
    tokenizer,
    output_dir,
    config: InstanceConfig,
    rank=0,
    size=1,
    num_shards=1,
    heldout_fraction=0.0,
    window=DOCUMENT_WINDOW,
    text_field="text",
    title_field="",
    dedup_documents=False,
    dedup_lines=0,
    comm=None,
    log=print,
):
    """Reads, tokenises and writes this rank's share of the corpus, `window` documents at a time, in
    bounded memory, as num_shards parts; restartable (parts and their files: the module docstring).

    With `dedup_documents` or `dedup_lines`, all ranks first agree over `comm` (collective: every
    rank calls this) which documents are later copies and which lines repeat `dedup_lines` times or
    more (`bert_tf.data.dedup`), and those are left out before the held-out split.
    Returns this rank's summary dict.
    """
    start = time.time()
    _check_dedup_lines(dedup_lines)
    os.makedirs(output_dir, exist_ok=True)
    parts = corpus.plan_shares(
        input_files, size * num_shards, input_format, text_field, title_field
    )
    key = fingerprint(
        input_files,
        input_format,
        tokenizer,
        config,
        size,
        num_shards,
        heldout_fraction,
        window,
        text_field,
        title_field,
        dedup_documents,
        dedup_lines,
    )
    summary = _new_summary(rank)
    mine = parts[rank * num_shards : (rank + 1) * num_shards]
    decisions = _dedup_decisions(mine, comm, dedup_documents, dedup_lines, summary)
    create = lambda shares, name: _create_part(
        shares, tokenizer, output_dir, name, config, heldout_fraction, window, decisions
    )
    counts = _make_parts(mine, create, key, output_dir, rank, summary, log)
    return _finish(summary, counts, start, input_files, rank, size)


def _check_dedup_lines(dedup_lines):
    """--dedup_lines is 0 (off) or at least 2: a line seen once is every line."""
    if dedup_lines < 0 or dedup_lines == 1:
        raise ConfigError(
            f"--dedup_lines={dedup_lines} would remove every line"
            if dedup_lines == 1
            else f"--dedup_lines must be 0 (off) or >= 2, got {dedup_lines}"
        )


def _new_summary(rank):
    """A rank's summary before its parts are added (`_add_part`)."""
    return {
        "rank": rank,
        "shares": [],
        "documents": 0,
        "sentences": 0,
        "tokens": 0,
        "unk": 0,
        "bad_bytes_lines": 0,
        "bytes_read": 0,
        "skipped_pages": 0,
        "problems": [],
        "files": {},
        "parts_reused": 0,
        **{k: 0 for k in DEDUP_COUNTS},
    }


def _dedup_decisions(mine, comm, dedup_documents, dedup_lines, summary):
    """What de-duplication leaves out of the corpus, agreed by all ranks over `comm` (collective),
    with its time and the number of repeated lines in `summary`; None when it is off."""
    if not (dedup_documents or dedup_lines):
        return None
    from bert_tf.data import dedup

    t = time.time()
    decisions = dedup.decide(
        corpus.read_share([sh for part in mine for sh in part], corpus.ReadStats()),
        comm,
        dedup_documents,
        dedup_lines,
    )
    summary["dedup_seconds"] = time.time() - t
    summary["distinct_repeated_lines"] = len(decisions.repeated_lines)
    return decisions


def _make_parts(mine, create, key, output_dir, rank, summary, log):
    """This rank's parts, each reused when complete (`read_completed`), else made by
    `create(shares, name)` and its summary written; their totals added to `summary`. -> the splits'
    Counts over the parts."""
    counts = {}
    for i, shares in enumerate(mine):
        name = f"r{rank:03d}-{i:04d}-of-{len(mine):04d}"
        part = read_completed(os.path.join(output_dir, f"part-{name}.json"), key)
        if part is not None:
            summary["parts_reused"] += 1
            log(f"rank {rank}: part {name} complete (summary and checksums match), skipped")
        else:
            part = create(shares, name)
            _write_part_summary(part, os.path.join(output_dir, f"part-{name}.json"), key)
        _add_part(summary, counts, part)
    return counts


def _write_part_summary(part, part_path, key):
    """The part's summary with its fingerprint and the shards' checksums, written last: the part
    counts as done only once it is there."""
    part["fingerprint"] = key
    part["sha256"] = {path: sha256(path) for path in part["files"].values()}
    tmp = part_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(part, f, indent=1)
    os.replace(tmp, part_path)


def _add_part(summary, counts, part):
    """Adds a part's totals to the rank's summary and its splits' Counts to `counts`."""
    for k in (
        "documents",
        "sentences",
        "tokens",
        "unk",
        "bad_bytes_lines",
        "bytes_read",
        "skipped_pages",
        *DEDUP_COUNTS,
    ):
        summary[k] += part.get(k, 0)
    summary["shares"] += part["shares"]
    summary["problems"] += part["problems"]
    for split, path in part["files"].items():
        summary["files"].setdefault(split, []).append(path)
        c = counts.setdefault(split, Counts())
        for field, value in part[split].items():
            setattr(c, field, getattr(c, field) + value)


def _finish(summary, counts, start, input_files, rank, size):
    """The rank's summary completed: per-split counts, UNK rate, time; an empty corpus is an
    error."""
    for split, c in counts.items():
        summary[split] = dataclasses.asdict(c)
    summary["unk_rate"] = summary.pop("unk") / max(summary["tokens"], 1)
    summary["seconds"] = time.time() - start
    if not summary["documents"] and size == 1:
        raise ConfigError(f"no text found in {', '.join(input_files)} (empty corpus?)")
    # with several ranks, an error only if no rank found any (the caller's check)
    if not summary["documents"]:
        summary["problems"].append(
            f"rank {rank}: no document begins in its share "
            f"({'more ranks than documents' if summary['shares'] else 'no bytes assigned'})"
        )
    return summary


def _create_part(
    shares, tokenizer, output_dir, name, config, heldout_fraction, window, decisions=None
):
    """One part: the documents beginning in `shares` -> train/eval shards named by `name`."""
    stats = corpus.ReadStats()
    part = {
        "shares": [[sh.path, sh.start, sh.end] for sh in shares],
        "documents": 0,
        "sentences": 0,
        "tokens": 0,
        "unk": 0,
        "files": {},
        **{k: 0 for k in DEDUP_COUNTS},
    }
    writer = PartWriter(tokenizer, output_dir, name, config)
    try:
        for docs in _windows(_kept(corpus.read_share(shares, stats), decisions, part), window):
            pools = _tokenized_pools(docs, tokenizer, part, heldout_fraction, config.random_seed)
            for split, members in pools.items():
                if members:
                    writer.add(split, members)
        writer.flush()
    except BaseException:
        writer.abort()
        raise
    writer.close(part)
    part.update(
        bad_bytes_lines=stats.bad_bytes_lines,
        bytes_read=stats.bytes_read,
        skipped_pages=stats.skipped_pages,
        problems=stats.problems,
    )
    return part


def _kept(documents, decisions, part):
    """The (key, document)s de-duplication keeps (all without `decisions`), counting what it leaves
    out."""
    for key, doc in documents:
        if decisions is not None:
            doc, why, removed = decisions.apply(key, doc)
            part["repeated_lines_removed"] += removed
            if why:
                part["duplicate_documents" if why == "duplicate" else "documents_emptied"] += 1
                continue
        yield key, doc


def _tokenized_pools(docs, tokenizer, part, heldout_fraction, seed):
    """A window's documents tokenised in one batch, then regrouped by document and split:
    {"train": [(document seed, token-id lists)], "eval": [...]}; the part's counts updated."""
    flat = tokenizer.tokenize([s for _, d in docs for s in d])
    pools, k = {"train": [], "eval": []}, 0
    for key, d in docs:
        tokens = [t for t in flat[k : k + len(d)] if t]
        k += len(d)
        part["documents"] += 1
        part["sentences"] += len(d)
        part["tokens"] += sum(len(t) for t in tokens)
        part["unk"] += sum(t.count(tokenizer.unk_id) for t in tokens)
        doc_seed = document_seed(key)
        pools["eval" if is_heldout(doc_seed, heldout_fraction, seed) else "train"].append(
            (doc_seed, tokens)
        )
    return pools


def summarize(summaries, max_seq_length=None):
    """Totals over ranks and the derived rates printed at the end of creation (with max_seq_length,
    the fraction of the rows' token slots that is padding)."""
    total = {
        k: sum(s.get(k, 0) for s in summaries)
        for k in ("documents", "sentences", "tokens", "bad_bytes_lines", *DEDUP_COUNTS)
    }
    if "distinct_repeated_lines" in summaries[0]:
        # the same set on every rank
        total["distinct_repeated_lines"] = summaries[0]["distinct_repeated_lines"]
    total["unk_rate"] = sum(s["unk_rate"] * s["tokens"] for s in summaries) / max(
        total["tokens"], 1
    )
    total["seconds"] = max(s["seconds"] for s in summaries)
    for split in ("train", "eval"):
        parts = [s[split] for s in summaries if split in s]
        if not parts:
            continue
        c = {k: sum(p[k] for p in parts) for k in parts[0]}
        c["mean_masked_fraction"] = c["masked"] / max(c["maskable"], 1)
        c["nsp_random_fraction"] = c["random_next"] / max(c["instances"], 1)
        c["instances_per_row"] = c["instances"] / max(c["rows"], 1)
        if max_seq_length:
            c["padding_fraction"] = 1 - c["tokens"] / max(c["rows"] * max_seq_length, 1)
        c["instances_per_second"] = c["instances"] / max(total["seconds"], 1e-9)
        total[split] = c
    total["per_rank_instances_per_second"] = [
        sum(s[k]["instances"] for k in ("train", "eval") if k in s) / max(s["seconds"], 1e-9)
        for s in summaries
    ]
    return total
