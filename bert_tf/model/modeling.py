"""The BERT model, top to bottom: embeddings, attention, the post-LN layer, the encoder, the
pre-training heads (the config is model/config.py, the blocks both encoders share model/layers.py,
ModernBERT model/modern.py).

Written on plain `tf.Module`s and `tf.Variable`s (no Keras), so that Horovod 0.28.1's
`horovod.tensorflow` collectives, `tf.train.Checkpoint` and SavedModel see ordinary
variables (Keras 3 variables are not `tf.Variable`s; see docs/design.md, "No Keras").

Shapes in docstrings: B batch, S sequence length, H hidden size, N attention heads,
D = H / N head size, I intermediate size, P max predictions per sequence, V vocab size.

Precision: variables are float32 ("master weights") and are cast to the compute dtype
(float32, bfloat16 or float16) where they are used. Softmax, LayerNorm, GELU and the
losses run in float32 whatever the compute dtype.

Dropout is stateless and seeded per call (`seed`, an int32 [2] tensor), so it compiles under XLA
and the masks follow from the seed alone: training.Trainer.micro_batch_seed derives it from the run
seed, the step and the micro-batch's index in the update, plus the rank in static runs (elastic mode
leaves the rank out, so an update draws the same masks at any rank count).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.model.config import (  # noqa: F401  (modeling.BertConfig: the names users know)
    ACTIVATION_NAMES,
    ARCHITECTURES,
    MODERN_PRESETS,
    PRESET_NAMES,
    PRESETS,
    RECOMPUTE,
    BertConfig,
)
from bert_tf.model.layers import (  # noqa: F401  (modeling.Dense, ...: where they were)
    ACTIVATIONS,
    Dense,
    Encoder,
    LayerNorm,
    attend,
    dropout,
    mask_bias_for,
    run_layers,
    truncated_normal,
)


class Embeddings(tf.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout: ids [B, S] -> [B, S, H]."""

    def __init__(self, config: BertConfig, name=None):
        super().__init__(name=name)
        c = config
        self.word_embeddings = tf.Variable(
            truncated_normal([c.vocab_size, c.hidden_size], c.initializer_range),
            name="word_embeddings",
        )
        self.position_embeddings = tf.Variable(
            truncated_normal([c.max_position_embeddings, c.hidden_size], c.initializer_range),
            name="position_embeddings",
        )
        self.token_type_embeddings = tf.Variable(
            truncated_normal([c.type_vocab_size, c.hidden_size], c.initializer_range),
            name="token_type_embeddings",
        )
        self.layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout_rate = c.hidden_dropout_prob

    def __call__(self, input_ids, segment_ids, dtype, seed, training, position_ids=None):
        """position_ids [B, S]: each token's position in its own instance (packed rows); default 0,
        1, ..."""
        if position_ids is None:
            position = self.position_embeddings[tf.newaxis, : tf.shape(input_ids)[1]]
        else:
            position = tf.gather(self.position_embeddings, position_ids)
        x = (
            tf.gather(self.word_embeddings, input_ids)
            + tf.gather(self.token_type_embeddings, segment_ids)
            + position
        )
        x = self.layer_norm(x)  # float32 here: the sum of embeddings is cheap
        return dropout(tf.cast(x, dtype), self.dropout_rate, seed, training)


class SelfAttention(tf.Module):
    """Multi-head self-attention with a padding mask: x [B, S, H] -> [B, S, H]."""

    def __init__(self, config: BertConfig, name=None):
        super().__init__(name=name)
        c = config
        self.num_heads = c.num_attention_heads
        self.head_size = c.hidden_size // c.num_attention_heads
        self.query = Dense(c.hidden_size, c.hidden_size, c.initializer_range)
        self.key = Dense(c.hidden_size, c.hidden_size, c.initializer_range)
        self.value = Dense(c.hidden_size, c.hidden_size, c.initializer_range)
        self.output = Dense(c.hidden_size, c.hidden_size, c.initializer_range)
        self.dropout_rate = c.attention_probs_dropout_prob

    def __call__(self, x, mask_bias, seed, training):
        """mask_bias float32, 0 where a query may attend to a key, -10000 where not: [B, 1, 1, S]
        (padding keys) or [B, 1, S, S] (packed rows: each instance attends to itself only)."""
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]

        def heads(t):  # [B, S, H] -> [B, S, N, D]
            return tf.reshape(t, [batch, seq, self.num_heads, self.head_size])

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        context = attend(q, k, v, mask_bias, self.dropout_rate, seed, training)
        return self.output(tf.reshape(context, [batch, seq, self.num_heads * self.head_size]))


