"""Corpus readers, vocabulary, tokenisation, instance creation, TFRecords and the input pipeline."""
import bz2
import collections
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import time
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.data import (compressed, corpus, input_pipeline, instances as ins, part_writer, pretraining_data as pd,
                          records as rec, sentences, tokenization)
from bert_tf.train import preflight
from bert_tf.train import pretrain_config
from conftest import REPO, mpi_env, mpirun

WIKI = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


# ----------------------------------------------------------------------------- readers
def test_mediawiki_reader_strips_markup(corpus_dir):
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(corpus_dir / WIKI)], "auto", stats))
    text = "\n".join(s for d in docs for s in d)
    assert stats.documents == len(docs) > 100
    assert stats.skipped_pages > 0                       # redirects
    for markup in ("{{", "}}", "[[", "]]", "<ref", "&lt;ref", "File:", "Category:"):
        assert markup not in text, markup
    assert not any(s.lstrip().startswith(("|", "!", "{|")) for d in docs for s in d)
    assert any(s == "Early life" for d in docs for s in d)  # headings kept as their own sentence


def test_wiki_markup_cases():
    wikitext = ("'''Anarchism''' is a [[political philosophy]]<ref>cite</ref> that [[State (polity)|states]] "
                "{{cite|x={{nested}}}} are harmful.\n{| class=wikitable\n|-\n| cell\n|}\n"
                "[[File:A.jpg|thumb|A [[caption]] here]]\n== History ==\nIt began in [http://x.org France].")
    assert sentences.wiki_to_sentences(wikitext) == [
        "Anarchism is a political philosophy that states are harmful.", "History", "It began in France."]


def test_sentence_splitter_rules():
    text = ("Mr. Smith paid $3.50 at 5 p.m. on Monday. J. R. Tolkien wrote it! "
            "\"Is it?\" she asked. The U.S. Army won.\n\nA new paragraph")
    assert sentences.split_sentences(text) == [
        "Mr. Smith paid $3.50 at 5 p.m. on Monday.", "J. R. Tolkien wrote it!", "\"Is it?\" she asked.",
        "The U.S. Army won.", "A new paragraph"]


def test_google_format_gzip_and_bad_bytes(tmp_path):
    path = tmp_path / "c.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"First sentence.\nSecond \xff\xfe one.\n\nOther document.\n")
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(path)], "sentences", stats))
    assert docs == [["First sentence.", "Second \ufffd\ufffd one."], ["Other document."]]
    assert stats.bad_bytes_lines == 1


def test_document_per_line_and_per_file_format(tmp_path):
    path = tmp_path / "docs.bz2"
    path.write_bytes(bz2.compress(b"One doc. Two sentences.\nAnother doc here.\n"))
    docs = list(corpus.read_documents([str(path) + "@documents"]))
    assert docs == [["One doc.", "Two sentences."], ["Another doc here."]]


def test_json_lines_plain_gz_bz2_with_a_field_flag_and_bad_lines_reported(tmp_path):
    lines = [json.dumps({"body": "First doc. It has two sentences.", "id": 1}),
             "{not json",
             json.dumps({"title": "no body"}),
             json.dumps({"body": "Second doc here. And more text!"})]
    data = ("\n".join(lines) + "\n").encode()
    for name, opener in (("c.jsonl", open), ("c.jsonl.gz", gzip.open), ("c.jsonl.bz2", bz2.open)):
        with opener(tmp_path / name, "wb") as f:
            f.write(data)
        stats = corpus.ReadStats()
        docs = list(corpus.read_documents([str(tmp_path / name)], "auto", stats, text_field="body"))
        assert docs == [["First doc.", "It has two sentences."], ["Second doc here.", "And more text!"]]
        assert stats.bad_json_lines == 2
        at = (f"byte {len(lines[0]) + 1}", f"byte {len(lines[0]) + len(lines[1]) + 2}") if name == "c.jsonl" \
            else ("line 2", "line 3")
        assert stats.problems[0].startswith(f"{tmp_path / name}: {at[0]}: not valid JSON")
        assert stats.problems[1] == f"{tmp_path / name}: {at[1]}: no string field 'body'"
    # a .bz2 cut short: what it holds is read, the cut is reported with the file's name
    many = "".join(json.dumps({"body": f"Document {i} is about {i * 7919 % 100003} things."}) + "\n"
                   for i in range(60000)).encode()                # > 2 bz2 blocks of 900 kB
    whole = bz2.compress(many)
    (tmp_path / "cut.jsonl.bz2").write_bytes(whole[:len(whole) * 2 // 3])
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(tmp_path / "cut.jsonl.bz2")], "jsonl", stats, text_field="body"))
    assert 0 < len(docs) < 60000 and stats.truncated_files == 1
    assert stats.problems[-1].startswith(f"{tmp_path / 'cut.jsonl.bz2'}: compressed data ends after ")


def test_more_ranks_than_documents_leaves_a_rank_an_empty_share_reported(tmp_path, vocab_file):
    (tmp_path / "two.txt").write_text("One document here.\nAnother document there.\n")
    tok = tokenization.Tokenizer.from_file(vocab_file)
    config = ins.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    summaries = [pd.create_pretraining_data([str(tmp_path / "two.txt")], "documents", tok, str(tmp_path / "out"),
                                            config, rank=r, size=8) for r in range(8)]
    assert sum(s["documents"] for s in summaries) == 2
    empty = [s for s in summaries if not s["documents"]]
    assert len(empty) == 6 and all(s["problems"][-1].startswith(f"rank {s['rank']}: no document begins in its "
                                                                f"share") for s in empty)


def test_cleaned_wikipedia_sentences_are_almost_free_of_markup(corpus_dir):
    docs = corpus.read_documents([str(corpus_dir / "enwiki-latest-pages-articles1.xml-p000000010p000030302-"
                                                    "shortened.bz2")])
    from bert_tf.data.sentences import markup_fraction
    sentences = [s for d in docs for s in d]
    assert len(sentences) > 20000
    fraction = markup_fraction(sentences)
    print(f"sentences with markup: {fraction:.5f} of {len(sentences)}")
    assert fraction < 0.0005        # measured 3 of 22,831 ('|' in quoted text and one broken link)


