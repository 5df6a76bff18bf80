"""Scale benchmark of pre-training data creation (issue 14): generates a corpus of --size_mb in
each format from the bundled text (documents shuffled and perturbed: sentences dropped and
reordered, numbers changed, so it is not copies of one file), runs run/create_pretraining_data.py
on 1 and 2 ranks (--rank_counts; --ranks, its old name, works for one release), and prints wall
time, MB/s and instances/s per rank, peak RSS per rank, the 2-rank speed-up, and the time
extrapolated to the English Wikipedia on 16 ranks.

    python run/data_benchmark.py --vocab_file=vocab.txt --size_mb=1000 --work_dir=/tmp/data_bench
    python run/data_benchmark.py --resume_files='data/seq128/train-*' --resume_positions=10,100000

Generated files and outputs live under --work_dir and are deleted at the end (--keep to keep them).
"""

import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from xml.sax.saxutils import escape

from bert_tf import ConfigError, cli, knob, knobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = ("sentences", "documents", "jsonl", "mediawiki")  # the formats generate() writes


@dataclasses.dataclass(frozen=True)
class DataBenchmarkConfig:
    """run/data_benchmark.py's flags."""

    vocab_file: str = knobs.vocab_file("", detail="the creation benchmark's.")
    size_mb: int = knob(1000, "Size of each generated corpus, MB.")
    formats: list[str] = knob(list(GENERATED), "Formats to generate and time.", choices=GENERATED)
    rank_counts: list[int] = knob([1, 2], "Rank counts to time.")
    work_dir: str = knob(
        "/tmp/bert_tf_data_benchmark", "Scratch space (needs about 3 x size_mb per format)."
    )
    dupe_factor: int = knob(1, "Passed to creation.")
    tokenizers: list[str] = knob(
        ["rust"], "Creation's --tokenizer values to time (each format, each rank count)."
    )
    vocab_learners: list[str] = knob(
        [],
        "Also time learning a --vocab_size vocabulary from the first format's corpus with these "
        "run/learn_vocab.py --learner values, and compare held-out UNK rates.",
    )
    vocab_size: int = knob(30522, "Vocabulary size for --vocab_learners.")
    max_seq_length: int = knob(
        128, "Tokens per sequence, with [CLS] and [SEP]s (passed to creation)."
    )
    wikipedia_gb: float = knob(
        20.0, "Size of the English Wikipedia XML dump used for the extrapolation."
    )
    keep: bool = knob(False, "Keep the generated corpora and outputs.")
    resume_files: str = knob(
        "",
        "Instead of the creation benchmark: time restoring the training input position "
        "(InputPosition) in these TFRecords at each of --resume_positions batches.",
    )
    resume_positions: list[int] = knob(
        [10, 100000], "Batches consumed before the position is saved."
    )
    resume_max_seq_length: int = knob(128, "Sequence length of --resume_files.")
    resume_max_predictions: int = knob(20, "max_predictions_per_seq of --resume_files.")


cli.define_config_flags(DataBenchmarkConfig)
cli.define_renamed("ranks", "rank_counts")


def bundled_documents():
    from bert_tf.data import corpus

    paths = sorted(
        os.path.join(REPO, "data", "corpus", f)
        for f in os.listdir(os.path.join(REPO, "data", "corpus"))
    )
    return list(
        corpus.read_documents([p + ("" if p.endswith(".bz2") else "@documents") for p in paths])
    )


def perturbed(docs, rng):
    """Endless documents: a random bundled document with sentences dropped, reordered in places
    and its numbers changed."""
    while True:
        doc = [s for s in rng.choice(docs) if rng.random() > 0.15] or rng.choice(docs)
        if len(doc) > 3 and rng.random() < 0.5:
            i = rng.randrange(len(doc) - 1)
            doc[i], doc[i + 1] = doc[i + 1], doc[i]
        yield [re.sub(r"\d+", lambda m: str(rng.randrange(10 ** len(m.group(0)))), s) for s in doc]


