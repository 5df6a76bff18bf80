"""A modern model (model/modern.py) in Hugging Face's ModernBERT layout: transformers'
`ModernBertForMaskedLM` config.json and model.safetensors, both ways.

    ours (encoder/...)                Hugging Face (torch.nn.Linear weights are [out, in])
    embeddings/word_embeddings [V, H] model.embeddings.tok_embeddings.weight (decoder.weight tied)
    embeddings/layer_norm/gamma       model.embeddings.norm.weight
    layers/N/attention_norm/gamma     model.layers.N.attn_norm.weight (none in layer 0)
    layers/N/attention/qkv/kernel     model.layers.N.attn.Wqkv.weight [3H, H]: q, k, v rows
    layers/N/attention/output/kernel  model.layers.N.attn.Wo.weight
    layers/N/mlp_norm/gamma           model.layers.N.mlp_norm.weight
    layers/N/mlp_in/kernel [H, 2I]    model.layers.N.mlp.Wi.weight [2I, H]: value rows, then gate
    layers/N/mlp_out/kernel           model.layers.N.mlp.Wo.weight
    final_norm/gamma                  model.final_norm.weight
    pooler, pooler_norm               (a fine-tuned classifier's own head.dense / head.norm)
    ours (heads)
    mlm_transform/kernel              head.dense.weight
    mlm_layer_norm/gamma              head.norm.weight
    mlm_output_bias                   decoder.bias

transformers' biases and LayerNorm betas are switched off by ModernBertConfig's *_bias fields, which
this layout writes as False: a config with any of them on is refused when read.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_tf import ConfigError
from bert_tf.model import modeling

# hidden_act: ours -> transformers' ACT2FN name, and back.
ACT_TO_HF = {"gelu_exact": "gelu", "gelu": "gelu_pytorch_tanh", "relu": "relu", "tanh": "tanh"}
ACT_FROM_HF = {
    "gelu": "gelu_exact",
    "gelu_pytorch_tanh": "gelu",
    "gelu_new": "gelu",
    "relu": "relu",
    "tanh": "tanh",
}
BIAS_FIELDS = ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias")
# ModernBertConfig's defaults (transformers 4.57.6, configuration_modernbert.py; v5 keeps them) for
# the fields a config.json may leave out: a missing field means transformers' default.
DEFAULTS = dict(
    vocab_size=50368,
    hidden_size=768,
    num_hidden_layers=22,
    num_attention_heads=12,
    intermediate_size=1152,
    max_position_embeddings=8192,
    initializer_range=0.02,
    global_attn_every_n_layers=3,
    local_attention=128,
    classifier_pooling="cls",
)
THETA_DEFAULTS = {"global_rope_theta": 160000.0, "local_rope_theta": 10000.0}
# transformers v5's layer types (config.layer_types, rope_parameters' keys) and the v4 theta field
# each one replaces
LAYER_TYPES = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def table(config: modeling.BertConfig):
    """[(our name, Hugging Face name, kind, our shape)]: kind "kernel" is transposed between the
    two."""
    c = config
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    rows = [
        (
            "encoder/embeddings/word_embeddings",
            "model.embeddings.tok_embeddings.weight",
            "vector",
            [v, h],
        ),
        ("encoder/embeddings/layer_norm/gamma", "model.embeddings.norm.weight", "vector", [h]),
    ]
    for n in range(c.num_hidden_layers):
        o, t = f"encoder/layers/{n}", f"model.layers.{n}"
        if n:
            rows.append((f"{o}/attention_norm/gamma", f"{t}.attn_norm.weight", "vector", [h]))
        rows += [
            (f"{o}/attention/qkv/kernel", f"{t}.attn.Wqkv.weight", "kernel", [h, 3 * h]),
            (f"{o}/attention/output/kernel", f"{t}.attn.Wo.weight", "kernel", [h, h]),
            (f"{o}/mlp_norm/gamma", f"{t}.mlp_norm.weight", "vector", [h]),
            (f"{o}/mlp_in/kernel", f"{t}.mlp.Wi.weight", "kernel", [h, 2 * i]),
            (f"{o}/mlp_out/kernel", f"{t}.mlp.Wo.weight", "kernel", [i, h]),
        ]
    rows += [
        ("encoder/final_norm/gamma", "model.final_norm.weight", "vector", [h]),
        ("mlm_transform/kernel", "head.dense.weight", "kernel", [h, h]),
        ("mlm_layer_norm/gamma", "head.norm.weight", "vector", [h]),
        ("mlm_output_bias", "decoder.bias", "vector", [v]),
    ]
    return rows


def architecture(weights) -> str:
    """ "modern" when {our name: array} holds ModernBERT's fused attention projection, else
    "bert"."""
    return "modern" if "encoder/layers/0/attention/qkv/kernel" in weights else "bert"


def check_architecture(config: modeling.BertConfig, weights: dict, where: str):
    found = architecture(weights)
    if found != config.architecture:
        raise ConfigError(
            f"{where}: the tensors are a {found!r} model's but the config says architecture="
            f"{config.architecture!r} (a classic BERT and a modern one cannot take each other's "
            "weights)"
        )


def expected_shapes(config: modeling.BertConfig, use_nsp=True) -> dict:
    """{our name: shape} of a modern BertPretrainer (checkpoint_formats.expected_shapes for this
    family)."""
    h = config.hidden_size
    shapes = {ours: shape for ours, _, _, shape in table(config)}
    shapes.update({"encoder/pooler/kernel": [h, h], "encoder/pooler_norm/gamma": [h]})
    if use_nsp:
        shapes.update({"nsp/kernel": [h, 2], "nsp/bias": [2]})
    return shapes


def config_to_huggingface(config: modeling.BertConfig, token_id) -> dict:
    """transformers' ModernBertConfig as config.json; token_id(token): the vocabulary's id of [PAD],
    [CLS], [SEP] (ModernBERT's pad, cls/bos and sep/eos ids)."""
    c = config
    if not c.modern:
        raise ConfigError(
            f"a classic BERT (architecture={c.architecture!r}) has no ModernBERT layout: export it "
            f"as BERT (checkpoint_formats.write_huggingface)"
        )
    act = ACT_TO_HF[c.hidden_act]
    return {
        "architectures": ["ModernBertForMaskedLM"],
        "model_type": "modernbert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "hidden_activation": act,
        "classifier_activation": act,
        "max_position_embeddings": c.max_position_embeddings,
        "initializer_range": c.initializer_range,
        "initializer_cutoff_factor": 2.0,
        "norm_eps": c.layer_norm_eps,
        **dict.fromkeys(BIAS_FIELDS, False),
        "decoder_bias": True,
        "tie_word_embeddings": True,
        # transformers 4.x's fields only: 4.57 reads global_rope_theta / local_rope_theta and
        # global_attn_every_n_layers (not v5's rope_parameters / layer_types), and v5's
        # ModernBertConfig still takes these, turning the thetas into rope_parameters and the
        # period into layer_types
        "global_attn_every_n_layers": c.global_attn_every_n_layers,
        "local_attention": c.local_attention,
        "global_rope_theta": c.global_rope_theta,
        "local_rope_theta": c.local_rope_theta,
        "embedding_dropout": c.hidden_dropout_prob,
        "mlp_dropout": c.hidden_dropout_prob,
        "attention_dropout": c.attention_probs_dropout_prob,
        "classifier_pooling": c.classifier_pooling,
        "pad_token_id": token_id("[PAD]"),
        "cls_token_id": token_id("[CLS]"),
        "bos_token_id": token_id("[CLS]"),
        "sep_token_id": token_id("[SEP]"),
        "eos_token_id": token_id("[SEP]"),
    }


def config_from_huggingface(values: dict, path: str) -> modeling.BertConfig:
    """ModernBertConfig's config.json (parsed) -> a modern BertConfig; `path` names the file in
    errors. Both transformers' forms load: 4.x's global_rope_theta / local_rope_theta and v5's
    rope_parameters and layer_types; a field left out means ModernBertConfig's default."""
    act = _check_supported(values, path)
    out = {k: values.get(k, default) for k, default in DEFAULTS.items()}
    out.update(
        _rope_thetas(values, path),
        architecture="modern",
        hidden_act=ACT_FROM_HF[act],
        layer_norm_eps=values.get("norm_eps", 1e-5),
        hidden_dropout_prob=values.get("mlp_dropout", 0.0),
        attention_probs_dropout_prob=values.get("attention_dropout", 0.0),
    )
    try:
        config = modeling.BertConfig.from_dict(out)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    _check_layer_types(values.get("layer_types"), config, path)
    return config


def _check_supported(values: dict, path: str) -> str:
    """Refuse what the modern model cannot be; -> transformers' activation name."""
    on = [f for f in BIAS_FIELDS if values.get(f, False)]
    if on or not values.get("decoder_bias", True):
        raise ConfigError(
            f"{path}: {', '.join(on) or 'decoder_bias'} is {bool(on)}: bert_tf's modern model has "
            "no biases in its linear layers and norms and a decoder bias (ModernBERT's released "
            "setting)"
        )
    if not values.get("tie_word_embeddings", True):
        raise ConfigError(
            f"{path}: tie_word_embeddings is false; the modern model ties its decoder to the "
            "embeddings"
        )
    acts = {values.get("hidden_activation", "gelu"), values.get("classifier_activation", "gelu")}
    if len(acts) > 1 or not acts <= set(ACT_FROM_HF):
        raise ConfigError(
            f"{path}: hidden_activation / classifier_activation {sorted(acts)} are not supported: "
            f"one of {sorted(ACT_FROM_HF)} for both"
        )
    return acts.pop()


def _rope_thetas(values: dict, path: str) -> dict:
    """{global_rope_theta, local_rope_theta} from v5's rope_parameters ({"full_attention":
    {"rope_type": "default", "rope_theta": ...}, "sliding_attention": {...}}) or 4.x's fields. As
    v5's ModernBertConfig does, rope_parameters' theta wins and a layer type without one falls back
    to the 4.x field, then to the default; a 4.x null local theta is the global one (4.57's
    ModernBertAttention). A file whose two forms disagree is refused: 4.57 and v5 would differ."""
    thetas = {name: values.get(name, default) for name, default in THETA_DEFAULTS.items()}
    if thetas["local_rope_theta"] is None:
        thetas["local_rope_theta"] = thetas["global_rope_theta"]
    params = values.get("rope_parameters")
    if params is None:
        return thetas
    if not isinstance(params, dict) or not set(params) <= set(LAYER_TYPES):
        raise ConfigError(
            f"{path}: rope_parameters {params!r} is not keyed by layer type: transformers v5's "
            f"ModernBertConfig writes a dict with {' and '.join(map(repr, LAYER_TYPES))}"
        )
    for layer_type, field in LAYER_TYPES.items():
        entry = params.get(layer_type) or {}
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        extra = sorted(set(entry) - {"rope_type", "type", "rope_theta"})
        if rope_type != "default" or extra:
            raise ConfigError(
                f"{path}: rope_parameters[{layer_type!r}] has rope_type {rope_type!r}"
                + (f" and {', '.join(extra)}" if extra else "")
                + ": bert_tf's modern model has plain RoPE only (rope_type 'default' with a "
                "rope_theta), no scaled variants"
            )
        theta = entry.get("rope_theta")
        if theta is not None and values.get(field) is not None and values[field] != theta:
            raise ConfigError(
                f"{path}: rope_parameters[{layer_type!r}] has rope_theta {theta} but {field} is "
                f"{values[field]}: transformers v5 reads the first, 4.x the second; keep one"
            )
        if theta is not None:
            thetas[field] = theta
    return thetas


def _check_layer_types(layer_types, config: modeling.BertConfig, path: str):
    """v5's layer_types must be the modern model's layout: global ("full_attention") in layer i
    when i % global_attn_every_n_layers == 0 (layer 0 too), sliding elsewhere."""
    if layer_types is None:
        return
    n, layers = config.global_attn_every_n_layers, config.num_hidden_layers
    expected = ["sliding_attention" if i % n else "full_attention" for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise ConfigError(
            f"{path}: layer_types {layer_types!r} is not a list of num_hidden_layers={layers} "
            "'full_attention' / 'sliding_attention' entries"
        )
    for i, (found, wanted) in enumerate(zip(layer_types, expected)):
        if found != wanted:
            raise ConfigError(
                f"{path}: layer_types[{i}] is {found!r} where bert_tf's modern model has "
                f"{wanted!r}: it attends globally in layer i when i % global_attn_every_n_layers "
                f"({n}) == 0 and in the sliding window elsewhere; other patterns are not supported"
            )


def from_huggingface(tensors: dict, config: modeling.BertConfig, weights_file: str) -> dict:
    """model.safetensors' tensors -> {our name: array}; every encoder tensor of `config` must be
    there."""
    decoder = tensors.get("decoder.weight")
    word = tensors.get("model.embeddings.tok_embeddings.weight")
    if decoder is not None and word is not None and not np.array_equal(decoder, word):
        raise ConfigError(
            f"{weights_file}: decoder.weight differs from the token embeddings; the modern model "
            f"ties them (an untied decoder is not supported)"
        )
    weights, missing = {}, []
    for ours, hf, kind, _ in table(config):
        if hf in tensors:
            weights[ours] = np.ascontiguousarray(tensors[hf].T) if kind == "kernel" else tensors[hf]
        elif ours.startswith("encoder/"):
            missing.append(hf)
    if missing:
        raise ConfigError(
            f"{weights_file}: {len(missing)} ModernBERT tensors the config implies are missing, "
            f"e.g. {missing[0]} (a checkpoint of another model, or saved without the 'model.' "
            "prefix?)"
        )
    return weights


def to_huggingface(
    weights: dict, config: modeling.BertConfig, weights_file: str = "the model"
) -> dict:
    """{our name: array} -> {transformers name: float32 array}; the pooler (not part of
    ModernBertForMaskedLM) and NSP head are left out."""
    tensors = {}
    for ours, hf, kind, _ in table(config):
        if ours not in weights:
            raise ConfigError(
                f"{weights_file}: {ours} missing: not a modern model's weights (architecture "
                f"{config.architecture!r} in its config?)"
            )
        value = weights[ours]
        tensors[hf] = np.ascontiguousarray(value.T if kind == "kernel" else value, dtype=np.float32)
    return tensors


def describe(config: modeling.BertConfig) -> str:
    """One line for logs and the model card."""
    c = dataclasses.asdict(config)
    return (
        "ModernBERT architecture: RoPE (theta {global_rope_theta:g} global, {local_rope_theta:g} "
        "local), GeGLU, pre-norm without biases, global attention every "
        "{global_attn_every_n_layers} layers and a {local_attention}-token window elsewhere"
    ).format(**c)