def test_multistream_dump_shares_its_streams_and_a_wrong_index_stops_with_a_clear_error(tmp_path, corpus_dir):
    data = bz2.decompress((corpus_dir / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
                          .read_bytes())
    starts = [m.start() for m in re.finditer(b"<page>", data)]
    end = data.rindex(b"</page>") + len(b"</page>\n")
    pieces = [data[:starts[0]]] + [data[a:b] for a, b in zip(starts[::10], starts[10::10] + [end])] + [data[end:]]
    dump, index = tmp_path / "x-multistream.xml.bz2", []
    with open(dump, "wb") as f:
        for n, piece in enumerate(pieces):       # Wikipedia's layout: header, streams of pages, footer
            if 0 < n < len(pieces) - 1:
                index.append(f"{f.tell()}:{n}:Title {n}\n")
            f.write(bz2.compress(piece))
    (tmp_path / "x-multistream-index.txt.bz2").write_bytes(bz2.compress("".join(index).encode()))
    whole = list(corpus.read_documents([str(dump)], "mediawiki"))
    assert len(whole) > 50
    shares = corpus.plan_shares([str(dump)], 3)
    assert all(len(r) == 1 and len(r[0].streams) >= 3 for r in shares)       # every rank has streams
    got, read = [], 0
    for rank in range(3):
        stats = corpus.ReadStats()
        got += [d for _, d in corpus.read_share(shares[rank], stats)]
        read += stats.bytes_read
    assert got == whole and read == dump.stat().st_size                      # each stream read by one rank
    # an index whose offsets are not the dump's streams
    (tmp_path / "x-multistream-index.txt.bz2").write_bytes(bz2.compress(b"1000:1:Wrong\n"))
    with pytest.raises(ConfigError, match=r"x-multistream-index.txt.bz2 does not match .*x-multistream.xml.bz2: "
                                          r"no bz2 stream starts at byte 1000"):
        corpus.plan_shares([str(dump)], 2)


@pytest.mark.parametrize("fmt", ["sentences", "documents", "mediawiki", "jsonl"])
def test_ranks_read_disjoint_byte_ranges_whose_documents_make_the_corpus(tmp_path, corpus_dir, fmt):
    """Cut points fall inside documents; each document is read by the rank it begins with."""
    docs = list(corpus.read_documents([str(corpus_dir / "lee_background.cor")], "documents"))
    path = tmp_path / "corpus.txt"
    if fmt == "mediawiki":
        data = bz2.decompress((corpus_dir / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
                              .read_bytes())
        data = data[:data.index(b"<page>", len(data) // 3)] + b"</mediawiki>\n"     # a third of the pages
        path.write_bytes(data)
        longest = max(len(page) for page in data.split(b"<page>"))
    elif fmt == "sentences":
        path.write_text("".join("\n".join(d) + "\n \n" for d in docs))      # a blank line of white space
        longest = max(len(d) for d in path.read_bytes().split(b"\n \n"))
    else:
        path.write_text("".join((json.dumps({"text": " ".join(d)}) if fmt == "jsonl" else " ".join(d)) + "\n"
                                for d in docs))
        longest = max(len(d) for d in path.read_bytes().split(b"\n"))
    whole = list(corpus.read_documents([str(path)], fmt))
    assert len(whole) > 20
    for size in (2, 3, 5):
        shares = corpus.plan_shares([str(path)], size, fmt)
        ranges = [(sh.start, sh.end or path.stat().st_size) for r in shares for sh in r]
        assert ranges == sorted(ranges) and ranges[0][0] == 0 and ranges[-1][1] == path.stat().st_size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))              # disjoint, no gap
        got = []
        for rank in range(size):
            stats = corpus.ReadStats()
            got += [d for _, d in corpus.read_share(shares[rank], stats)]
            share_bytes = sum((sh.end or path.stat().st_size) - sh.start for sh in shares[rank])
            # its share, the rest of the last document begun in it, one read buffer beyond (and one before)
            assert stats.bytes_read <= share_bytes + longest + 2 * compressed.READ_BUFFER
        assert got == whole, size                                                # same documents, once each


def test_mediawiki_page_cut_off_or_broken_is_reported_with_file_and_byte(tmp_path, corpus_dir):
    data = bz2.decompress((corpus_dir / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
                          .read_bytes())
    starts = [m.start() for m in re.finditer(b"<page>", data)]
    articles = [data[a:data.index(b"</page>", a) + 7] + b"\n" for a in starts
                if b"<ns>0</ns>" in data[a:data.index(b"</page>", a)] and b"<redirect" not in data[a:a + 2000]][:4]
    good, bad, cut = articles[0] + articles[1], articles[2].replace(b"</title>", b"</titl>", 1), articles[3][:300]
    head = data[:starts[0]]
    path = tmp_path / "cut.xml"
    path.write_bytes(head + good + bad + cut)           # the file ends inside the last page
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(path)], "mediawiki", stats))
    assert len(docs) == 2 and stats.bad_pages == 1 and stats.truncated_pages == 1
    assert stats.problems[0].startswith(f"{path}: byte {len(head + good)}: page is not valid XML (mismatched tag")
    assert stats.problems[1] == f"{path}: byte {len(head + good + bad)}: <page> not closed before the end of the file"


def test_missing_and_empty_corpus(tmp_path):
    with pytest.raises(ConfigError, match="input file not found: .*nope.txt"):
        list(corpus.read_documents([str(tmp_path / "nope.txt")]))
    with pytest.raises(ConfigError, match="nope"):
        corpus.expand_inputs([str(tmp_path / "nope*.txt")])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    tok = tokenization.Tokenizer(tokenization.google_reserved_tokens() + ["a"])
    with pytest.raises(ConfigError, match="no text found in .*empty.txt"):
        pd.create_pretraining_data([str(empty)], "auto", tok, str(tmp_path / "out"), ins.InstanceConfig())


# ----------------------------------------------------------------------------- vocabulary
@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory, corpus_dir):
    docs = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    vocab = tokenization.learn_vocab([s for d in docs for s in d], vocab_size=3000)
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    tokenization.write_vocab(vocab, path)
    return path


def test_learned_vocab_has_google_layout(vocab_file):
    vocab = tokenization.load_vocab(vocab_file)
    assert vocab[0] == "[PAD]" and vocab[1] == "[unused0]"
    assert vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab) > 1500 and any(t.startswith("##") for t in vocab)


def test_the_default_learner_gives_the_same_file_in_every_process(corpus_dir, vocab_file, tmp_path):
    """The `tokenizers` WordPieceTrainer gave other ids, and at 3,000 tokens other pieces, in each new
    process (its "##" pieces numbered in hash-map order; huggingface/tokenizers#1794): 5 processes, 5
    files. Two fresh processes and this one must write the same bytes."""
    script = (
        "import sys; from bert_tf.data import corpus, tokenization as t; "
        "docs = corpus.read_documents([sys.argv[1]]); "
        "t.write_vocab(t.learn_vocab([s for d in docs for s in d], 3000), sys.argv[2])"
    )
    source = str(corpus_dir / "lee_background.cor") + "@documents"
    files = [tmp_path / f"vocab{i}.txt" for i in range(2)]
    for f in files:
        subprocess.run([sys.executable, "-c", script, source, str(f)], check=True, cwd=REPO, capture_output=True)
    expected = open(vocab_file, "rb").read()
    assert all(f.read_bytes() == expected for f in files)


def test_the_default_learner_learns_wordpiece_pieces():
    """Word-initial pieces and "##" pieces kept apart: "ab" inside a word is "##ab", never "ab"."""
    vocab = tokenization.learn_vocab(["xab yab zab"] * 50 + ["abq"] * 3, 215)
    assert vocab[104:] == ["x", "a", "##a", "##b", "y", "z", "##q", "##ab", "xab", "yab", "zab", "ab", "abq"]
    assert tokenization.Tokenizer(vocab, backend="python").tokens("xab zabq") == ["xab", "zab", "##q"]


@pytest.mark.slow
def test_both_vocabulary_learners_give_googles_layout_and_few_unknowns(corpus_dir):
    docs = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    heldout = [s for d in list(corpus.read_documents([str(corpus_dir / WIKI)]))[:5] for s in d]
    for learner in tokenization.LEARNERS:
        vocab, report = tokenization.learn_and_report([s for d in docs for s in d], heldout, 3000, learner=learner)
        assert vocab[:104] == tokenization.google_reserved_tokens() and len(set(vocab)) == len(vocab), learner
        assert 1500 < len(vocab) <= 3000 and sum(t.startswith("##") for t in vocab) > 300, learner
        assert 0 < report["heldout_unk_rate"] < 0.02 and 1.1 < report["heldout_pieces_per_word"] < 3, (learner, report)
    with pytest.raises(ConfigError, match="--learner=spm: valid are tokenizers, tensorflow_text"):
        tokenization.learn_vocab(["a b"], 3000, learner="spm")


def test_vocab_missing_special_token_is_named(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ConfigError, match=r"vocab.txt lacks the special token\(s\) \[MASK\]"):
        tokenization.load_vocab(str(path))
    with pytest.raises(ConfigError, match="vocab file not found"):
        tokenization.load_vocab(str(tmp_path / "none.txt"))


def test_tokenizer_matches_google_basic_and_wordpiece_behaviour():
    vocab = tokenization.google_reserved_tokens() + [
        "hello", "world", ",", "!", ".", "'", "cafe", "nai", "##ve", "un", "##believ", "##able", "你", "s", "jose"]
    tok = tokenization.Tokenizer(vocab)
    assert tok.tokens("Hello, World!") == ["hello", ",", "world", "!"]
    assert tok.tokens("Café naïve José") == ["cafe", "nai", "##ve", "jose"]       # accents stripped
    assert tok.tokens("Unbelievable.") == ["un", "##believ", "##able", "."]
    assert tok.tokens("你好 world's") == ["你", "[UNK]", "world", "'", "s"]         # CJK split per character
    assert tok.tokens("xyzzy") == ["[UNK]"]


