"""Properties of the numpy ModernBertForMaskedLM oracle (tests/modernbert_reference.py); no TF, no torch.
Its agreement with transformers itself was checked once outside the project (see the module docstring)."""
import math

import numpy as np
import pytest

from tests import modernbert_reference as ref

CONFIG = dict(ref.SMALL, global_attn_every_n_layers=2, num_hidden_layers=2)   # layer 0 global, layer 1 local


def _inputs(batch=2, seq=16, seed=1, vocab=CONFIG["vocab_size"]):
    r = np.random.RandomState(seed)
    ids = r.randint(0, vocab, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    mask[-1, 11:] = 0
    return ids, mask


def test_shapes_and_layer_kinds():
    w = ref.random_weights(CONFIG)
    ids, mask = _inputs()
    assert ref.last_hidden_state(w, CONFIG, ids, mask).shape == (2, 16, 32)
    assert ref.mlm_logits(w, CONFIG, ids, mask).shape == (2, 16, 53)
    assert [ref.is_global(ref.DEFAULTS, i) for i in range(7)] == [True, False, False, True, False, False, True]
    assert "model.layers.0.attn_norm.weight" not in w and "model.layers.1.attn_norm.weight" in w


def test_masks():
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 0, 0]])
    glob, local = ref.visible(CONFIG, mask, 0)[0, 0], ref.visible(CONFIG, mask, 1)[0, 0]
    assert (glob == mask.astype(bool)).all()                       # every query: all real keys, no padding
    i, j = np.indices(local.shape)
    assert (local == ((np.abs(i - j) <= 2) & (j < 7))).all()        # local_attention=4: |i - j| <= 2


def test_sliding_window_restricts_attention():
    """With layer 0's attention output zeroed, layer 0 is position-wise and only the local layer mixes tokens:
    a token 3 away from position 8 must not change its logits, a token 2 away must."""
    w = ref.random_weights(CONFIG)
    w["model.layers.0.attn.Wo.weight"] = np.zeros_like(w["model.layers.0.attn.Wo.weight"])
    ids, mask = _inputs(batch=1)
    mask[:] = 1                 # all real
    base = ref.mlm_logits(w, CONFIG, ids, mask)
    for distance, changes in ((3, False), (-3, False), (7, False), (2, True), (-2, True)):
        other = ids.copy()
        other[0, 8 + distance] = (ids[0, 8 + distance] + 1) % CONFIG["vocab_size"]
        delta = np.abs(ref.mlm_logits(w, CONFIG, other, mask)[0, 8] - base[0, 8]).max()
        assert (delta > 1e-4) == changes, (distance, delta)
    far = ids.copy()
    far[0, 0] = (ids[0, 0] + 1) % CONFIG["vocab_size"]
    assert np.abs(ref.mlm_logits(w, dict(CONFIG, global_attn_every_n_layers=1), far, mask)[0, 8]
                  - ref.mlm_logits(w, dict(CONFIG, global_attn_every_n_layers=1), ids, mask)[0, 8]).max() > 1e-4


def test_padding_keys_do_not_influence_real_positions():
    w = ref.random_weights(CONFIG)
    ids, mask = _inputs()
    other = ids.copy()
    other[1, 11:] = (ids[1, 11:] + 5) % CONFIG["vocab_size"]
    a, b = ref.mlm_logits(w, CONFIG, ids, mask), ref.mlm_logits(w, CONFIG, other, mask)
    np.testing.assert_allclose(a[1, :11], b[1, :11], atol=1e-12)
    np.testing.assert_array_equal(a[0], b[0])
    assert np.abs(a[1, 11:] - b[1, 11:]).max() > 1e-3           # padded positions are still computed


def test_rope_depends_on_relative_position_only():
    w = ref.random_weights(CONFIG)
    ids, mask = _inputs()
    base = ref.mlm_logits(w, CONFIG, ids, mask)
    np.testing.assert_allclose(ref.mlm_logits(w, CONFIG, ids, mask, np.arange(16)[None].repeat(2, 0)), base,
                               atol=1e-12)
    shifted = ref.mlm_logits(w, CONFIG, ids, mask, np.arange(16)[None].repeat(2, 0) + np.array([[37], [5]]))
    np.testing.assert_allclose(shifted, base, atol=1e-6)
    stretched = ref.mlm_logits(w, CONFIG, ids, mask, 2 * np.arange(16)[None].repeat(2, 0))
    assert np.abs(stretched - base).max() > 1e-3


def test_rope_rotation():
    x = np.random.RandomState(0).randn(1, 1, 3, 8)
    out = ref.rope(x, np.array([[0, 1, 5]]), 10000.0)
    np.testing.assert_allclose(out[..., 0, :], x[..., 0, :])                         # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))
    # pair (0, 4) rotates by angle p * theta^0 = p (rotate-half pairs dim i with i + d/2)
    c, s = math.cos(5), math.sin(5)
    np.testing.assert_allclose(out[0, 0, 2, [0, 4]], [c * x[0, 0, 2, 0] - s * x[0, 0, 2, 4],
                                                      s * x[0, 0, 2, 0] + c * x[0, 0, 2, 4]])


def test_tied_decoder_when_decoder_weight_absent():
    w = ref.random_weights(CONFIG, tied=True)
    assert "decoder.weight" not in w
    ids, mask = _inputs()
    tied = ref.mlm_logits(w, CONFIG, ids, mask)
    explicit = dict(w, **{"decoder.weight": w["model.embeddings.tok_embeddings.weight"]})
    np.testing.assert_array_equal(ref.mlm_logits(explicit, CONFIG, ids, mask), tied)
    untied = ref.random_weights(CONFIG, tied=False)
    assert np.abs(ref.mlm_logits(untied, CONFIG, ids, mask) - tied).max() > 1e-3


@pytest.mark.parametrize("flag", ["norm_bias", "attention_bias", "mlp_bias", "classifier_bias", "decoder_bias"])
def test_bias_flags_read_bias_tensors(flag):
    on = dict(CONFIG, **{flag: True}) if flag != "decoder_bias" else CONFIG
    off = dict(CONFIG, **{flag: False})
    w = ref.random_weights(on)
    biases = sorted(set(w) - set(ref.random_weights(off)))
    assert biases and all(k.endswith(".bias") for k in biases)
    ids, mask = _inputs()
    zeroed = {k: (np.zeros_like(v) if k in biases else v) for k, v in w.items()}
    np.testing.assert_allclose(ref.mlm_logits(zeroed, on, ids, mask), ref.mlm_logits(w, off, ids, mask), atol=1e-12)
    assert np.abs(ref.mlm_logits(w, on, ids, mask) - ref.mlm_logits(w, off, ids, mask)).max() > 1e-4
    with pytest.raises(KeyError):
        ref.mlm_logits({k: v for k, v in w.items() if k != biases[0]}, on, ids, mask)


def test_activations():
    x = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(ref.ACT["gelu"](x), [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    assert abs(ref.ACT["gelu"](np.array([1.0]))[0] - 0.8413447460685429) < 1e-12
    assert 1e-5 < abs(ref.ACT["gelu_pytorch_tanh"](np.array([1.0]))[0] - 0.8413447460685429) < 1e-3
    np.testing.assert_array_equal(ref.ACT["gelu_new"](x), ref.ACT["gelu_pytorch_tanh"](x))
    np.testing.assert_allclose(ref.ACT["silu"](x), x / (1 + np.exp(-x)))
    np.testing.assert_array_equal(ref.ACT["relu"](x), np.maximum(x, 0))

