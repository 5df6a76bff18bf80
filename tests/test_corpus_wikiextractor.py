"""WikiExtractor output as a corpus (format `wikiextractor`, bert_tf/data/wikiextractor.py): the folder
layout found and detected, titles dropped (or kept with --title_field), paragraphs split into sentences,
empty and malformed <doc>s skipped and counted, and byte-range shares that read every document once.
The files are written here in the layout WikiExtractor writes (its --json layout too)."""
import bz2
import json
import os
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.data import corpus

URL = "https://en.wikipedia.org/wiki?curid="


def doc(number, title, paragraphs):
    """One <doc> as WikiExtractor writes it: header, the title, a blank line, a paragraph per line, </doc>."""
    return (f'<doc id="{number}" url="{URL}{number}" title="{title}">\n{title}\n\n' + "\n".join(paragraphs)
            + "\n\n</doc>\n")


def article(number):
    """A document with several paragraphs of a few sentences, a section heading, and a blank-line paragraph."""
    return doc(number, f"Article {number}", [
        f"Article {number} is a page about the number {number}. It has a second sentence. And a third one.",
        f"A new paragraph of article {number} starts here. It ends with a question?",
        "History.",
        f"In {1900 + number} something happened to it. Nothing else did.",
        "",
        f"After a blank line, paragraph five of {number} is one sentence."])


def sentences_of(number, title=False):
    return [f"Article {number}"] * title + [
        f"Article {number} is a page about the number {number}.", "It has a second sentence.", "And a third one.",
        f"A new paragraph of article {number} starts here.", "It ends with a question?", "History.",
        f"In {1900 + number} something happened to it.", "Nothing else did.",
        f"After a blank line, paragraph five of {number} is one sentence."]


def write_extracted(root, files=3, per_file=4, compress=()):
    """root/AA/wiki_00 ... in WikiExtractor's layout (3 files to a folder here, 100 there); files named in
    `compress` (AA/wiki_01, ...) written as .bz2 (WikiExtractor -c). Returns the document numbers in corpus order."""
    numbers = []
    for i in range(files):
        folder = root / ("AA", "AB", "AC")[i // 3]
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(article(100 * i + j) for j in range(per_file))
        numbers += [100 * i + j for j in range(per_file)]
        name = f"wiki_{i % 3:02d}"
        if f"{folder.name}/{name}" in compress:
            (folder / (name + ".bz2")).write_bytes(bz2.compress(text.encode()))
        else:
            (folder / name).write_text(text)
    return numbers


def test_a_wikiextractor_folder_is_found_detected_and_read_without_its_titles(tmp_path):
    root = tmp_path / "extracted"
    numbers = write_extracted(root, files=5, compress=("AA/wiki_01",))
    (root / "AA" / "notes.txt").write_text("not WikiExtractor's\n")          # other files are not inputs
    files = corpus.expand_inputs([str(root)])
    assert [f.split("extracted/")[1] for f in files] == ["AA/wiki_00", "AA/wiki_01.bz2", "AA/wiki_02", "AB/wiki_00",
                                                         "AB/wiki_01"]
    assert corpus.expand_inputs([str(root / "*" / "wiki_*")]) == files                    # a glob works too
    assert corpus.expand_inputs([str(root) + "@wikiextractor"]) == [f + "@wikiextractor" for f in files]
    assert {corpus.detect_format(f) for f in files} == {"wikiextractor"}
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents(files, stats=stats))
    assert docs == [sentences_of(n) for n in numbers]
    assert (stats.documents, stats.sentences, stats.problems) == (20, 20 * 9, [])
    assert list(corpus.read_documents([str(root)])) == docs                  # the folder given to the reader
    titled = list(corpus.read_documents(files, title_field="title"))
    assert titled == [sentences_of(n, title=True) for n in numbers]
    assert list(corpus.read_documents(files[:1], title_field="id"))[1][0] == "1"
    with pytest.raises(ConfigError, match=r"extracted/AA/wiki_00: byte 0: the <doc> has no attribute 'name' "
                                          r"\(--title_field\); its attributes: id, url, title"):
        list(corpus.read_documents(files, title_field="name"))
    (tmp_path / "empty" / "AA").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"empty is a folder with neither WikiExtractor output"):
        corpus.expand_inputs([str(tmp_path / "empty")])


def test_empty_docs_entities_and_leftover_tags(tmp_path):
    path = tmp_path / "AA" / "wiki_00"
    path.parent.mkdir()
    path.write_text(doc(1, "Cogency", []) + doc(2, "Only tags", ["</dl>", "<br>"])
                    + doc(3, 'A "quoted" &amp; title', ["Fish &amp; chips &lt;3 are food. They are.", "</dl>",
                                                          "<poem>", "Last line."])
                    + doc(4, "Stub", ["   "]))
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(path)], stats=stats))
    assert docs == [["Fish & chips <3 are food.", "They are.", "Last line."]]
    assert (stats.documents, stats.skipped_pages, stats.problems) == (1, 3, [])      # empty: counted, not listed
    assert next(corpus.read_documents([str(path)], title_field="title"))[0] == 'A "quoted" & title'


