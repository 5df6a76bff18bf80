"""The knobs several entry points share, declared once: one name, one type, one help text
everywhere.

A script's config dataclass takes them as fields (`vocab_file: str = knobs.vocab_file()`) or as a
group (`corpus: knobs.CorpusInput = knobs.CorpusInput()`); bert_tf.cli.define_config_flags turns
either into flags of the same names. No TensorFlow, no absl: a config can be built and checked
anywhere.

Names and what they mean, in every script:
    --input_files     corpus text to read (files or globs, PATH@FORMAT)
    --train_files     training TFRecords (globs); --eval_files: held-out TFRecords
    --vocab_file      a WordPiece vocab.txt
    --output_dir      a folder the script writes into
    --output_json     one file the script writes (--output_png too)
    --checkpoint_dir  a pre-training run's folder: written, and resumed from
    --epochs          passes over the training examples (a float)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_tf import knob
from bert_tf.data.corpus import FORMATS
from bert_tf.model.config import PRESET_NAMES

# The names whose meaning this module fixes, and that meaning: every script's help for one of them
# opens with it, and adds the script's own detail after a colon (tests/test_cli.py compares them
# across run/).
MEANINGS = {
    "input_files": "Corpus text",
    "train_files": "Training TFRecords",
    "eval_files": "Held-out TFRecords",
    "vocab_file": "WordPiece vocab.txt",
    "output_dir": "Folder this writes into",
    "output_json": "JSON file this writes",
    "checkpoint_dir": "A pre-training run's folder",
    "init_checkpoint": "Weights to start from",
    "epochs": "Passes over the training examples",
}
FIXED_MEANINGS = tuple(MEANINGS)


# Each knob below returns bert_tf.knob's dataclasses.field, typed Any: a field's default stands for
# its value.
def _help(name: str, detail: str) -> str:
    return f"{MEANINGS[name]}: {detail}" if detail else f"{MEANINGS[name]}."


def vocab_file(
    default: str | None = None,
    required: bool = False,
    detail: str = "one token per line (google-research/bert's layout).",
) -> Any:
    return knob(default, _help("vocab_file", detail), required=required)


def input_files(default: list[str] | None = None, detail: str = "") -> Any:
    return knob(
        default,
        _help(
            "input_files",
            "files or globs, comma-separated; .gz/.bz2/.zst read transparently; PATH@FORMAT gives "
            "one file its own format, e.g. news.txt@documents." + (f" {detail}" if detail else ""),
        ),
    )


def train_files(default: str = "", detail: str = "comma-separated globs.") -> Any:
    return knob(default, _help("train_files", detail))


def eval_files(default: str = "", detail: str = "comma-separated globs.") -> Any:
    return knob(default, _help("eval_files", detail))


def output_dir(what: str, default: str | None = None, required: bool = False) -> Any:
    return knob(default, _help("output_dir", f"{what}."), required=required)


def output_json(what: str = "the figures") -> Any:
    return knob("", _help("output_json", f"{what} (empty: none)."))


def checkpoint_dir(detail: str, default: str = "") -> Any:
    return knob(default, _help("checkpoint_dir", detail))


def init_checkpoint(detail: str, default: str | None = "", required: bool = False) -> Any:
    return knob(default, _help("init_checkpoint", detail), required=required)


def epochs(default: float) -> Any:
    return knob(default, _help("epochs", "fractions allowed."))


def model_preset(default: str) -> Any:
    return knob(
        default,
        "Standard model size (google-research/bert and Turc et al. 2019).",
        choices=PRESET_NAMES,
    )


@dataclasses.dataclass(frozen=True)
class Sequence:
    max_seq_length: int = knob(128, "Tokens per sequence, with [CLS] and [SEP]s.")
    max_predictions_per_seq: int = knob(20, "Masked positions per sequence.")


@dataclasses.dataclass(frozen=True)
class CorpusFormat:
    """How corpus files are read (bert_tf/data/corpus.py)."""

    input_format: str = knob(
        "auto",
        "sentences: one per line, blank line between documents (google); documents: one per line; "
        "mediawiki: XML dump; wikiextractor: WikiExtractor's <doc> files (a folder of AA/wiki_00 "
        "...); jsonl: JSON lines, the text in --text_field; parquet: a row per document (Hugging "
        "Face datasets' shards); arrow: a datasets.save_to_disk folder; auto: parquet for "
        "*.parquet, arrow for a folder with state.json, mediawiki if the file starts with "
        "<mediawiki>, wikiextractor if it starts with <doc id=, jsonl if it starts with { or is "
        "named *.jsonl/*.json, else sentences. PATH@FORMAT in --input_files gives one file its own "
        "format.",
        choices=["auto", *FORMATS],
    )
    text_field: str = knob(
        "text", "JSON lines, Parquet, Arrow: the field that holds a document's text."
    )
    title_field: str = knob(
        "",
        "Parquet, Arrow: a column whose value becomes each document's first sentence (e.g. title "
        "for wikimedia/wikipedia); wikiextractor: a <doc> attribute (title, id, url); empty: none.",
    )


@dataclasses.dataclass(frozen=True)
class CorpusInput:
    """A corpus to read, with the seeded document-level held-out split every script makes the same
    way."""

    input_files: list[str] | None = input_files()
    reading: CorpusFormat = CorpusFormat()
    do_lower_case: bool = knob(True, "Lower-case and strip accents.")
    heldout_fraction: float = knob(
        0.05,
        "Fraction of documents held out (evaluation records; the vocabulary's UNK-rate "
        "measurement).",
    )
    random_seed: int = knob(12345, "Seed of the held-out split (and of instance creation).")


@dataclasses.dataclass(frozen=True)
class FinetuneStart:
    """Where a fine-tuning run starts: an encoder checkpoint in any format, or random weights for
    the baseline, and the vocabulary it was trained with (bert_tf.cli.finetune_start reads them)."""

    init_checkpoint: str = init_checkpoint(
        "the encoder's: a pre-training run (its latest checkpoint), an export, "
        "google-research/bert's bert_model.ckpt or a Hugging Face directory."
    )
    random_init: bool = knob(
        False, "Randomly initialised encoder (the baseline); needs --bert_config_file."
    )
    bert_config_file: str = knob("", "Model config; default: the checkpoint's own.")
    vocab_file: str | None = vocab_file(required=True)
    do_lower_case: bool = knob(True, "Lower-case and strip accents.")