def test_unk_rate_on_heldout_text(vocab_file, corpus_dir):
    tok = tokenization.Tokenizer.from_file(vocab_file)
    docs = list(corpus.read_documents([str(corpus_dir / WIKI)]))[:5]
    rate = tokenization.unk_rate(tok, [s for d in docs for s in d])
    assert 0.0 < rate < 0.02                                          # measured 0.0026
    # the rate is [UNK] pieces over all pieces: a snowman is not in the vocabulary, "the" is
    assert tokenization.unk_rate(tok, ["\u2603 the", "the"]) == 1 / 3


# ----------------------------------------------------------------------------- instances
@pytest.fixture(scope="module")
def created(tmp_path_factory, vocab_file, corpus_dir):
    """Static instances from the news corpus, written twice with the same seed."""
    tok = tokenization.Tokenizer.from_file(vocab_file)
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3, random_seed=7)
    inputs = [str(corpus_dir / "lee_background.cor") + "@documents"]
    outs = []
    for i in range(2):
        out = str(tmp_path_factory.mktemp(f"created{i}"))
        summary = pd.create_pretraining_data(inputs, "auto", tok, out, config, num_shards=2, heldout_fraction=0.1)
        outs.append((out, summary))
    return tok, config, outs


FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
            "next_sentence_labels")


def record_keys(features):
    """One hashable key per record of a batch (or of one record) of features, int32 or int64, for multisets:
    every feature's values (the 0/1 weights too) as int64 bytes."""
    rows = np.concatenate([np.asarray(features[k]).reshape(-1, np.asarray(features[k]).shape[-1]).astype(np.int64)
                           for k in FEATURES], axis=1)
    return [row.tobytes() for row in rows]


def record_key(record):
    return record_keys(record)[0]


def batch_records(batches, limit=None):
    """The record keys of a dataset's batches (of its first `limit` batches)."""
    for batch, _ in zip(batches, range(limit) if limit else iter(int, 1)):
        yield from record_keys({k: v.numpy() for k, v in batch.items()})


def file_records(files, config):
    """The record keys of `files`, in order (batched parsing: fast)."""
    spec = rec.feature_spec(config.max_seq_length, config.max_predictions_per_seq)
    return list(batch_records(tf.data.TFRecordDataset(sorted(files)).batch(512).map(
        lambda r: tf.io.parse_example(r, spec))))


def read_records(files, config):
    spec = rec.feature_spec(config.max_seq_length, config.max_predictions_per_seq)
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
            for r in tf.data.TFRecordDataset(sorted(files))]


def test_masking_statistics(created):
    tok, config, ((out, summary), _) = created
    records = read_records(glob.glob(os.path.join(out, "train-*.tfrecord")), config)
    assert len(records) == summary["train"]["instances"] > 3000
    masked = maskable = same = mask = 0
    for r in records:
        n = int(r["input_mask"].sum())
        k = int(r["masked_lm_weights"].sum())
        # google's count: 15% of the non-special tokens, rounded, at least 1, at most max_predictions_per_seq
        assert k == min(config.max_predictions_per_seq, max(1, int(round((n - 3) * 0.15)))), (n, k)
        assert not r["masked_lm_weights"][k:].any() and (r["masked_lm_weights"][:k] == 1).all()
        positions = r["masked_lm_positions"][:k]
        assert len(set(positions)) == k                              # never twice
        ids = r["input_ids"]
        assert not (ids[:n] == 0).any() and not ids[n:].any()         # random ids are never [PAD]
        assert set(np.flatnonzero(ids == tok.mask_id)) <= set(positions.tolist())   # [MASK] only where masked
        special = {i for i in range(n) if ids[i] in (tok.cls_id, tok.sep_id)}
        assert ids[0] == tok.cls_id and len(special) == 3            # [CLS] and two [SEP] survive
        assert not special & set(positions.tolist())                 # and are never masked
        labels = r["masked_lm_ids"][:k]
        mask += int((ids[positions] == tok.mask_id).sum())
        same += int((ids[positions] == labels).sum())
        masked += k
        maskable += n - 3
    # the counts the summary reports are the records' own
    train = summary["train"]
    assert (masked, maskable, mask) == (train["masked"], train["maskable"], train["replaced_mask"])
    # Each masked position is independently [MASK] (p = 0.8), kept (0.1) or a random id (0.1): binomial over
    # `masked` trials (41,444 here), sigma = sqrt(p (1 - p) / masked) = 0.0020 for 0.8, 0.0015 for 0.1; the
    # tolerance is 5 sigma (0.0098, 0.0074). A random id equal to the label (p = 0.1 / vocab, 6e-5) counts as
    # kept: a bias of 0.04 sigma.
    for observed, p in ((mask, 0.8), (same, 0.1), (masked - mask - same, 0.1)):
        assert abs(observed / masked - p) < 5 * (p * (1 - p) / masked) ** 0.5, (observed, masked, p)
    # NSP: a random next segment with p = 0.5 per instance, sigma = sqrt(0.25 / 4708) = 0.0073; tolerance 4 sigma
    # (0.029; measured 0.504). Close to, not exactly, binomial: a random next puts its unused sentences back, so
    # how many instances a document gives depends on the labels it drew.
    nsp = np.mean([r["next_sentence_labels"][0] for r in records])
    assert abs(nsp - 0.5) < 4 * (0.25 / len(records)) ** 0.5


def test_same_seed_gives_byte_identical_shards(created):
    _, _, ((a, _), (b, _)) = created
    names = sorted(os.listdir(a))
    assert [n for n in names if n.endswith(".tfrecord")] and names == sorted(os.listdir(b))
    for name in names:
        if name.endswith(".tfrecord"):
            assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()


