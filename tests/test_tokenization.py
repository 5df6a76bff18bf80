"""Our tokenizer gives google-research/bert's ids: checked against transformers' pure-Python BertTokenizer
on the whole bundled corpus and an adversarial set (run/tokenizer_agreement.py)."""
import json
import subprocess
import sys
import time

import pytest

from bert_tf import tokenization
from conftest import REPO, mpi_env


@pytest.fixture(scope="module")
def agreement(tiny_data, corpus_dir, tmp_path_factory):
    import transformers  # noqa: F401  the oracle (requirements-dev.txt): missing, the tests fail, not skip
    out = tmp_path_factory.mktemp("agreement") / "agreement.json"
    files = [f"{corpus_dir}/lee_background.cor@documents", f"{corpus_dir}/pang_lee_polarity.cor",
             f"{corpus_dir}/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"]
    start = time.time()
    proc = subprocess.run([sys.executable, str(REPO / "run" / "tokenizer_agreement.py"),
                           f"--vocab_file={tiny_data['vocab_file']}", f"--input_files={','.join(files)}",
                           f"--output_json={out}"], env=mpi_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout, f"({time.time() - start:.0f} s)")
    return json.loads(out.read_text())


def test_google_ids_on_the_whole_bundled_corpus(agreement):
    assert agreement["corpus_sentences"] > 20000
    assert agreement["exact_corpus_identical"] == agreement["corpus_sentences"], \
        agreement["exact_corpus_differing"][:3]


def test_adversarial_set_differs_only_where_the_oracle_departs_from_google(agreement):
    """Each remaining difference is explained by a known departure of transformers' BertTokenizer from
    google's (run/tokenizer_agreement.py ORACLE_DEPARTURES): our tokenizer, given the text as the oracle
    sees it, gives the oracle's ids. On this set: a private-use character and word-final capital sigmas."""
    differing = agreement["exact_adversarial_differing"]
    assert agreement["exact_adversarial_identical"] + len(differing) == agreement["adversarial_sentences"]
    assert all(d["explained_by"] for d in differing), [d for d in differing if not d["explained_by"]]
    assert sorted(d["explained_by"][0].split(" (")[0] for d in differing) == [
        "transformers drops every Unicode C* character", "transformers lower-cases one character at a time"]


def test_exported_tokenizer_json_is_the_fast_tokenizer_and_gives_google_ids(agreement):
    """An export's tokenizer files (checkpoint_formats.write_tokenizer_files), read by AutoTokenizer: the Rust
    tokenizer from tokenizer.json, google's ids on the whole corpus; on the adversarial set it departs from
    google only where transformers' tokenizers do (the same two causes as the pure-Python oracle)."""
    assert agreement["export_is_fast"] and agreement["export_tokenizer_class"] == "BertTokenizerFast"
    assert agreement["export_corpus_identical"] == agreement["corpus_sentences"], \
        agreement["export_corpus_differing"][:3]
    differing = agreement["export_adversarial_differing"]
    assert agreement["export_adversarial_identical"] + len(differing) == agreement["adversarial_sentences"]
    assert sorted(d["explained_by"][0].split(" (")[0] for d in differing) == [
        "transformers drops every Unicode C* character", "transformers lower-cases one character at a time"]


def test_transformers_basic_tokenizer_lower_cases_words_as_google_does():
    """The cause of the sigma difference, shown with transformers' own BasicTokenizer (per-word lower())."""
    from transformers.models.bert.tokenization_bert import BasicTokenizer
    text = "ΟΔΥΣΣΕΥΣ ΣΟΦΟΣ Ἀθῆναι"
    assert BasicTokenizer(do_lower_case=True).tokenize(text) == tokenization.basic_tokenize(text) \
        == ["οδυσσευς", "σοφος", "αθηναι"]


def test_wordpiece_rules():
    vocab = tokenization.google_reserved_tokens() + ["un", "##aff", "##able", "aff", "a", "##a", ",", "[", "]"]
    tok = tokenization.Tokenizer(vocab)
    assert tok.tokens("UnAffable, [unaffable]") == ["un", "##aff", "##able", ",", "[", "un", "##aff", "##able", "]"]
    assert tok.tokens("unaffablex aff") == ["[UNK]", "aff"]                 # one uncovered piece: the word is [UNK]
    assert tok.tokens("a" * 100 + " " + "a" * 101) == ["a"] + ["##a"] * 99 + ["[UNK]"]   # over 100 characters
    assert tok.tokens("a\x00a\ufffda") == ["a", "##a", "##a"]                 # NUL and U+FFFD are dropped


def test_ascii_shortcut_equals_the_unicode_rules():
    import random
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(128)]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        for lower in (True, False):
            assert tokenization.basic_tokenize(text, lower) == tokenization._basic_tokenize_unicode(text, lower), text
