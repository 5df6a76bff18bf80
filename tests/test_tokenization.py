"""Our tokenizer gives google-research/bert's ids: checked against transformers' pure-Python BertTokenizer
on the whole bundled corpus and an adversarial set (run/tokenizer_agreement.py)."""
import json
import subprocess
import sys
import time

import pytest

from bert_tf.data import basic_tokenizer, tokenization
import stamps
from conftest import REPO, mpi_env


@pytest.fixture(scope="module")
def agreement(tiny_data, corpus_dir, tmp_path_factory):
    import transformers  # noqa: F401  (the oracle, requirements-dev.txt: missing, the tests fail, not skip)
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
    assert agreement["python_corpus_identical"] == agreement["corpus_sentences"], \
        agreement["python_corpus_differing"][:3]


@pytest.mark.parametrize("backend", ["tensorflow_text", "rust"])
def test_library_backends_give_the_python_rules_ids_on_every_sentence(agreement, backend):
    assert agreement[f"{backend}_python_identical"] == (agreement["corpus_sentences"]
                                                        + agreement["adversarial_sentences"])
    assert agreement[f"{backend}_corpus_identical"] == agreement["corpus_sentences"]


def test_adversarial_set_differs_only_where_the_oracle_departs_from_google(agreement):
    """Each remaining difference is explained by a known departure of transformers' BertTokenizer from
    google's (run/tokenizer_agreement.py ORACLE_DEPARTURES): our tokenizer, given the text as the oracle
    sees it, gives the oracle's ids. On this set: a private-use character and word-final capital sigmas."""
    differing = agreement["python_adversarial_differing"]
    assert agreement["python_adversarial_identical"] + len(differing) == agreement["adversarial_sentences"]
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
            assert basic_tokenizer.basic_tokenize(text, lower) == basic_tokenizer._basic_tokenize_unicode(text, lower), text


@pytest.mark.parametrize("backend", ["tensorflow_text", "rust"])
def test_library_backend_equals_the_python_rules_on_random_unicode_text(backend):
    """Random strings of characters from every Unicode block (letters, marks, punctuation, symbols, spaces,
    controls, CJK, private use, the known departures), with every character and its ## form in the
    vocabulary so that a different normalisation is a different id, not [UNK] on both sides."""
    import random
    import unicodedata
    rng = random.Random(0)
    pool = [chr(cp) for cp in range(0x30000) if not 0xD800 <= cp < 0xE000
            and unicodedata.category(chr(cp)) != "Cn"][::7] + list("ΣΣςσ \t\n\u00a0\u200b\x00\ufffd\ue000[]MASK")
    texts = ["".join(rng.choice(pool) if rng.random() < 0.3 else rng.choice("abc ") for _ in range(rng.randint(1, 40)))
             for _ in range(3000)]
    texts += ["ΟΔΥΣΣΕΥΣ ΣΟΦΟΣ.", "a [MASK] b [CLS]", "\U0002b820\U0002b91f", "x\ue000y", "Ǆ ǅ İ",
              "é" * 60, "ж" * 60 + " x", "ж" * 101, "a" * 100, "a" * 101, "nul\x00byte \x07\x1b[0m \x7f."]          # 100 characters, not bytes
    python = tokenization.Tokenizer(tokenization.google_reserved_tokens(), backend="python")
    words = {w for t in texts for w in tokenization.basic_tokenize(t)}
    vocab = tokenization.google_reserved_tokens() + sorted(words - set(tokenization.SPECIAL_TOKENS)) + sorted(
        {"##" + c for w in words for c in w} | {c for w in words for c in w} - words - set(python.vocab))
    python = tokenization.Tokenizer(vocab, backend="python")
    library = tokenization.Tokenizer(vocab, backend=backend)
    got, want = library.tokenize(texts), python.tokenize(texts)
    assert [t for t, a, b in zip(texts, got, want) if a != b] == []
    assert library.tokens("a [MASK] b") == ["a", "[", "mask", "]", "b"]          # corpus text: google's pieces
    assert library.tokens("ΟΔΥΣΣΕΥΣ") == python.tokens("ΟΔΥΣΣΕΥΣ") == ["οδυσσευς"]   # final sigma: Python rules
    departing = tokenization.departures(backend)
    assert "Σ" in departing and "\ue000" in departing and "a" not in departing and "é" not in departing