def test_google_parse_spec_reads_our_files(created):
    _, _, ((out, _), _) = created
    # name_to_features as in google-research/bert run_pretraining.py, at seq 64 / 10 predictions
    google = {
        "input_ids": tf.io.FixedLenFeature([64], tf.int64),
        "input_mask": tf.io.FixedLenFeature([64], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([64], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([10], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([10], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([10], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    record = next(iter(tf.data.TFRecordDataset(glob.glob(os.path.join(out, "eval-*")))))
    example = tf.train.Example.FromString(record.numpy())
    assert set(example.features.feature) == set(google)
    parsed = tf.io.parse_single_example(record, google)
    assert parsed["input_ids"].shape == (64,)


def test_heldout_split_is_by_document(tmp_path, vocab_file, corpus_dir, monkeypatch):
    """Each document's instances, and the partners of its random-next pairs, come from one split."""
    tok = tokenization.Tokenizer.from_file(vocab_file)
    docs_of_pool, pools = {}, {}
    real = ins.create_instances

    def recording(doc_index, documents, *args, doc_id=None, **kwargs):
        docs_of_pool.setdefault(id(documents), collections.Counter())[doc_id] += 1
        pools[id(documents)] = len(documents)
        return real(doc_index, documents, *args, doc_id=doc_id, **kwargs)

    monkeypatch.setattr(part_writer, "create_instances", recording)
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, random_seed=7)
    summary = pd.create_pretraining_data([str(corpus_dir / "lee_background.cor") + "@documents"], "auto", tok,
                                         str(tmp_path), config, heldout_fraction=0.1)
    train, heldout = docs_of_pool.values()                 # the train pool is written first
    assert set(train.values()) == set(heldout.values()) == {2}           # every document once per dupe_factor pass
    train, heldout = set(train), set(heldout)
    keys = [k for k, _ in corpus.read_share(corpus.plan_shares([str(corpus_dir / "lee_background.cor")],
                                                               1, "documents")[0])]
    expected = {pd.document_seed(k) for k in keys if pd.is_heldout(pd.document_seed(k), 0.1, 7)}
    assert 10 <= len(expected) <= 50
    assert heldout == expected and not train & heldout and len(train | heldout) == summary["documents"] == 300
    assert sorted(pools.values()) == sorted([len(train), len(heldout)])   # partners only from the own split
    assert summary["train"]["instances"] > 0 and summary["eval"]["instances"] > 0


def test_max_seq_length_too_small():
    with pytest.raises(ConfigError, match="--max_seq_length=4 is too small for \\[CLS\\] A \\[SEP\\] B \\[SEP\\]"):
        ins.InstanceConfig(max_seq_length=4)


def test_too_few_predictions_are_clamped_and_counted():
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=2)
    counts = ins.Counts()
    tokens = [101] + list(range(200, 260)) + [102]
    positions, labels = ins.mask_tokens(tokens, config, {"CLS": 101, "SEP": 102, "MASK": 103}, 300,
                                       __import__("random").Random(0), counts=counts)
    assert len(positions) == 2 and counts.clamped == 1


def test_whole_word_masking_masks_all_pieces():
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=20, whole_word_masking=True)
    vocab = ["a", "##b", "##c", "d", "[CLS]", "[SEP]", "[MASK]"]
    starts = [not t.startswith("##") for t in vocab]
    rng = __import__("random").Random(3)
    words = [[1 + 4 * w, 2 + 4 * w, 3 + 4 * w] for w in range(5)] + [[4 + 4 * w] for w in range(5)]
    whole_words_masked = 0
    for _ in range(50):
        tokens = [4] + [0, 1, 2, 3] * 5 + [5]
        positions, _ = ins.mask_tokens(tokens, config, {"CLS": 4, "SEP": 5, "MASK": 6}, 4, rng, starts)
        assert len(positions) == 3          # round(20 * 0.15); 5 one-piece words always fill what is left
        for word in words:                  # a word is masked with all its pieces or not at all
            assert sum(p in positions for p in word) in (0, len(word)), (word, positions)
        whole_words_masked += any(set(w) <= set(positions) for w in words if len(w) == 3)
    assert whole_words_masked > 10          # three-piece words are masked too, not only the short ones


def test_failed_creation_leaves_no_half_written_shard(tmp_path, vocab_file, corpus_dir, monkeypatch):
    tok = tokenization.Tokenizer.from_file(vocab_file)
    calls = {"n": 0}
    real = rec.serialize

    def failing(instance, config):
        calls["n"] += 1
        if calls["n"] == 500:
            raise RuntimeError("disk full")
        return real(instance, config)

    monkeypatch.setattr(part_writer, "serialize", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        pd.create_pretraining_data([str(corpus_dir / "lee_background.cor") + "@documents"], "auto", tok,
                                   str(tmp_path), ins.InstanceConfig(max_seq_length=64, dupe_factor=2))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_killed_creation_job_resumes_skipping_its_complete_parts(tmp_path, vocab_file, corpus_dir):
    args = [sys.executable, str(REPO / "run" / "create_pretraining_data.py"),
            f"--input_files={corpus_dir / 'lee_background.cor'}@documents", f"--vocab_file={vocab_file}",
            "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=4", "--shards_per_rank=4",
            "--heldout_fraction=0.05"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    subprocess.run(args + [f"--output_dir={straight}"], env=mpi_env(), check=True, capture_output=True, timeout=300)
    job = subprocess.Popen(args + [f"--output_dir={resumed}"], env=mpi_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    first = resumed / "part-r000-0000-of-0004.json"
    deadline = time.time() + 120
    while not first.exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    job.kill()                                                   # SIGKILL: no clean-up of any kind
    job.wait()
    done = sorted(p.name for p in resumed.glob("part-*.json"))
    assert first.name in done and len(done) < 4, done           # killed between parts
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    for shard in resumed.glob("*.tfrecord"):                     # never a half-written shard under its name
        read_records([str(shard)], config)
    again = subprocess.run(args + [f"--output_dir={resumed}"], env=mpi_env(), check=True, capture_output=True,
                           text=True, timeout=300)
    for name in done:
        assert f"part {name[5:-5]} complete (summary and checksums match), skipped" in again.stdout
    assert json.load(open(resumed / "summary.json"))["total"] == {
        **json.load(open(straight / "summary.json"))["total"], "seconds": mock.ANY,
        "per_rank_instances_per_second": mock.ANY, **{s: mock.ANY for s in ("train", "eval")}}
    names = sorted(p.name for p in straight.glob("*.tfrecord"))
    assert names == sorted(p.name for p in resumed.glob("*")
                           if p.suffix == ".tfrecord") and len(names) == 8
    for name in names:                                           # byte-identical to the uninterrupted job
        assert pd.sha256(resumed / name) == pd.sha256(straight / name), name
    # a part whose shard changed afterwards is not complete any more: a rerun makes it again
    key = json.load(open(first))["fingerprint"]
    assert pd.read_completed(str(first), key) is not None
    with open(resumed / "train-r000-0000-of-0004.tfrecord", "ab") as f:
        f.write(b"x")
    assert pd.read_completed(str(first), key) is None
    assert pd.read_completed(str(resumed / "part-r000-0001-of-0004.json"), "other arguments") is None


# ----------------------------------------------------------------------------- reading
def test_corrupt_tfrecord_is_named(created, tmp_path):
    _, config, ((out, _), _) = created
    source = sorted(glob.glob(os.path.join(out, "train-*")))[0]
    broken = tmp_path / "train-broken.tfrecord"
    data = open(source, "rb").read()
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="train-broken.tfrecord is truncated or corrupt"):
        input_pipeline.check_files([str(broken)], 64, 10)
    assert input_pipeline.find_corrupt_file([source, str(broken)]) == str(broken)


def test_shape_mismatch_names_file_feature_and_flag(created):
    _, _, ((out, _), _) = created
    files = sorted(glob.glob(os.path.join(out, "train-*")))
    with pytest.raises(ConfigError, match=r"train-.*feature 'input_ids' has length 64 but the run expects 128 "
                                         r"\(--max_seq_length\)"):
        input_pipeline.check_files(files, 128, 10)
    with pytest.raises(ConfigError, match=r"'masked_lm_positions' has length 10 .* \(--max_predictions_per_seq\)"):
        input_pipeline.check_files(files, 64, 20)


@pytest.mark.parametrize("level", ["file", "record"])
def test_pipeline_gives_ranks_disjoint_records(created, level):
    _, config, ((out, _), _) = created
    files = sorted(glob.glob(os.path.join(out, "train-*")))      # 2 shards
    size = 2 if level == "file" else 3                           # 3 ranks > 2 files: record-level
    # Whole records as multisets: a record read twice, by one rank or by two, or never read, shows.
    written = collections.Counter(file_records(files, config))
    assert written.total() > 4000
    seen = [collections.Counter(batch_records(input_pipeline.make_dataset(files, 8, 64, 10, rank, size, seed=5,
                                                                          training=False)))
            for rank in range(size)]
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])          # disjoint
    assert sum(seen, collections.Counter()) == written           # one pass: every record exactly once
    if level == "record":                                        # records r, r + 3, ... of one stream: even shares
        shares = [s.total() for s in seen]
        assert max(shares) - min(shares) <= 1, shares
    else:                                                        # file r is rank r's, all of it
        own = [collections.Counter(file_records(files[rank::size], config)) for rank in range(size)]
        assert seen == own
        for rank in range(size):                                 # training, repeated: still its own files only
            ds = input_pipeline.make_dataset(files, 8, 64, 10, rank, size, seed=5, training=True, shuffle_buffer=100)
            got = list(batch_records(ds, own[rank].total() // 8 + 50))
            assert set(got) <= set(own[rank]) and len(got) > own[rank].total()   # more than a pass, all its own
    ds = input_pipeline.make_dataset(files, 8, 64, 10, 0, size, seed=5, training=True)
    first = [b["input_ids"].numpy() for b, _ in zip(ds, range(3))]
    again = [b["input_ids"].numpy() for b, _ in zip(input_pipeline.make_dataset(
        files, 8, 64, 10, 0, size, seed=5, training=True), range(3))]
    other = [b["input_ids"].numpy() for b, _ in zip(input_pipeline.make_dataset(
        files, 8, 64, 10, 0, size, seed=6, training=True), range(3))]
    assert not np.array_equal(first, other)                # the seed is used
    np.testing.assert_array_equal(first, again)            # seeded: the same order every run


def test_resume_decodes_as_few_records_after_many_updates_as_after_few(created):
    """InputPosition: a saved iterator state puts a fresh pipeline at the exact position, and
    the records it decodes to get there do not grow with the position (no skipping)."""
    _, _, ((out, _), _) = created
    files = sorted(glob.glob(os.path.join(out, "train-*")))
    decoded = tf.Variable(0, dtype=tf.int64)

    def counting_read(path):
        def count(record):
            decoded.assign_add(1)
            return record
        return tf.data.TFRecordDataset(path).map(count)

    def pipeline(rank=0, size=1):
        return input_pipeline.PerRankInput(input_pipeline.make_dataset(
            files, 8, 64, 10, rank, size, seed=5, shuffle_buffer=64, read=counting_read), 1, gather=lambda b: [b],
        rank=rank, size=size)
    # positions 10 and 1,500 batches (12,000 records: several passes over these files)
    near, far = 10, 1500
    original = pipeline()
    positions, expected = {}, {}
    for consumed in range(1, far + 1):
        original.next_update()
        if consumed in (near, far):
            positions[consumed] = input_pipeline.InputPosition()
            original.capture(positions[consumed], consumed * 8)
            expected[consumed] = [original.next_update()[0]["input_ids"].numpy() for _ in range(3)]
            original = pipeline()                                # back to `consumed`, through a restore too
            assert original.resume(positions[consumed])
    assert int(decoded.numpy()) > far * 8                        # what skipping to `far` would decode
    cost = {}
    for consumed, position in positions.items():
        resumed = pipeline()
        decoded.assign(0)
        assert resumed.resume(position)
        got = [resumed.next_update()[0]["input_ids"].numpy() for _ in range(3)]
        cost[consumed] = int(decoded.numpy())
        for a, b in zip(got, expected[consumed]):
            np.testing.assert_array_equal(a, b)                  # exact: the very next batches
    # after restoring, only the batches asked for and what prefetching reads ahead are decoded
    print("records decoded to resume:", cost)
    assert cost[far] <= 40 * 8 and cost[near] <= 40 * 8, cost
    # saved by 1 rank, resumed by 2: the states do not apply and the caller is told so
    assert not pipeline(0, 2).resume(positions[near])


# ----------------------------------------------------------------------------- dynamic masking
def test_dynamic_masking_gives_static_features_with_a_fresh_mask_each_epoch(tmp_path, vocab_file, corpus_dir):
    tok = tokenization.Tokenizer.from_file(vocab_file)
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, mask=False)
    pd.create_pretraining_data([str(corpus_dir / "lee_background.cor") + "@documents"], "auto", tok,
                               str(tmp_path), config)
    files = glob.glob(str(tmp_path / "train-*"))
    input_pipeline.check_files(files, 64, 10, dynamic_masking=True)
    masker = input_pipeline.dynamic_masker(len(tok), [tok.cls_id, tok.sep_id, tok.pad_id], 10, 0.15, tok.mask_id)
    first = list(input_pipeline.make_dataset(files, 16, 64, 10, training=False, masker=masker))
    batch = first[0]
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (16, 64), "input_mask": (16, 64), "segment_ids": (16, 64), "next_sentence_labels": (16, 1),
        "masked_lm_positions": (16, 10), "masked_lm_ids": (16, 10), "masked_lm_weights": (16, 10)}
    # the records as written (unmasked), in the same order: one file, one pass
    spec = {k: v for k, v in rec.feature_spec(64, 10).items() if not k.startswith("masked_lm")}
    written = list(tf.data.TFRecordDataset(sorted(files)).batch(16).map(lambda r: tf.io.parse_example(r, spec)))
    masked = mask = same = 0
    for b, w in zip(first, written, strict=True):
        b, w = {k: v.numpy() for k, v in b.items()}, {k: v.numpy() for k, v in w.items()}
        for key in ("input_mask", "segment_ids", "next_sentence_labels"):
            np.testing.assert_array_equal(b[key], w[key])
        n, k = w["input_mask"].sum(1), b["masked_lm_weights"].sum(1).astype(int)
        # tensorflow-text's RandomItemSelector: ceil(rate x selectable) in float32, at most max_selections
        np.testing.assert_array_equal(k, np.minimum(10, np.ceil(np.float32(n - 3) * np.float32(0.15))))
        for row in range(len(n)):
            positions, labels = b["masked_lm_positions"][row, :k[row]], b["masked_lm_ids"][row, :k[row]]
            np.testing.assert_array_equal(labels, w["input_ids"][row, positions])         # the original ids
            unmasked = np.setdiff1d(np.arange(64), positions)
            np.testing.assert_array_equal(b["input_ids"][row, unmasked], w["input_ids"][row, unmasked])
            mask += int((b["input_ids"][row, positions] == tok.mask_id).sum())
            same += int((b["input_ids"][row, positions] == labels).sum())
        masked += int(k.sum())
    # 80% [MASK], 10% kept, 10% random, drawn per position: binomial over `masked` (16,837 here) trials,
    # sigma = sqrt(p (1 - p) / masked) = 0.0031 for 0.8, 0.0023 for 0.1; the tolerance is 5 sigma.
    assert masked > 10000
    for observed, p in ((mask, 0.8), (same, 0.1), (masked - mask - same, 0.1)):
        assert abs(observed / masked - p) < 5 * (p * (1 - p) / masked) ** 0.5, (observed, masked, p)
    labels, weights = batch["masked_lm_ids"].numpy(), batch["masked_lm_weights"].numpy()
    for row in range(16):
        k = int(weights[row].sum())
        assert not {tok.cls_id, tok.sep_id, tok.pad_id} & set(labels[row][:k].tolist())
    # a run's next pass over the same records draws new masks, also with the global seed fixed as run/pretrain.py
    # fixes it (two pipelines built alike then draw alike: CI saw it): one file, no shuffling, record i returns as R + i
    tf.random.set_seed(1)
    one = sorted(files)[:1]
    R = sum(1 for _ in tf.data.TFRecordDataset(one))
    rows = list(input_pipeline.make_dataset(one, 16, 64, 10, training=True, masker=masker, shuffle_buffer=1)
                .unbatch().take(2 * R).as_numpy_iterator())
    for a, b in zip(rows[:R], rows[R:], strict=True):
        for key in ("input_mask", "segment_ids", "next_sentence_labels"):
            np.testing.assert_array_equal(a[key], b[key])
    fresh = sum(not np.array_equal(a["masked_lm_positions"], b["masked_lm_positions"]) for a, b in zip(rows[:R], rows[R:]))
    assert R > 100 and fresh > R / 2, (fresh, R)


# ----------------------------------------------------------------------------- parallel creation
@pytest.mark.cluster
def test_two_ranks_write_disjoint_shards_that_match_one_process_but_for_random_partners(tmp_path, vocab_file,
                                                                                       corpus_dir):
    args = [REPO / "run" / "create_pretraining_data.py",
            f"--input_files={corpus_dir / 'lee_background.cor'}@documents", f"--vocab_file={vocab_file}",
            "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2", "--heldout_fraction=0"]
    mpirun(2, args + [f"--output_dir={tmp_path / 'two'}"])
    mpirun(1, args + [f"--output_dir={tmp_path / 'one'}"])
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)

    def records(pattern):
        return [tuple((k, tuple(v.ravel().tolist())) for k, v in sorted(r.items()))
                for r in read_records(glob.glob(str(pattern)), config)]

    def actual_next(rs):
        return collections.Counter(r for r in rs if dict(r)["next_sentence_labels"] == (0,))

    per_rank = [records(tmp_path / "two" / f"train-r00{r}-*") for r in (0, 1)]
    one = records(tmp_path / "one" / "train-*")
    assert len(one) > 1000 and per_rank[0] and per_rank[1]
    assert not collections.Counter(per_rank[0]) & collections.Counter(per_rank[1])   # disjoint
    # every record whose B segment continues its own document is the one process's, to the byte;
    # a random-next pair's B comes from the rank's own documents, so only their number is the same
    assert actual_next(per_rank[0] + per_rank[1]) == actual_next(one)
    assert len(per_rank[0]) + len(per_rank[1]) == len(one)
    summary = json.load(open(tmp_path / "two" / "summary.json"))
    # each rank read its own half of the file's bytes (plus one read buffer), not the whole file
    size = os.path.getsize(corpus_dir / "lee_background.cor")
    shares = [s["shares"] for s in summary["per_rank"]]
    assert shares == [[[str(corpus_dir / "lee_background.cor"), 0, size // 2]],
                      [[str(corpus_dir / "lee_background.cor"), size // 2, None]]]
    assert all(s["bytes_read"] <= size // 2 + compressed.READ_BUFFER for s in summary["per_rank"])
    assert sum(s["documents"] for s in summary["per_rank"]) == 300 and summary["per_rank"][1]["documents"] > 100


# ----------------------------------------------------------------------------- the ecosystem's corpora
def write_ecosystem_corpora(folder, documents):
    """The same documents as a Parquet shard (title + text columns, small row groups, as pyarrow writes
    Hugging Face's shards), a datasets.save_to_disk folder (3 Arrow files) and JSON lines in two zstd frames."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    texts = [" ".join(d) for d in documents]
    third = len(texts) // 3
    parquet = folder / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(third)], "title": [f"Title {i}" for i in range(third)],
                             "text": texts[:third]}), parquet, row_group_size=10)
    arrow = folder / "saved"
    datasets.Dataset.from_dict({"text": texts[third:2 * third]}).save_to_disk(str(arrow), num_shards=3)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[2 * third:]).encode()
    cut = lines.index(b"\n", len(lines) // 2) + 1
    zst = folder / "rest.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(lines[:cut]) + zstandard.ZstdCompressor().compress(lines[cut:]))
    return parquet, arrow, zst, texts


def test_parquet_arrow_and_zst_give_the_documents_and_split_by_row_group_and_batch(tmp_path, corpus_dir):
    documents = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    parquet, arrow, zst, texts = write_ecosystem_corpora(tmp_path, documents)
    third = len(texts) // 3
    assert corpus.detect_format(str(parquet)) == "parquet" and corpus.detect_format(str(arrow)) == "arrow"
    assert corpus.detect_format(str(zst)) == "jsonl"
    assert list(corpus.read_documents([str(parquet)])) == documents[:third]
    assert list(corpus.read_documents([str(parquet)], title_field="title"))[3] == ["Title 3", *documents[3]]
    assert list(corpus.read_documents([str(arrow)])) == documents[third:2 * third]
    assert list(corpus.read_documents([str(zst)])) == documents[2 * third:]           # both frames
    specs = [str(parquet), str(arrow), str(zst)]
    for size in (2, 3, 4):
        shares = corpus.plan_shares(specs, size)
        got = [doc for rank in shares for _, doc in corpus.read_share(rank)]
        assert got == documents[:3 * third], size                                    # once each, in order
        groups = [g for rank in shares for sh in rank if sh.fmt == "parquet" for g in sh.streams]
        assert groups == list(range(10))
    alone = corpus.plan_shares([str(parquet)], 3)                                    # row groups shared out
    per_rank = [[g for sh in rank for g in sh.streams] for rank in alone]
    assert sum(per_rank, []) == list(range(10)) and all(per_rank), per_rank   # by bytes (the footer is the last)
    keys = {k for rank in corpus.plan_shares(specs, 3) for k, _ in corpus.read_share(rank)}
    assert keys == {k for k, _ in corpus.read_share(corpus.plan_shares(specs, 1)[0])}  # names, whatever the split


def test_bad_parquet_arrow_and_zst_inputs_are_named(tmp_path, corpus_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    no_text = tmp_path / "no_text.parquet"
    pq.write_table(pa.table({"id": ["1"], "body": ["Some text here."]}), no_text)
    with pytest.raises(ConfigError, match=r"no_text.parquet: no column 'text' .*its columns: id, body"):
        list(corpus.read_documents([str(no_text)]))
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    with pytest.raises(ConfigError, match=r"numbers.parquet: column 'text' holds int64, not text"):
        list(corpus.read_documents([str(numbers)]))
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["First one. Second one.", None, "Third."]}), good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-20])
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1" + os.urandom(300))
    for bad in (cut, garbage):
        with pytest.raises(ConfigError, match=rf"{bad.name}: not a readable Parquet file"):
            list(corpus.read_documents([str(bad)]))
    stats = corpus.ReadStats()
    assert list(corpus.read_documents([str(good)], stats=stats)) == [["First one.", "Second one."], ["Third."]]
    assert stats.bad_rows == 1 and stats.problems == [f"{good}: row 1 of row group 0: 'text' is None, not text; "
                                                      f"skipped"]
    folder = tmp_path / "not_saved"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"not_saved is a folder with neither WikiExtractor output \(AA/wiki_00, .*nor a "
                                          r"datasets.save_to_disk state.json"):
        list(corpus.read_documents([str(folder)]))
    (folder / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(ConfigError, match=r"a DatasetDict: give one split's folder"):
        list(corpus.read_documents([str(folder)]))
    (folder / "state.json").write_text('{"_data_files": "data.arrow"}')            # another layout
    with pytest.raises(ConfigError, match=r"state.json: not the layout datasets.save_to_disk writes"):
        list(corpus.read_documents([str(folder)]))
    (folder / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    (folder / "data-00000-of-00001.arrow").write_bytes(good.read_bytes())          # Parquet where Arrow should be
    with pytest.raises(ConfigError, match=r"data-00000-of-00001.arrow: not a readable an Arrow stream|"
                                          r"data-00000-of-00001.arrow: not a readable Arrow stream"):
        list(corpus.read_documents([str(folder)]))
    garbage = tmp_path / "garbage.jsonl.zst"
    garbage.write_bytes(b"(\xb5/\xfd" + os.urandom(5000))                   # zstd's magic, then noise
    stats = corpus.ReadStats()
    assert list(corpus.read_documents([str(garbage)], "jsonl", stats=stats)) == []
    assert stats.truncated_files == 1 and "garbage.jsonl.zst: compressed data ends after 0 uncompressed bytes (not " \
        "valid Zstandard data" in stats.problems[0], stats.problems
    text = "".join(f"Document number {i} has a sentence.\n" for i in range(20000)).encode()
    truncated = tmp_path / "docs.txt.zst"
    truncated.write_bytes(zstandard.ZstdCompressor().compress(text)[:-100])
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(truncated) + "@documents"], stats=stats))
    assert 0 < len(docs) < 20000 and docs[0] == ["Document number 0 has a sentence."]
    assert stats.truncated_files == 1 and "docs.txt.zst: compressed data ends after" in stats.problems[0]


@pytest.mark.cluster
def test_parquet_arrow_and_zst_corpora_made_by_two_ranks_killed_and_resumed(tmp_path, vocab_file, corpus_dir):
    """2 ranks, one corpus of the three formats plus a file of copies, de-duplicated: a job killed between
    parts, run again, skips its complete parts and ends with the shards of an uninterrupted job, byte for
    byte (so the ranks make the same de-duplication choice again); the ranks' documents are the corpus
    without the later copies, which are found across ranks and formats."""
    documents = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    parquet, arrow, zst, texts = write_ecosystem_corpora(tmp_path, documents)
    copies = tmp_path / "copies.txt"          # copies of Parquet rows, and boilerplate
    copies.write_text("".join(t.upper() + "\n" for t in texts[:5])
                      + "".join(f"Copy number {i} of nothing. This line is boilerplate.\n" for i in range(12)))
    args = [REPO / "run" / "create_pretraining_data.py", f"--input_files={parquet},{arrow},{zst},{copies}@documents",
            f"--vocab_file={vocab_file}", "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=4",
            "--shards_per_rank=3", "--heldout_fraction=0.05", "--dedup_documents", "--dedup_lines=10"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    out = mpirun(2, args + [f"--output_dir={straight}"])
    summary = json.load(open(straight / "summary.json"))
    assert [s["documents"] for s in summary["per_rank"]] and all(s["documents"] for s in summary["per_rank"])
    seen, expected_copies = set(), 0                        # the later copies, counted here from the texts
    for t in texts[:len(texts) // 3 * 3] + texts[:5]:
        expected_copies += " ".join(t.lower().split()) in seen
        seen.add(" ".join(t.lower().split()))
    total = summary["total"]
    assert expected_copies >= 5 and total["duplicate_documents"] == expected_copies
    assert (total["repeated_lines_removed"], total["distinct_repeated_lines"], total["documents_emptied"]) == (12, 1, 0)
    assert total["documents"] == len(texts) // 3 * 3 + 5 + 12 - expected_copies
    per_rank = [(s["duplicate_documents"], s["repeated_lines_removed"]) for s in summary["per_rank"]]
    # inputs go in sorted order: copies.txt (rank 0) comes first, so rank 1 drops the 5 Parquet rows it copies
    assert [sh[0] for sh in summary["per_rank"][0]["shares"]][0] == str(copies)
    assert per_rank[1][0] == 5 and per_rank[0][1] == 12 and sum(d for d, _ in per_rank) == expected_copies
    assert f"de-duplication: {expected_copies} duplicate documents, 12 lines removed" in out.stdout
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"] + (
        ["--allow-run-as-root"] if os.geteuid() == 0 else []) + [sys.executable, *map(str, args),
                                                                  f"--output_dir={resumed}"]
    job = subprocess.Popen(cmd, env=mpi_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.time() + 180
    while not list(resumed.glob("part-*.json")) and job.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(job.pid, 9)                                       # SIGKILL to mpirun and both ranks
    job.wait()
    done = sorted(p.name for p in resumed.glob("part-*.json"))
    assert 0 < len(done) < 6, done                              # killed between parts
    again = mpirun(2, args + [f"--output_dir={resumed}"])
    for name in done:
        assert f"part {name[5:-5]} complete (summary and checksums match), skipped" in again.stdout
    names = sorted(p.name for p in straight.glob("*.tfrecord"))
    assert names == sorted(p.name for p in resumed.glob("*.tfrecord")) and len(names) >= 6
    for name in names:
        assert pd.sha256(resumed / name) == pd.sha256(straight / name), name


# ----------------------------------------------------------------------------- de-duplication
class ThreadComm:
    """mpi4py's alltoall/allgather for ranks that are threads of one process (tests of bert_tf.data.dedup)."""

    def __init__(self, rank, board, barrier):
        self.rank, self.board, self.barrier = rank, board, barrier

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return len(self.board)

    def _exchange(self, item):
        self.board[self.rank] = item
        self.barrier.wait()
        everything = list(self.board)
        self.barrier.wait()
        return everything

    def alltoall(self, items):
        return [row[self.rank] for row in self._exchange(items)]

    def allgather(self, item):
        return self._exchange(item)


def decide_on_ranks(shares_per_rank, documents_too, min_line_repeats):
    import threading
    from bert_tf.data import dedup
    n = len(shares_per_rank)
    board, barrier, out = [None] * n, threading.Barrier(n), [None] * n

    def rank(r):
        out[r] = dedup.decide(list(shares_per_rank[r]), ThreadComm(r, board, barrier), documents_too,
                              min_line_repeats)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_dedup_keeps_the_first_copy_in_corpus_order_and_drops_lines_repeated_in_kept_documents():
    from bert_tf.data import dedup
    docs = [((0, 0), ["The cat sat.", "See also"]), ((0, 10), ["A dog ran.", "See also"]),
            ((1, 0), ["the  CAT sat.", "see also"]),                    # a copy of (0, 0) after normalising
            ((1, 5), ["Birds fly.", "See  also"]), ((1, 9), ["See also"]),
            ((2, 0), ["A dog ran.", "See also"]),                        # a copy of (0, 10): its lines do not count
            ((2, 7), ["A dog ran.", "Fish swim."])]
    one = dedup.decide(docs, None, True, 4)
    assert one.duplicate_keys == {(1, 0), (2, 0)}
    assert one.repeated_lines == {dedup.line_hash("See also")}          # 4 times in kept documents, not 6
    assert [one.apply(k, d) for k, d in docs] == [
        (["The cat sat."], "", 1), (["A dog ran."], "", 1), (None, "duplicate", 0), (["Birds fly."], "", 1),
        (None, "emptied", 1), (None, "duplicate", 0), (["A dog ran.", "Fish swim."], "", 0)]
    assert not dedup.decide(docs, None, True, 5).repeated_lines          # 4 < 5
    assert dedup.decide(docs, None, False, 0).duplicate_keys == set()
    # the same decisions with the corpus split over 2 or 3 ranks, at any cut
    for cuts in ([3], [1, 5], [6], [2, 4]):
        bounds = [0, *cuts, len(docs)]
        ranks = decide_on_ranks([docs[a:b] for a, b in zip(bounds, bounds[1:])], True, 4)
        assert set().union(*(r.duplicate_keys for r in ranks)) == one.duplicate_keys, cuts
        for r, (a, b) in zip(ranks, zip(bounds, bounds[1:])):
            assert r.duplicate_keys <= {k for k, _ in docs[a:b]} and r.repeated_lines == one.repeated_lines


def test_dedup_in_creation_counts_what_it_left_out_and_a_rerun_reuses_the_parts(tmp_path, vocab_file):
    tok = tokenization.Tokenizer.from_file(vocab_file)
    rng = np.random.RandomState(0)
    words = [w for w in tok.vocab[1000:3000] if w.isalpha()]
    docs = [[" ".join(rng.choice(words, 12)).capitalize() + "." for _ in range(4)] for _ in range(40)]
    docs += [list(docs[3]), [s.upper() for s in docs[8]]]                  # 2 duplicates
    for d in docs[10:16]:
        d.append("Retrieved from the archive.")                           # boilerplate, 6 times
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("".join("\n".join(d) + "\n\n" for d in docs))
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
    args = ([str(corpus_file)], "auto", tok, str(tmp_path / "out"), config)
    summary = pd.create_pretraining_data(*args, dedup_documents=True, dedup_lines=6, log=lambda m: None)
    assert (summary["duplicate_documents"], summary["repeated_lines_removed"], summary["documents_emptied"],
            summary["documents"], summary["distinct_repeated_lines"]) == (2, 6, 0, 40, 1)
    plain = pd.create_pretraining_data(*args[:3], str(tmp_path / "plain"), config, log=lambda m: None)
    assert plain["documents"] == 42 and plain["sentences"] == summary["sentences"] + 8 + 6
    logged = []
    again = pd.create_pretraining_data(*args, dedup_documents=True, dedup_lines=6, log=logged.append)
    assert again["parts_reused"] == 1 and again["duplicate_documents"] == 2 and len(logged) == 1
    assert pd.create_pretraining_data(*args, dedup_documents=True, dedup_lines=7,
                                      log=lambda m: None)["repeated_lines_removed"] == 0   # 6 < 7: a new part
    with pytest.raises(ConfigError, match="--dedup_lines=1 would remove every line"):
        pd.create_pretraining_data(*args, dedup_lines=1)


# ----------------------------------------------------------------------------- FULL-SENTENCES
SPECIAL = {"CLS": 101, "SEP": 102, "MASK": 103}


def windowed(docs, config, window):
    """pack_full_sentences over docs fed `window` documents a call, as the writer feeds them."""
    state, out = {}, []
    for i in range(0, len(docs), window):
        out += ins.pack_full_sentences(docs[i:i + window], state, config, SPECIAL, 400)
    return out + ins.pack_full_sentences([], state, config, SPECIAL, 400, flush=True)


def test_full_sentences_pack_whole_consecutive_sentences_across_documents_whatever_the_window():
    rng = np.random.RandomState(0)
    docs = [(1000 + d, [list(rng.randint(200, 300, rng.randint(3, 10))) for _ in range(rng.randint(1, 6))])
            for d in range(40)]
    docs[7][1].append(list(range(200, 300)))                         # one sentence longer than a sequence
    config = ins.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, mask=False, full_sentences=True)
    instances = windowed(docs, config, 1)
    assert [i.tokens for i in instances] == [i.tokens for i in windowed(docs, config, 7)] == \
        [i.tokens for i in windowed(docs, config, 40)]
    assert all(len(i.tokens) <= 32 and i.tokens[0] == 101 and i.tokens[-1] == 102 and set(i.segment_ids) == {0}
               and not i.is_random_next for i in instances)
    # the body of all sequences, documents joined by [SEP], is the corpus in order (the long sentence cut to fit)
    stream = [t for i in instances for t in i.tokens[1:-1]]
    expected = []
    for seed, doc in docs:
        for s in doc:
            expected += s[:30]
        expected.append(102)
    assert [t for t in stream if t != 102] == [t for t in expected if t != 102]
    # filled across documents: fewer sequences than documents, and each could not take the next sentence
    assert len(instances) < len(docs) and np.mean([len(i.tokens) for i in instances]) > 32 - 8
    # a sentence is never split between two sequences: each sequence's body starts where a sentence starts
    starts = {tuple(s[:3]) for _, doc in docs for s in doc}
    assert all(tuple(i.tokens[1:4]) in starts for i in instances)
    masked = ins.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, full_sentences=True)
    a = ins.pack_full_sentences(docs, {}, masked, SPECIAL, 400, flush=True)
    b = ins.pack_full_sentences(docs[:9], state := {}, masked, SPECIAL, 400) + \
        ins.pack_full_sentences(docs[9:], state, masked, SPECIAL, 400, flush=True)
    assert [(i.tokens, i.positions) for i in a] == [(i.tokens, i.positions) for i in b]   # masks too
    assert all(i.positions and 101 not in [i.tokens[p] for p in i.positions] for i in a)


def test_fill_rows_cuts_the_stream_into_full_rows_whatever_the_window():
    """--fill_rows: every sequence but the last is max_seq_length tokens; the bodies, joined, are the corpus in
    order with [SEP] between documents (except where a row ends) and nothing cut away (a long sentence runs over
    several rows)."""
    rng = np.random.RandomState(1)
    docs = [(2000 + d, [list(rng.randint(200, 300, rng.randint(3, 12))) for _ in range(rng.randint(1, 6))])
            for d in range(40)]
    docs[5][1].append(list(range(200, 300)))                         # longer than three rows
    for mask in (False, True):
        config = ins.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, mask=mask, full_sentences=True,
                                    fill_rows=True)
        rows = windowed(docs, config, 1)
        assert [(i.tokens, i.positions) for i in rows] == [(i.tokens, i.positions) for i in windowed(docs, config, 7)]
        assert all(len(i.tokens) == 32 for i in rows[:-1]) and 0 < len(rows[-1].tokens) <= 32
        assert all(i.tokens[0] == 101 and i.tokens[-1] == 102 for i in rows)
        if mask:                                                         # masks drawn alike whatever the window
            assert all(i.positions for i in rows)
            continue
        stream = [t for i in rows for t in i.tokens[1:-1]]
        expected = [t for _, doc in docs for t in [*(t for s in doc for t in s), 102]]
        # a document that ends a row needs no [SEP]: the row's end parts it from the next one
        assert [t for t in stream if t != 102] == [t for t in expected if t != 102]
        assert len(expected) - len(rows) <= len(stream) <= len(expected)
    whole = ins.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, mask=False, full_sentences=True)
    whole_rows = ins.pack_full_sentences(docs, {}, whole, SPECIAL, 400, flush=True)
    assert len(rows) < len(whole_rows)                                  # the padding it saves
    with pytest.raises(ConfigError, match="--fill_rows needs --full_sentences"):
        ins.InstanceConfig(fill_rows=True)


@pytest.mark.slow
def test_full_sentence_records_need_mlm_only(tmp_path, vocab_file, corpus_dir):
    out = tmp_path / "full"
    subprocess.run([sys.executable, str(REPO / "run" / "create_pretraining_data.py"),
                    f"--input_files={corpus_dir / 'lee_background.cor'}@documents", f"--vocab_file={vocab_file}",
                    "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=1", "--full_sentences",
                    "--heldout_fraction=0.05", f"--output_dir={out}"], env=mpi_env(), check=True,
                   capture_output=True, timeout=300)
    summary = json.load(open(out / "summary.json"))["total"]
    assert summary["config"]["full_sentences"] and summary["train"]["random_next"] == 0
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    records = read_records(glob.glob(str(out / "train-*")), config)
    assert all(r["segment_ids"].sum() == 0 and r["next_sentence_labels"][0] == 0 for r in records)
    # sequences run on across documents: a [SEP] inside some (at 64 tokens a story fills about 4 sequences)
    tok = tokenization.Tokenizer.from_file(vocab_file)
    inner = [int((r["input_ids"][:r["input_mask"].sum() - 1] == tok.sep_id).sum()) for r in records]
    assert np.mean([n > 0 for n in inner]) > 0.05, np.mean(inner)          # measured 0.11 (0 if per document)
    base = dict(vocab_file=vocab_file, train_files=str(out / "train-*"), max_seq_length=64,
                max_predictions_per_seq=10, model_preset="tiny", checkpoint_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"full: its records are FULL-SENTENCES instances .* --mlm_only"):
        preflight.check_inputs(pretrain_config.PretrainConfig(**base), 0, 1)
    preflight.check_inputs(pretrain_config.PretrainConfig(mlm_only=True, **base), 0, 1)


# ----------------------------------------------------------------------------- inputs that are not text
def test_a_binary_file_or_parquet_given_as_text_stops_at_start_naming_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    noise = tmp_path / "noise.txt"
    noise.write_bytes(np.random.RandomState(0).bytes(200_000))
    with pytest.raises(ConfigError, match=r"noise.txt: not text: \d+ of the first \d+ lines are not UTF-8"):
        corpus.plan_shares([str(noise)], 2)
    shard = tmp_path / "shard.bin"
    pq.write_table(pa.table({"text": ["A sentence. " * 50] * 200}), shard)
    with pytest.raises(ConfigError, match=r"shard.bin: not text: .*\(a Parquet file: name it \*.parquet or add "
                                          r"@parquet\)"):
        corpus.plan_shares([f"{shard}@documents"], 1)
    assert list(corpus.read_documents([f"{shard}@parquet"]))[0][0] == "A sentence."
    text = tmp_path / "latin1.txt"                                   # a few bad lines are text with bad bytes
    text.write_bytes(b"".join(b"Caf\xe9 number %d is open.\n" % i if i % 4 == 0 else b"A plain line %d.\n" % i
                              for i in range(400)))
    assert len(list(corpus.read_documents([f"{text}@documents"]))) == 400


def test_truncation_is_googles_and_a_document_of_one_enormous_line_makes_instances(tmp_path):
    def google_truncate(a, b, max_num_tokens, rng):                 # google-research/bert's loop, as it was
        while len(a) + len(b) > max_num_tokens:
            longer = a if len(a) > len(b) else b
            if rng.random() < 0.5:
                del longer[0]
            else:
                longer.pop()

    import random
    for seed in range(200):
        r = random.Random(seed)
        a, b = list(range(r.randint(0, 300))), list(range(1000, 1000 + r.randint(0, 300)))
        ours, theirs = (list(a), list(b)), (list(a), list(b))
        limit = r.randint(1, 200)
        ins._truncate_pair(*ours, limit, random.Random(seed))
        google_truncate(*theirs, limit, random.Random(seed))
        assert ours == theirs, seed
    words = " ".join(f"word{i % 5000}" for i in range(300_000))       # 2 MB, one line, no sentence end
    path = tmp_path / "one_line.txt"
    path.write_text(words + "\n")
    tok = tokenization.Tokenizer(tokenization.google_reserved_tokens() + ["word"] + [f"##{i}" for i in range(10)])
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
    summary = pd.create_pretraining_data([f"{path}@documents"], "auto", tok, str(tmp_path / "out"), config)
    assert summary["documents"] == 1 and summary["train"]["instances"] >= 1


def test_the_training_and_shared_streams_run_without_the_autotune_thread(tiny_data):
    """With tf.data's autotuning on, deleting an iterator that idled (the end of a run, each evaluation's
    pass) waited for the autotune thread's timed sleep, 10-35 s in about half the cases, in every process
    under Horovod (input_pipeline.without_autotune_thread). Both pipelines a run reads leave it off."""
    from bert_tf.train import elastic
    files = sorted(glob.glob(tiny_data["train"]))
    for ds in (input_pipeline.make_dataset(files, 4, 64, 10), input_pipeline.make_dataset(files, 4, 64, 10, training=False),
               elastic.make_shared_stream(files, 4)):
        assert ds.options().autotune.enabled is False
