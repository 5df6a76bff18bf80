"""Learns a WordPiece vocab.txt (google layout) from a corpus and reports its held-out UNK rate.

    python run/learn_vocab.py --input_files='data/corpus/*.bz2' --vocab_size=30522 --output_file=vocab.txt
"""
import os

from absl import flags

from bert_tf import ConfigError, cli

cli.define_corpus_input()
flags.DEFINE_integer("vocab_size", 30522, "Largest vocabulary to learn (reserved tokens included).")
flags.DEFINE_string("output_file", None, "Where to write vocab.txt.")
flags.DEFINE_enum("learner", "tokenizers", ["tokenizers", "tensorflow_text"], "WordPiece learner: the "
                  "`tokenizers` library's WordPieceTrainer (9x faster here), or tensorflow-text's "
                  "bert_vocab_from_dataset.")
flags.mark_flags_as_required(["input_files", "output_file"])
FLAGS = flags.FLAGS


def main(_):
    from bert_tf.data import corpus, pretraining_data, tokenization

    docs = list(corpus.read_documents(corpus.expand_inputs(FLAGS.input_files), FLAGS.input_format,
                                       text_field=FLAGS.text_field, title_field=FLAGS.title_field))
    if not docs:
        raise ConfigError(f"no text in {FLAGS.input_files}")
    heldout = pretraining_data.split_heldout(len(docs), FLAGS.heldout_fraction, FLAGS.random_seed)
    train = [s for d, h in zip(docs, heldout) if not h for s in d]
    test = [s for d, h in zip(docs, heldout) if h for s in d]
    vocab, report = tokenization.learn_and_report(train, test, FLAGS.vocab_size, FLAGS.do_lower_case,
                                                  FLAGS.learner)
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output_file)), exist_ok=True)
    tokenization.write_vocab(vocab, FLAGS.output_file)
    print(f"vocab {report['vocab_size']} tokens -> {FLAGS.output_file}  learned by {FLAGS.learner} in "
          f"{report['learn_seconds']:.1f} s "
          f"from {len(train)} sentences; held-out UNK rate {report['heldout_unk_rate']:.4%} on {len(test)} sentences")


if __name__ == "__main__":
    cli.run(main)
