"""Corpus -> google-format pre-training TFRecords, in parallel over MPI ranks.

    python run/create_pretraining_data.py --input_files='data/corpus/*.bz2' --vocab_file=vocab.txt \
        --output_dir=data/tfrecords/seq128
    mpirun -np 4 python run/create_pretraining_data.py ...     # each rank writes its own shards
"""
import dataclasses
import json
import os
import resource

from absl import flags

from bert_tf import ConfigError, cli

cli.define_corpus_input()
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt (google layout).")
flags.DEFINE_enum("tokenizer", "tensorflow_text", ["tensorflow_text", "rust", "python"], "All give "
                  "google-research/bert's ids: tensorflow_text (the fastest here) and rust (the `tokenizers` "
                  "library) tokenise the sentences without a character on which their rules differ from "
                  "google's, python (google's rules, pure Python) the rest (bert_tf/data/tokenization.py).")
flags.DEFINE_string("output_dir", None, "Where train-*.tfrecord, eval-*.tfrecord and summary.json go.")
cli.define_sequence()
flags.DEFINE_float("masked_lm_prob", 0.15, "Fraction of tokens to mask.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target length.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the corpus with different masks.")
flags.DEFINE_bool("whole_word_masking", False, "Mask all pieces of a word together.")
flags.DEFINE_bool("full_sentences", False, "RoBERTa's FULL-SENTENCES instances: consecutive whole sentences "
                  "filling each sequence across document boundaries ([SEP] between documents), no sentence "
                  "pairs; for run/pretrain.py --mlm_only (which it then requires).")
flags.DEFINE_integer("pack", 0, "Pack up to this many sentence-pair instances into each row (>= 2; 0: one per row, "
                     "google's layout): short instances fill the padding of others, kept apart by the attention "
                     "mask; run/pretrain.py reads either layout.")
flags.DEFINE_bool("dynamic_masking", False, "Write unmasked sequences; mask in tf.data each epoch (RoBERTa-style).")
flags.DEFINE_bool("dedup_documents", False, "Leave out exact duplicate documents (after lower-casing and collapsing "
                  "white space), keeping the first copy in corpus order, across all ranks.")
flags.DEFINE_integer("dedup_lines", 0, "Leave out every line (sentence) whose normalised text occurs this many "
                     "times or more in the corpus (boilerplate); 0: keep all.")
flags.DEFINE_integer("shards_per_rank", 1, "Parts each rank writes (a train and an eval shard each): the unit "
                     "a restarted job skips when complete.")
flags.mark_flags_as_required(["input_files", "vocab_file", "output_dir"])
FLAGS = flags.FLAGS


def main(_):
    from mpi4py import MPI

    from bert_tf.data import corpus, instances, pretraining_data, tokenization

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    files = corpus.expand_inputs(FLAGS.input_files)
    config = instances.InstanceConfig(
        max_seq_length=FLAGS.max_seq_length, max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        masked_lm_prob=FLAGS.masked_lm_prob, short_seq_prob=FLAGS.short_seq_prob,
        dupe_factor=FLAGS.dupe_factor, whole_word_masking=FLAGS.whole_word_masking,
        random_seed=FLAGS.random_seed, mask=not FLAGS.dynamic_masking, full_sentences=FLAGS.full_sentences,
        pack=FLAGS.pack)
    tokenizer = tokenization.Tokenizer.from_file(FLAGS.vocab_file, FLAGS.do_lower_case, backend=FLAGS.tokenizer)
    summary = pretraining_data.create_pretraining_data(
        files, FLAGS.input_format, tokenizer, FLAGS.output_dir, config, rank=rank, size=size,
        num_shards=FLAGS.shards_per_rank, heldout_fraction=FLAGS.heldout_fraction, text_field=FLAGS.text_field,
        title_field=FLAGS.title_field, dedup_documents=FLAGS.dedup_documents, dedup_lines=FLAGS.dedup_lines,
        comm=comm)
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: kB
    summaries = comm.gather(summary, root=0)
    if rank == 0 and not sum(s["documents"] for s in summaries):
        raise ConfigError(f"no text found in {', '.join(files)} (empty corpus?)")
    if rank == 0:
        total = pretraining_data.summarize(summaries, FLAGS.max_seq_length)
        problems = [p for s in summaries for p in s["problems"]]
        for p in problems[:20]:
            print(f"skipped: {p}")
        if len(problems) > 20:
            print(f"... and {len(problems) - 20} more in summary.json")
        total.update(config=dataclasses.asdict(config), ranks=size, input_files=files)
        path = os.path.join(FLAGS.output_dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"total": total, "per_rank": summaries}, f, indent=1)
        os.replace(path + ".tmp", path)
        skipped = sum(s["skipped_pages"] for s in summaries)    # redirects, other namespaces, empty <doc>s
        print(f"documents {total['documents']}  sentences {total['sentences']}  tokens {total['tokens']}  "
              f"UNK rate {total['unk_rate']:.4%}  lines with bad bytes {total['bad_bytes_lines']}"
              + (f"  pages skipped {skipped} (redirects, other namespaces, docs without text)" if skipped else ""))
        if FLAGS.dedup_documents or FLAGS.dedup_lines:
            lines = (f"{total['repeated_lines_removed']} lines removed ({total['distinct_repeated_lines']} distinct "
                     f"lines seen >= {FLAGS.dedup_lines} times), {total['documents_emptied']} documents left empty"
                     if FLAGS.dedup_lines else "lines kept (--dedup_lines=0)")
            print(f"de-duplication: {total['duplicate_documents']} duplicate documents, {lines}; per rank "
                  "(documents/lines): " + ", ".join(f"{s['duplicate_documents']}/{s['repeated_lines_removed']}"
                                                    for s in summaries))
        for split in ("train", "eval"):
            c = total.get(split)
            if c:
                print(f"{split}: instances {c['instances']} in {c['rows']} rows ({c['padding_fraction']:.1%} padding)  "
                      f"masked fraction {c['mean_masked_fraction']:.4f}  "
                      f"NSP random-next {c['nsp_random_fraction']:.4f}  clamped {c['clamped']}  "
                      f"{c['instances_per_second']:.0f} instances/s")
        print(f"wall {total['seconds']:.1f} s on {size} rank(s); per rank instances/s: "
              + ", ".join(f"{x:.0f}" for x in total["per_rank_instances_per_second"])
              + "; peak RSS MB: " + ", ".join(f"{s['peak_rss_mb']:.0f}" for s in summaries)
              + (f"; parts reused: {sum(s['parts_reused'] for s in summaries)}"
                 if any(s["parts_reused"] for s in summaries) else ""))
        print(f"summary: {path}")


if __name__ == "__main__":
    cli.run(main)