def generate(fmt, path, size_bytes, docs, seed=1):
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "mediawiki":
            f.write('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n')
        for n, doc in enumerate(perturbed(docs, rng)):
            if fmt == "sentences":
                text = "\n".join(doc) + "\n\n"
            elif fmt == "documents":
                text = " ".join(doc) + "\n"
            elif fmt == "jsonl":
                text = json.dumps({"id": n, "text": " ".join(doc)}) + "\n"
            else:
                body = escape("\n\n".join(" ".join(doc[i : i + 4]) for i in range(0, len(doc), 4)))
                text = (
                    f"  <page>\n    <title>Doc {n}</title>\n    <ns>0</ns>\n    <id>{n}</id>\n    "
                    "<revision>\n"
                    f'      <text xml:space="preserve">{body}</text>\n    </revision>\n  </page>\n'
                )
            f.write(text)
            written += len(text.encode("utf-8"))
            if written >= size_bytes:
                break
        if fmt == "mediawiki":
            f.write("</mediawiki>\n")
    return os.path.getsize(path)


def create(cfg, path, fmt, ranks, out, tokenizer):
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [
        sys.executable,
        os.path.join(REPO, "run", "create_pretraining_data.py"),
        f"--input_files={path}",
        f"--input_format={fmt}",
        f"--vocab_file={cfg.vocab_file}",
        f"--output_dir={out}",
        f"--max_seq_length={cfg.max_seq_length}",
        f"--dupe_factor={cfg.dupe_factor}",
        "--heldout_fraction=0",
        f"--tokenizer={tokenizer}",
    ]
    start = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - start
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return wall, summary


def learn_vocabularies(cfg, path, fmt, size):
    """Each --vocab_learners value on the generated corpus (5% of documents held out for the UNK
    rate)."""
    from bert_tf.data import corpus, pretraining_data, tokenization

    docs = list(corpus.read_documents([path], fmt))
    heldout = pretraining_data.split_heldout(len(docs), 0.05, 12345)
    train = [s for d, h in zip(docs, heldout) if not h for s in d]
    test = [s for d, h in zip(docs, heldout) if h for s in d]
    rows = []
    print(
        "| vocabulary learner | MB | vocab | learn s | MB/s | held-out UNK rate | held-out pieces "
        "per word |"
    )
    print("|---|---|---|---|---|---|---|")
    for learner in cfg.vocab_learners:
        vocab, report = tokenization.learn_and_report(train, test, cfg.vocab_size, learner=learner)
        rows.append({"learner": learner, "mb": size / 1e6, **report})
        print(
            f"| {learner} | {size / 1e6:.0f} | {report['vocab_size']} | "
            f"{report['learn_seconds']:.1f} | {size / 1e6 / report['learn_seconds']:.2f} | "
            f"{report['heldout_unk_rate']:.4%} | {report['heldout_pieces_per_word']:.3f} |",
            flush=True,
        )
    return rows


def time_resume(cfg):
    """Restore time of the input position after few and after many batches (batch 32, the
    training pipeline's default shuffle buffer), and what decoding and skipping would cost."""
    from bert_tf.data import input_pipeline

    files = input_pipeline.list_files(cfg.resume_files)

    def pipeline():
        return input_pipeline.make_dataset(
            files, 32, cfg.resume_max_seq_length, cfg.resume_max_predictions, seed=1
        )

    it, consumed = iter(pipeline()), 0
    print(
        "| batches consumed | save s | state MB | restore + first batch s | skip + first batch s "
        "(old way) |"
    )
    print("|---|---|---|---|---|")
    for target in sorted(cfg.resume_positions):
        while consumed < target:
            next(it)
            consumed += 1
        position = input_pipeline.InputPosition()
        start = time.time()
        position.capture(it, consumed * 32, lambda b: [b])
        save = time.time() - start
        mb = len(position.iterator_states.numpy()[0]) / 1e6
        start = time.time()
        resumed = iter(pipeline())
        position.resume(resumed, 0, 1)
        next(resumed)
        restore = time.time() - start
        start = time.time()
        next(iter(pipeline().skip(consumed)))
        skip = time.time() - start
        print(f"| {consumed} | {save:.2f} | {mb:.1f} | {restore:.2f} | {skip:.2f} |", flush=True)