@pytest.fixture(scope="module")
def python_rules_shared_by_the_scans():
    """Each scan (tokenization.scan_departures) splits the same 1.1 million probes by the Python rules twice,
    cased and uncased (once for its vocabulary, once for the ids it compares with), and the scan of the
    other backend does all of it again: about half of each scan. basic_tokenize is a pure function, so
    while the scans run it is memoised: each probe is split once per casing, for both backends, in this
    process. And the cyclic garbage collector waits: the scans make tens of millions of small objects and
    no cycles, and each full collection would walk all of them and everything the test session holds
    (measured alone: 106 s for both scans as they were, 87 s memoised, 69 s with the collector waiting).
    The scans and what they are compared with are unchanged."""
    import gc
    original, memo = tokenization.basic_tokenize, {}

    def basic_tokenize(sentence, lower_case=True):
        words = memo.get((sentence, lower_case))
        if words is None:
            words = memo[sentence, lower_case] = original(sentence, lower_case)
        return list(words)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokenization, "basic_tokenize", basic_tokenize)
        gc.disable()
        try:
            yield
        finally:
            gc.enable()
            memo.clear()
            gc.collect()


@pytest.mark.cluster
@pytest.mark.parametrize("backend", ["tensorflow_text", "rust"])
def test_the_shipped_departure_table_is_what_a_scan_of_every_code_point_finds(backend, request):
    """bert_tf/data/tokenizer_departures.py against a fresh scan (about 1 min, 5 GB) with the pinned library;
    the two scans share their Python-rules work (python_rules_shared_by_the_scans). The scan is a pure
    function of the tokenizer's code, the shipped table and the libraries' versions: it records a stamp
    keyed by them (tests/stamps.py) and is not repeated while they stay the same; the versions check
    always runs."""
    from bert_tf.data import tokenizer_departures
    table = tokenizer_departures.TABLES[backend]
    versions = tokenization.library_versions(backend)
    assert table["versions"] == versions
    data = REPO / "bert_tf" / "data"
    stamp = stamps.for_test(request, "tokenizer-scan", {
        "tokenizer code": [data / "tokenization.py", data / "basic_tokenizer.py", data / "tokenizer_departures.py"],
        "versions": f"{versions} | TensorFlow {tf_version()} | Python {sys.version}"})
    stamp.skip_if_verified()
    request.getfixturevalue("python_rules_shared_by_the_scans")
    assert tokenization.scan_departures(backend) == list(table["ranges"])
    stamp.record()


def tf_version():
    import tensorflow as tf
    return tf.__version__


def test_an_unknown_tokenizer_backend_is_named():
    from bert_tf import ConfigError
    with pytest.raises(ConfigError, match="--tokenizer=spacy: valid are tensorflow_text, rust, python"):
        tokenization.Tokenizer(tokenization.google_reserved_tokens(), backend="spacy")


def test_the_departure_table_writer_reproduces_the_shipped_file_in_the_formatters_layout():
    """run/tokenizer_agreement.py --write_departures rewrites bert_tf/data/tokenizer_departures.py: given the
    shipped tables it writes the shipped text byte for byte, the layout `ruff format --check` keeps."""
    import importlib.util
    from bert_tf.data import tokenizer_departures
    from conftest import REPO
    spec = importlib.util.spec_from_file_location("tokenizer_agreement", REPO / "run" / "tokenizer_agreement.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = open(tokenizer_departures.__file__).read()
    tables = {name: (t["versions"], t["ranges"]) for name, t in tokenizer_departures.TABLES.items()}
    assert script.departures_source(text.split('"""')[1], tables) == text
