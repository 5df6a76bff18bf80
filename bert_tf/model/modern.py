"""ModernBERT's encoder (Warner et al. 2024, "Smarter, Better, Faster, Longer", arXiv:2412.13663) on
layers.py's blocks: the `architecture="modern"` of a BertConfig.

What differs from BERT, layer by layer (transformers' ModernBertModel has the same structure, so
an export maps one variable to one tensor; artifacts/modernbert_format.py):
  - embeddings: word embeddings only (no positions, no token types), a norm, dropout;
  - positions: rotary (RoPE, Su et al. 2021) on queries and keys, theta `global_rope_theta` in
    global layers and `local_rope_theta` in local ones; packed rows rotate by each instance's own
    positions;
  - pre-norm layers: x + attn(norm(x)), then x + mlp(norm(x)); layer 0 has no norm before attention
    (the embeddings' norm is it); a final norm after the last layer;
  - attention: global in layer i when i % global_attn_every_n_layers == 0, else within a sliding
    window of keys at most local_attention // 2 tokens away (in blocks, local_attention.py, when
    that saves work); one fused query-key-value projection;
  - feed-forward: GeGLU, act(x W_in) * (x W_gate) W_out, with W_in and W_gate one [H, 2I] kernel;
  - no biases in linear layers or norms;
  - pooler (for fine-tuning heads): dense + activation + norm, ModernBERT's classifier head, on
    [CLS] or (classifier_pooling "mean") on the mean over the non-padding tokens.

Shapes: B batch, S sequence, H hidden, N heads, D = H / N, I intermediate size.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from bert_tf.model import layers, local_attention
from bert_tf.model.config import RECOMPUTE, BertConfig
from bert_tf.model.layers import ACTIVATIONS, Dense, LayerNorm, dropout


def rotate(x, positions, theta):
    """RoPE on x [B, S, N, D] at positions [B, S]: dimension pairs (j, j + D/2) turn by the angle
    position * theta^(-2j/D) (the rotate-half layout of transformers' apply_rotary_pos_emb)."""
    d = x.shape[-1]
    inv_freq = tf.constant(
        1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d), tf.float32
    )  # [D/2]
    angles = tf.cast(positions, tf.float32)[:, :, tf.newaxis] * inv_freq  # [B, S, D/2]
    angles = tf.concat([angles, angles], -1)[:, :, tf.newaxis, :]  # [B, S, 1, D]
    x32 = tf.cast(x, tf.float32)
    half = tf.concat([-x32[..., d // 2 :], x32[..., : d // 2]], -1)
    return tf.cast(x32 * tf.cos(angles) + half * tf.sin(angles), x.dtype)


class ModernEmbeddings(tf.Module):
    """Word embeddings, norm, dropout: ids [B, S] -> [B, S, H]."""

    def __init__(self, c: BertConfig, name=None):
        super().__init__(name=name)
        self.word_embeddings = tf.Variable(
            layers.truncated_normal([c.vocab_size, c.hidden_size], c.initializer_range),
            name="word_embeddings",
        )
        self.layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=False)
        self.dropout_rate = c.hidden_dropout_prob

    def __call__(self, input_ids, dtype, seed, training):
        x = self.layer_norm(tf.gather(self.word_embeddings, input_ids))
        return dropout(tf.cast(x, dtype), self.dropout_rate, seed, training)


class ModernAttention(tf.Module):
    """Self-attention with RoPE and a fused [H, 3H] projection (columns: queries, keys, values, each
    head after head): x [B, S, H] -> [B, S, H]."""

    def __init__(self, c: BertConfig, theta, name=None):
        super().__init__(name=name)
        out_std = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
        self.num_heads = c.num_attention_heads
        self.head_size = c.hidden_size // c.num_attention_heads
        self.theta = theta
        self.qkv = Dense(c.hidden_size, 3 * c.hidden_size, c.initializer_range, bias=False)
        self.output = Dense(c.hidden_size, c.hidden_size, out_std, bias=False)
        self.dropout_rate = c.attention_probs_dropout_prob

    def __call__(self, x, mask_bias, positions, seed, training):
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]
        seeds = tf.random.experimental.stateless_split(seed, 2)
        qkv = tf.reshape(self.qkv(x), [batch, seq, 3, self.num_heads, self.head_size])
        q = rotate(qkv[:, :, 0], positions, self.theta)
        k = rotate(qkv[:, :, 1], positions, self.theta)
        blocked = isinstance(mask_bias, local_attention.WindowMask)
        context = (local_attention.attend if blocked else layers.attend)(
            q, k, qkv[:, :, 2], mask_bias, self.dropout_rate, seeds[0], training
        )
        out = self.output(tf.reshape(context, [batch, seq, self.num_heads * self.head_size]))
        return dropout(out, self.dropout_rate, seeds[1], training)


class ModernLayer(tf.Module):
    """Pre-norm layer: x + attn(norm(x)), then x + GeGLU(norm(x)); layer 0 without the first
    norm."""

    def __init__(self, c: BertConfig, index, name=None):
        super().__init__(name=name)
        self.local = index % c.global_attn_every_n_layers != 0
        if index:
            self.attention_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=False)
        self.attention = ModernAttention(
            c, c.local_rope_theta if self.local else c.global_rope_theta
        )
        self.mlp_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=False)
        self.mlp_in = Dense(c.hidden_size, 2 * c.intermediate_size, c.initializer_range, bias=False)
        self.mlp_out = Dense(
            c.intermediate_size,
            c.hidden_size,
            c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
            bias=False,
        )
        self.activation = ACTIVATIONS[c.hidden_act]
        self.dropout_rate = c.hidden_dropout_prob

    def __call__(self, x, mask_biases, positions, seed, training):
        """mask_biases: (global, local) masks, [B, 1, S or 1, S] and [B, 1, S, S] additive biases
        or a local_attention.WindowMask."""
        seeds = tf.random.experimental.stateless_split(seed, 2)
        h = self.attention_norm(x) if hasattr(self, "attention_norm") else x
        x = x + self.attention(h, mask_biases[self.local], positions, seeds[0], training)
        value, gate = tf.split(self.mlp_in(self.mlp_norm(x)), 2, axis=-1)
        return x + self.mlp_out(
            dropout(self.activation(value) * gate, self.dropout_rate, seeds[1], training)
        )


