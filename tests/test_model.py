"""BertConfig, the model's heads and parameter count."""
import json

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.model import modeling
from conftest import random_features


def test_config_json_round_trip(tmp_path):
    config = modeling.BertConfig.preset("mini", vocab_size=1234)
    path = str(tmp_path / "bert_config.json")
    config.to_json_file(path)
    assert json.loads(open(path).read())["num_hidden_layers"] == 4
    assert modeling.BertConfig.from_json_file(path) == config


@pytest.mark.parametrize("name,layers,hidden", [("tiny", 2, 128), ("mini", 4, 256), ("small", 4, 512),
                                                ("medium", 8, 512), ("base", 12, 768), ("large", 24, 1024)])
def test_presets(name, layers, hidden):
    c = modeling.BertConfig.preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == \
        (layers, hidden, hidden // 64, 4 * hidden)


@pytest.mark.parametrize("overrides,message", [
    (dict(hidden_size=100, num_attention_heads=3), "not divisible by num_attention_heads"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    (dict(vocab_size=-5), "vocab_size must be a positive integer"),
    (dict(hidden_act="swish2"), "hidden_act"),
])
def test_invalid_config_fails_clearly(overrides, message):
    with pytest.raises(ValueError, match=message):
        modeling.BertConfig(**overrides)


def test_unknown_fields_and_preset_are_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2, "hiden_layers": 3}))
    with pytest.raises(ValueError, match="hiden_layers"):
        modeling.BertConfig.from_json_file(str(path))
    with pytest.raises(ValueError, match="valid presets: tiny"):
        modeling.BertConfig.preset("huge")


@pytest.mark.slow
def test_base_parameter_count_matches_google_bert_base():
    config = modeling.BertConfig.preset("base")
    model = modeling.BertPretrainer(config)
    encoder = sum(int(np.prod(v.shape)) for v in model.encoder.trainable_variables)
    total = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    # google's BERT-base (110M), counted from its architecture: exact, so one missing bias or LayerNorm shows
    H, I, L, V, P, T = 768, 3072, 12, 30522, 512, 2
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size,
            config.max_position_embeddings, config.type_vocab_size) == (H, I, L, V, P, T)
    embeddings = (V + P + T) * H + 2 * H                                  # three tables, LayerNorm
    layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H    # Q K V O, LN, FFN in and out, LN
    pooler = H * H + H
    heads = (H * H + H) + 2 * H + V + (2 * H + 2)                         # MLM transform, LN, output bias; NSP
    assert encoder == embeddings + L * layer + pooler == 109_482_240
    assert total == encoder + heads == 110_106_428


@pytest.fixture(scope="module")
def tiny():
    tf.random.set_seed(1)
    return modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))


def test_output_shapes_of_each_head(tiny):
    f = {k: tf.constant(v) for k, v in random_features(batch=3, seq=16, preds=4).items()}
    seq, pooled = tiny.encoder(f["input_ids"], f["input_mask"], f["segment_ids"])
    assert seq.shape == (3, 16, 128) and pooled.shape == (3, 128)
    assert tiny.mlm_logits(seq, f["masked_lm_positions"]).shape == (3, 4, 100)
    assert tiny.nsp(pooled).shape == (3, 2)
    out = tiny(f)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_weight", "nsp_correct", "nsp_count"):
        assert getattr(out, key).shape == () and getattr(out, key).dtype == tf.float32
    assert float(out.mlm_weight) == 12 and float(out.nsp_count) == 3


def test_only_masked_positions_feed_the_mlm_loss(tiny):
    f = {k: tf.constant(v) for k, v in random_features(batch=2, seq=16, preds=3).items()}
    seq, _ = tiny.encoder(f["input_ids"], f["input_mask"], f["segment_ids"])
    with tf.GradientTape() as tape:
        tape.watch(seq)
        loss = tf.reduce_sum(tiny.mlm_logits(seq, f["masked_lm_positions"]))
    grad_norm_per_position = tf.norm(tf.convert_to_tensor(tape.gradient(loss, seq)), axis=-1).numpy()
    masked = np.zeros([2, 16], bool)
    for b, positions in enumerate(f["masked_lm_positions"].numpy()):
        masked[b, positions] = True
    assert (grad_norm_per_position[masked] > 0).all()
    assert (grad_norm_per_position[~masked] == 0).all()


def test_mlm_only_model_has_no_nsp_head():
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100), use_nsp=False)
    out = model({k: tf.constant(v) for k, v in random_features().items()})
    assert out.nsp_loss is None and not hasattr(model, "nsp")
    assert float(out.loss) == float(out.mlm_loss)


def test_features_that_do_not_fit_fail_before_training():
    config = modeling.BertConfig.preset("tiny", vocab_size=100, max_position_embeddings=64)
    with pytest.raises(ValueError, match="--max_seq_length=128 exceeds the model's max_position_embeddings"):
        modeling.check_features_fit(config, 128)
    with pytest.raises(ValueError, match="vocabulary has 120 tokens but the model's vocab_size is 100"):
        modeling.check_features_fit(config, 64, vocab_size=120)


