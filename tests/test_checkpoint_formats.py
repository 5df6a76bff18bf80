"""Checkpoints in and out: google-research/bert's and Hugging Face's formats, checked against an
independent numpy BERT (tests/bert_reference.py) and against transformers' own BERT."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import bert_reference as ref
from bert_tf.artifacts import checkpoint_formats as cf
from bert_tf import ConfigError
from bert_tf.data import tokenization
from bert_tf.model import modeling
from bert_tf.train import pretrain_config
from conftest import REPO, mpi_env


def our_outputs(model, ids, mask, segments, positions):
    seq, pooled = model.encoder(tf.constant(ids), tf.constant(mask), tf.constant(segments))
    mlm = model.mlm_logits(seq, tf.constant(positions))
    nsp = model.nsp(pooled)
    return [t.numpy() for t in (seq, pooled, mlm, nsp)]


def load(path):
    ckpt = cf.read(str(path))
    model = modeling.BertPretrainer(ckpt.config)
    cf.assign(model, ckpt)
    return ckpt, model


def max_diffs(a, b):
    return [float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max()) for x, y in zip(a, b)]


@pytest.fixture(scope="module")
def weights():
    return ref.random_google_weights()


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory, weights):
    d = tmp_path_factory.mktemp("google")
    ref.write_google_checkpoint(str(d), weights)
    ref.write_vocab(str(d / "vocab.txt"))
    return d


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, weights):
    d = tmp_path_factory.mktemp("hf")
    ref.write_huggingface_dir(str(d), weights)
    ref.write_vocab(str(d / "vocab.txt"))
    return d


def test_google_checkpoint_reads_as_google_and_matches_the_numpy_bert(google_dir, weights):
    ckpt, model = load(google_dir)                   # a directory without a 'checkpoint' file: bert_model.ckpt
    assert ckpt.format == cf.GOOGLE and ckpt.config == modeling.BertConfig(**ref.CONFIG)
    x = ref.inputs()
    expected = ref.forward(weights, ref.CONFIG, "tanh_gelu", *x)
    diffs = max_diffs(our_outputs(model, *x), expected)
    print("google import vs numpy BERT, max abs diff (sequence, pooled, MLM, NSP):", diffs)
    assert max(diffs) < 5e-5, diffs
    # The comparison sees a swapped LayerNorm: the same check on a model with two norms exchanged fails.
    swapped = dict(weights)
    a, b = "bert/encoder/layer_1/attention/output/LayerNorm/gamma", "bert/encoder/layer_1/output/LayerNorm/gamma"
    swapped[a], swapped[b] = weights[b], weights[a]
    assert max(max_diffs(our_outputs(model, *x), ref.forward(swapped, ref.CONFIG, "tanh_gelu", *x))) > 1e-2


@pytest.mark.parametrize("hidden_act,ours,reference_act", [("gelu_new", "gelu", "tanh_gelu"),
                                                           ("gelu_pytorch_tanh", "gelu", "tanh_gelu"),
                                                           ("gelu", "gelu_exact", "erf_gelu")])
def test_huggingface_dir_matches_the_numpy_bert(tmp_path, weights, hidden_act, ours, reference_act):
    ref.write_huggingface_dir(str(tmp_path), weights, hidden_act=hidden_act)
    ckpt, model = load(tmp_path)
    assert ckpt.format == cf.HUGGINGFACE and ckpt.config.hidden_act == ours
    x = ref.inputs()
    diffs = max_diffs(our_outputs(model, *x), ref.forward(weights, ref.CONFIG, reference_act, *x))
    print(f"Hugging Face import ({hidden_act}) vs numpy BERT, max abs diff:", diffs)
    assert max(diffs) < 5e-5, diffs
    # the other gelu would be visible (measured 4.9e-3, 100 times the tolerance above)
    other = "erf_gelu" if reference_act == "tanh_gelu" else "tanh_gelu"
    assert max(max_diffs(our_outputs(model, *x), ref.forward(weights, ref.CONFIG, other, *x))) > 1e-3


@pytest.fixture(scope="module")
def exported(google_dir, tmp_path_factory):
    """run/export.py on the google fixture: all three formats into one folder."""
    out = tmp_path_factory.mktemp("export")
    proc = subprocess.run([sys.executable, str(REPO / "run" / "export.py"), f"--checkpoint={google_dir}",
                           f"--vocab_file={google_dir / 'vocab.txt'}", f"--output_dir={out}"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_export_writes_google_names_exactly(exported, weights):
    assert sorted(os.listdir(exported)) == [
        "README.md", "bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index", "config.json",
        "model.safetensors", "saved_model", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    names = dict(tf.train.list_variables(str(exported / "bert_model.ckpt")))
    assert names == {k: list(v.shape) for k, v in weights.items()}        # encoder and heads, nothing else
    for name, value in weights.items():                                    # and the values, bit for bit
        np.testing.assert_array_equal(tf.train.load_variable(str(exported / "bert_model.ckpt"), name), value,
                                      err_msg=name)
    assert json.load(open(exported / "bert_config.json")) == ref.CONFIG


@pytest.mark.parametrize("fmt", ["google", "huggingface"])
def test_round_trip_export_then_read_gives_identical_outputs(google_dir, exported, fmt):
    _, original = load(google_dir)
    tmp = exported / "only_hf"
    if fmt == "huggingface":       # the folder holds both formats; read the Hugging Face files alone
        tmp.mkdir(exist_ok=True)
        for f in ("config.json", "model.safetensors"):
            if not (tmp / f).exists():
                os.symlink(exported / f, tmp / f)
    ckpt, model = load(tmp if fmt == "huggingface" else exported / "bert_model.ckpt")
    assert ckpt.format == fmt
    # float32 written and read back (HF kernels transposed twice): every weight bit for bit, so the outputs too
    pairs = list(zip(original.trainable_variables, model.trainable_variables, strict=True))  # same class: same order
    assert len(pairs) > 50
    for theirs, ours in pairs:
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=theirs.name)
    x = ref.inputs()
    diffs = max_diffs(our_outputs(model, *x), our_outputs(original, *x))
    print(f"round trip via {fmt}: max abs diff (sequence, pooled, MLM, NSP) = {diffs}")
    assert max(diffs) == 0, diffs


def test_export_is_what_transformers_reads(exported, google_dir):
    """transformers' own BERT (its TF port: PyTorch is not installable here) loads model.safetensors by its
    PyTorch names with no missing or unexpected key, and computes our outputs; its config and tokenizer load."""
    import transformers  # the oracle (requirements-dev.txt): missing, the test fails, not skips
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model
    config = transformers.BertConfig.from_pretrained(str(exported))
    assert config.model_type == "bert" and config.hidden_act == "gelu_new" and config.num_hidden_layers == 3
    assert config.architectures == ["BertForPreTraining"]
    tokenizer = transformers.BertTokenizer.from_pretrained(str(exported))
    assert tokenizer.do_lower_case and len(tokenizer) == 211
    hf = transformers.TFBertForPreTraining(config)
    hf.build_in_name_scope()
    hf, info = load_pytorch_state_dict_in_tf2_model(hf, load_file(str(exported / "model.safetensors")),
                                                    tf_inputs=False, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, info
    # PyTorch's BertForPreTraining (not importable without torch: read from its source) ties the decoder
    # weight and bias to the word embeddings and cls.predictions.bias: save_pretrained leaves them out, as we do.
    import ast
    import inspect
    import re
    source = open(inspect.getfile(transformers.models.bert.tokenization_bert).replace(
        "tokenization_bert.py", "modeling_bert.py")).read()
    tied = re.search(r"class BertForPreTraining\(.*?_tied_weights_keys = (\[.*?\])", source, re.S).group(1)
    stored = set(load_file(str(exported / "model.safetensors")))
    for key in ast.literal_eval(tied):
        assert ("cls." + key if not key.startswith("cls.") else key) not in stored
    assert {"cls.predictions.bias", "bert.embeddings.word_embeddings.weight"} <= stored
    _, ours = load(google_dir)
    ids, mask, segments, _ = ref.inputs()
    out = hf(input_ids=ids, attention_mask=mask, token_type_ids=segments, training=False)
    seq, pooled = ours.encoder(tf.constant(ids), tf.constant(mask), tf.constant(segments))
    positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
    mlm = ours.mlm_logits(seq, tf.constant(positions))
    real = mask.astype(bool)   # transformers masks padding with -inf-like values, we with -10000: compare real tokens
    diffs = [float(np.abs(out.prediction_logits.numpy() - mlm.numpy())[real].max()),
             float(np.abs(out.seq_relationship_logits.numpy() - ours.nsp(pooled).numpy()).max())]
    print("transformers TFBertForPreTraining vs ours, max abs diff (MLM, NSP):", diffs)
    assert max(diffs) < 5e-5, diffs


def test_fill_mask_pipeline_on_the_export_predicts_our_top_tokens(exported, google_dir):
    """transformers' fill-mask pipeline, its TF BertForMaskedLM read from model.safetensors and the fast
    tokenizer from tokenizer.json: the ids we would give, "[MASK]" as one token, and our top tokens in order."""
    import transformers
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert tokenizer.is_fast and len(tokenizer) == ref.CONFIG["vocab_size"]
    ours_tok = tokenization.Tokenizer.from_file(str(exported / "vocab.txt"))
    text = "W5 w17, [MASK] w42 w8"
    ids = tokenizer(text)["input_ids"]
    assert ids == [ours_tok.cls_id, *ours_tok.ids("W5 w17,"), ours_tok.mask_id, *ours_tok.ids("w42 w8"),
                   ours_tok.sep_id]
    # tokenizer.json alone (text-embeddings-inference, transformers.js read only it): the same ids
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(exported / "tokenizer.json")).encode(text).ids == ids
    pair = tokenizer("w1 w2", "w3")
    assert pair["token_type_ids"] == [0, 0, 0, 0, 1, 1] and pair["input_ids"][-1] == ours_tok.sep_id
    # TFBertForMaskedLM.from_pretrained(export) fails inside transformers 4.57 with safetensors 0.8
    # ("'builtins.safe_open' object is not iterable"), so the same loader gets the tensors as numpy.
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model
    model = transformers.TFBertForMaskedLM(transformers.BertConfig.from_pretrained(str(exported)))
    model.build_in_name_scope()
    model, info = load_pytorch_state_dict_in_tf2_model(model, load_file(str(exported / "model.safetensors")),
                                                       tf_inputs=False, output_loading_info=True)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == [], info
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, framework="tf",
                                 dtype=None)  # its default "auto" looks torch up
    theirs = [p["token"] for p in fill(text, top_k=5)]
    _, ours = load(google_dir)
    x = tf.constant([ids], tf.int32)
    seq, _ = ours.encoder(x, tf.ones_like(x), tf.zeros_like(x))
    logits = ours.mlm_logits(seq, tf.constant([[ids.index(ours_tok.mask_id)]], tf.int32)).numpy().ravel()
    assert theirs == list(np.argsort(-logits)[:5]), (theirs, np.argsort(-logits)[:5])


def test_a_missing_head_is_initialised_and_said_in_one_line(tmp_path, weights):
    encoder_only = {k: v for k, v in weights.items() if k.startswith("bert/")}
    ref.write_huggingface_dir(str(tmp_path), encoder_only)
    ckpt = cf.read(str(tmp_path))
    model = modeling.BertPretrainer(ckpt.config)
    lines = []
    fresh = cf.assign(model, ckpt, log=lines.append)
    assert fresh == ["MLM head", "NSP head"] and len(lines) == 1
    assert "MLM head and NSP head not in" in lines[0] and "model.safetensors" in lines[0]
    # a bare BertModel's names (no "bert." prefix) read too
    from safetensors.numpy import load_file, save_file
    bare = {k[len("bert."):]: v for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    save_file(bare, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert set(cf.read(str(tmp_path)).weights) == set(ckpt.weights)


# ------------------------------------------------------------------------------- bad input
def test_config_json_without_weights_names_the_missing_file(tmp_path, hf_dir):
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(ConfigError, match=f"{tmp_path}/model.safetensors not found.*needs model.safetensors"):
        cf.read(str(tmp_path))


def test_truncated_safetensors_is_named(tmp_path, hf_dir):
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    data = (hf_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=f"{tmp_path}/model.safetensors is not a readable safetensors file "
                                         r"\(a truncated download\?\)"):
        cf.read(str(tmp_path))


def test_half_precision_safetensors_read_as_float32(tmp_path, weights):
    """Many published directories hold float16 or bfloat16 weights (safetensors reads bfloat16 via ml_dtypes)."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file
    ref.write_huggingface_dir(str(tmp_path), weights)
    full = load_file(str(tmp_path / "model.safetensors"))
    for dtype in (np.float16, ml_dtypes.bfloat16):
        save_file({k: v.astype(dtype) for k, v in full.items()}, str(tmp_path / "model.safetensors"),
                  metadata={"format": "pt"})
        ckpt, model = load(tmp_path)
        word = model.encoder.embeddings.word_embeddings.numpy()
        assert word.dtype == np.float32
        expected = full["bert.embeddings.word_embeddings.weight"].astype(dtype).astype(np.float32)
        np.testing.assert_array_equal(word, expected)


