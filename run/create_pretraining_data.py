"""Corpus -> google-format pre-training TFRecords, in parallel over MPI ranks.

    python run/create_pretraining_data.py --input_files='data/corpus/*.bz2' --vocab_file=vocab.txt \
        --output_dir=data/tfrecords/seq128
    mpirun -np 4 python run/create_pretraining_data.py ...     # each rank writes its own shards
"""

import dataclasses
import json
import os
import resource

from bert_tf import ConfigError, cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class CreateDataConfig:
    """run/create_pretraining_data.py's flags: the corpus and its held-out split, the vocabulary and
    tokenizer, the instances (sequence, masking, packing), de-duplication, and where the records
    go."""

    corpus: knobs.CorpusInput = knobs.CorpusInput()
    vocab_file: str | None = knobs.vocab_file(required=True)
    tokenizer: str = knob(
        "tensorflow_text",
        "All give google-research/bert's ids: tensorflow_text (the fastest here) and rust (the "
        "`tokenizers` library) tokenise the sentences without a character on which their rules "
        "differ from google's, python (google's rules, pure Python) the rest "
        "(bert_tf/data/tokenization.py).",
        choices=["tensorflow_text", "rust", "python"],
    )
    output_dir: str | None = knobs.output_dir(
        "train-*.tfrecord, eval-*.tfrecord and summary.json", required=True
    )
    sequence: knobs.Sequence = knobs.Sequence()
    masked_lm_prob: float = knob(0.15, "Fraction of tokens to mask.")
    short_seq_prob: float = knob(0.1, "Probability of a shorter target length.")
    dupe_factor: int = knob(10, "Passes over the corpus with different masks.")
    whole_word_masking: bool = knob(False, "Mask all pieces of a word together.")
    full_sentences: bool = knob(
        False,
        "RoBERTa's FULL-SENTENCES instances: consecutive whole sentences filling each sequence "
        "across document boundaries ([SEP] between documents), no sentence pairs; for "
        "run/pretrain.py --mlm_only (which it then requires).",
    )
    fill_rows: bool = knob(
        False,
        "With --full_sentences: fill every sequence to --max_seq_length, cutting the sentence "
        "that does not fit and starting the next sequence with its rest (the corpus as one stream "
        "cut into rows, as ModernBERT and MosaicBERT train: no padding, where whole sentences "
        "leave about 14% of a 128-token row empty).",
    )
    pack: int = knob(
        0,
        "Pack up to this many sentence-pair instances into each row (>= 2; 0: one per row, "
        "google's layout): short instances fill the padding of others, kept apart by the attention "
        "mask; run/pretrain.py reads either layout.",
    )
    dynamic_masking: bool = knob(
        False, "Write unmasked sequences; mask in tf.data each epoch (RoBERTa-style)."
    )
    dedup_documents: bool = knob(
        False,
        "Leave out exact duplicate documents (after lower-casing and collapsing white space), "
        "keeping the first copy in corpus order, across all ranks.",
    )
    dedup_lines: int = knob(
        0,
        "Leave out every line (sentence) whose normalised text occurs this many times or more in "
        "the corpus (boilerplate); 0: keep all.",
    )
    shards_per_rank: int = knob(
        1,
        "Parts each rank writes (a train and an eval shard each): the unit a restarted job skips "
        "when complete.",
    )

    def __post_init__(self):
        if not self.corpus.input_files:
            raise ConfigError("--input_files is required (the corpus to read)")


cli.define_config_flags(CreateDataConfig)