def window_bias(seq, local_attention):
    """[1, 1, S, S]: 0 where key j is within local_attention // 2 tokens of query i, -10000
    elsewhere."""
    index = tf.range(seq)
    near = tf.abs(index[:, tf.newaxis] - index[tf.newaxis, :]) <= local_attention // 2
    return tf.where(near, 0.0, -10000.0)[tf.newaxis, tf.newaxis]


class ModernEncoder(tf.Module):
    """Embeddings, pre-norm layers, final norm and pooler; called like modeling.BertEncoder
    (segment_ids are taken and ignored: no token types). Returns sequence_output [B, S, H] and
    pooled_output [B, H]. blocked_local=False: local layers always attend densely (the blocked
    path's reference in tests/test_local_attention.py)."""

    def __init__(self, config: BertConfig, name=None, recompute="none", blocked_local=True):
        super().__init__(name=name)
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute={recompute!r}: valid are {', '.join(RECOMPUTE)}")
        c = self.config = config
        self.recompute = recompute
        self.blocked_local = blocked_local
        self.embeddings = ModernEmbeddings(c)
        self.layers = [ModernLayer(c, i, name=f"layer_{i}") for i in range(c.num_hidden_layers)]
        self.final_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=False)
        self.pooler = Dense(
            c.hidden_size,
            c.hidden_size,
            c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
            bias=False,
        )
        self.pooler_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=False)
        self.activation = ACTIVATIONS[c.hidden_act]

    def __call__(
        self,
        input_ids,
        input_mask,
        segment_ids,
        *,
        dtype=tf.float32,
        seed=None,
        training=False,
        position_ids=None,
        instance_ids=None,
    ):
        """position_ids / instance_ids [B, S]: packed rows (modeling.BertEncoder); RoPE then turns
        each instance by its own positions and attention stays within it, windowed or not."""
        if seed is None:
            seed = tf.zeros([2], tf.int32)
        seeds = tf.random.experimental.stateless_split(seed, len(self.layers) + 1)
        if position_ids is None:
            position_ids = tf.broadcast_to(
                tf.range(tf.shape(input_ids)[1])[tf.newaxis], tf.shape(input_ids)
            )
        x = self.embeddings(input_ids, dtype, seeds[0], training)
        global_bias = layers.mask_bias_for(input_mask, instance_ids)
        window = self.config.local_attention
        if self.blocked_local and local_attention.saves_work(input_ids.shape[1], window):
            local_bias = local_attention.window_mask(input_mask, instance_ids, window)
        else:
            local_bias = global_bias + window_bias(tf.shape(input_ids)[1], window)
        biases = (global_bias, local_bias)
        x = layers.run_layers(
            self.layers,
            x,
            seeds[1:],
            self.recompute == "layer" and training,
            lambda layer, h, s: layer(h, biases, position_ids, s, training),
        )
        x = self.final_norm(x)
        return x, self.pool(x, input_mask=input_mask, instance_ids=instance_ids)

    def pool(self, sequence_output, positions=None, *, input_mask=None, instance_ids=None):
        """dense + activation + norm (transformers' ModernBertPredictionHead) on [CLS]
        (classifier_pooling "cls") or on the masked mean of the sequence output ("mean", as
        ModernBertForSequenceClassification: sum(x * mask) / sum(mask) over input_mask [B, S]):
        [B, H]; or [B, K, H] for the instances whose [CLS] is at positions [B, K] (packed rows,
        instance_ids [B, S]: "mean" averages each instance over its own tokens)."""
        if self.config.classifier_pooling == "mean":
            x = mean_pool(sequence_output, positions, input_mask, instance_ids)
        elif positions is None:
            x = sequence_output[:, 0]
        else:
            x = tf.gather(sequence_output, positions, batch_dims=1)
        return self.pooler_norm(self.activation(self.pooler(x)))