def time_creation(cfg, fmt, path, size):
    """Creation from one generated corpus with each tokenizer on each rank count: a row each."""
    rows = []
    for tokenizer in cfg.tokenizers:
        base = None
        for ranks in cfg.rank_counts:
            out = os.path.join(cfg.work_dir, f"out-{fmt}-{ranks}")
            shutil.rmtree(out, ignore_errors=True)
            wall, summary = create(cfg, path, fmt, ranks, out, tokenizer)
            per_rank = summary["per_rank"]
            mb_s = [s["bytes_read"] / 1e6 / s["seconds"] for s in per_rank]
            inst_s = summary["total"]["per_rank_instances_per_second"]
            rss = [s["peak_rss_mb"] for s in per_rank]
            base = base or wall
            rows.append(
                {
                    "format": fmt,
                    "tokenizer": tokenizer,
                    "mb": size / 1e6,
                    "ranks": ranks,
                    "wall": wall,
                    "mb_s": mb_s,
                    "instances_s": inst_s,
                    "rss": rss,
                    "speedup": base / wall,
                }
            )
            print(
                f"| {fmt} | {tokenizer} | {size / 1e6:.0f} | {ranks} | {wall:.1f} | "
                f"{', '.join(f'{x:.2f}' for x in mb_s)} | {', '.join(f'{x:.0f}' for x in inst_s)} "
                f"| {', '.join(f'{x:.0f}' for x in rss)} | {base / wall:.2f} |",
                flush=True,
            )
            if not cfg.keep:
                shutil.rmtree(out, ignore_errors=True)
    return rows


def main(_):
    cfg = cli.config_from_flags(DataBenchmarkConfig)
    if cfg.resume_files:
        return time_resume(cfg)
    if not os.path.isfile(cfg.vocab_file):
        raise ConfigError(f"--vocab_file={cfg.vocab_file}: no such file")
    os.makedirs(cfg.work_dir, exist_ok=True)
    docs = bundled_documents()
    rows = []
    print(f"{len(docs)} bundled documents; corpora of {cfg.size_mb} MB in {cfg.work_dir}")
    print(
        "| format | tokenizer | MB | ranks | wall s | MB/s per rank | instances/s per rank | peak "
        "RSS per rank MB | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in cfg.formats:
        path = os.path.join(cfg.work_dir, f"corpus.{fmt}")
        size = generate(fmt, path, cfg.size_mb * 1e6, docs)
        rows += time_creation(cfg, fmt, path, size)
        if cfg.vocab_learners and fmt == cfg.formats[0]:
            rows += learn_vocabularies(cfg, path, fmt, size)
        if not cfg.keep:
            os.remove(path)
    for row in rows:
        if row.get("format") == "mediawiki" and row["ranks"] == max(cfg.rank_counts):
            rate = min(row["mb_s"])  # the slowest rank sets the pace
            hours = cfg.wikipedia_gb * 1e3 / (rate * 16) / 3600
            print(
                f"extrapolated: English Wikipedia ({cfg.wikipedia_gb:.0f} GB of XML) on 16 ranks "
                f"at {rate:.2f} MB/s per rank (this machine's slowest rank, {row['ranks']} ranks): "
                f"{hours:.1f} h (if ranks scale linearly; the dump must be decompressed or split "
                "so 16 ranks can share it)"
            )
    with open(os.path.join(cfg.work_dir, "data_benchmark.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
