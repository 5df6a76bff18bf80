"""The README.md that goes with a Hugging Face export: what the model is, what it was trained on,
for how long, how good its masked-LM is on held-out data, and the commands that made it.

What a bert_tf run knows is read from its folder (the checkpoint's ckpt-N.json, metrics.jsonl's run
record and its held-out evaluations); a google or Hugging Face checkpoint brought in from elsewhere
gets its architecture and a line saying that its training is not recorded here.
"""

from __future__ import annotations

import json
import os

from bert_tf.artifacts import bert_format, metrics, modernbert_format
from bert_tf.model import modeling


def provenance(checkpoint_path: str) -> dict:
    """What the run that wrote `checkpoint_path` (a bert_tf ckpt-N prefix) recorded; {} for other
    sources."""
    info = {}
    meta = checkpoint_path + ".json"
    if os.path.exists(meta):
        with open(meta) as f:
            info["checkpoint"] = json.load(f)
    log = os.path.join(os.path.dirname(checkpoint_path), "metrics.jsonl")
    if info and os.path.exists(log):
        step = info["checkpoint"]["step"]
        records = metrics.read_metrics(log, growing=True)
        runs = [r for r in records if r.get("kind") == "run" and r.get("step", 0) <= step]
        evals = [r for r in records if r.get("kind") == "eval" and r.get("step") == step]
        if runs:
            info["run"] = runs[-1]
        if evals:
            info["eval"] = evals[-1]
    return info


def render(
    config: modeling.BertConfig,
    parameters: int,
    source: str,
    source_format: str,
    info: dict,
    export_command: str,
    heads: str,
) -> str:
    """The model card's markdown (Hugging Face's YAML header first)."""
    lines = [
        *_header(config, source, source_format, heads),
        *_architecture(config, parameters),
        *_training(info),
        *_use(config),
        "## Export",
        "",
        f"`{export_command}`",
        "",
    ]
    return "\n".join(lines)


def _family(config: modeling.BertConfig) -> str:
    return "ModernBERT" if config.modern else "BERT"


def _header(config: modeling.BertConfig, source: str, source_format: str, heads: str) -> list:
    """Hugging Face's YAML header, the title and what the model is."""
    family = _family(config)
    return [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags:",
        f"- {family.lower()}",
        "- bert_tf",
        "- fill-mask",
        "---",
        "",
        f"# {family} ({config.num_hidden_layers} layers, hidden {config.hidden_size})",
        "",
        f"A {family} encoder with {heads}, exported by bert_tf from `{source}` ({source_format} "
        "format).",
        "",
    ]


def _architecture(config: modeling.BertConfig, parameters: int) -> list:
    """The sizes as a one-row table; the activation as config.json names it."""
    c = config
    activation = (modernbert_format.ACT_TO_HF if c.modern else bert_format.ACT_TO_HF)[c.hidden_act]
    return [
        "## Architecture",
        "",
        *([modernbert_format.describe(c) + ".", ""] if c.modern else []),
        "| layers | hidden | attention heads | intermediate | activation | vocabulary | positions "
        "| parameters |",
        "|---|---|---|---|---|---|---|---|",
        f"| {c.num_hidden_layers} | {c.hidden_size} | {c.num_attention_heads} | "
        f"{c.intermediate_size} | {activation} | {c.vocab_size} | "
        f"{'RoPE' if c.modern else c.max_position_embeddings} | {parameters:,} |",
        "",
    ]


def _training(info: dict) -> list:
    """What `provenance` found: updates, data, optimizer, held-out accuracy, command."""
    lines = ["## Training", ""]
    if "checkpoint" not in info:
        lines.append(
            "Not recorded here: this export was converted from a checkpoint bert_tf did not train."
        )
        return lines
    ckpt = info["checkpoint"]
    ranks = ckpt.get("ranks", "?")
    lines.append(
        f"- updates: {ckpt['step']:,} ({ckpt.get('samples_seen', 0):,} sequences; global batch "
        f"{ckpt.get('global_batch', '?')} on {ranks} rank{'' if ranks == 1 else 's'})"
    )
    cfg = info.get("run", {}).get("resolved") or info.get("run", {}).get("config")
    if cfg:
        lines += _run_settings(cfg)
    evaluation = info.get("eval")
    if evaluation:
        lines.append(_evaluation(evaluation, cfg))
    else:
        lines.append("- held-out masked-LM accuracy: not evaluated at this update")
    command = info.get("run", {}).get("command")
    lines.append(f"- command (each rank): `{command}`" if command else "- command: not recorded")
    return lines


def _run_settings(cfg: dict) -> list:
    """The data and optimizer lines of a run's recorded config."""
    objective = (
        "masked LM only" if cfg.get("mlm_only") else "masked LM and next-sentence prediction"
    )
    return [
        f"- data: `{cfg.get('train_files')}`, sequence length {cfg.get('max_seq_length')}, "
        f"{objective}",
        f"- optimizer: {cfg.get('optimizer')}, peak learning rate {cfg.get('learning_rate')}, "
        f"warmup {cfg.get('warmup_steps')} of {cfg.get('total_steps')} updates, precision "
        f"{cfg.get('precision')}",
    ]


def _evaluation(evaluation: dict, cfg: dict | None) -> str:
    """The held-out accuracy line of an eval record (cfg: the run's config, for the eval files)."""
    nsp = (
        f", next-sentence accuracy {evaluation['eval_nsp_accuracy']:.4f}"
        if "eval_nsp_accuracy" in evaluation
        else ""
    )
    return (
        f"- held-out masked-LM accuracy {evaluation['eval_mlm_accuracy']:.4f} at update "
        f"{evaluation['step']:,} on {int(evaluation.get('eval_sequences', 0)):,} sequences of "
        f"`{cfg.get('eval_files') if cfg else '?'}`{nsp}"
    )


def _use(config: modeling.BertConfig) -> list:
    """How to load the folder, and what bert_tf's tests check of it."""
    if config.modern:
        checked = (
            "transformers' ModernBertForMaskedLM (PyTorch) reads this folder; bert_tf's tests "
            "check its config.json with transformers' ModernBertConfig and its logits with a NumPy "
            "forward pass written from transformers' modeling_modernbert.py."
        )
    else:
        checked = (
            "bert_tf's tests run this pipeline with transformers' TensorFlow classes. The folder "
            "also holds google-research/bert's files when exported with them (bert_model.ckpt.*, "
            "bert_config.json)."
        )
    return [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        'fill = pipeline("fill-mask", model="path/to/this/folder")',
        'fill("The capital of France is [MASK].")',
        "```",
        "",
        "tokenizer.json is the fast (Rust) tokenizer; it gives google-research/bert's ids.",
        "",
        checked,
        "",
    ]


def write(
    out_dir: str,
    config: modeling.BertConfig,
    parameters: int,
    source: str,
    source_format: str,
    export_command: str,
    heads: str,
) -> str:
    """Writes <out_dir>/README.md; returns its name."""
    os.makedirs(out_dir, exist_ok=True)
    text = render(
        config, parameters, source, source_format, provenance(source), export_command, heads
    )
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)
    return "README.md"