def main(_):
    cfg = cli.config_from_flags(CreateDataConfig)
    from mpi4py import MPI

    from bert_tf.data import corpus, instances, pretraining_data, tokenization

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    read, seq = cfg.corpus, cfg.sequence
    files = corpus.expand_inputs(read.input_files)
    config = instances.InstanceConfig(
        max_seq_length=seq.max_seq_length,
        max_predictions_per_seq=seq.max_predictions_per_seq,
        masked_lm_prob=cfg.masked_lm_prob,
        short_seq_prob=cfg.short_seq_prob,
        dupe_factor=cfg.dupe_factor,
        whole_word_masking=cfg.whole_word_masking,
        random_seed=read.random_seed,
        mask=not cfg.dynamic_masking,
        full_sentences=cfg.full_sentences,
        fill_rows=cfg.fill_rows,
        pack=cfg.pack,
    )
    tokenizer = tokenization.Tokenizer.from_file(
        cfg.vocab_file, read.do_lower_case, backend=cfg.tokenizer
    )
    summary = pretraining_data.create_pretraining_data(
        files,
        read.reading.input_format,
        tokenizer,
        cfg.output_dir,
        config,
        rank=rank,
        size=size,
        num_shards=cfg.shards_per_rank,
        heldout_fraction=read.heldout_fraction,
        text_field=read.reading.text_field,
        title_field=read.reading.title_field,
        dedup_documents=cfg.dedup_documents,
        dedup_lines=cfg.dedup_lines,
        comm=comm,
    )
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB
    summaries = comm.gather(summary, root=0)
    if rank == 0 and not sum(s["documents"] for s in summaries):
        raise ConfigError(f"no text found in {', '.join(files)} (empty corpus?)")
    if rank == 0:
        total = pretraining_data.summarize(summaries, seq.max_seq_length)
        total.update(config=dataclasses.asdict(config), ranks=size, input_files=files)
        report(cfg, total, summaries)


def report(cfg, total, summaries):
    """Rank 0: summary.json (the total and each rank's), and what it says, printed."""
    problems = [p for s in summaries for p in s["problems"]]
    for p in problems[:20]:
        print(f"skipped: {p}")
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more in summary.json")
    path = os.path.join(cfg.output_dir, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"total": total, "per_rank": summaries}, f, indent=1)
    os.replace(path + ".tmp", path)
    # redirects, other namespaces, empty <doc>s
    skipped = sum(s["skipped_pages"] for s in summaries)
    print(
        f"documents {total['documents']}  sentences {total['sentences']}  tokens "
        f"{total['tokens']}  UNK rate {total['unk_rate']:.4%}  lines with bad bytes "
        f"{total['bad_bytes_lines']}"
        + (
            f"  pages skipped {skipped} (redirects, other namespaces, docs without text)"
            if skipped
            else ""
        )
    )
    if cfg.dedup_documents or cfg.dedup_lines:
        report_dedup(cfg, total, summaries)
    for split in ("train", "eval"):
        c = total.get(split)
        if c:
            print(
                f"{split}: instances {c['instances']} in {c['rows']} rows "
                f"({c['padding_fraction']:.1%} padding)  masked fraction "
                f"{c['mean_masked_fraction']:.4f}  NSP random-next {c['nsp_random_fraction']:.4f}  "
                f"clamped {c['clamped']}  {c['instances_per_second']:.0f} instances/s"
            )
    print(
        f"wall {total['seconds']:.1f} s on {len(summaries)} rank(s); per rank instances/s: "
        + ", ".join(f"{x:.0f}" for x in total["per_rank_instances_per_second"])
        + "; peak RSS MB: "
        + ", ".join(f"{s['peak_rss_mb']:.0f}" for s in summaries)
        + (
            f"; parts reused: {sum(s['parts_reused'] for s in summaries)}"
            if any(s["parts_reused"] for s in summaries)
            else ""
        )
    )
    print(f"summary: {path}")


def report_dedup(cfg, total, summaries):
    """What de-duplication left out, in total and per rank (documents/lines), printed."""
    lines = (
        f"{total['repeated_lines_removed']} lines removed ({total['distinct_repeated_lines']} "
        f"distinct lines seen >= {cfg.dedup_lines} times), {total['documents_emptied']} documents "
        "left empty"
        if cfg.dedup_lines
        else "lines kept (--dedup_lines=0)"
    )
    per_rank = ", ".join(
        f"{s['duplicate_documents']}/{s['repeated_lines_removed']}" for s in summaries
    )
    print(
        f"de-duplication: {total['duplicate_documents']} duplicate documents, {lines}; per rank "
        f"(documents/lines): {per_rank}"
    )


if __name__ == "__main__":
    cli.run(main)
