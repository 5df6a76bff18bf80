"""Checkpoint formats in and out: this project's, google-research/bert's and Hugging Face's.

Reading gives the same thing whatever the format (`read(path)` -> `Checkpoint`): the model config
the checkpoint declares and a dict of numpy arrays keyed by our variable paths, e.g.
"encoder/layers/0/attention/query/kernel" (kernels [in, out], as in modeling.py). `assign` puts them
into a `BertPretrainer` or `BertEncoder`; `write_google` / `write_huggingface` write them out.

This module finds, reads, checks and writes the files; the names and shapes of each layout are in
artifacts/bert_format.py (a classic BERT: google's and Hugging Face's `BertForPreTraining`) and
artifacts/modernbert_format.py (a modern model: Hugging Face's ModernBERT)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from bert_tf import ConfigError
from bert_tf.artifacts import bert_format, checkpointing, modernbert_format
from bert_tf.model import modeling

OURS, GOOGLE, HUGGINGFACE = "bert_tf", "google", "huggingface"
HF_CONFIG, HF_WEIGHTS = "config.json", "model.safetensors"
GOOGLE_CONFIG, GOOGLE_CKPT = "bert_config.json", "bert_model.ckpt"

# Parts a checkpoint may lack (initialised at random): ModernBERT's masked-LM export has no pooler.
HEADS = {"MLM head": ("mlm_",), "NSP head": ("nsp/",), "pooler": ("encoder/pooler",)}


def _layers(weights):
    """Encoder layers in a dict keyed by our names (a Checkpoint's weights), of either
    architecture."""
    return max(
        bert_format.count_layers(weights, "encoder/layers/{}/attention/query/kernel"),
        bert_format.count_layers(weights, "encoder/layers/{}/attention/qkv/kernel"),
    )


def _first_mismatch(expected: dict, weights: dict):
    """(name, shape in `weights`, expected shape) of the first of `expected`'s {name: shape} that
    `weights` (our name -> array) holds with another shape, or None
    (checkpointing.shape_differences)."""
    mismatches, _, _ = checkpointing.shape_differences(
        expected, {name: value.shape for name, value in weights.items()}
    )
    return mismatches[0] if mismatches else None


def config_from_huggingface(values: dict, path: str) -> modeling.BertConfig:
    """Hugging Face config.json (already parsed) -> BertConfig; `path` names the file in errors."""
    model_type = values.get("model_type")
    if model_type == "modernbert":
        return modernbert_format.config_from_huggingface(values, path)
    if model_type != "bert":
        raise ConfigError(
            f"{path}: model_type is {model_type!r}, expected 'bert' or 'modernbert' (RoBERTa, "
            f"ALBERT and others have other weights and tokenizers)"
        )
    return bert_format.config_from_huggingface(values, path)


def expected_shapes(config: modeling.BertConfig, use_nsp=True) -> dict:
    """{our name: shape} of a BertPretrainer with `config`, without building a model."""
    if config.modern:
        return modernbert_format.expected_shapes(config, use_nsp)
    return bert_format.expected_shapes(config, use_nsp)


# ------------------------------------------------------------------------------------------ reading
@dataclasses.dataclass
class Checkpoint:
    format: str  # OURS, GOOGLE or HUGGINGFACE
    path: str  # the checkpoint prefix, or the Hugging Face directory
    weights_file: str  # the file the tensors came from (for messages)
    config: modeling.BertConfig | None
    config_file: str | None
    weights: dict  # our variable path -> np.ndarray


def locate(path: str) -> tuple[str, str]:
    """(format, path) without reading tensors: a TF checkpoint prefix (ours or google's, told apart
    by their names) or a Hugging Face directory. Raises naming `path` and what was looked for."""
    import tensorflow as tf

    if not path:
        raise ConfigError("empty checkpoint path")
    if path.endswith(".safetensors") and os.path.isfile(path):
        path = os.path.dirname(path) or "."
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, HF_CONFIG)) or os.path.exists(
            os.path.join(path, HF_WEIGHTS)
        ):
            return HUGGINGFACE, path
        # a bert_tf run's folder: its newest intact checkpoint (checkpointing.latest_intact says
        # what it passed over)
        prefix = checkpointing.latest_intact(path) or tf.train.latest_checkpoint(path)
        if not prefix and tf.io.gfile.exists(os.path.join(path, GOOGLE_CKPT + ".index")):
            prefix = os.path.join(path, GOOGLE_CKPT)
        if not prefix:
            raise ConfigError(
                f"{path}: unknown checkpoint format: found neither {HF_CONFIG} + {HF_WEIGHTS} "
                "(Hugging Face), nor a TensorFlow checkpoint ('checkpoint' index file or "
                f"{GOOGLE_CKPT}.index)"
            )
        path = prefix
    elif not tf.io.gfile.exists(path + ".index"):
        raise ConfigError(
            f"no such checkpoint: {path} ({path}.index not found, and not a directory)"
        )
    names = dict(tf.train.list_variables(path))
    if checkpointing.variable_key("model", "encoder/embeddings/word_embeddings") in names:
        return OURS, path
    if "bert/embeddings/word_embeddings" in names:
        return GOOGLE, path
    raise ConfigError(
        f"{path}: unknown checkpoint format: it has neither bert_tf's "
        f"model/encoder/embeddings/word_embeddings nor google-research/bert's "
        f"bert/embeddings/word_embeddings (first names: {sorted(names)[:3]})"
    )


def read(path: str) -> Checkpoint:
    """Reads any supported checkpoint; its config is checked against its tensors."""
    fmt, path = locate(path)
    if fmt == HUGGINGFACE:
        ckpt = _read_huggingface(path)
    else:
        ckpt = _read_tf(fmt, path)
    _check_consistent(ckpt)
    return ckpt


def _read_tf(fmt, prefix):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    if fmt == OURS:
        weights = {}
        for key in names:
            # None for optimizer slots and other items
            name = checkpointing.variable_path(key, "model")
            if name is not None:
                weights[name] = reader.get_tensor(key)
    else:
        weights = bert_format.from_google(names, reader.get_tensor)
    config_file = os.path.join(os.path.dirname(prefix), GOOGLE_CONFIG)
    config = (
        bert_format.config_from_google(_read_json(config_file), config_file)
        if os.path.isfile(config_file)
        else None
    )
    return Checkpoint(fmt, prefix, prefix, config, config_file if config else None, weights)


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


def _read_huggingface(directory):
    config_file = os.path.join(directory, HF_CONFIG)
    weights_file = os.path.join(directory, HF_WEIGHTS)
    _check_huggingface_files(directory, config_file, weights_file)
    config = config_from_huggingface(_read_json(config_file), config_file)
    tensors = _load_safetensors(weights_file)
    if config.modern:
        weights = modernbert_format.from_huggingface(tensors, config, weights_file)
    else:
        weights = bert_format.from_huggingface(tensors, weights_file)
    return Checkpoint(HUGGINGFACE, directory, weights_file, config, config_file, weights)


def _check_huggingface_files(directory, config_file, weights_file):
    """Raises unless `directory` holds config.json and model.safetensors, naming the weights files
    of other kinds it holds instead."""
    if not os.path.isfile(config_file):
        raise ConfigError(f"{directory}: Hugging Face directory without {HF_CONFIG}")
    if os.path.isfile(weights_file):
        return
    others = [
        f
        for f in ("pytorch_model.bin", "tf_model.h5", "model.safetensors.index.json")
        if os.path.exists(os.path.join(directory, f))
    ]
    found = (
        f" (found {', '.join(others)}, which this reader does not take: save the model with "
        "safe_serialization=True)"
        if others
        else ""
    )
    raise ConfigError(
        f"{weights_file} not found: a Hugging Face BERT directory needs {HF_WEIGHTS} beside "
        f"{HF_CONFIG}{found}"
    )


def _load_safetensors(weights_file) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(weights_file)
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"{weights_file} is not a readable safetensors file (a truncated download?): {e}"
        ) from None


def _check_consistent(ckpt: Checkpoint):
    """The checkpoint's own config must describe its tensors (a bert_config.json of another model
    fails here)."""
    if ckpt.config is None:
        return
    where = f"{ckpt.config_file} disagrees with the tensors in {ckpt.weights_file}"
    modernbert_format.check_architecture(ckpt.config, ckpt.weights, where)
    layers = _layers(ckpt.weights)
    if layers != ckpt.config.num_hidden_layers:
        raise ConfigError(
            f"{where}: num_hidden_layers is {ckpt.config.num_hidden_layers} but the checkpoint "
            f"holds {layers} layers"
        )
    mismatch = _first_mismatch(expected_shapes(ckpt.config), ckpt.weights)
    if mismatch:
        name, got, want = mismatch
        raise ConfigError(f"{where}: {name} should be {want} by the config but is {got}")


def check_fits(
    ckpt: Checkpoint,
    config: modeling.BertConfig,
    vocab_size: int | None = None,
    vocab_file: str = "",
    max_seq_length: int | None = None,
):
    """Raises ConfigError naming the checkpoint and the first mismatch with the model to be trained
    (before it is built): vocabulary size, hidden size, layers, position rows, then every shape."""
    w = ckpt.weights
    src = ckpt.weights_file
    word = w.get("encoder/embeddings/word_embeddings")
    if word is None:
        raise ConfigError(
            f"{src}: no word embeddings ({ckpt.format} checkpoint without an encoder?)"
        )
    # first: the clearest of the mismatches it causes
    modernbert_format.check_architecture(config, w, src)
    if vocab_size is not None and word.shape[0] != vocab_size:
        raise ConfigError(
            f"{src}: its vocabulary has {word.shape[0]} tokens but the vocab file "
            f"{vocab_file + ' ' if vocab_file else ''}has {vocab_size}: use the vocab.txt that "
            "came with the checkpoint"
        )
    if word.shape[1] != config.hidden_size:
        raise ConfigError(
            f"{src}: hidden size {word.shape[1]} but the model's hidden_size is "
            f"{config.hidden_size}"
        )
    layers = _layers(w)
    if layers != config.num_hidden_layers:
        raise ConfigError(
            f"{src}: {layers} layers but the model has num_hidden_layers={config.num_hidden_layers}"
        )
    positions = w.get("encoder/embeddings/position_embeddings")
    if positions is not None and max_seq_length is not None and positions.shape[0] < max_seq_length:
        raise ConfigError(
            f"{src}: the position table has {positions.shape[0]} rows, fewer than "
            f"--max_seq_length={max_seq_length}"
        )
    mismatch = _first_mismatch(expected_shapes(config), w)
    if mismatch:
        name, got, want = mismatch
        raise ConfigError(f"{src}: {name} is {got} but the model expects {want}")


# ------------------------------------------------------------------------------------------ models
def model_variables(model) -> dict:
    """{our name: tf.Variable} of a BertPretrainer (or, under "encoder/", a BertEncoder)."""
    variables = checkpointing.module_variables(model)
    if isinstance(model, modeling.BertPretrainer):
        return variables
    return {f"encoder/{name}": var for name, var in variables.items()}


def assign(model, ckpt: Checkpoint, log=print) -> list:
    """Copies the checkpoint's weights into `model`; returns the heads left at their initial values.
    The encoder must be complete; a missing head is said in one log line. Every shape is checked
    before the first weight is copied, so a failure leaves the model as it was."""
    variables = model_variables(model)
    mismatches, missing, _ = checkpointing.shape_differences(
        {name: var.shape for name, var in variables.items()},
        {name: value.shape for name, value in ckpt.weights.items()},
    )
    encoder_missing = [
        n for n in missing if n.startswith("encoder/") and not n.startswith("encoder/pooler")
    ]
    if encoder_missing:
        raise ConfigError(
            f"{ckpt.weights_file}: {len(encoder_missing)} encoder weights missing, e.g. "
            f"{encoder_missing[0]}"
        )
    if mismatches:
        name, got, want = mismatches[0]
        raise ConfigError(f"{ckpt.weights_file}: {name} is {got} but the model expects {want}")
    for name, var in variables.items():
        if name in ckpt.weights:
            var.assign(ckpt.weights[name].astype(np.float32, copy=False))
    fresh = [
        head for head, prefixes in HEADS.items() if any(n.startswith(prefixes) for n in missing)
    ]
    if fresh:
        log(f"{' and '.join(fresh)} not in {ckpt.weights_file}: initialised at random")
    return fresh


def to_numpy(model) -> dict:
    return {name: var.numpy() for name, var in model_variables(model).items()}


# ------------------------------------------------------------------------------------------ writing
def write_google(weights: dict, config: modeling.BertConfig, vocab_file: str, out_dir: str) -> list:
    """bert_model.ckpt.{index,data-*} under google's names, bert_config.json, vocab.txt."""
    import tensorflow as tf

    from bert_tf.data import tokenization

    if config.modern:
        raise ConfigError(
            "a modern model has no google-research/bert layout: export it with "
            "--format=huggingface (transformers' ModernBertForMaskedLM) or saved_model"
        )
    if config.hidden_act not in ("gelu", "relu", "tanh"):
        raise ConfigError(
            f"hidden_act {config.hidden_act!r} has no google-research/bert name (its 'gelu' is the "
            f"tanh form): export this model with --format=huggingface,saved_model"
        )
    named = bert_format.to_google(weights)
    names, tensors = list(named), [tf.constant(value) for value in named.values()]
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, GOOGLE_CKPT)
    # A name-based (TF1) checkpoint, no object graph: what tf.compat.v1.train.Saver writes.
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    config.to_json_file(os.path.join(out_dir, GOOGLE_CONFIG))
    tokenization.copy_vocab(vocab_file, out_dir)
    return [
        GOOGLE_CKPT + ".index",
        GOOGLE_CKPT + ".data-00000-of-00001",
        GOOGLE_CONFIG,
        "vocab.txt",
    ]


