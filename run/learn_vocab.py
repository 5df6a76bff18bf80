"""Learns a WordPiece vocab.txt (google layout) from a corpus and reports its held-out UNK rate.

    python run/learn_vocab.py --input_files='data/corpus/*.bz2' --vocab_size=30522 \
        --output_file=vocab.txt
"""

import dataclasses
import os

from bert_tf import ConfigError, cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class LearnVocabConfig:
    """run/learn_vocab.py's flags: the corpus (its held-out documents measure the UNK rate), the
    vocabulary's size and learner, and where it goes."""

    corpus: knobs.CorpusInput = knobs.CorpusInput()
    vocab_size: int = knob(30522, "Largest vocabulary to learn (reserved tokens included).")
    output_file: str | None = knob(None, "Where to write vocab.txt.", required=True)
    learner: str = knob(
        "tokenizers",
        "WordPiece learner: the `tokenizers` library's BPE trainer on word-initial and inner "
        "characters (the same file in every process; several times faster here), or "
        "tensorflow-text's bert_vocab_from_dataset.",
        choices=["tokenizers", "tensorflow_text"],
    )

    def __post_init__(self):
        if not self.corpus.input_files:
            raise ConfigError("--input_files is required (the corpus to learn from)")


cli.define_config_flags(LearnVocabConfig)


def main(_):
    cfg = cli.config_from_flags(LearnVocabConfig)
    from bert_tf.data import corpus, pretraining_data, tokenization

    c = cfg.corpus
    docs = list(
        corpus.read_documents(
            corpus.expand_inputs(c.input_files),
            c.reading.input_format,
            text_field=c.reading.text_field,
            title_field=c.reading.title_field,
        )
    )
    if not docs:
        raise ConfigError(f"no text in {c.input_files}")
    heldout = pretraining_data.split_heldout(len(docs), c.heldout_fraction, c.random_seed)
    train = [s for d, h in zip(docs, heldout) if not h for s in d]
    test = [s for d, h in zip(docs, heldout) if h for s in d]
    vocab, report = tokenization.learn_and_report(
        train, test, cfg.vocab_size, c.do_lower_case, cfg.learner
    )
    os.makedirs(os.path.dirname(os.path.abspath(cfg.output_file)), exist_ok=True)
    tokenization.write_vocab(vocab, cfg.output_file)
    print(
        f"vocab {report['vocab_size']} tokens -> {cfg.output_file}  learned by {cfg.learner} in "
        f"{report['learn_seconds']:.1f} s from {len(train)} sentences; held-out UNK rate "
        f"{report['heldout_unk_rate']:.4%} on {len(test)} sentences"
    )


if __name__ == "__main__":
    cli.run(main)
