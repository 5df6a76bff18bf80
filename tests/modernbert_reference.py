"""An independent ModernBERT forward pass in numpy (float64): Hugging Face transformers 4.57.6's
ModernBertForMaskedLM, eager attention on padded inputs, over its exact state-dict names and PyTorch layouts
(a Linear weight is [out, in]). A test oracle, written from modeling_modernbert.py, not from project code.

x = LN_emb(tok[ids]); per layer i (pre-LN; attn_norm is Identity for layer 0):
x = x + Wo·attention(rope(q), rope(k), v) with q, k, v = Wqkv·attn_norm(x) split [q | k | v] (each heads-major);
x = x + Wo·(act(a) * g) with [a | g] = Wi·mlp_norm(x); then final_norm.
Layer i is global when i % global_attn_every_n_layers == 0 (rope theta global_rope_theta), otherwise local:
key j is visible to query i only if |i - j| <= local_attention // 2 (absolute indices, not position_ids),
rope theta local_rope_theta. MLM logits = LN_head(act_cls(dense x)) · decoder^T + b, decoder tied to tok.
Masked scores get + float32 min (as HF does, not summed twice), so a query whose keys are all masked attends
uniformly to every key, like HF's -- this only matters at padded positions.
"""
import math

import numpy as np

# ModernBertConfig's defaults for every key the forward pass reads.
DEFAULTS = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
            "num_attention_heads": 12, "hidden_activation": "gelu", "norm_eps": 1e-5, "norm_bias": False,
            "global_rope_theta": 160000.0, "attention_bias": False, "global_attn_every_n_layers": 3,
            "local_attention": 128, "local_rope_theta": 10000.0, "mlp_bias": False, "decoder_bias": True,
            "classifier_bias": False, "classifier_activation": "gelu"}

SMALL = dict(DEFAULTS, vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
             num_attention_heads=4, local_attention=4)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _tanh_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


ACT = {"gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), "gelu_new": _tanh_gelu,
       "gelu_pytorch_tanh": _tanh_gelu, "silu": lambda x: x / (1 + np.exp(-x)), "swish": lambda x: x / (1 + np.exp(-x)),
       "relu": lambda x: np.maximum(x, 0)}
ACT["gelu_python"] = ACT["gelu"]
MASKED = float(np.finfo(np.float32).min)  # torch.finfo(float32).min, HF's additive mask value


def _config(config):
    c = {**DEFAULTS, **config}
    if c["local_rope_theta"] is None:
        c["local_rope_theta"] = c["global_rope_theta"]
    return c


def is_global(config, layer):
    return layer % _config(config)["global_attn_every_n_layers"] == 0


