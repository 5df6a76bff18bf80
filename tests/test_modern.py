"""The modern architecture (ModernBERT's: model/modern.py) and its Hugging Face layout
(artifacts/modernbert_format.py), checked against an independent NumPy ModernBertForMaskedLM
(tests/modernbert_reference.py, itself checked once against transformers' PyTorch model: docs/results.md)
and against transformers' own ModernBertConfig."""
import dataclasses
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

import bert_reference
import modernbert_reference as ref
from bert_tf import ConfigError
from bert_tf.artifacts import checkpoint_formats as cf
from bert_tf.artifacts import checkpointing, modernbert_format
from bert_tf.model import modeling

# Four layers, global in 0 and 3 (every third), a window of +-4 tokens: at 20 tokens it matters.
CONFIG = modeling.BertConfig.preset("modern-tiny", vocab_size=120, hidden_size=64, num_attention_heads=4,
                                    num_hidden_layers=4, intermediate_size=96, local_attention=8)


def perturbed_model(config=CONFIG, seed=0, use_nsp=False):
    """A modern BertPretrainer with every variable random (norm scales near 1, not 1): a weight read into
    the wrong place, or ignored, changes the outputs."""
    model = modeling.BertPretrainer(config, use_nsp=use_nsp)
    r = np.random.RandomState(seed)
    for name, var in sorted(checkpointing.module_variables(model).items()):
        scale = 1.0 if "word_embeddings" in name else 0.5 / np.sqrt(var.shape[0]) if len(var.shape) == 2 else 0.1
        var.assign(((1.0 if name.endswith("gamma") else 0.0) + scale * r.randn(*var.shape)).astype(np.float32))
    return model


