"""A classic BERT in the two layouts the BERT world reads: google-research/bert's name-based TF1
checkpoint and Hugging Face's `BertForPreTraining` (config.json, model.safetensors), both ways.

    ours (tf.train.Checkpoint)      google-research/bert (name-based TF1)
                                      Hugging Face (safetensors)
    encoder/embeddings/word_emb..   bert/embeddings/word_embeddings
                                      bert.embeddings.word_embeddings.weight
    encoder/layers/N/attention/q..  bert/encoder/layer_N/attention/self/query
                                      bert.encoder.layer.N.attention.self.query
    mlm_output_bias                 cls/predictions/output_bias
                                      cls.predictions.bias
    nsp/kernel [H, 2]               cls/seq_relationship/output_weights [2, H]
                                      cls.seq_relationship.weight [2, H]

Hugging Face stores linear weights as [out, in] (torch.nn.Linear): kernels are transposed; its MLM
decoder is tied to the word embeddings, not stored. Our (and google's) "gelu" is the tanh form,
Hugging Face's "gelu_new"; its "gelu" is the exact erf form (our "gelu_exact"). A modern model has
ModernBERT's layout instead: modernbert_format.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_tf import ConfigError
from bert_tf.model import modeling

# hidden_act: ours -> Hugging Face, and Hugging Face -> ours.
ACT_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "tanh": "tanh"}
ACT_FROM_HF = {
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu": "gelu_exact",
    "relu": "relu",
    "tanh": "tanh",
}
# Fields of google's multilingual/Chinese bert_config.json that its modeling.py never reads.
GOOGLE_UNUSED = (
    "directionality",
    "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers",
    "pooler_size_per_head",
    "pooler_type",
)


# ------------------------------------------------------------------------------------------ names
def table(num_layers):
    """[(ours, google, huggingface, kind)]; kind "kernel" is [in, out] in ours and google, [out, in]
    in HF; "nsp" is [H, 2] in ours and [2, H] in both others; anything else is stored as is."""
    rows = []

    def dense(ours, google, hf):
        rows.append((f"{ours}/kernel", f"{google}/kernel", f"{hf}.weight", "kernel"))
        rows.append((f"{ours}/bias", f"{google}/bias", f"{hf}.bias", "vector"))

    def norm(ours, google, hf):
        rows.append((f"{ours}/gamma", f"{google}/gamma", f"{hf}.weight", "vector"))
        rows.append((f"{ours}/beta", f"{google}/beta", f"{hf}.bias", "vector"))

    for embedding in ("word", "position", "token_type"):
        rows.append(
            (
                f"encoder/embeddings/{embedding}_embeddings",
                f"bert/embeddings/{embedding}_embeddings",
                f"bert.embeddings.{embedding}_embeddings.weight",
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


def count_layers(names, pattern):
    """Layers present in `names`, where pattern.format(i) is a name layer i has."""
    return next(n for n in range(len(names) + 1) if pattern.format(n) not in names)


def _weights_table(weights):
    """The table for {our name: array}: as many layers as `weights` holds."""
    return table(count_layers(weights, "encoder/layers/{}/attention/query/kernel"))


def expected_shapes(config: modeling.BertConfig, use_nsp=True) -> dict:
    """{our name: shape} of a classic BertPretrainer with `config` (the table, without building a
    model)."""
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
    for ours, _, _, kind in table(c.num_hidden_layers):
        # fine-tuned heads have the task's shape
        if ours in shapes or ours.startswith(("classifier/", "span/")):
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


# ------------------------------------------------------------------------------------------ configs
def config_from_google(values: dict, path: str) -> modeling.BertConfig:
    """bert_config.json (already parsed) -> BertConfig; `path` names the file in errors."""
    try:
        return modeling.BertConfig.from_dict(
            {k: v for k, v in values.items() if k not in GOOGLE_UNUSED}
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


def config_from_huggingface(values: dict, path: str) -> modeling.BertConfig:
    """BertConfig's config.json (already parsed, model_type "bert") -> BertConfig; `path` names the
    file in errors."""
    act = values.get("hidden_act", "gelu")
    if act not in ACT_FROM_HF:
        raise ConfigError(
            f"{path}: hidden_act {act!r} is not supported; expected one of {sorted(ACT_FROM_HF)}"
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
            {**{k: v for k, v in values.items() if k in fields}, "hidden_act": ACT_FROM_HF[act]}
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


def config_to_huggingface(
    config: modeling.BertConfig, architecture="BertForPreTraining", labels=None, regression=False
) -> dict:
    """transformers' config.json. labels: a classifier's label names (id2label / label2id);
    regression: one output under mean squared error (problem_type "regression")."""
    values = config.to_dict()
    values["hidden_act"] = ACT_TO_HF[config.hidden_act]
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


# ------------------------------------------------------------------------------------------ tensors
def from_google(names, get_tensor) -> dict:
    """A google checkpoint's variables -> {our name: array}; names: its variable names,
    get_tensor(name): one of them as an array."""
    layers = count_layers(names, "bert/encoder/layer_{}/attention/self/query/kernel")
    weights = {}
    for ours, google, _, kind in table(layers):
        # global_step and optimizer slots (adam_m, adam_v, LAMB's) are not in the table
        if google in names:
            value = get_tensor(google)
            weights[ours] = value.T if kind == "nsp" else value
    return weights


def to_google(weights: dict) -> dict:
    """{our name: array} -> {google name: array}, in the table's order."""
    return {
        google: weights[ours].T if kind == "nsp" else weights[ours]
        for ours, google, _, kind in _weights_table(weights)
        if ours in weights
    }


def from_huggingface(tensors: dict, weights_file: str) -> dict:
    """model.safetensors' tensors -> {our name: array}; a bare BertModel's (no "bert." prefix) and
    old checkpoints' (LayerNorm gamma/beta) names are read too."""
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
    layers = count_layers(tensors, "bert.encoder.layer.{}.attention.self.query.weight")
    weights = {}
    for ours, _, hf, kind in table(layers):
        if hf in tensors:
            value = tensors[hf]
            weights[ours] = np.ascontiguousarray(value.T) if kind in ("kernel", "nsp") else value
    return weights


def to_huggingface(weights: dict) -> dict:
    """{our name: array} -> {transformers name: float32 array}."""
    return {
        hf: np.ascontiguousarray(
            weights[ours].T if kind in ("kernel", "nsp") else weights[ours], np.float32
        )
        for ours, _, hf, kind in _weights_table(weights)
        if ours in weights
    }
