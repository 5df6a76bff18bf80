"""Measures how often our tokenizer gives google-research/bert's ids, and its speed.

The oracle is Hugging Face's pure-Python BertTokenizer (a reimplementation of google's
FullTokenizer; test-only dependency `transformers`). Sentences: the bundled corpus as pre-training
reads it, plus an adversarial set (ligatures, ª/º, full-width Latin, NUL and control characters,
combining marks, Greek, Cyrillic, Hebrew, Arabic, CJK, emoji, words over 100 characters, URLs).
Every character of the adversarial set (and its ## form) is added to the vocabulary, so that a
difference in normalisation shows as different ids rather than hiding behind [UNK] on both sides.

    python run/tokenizer_agreement.py --vocab_file=data/demo/vocab.txt
    python run/tokenizer_agreement.py --vocab_file=... --output_json=agreement.json
"""

import dataclasses
import json
import time
import unicodedata

from bert_tf import cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class AgreementConfig:
    """run/tokenizer_agreement.py's flags: the vocabulary and corpus to compare the tokenizers
    on."""

    vocab_file: str | None = knobs.vocab_file(required=True)
    input_files: list[str] = knob(
        [
            "data/corpus/lee_background.cor@documents",
            "data/corpus/pang_lee_polarity.cor",
            "data/corpus/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        ],
        knobs.MEANINGS["input_files"] + ": the files the tokenizers are compared on.",
    )
    do_lower_case: bool = knob(True, "Lower-case (both tokenizers).")
    output_json: str = knobs.output_json("the figures")
    write_departures: bool = knob(
        False,
        "Instead: scan every code point for where tensorflow-text's and the `tokenizers` library's "
        "rules depart from google's (about 2 min, 5 GB) and write "
        "bert_tf/data/tokenizer_departures.py.",
    )


cli.define_config_flags(AgreementConfig)

ADVERSARIAL = [
    "The ﬁnal ﬂight was ﬃcient: ﬀ ﬅ ﬆ.",  # Latin ligatures (NFKC would expand them)
    "Nº 5 and the 1ª edición; 2º piso.",  # ordinal indicators ª º
    "ＦＵＬＬ－ＷＩＤＴＨ Ｌａｔｉｎ １２３ ｔｅｘｔ！",  # full-width Latin, digits, punctuation
    "nul\x00byte and bell\x07 and escape\x1b[0m here",  # NUL and C0 controls
    "zero\u200bwidth\u200djoiner\ufeffbom soft\u00adhyphen",  # format characters (Cf)
    "tab\tnew\nline\rreturn\x85next\u2028line\u2029para",  # white space and line separators
    "no\u00a0break\u2003em\u3000ideographic space",  # Zs spaces
    "replacement \ufffd char and private \ue000 use",  # U+FFFD, private use (Co)
    "cafe\u0301 na\u0308ive re\u0301sume\u0301 A\u030a",  # combining marks (decomposed)
    "Café naïve résumé Ångström Øresund Łódź Ćevapi",  # precomposed accents, letters without NFD
    "ΟΔΥΣΣΕΥΣ ΣΟΦΟΣ σοφός Ἀθῆναι ΐ",  # Greek: final sigma, polytonic
    "Москва́ — столица России; ЁЛКА, Йошкар-Ола.",  # Cyrillic (Ё, Й decompose under NFD)
    "שָׁלוֹם עוֹלָם",  # Hebrew with points (Mn)
    "مَرْحَبًا بالعالم، كيف الحال؟",  # Arabic with harakat, Arabic punctuation
    "北京大学的学生们在学习。東京タワー과 서울",  # CJK ideographs, kana, Hangul
    "İstanbul ıi ǅ ǈ ß ẞ ﬀ K Å",  # special casing (İ, dotless ı, titlecase digraphs)
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇩🇪 and ❤️",  # emoji, ZWJ sequences, variation selector
    "a" * 101 + " " + "b" * 100 + " " + "é" * 101,  # longer than 100 characters (and exactly 100)
    "https://example.com/path?query=1&x=%20y#frag user@mail.org",  # URLs, e-mail
    "“Curly” quotes, don’t ‘single’ — dashes – and … ellipsis",  # typographic punctuation
    "$100 + 5% = ^caret^ `back` |pipe| ~tilde~ <tag>",  # ASCII symbols that are not Unicode P*
    "math ∑∫√ ≤≥ and currency €£¥ and ©®™ symbols",  # S* symbols (not split by google)
    "Dž ǲ Ǳ ﬓ ﬔ ŉ ǰ",  # characters whose lower-case differs in length
    "ℌ ℍ ℕ ① ⅷ ㍿ ㎏",  # compatibility characters
    "  leading and trailing spaces   ",
    "",
]


# Where transformers' BertTokenizer (the oracle) is not google's FullTokenizer: a difference is
# explained when our tokenizer, given the text as the oracle sees it, gives the oracle's ids.
ORACLE_DEPARTURES = {
    "transformers drops every Unicode C* character (google's _is_control: only Cc and Cf), e.g. "
    "private use": lambda s: "".join(
        c for c in s if c in "\t\n\r" or not unicodedata.category(c).startswith("C")
    ),
    "transformers lower-cases one character at a time (google: str.lower() per word, so a final "
    "capital sigma becomes ς)": lambda s: "".join(c.lower() for c in s),
}


def explain(tokenizer, sentence, oracle_ids):
    return [
        cause
        for cause, seen_by_oracle in ORACLE_DEPARTURES.items()
        if tokenizer.tokenize([seen_by_oracle(sentence)])[0] == list(oracle_ids)
    ]


def corpus_sentences(paths):
    from bert_tf.data import corpus

    return [s for doc in corpus.read_documents(paths) for s in doc]


def vocab_with_sample_characters(vocab, samples, lower_case):
    """vocab + every character of `samples` (as written, lower-cased, NFD-stripped, NFKC) and its ##
    form."""
    chars = set()
    for s in samples:
        for form in (
            s,
            s.lower(),
            unicodedata.normalize("NFD", s.lower()),
            unicodedata.normalize("NFKC", s).lower(),
        ):
            # not white space or control/format characters (tensorflow-text refuses some as vocab
            # entries)
            chars.update(
                c
                for c in form
                if not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf", "Cs")
            )
    known = set(vocab)
    extra = [t for c in sorted(chars) for t in (c, "##" + c) if t not in known]
    return list(vocab) + extra


def oracle(vocab_file, lower_case):
    from transformers import BertTokenizer

    return BertTokenizer(vocab_file, do_lower_case=lower_case)


def oracle_ids(hf, sentences):
    """-> (ids per sentence, tokens/s)."""
    start = time.perf_counter()
    ids = [hf.convert_tokens_to_ids(hf.tokenize(s)) for s in sentences]
    return ids, sum(map(len, ids)) / (time.perf_counter() - start)


def compare(tokenizer, sentences, expected):
    """-> (identical sentences, differing [(sentence, ours, oracle)], tokens/s of ours)."""
    start = time.perf_counter()
    ours = tokenizer.tokenize(sentences)
    seconds = time.perf_counter() - start
    differing = [(s, a, b) for s, a, b in zip(sentences, ours, expected) if list(a) != list(b)]
    return len(sentences) - len(differing), differing, sum(map(len, ours)) / seconds, ours


def compare_export(vocab_file, tmp, parts, exact, lower_case):
    """What an export's tokenizer files give through transformers' AutoTokenizer (the Rust
    tokenizer.json), against google's ids (our exact tokenizer); differences explained as for the
    oracle."""
    import os

    from transformers import AutoTokenizer

    from bert_tf.data import tokenization

    export_dir = os.path.join(tmp, "export")
    tokenization.write_tokenizer_files(vocab_file, export_dir, lower_case)
    hf = AutoTokenizer.from_pretrained(export_dir)
    report = {"export_tokenizer_class": type(hf).__name__, "export_is_fast": hf.is_fast}
    for part, sample in parts.items():
        start = time.perf_counter()
        ids = hf(sample, add_special_tokens=False, verbose=False)["input_ids"]
        if part == "corpus":
            report["export_tokens_per_second"] = sum(map(len, ids)) / (time.perf_counter() - start)
        same, differing, _, _ = compare(exact, sample, ids)
        report[f"export_{part}_identical"] = same
        report[f"export_{part}_differing"] = [
            {"text": s, "explained_by": explain(exact, s, b)} for s, _, b in differing
        ]
    print(
        f"export: {report['export_tokenizer_class']} from tokenizer.json: google's ids on "
        f"{report['export_corpus_identical']}/{len(parts['corpus'])} corpus and "
        f"{report['export_adversarial_identical']}/{len(parts['adversarial'])} adversarial "
        f"sentences; {report['export_tokens_per_second']:,.0f} tokens/s"
    )
    for d in report["export_adversarial_differing"] + report["export_corpus_differing"][:3]:
        print(
            f"   {d['text'][:70]!r}"
            + "".join(f"\n      explained: {cause}" for cause in d["explained_by"])
        )
    return report


def write_departures():
    """bert_tf/data/tokenizer_departures.py from fresh scans of every backend
    (tokenization.scan_departures), in the layout ruff's formatter keeps (tests/test_lint.py)."""
    import os

    from bert_tf.data import tokenization, tokenizer_departures

    path = tokenizer_departures.__file__
    doc = open(path).read().split('"""')[1]
    tables = {}
    for backend in tokenization.BACKENDS[:-1]:
        ranges = tokenization.scan_departures(backend)
        tables[backend] = (tokenization.library_versions(backend), ranges)
        print(f"{backend}: {len(ranges)} ranges, {sum(b - a + 1 for a, b in ranges)} code points")
    with open(path + ".tmp", "w") as f:
        f.write(departures_source(doc, tables))
    os.replace(path + ".tmp", path)
    print(f"-> {path}")


def departures_source(doc: str, tables: dict) -> str:
    """The module's text: `doc` as its docstring, TABLES from {backend: (versions, ranges)}, one
    range a line with upper-case hex digits, as ruff format writes it."""
    body = ""
    for backend, (versions, ranges) in tables.items():
        quoted = ", ".join(f'"{v}"' for v in versions)
        rows = "".join(f"            ({a:#X}, {b:#X}),\n".replace("0X", "0x") for a, b in ranges)
        body += (
            f'    "{backend}": {{\n        "versions": ({quoted}),\n'
            f'        "ranges": (\n{rows}        ),\n    }},\n'
        )
    return f'"""{doc}"""\n\nTABLES = {{\n{body}}}\n'


def compare_backend(name, vocab, lower_case, parts, expected, report):
    """One backend against the oracle on each part (its figures into `report`, printed) -> its ids
    per part."""
    from bert_tf.data import tokenization

    tok = tokenization.Tokenizer(vocab, lower_case, backend=name)
    tok.tokenize(["warm up"])
    ids = {}
    for part, sample in parts.items():
        same, differing, ours_tps, ids[part] = compare(tok, sample, expected[part][0])
        report[f"{name}_{part}_identical"] = same
        report[f"{name}_{part}_differing"] = [
            {
                "text": s,
                "ours": [vocab[i] for i in a],
                "oracle": [vocab[i] for i in b],
                "explained_by": explain(tok, s, b),
            }
            for s, a, b in differing
        ]
        if part == "corpus":
            report[f"{name}_tokens_per_second"] = ours_tps
    corpus, adversarial = len(parts["corpus"]), len(parts["adversarial"])
    total = corpus + adversarial
    same = report[f"{name}_corpus_identical"] + report[f"{name}_adversarial_identical"]
    report[f"{name}_agreement"] = same / total
    print(
        f"{name:15s}: identical ids on {same}/{total} sentences ({100 * same / total:.2f}%): "
        f"corpus {report[f'{name}_corpus_identical']}/{corpus}, adversarial "
        f"{report[f'{name}_adversarial_identical']}/{adversarial}; "
        f"{report[f'{name}_tokens_per_second']:,.0f} tokens/s on the corpus"
    )
    for d in report[f"{name}_corpus_differing"][:3] + report[f"{name}_adversarial_differing"]:
        print(
            f"   {d['text'][:70]!r}\n      ours   {d['ours'][:14]}\n      oracle {d['oracle'][:14]}"
            + "".join(f"\n      explained: {cause}" for cause in d["explained_by"])
        )
    return ids


def main(_):
    import os
    import tempfile

    cfg = cli.config_from_flags(AgreementConfig)
    from bert_tf.data import tokenization

    if cfg.write_departures:
        return write_departures()
    sentences = corpus_sentences(cfg.input_files)
    vocab = vocab_with_sample_characters(
        tokenization.load_vocab(cfg.vocab_file), ADVERSARIAL, cfg.do_lower_case
    )
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = os.path.join(tmp, "vocab.txt")
        tokenization.write_vocab(vocab, vocab_file)
        hf = oracle(vocab_file, cfg.do_lower_case)
        report = {
            "vocab_size": len(vocab),
            "corpus_sentences": len(sentences),
            "adversarial_sentences": len(ADVERSARIAL),
        }
        parts = {"corpus": sentences, "adversarial": ADVERSARIAL}
        expected = {part: oracle_ids(hf, sample) for part, sample in parts.items()}
        report["oracle_tokens_per_second"] = expected["corpus"][1]
        mine = {
            name: compare_backend(name, vocab, cfg.do_lower_case, parts, expected, report)
            for name in tokenization.BACKENDS
        }
        # each library backend against google's rules as written here (python), id for id
        total = len(sentences) + len(ADVERSARIAL)
        for name in tokenization.BACKENDS[:-1]:
            report[f"{name}_python_identical"] = sum(
                list(a) == list(b)
                for part in parts
                for a, b in zip(mine[name][part], mine["python"][part])
            )
            print(
                f"{name} vs python rules: identical ids on "
                f"{report[f'{name}_python_identical']}/{total} sentences"
            )
        print(
            f"oracle (transformers BertTokenizer): {report['oracle_tokens_per_second']:,.0f} "
            "tokens/s"
        )
        report.update(
            compare_export(
                vocab_file,
                tmp,
                parts,
                tokenization.Tokenizer(vocab, cfg.do_lower_case, backend="python"),
                cfg.do_lower_case,
            )
        )
    if cfg.output_json:
        with open(cfg.output_json, "w") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    cli.run(main)
