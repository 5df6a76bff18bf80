"""Fine-tuning, export and the transfer probe."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.artifacts import checkpointing
from bert_tf.data import tokenization
from bert_tf.model import modeling
from bert_tf.tasks import classification, finetuning
from bert_tf.train import training
from conftest import REPO, WORKERS, mpi_env, mpirun, read_rank_results

VOCAB = tokenization.google_reserved_tokens() + ["good", "bad", "great", "awful", "movie", "plot", "the", "was"]


def toy_examples(n=48, seed=0):
    rng = np.random.RandomState(seed)
    labels, texts = [], []
    for i in range(n):
        positive = i % 2 == 0
        word = ["good", "great"][rng.randint(2)] if positive else ["bad", "awful"][rng.randint(2)]
        texts.append(" ".join(rng.permutation(["the", "movie", "was", word])))
        labels.append("pos" if positive else "neg")
    return classification.Examples(labels, texts, [None] * n)


def heldout_examples(train):
    """Toy sentences that are not in `train` (other word orders), each once."""
    seen, labels, texts = set(train.texts_a), [], []
    other = toy_examples(200, seed=1)
    for label, text in zip(other.labels, other.texts_a):
        if text not in seen:
            seen.add(text)
            labels.append(label)
            texts.append(text)
    return classification.Examples(labels, texts, [None] * len(texts))


@pytest.mark.slow
def test_classifier_head_reaches_100_percent_on_a_separable_set():
    """Trained on 48 sentences, it classifies every one of 51 word orders it never saw: a model that did not
    learn the task scores about 0.5 (sigma 0.07 on 51 sentences), one that memorised its training set no better."""
    tok = tokenization.Tokenizer(VOCAB)
    train = toy_examples()
    heldout = heldout_examples(train)
    x, y, _ = classification.encode(train, tok, 8, ["neg", "pos"])
    ex, ey, _ = classification.encode(heldout, tok, 8, ["neg", "pos"])
    assert len(ey) > 40 and 0.4 < ey.mean() < 0.6
    config = modeling.BertConfig.preset("tiny", vocab_size=len(VOCAB))
    metrics, _ = classification.train_and_evaluate(config, ["neg", "pos"], (x, y), (ex, ey), epochs=15,
                                                   per_rank_batch=8, learning_rate=2e-3)
    assert metrics["eval_examples"] == len(ey)
    assert metrics["accuracy"] == 1.0 and metrics["f1"] == 1.0
    assert metrics["final_train_loss"] < 0.05                 # from ln 2 = 0.69 at the start (measured 4e-4)


def test_reading_skips_and_counts_bad_rows_and_names_problems(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("pos\tgood movie\n\n\tno label\nneg\n__label__neg awful plot\npos\tgreat\tsecond part\n")
    examples = classification.read_examples(str(path))
    assert examples.labels == ["pos", "neg", "pos"] and examples.skipped == 3
    assert examples.texts_b == [None, None, "second part"]
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n\t\n")
    with pytest.raises(ValueError, match="empty.tsv: no labelled examples \\(2 lines skipped"):
        classification.read_examples(str(empty))
    tok = tokenization.Tokenizer(VOCAB)
    with pytest.raises(ValueError, match=r"labels \['neutral'\] are not among the training labels"):
        classification.encode(classification.Examples(["neutral"], ["the movie"], [None]), tok, 8, ["neg", "pos"])
    long = classification.Examples(["pos"], [" ".join(["good"] * 20)], ["bad bad"])
    x, _, truncated = classification.encode(long, tok, 8, ["neg", "pos"])
    assert truncated == 1 and x["input_mask"].sum() == 8 and x["segment_ids"][0, -2] == 1


def test_kfold_splits_are_disjoint_and_cover_the_data():
    splits = classification.kfold_splits(200, 5, seed=3)
    tests = [set(te.tolist()) for _, te in splits]
    assert set().union(*tests) == set(range(200)) and sum(map(len, tests)) == 200
    for tr, te in splits:
        assert not set(tr.tolist()) & set(te.tolist()) and len(tr) + len(te) == 200
    assert [t.tolist() for _, t in splits] == [t.tolist() for _, t in classification.kfold_splits(200, 5, seed=3)]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny pre-training checkpoint folder, as run/pretrain.py leaves it."""
    folder = tmp_path_factory.mktemp("pretrained")
    config = modeling.BertConfig.preset("tiny", vocab_size=len(VOCAB))
    tf.random.set_seed(4)
    trainer = training.Trainer(modeling.BertPretrainer(config), training.TrainConfig())
    ckpts = checkpointing.Checkpoints(str(folder), trainer.checkpoint_items())
    ckpts.save(1)
    ckpts.save(2)
    config.to_json_file(str(folder / "bert_config.json"))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    return folder, trainer.model