def test_dropout_keeps_the_configured_fraction_unbiased_the_same_under_xla_and_per_seed():
    """16 random bits per element: the kept fraction is 1 - rate to within 5 standard deviations
    (N = 1,001,000 elements: sigma = sqrt(rate (1 - rate) / N) = 3.0e-4 at 0.1, 5.0e-4 at 0.5), the kept values
    are x / (1 - rate) (rate to 16 bits) and the mean is unchanged (5 sigma), XLA draws the same mask, and a seed is a mask."""
    x = tf.ones([1000, 1001])
    n = 1000 * 1001
    seed = tf.constant([3, 4], tf.int32)
    for rate in (0.1, 0.5):
        y = modeling.dropout(x, rate, seed, training=True)
        kept = float(tf.reduce_mean(tf.cast(y != 0, tf.float32)))
        assert abs(kept - (1 - rate)) < 5 * (rate * (1 - rate) / n) ** 0.5, (rate, kept)
        values = y.numpy()[y.numpy() != 0]           # scaled by 1 / kept, the rate rounded to 16 bits
        np.testing.assert_allclose(values, 65536 / (65536 - round(rate * 65536)), rtol=1e-6)
        assert abs(float(tf.reduce_mean(y)) - 1.0) < 5 * (rate / (1 - rate) / n) ** 0.5
    small = tf.random.normal([3, 5, 7], dtype=tf.float32)          # an odd element count
    compiled = tf.function(lambda v, s: modeling.dropout(v, 0.1, s, True), jit_compile=True)
    assert bool(tf.reduce_all(compiled(small, seed) == modeling.dropout(small, 0.1, seed, True)))
    assert bool(tf.reduce_all(modeling.dropout(x, 0.1, seed, True) == modeling.dropout(x, 0.1, seed, True)))
    assert not bool(tf.reduce_all(modeling.dropout(x, 0.1, seed + 1, True) == modeling.dropout(x, 0.1, seed, True)))
    assert modeling.dropout(x, 0.1, seed, training=False) is x


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
def test_layer_recomputation_gives_the_plain_gradients_and_runs_each_layer_again_backwards(compiled, monkeypatch):
    config = modeling.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=64)
    features = {k: tf.constant(v) for k, v in random_features(batch=4, seq=16, preds=3, vocab=100).items()}
    calls = {"n": 0}
    real = modeling.TransformerLayer.__call__

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return real(self, *args, **kwargs)
    monkeypatch.setattr(modeling.TransformerLayer, "__call__", counted)
    results = {}
    for recompute in modeling.RECOMPUTE:
        tf.random.set_seed(0)
        model = modeling.BertPretrainer(config, recompute=recompute)

        def gradients():
            with tf.GradientTape() as tape:                      # dropout on: the masks must be redrawn alike
                loss = model(features, seed=tf.constant([1, 2]), training=True).loss
            return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
        calls["n"] = 0
        loss, grads = (tf.function(gradients) if compiled else gradients)()
        results[recompute] = (float(loss), [g.numpy() for g in grads], calls["n"])
    (loss, plain, n_plain), (loss_r, recomputed, n_r) = results["none"], results["layer"]
    assert loss == loss_r and len(plain) == len(recomputed)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(plain, recomputed))
    assert max(np.abs(a).max() for a in plain) > 1e-3                   # gradients that are not all zero
    assert (n_plain, n_r) == (3, 6)                                      # each layer once more, in the backward pass
    with pytest.raises(ValueError, match="recompute='all': valid are none, layer"):
        modeling.BertEncoder(config, recompute="all")


@pytest.mark.parametrize("name", ["gelu", "gelu_exact"])
def test_gelu_runs_in_float32_whatever_the_compute_dtype(name):
    """bfloat16 in, bfloat16 out, computed in float32 between (TensorFlow's bfloat16 tanh is the slow
    path on CPU): exactly the rounded float32 GELU, which the bfloat16 GELU is not everywhere."""
    x = tf.cast(tf.linspace(-6.0, 6.0, 4001), tf.bfloat16)
    approximate = name == "gelu"
    y = modeling.ACTIVATIONS[name](x)
    assert y.dtype == tf.bfloat16
    rounded = tf.cast(tf.nn.gelu(tf.cast(x, tf.float32), approximate=approximate), tf.bfloat16)
    assert np.array_equal(y.numpy(), rounded.numpy())
    assert not np.array_equal(y.numpy(), tf.nn.gelu(x, approximate=approximate).numpy())
    x32 = tf.cast(x, tf.float32)                                   # float32 in: TensorFlow's own GELU, unchanged
    assert np.array_equal(modeling.ACTIVATIONS[name](x32).numpy(), tf.nn.gelu(x32, approximate=approximate).numpy())


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("use_nsp", [True, False])
def test_the_pretrainer_output_keeps_every_field_through_a_compiled_function(jit, use_nsp):
    """PretrainOutput flattens for tf.nest: out of tf.function (XLA or not) each field holds what it holds eagerly,
    and the NSP fields stay None without the head."""
    config = modeling.BertConfig.preset("tiny", vocab_size=100, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
    model = modeling.BertPretrainer(config, use_nsp=use_nsp)
    features = {k: tf.constant(v) for k, v in random_features().items()}
    eager = model(features)
    compiled = tf.function(lambda f: model(f), jit_compile=jit)(features)
    assert type(compiled) is modeling.PretrainOutput
    assert list(compiled.present()) == list(eager.present())
    assert (compiled.nsp_loss is None) == (not use_nsp)
    for name, value in eager.present().items():
        np.testing.assert_allclose(getattr(compiled, name).numpy(), value.numpy(), rtol=1e-4, err_msg=name)
