"""An independent BERT forward pass in numpy (float64), written from the architecture, not from
bert_tf/model/modeling.py, over google-research/bert's variable names; and the checkpoint fixtures the
format tests read: a google-format TF1 checkpoint written with tf.compat.v1.train.Saver, and a
Hugging Face directory written with safetensors' numpy API.

BERT: x = LN(word[ids] + position[0:S] + token_type[segments]); per layer (post-LN):
x = LN(x + Wo·attention(Wq x, Wk x, Wv x)); x = LN(x + W2·act(W1 x)); pooled = tanh(Wp x[:, 0]);
MLM logits = LN(act(Wt x)) · word^T + b; NSP logits = pooled · output_weights^T + b.
"""
import json
import math
import os

import numpy as np

CONFIG = dict(vocab_size=211, hidden_size=96, num_hidden_layers=3, num_attention_heads=4, intermediate_size=384,
              hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              max_position_embeddings=40, type_vocab_size=2, initializer_range=0.02)

_erf = np.vectorize(math.erf)
ACT = {"tanh_gelu": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
       "erf_gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))}


def random_google_weights(config=CONFIG, seed=0):
    """{google name: float32 array}: every tensor random (LayerNorm gammas near 1, non-zero betas and biases)."""
    r = np.random.RandomState(seed)
    h, i, v, L = (config[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    w = {}

    def rand(*shape, scale=0.08, offset=0.0):
        return (offset + scale * r.randn(*shape)).astype(np.float32)

    def dense(name, n_in, n_out):
        w[name + "/kernel"] = rand(n_in, n_out)
        w[name + "/bias"] = rand(n_out, scale=0.05)

    def norm(name):
        w[name + "/gamma"] = rand(h, scale=0.1, offset=1.0)
        w[name + "/beta"] = rand(h, scale=0.1)

    w["bert/embeddings/word_embeddings"] = rand(v, h, scale=0.5)
    w["bert/embeddings/position_embeddings"] = rand(config["max_position_embeddings"], h, scale=0.5)
    w["bert/embeddings/token_type_embeddings"] = rand(config["type_vocab_size"], h, scale=0.5)
    norm("bert/embeddings/LayerNorm")
    for layer in range(L):
        p = f"bert/encoder/layer_{layer}"
        for part in ("query", "key", "value"):
            dense(f"{p}/attention/self/{part}", h, h)
        dense(f"{p}/attention/output/dense", h, h)
        norm(f"{p}/attention/output/LayerNorm")
        dense(f"{p}/intermediate/dense", h, i)
        dense(f"{p}/output/dense", i, h)
        norm(f"{p}/output/LayerNorm")
    dense("bert/pooler/dense", h, h)
    dense("cls/predictions/transform/dense", h, h)
    norm("cls/predictions/transform/LayerNorm")
    w["cls/predictions/output_bias"] = rand(v, scale=0.5)
    w["cls/seq_relationship/output_weights"] = rand(2, h, scale=0.3)
    w["cls/seq_relationship/output_bias"] = rand(2, scale=0.3)
    return w


def forward(w, config, act, ids, mask, segments, positions):
    """-> sequence [B, S, H], pooled [B, H], MLM logits [B, P, V], NSP logits [B, 2] (float64)."""
    p = {k: v.astype(np.float64) for k, v in w.items()}
    f = ACT[act]
    n = config["num_attention_heads"]
    B, S = ids.shape

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * p[name + "/gamma"] + p[name + "/beta"]

    def dense(x, name):
        return x @ p[name + "/kernel"] + p[name + "/bias"]

    x = p["bert/embeddings/word_embeddings"][ids] + p["bert/embeddings/position_embeddings"][:S][None] \
        + p["bert/embeddings/token_type_embeddings"][segments]
    x = ln(x, "bert/embeddings/LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for layer in range(config["num_hidden_layers"]):
        pre = f"bert/encoder/layer_{layer}"

        def split(t):
            return t.reshape(B, S, n, -1).transpose(0, 2, 1, 3)     # [B, N, S, D]
        q, k, v = (split(dense(x, f"{pre}/attention/self/{part}")) for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, -1)
        x = ln(x + dense(context, f"{pre}/attention/output/dense"), f"{pre}/attention/output/LayerNorm")
        x = ln(x + dense(f(dense(x, f"{pre}/intermediate/dense")), f"{pre}/output/dense"), f"{pre}/output/LayerNorm")
    pooled = np.tanh(dense(x[:, 0], "bert/pooler/dense"))
    picked = np.take_along_axis(x, positions[:, :, None], axis=1)
    t = ln(f(dense(picked, "cls/predictions/transform/dense")), "cls/predictions/transform/LayerNorm")
    mlm = t @ p["bert/embeddings/word_embeddings"].T + p["cls/predictions/output_bias"]
    nsp = pooled @ p["cls/seq_relationship/output_weights"].T + p["cls/seq_relationship/output_bias"]
    return x, pooled, mlm, nsp


def google_to_huggingface(w):
    """The test's own renaming to BertForPreTraining's names ([out, in] linear weights)."""
    out = {}
    for name, value in w.items():
        hf = name
        if name == "cls/predictions/output_bias":
            hf = "cls/predictions/bias"
        elif name == "cls/seq_relationship/output_weights":
            hf = "cls/seq_relationship/weight"
        elif name == "cls/seq_relationship/output_bias":
            hf = "cls/seq_relationship/bias"
        elif name.endswith("_embeddings"):
            hf = name + "/weight"
        elif name.endswith("/kernel"):
            hf, value = name[:-len("kernel")] + "weight", value.T
        elif name.endswith("/gamma"):
            hf = name[:-len("gamma")] + "weight"
        elif name.endswith("/beta"):
            hf = name[:-len("beta")] + "bias"
        hf = hf.replace("/layer_", "/layer/").replace("/", ".")
        out[hf] = np.ascontiguousarray(value)
    return out


def write_google_checkpoint(directory, w, config=CONFIG):
    """bert_model.ckpt via tf.compat.v1.train.Saver (with global_step and Adam slots, as google's
    run_pretraining.py leaves them), bert_config.json."""
    import tensorflow as tf
    os.makedirs(directory, exist_ok=True)
    with tf.Graph().as_default():
        variables = [tf.compat.v1.Variable(value, name=name) for name, value in w.items()]
        variables.append(tf.compat.v1.Variable(np.int64(1000), name="global_step"))
        for name in list(w)[:3]:
            variables.append(tf.compat.v1.Variable(np.zeros_like(w[name]), name=name + "/adam_m"))
            variables.append(tf.compat.v1.Variable(np.zeros_like(w[name]), name=name + "/adam_v"))
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, os.path.join(directory, "bert_model.ckpt"))
    with open(os.path.join(directory, "bert_config.json"), "w") as f:
        json.dump(config, f)
    return os.path.join(directory, "bert_model.ckpt")


def write_huggingface_dir(directory, w, config=CONFIG, hidden_act="gelu_new"):
    from safetensors.numpy import save_file
    os.makedirs(directory, exist_ok=True)
    save_file(google_to_huggingface(w), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    hf = dict(config, hidden_act=hidden_act, model_type="bert", architectures=["BertForPreTraining"],
              layer_norm_eps=1e-12, transformers_version="4.57.6")
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f)
    return directory


def write_vocab(path, size=CONFIG["vocab_size"]):
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"w{i}" for i in range(size - len(tokens))]
    with open(path, "w") as f:
        f.write("".join(t + "\n" for t in tokens))
    return path


def inputs(config=CONFIG, batch=3, seq=24, preds=5, seed=1):
    r = np.random.RandomState(seed)
    ids = r.randint(0, config["vocab_size"], (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[1, 17:] = 0
    mask[2, 9:] = 0
    segments = (np.arange(seq)[None] >= r.randint(3, seq - 3, (batch, 1))).astype(np.int32)
    positions = np.stack([np.sort(r.choice(seq, preds, replace=False)) for _ in range(batch)]).astype(np.int32)
    return ids, mask, segments, positions
