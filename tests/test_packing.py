"""Sequence packing: rows of several instances (create_pretraining_data.py --pack) train exactly
like the instances alone, and the records made from the bundled corpus carry less padding."""
import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.data import input_pipeline, instances as ins, pretraining_data as pd, records as rec, tokenization
from bert_tf.model import modeling
from bert_tf.train import pretrain_config

SPECIAL = {"CLS": 1, "SEP": 2, "MASK": 3}


def random_instances(n, max_len, preds, vocab=300, seed=0):
    """Sentence-pair instances of random lengths 5..max_len with ~15% of their tokens masked."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        length = r.randint(5, max_len)
        a = r.randint(1, length - 4)
        tokens = [SPECIAL["CLS"]] + [r.randrange(10, vocab) for _ in range(a)] + [SPECIAL["SEP"]] + \
            [r.randrange(10, vocab) for _ in range(length - a - 3)] + [SPECIAL["SEP"]]
        segments = [0] * (a + 2) + [1] * (length - a - 2)
        maskable = [i for i, t in enumerate(tokens) if t not in (SPECIAL["CLS"], SPECIAL["SEP"])]
        positions = sorted(r.sample(maskable, min(preds, max(1, round(0.15 * len(maskable))))))
        out.append(ins.Instance(tokens, segments, r.random() < 0.5, positions, [r.randrange(10, vocab) for _ in positions]))
    return out


def parsed(records, config, pack):
    spec = input_pipeline.record_spec(config.max_seq_length, config.max_predictions_per_seq, pack=pack)
    return input_pipeline.parse_features(tf.constant(records), spec)


def test_pack_instances_keeps_every_instance_once_within_every_limit_and_fills_rows():
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=8, pack=3)
    instances = random_instances(300, 64, 8)
    rows = ins.pack_instances(instances, config, random.Random(0))
    assert sorted(id(i) for row in rows for i in row) == sorted(id(i) for i in instances)
    for row in rows:
        assert 1 <= len(row) <= 3
        assert sum(len(i.tokens) for i in row) <= 64 and sum(len(i.positions) for i in row) <= 8
    tokens = sum(len(i.tokens) for i in instances)
    lower_bound = -(-tokens // 64)               # rows needed if every row were full
    assert len(rows) <= 1.1 * lower_bound < 0.75 * len(instances)
    again = ins.pack_instances(instances, config, random.Random(0))
    assert [[id(i) for i in row] for row in again] == [[id(i) for i in row] for row in rows]   # deterministic


def test_a_packed_batch_has_the_losses_and_gradients_of_its_instances_unpacked():
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=8, pack=3)
    instances = random_instances(12, 40, 8, seed=1)
    rows = ins.pack_instances(instances, config, random.Random(1))
    assert len(rows) < len(instances) and any(len(r) > 1 for r in rows)
    packed = parsed([rec.serialize_packed(r, config) for r in rows], config, pack=3)
    plain = parsed([rec.serialize(i, config) for i in instances], config, pack=0)
    assert int(tf.reduce_sum(packed["input_mask"])) == int(tf.reduce_sum(plain["input_mask"]))

    tf.random.set_seed(0)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=300))

    def run(features):
        with tf.GradientTape() as tape:
            out = model(features, training=False)
        return out, tape.gradient(out.loss, model.trainable_variables)

    (out_packed, g_packed), (out_plain, g_plain) = run(packed), run(plain)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_weight", "nsp_correct", "nsp_count"):
        np.testing.assert_allclose(getattr(out_packed, key).numpy(), getattr(out_plain, key).numpy(), rtol=2e-5,
                                   atol=1e-6, err_msg=key)
    assert float(out_packed.nsp_count) == len(instances)
    g_packed = [tf.convert_to_tensor(g).numpy() for g in g_packed]
    g_plain = [tf.convert_to_tensor(g).numpy() for g in g_plain]
    # relative to the largest gradient: the key biases' gradients are zero in exact arithmetic (softmax
    # does not see a per-query constant), so both sides are rounding noise there
    largest = max(np.abs(g).max() for g in g_plain)
    key_biases = {id(layer.attention.key.bias) for layer in model.encoder.layers}
    for i, (v, a, b) in enumerate(zip(model.trainable_variables, g_packed, g_plain)):
        np.testing.assert_allclose(a / largest, b / largest, atol=2e-6, err_msg=f"{i} {v.name}")
        if id(v) not in key_biases:
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * np.abs(b).max(), err_msg=f"{i} {v.name}")

    # without the block-diagonal mask the instances would see each other: the check above can fail
    out_leaky = model.encoder(packed["input_ids"], packed["input_mask"], packed["segment_ids"],
                              position_ids=packed["position_ids"])[0]
    out_tight = model.encoder(packed["input_ids"], packed["input_mask"], packed["segment_ids"],
                              position_ids=packed["position_ids"], instance_ids=packed["instance_ids"])[0]
    assert float(tf.reduce_max(tf.abs(out_leaky - out_tight))) > 1e-2


def test_packing_options_and_layouts_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="--pack must be 0"):
        ins.InstanceConfig(pack=1)
    with pytest.raises(ConfigError, match="--pack with --full_sentences"):
        ins.InstanceConfig(pack=3, full_sentences=True)
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=8, pack=3)
    instances = random_instances(20, 40, 8)
    files = {}
    for name, records in (("packed", [rec.serialize_packed(r, config) for r in ins.pack_instances(instances, config)]),
                          ("plain", [rec.serialize(i, config) for i in instances])):
        files[name] = str(tmp_path / f"{name}.tfrecord")
        with tf.io.TFRecordWriter(files[name]) as w:
            for record in records:
                w.write(record)
    assert input_pipeline.check_files([files["packed"]], 64, 8) == 3
    assert input_pipeline.check_files([files["plain"]], 64, 8) == 0
    with pytest.raises(ConfigError, match=r"plain.tfrecord: records are one instance per row, unlike the run's "
                                          r"other files \(packed \(3 instances per row\)\)"):
        input_pipeline.check_files([files["packed"], files["plain"]], 64, 8)
    batch = next(iter(input_pipeline.make_dataset([files["packed"]], 4, 64, 8, training=False, pack=3)))
    assert batch["next_sentence_labels"].shape == (4, 3) and batch["instance_ids"].shape == (4, 64)


@pytest.fixture(scope="module")
def bundled_records(tmp_path_factory, corpus_dir):
    """The bundled news corpus as records at sequence 128 and 512, one instance per row and packed."""
    from bert_tf.data import corpus
    root = tmp_path_factory.mktemp("packing")
    inputs = [str(corpus_dir / "lee_background.cor") + "@documents"]
    docs = list(corpus.read_documents(inputs))
    tokenizer = tokenization.Tokenizer(tokenization.learn_vocab([s for d in docs for s in d], vocab_size=2000))
    out = {}
    for seq, preds in ((128, 20), (512, 80)):
        for pack in (0, 3):
            config = ins.InstanceConfig(max_seq_length=seq, max_predictions_per_seq=preds, dupe_factor=2, pack=pack)
            folder = str(root / f"seq{seq}-pack{pack}")
            out[seq, pack] = pd.summarize([pd.create_pretraining_data(inputs, "auto", tokenizer, folder, config)],
                                          seq)["train"]
            out[seq, pack]["folder"] = folder
    return out


@pytest.mark.parametrize("seq", [128, 512])
def test_packing_the_bundled_corpus_keeps_its_instances_and_cuts_its_padding(bundled_records, seq):
    plain, packed = bundled_records[seq, 0], bundled_records[seq, 3]
    assert packed["instances"] == plain["instances"] and packed["tokens"] == plain["tokens"]
    assert plain["rows"] == plain["instances"] and packed["rows"] < plain["rows"]
    assert packed["padding_fraction"] < plain["padding_fraction"]
    files = input_pipeline.list_files(os.path.join(packed["folder"], "train-*"))
    assert input_pipeline.check_files(files, seq, 20 if seq == 128 else 80) == 3
    rows = sum(1 for _ in tf.data.TFRecordDataset(files))
    assert rows == packed["rows"]
    with open(os.path.join(packed["folder"], "part-r000-0000-of-0001.json")) as f:
        assert json.load(f)["train"]["rows"] == rows


@pytest.mark.slow
def test_pretraining_reads_packed_records_and_counts_instances_and_useful_tokens(tiny_data, corpus_dir, tmp_path):
    """tiny_data's corpus made again with --pack=3 (seq 64): a short run trains and evaluates on it and
    logs instances/s above rows/s."""
    from bert_tf.train import pretraining
    inputs = [str(corpus_dir / "lee_background.cor") + "@documents"]
    tokenizer = tokenization.Tokenizer.from_file(tiny_data["vocab_file"])
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, random_seed=3, pack=3)
    pd.create_pretraining_data(inputs, "auto", tokenizer, str(tmp_path / "data"), config, heldout_fraction=0.1)
    cfg = pretrain_config.PretrainConfig(
        model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=str(tmp_path / "data" / "train-*"),
        eval_files=str(tmp_path / "data" / "eval-*"), max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4,
        total_steps=4, log_interval=2, eval_batches=2, learning_rate=1e-3, checkpoint_dir=str(tmp_path / "run"))
    trainer, last = pretraining.run(cfg, log=lambda *a, **k: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and all(np.isfinite(r["loss"]) for r in train)
    for r in train:      # instances counted from the rows (on this corpus ~1% of rows hold two), useful tokens too
        assert r["instances_per_second"] >= r["sequences_per_second"]
        assert 0 < r["useful_tokens_per_second"] <= r["tokens_per_second"]
    assert 0 < last["eval_nsp_accuracy"] <= 1 and 0 <= last["eval_mlm_accuracy"] <= 1
