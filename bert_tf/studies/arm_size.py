"""A raced arm's size, read from its run folder: its parameters, those of its transformer layers
and their forward FLOPs per token. The recipe race compares models of matched compute (issue 49:
a FLOP-matched modern-mini beside the smaller one), so its tables carry these beside the
accuracies."""

from __future__ import annotations

import os

from bert_tf import ConfigError
from bert_tf.model.config import BertConfig
from bert_tf.tools import flops, model_shapes

SIZE_KEYS = ("parameters", "encoder_parameters", "encoder_flops_per_token")


def model_size(run_dir: str, run_record: dict) -> dict:
    """The run's parameters (its run record), those of its transformer layers and their forward
    FLOPs per token (from its bert_config.json and sequence length): the size-matching of arms."""
    out = {"parameters": run_record["parameters"]} if "parameters" in run_record else {}
    path = os.path.join(run_dir, "bert_config.json")
    ran = run_record.get("resolved") or run_record.get("config") or {}
    seq = ran.get("max_seq_length")
    if os.path.exists(path) and seq:
        try:
            config = BertConfig.from_json_file(path)
        except ConfigError:  # a config this version cannot read: the report goes on without sizes
            return out
        out["encoder_parameters"] = model_shapes.encoder_parameter_count(config)
        out["encoder_flops_per_token"] = flops.encoder_flops_per_token(config, seq)
    return out


def size_line(row: dict) -> list:
    """The arm's size, if its run dir told it: a race compares models of matched compute."""
    if not all(key in row for key in SIZE_KEYS):
        return []
    millions = {key: row[key] / 1e6 for key in SIZE_KEYS}
    return [
        f"  model: {millions['parameters']:.2f} M parameters, "
        f"{millions['encoder_parameters']:.2f} M in its layers, "
        f"{millions['encoder_flops_per_token']:.2f} MFLOP per token in them"
    ]
