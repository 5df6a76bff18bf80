"""Checkpoint formats in and out: this project's, google-research/bert's and Hugging Face's.

Reading gives the same thing whatever the format (`read(path)` -> `Checkpoint`): the model config
the checkpoint declares and a dict of numpy arrays keyed by our variable paths, e.g.
"encoder/layers/0/attention/query/kernel" (kernels [in, out], as in modeling.py). `assign` puts them
into a `BertPretrainer` or `BertEncoder`; `write_google` / `write_huggingface` write them out.

    ours (tf.train.Checkpoint)     google-research/bert (name-based TF1)       Hugging Face (safetensors)
    encoder/embeddings/word_emb..  bert/embeddings/word_embeddings             bert.embeddings.word_embeddings.weight
    encoder/layers/N/attention/q.. bert/encoder/layer_N/attention/self/query   bert.encoder.layer.N.attention.self.query
    mlm_output_bias                cls/predictions/output_bias                 cls.predictions.bias
    nsp/kernel [H, 2]              cls/seq_relationship/output_weights [2, H]  cls.seq_relationship.weight [2, H]

Hugging Face stores linear weights as [out, in] (torch.nn.Linear): kernels are transposed; its MLM
decoder is tied to the word embeddings, not stored. Our (and google's) "gelu" is the tanh form,
Hugging Face's "gelu_new"; its "gelu" is the exact erf form (our "gelu_exact"). A modern model
(architecture "modern") reads and writes ModernBERT's layout instead:
artifacts/modernbert_format.py."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from bert_tf import ConfigError
from bert_tf.artifacts import checkpointing, modernbert_format
from bert_tf.model import modeling

OURS, GOOGLE, HUGGINGFACE = "bert_tf", "google", "huggingface"
HF_CONFIG, HF_WEIGHTS = "config.json", "model.safetensors"
GOOGLE_CONFIG, GOOGLE_CKPT = "bert_config.json", "bert_model.ckpt"

# hidden_act: ours -> Hugging Face, and Hugging Face -> ours.
_ACT_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "tanh": "tanh"}
_ACT_FROM_HF = {
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu": "gelu_exact",
    "relu": "relu",
    "tanh": "tanh",
}
# Parts a checkpoint may lack (initialised at random): ModernBERT's masked-LM export has no pooler.
HEADS = {"MLM head": ("mlm_",), "NSP head": ("nsp/",), "pooler": ("encoder/pooler",)}


# ------------------------------------------------------------------------------------------ names
def _table(num_layers):
    """[(ours, google, huggingface, kind)]; kind "kernel" is [in, out] in ours and google, [out, in]
    in HF; "nsp" is [H, 2] in ours and [2, H] in both others; anything else is stored as is."""
    rows = []

    def dense(ours, google, hf):
        rows.append((f"{ours}/kernel", f"{google}/kernel", f"{hf}.weight", "kernel"))
        rows.append((f"{ours}/bias", f"{google}/bias", f"{hf}.bias", "vector"))

    def norm(ours, google, hf):
        rows.append((f"{ours}/gamma", f"{google}/gamma", f"{hf}.weight", "vector"))
        rows.append((f"{ours}/beta", f"{google}/beta", f"{hf}.bias", "vector"))

    for table in ("word", "position", "token_type"):
        rows.append(
            (
                f"encoder/embeddings/{table}_embeddings",
                f"bert/embeddings/{table}_embeddings",
                f"bert.embeddings.{table}_embeddings.weight",
                "vector",
            )
        )
    norm("encoder/embeddings/layer_norm", "bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    for i in range(num_layers):
        o, g, h = f"encoder/layers/{i}", f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for qkv in ("query", "key", "value"):
            dense(f"{o}/attention/{qkv}", f"{g}/attention/self/{qkv}", f"{h}.attention.self.{qkv}")
        dense(f"{o}/attention/output", f"{g}/attention/output/dense", f"{h}.attention.output.dense")
        norm(
            f"{o}/attention_layer_norm",
            f"{g}/attention/output/LayerNorm",
            f"{h}.attention.output.LayerNorm",
        )
        dense(f"{o}/intermediate", f"{g}/intermediate/dense", f"{h}.intermediate.dense")
        dense(f"{o}/output", f"{g}/output/dense", f"{h}.output.dense")
        norm(f"{o}/output_layer_norm", f"{g}/output/LayerNorm", f"{h}.output.LayerNorm")
    dense("encoder/pooler", "bert/pooler/dense", "bert.pooler.dense")
    dense("mlm_transform", "cls/predictions/transform/dense", "cls.predictions.transform.dense")
    norm(
        "mlm_layer_norm",
        "cls/predictions/transform/LayerNorm",
        "cls.predictions.transform.LayerNorm",
    )
    rows.append(
        ("mlm_output_bias", "cls/predictions/output_bias", "cls.predictions.bias", "vector")
    )
    rows.append(
        ("nsp/kernel", "cls/seq_relationship/output_weights", "cls.seq_relationship.weight", "nsp")
    )
    rows.append(
        ("nsp/bias", "cls/seq_relationship/output_bias", "cls.seq_relationship.bias", "vector")
    )
    # fine-tuned heads: run_classifier.py's and BertForSequenceClassification's, run_squad.py's and
    # BertForQuestionAnswering's (both [labels, H] there, like the NSP head)
    rows.append(("classifier/kernel", "output_weights", "classifier.weight", "nsp"))
    rows.append(("classifier/bias", "output_bias", "classifier.bias", "vector"))
    rows.append(("span/kernel", "cls/squad/output_weights", "qa_outputs.weight", "nsp"))
    rows.append(("span/bias", "cls/squad/output_bias", "qa_outputs.bias", "vector"))
    return rows


def _count_layers(names, pattern):
    """Layers present in `names`, where pattern.format(i) is a name layer i has."""
    return next(n for n in range(len(names) + 1) if pattern.format(n) not in names)


def _layers(weights):
    """Encoder layers in a dict keyed by our names (a Checkpoint's weights), of either
    architecture."""
    return max(
        _count_layers(weights, "encoder/layers/{}/attention/query/kernel"),
        _count_layers(weights, "encoder/layers/{}/attention/qkv/kernel"),
    )


def _first_mismatch(expected: dict, weights: dict):
    """(name, shape in `weights`, expected shape) of the first of `expected`'s {name: shape} that
    `weights` (our name -> array) holds with another shape, or None
    (checkpointing.shape_differences)."""
    mismatches, _, _ = checkpointing.shape_differences(
        expected, {name: value.shape for name, value in weights.items()}
    )
    return mismatches[0] if mismatches else None


# ------------------------------------------------------------------------------------------ configs
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
    act = values.get("hidden_act", "gelu")
    if act not in _ACT_FROM_HF:
        raise ConfigError(
            f"{path}: hidden_act {act!r} is not supported; expected one of {sorted(_ACT_FROM_HF)}"
        )
    if values.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(
            f"{path}: position_embedding_type {values['position_embedding_type']!r} is not "
            f"supported; expected 'absolute'"
        )
    eps = values.get("layer_norm_eps", 1e-12)
    if not np.isclose(eps, 1e-12, rtol=1e-3, atol=0):
        raise ConfigError(f"{path}: layer_norm_eps {eps} is not supported; expected 1e-12 (BERT's)")
    fields = {f.name for f in dataclasses.fields(modeling.BertConfig)}
    try:
        return modeling.BertConfig.from_dict(
            {**{k: v for k, v in values.items() if k in fields}, "hidden_act": _ACT_FROM_HF[act]}
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


def config_to_huggingface(
    config: modeling.BertConfig, architecture="BertForPreTraining", labels=None, regression=False
) -> dict:
    """transformers' config.json. labels: a classifier's label names (id2label / label2id);
    regression: one output under mean squared error (problem_type "regression")."""
    values = config.to_dict()
    values["hidden_act"] = _ACT_TO_HF[config.hidden_act]
    out = {
        "architectures": [architecture],
        "model_type": "bert",
        **values,
        "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
    }
    if regression:
        out.update(
            num_labels=1, problem_type="regression", id2label={"0": "score"}, label2id={"score": 0}
        )
    elif labels is not None:
        out.update(
            num_labels=len(labels),
            problem_type="single_label_classification",
            id2label={str(i): name for i, name in enumerate(labels)},
            label2id={name: i for i, name in enumerate(labels)},
        )
    return out


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
                "(Hugging Face), "
                f"nor a TensorFlow checkpoint ('checkpoint' index file or {GOOGLE_CKPT}.index)"
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
    weights = {}
    if fmt == OURS:
        for key in names:
            name = checkpointing.variable_path(
                key, "model"
            )  # None for optimizer slots and other items
            if name is not None:
                weights[name] = reader.get_tensor(key)
    else:
        layers = _count_layers(names, "bert/encoder/layer_{}/attention/self/query/kernel")
        for ours, google, _, kind in _table(layers):
            if (
                google in names
            ):  # global_step and optimizer slots (adam_m, adam_v, LAMB's) are not in the table
                value = reader.get_tensor(google)
                weights[ours] = value.T if kind == "nsp" else value
    config_file = os.path.join(os.path.dirname(prefix), GOOGLE_CONFIG)
    config = _read_google_config(config_file) if os.path.isfile(config_file) else None
    return Checkpoint(fmt, prefix, prefix, config, config_file if config else None, weights)


# Fields of google's multilingual/Chinese bert_config.json that its modeling.py never reads.
_GOOGLE_UNUSED = (
    "directionality",
    "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers",
    "pooler_size_per_head",
    "pooler_type",
)


def _read_google_config(path):
    try:
        with open(path) as f:
            values = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    try:
        return modeling.BertConfig.from_dict(
            {k: v for k, v in values.items() if k not in _GOOGLE_UNUSED}
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


def _read_huggingface(directory):
    config_file = os.path.join(directory, HF_CONFIG)
    weights_file = os.path.join(directory, HF_WEIGHTS)
    if not os.path.isfile(config_file):
        raise ConfigError(f"{directory}: Hugging Face directory without {HF_CONFIG}")
    if not os.path.isfile(weights_file):
        others = [
            f
            for f in ("pytorch_model.bin", "tf_model.h5", "model.safetensors.index.json")
            if os.path.exists(os.path.join(directory, f))
        ]
        raise ConfigError(
            f"{weights_file} not found: a Hugging Face BERT directory needs {HF_WEIGHTS} beside "
            f"{HF_CONFIG}"
            + (
                f" (found {', '.join(others)}, which this reader does not take: save the model "
                "with "
                f"safe_serialization=True)"
                if others
                else ""
            )
        )
    try:
        with open(config_file) as f:
            values = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{config_file} is not valid JSON: {e}") from None
    config = config_from_huggingface(values, config_file)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(weights_file)
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"{weights_file} is not a readable safetensors file (a truncated download?): {e}"
        ) from None
    if config.modern:
        return Checkpoint(
            HUGGINGFACE,
            directory,
            weights_file,
            config,
            config_file,
            modernbert_format.from_huggingface(tensors, config, weights_file),
        )
    # A bare BertModel is saved without the "bert." prefix; old checkpoints say gamma/beta for
    # LayerNorm.
    if not any(k.startswith("bert.") for k in tensors):
        tensors = {("bert." + k if not k.startswith("cls.") else k): v for k, v in tensors.items()}
    tensors = {
        k.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias"
        ): v
        for k, v in tensors.items()
    }
    if "cls.predictions.bias" not in tensors and "cls.predictions.decoder.bias" in tensors:
        tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
    decoder = tensors.get("cls.predictions.decoder.weight")
    word = tensors.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and word is not None and not np.array_equal(decoder, word):
        raise ConfigError(
            f"{weights_file}: cls.predictions.decoder.weight differs from the word embeddings; "
            f"BERT ties them (an untied decoder is not supported)"
        )
    layers = _count_layers(tensors, "bert.encoder.layer.{}.attention.self.query.weight")
    weights = {}
    for ours, _, hf, kind in _table(layers):
        if hf in tensors:
            value = tensors[hf]
            weights[ours] = np.ascontiguousarray(value.T) if kind in ("kernel", "nsp") else value
    return Checkpoint(HUGGINGFACE, directory, weights_file, config, config_file, weights)


def expected_shapes(config: modeling.BertConfig, use_nsp=True) -> dict:
    """{our name: shape} of a BertPretrainer with `config` (the table above, without building a
    model)."""
    if config.modern:
        return modernbert_format.expected_shapes(config, use_nsp)
    c = config
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    shapes = {
        "encoder/embeddings/word_embeddings": [v, h],
        "encoder/embeddings/position_embeddings": [c.max_position_embeddings, h],
        "encoder/embeddings/token_type_embeddings": [c.type_vocab_size, h],
        "mlm_output_bias": [v],
        "nsp/kernel": [h, 2],
        "nsp/bias": [2],
    }
    for ours, _, _, kind in _table(c.num_hidden_layers):
        if ours in shapes or ours.startswith(
            ("classifier/", "span/")
        ):  # fine-tuned heads: the task's shape
            continue
        if "/intermediate/" in ours:
            shapes[ours] = [h, i] if kind == "kernel" else [i]
        elif "/layers/" in ours and ours.split("/")[3] == "output" and kind == "kernel":
            shapes[ours] = [i, h]
        else:
            shapes[ours] = [h, h] if kind == "kernel" else [h]
    if not use_nsp:
        shapes = {k: s for k, s in shapes.items() if not k.startswith("nsp/")}
    return shapes


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
    modernbert_format.check_architecture(
        config, w, src
    )  # first: the clearest of the mismatches it causes
    if vocab_size is not None and word.shape[0] != vocab_size:
        raise ConfigError(
            f"{src}: its vocabulary has {word.shape[0]} tokens but the vocab file "
            f"{vocab_file + ' ' if vocab_file else ''}has {vocab_size}: use the vocab.txt that "
            "came "
            f"with the checkpoint"
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
            f"{ckpt.weights_file}: {len(encoder_missing)} encoder weights missing, "
            f"e.g. {encoder_missing[0]}"
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
def _tables(weights):
    return _table(_layers(weights))


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
            f"hidden_act {config.hidden_act!r} has no google-research/bert name (its 'gelu' is "
            f"the tanh form): export this model with --format=huggingface,saved_model"
        )
    names, tensors = [], []
    for ours, google, _, kind in _tables(weights):
        if ours in weights:
            names.append(google)
            tensors.append(tf.constant(weights[ours].T if kind == "nsp" else weights[ours]))
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
    BertForPreTraining's, config_to_huggingface)."""
    from safetensors.numpy import save_file

    from bert_tf.data import tokenization

    modernbert_format.check_architecture(config, weights, "the model")
    if config.modern:  # ModernBertForMaskedLM's names and config
        tensors = modernbert_format.to_huggingface(weights, config)
        hf_config = hf_config or modernbert_format.config_to_huggingface(
            config, tokenization.load_vocab(vocab_file).index
        )
    else:
        tensors = {
            hf: np.ascontiguousarray(
                weights[ours].T if kind in ("kernel", "nsp") else weights[ours], np.float32
            )
            for ours, _, hf, kind in _tables(weights)
            if ours in weights
        }
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, HF_WEIGHTS + ".tmp")
    save_file(
        tensors, tmp, metadata={"format": "pt"}
    )  # transformers refuses files without this metadata
    os.replace(tmp, os.path.join(out_dir, HF_WEIGHTS))
    with open(os.path.join(out_dir, HF_CONFIG), "w") as f:
        json.dump(hf_config or config_to_huggingface(config), f, indent=2, sort_keys=True)
        f.write("\n")
    return [HF_CONFIG, HF_WEIGHTS] + tokenization.write_tokenizer_files(
        vocab_file,
        out_dir,
        do_lower_case,
        config.max_position_embeddings,
        model_input_names=["input_ids", "attention_mask"] if config.modern else None,
    )