def batch(seq=20, vocab=120, seed=1):
    """ids [3, seq] and a padding mask (row 1 padded from 13, row 2 from 6)."""
    r = np.random.RandomState(seed)
    ids = r.randint(5, vocab, (3, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 13:] = 0
    mask[2, 6:] = 0
    return ids, mask


def our_logits(model, ids, mask, position_ids=None):
    """Masked-LM logits at every position [B, S, V] and the sequence output [B, S, H]."""
    seq, _ = model.encoder(tf.constant(ids), tf.constant(mask), tf.zeros_like(ids),
                           position_ids=None if position_ids is None else tf.constant(position_ids))
    every = tf.broadcast_to(tf.range(ids.shape[1])[None], ids.shape)
    return model.mlm_logits(seq, every).numpy(), seq.numpy()


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return bert_reference.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"), size=CONFIG.vocab_size)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vocab_file):
    model = perturbed_model()
    out = tmp_path_factory.mktemp("modern_hf")
    written = cf.write_huggingface(cf.to_numpy(model), CONFIG, vocab_file, str(out))
    return model, out, written


def max_diff(a, b, mask):
    real = mask.astype(bool)
    return float(np.abs(np.asarray(a, np.float64) - b)[real].max())


def test_the_export_gives_the_numpy_modernbert_s_logits(exported):
    model, out, _ = exported
    tensors, config = load_file(str(out / "model.safetensors")), json.load(open(out / "config.json"))
    ids, mask = batch()
    ours, sequence = our_logits(model, ids, mask)
    theirs = ref.mlm_logits(tensors, config, ids, mask)
    diff, hidden = max_diff(ours, theirs, mask), max_diff(sequence, ref.last_hidden_state(tensors, config, ids, mask), mask)
    print(f"modern export vs the NumPy ModernBertForMaskedLM: max abs diff logits {diff:.2e} (logits up to "
          f"{np.abs(theirs).max():.1f}), last hidden state {hidden:.2e}")
    assert diff <= 1e-4 and hidden <= 1e-4
    # the window is in effect: the same weights with every layer global give other logits
    wide = ref.mlm_logits(tensors, {**config, "global_attn_every_n_layers": 1}, ids, mask)
    assert max_diff(wide, theirs, mask) > 1e-2


def test_a_modernbert_checkpoint_imports_with_the_numpy_modernbert_s_logits(tmp_path, vocab_file, exported):
    """The other direction, from tensors made by the reference (not by our export)."""
    config = json.load(open(exported[1] / "config.json"))
    tensors = ref.random_weights(config, seed=5)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    json.dump(config, open(tmp_path / "config.json", "w"))
    ckpt = cf.read(str(tmp_path))
    assert ckpt.format == cf.HUGGINGFACE and ckpt.config.to_dict() == CONFIG.to_dict()
    model = modeling.BertPretrainer(ckpt.config, use_nsp=False)
    assert cf.assign(model, ckpt, log=lambda *_: None) == ["pooler"]      # the MLM export has no classifier head
    ids, mask = batch(seed=2)
    diff = max_diff(our_logits(model, ids, mask)[0], ref.mlm_logits(tensors, config, ids, mask), mask)
    print(f"imported ModernBERT tensors vs the NumPy ModernBertForMaskedLM: max abs diff {diff:.2e}")
    assert diff <= 1e-4


def test_the_export_has_modernbert_s_names_shapes_and_config(exported):
    import transformers  # the oracle (requirements-dev.txt): missing, the test fails, not skips
    _, out, written = exported
    tensors = load_file(str(out / "model.safetensors"))
    config = json.load(open(out / "config.json"))
    expected = ref.random_weights(config)       # the names and shapes the reference read from modeling_modernbert.py
    assert {k: v.shape for k, v in tensors.items()} == {k: v.shape for k, v in expected.items()}
    hf = transformers.AutoConfig.from_pretrained(str(out))
    assert type(hf) is transformers.ModernBertConfig
    known = set(transformers.ModernBertConfig().to_dict()) | {"architectures"}
    assert set(config) <= known, set(config) - known
    for key, value in config.items():
        assert getattr(hf, key) == value, key
    assert not any(getattr(hf, f) for f in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias"))
    # the vocabulary's [PAD], [CLS], [SEP] (bert_reference.write_vocab: 0, 101, 102) as ModernBERT's special ids
    assert (hf.pad_token_id, hf.cls_token_id, hf.bos_token_id, hf.sep_token_id, hf.eos_token_id) == (0, 101, 101, 102, 102)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("w1 w2")["input_ids"] == [101, 105, 106, 102]
    assert set(tokenizer("w1 w2")) == {"input_ids", "attention_mask"}    # ModernBERT takes no token types
    assert set(written) >= {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"}


def test_export_then_import_gives_identical_weights_and_outputs(exported):
    model, out, _ = exported
    ckpt = cf.read(str(out))
    back = modeling.BertPretrainer(ckpt.config, use_nsp=False)
    cf.assign(back, ckpt, log=lambda *_: None)
    before, after = cf.to_numpy(model), cf.to_numpy(back)
    assert all(np.array_equal(before[k], after[k]) for k in before if not k.startswith("encoder/pooler"))
    ids, mask = batch(seed=3)
    assert np.array_equal(our_logits(model, ids, mask)[0], our_logits(back, ids, mask)[0])


def packed_pair(seed):
    """Two random instances (7 and 9 tokens) packed into one row of 20: (a, b, row, positions, instance ids)."""
    r = np.random.RandomState(seed)
    a, b = r.randint(5, 120, 7), r.randint(5, 120, 9)
    row = np.zeros((1, 20), np.int32)
    row[0, :16] = np.concatenate([a, b])
    positions = np.zeros_like(row)
    positions[0, :16] = np.concatenate([np.arange(7), np.arange(9)])
    instance = np.zeros_like(row)
    instance[0, :16] = [1] * 7 + [2] * 9
    return a, b, row, positions, instance


def test_packed_rows_give_each_instance_what_it_has_alone():
    """Two instances in one row (per-instance positions into RoPE, the block-diagonal mask and the window)."""
    model = perturbed_model(modeling.BertConfig.preset("modern-tiny", vocab_size=120, hidden_size=64,
                                                       num_attention_heads=4, num_hidden_layers=3, local_attention=4))
    a, b, row, positions, instance = packed_pair(seed=4)
    packed, _ = model.encoder(tf.constant(row), tf.constant((instance > 0).astype(np.int32)), tf.zeros_like(row),
                              position_ids=tf.constant(positions), instance_ids=tf.constant(instance))
    for start, tokens in ((0, a), (7, b)):
        alone = np.zeros((1, 20), np.int32)
        alone[0, :len(tokens)] = tokens
        mask = (alone > 0).astype(np.int32)
        single, _ = model.encoder(tf.constant(alone), tf.constant(mask), tf.zeros_like(alone))
        diff = np.abs(packed.numpy()[0, start:start + len(tokens)] - single.numpy()[0, :len(tokens)]).max()
        assert diff < 1e-5, (start, diff)


def test_expected_shapes_are_the_models_variables_and_the_classic_json_is_google_s():
    for config in (CONFIG, modeling.BertConfig.preset("tiny", vocab_size=120)):
        for nsp in (True, False):
            variables = checkpointing.module_variables(modeling.BertPretrainer(config, use_nsp=nsp))
            assert {k: list(v.shape) for k, v in variables.items()} == cf.expected_shapes(config, nsp)
    google = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
              "type_vocab_size", "initializer_range"}
    assert set(modeling.BertConfig.preset("base").to_dict()) == google
    assert modeling.BertConfig.from_dict(CONFIG.to_dict()) == CONFIG


def test_the_modern_encoder_fine_tunes_from_the_export(exported):
    from bert_tf.tasks import classification
    _, out, _ = exported
    classifier = classification.BertClassifier(CONFIG, 3)
    said = []
    ckpt = cf.read(str(out))
    cf.check_fits(ckpt, CONFIG, CONFIG.vocab_size)
    cf.assign(classifier.encoder, ckpt, log=said.append)
    assert said == [f"pooler not in {out / 'model.safetensors'}: initialised at random"]
    ids, mask = batch(seed=6)
    features = {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.zeros_like(ids),
                "label": tf.constant([0, 1, 2])}
    with tf.GradientTape() as tape:
        loss = classifier(features, training=True).loss
    grads = tape.gradient(loss, classifier.trainable_variables)
    assert all(g is not None and np.abs(tf.convert_to_tensor(g).numpy()).max() > 0 for g in grads)


def test_bad_modern_input_is_named(tmp_path, exported, vocab_file):
    with pytest.raises(ConfigError, match="even head size"):
        modeling.BertConfig.preset("modern-tiny", hidden_size=66, num_attention_heads=6)
    with pytest.raises(ConfigError, match="local_attention=128.*--max_seq_length=64"):
        modeling.check_features_fit(modeling.BertConfig.preset("modern-tiny"), 64)
    modeling.check_features_fit(modeling.BertConfig.preset("modern-tiny", global_attn_every_n_layers=1), 64)
    classic = cf.to_numpy(modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=120)))
    with pytest.raises(ConfigError, match="'bert' model's but the config says architecture='modern'"):
        cf.write_huggingface(classic, CONFIG, vocab_file, str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="'bert' model's but the config says architecture='modern'"):
        cf.check_fits(cf.Checkpoint(cf.OURS, "c", "c.index", None, None, classic), CONFIG, CONFIG.vocab_size)
    with pytest.raises(ConfigError, match="'modern' model's but the config says architecture='bert'"):
        cf.check_fits(cf.Checkpoint(cf.OURS, "m", "m.index", None, None, cf.to_numpy(exported[0])),
                      modeling.BertConfig.preset("tiny", vocab_size=120), 120)
    with pytest.raises(ConfigError, match="no google-research/bert layout"):
        cf.write_google(cf.to_numpy(exported[0]), CONFIG, vocab_file, str(tmp_path / "y"))
    config = json.load(open(exported[1] / "config.json"))
    bad = tmp_path / "biased"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((exported[1] / "model.safetensors").read_bytes())
    json.dump({**config, "mlp_bias": True}, open(bad / "config.json", "w"))
    with pytest.raises(ConfigError, match=f"{bad / 'config.json'}: mlp_bias"):
        cf.read(str(bad))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ---------------------------------------------------------------- issue 49: ModernBERT configs as transformers writes them
