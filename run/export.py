"""Exports a pre-trained BERT (encoder and heads) in the formats the BERT world reads:

    python run/export.py --checkpoint=runs/demo --vocab_file=data/demo/vocab.txt \
        --output_dir=runs/demo_export

writes into <output_dir> (--format; by default all three for BERT, huggingface and saved_model for a
modern model, which has no google layout):
    google        bert_model.ckpt.*, bert_config.json, vocab.txt: google-research/bert's names
                  (run_classifier.py, NVIDIA's scripts, Hugging Face's google-checkpoint converter,
                  run/finetune.py --init_checkpoint)
    huggingface   config.json, model.safetensors, vocab.txt, tokenizer.json, tokenizer_config.json,
                  special_tokens_map.json and a README.md model card: transformers'
                  BertForPreTraining.from_pretrained(<output_dir>) (a modern model:
                  ModernBertForMaskedLM), AutoTokenizer.from_pretrained(...) (fast),
                  pipeline("fill-mask", model=<output_dir>)
    saved_model   saved_model/: serve(input_ids, input_mask, segment_ids) -> sequence_output,
                  pooled_output

--checkpoint takes any format run/pretrain.py --init_checkpoint takes (this project's checkpoints,
google's, a Hugging Face directory), so this also converts between them.
"""

import dataclasses
import os
import shlex
import sys

from bert_tf import ConfigError, cli, knob, knobs

FORMATS = ("google", "huggingface", "saved_model")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """run/export.py's flags: the checkpoint to read, its vocabulary, and the formats to write
    where."""

    checkpoint: str | None = knob(
        None,
        "Checkpoint: a pre-training run's folder (its latest) or checkpoint path, a "
        "google-research/bert bert_model.ckpt, or a Hugging Face directory.",
        required=True,
    )
    bert_config_file: str = knob(
        "", "Default: the checkpoint's own (bert_config.json / config.json)."
    )
    vocab_file: str | None = knobs.vocab_file(required=True)
    do_lower_case: bool = knob(True, "Written to tokenizer_config.json (Hugging Face).")
    format: list[str] = knob(
        [],
        f"Formats to write: any of {', '.join(FORMATS)} (default: every format the model has).",
        choices=FORMATS,
    )
    output_dir: str | None = knobs.output_dir("the export's files (--format)", required=True)


cli.define_config_flags(ExportConfig)


def main(_):
    cfg = cli.config_from_flags(ExportConfig)  # checked before TensorFlow loads
    import tensorflow as tf

    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.data import tokenization
    from bert_tf.model import modeling
    from bert_tf.tasks import classification

    vocab = tokenization.load_vocab(cfg.vocab_file)
    ckpt = checkpoint_formats.read(cfg.checkpoint)
    config = (
        modeling.BertConfig.from_json_file(cfg.bert_config_file)
        if cfg.bert_config_file
        else ckpt.config
    )
    if config is None:
        raise ConfigError(f"{ckpt.path}: no bert_config.json beside it: give --bert_config_file")
    checkpoint_formats.check_fits(ckpt, config, len(vocab), cfg.vocab_file)
    model = modeling.BertPretrainer(config, use_nsp="nsp/kernel" in ckpt.weights)
    checkpoint_formats.assign(model, ckpt)
    weights = checkpoint_formats.to_numpy(model)
    formats = _formats(cfg, config, ckpt.path)
    written = []
    if "google" in formats:
        written += checkpoint_formats.write_google(weights, config, cfg.vocab_file, cfg.output_dir)
    if "huggingface" in formats:
        written += _write_huggingface(cfg, config, ckpt, weights)
    if "saved_model" in formats:
        tf.saved_model.save(
            classification.ServingEncoder(model.encoder),
            os.path.join(cfg.output_dir, "saved_model"),
        )
        written.append("saved_model/")
    print(
        f"exported {ckpt.path} ({ckpt.format}) -> {cfg.output_dir}: "
        f"{', '.join(sorted(set(written)))}"
    )


def _formats(cfg: ExportConfig, config, checkpoint_path: str) -> list[str]:
    """--format, or every format the model has; raises if the google layout cannot hold it."""
    formats = cfg.format or [f for f in FORMATS if not (config.modern and f == "google")]
    if "google" in formats and config.modern:
        raise ConfigError(
            f"--format=google: {checkpoint_path} is a modern (ModernBERT) model, which "
            "google-research/bert's layout cannot hold: use --format=huggingface,saved_model"
        )
    if "google" in formats and config.hidden_act not in ("gelu", "relu", "tanh"):
        raise ConfigError(
            f"hidden_act {config.hidden_act!r} has no google-research/bert name: use "
            f"--format=huggingface,saved_model"
        )
    return formats


def _write_huggingface(cfg, config, ckpt, weights):
    """The transformers folder and its README.md model card; returns the names written."""
    from bert_tf.artifacts import checkpoint_formats, model_card

    written = checkpoint_formats.write_huggingface(
        weights, config, cfg.vocab_file, cfg.output_dir, cfg.do_lower_case
    )
    heads = "masked-LM and next-sentence heads" if "nsp/kernel" in weights else "a masked-LM head"
    written.append(
        model_card.write(
            cfg.output_dir,
            config,
            sum(v.size for v in weights.values()),
            ckpt.path,
            ckpt.format,
            "python " + shlex.join(sys.argv),
            heads,
        )
    )
    return written


if __name__ == "__main__":
    cli.run(main)