def mean_pool(sequence_output, positions=None, input_mask=None, instance_ids=None):
    """The mean of sequence_output [B, S, H] over a row's tokens, summed in float32 and returned in
    its dtype: [B, H] over input_mask [B, S] (every token when None), or [B, K, H] with positions
    [B, K]. With instance_ids [B, S] (packed rows) a mean covers the tokens of one instance: the one
    at each position, or at position 0 without positions (the instance whose [CLS] "cls" pools).
    A mean over no tokens is 0."""
    x = tf.cast(sequence_output, tf.float32)
    if instance_ids is not None:
        at = (
            instance_ids[:, :1]
            if positions is None
            else tf.gather(instance_ids, positions, batch_dims=1)
        )[:, :, tf.newaxis]  # [B, K, 1]: the instance to average
        same = tf.equal(instance_ids[:, tf.newaxis, :], at)
        weights = tf.cast(tf.logical_and(same, at > 0), tf.float32)  # [B, K, S]
    else:
        mask = tf.ones(tf.shape(x)[:2]) if input_mask is None else tf.cast(input_mask, tf.float32)
        weights = mask[:, tf.newaxis, :]  # [B, 1, S]: a row not packed is one instance
        if positions is not None:
            weights *= tf.ones_like(tf.cast(positions, tf.float32))[:, :, tf.newaxis]
    count = tf.maximum(tf.reduce_sum(weights, -1, keepdims=True), 1.0)
    mean = tf.einsum("bks,bsh->bkh", weights, x) / count
    return tf.cast(mean[:, 0] if positions is None else mean, sequence_output.dtype)