class TransformerLayer(tf.Module):
    """Post-LN transformer layer: LN(x + attn(x)), then LN(h + FFN(h))."""

    def __init__(self, config: BertConfig, name=None):
        super().__init__(name=name)
        c = config
        self.attention = SelfAttention(c)
        self.attention_layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.intermediate = Dense(c.hidden_size, c.intermediate_size, c.initializer_range)
        self.output = Dense(c.intermediate_size, c.hidden_size, c.initializer_range)
        self.output_layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.activation = ACTIVATIONS[c.hidden_act]
        self.dropout_rate = c.hidden_dropout_prob

    def __call__(self, x, mask_bias, seed, training):
        seeds = tf.random.experimental.stateless_split(seed, 3)
        h = self.attention(x, mask_bias, seeds[0], training)
        x = self.attention_layer_norm(x + dropout(h, self.dropout_rate, seeds[1], training))
        h = self.output(self.activation(self.intermediate(x)))
        return self.output_layer_norm(x + dropout(h, self.dropout_rate, seeds[2], training))


class BertEncoder(tf.Module):
    """Embeddings, transformer stack and pooler.

    Returns sequence_output [B, S, H] and pooled_output [B, H] (tanh dense on [CLS]),
    both in the compute dtype. recompute="layer" keeps only each layer's input [B, S, H] for the
    backward pass and runs the layer again there (tf.recompute_grad): activation memory drops from
    about L x B x S x (34 H + 5 N S) bytes (fp16; Korthikanti et al. 2022) to L x B x S x H inputs
    plus one layer's worth, for one more forward pass. Dropout masks are seeded statelessly, so the
    recomputed layer draws the same masks and the gradients are the plain step's.
    """

    def __init__(self, config: BertConfig, name=None, recompute="none"):
        super().__init__(name=name)
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute={recompute!r}: valid are {', '.join(RECOMPUTE)}")
        self.recompute = recompute
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = [
            TransformerLayer(config, name=f"layer_{i}") for i in range(config.num_hidden_layers)
        ]
        self.pooler = Dense(config.hidden_size, config.hidden_size, config.initializer_range)

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
        """Packed rows (instances.pack_instances) also pass position_ids and instance_ids [B, S]
        (1, 2, ... per instance, 0 for padding): attention stays within an instance, so each one's
        outputs are those it has alone in a row of its own."""
        if seed is None:
            seed = tf.zeros([2], tf.int32)
        seeds = tf.random.experimental.stateless_split(seed, len(self.layers) + 1)
        x = self.embeddings(input_ids, segment_ids, dtype, seeds[0], training, position_ids)
        mask_bias = mask_bias_for(input_mask, instance_ids)
        x = run_layers(
            self.layers,
            x,
            seeds[1:],
            self.recompute == "layer" and training,
            lambda layer, h, s: layer(h, mask_bias, s, training),
        )
        return x, self.pool(x)

    def pool(self, sequence_output, positions=None, *, input_mask=None, instance_ids=None):
        """The pooler (tanh dense) on [CLS]: [B, H] at position 0, or [B, K, H] at positions [B, K]
        (each packed instance's [CLS]). input_mask and instance_ids are the Encoder contract's (a
        modern mean pooler reads them); [CLS] needs neither."""
        if positions is None:
            return tf.tanh(self.pooler(sequence_output[:, 0]))
        return tf.tanh(self.pooler(tf.gather(sequence_output, positions, batch_dims=1)))


