"""Fine-tuned models export to what the BERT world loads: transformers' BertForSequenceClassification (with
id2label / label2id, or regression) and BertForQuestionAnswering with no missing or unexpected key and our
outputs, and google-research/bert's names, which bert_tf reads back."""
import numpy as np
import pytest
import tensorflow as tf
import transformers  # the oracle (requirements-dev.txt)
from safetensors.numpy import load_file
from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

from bert_tf.artifacts import checkpoint_formats
from bert_tf.model import modeling
from bert_tf.tasks import classification, finetuning, squad
from conftest import random_features


def _vocab(tmp_path, size=100):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(size - 5)]) + "\n")
    return str(path)


@pytest.mark.parametrize("kind", ["classifier", "regression", "span"])
def test_a_fine_tuned_model_loads_in_transformers_and_back_in_bert_tf(kind, tmp_path):
    vocab = _vocab(tmp_path)
    config = modeling.BertConfig.preset("tiny", vocab_size=100, hidden_act="gelu", num_hidden_layers=2)
    tf.random.set_seed(4)
    labels = ["contradiction", "entailment", "neutral"]
    if kind == "span":
        model, hf_class = squad.BertSpanExtractor(config), transformers.TFBertForQuestionAnswering
    else:
        regression = kind == "regression"
        model = classification.BertClassifier(config, 1 if regression else 3, regression=regression)
        hf_class = transformers.TFBertForSequenceClassification
    for v in model.trainable_variables:        # not the initial values: a head left at random would show
        v.assign(v + tf.random.normal(v.shape, stddev=0.02))
    out = tmp_path / "export"
    written = finetuning.export(model, vocab, str(out), labels=None if kind != "classifier" else labels)
    assert {"bert_model.ckpt.index", "config.json", "model.safetensors", "vocab.txt"} <= set(written)
    hf_config = transformers.BertConfig.from_pretrained(str(out))
    if kind == "classifier":
        assert hf_config.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"} and hf_config.num_labels == 3
    if kind == "regression":
        assert hf_config.num_labels == 1 and hf_config.problem_type == "regression"
    hf = hf_class(hf_config)
    hf.build_in_name_scope()
    hf, info = load_pytorch_state_dict_in_tf2_model(hf, load_file(str(out / "model.safetensors")), tf_inputs=False,
                                                    output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, info
    f = {k: tf.constant(v) for k, v in random_features(batch=3, seq=12, vocab=100).items()}
    got = hf(input_ids=f["input_ids"], attention_mask=f["input_mask"], token_type_ids=f["segment_ids"], training=False)
    if kind == "span":
        start, end = model.logits(f)
        np.testing.assert_allclose(got.start_logits.numpy(), start.numpy(), atol=1e-4)
        np.testing.assert_allclose(got.end_logits.numpy(), end.numpy(), atol=1e-4)
    else:
        np.testing.assert_allclose(got.logits.numpy(), model.logits(f).numpy(), atol=1e-4)
    # google's names, read back by bert_tf into a fresh model of the same kind: the same outputs
    # run_classifier.py's output_weights and run_squad.py's cls/squad/output_weights are [labels, H]
    name = "cls/squad/output_weights" if kind == "span" else "output_weights"
    outputs = 2 if kind == "span" else 3 if kind == "classifier" else 1
    assert tf.train.load_variable(str(out / "bert_model.ckpt"), name).shape == (outputs, config.hidden_size)
    google = checkpoint_formats.read(str(out / "bert_model.ckpt"))
    assert ("span/kernel" if kind == "span" else "classifier/kernel") in google.weights
    fresh = squad.BertSpanExtractor(config) if kind == "span" else classification.BertClassifier(
        config, model.classifier.kernel.shape[-1], regression=kind == "regression")
    names = {name: v for name, v in checkpoint_formats.checkpointing.module_variables(fresh).items()}
    for name, v in names.items():
        v.assign(google.weights[name])
    for a, b in zip(tf.nest.flatten(fresh.predict(f)), tf.nest.flatten(model.predict(f))):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
