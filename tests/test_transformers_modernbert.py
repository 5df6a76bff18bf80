"""ModernBERT checkpoints as transformers writes them: a random-init ModernBertForMaskedLM made from transformers'
own ModernBertConfig and saved by save_pretrained, in v4's layout (4.57.6: *_rope_theta,
global_attn_every_n_layers) and v5's (5.25.0: rope_parameters, layer_types), with the logits transformers'
PyTorch model gave on a padded batch. Made by `bash tests/transformers_modernbert.sh --write-fixtures` (which also
loads bert_tf's export in both versions); PyTorch stays out of the project and of this test."""
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.artifacts import checkpoint_formats as cf
from bert_tf.model import modeling
from bert_tf.train import pretrain_config, pretraining
from conftest import REPO

FIXTURES = REPO / "tests" / "data" / "transformers_modernbert"
VERSIONS = ["v4", "v5"]


def test_both_layouts_are_what_transformers_wrote_and_give_the_same_model():
    v4, v5 = (json.load(open(FIXTURES / v / "config.json")) for v in VERSIONS)
    assert v4["transformers_version"].startswith("4.") and v5["transformers_version"].startswith("5.")
    assert {"global_rope_theta", "local_rope_theta", "global_attn_every_n_layers"} <= set(v4)
    assert {"rope_parameters", "layer_types"} <= set(v5) and "global_rope_theta" not in v5
    configs = [cf.read(str(FIXTURES / v)).config for v in VERSIONS]
    assert configs[0] == configs[1]
    c = configs[0]
    assert (c.architecture, c.global_attn_every_n_layers, c.local_attention) == ("modern", 2, 8)
    assert (c.global_rope_theta, c.local_rope_theta) == (50000.0, 2500.0)   # not the defaults


@pytest.mark.parametrize("version", VERSIONS)
def test_a_transformers_saved_model_gives_transformers_logits(version):
    ckpt = cf.read(str(FIXTURES / version))
    assert ckpt.format == cf.HUGGINGFACE
    model = modeling.BertPretrainer(ckpt.config, use_nsp=False)
    assert cf.assign(model, ckpt, log=lambda *_: None) == ["pooler"]   # a masked-LM model has no classifier head
    saved = np.load(FIXTURES / version / "logits.npz")
    ids, mask = saved["ids"], saved["mask"]
    seq, _ = model.encoder(tf.constant(ids), tf.constant(mask), tf.zeros_like(ids))
    logits = model.mlm_logits(seq, tf.broadcast_to(tf.range(ids.shape[1])[None], ids.shape)).numpy()
    real = mask.astype(bool)
    diff = float(np.abs(logits.astype(np.float64) - saved["logits"])[real].max())
    print(f"transformers {saved['transformers']} (torch {saved['torch']}) saved model, read here: masked-LM logits "
          f"max abs diff {diff:.2e} (logits sd {saved['logits'][real].std():.2f})")
    assert diff <= 1e-4


@pytest.mark.slow
def test_pre_training_continues_from_a_transformers_saved_model(tiny_data, tmp_path):
    """--init_checkpoint on v5's directory: the run starts from its weights (no part at random) and learns."""
    settings = dict(vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                    eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10, mlm_only=True,
                    micro_batch_size=8, learning_rate=3e-3, warmup_steps=2, log_interval=5, eval_interval=30,
                    eval_batches=4, total_steps=30, init_checkpoint=str(FIXTURES / "v5"),
                    checkpoint_dir=str(tmp_path))
    said = []
    pretraining.run(pretrain_config.PretrainConfig(**settings), log=lambda *a, **k: said.append(" ".join(map(str, a))))
    log = "\n".join(said)
    assert f"initialised encoder and heads from {FIXTURES / 'v5'} (huggingface format)" in log, log
    assert "model: modern, 4 layers, hidden 32" in log
    # the pooler (a classifier's, which a masked-LM model does not have) is the only part at random
    assert [line for line in said if "at random" in line] == [
        f"pooler not in {FIXTURES / 'v5' / 'model.safetensors'}: initialised at random"], log
    evals = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 30]
    start, end = evals[0]["eval_mlm_loss"], evals[-1]["eval_mlm_loss"]
    print(f"held-out MLM loss from the transformers-saved model: {start:.3f} at step 0, {end:.3f} at step 30 "
          f"(uniform over the vocabulary: {math.log(2000):.3f})")
    assert end < start - 0.2   # 0.35 measured