def encoder(config: BertConfig, recompute="none") -> Encoder:
    """The encoder of config.architecture: BertEncoder or modern.ModernEncoder (the same contract:
    layers.Encoder)."""
    if config.modern:
        from bert_tf.model import modern

        return modern.ModernEncoder(config, recompute=recompute)
    return BertEncoder(config, recompute=recompute)


R = TypeVar("R", bound="TensorRecord")


@dataclasses.dataclass(frozen=True, eq=False)  # eq: tensors compare element-wise, not as one value
class TensorRecord:
    """Base of a model's output record: a frozen dataclass that tf.nest takes apart and rebuilds
    (TensorFlow's CustomNestProtocol, `__tf_flatten__` / `__tf_unflatten__`), so it leaves a
    tf.function (XLA-compiled or not; checked in TF 2.21) as it went in. A plain dataclass is one
    opaque leaf to tf.nest; a NamedTuple would work, but it iterates its values and `in` tests them,
    where the dict-era code iterated names. Fields left None (a head the model lacks) are not
    components: they stay None through the tf.function."""

    def __tf_flatten__(self) -> tuple[tuple[str, ...], tuple]:
        present = self.present()
        return tuple(present), tuple(present.values())

    @classmethod
    def __tf_unflatten__(cls: type[R], metadata: tuple[str, ...], components: tuple) -> R:
        return cls(**dict(zip(metadata, components)))

    def present(self) -> dict[str, Any]:
        """{field: value} of the fields that are not None, in declaration order."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class PretrainOutput(TensorRecord):
    """BertPretrainer's output: float32 scalars [] (batch means and sums, for exact cross-batch
    rates). Names ending in "loss" are means, the rest counts (figures.is_mean); the nsp_ ones are
    None without the NSP head (use_nsp=False: --mlm_only, ModernBERT's recipes)."""

    loss: tf.Tensor  # mlm_loss + nsp_loss (mlm_loss alone without NSP): what is trained
    mlm_loss: tf.Tensor  # mean cross-entropy over the masked tokens
    mlm_correct: tf.Tensor  # masked tokens predicted right (weighted)
    mlm_weight: tf.Tensor  # masked tokens (the sum of masked_lm_weights)
    nsp_loss: tf.Tensor | None = None  # mean next-sentence cross-entropy over the instances
    nsp_correct: tf.Tensor | None = None
    nsp_count: tf.Tensor | None = None  # instances (packed rows: every instance, not every row)


class BertPretrainer(tf.Module):
    """The encoder plus the masked-LM and next-sentence heads, and their losses.

    The masked-LM head runs only at the P masked positions: the sequence output is
    gathered to [B, P, H] before the dense transform and the [H, V] output projection,
    which is tied to the word embeddings. The modern head is the same without the biases of its
    dense and norm (ModernBertPredictionHead; the decoder keeps its bias).
    """

    def __init__(self, config: BertConfig, use_nsp: bool = True, name=None, recompute="none"):
        super().__init__(name=name)
        c = config
        self.config = config
        self.use_nsp = use_nsp
        self.encoder = encoder(config, recompute=recompute)
        # ModernBERT draws the head's dense with its output-projection std
        std = (
            c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
            if c.modern
            else c.initializer_range
        )
        self.mlm_transform = Dense(c.hidden_size, c.hidden_size, std, bias=not c.modern)
        self.mlm_layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=not c.modern)
        self.mlm_output_bias = tf.Variable(tf.zeros([c.vocab_size]), name="mlm_output_bias")
        self.activation = ACTIVATIONS[c.hidden_act]
        if use_nsp:
            self.nsp = Dense(c.hidden_size, 2, c.initializer_range)

    def mlm_logits(self, sequence_output, positions):
        """sequence_output [B, S, H], positions [B, P] -> logits [B, P, V] (float32)."""
        x = tf.gather(sequence_output, positions, batch_dims=1)  # [B, P, H]
        x = self.mlm_layer_norm(self.activation(self.mlm_transform(x)))
        logits = tf.einsum(
            "bph,vh->bpv", x, tf.cast(self.encoder.embeddings.word_embeddings, x.dtype)
        )
        return tf.cast(logits, tf.float32) + self.mlm_output_bias

    def __call__(self, features, *, dtype=tf.float32, seed=None, training=False) -> PretrainOutput:
        """features: google's pre-training feature dict, or a packed one (records.PACKED_FEATURES
        as well). Returns a PretrainOutput (the nsp_ fields only with the NSP head). A packed
        batch's losses are those of its instances unpacked: masked-LM over every masked token,
        next-sentence over every instance."""
        packed = "instance_ids" in features
        sequence_output, pooled = self.encoder(
            features["input_ids"],
            features["input_mask"],
            features["segment_ids"],
            dtype=dtype,
            seed=seed,
            training=training,
            position_ids=features.get("position_ids"),
            instance_ids=features.get("instance_ids"),
        )
        logits = self.mlm_logits(sequence_output, features["masked_lm_positions"])
        labels = features["masked_lm_ids"]
        weights = tf.cast(features["masked_lm_weights"], tf.float32)
        token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        mlm_weight = tf.reduce_sum(weights)
        mlm_loss = tf.reduce_sum(token_loss * weights) / (mlm_weight + 1e-5)
        mlm_hits = tf.cast(
            tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32
        )
        mlm_correct = tf.reduce_sum(mlm_hits * weights)
        if not self.use_nsp:
            return PretrainOutput(
                loss=mlm_loss, mlm_loss=mlm_loss, mlm_correct=mlm_correct, mlm_weight=mlm_weight
            )
        if packed:  # one [CLS] and label per instance slot, weight 0 for empty slots
            pooled = self.encoder.pool(
                sequence_output,
                features["next_sentence_positions"],
                input_mask=features["input_mask"],
                instance_ids=features["instance_ids"],
            )  # [B, K, H]
            nsp_weights = tf.reshape(tf.cast(features["next_sentence_weights"], tf.float32), [-1])
        nsp_logits = tf.reshape(tf.cast(self.nsp(pooled), tf.float32), [-1, 2])
        nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
        if not packed:
            nsp_weights = tf.ones_like(nsp_labels, tf.float32)
        nsp_count = tf.reduce_sum(nsp_weights)
        nsp_loss = tf.reduce_sum(
            nsp_weights
            * tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits)
        ) / tf.maximum(nsp_count, 1.0)
        nsp_pred = tf.argmax(nsp_logits, -1, output_type=nsp_labels.dtype)
        nsp_correct = tf.reduce_sum(
            tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32) * nsp_weights
        )
        return PretrainOutput(
            loss=mlm_loss + nsp_loss,
            mlm_loss=mlm_loss,
            mlm_correct=mlm_correct,
            mlm_weight=mlm_weight,
            nsp_loss=nsp_loss,
            nsp_correct=nsp_correct,
            nsp_count=nsp_count,
        )


def check_features_fit(
    config: BertConfig, max_seq_length: int, vocab_size: int | None = None
) -> None:
    """Fail before training when the data cannot fit the model."""
    if max_seq_length > config.max_position_embeddings:
        raise ConfigError(
            f"--max_seq_length={max_seq_length} exceeds the model's max_position_embeddings "
            f"({config.max_position_embeddings})"
        )
    if (
        config.modern
        and config.global_attn_every_n_layers > 1
        and config.num_hidden_layers > 1
        and config.local_attention // 2 >= max_seq_length - 1
    ):
        raise ConfigError(
            f"the model's sliding window (local_attention={config.local_attention}: keys within "
            f"{config.local_attention // 2} tokens) spans the whole "
            f"--max_seq_length={max_seq_length}: its local layers would attend globally; use "
            f"local_attention < {2 * (max_seq_length - 1)} or global_attn_every_n_layers=1"
        )
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise ConfigError(
            f"the vocabulary has {vocab_size} tokens but the model's vocab_size is "
            f"{config.vocab_size}: token ids >= {config.vocab_size} would not have embeddings"
        )