MEAN = dataclasses.replace(CONFIG, classifier_pooling="mean")


def perturb(module, seed):
    """Every variable of `module` random, as perturbed_model does."""
    r = np.random.RandomState(seed)
    for name, var in sorted(checkpointing.module_variables(module).items()):
        scale = 1.0 if "word_embeddings" in name else 0.5 / np.sqrt(var.shape[0]) if len(var.shape) == 2 else 0.1
        var.assign(((1.0 if name.endswith("gamma") else 0.0) + scale * r.randn(*var.shape)).astype(np.float32))
    return module


def classifier_tensors(classifier):
    """A BertClassifier's variables under ModernBertForSequenceClassification's names (ours: pooler = head)."""
    ours = {k: v.numpy() for k, v in checkpointing.module_variables(classifier).items()}
    tensors = {hf: (ours[name].T if kind == "kernel" else ours[name])
               for name, hf, kind, _ in modernbert_format.table(classifier.config) if name.startswith("encoder/")}
    tensors.update({"head.dense.weight": ours["encoder/pooler/kernel"].T, "head.norm.weight": ours["encoder/pooler_norm/gamma"],
                    "classifier.weight": ours["classifier/kernel"].T, "classifier.bias": ours["classifier/bias"]})
    return tensors


def test_mean_pooling_gives_the_numpy_modernbert_classifier_s_logits():
    """classifier_pooling "mean": the head on the mean over the attention mask (padded rows 1 and 2), as
    transformers' ModernBertForSequenceClassification (the NumPy one: PyTorch is not installed), not on [CLS]."""
    import transformers
    from bert_tf.tasks import classification
    classifier = perturb(classification.BertClassifier(MEAN, 3), seed=7)
    hf_config = modernbert_format.config_to_huggingface(MEAN, lambda token: 0)
    assert hf_config["classifier_pooling"] == "mean"
    assert transformers.ModernBertConfig(**hf_config).classifier_pooling == "mean"
    ids, mask = batch(seed=8)
    features = {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.zeros_like(ids)}
    ours = classifier.logits(features).numpy()
    tensors = classifier_tensors(classifier)
    theirs = ref.sequence_classification_logits(tensors, hf_config, ids, mask)
    diff = float(np.abs(ours - theirs).max())
    print(f"mean-pooled classifier vs the NumPy ModernBertForSequenceClassification: max abs diff {diff:.2e}")
    assert diff <= 1e-4
    cls = ref.sequence_classification_logits(tensors, {**hf_config, "classifier_pooling": "cls"}, ids, mask)
    assert np.abs(cls - theirs).max() > 1e-2          # the pooling is in effect