@pytest.mark.slow
def test_export_round_trip_reproduces_the_encoder(pretrained, tmp_path):
    folder, model = pretrained
    proc = subprocess.run([sys.executable, str(REPO / "run" / "export.py"), f"--checkpoint={folder}",
                           f"--vocab_file={folder / 'vocab.txt'}", f"--output_dir={tmp_path}"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["README.md", "bert_config.json", "bert_model.ckpt.data-00000-of-00001",
                                            "bert_model.ckpt.index", "config.json", "model.safetensors",
                                            "saved_model", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    ids = tf.constant([[101, 104, 105, 106, 102, 0]], tf.int32)
    mask = tf.constant([[1, 1, 1, 1, 1, 0]], tf.int32)
    seg = tf.zeros_like(ids)
    expected_seq, expected_pooled = model.encoder(ids, mask, seg)
    loaded = tf.saved_model.load(str(tmp_path / "saved_model"))      # keep a reference: it owns the variables
    served = loaded.serve(ids, mask, seg)
    np.testing.assert_allclose(served["sequence_output"], expected_seq, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served["pooled_output"], expected_pooled, rtol=1e-5, atol=1e-6)
    config = modeling.BertConfig.from_json_file(str(tmp_path / "bert_config.json"))
    encoder = modeling.BertEncoder(config)
    classification.load_encoder(encoder, str(tmp_path / "bert_model.ckpt"), len(VOCAB))
    np.testing.assert_allclose(encoder(ids, mask, seg)[1], expected_pooled, rtol=1e-6)
    classification.load_encoder(encoder, str(tmp_path), len(VOCAB))     # the Hugging Face files of the export
    np.testing.assert_allclose(encoder(ids, mask, seg)[1], expected_pooled, rtol=1e-6)
    with pytest.raises(ValueError, match="vocabulary has 112 tokens but the vocab file has 120"):
        classification.load_encoder(modeling.BertEncoder(config), str(tmp_path / "bert_model.ckpt"), 120)


@pytest.mark.slow
def test_probe_over_checkpoints_writes_metrics_and_plots(pretrained, tmp_path):
    folder, _ = pretrained
    data = tmp_path / "toy.tsv"
    ex = toy_examples(48)
    data.write_text("".join(f"{l}\t{t}\n" for l, t in zip(ex.labels, ex.texts_a)))
    (folder / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 2, "loss": 9.0, "mlm_loss": 8.0,
                                                      "mlm_accuracy": 0.1, "sequences_per_second": 5.0}) + "\n")
    proc = subprocess.run([sys.executable, str(REPO / "run" / "finetune.py"), f"--train_file={data}",
                           f"--vocab_file={folder / 'vocab.txt'}", f"--probe_checkpoint_dir={folder}", "--kfold=2",
                           "--epochs=6", "--global_batch_size=4", "--learning_rate=2e-3", "--max_seq_length=8"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probes = [json.loads(l) for l in open(folder / "metrics.jsonl") if '"probe"' in l]
    assert [p["step"] for p in probes] == [1, 2] and all(p["probe_task"] == "toy.tsv" for p in probes)
    # Each fold fine-tunes on 24 sentences and is scored on the other 24 (2 folds: 48 held-out scores).
    # Predicting the training fold's majority label scores `baseline`; guessing scores 0.5 with sigma
    # sqrt(0.25 / 48) = 0.07. The probe must learn the task: 0.9 is 5.5 sigma above guessing (measured 1.0;
    # with the former 2 epochs of 8 sentences it scored 0.31, below the baseline, and passed).
    labels = np.array([int(l == "pos") for l in ex.labels])
    baseline = np.mean([np.mean(labels[te] == np.bincount(labels[tr]).argmax())
                        for tr, te in classification.kfold_splits(len(labels), 2, seed=0)])
    assert baseline <= 0.6
    assert all(p["probe_accuracy"] >= 0.9 for p in probes), probes
    png = tmp_path / "m.png"
    plot = subprocess.run([sys.executable, str(REPO / "run" / "plot_metrics.py"), f"--metrics={folder / 'metrics.jsonl'}",
                           f"--output={png}"], env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr[-1000:]
    assert png.stat().st_size > 10000


@pytest.mark.cluster
def test_finetuning_on_two_ranks_keeps_identical_weights(tmp_path, monkeypatch):
    mpirun(2, [WORKERS / "finetune_checks.py", tmp_path])
    a, b = read_rank_results(tmp_path, 2)
    assert a["digest"] == b["digest"] and a["accuracy"] == b["accuracy"]
    # ... and they are not merely rank 0's broadcast initial weights, unchanged (the worker's 12 updates are too
    # few to learn its task, accuracy 0.5, so its accuracy cannot show that): the worker's own code with a
    # training step that does nothing gives those weights (the worker run so gave this digest), and they differ.
    vocab = tokenization.google_reserved_tokens() + ["good", "bad", "movie", "plot", "very", "a"]
    examples = classification.Examples(["pos", "pos", "neg", "neg"] * 8,
                                       ["a very good movie", "good plot", "a bad movie", "very bad plot"] * 8,
                                       [None] * 32)
    x, y, _ = classification.encode(examples, tokenization.Tokenizer(vocab), 8, ["neg", "pos"])
    monkeypatch.setattr(training.Trainer, "train_step",
                        lambda self, batches: finetuning.FinetuneOutput(loss=tf.constant(0.0)))
    _, untrained = classification.train_and_evaluate(modeling.BertConfig.preset("tiny", vocab_size=len(vocab)),
                                                     ["neg", "pos"], (x, y), (x, y), epochs=3, per_rank_batch=4, seed=0)
    initial = hashlib.sha256(b"".join(v.numpy().tobytes() for v in untrained.trainable_variables)).hexdigest()
    assert a["digest"] != initial


def test_fine_tuning_batches_reshuffle_each_epoch_and_split_the_ranks_disjointly():
    from bert_tf.tasks import finetuning
    n, batch, size = 20, 3, 2                  # 3 updates per epoch on each rank: 18 of 20 rows
    ranks = [list(finetuning.batch_rows(n, batch, total=7, seed=5, rank=r, size=size)) for r in range(size)]
    assert [len(r) for r in ranks] == [7, 7] and all(len(rows) == batch for r in ranks for rows in r)
    epochs = [[np.concatenate(r[e * 3:(e + 1) * 3]) for r in ranks] for e in range(2)]
    for a, b in epochs:
        assert not set(a) & set(b) and len(set(a) | set(b)) == 18      # disjoint, no row twice in an epoch
    assert list(np.concatenate(epochs[0])) != list(np.concatenate(epochs[1]))   # another order each epoch
    assert [list(x) for x in ranks[0]] == [list(x) for x in finetuning.batch_rows(n, batch, 7, 5, 0, size)]


@pytest.mark.slow
def test_finetune_proof_runs_every_task_from_both_starts(pretrained, tmp_path, corpus_dir):
    """run/finetune_proof.py end to end, small: each task from the checkpoint and from random weights,
    its table, and the JSON with one record per task, start and seed."""
    folder, _ = pretrained
    out = tmp_path / "proof.json"
    proc = subprocess.run([sys.executable, str(REPO / "run" / "finetune_proof.py"), f"--init_checkpoint={folder}",
                           f"--vocab_file={folder / 'vocab.txt'}", f"--input_files={corpus_dir / 'lee_background.cor'}"
                           "@documents", "--seeds=1", "--train_examples=32", "--dev_examples=16", "--epochs=1",
                           "--learning_rate=1e-3", f"--output_json={out}"],
                          env=mpi_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert sorted((r["task"], r["start"]) for r in runs) == sorted(
        (t, s) for t in ("same_document", "word_order", "spans", "odd_word") for s in ("pre-trained", "random"))
    assert all(0 <= r.get("accuracy", 0) <= 1 and 0 <= r.get("f1", 0) <= 100 for r in runs)
    for row in ("| same_document | accuracy |", "| word_order | accuracy |", "| spans | f1 |",
                "| spans | exact_match |", "| odd_word | f1 |", "| odd_word | exact_match |"):
        assert row in proc.stdout, proc.stdout[-2000:]
