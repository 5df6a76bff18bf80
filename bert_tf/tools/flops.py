"""FLOPs of the model bert_tf actually runs (the measured peak they are divided by:
studies/matmul_peaks.py).

Forward FLOPs of one sequence (a multiply-add counts 2), S sequence length, H hidden,
I intermediate, L layers, P masked positions, V vocab:

    per layer:  Q, K, V, output projections   4 * 2*S*H*H
                attention scores  Q K^T        2*S*S*H
                attention-weighted values      2*S*S*H
                feed-forward                   2 * 2*S*H*I    (classic: H -> I -> H)
                GeGLU feed-forward             3 * 2*S*H*I    (modern: H -> 2I, gated, I -> H)
    pooler                                     2*H*H          (the [CLS] token only)
    masked-LM head at P positions              2*P*H*H + 2*P*H*V
    next-sentence head                         2*H*2

Training = forward + backward = 3 x forward (the backward pass costs two matmuls for every
forward one). Embedding look-ups, softmax, LayerNorm and GELU are not counted (memory-bound,
a few percent). Model FLOP utilisation (MFU) = achieved model FLOP/s / the hardware's measured peak.
"""

from __future__ import annotations

from bert_tf.model.config import BertConfig


def _layer_flops(S: int, H: int, I: int, modern: bool) -> float:
    """One transformer layer over a sequence of S (the docstring's per-layer terms)."""
    feed_forward = (3 if modern else 2) * 2 * S * H * I
    return float(4 * 2 * S * H * H + 2 * 2 * S * S * H + feed_forward)


def forward_flops_per_sequence(
    config: BertConfig, seq_length: int, predictions: int, nsp: bool = True
) -> float:
    S, H, I, P, V = (
        seq_length,
        config.hidden_size,
        config.intermediate_size,
        predictions,
        config.vocab_size,
    )
    layer = _layer_flops(S, H, I, config.modern)
    heads = 2 * H * H + 2 * P * H * H + 2 * P * H * V + (2 * H * 2 if nsp else 0)
    return float(config.num_hidden_layers * layer + heads)


def training_flops_per_sequence(config, seq_length, predictions, nsp=True) -> float:
    return 3.0 * forward_flops_per_sequence(config, seq_length, predictions, nsp)


def encoder_flops_per_token(config: BertConfig, seq_length: int) -> float:
    """Forward FLOPs of the transformer layers alone per token at `seq_length` (the layer terms
    of forward_flops_per_sequence). Windowed layers count as dense, which is what bert_tf computes
    (a mask) up to 3 x local_attention // 2 tokens; past that it computes them in blocks
    (model/modern.py), and this count is then too high for them."""
    S, H, I = seq_length, config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * _layer_flops(S, H, I, config.modern) / S