def test_mean_pooling_of_packed_rows_gives_each_instance_its_own_mean():
    """Packed: the pooled output at each instance's [CLS] position is the one it has alone in a padded row."""
    encoder = perturb(modeling.encoder(MEAN), seed=9)
    a, b, row, positions, instance = packed_pair(seed=10)
    sequence, pooled_row = encoder(tf.constant(row), tf.constant((instance > 0).astype(np.int32)), tf.zeros_like(row),
                                   position_ids=tf.constant(positions), instance_ids=tf.constant(instance))
    pooled = encoder.pool(sequence, tf.constant([[0, 7]]), input_mask=tf.constant((instance > 0).astype(np.int32)),
                          instance_ids=tf.constant(instance)).numpy()
    for k, tokens in enumerate((a, b)):
        alone = np.zeros((1, 20), np.int32)
        alone[0, :len(tokens)] = tokens
        _, single = encoder(tf.constant(alone), tf.constant((alone > 0).astype(np.int32)), tf.zeros_like(alone))
        assert np.abs(pooled[0, k] - single.numpy()[0]).max() < 1e-5, k
        if k == 0:   # the row's own pooled output is its first instance's, as [CLS] pooling's is
            assert np.abs(pooled_row.numpy()[0] - single.numpy()[0]).max() < 1e-5


def test_classifier_pooling_is_validated_and_carried_through_export_and_import(tmp_path, exported):
    with pytest.raises(ConfigError, match="classifier_pooling 'max' is not one of cls, mean"):
        modeling.BertConfig.preset("modern-tiny", classifier_pooling="max")
    with pytest.raises(ConfigError, match="classifier_pooling 'mean' needs architecture='modern'"):
        modeling.BertConfig.preset("tiny", classifier_pooling="mean")
    assert "classifier_pooling" not in modeling.BertConfig.preset("tiny").to_dict()   # google's JSON unchanged
    assert modeling.BertConfig.from_dict(MEAN.to_dict()) == MEAN
    config = json.load(open(exported[1] / "config.json"))
    assert config["classifier_pooling"] == "cls"
    hf = modernbert_format.config_to_huggingface(MEAN, lambda token: 0)
    assert modernbert_format.config_from_huggingface(hf, "c.json") == MEAN
    bad = write_checkpoint(tmp_path / "max", exported, {**config, "classifier_pooling": "max"})
    with pytest.raises(ConfigError, match=re.escape(f"{bad}: BertConfig.classifier_pooling 'max'")):
        cf.read(str(bad.parent))


def test_a_missing_field_means_transformers_default():
    """Every field config_from_huggingface fills in is ModernBertConfig's default (4.57.6): local_rope_theta
    10000, not the global theta; 4.57 turns an explicit null local theta into the global one."""
    import transformers
    hf = transformers.ModernBertConfig()
    ours = modernbert_format.config_from_huggingface({"model_type": "modernbert"}, "c.json")
    pairs = {"norm_eps": "layer_norm_eps", "mlp_dropout": "hidden_dropout_prob",
             "attention_dropout": "attention_probs_dropout_prob",
             **{k: k for k in modernbert_format.DEFAULTS}, **{k: k for k in modernbert_format.THETA_DEFAULTS}}
    for theirs, mine in pairs.items():
        assert getattr(ours, mine) == getattr(hf, theirs), theirs
    assert ours.hidden_act == modernbert_format.ACT_FROM_HF[hf.hidden_activation]
    given = {"global_rope_theta": 50000.0}
    assert modernbert_format.config_from_huggingface(given, "c.json").local_rope_theta == 10000.0
    null = modernbert_format.config_from_huggingface({**given, "local_rope_theta": None}, "c.json")
    assert null.local_rope_theta == 50000.0