def visible(config, attention_mask, layer):
    """-> bool [B, 1, S, S]: may query i attend to key j in this layer (key not padding, within the window)."""
    c = _config(config)
    keys = np.asarray(attention_mask)[:, None, None, :] != 0
    if is_global(c, layer):
        return np.broadcast_to(keys, keys.shape[:2] + (keys.shape[-1],) * 2)
    idx = np.arange(keys.shape[-1])
    return keys & (np.abs(idx[:, None] - idx[None, :]) <= c["local_attention"] // 2)[None, None]


def rope(x, positions, theta):
    """x [B, N, S, D] rotated by positions [B, S] (rotate-half convention, as GPT-NeoX / HF Llama)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = np.asarray(positions, np.float64)[..., None] * inv_freq   # [B, S, D/2]
    angles = np.concatenate([angles, angles], -1)[:, None]              # [B, 1, S, D]
    rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def last_hidden_state(weights, config, input_ids, attention_mask, position_ids=None):
    """input_ids, attention_mask [B, S] (1 = real token), position_ids [B, S] (default arange(S) per row)
    -> float64 [B, S, H] after model.final_norm."""
    c = _config(config)
    p = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    ids = np.asarray(input_ids)
    B, S = ids.shape
    n = c["num_attention_heads"]
    act = ACT[c["hidden_activation"]]
    positions = np.broadcast_to(np.arange(S) if position_ids is None else np.asarray(position_ids), (B, S))

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + c["norm_eps"]) * p[name + ".weight"]
        return y + p[name + ".bias"] if c["norm_bias"] else y

    def linear(x, name, bias):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    x = ln(p["model.embeddings.tok_embeddings.weight"][ids], "model.embeddings.norm")
    for layer in range(c["num_hidden_layers"]):
        pre = f"model.layers.{layer}"
        h = x if layer == 0 else ln(x, pre + ".attn_norm")
        qkv = linear(h, pre + ".attn.Wqkv", c["attention_bias"]).reshape(B, S, 3, n, -1).transpose(2, 0, 3, 1, 4)
        theta = c["global_rope_theta"] if is_global(c, layer) else c["local_rope_theta"]
        q, k, v = rope(qkv[0], positions, theta), rope(qkv[1], positions, theta), qkv[2]   # [B, N, S, D]
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
        scores = np.where(visible(c, attention_mask, layer), scores, MASKED)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, -1)
        x = x + linear(context, pre + ".attn.Wo", c["attention_bias"])
        a, g = np.split(linear(ln(x, pre + ".mlp_norm"), pre + ".mlp.Wi", c["mlp_bias"]), 2, axis=-1)
        x = x + linear(act(a) * g, pre + ".mlp.Wo", c["mlp_bias"])
    return ln(x, "model.final_norm")


def mlm_logits(weights, config, input_ids, attention_mask, position_ids=None):
    """-> float64 [B, S, V] for every position (decoder.weight defaults to the tied token embeddings)."""
    c = _config(config)
    x = last_hidden_state(weights, c, input_ids, attention_mask, position_ids)
    p = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    t = x @ p["head.dense.weight"].T + (p["head.dense.bias"] if c["classifier_bias"] else 0.0)
    t = ACT[c["classifier_activation"]](t)
    mu = t.mean(-1, keepdims=True)
    t = (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + c["norm_eps"]) * p["head.norm.weight"]
    t = t + p["head.norm.bias"] if c["norm_bias"] else t
    decoder = p.get("decoder.weight", p["model.embeddings.tok_embeddings.weight"])
    return t @ decoder.T + (p["decoder.bias"] if c["decoder_bias"] else 0.0)


def sequence_classification_logits(weights, config, input_ids, attention_mask):
    """ModernBertForSequenceClassification -> float64 [B, num_labels]: the last hidden state pooled by
    classifier_pooling ("cls": position 0; "mean": sum(x * mask) / sum(mask) over the attention mask), then
    head.dense -> classifier_activation -> head.norm, then classifier (weight [num_labels, H] and bias); the
    head without biases (classifier_bias, norm_bias off)."""
    c = {"classifier_pooling": "cls", **_config(config)}
    x = last_hidden_state(weights, c, input_ids, attention_mask)
    p = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    if c["classifier_pooling"] == "cls":
        pooled = x[:, 0]
    else:
        m = np.asarray(attention_mask, np.float64)
        pooled = (x * m[..., None]).sum(1) / m.sum(1, keepdims=True)
    t = ACT[c["classifier_activation"]](pooled @ p["head.dense.weight"].T)
    mu = t.mean(-1, keepdims=True)
    t = (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + c["norm_eps"]) * p["head.norm.weight"]
    return t @ p["classifier.weight"].T + p["classifier.bias"]


def random_weights(config=SMALL, seed=0, tied=True):
    """{state-dict name: float32 array} for ModernBertForMaskedLM; every tensor random (norm weights near 1),
    `.bias` entries only where the config turns them on; no decoder.weight when tied."""
    c = _config(config)
    r = np.random.RandomState(seed)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    w = {}

    def rand(*shape, scale=0.15, offset=0.0):
        return (offset + scale * r.randn(*shape)).astype(np.float32)

    def linear(name, n_in, n_out, bias):
        w[name + ".weight"] = rand(n_out, n_in, scale=1.0 / math.sqrt(n_in))
        if bias:
            w[name + ".bias"] = rand(n_out, scale=0.1)

    def norm(name):
        w[name + ".weight"] = rand(h, scale=0.1, offset=1.0)
        if c["norm_bias"]:
            w[name + ".bias"] = rand(h, scale=0.1)

    w["model.embeddings.tok_embeddings.weight"] = rand(v, h, scale=1.0)
    norm("model.embeddings.norm")
    for layer in range(c["num_hidden_layers"]):
        pre = f"model.layers.{layer}"
        if layer:
            norm(pre + ".attn_norm")
        linear(pre + ".attn.Wqkv", h, 3 * h, c["attention_bias"])
        linear(pre + ".attn.Wo", h, h, c["attention_bias"])
        norm(pre + ".mlp_norm")
        linear(pre + ".mlp.Wi", h, 2 * i, c["mlp_bias"])
        linear(pre + ".mlp.Wo", i, h, c["mlp_bias"])
    norm("model.final_norm")
    linear("head.dense", h, h, c["classifier_bias"])
    norm("head.norm")
    if c["decoder_bias"]:
        w["decoder.bias"] = rand(v, scale=0.1)
    if not tied:
        w["decoder.weight"] = rand(v, h, scale=0.3)
    return w