def test_bert_config_that_disagrees_with_the_tensors_is_named(tmp_path, weights):
    ref.write_google_checkpoint(str(tmp_path), weights, config=dict(ref.CONFIG, num_hidden_layers=2))
    with pytest.raises(ValueError, match=f"{tmp_path}/bert_config.json disagrees with the tensors in "
                                         f".*bert_model.ckpt: num_hidden_layers is 2 but the checkpoint holds 3"):
        cf.read(str(tmp_path))
    ref.write_google_checkpoint(str(tmp_path), weights, config=dict(ref.CONFIG, intermediate_size=192))
    with pytest.raises(ValueError, match=r"bert_config.json disagrees .*intermediate/kernel should be \[96, 192\]"):
        cf.read(str(tmp_path))


@pytest.mark.parametrize("model_type", ["roberta", "albert"])
def test_non_bert_config_is_refused(tmp_path, hf_dir, model_type):
    values = json.loads((hf_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(values, model_type=model_type)))
    os.symlink(hf_dir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"{tmp_path}/config.json: model_type is '{model_type}', expected 'bert'"):
        cf.read(str(tmp_path))


def test_unsupported_activation_and_unknown_format_are_named(tmp_path, hf_dir):
    values = json.loads((hf_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(values, hidden_act="silu")))
    os.symlink(hf_dir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="config.json: hidden_act 'silu' is not supported"):
        cf.read(str(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    (other / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=f"{other}: unknown checkpoint format"):
        cf.read(str(other))


@pytest.mark.parametrize("change,vocab,seq,message", [
    ({}, 300, 16, r"its vocabulary has 211 tokens but the vocab file v.txt has 300"),
    (dict(hidden_size=128, num_attention_heads=2), 211, 16, "hidden size 96 but the model's hidden_size is 128"),
    (dict(num_hidden_layers=4), 211, 16, "3 layers but the model has num_hidden_layers=4"),
    ({}, 211, 64, "the position table has 40 rows, fewer than --max_seq_length=64"),
])
def test_checkpoint_that_does_not_fit_the_run_is_named(google_dir, change, vocab, seq, message):
    ckpt = cf.read(str(google_dir))
    with pytest.raises(ValueError, match=f"{google_dir}/bert_model.ckpt: {message}"):
        cf.check_fits(ckpt, modeling.BertConfig(**dict(ref.CONFIG, **change)), vocab, "v.txt", seq)


def test_pretrain_refuses_a_vocab_of_another_size_before_writing_anything(tmp_path, hf_dir, tiny_data):
    from bert_tf.train import pretraining
    cfg = pretrain_config.PretrainConfig(vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                                     max_seq_length=64, max_predictions_per_seq=10, total_steps=1,
                                     checkpoint_dir=str(tmp_path / "run"), init_checkpoint=str(hf_dir))
    with pytest.raises(ValueError, match=f"{hf_dir}/model.safetensors: its vocabulary has 211 tokens but the "
                                         f"vocab file {tiny_data['vocab_file']} has"):
        pretraining.run(cfg)
    assert not (tmp_path / "run").exists()


def test_continue_base_flagfile_names_only_real_flags():
    import dataclasses

    lines = [l for l in (REPO / "configs" / "continue_base.flags").read_text().splitlines() if l.startswith("--")]
    values = dict(l[2:].partition("=")[::2] for l in lines)
    assert set(values) <= {f.name for f in dataclasses.fields(pretrain_config.PretrainConfig)}
    assert values["init_checkpoint"].endswith("uncased_L-12_H-768_A-12/bert_model.ckpt")
    assert "model_preset" not in values and "bert_config_file" not in values   # the size comes from the checkpoint


@pytest.mark.slow
def test_export_refuses_before_writing(tmp_path, hf_dir, weights):
    """A vocab of another size, and an exact-gelu model asked for in google's format (google's 'gelu' is the
    tanh form): each fails naming the problem, and the output folder is not created."""
    exact = ref.write_huggingface_dir(str(tmp_path / "exact_gelu"), weights, hidden_act="gelu")
    other_vocab = ref.write_vocab(str(tmp_path / "vocab300.txt"), 300)
    for checkpoint, vocab, fmt, message in [
            (hf_dir, other_vocab, "huggingface", "its vocabulary has 211 tokens but the vocab file"),
            (exact, str(hf_dir / "vocab.txt"), "google,huggingface",
             "hidden_act 'gelu_exact' has no google-research/bert name")]:
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, str(REPO / "run" / "export.py"), f"--checkpoint={checkpoint}",
                               f"--vocab_file={vocab}", f"--output_dir={out}", f"--format={fmt}"],
                              env=mpi_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
        assert not out.exists()
