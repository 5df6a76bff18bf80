"""Masking at start-up: the records' own masks, or --dynamic_masking's masker at a fixed rate or
at --masked_lm_prob_end's scheduled one (input_pipeline.MaskingRate)."""

from __future__ import annotations

from bert_tf.data import input_pipeline, tokenization
from bert_tf.train.pretrain_config import PretrainConfig


def make_masker(cfg: PretrainConfig, tokenizer: tokenization.Tokenizer, rate=None):
    """--dynamic_masking's masker (input_pipeline.dynamic_masker), or None: the records' masks.
    rate: a MaskingRate (--masked_lm_prob_end) or a fixed rate; default --masked_lm_prob."""
    if not cfg.dynamic_masking:
        return None
    return input_pipeline.dynamic_masker(
        len(tokenizer),
        [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id],
        cfg.max_predictions_per_seq,
        cfg.masked_lm_prob if rate is None else getattr(rate, "variable", rate),
        tokenizer.mask_id,
    )


def scheduled_rate(cfg: PretrainConfig, trainer) -> input_pipeline.MaskingRate | None:
    """--masked_lm_prob_end's rate, set for the restored step before any batch is masked."""
    if cfg.masked_lm_prob_end is None:
        return None
    rate = input_pipeline.MaskingRate(cfg.masked_lm_prob, cfg.masked_lm_prob_end)
    rate.follow(int(trainer.step.numpy()), int(trainer.schedule[1].numpy()))
    return rate