def test_shares_read_every_document_exactly_once_wherever_the_file_is_cut(tmp_path):
    """Every cut of one file into two shares, and every rank count up to 12 over three files (one
    compressed, read whole): the documents and their keys are those of one share, each read once."""
    root = tmp_path / "extracted"
    write_extracted(root, files=3, per_file=5, compress=("AA/wiki_02",))
    files = corpus.expand_inputs([str(root)])
    whole = list(corpus.read_share(corpus.plan_shares(files, 1)[0]))
    assert len(whole) == 15 and len({k for k, _ in whole}) == 15
    for size in range(2, 13):
        got = [item for rank in corpus.plan_shares(files, size) for item in corpus.read_share(rank)]
        assert got == whole, size
    first = files[0]
    size = os.path.getsize(first)
    mine = [item for item in whole if item[0][0] == 0]
    for cut in range(1, size):
        parts = [corpus.Share(0, first, "wikiextractor", 0, cut), corpus.Share(0, first, "wikiextractor", cut)]
        got = [item for part in parts for item in corpus.read_share([part])]
        assert got == mine, cut


MALFORMED = (doc(1, "Good", ["One sentence here."])
             + "stray text between documents\nand more of it\n"
             + '<doc id="2" url="u" title="Unclosed">\nUnclosed\n\nIt never ends.\n'
             + doc(3, "After", ["Read all the same."])
             + "</doc>\n"
             + '<doc id="4" url="u" title="Cut">\nCut\n\nThe file ends inside.\n')


def test_malformed_docs_are_skipped_counted_and_named_with_file_and_byte(tmp_path):
    path = tmp_path / "wiki_00"
    path.write_text(MALFORMED)
    stats = corpus.ReadStats()
    docs = list(corpus.read_documents([str(path)], "wikiextractor", stats))
    assert docs == [["One sentence here."], ["Read all the same."]]
    at = [MALFORMED.index(s) for s in ("stray", '<doc id="2"', '<doc id="3"', "</doc>\n<doc id=\"4\"",
                                       '<doc id="4"')]
    assert stats.problems == [f"{path}: byte {at[0]}: text outside <doc> ... </doc>: ignored",
                              f"{path}: byte {at[1]}: <doc> not closed before the next <doc> at byte {at[2]}; skipped",
                              f"{path}: byte {at[3]}: text outside <doc> ... </doc>: ignored",
                              f"{path}: byte {at[4]}: <doc> not closed before the end of the file; skipped"]
    assert (stats.stray_text, stats.bad_pages, stats.truncated_pages) == (2, 1, 1)
    for cut in range(1, len(MALFORMED)):          # the same problems, each once, wherever the file is cut
        counts = corpus.ReadStats()
        parts = [corpus.Share(0, str(path), "wikiextractor", 0, cut), corpus.Share(0, str(path), "wikiextractor", cut)]
        got = [d for part in parts for _, d in corpus.read_share([part], counts)]
        assert got == docs and sorted(counts.problems) == sorted(stats.problems), cut
    shares = corpus.plan_shares([f"{path}@wikiextractor"], 3)
    assert [d for rank in shares for _, d in corpus.read_share(rank)] == docs
    compressed = tmp_path / "wiki_01.bz2"
    compressed.write_bytes(bz2.compress(MALFORMED.encode()))
    stats = corpus.ReadStats()
    assert list(corpus.read_documents([str(compressed)], stats=stats)) == docs
    assert stats.problems[-1] == (f"{compressed}: uncompressed byte {at[4]}: <doc> not closed before the end of "
                                  f"the file; skipped")


def test_the_json_layout_is_read_as_json_lines(tmp_path):
    """WikiExtractor --json: a JSON line per article (id, revid, url, title, text without the title,
    paragraphs joined by newlines) in the same folders: detected as jsonl, the same sentences."""
    numbers = write_extracted(tmp_path / "xml", files=2)
    folder = tmp_path / "json" / "AA"
    folder.mkdir(parents=True)
    with open(folder / "wiki_00", "w") as f:
        for n in numbers:
            paragraphs = article(n).split("\n")[3:-3]
            f.write(json.dumps({"id": str(n), "revid": "1", "url": f"{URL}{n}", "title": f"Article {n}",
                                "text": "\n".join(paragraphs)}) + "\n")
    files = corpus.expand_inputs([str(tmp_path / "json")])
    assert corpus.detect_format(files[0]) == "jsonl"
    assert list(corpus.read_documents(files)) == list(corpus.read_documents([str(tmp_path / "xml")]))


@pytest.mark.slow
def test_vocabulary_and_records_from_a_wikiextractor_folder(tmp_path):
    """run/learn_vocab.py and run/create_pretraining_data.py (with the vocabulary learned) given the top
    folder: every document read, the empty one counted."""
    from conftest import REPO, mpi_env
    root = tmp_path / "extracted"
    write_extracted(root, files=4, per_file=6)
    (root / "AB" / "wiki_01").write_text(doc(900, "Empty", []))
    vocab = subprocess.run([sys.executable, str(REPO / "run" / "learn_vocab.py"), f"--input_files={root}",
                            "--vocab_size=300", f"--output_file={tmp_path / 'vocab.txt'}"],
                           env=mpi_env(), capture_output=True, text=True, timeout=300, check=False)
    assert vocab.returncode == 0 and (tmp_path / "vocab.txt").exists(), vocab.stderr[-2000:]
    out = subprocess.run([sys.executable, str(REPO / "run" / "create_pretraining_data.py"), f"--input_files={root}",
                          f"--vocab_file={tmp_path / 'vocab.txt'}", "--max_seq_length=64",
                          "--max_predictions_per_seq=10", "--dupe_factor=2", f"--output_dir={tmp_path / 'records'}"],
                         env=mpi_env(), capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "records" / "summary.json").read_text())
    assert summary["total"]["documents"] == 24 and summary["total"]["sentences"] == 24 * 9
    assert summary["per_rank"][0]["skipped_pages"] == 1 and "pages skipped 1 " in out.stdout
    assert summary["total"]["train"]["instances"] > 0 and len(summary["total"]["input_files"]) == 5