def v5_config(v4, n=3):
    """A v4 config.json as transformers v5 writes it: rope_parameters and layer_types, no *_rope_theta."""
    v5 = {k: v for k, v in v4.items() if k not in ("global_rope_theta", "local_rope_theta")}
    v5["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": v4["global_rope_theta"]},
                             "sliding_attention": {"rope_type": "default", "rope_theta": v4["local_rope_theta"]}}
    v5["layer_types"] = ["sliding_attention" if i % n else "full_attention" for i in range(v4["num_hidden_layers"])]
    return v5


def write_checkpoint(folder, exported, config):
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((exported[1] / "model.safetensors").read_bytes())
    json.dump(config, open(folder / "config.json", "w"))
    return folder / "config.json"


def test_a_transformers_v5_config_imports_as_its_v4_equivalent(tmp_path, exported):
    v4 = {**json.load(open(exported[1] / "config.json")), "global_rope_theta": 50000.0, "local_rope_theta": 2500.0}
    expected = modernbert_format.config_from_huggingface(v4, "v4.json")
    assert (expected.global_rope_theta, expected.local_rope_theta) == (50000.0, 2500.0)
    v5 = v5_config(v4)
    assert modernbert_format.config_from_huggingface(v5, "v5.json") == expected
    assert modernbert_format.config_from_huggingface({**v4, **v5}, "both.json") == expected   # agreeing forms
    ckpt = cf.read(str(write_checkpoint(tmp_path / "v5", exported, v5).parent))
    assert ckpt.config == expected


def test_a_v5_config_the_modern_model_cannot_be_is_refused_naming_the_file(tmp_path, exported):
    v5 = v5_config(json.load(open(exported[1] / "config.json")))
    cases = {
        "period": ({**v5, "layer_types": ["full_attention", "sliding_attention"] * 2},     # every 2nd, not 3rd
                   "layer_types[2] is 'full_attention' where bert_tf's modern model has 'sliding_attention'"),
        "first": ({**v5, "layer_types": ["sliding_attention"] + v5["layer_types"][1:]},
                  "layer_types[0] is 'sliding_attention' where bert_tf's modern model has 'full_attention'"),
        "length": ({**v5, "layer_types": v5["layer_types"][:-1]}, "layer_types ['full_attention'"),
        "yarn": ({**v5, "rope_parameters": {**v5["rope_parameters"], "full_attention": {"rope_type": "yarn",
                  "rope_theta": 160000.0, "factor": 4.0}}},
                 "rope_parameters['full_attention'] has rope_type 'yarn' and factor: bert_tf's modern model has plain RoPE"),
        "flat": ({**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
                 "rope_parameters {'rope_type': 'default', 'rope_theta': 10000.0} is not keyed by layer type"),
        "disagree": ({**v5, "global_rope_theta": 1000.0},
                     "rope_parameters['full_attention'] has rope_theta 160000.0 but global_rope_theta is 1000.0"),
    }
    for name, (config, message) in cases.items():
        path = write_checkpoint(tmp_path / name, exported, config)
        with pytest.raises(ConfigError, match=re.escape(f"{path}: {message}")):
            cf.read(str(path.parent))


def test_global_rope_theta_overrides_the_preset_and_the_checkpoint_and_a_classic_model_refuses_it():
    """--global_rope_theta: ModernBERT's pre-training theta (10,000) for phase 1, its long-context one
    (160,000, the preset's, from the released config) for phase 2; a classic BERT has no RoPE."""
    from bert_tf.train import pretrain_config, preflight
    base = dict(checkpoint_dir="x", vocab_file="v")
    modern = pretrain_config.PretrainConfig(**base, model_preset="modern-tiny", global_rope_theta=10000.0)
    config = preflight.build_model_config(modern, 300)
    assert (config.global_rope_theta, config.local_rope_theta) == (10000.0, 10000.0)
    assert preflight.build_model_config(dataclasses.replace(modern, global_rope_theta=0.0), 300).global_rope_theta \
        == 160000.0
    with pytest.raises(ConfigError, match=r"--global_rope_theta=10000: the model is a classic BERT"):
        preflight.build_model_config(dataclasses.replace(modern, model_preset="tiny"), 300)
    with pytest.raises(ConfigError, match="--global_rope_theta must be > 0, got -1"):
        dataclasses.replace(modern, global_rope_theta=-1.0).validate()