def write_huggingface(
    weights: dict,
    config: modeling.BertConfig,
    vocab_file: str,
    out_dir: str,
    do_lower_case: bool = True,
    hf_config: dict | None = None,
) -> list:
    """config.json, model.safetensors (transformers' names) and the tokenizer files
    (tokenization.write_tokenizer_files). hf_config: config.json's content (default:
    BertForPreTraining's, bert_format.config_to_huggingface)."""
    from safetensors.numpy import save_file

    from bert_tf.data import tokenization

    modernbert_format.check_architecture(config, weights, "the model")
    if config.modern:  # ModernBertForMaskedLM's names and config
        tensors = modernbert_format.to_huggingface(weights, config)
        hf_config = hf_config or modernbert_format.config_to_huggingface(
            config, tokenization.load_vocab(vocab_file).index
        )
    else:
        tensors = bert_format.to_huggingface(weights)
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, HF_WEIGHTS + ".tmp")
    # transformers refuses files without this metadata
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, HF_WEIGHTS))
    with open(os.path.join(out_dir, HF_CONFIG), "w") as f:
        json.dump(
            hf_config or bert_format.config_to_huggingface(config), f, indent=2, sort_keys=True
        )
        f.write("\n")
    return [HF_CONFIG, HF_WEIGHTS] + tokenization.write_tokenizer_files(
        vocab_file,
        out_dir,
        do_lower_case,
        config.max_position_embeddings,
        model_input_names=["input_ids", "attention_mask"] if config.modern else None,
    )
