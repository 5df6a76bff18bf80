"""The single-device update: optimizers, precision policies, XLA, loss scaling, accumulation, checkpoints."""
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.artifacts import checkpointing
from bert_tf.model import modeling
from bert_tf.train import optimization, training
from bert_tf.parallel.comm import CommConfig
from bert_tf.parallel.exchange import Stateless
from conftest import random_features

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_model(seed=3, vocab=100):
    tf.random.set_seed(seed)
    return modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=vocab, **NO_DROPOUT))


def features(**kw):
    return {k: tf.constant(v) for k, v in random_features(**kw).items()}


def weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


def test_lamb_update_matches_numpy_reference():
    rng = np.random.RandomState(0)
    w0 = rng.randn(4, 3).astype(np.float32)
    b0 = rng.randn(3).astype(np.float32)
    grads = [rng.randn(4, 3).astype(np.float32), rng.randn(3).astype(np.float32)]
    kernel, bias = tf.Variable(w0, name="kernel"), tf.Variable(b0, name="bias")
    opt = optimization.Optimizer([kernel, bias], "lamb", weight_decay=0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-6)
    lr = 0.05
    opt.apply([tf.constant(g) for g in grads], [kernel, bias], lr)

    def reference(w, g, decay):
        m = 0.1 * g
        v = 0.01 * g * g
        update = (m / 0.1) / (np.sqrt(v / 0.01) + 1e-6)
        if decay:
            update = update + 0.1 * w
            ratio = np.linalg.norm(w) / np.linalg.norm(update)
        else:
            ratio = 1.0        # biases and LayerNorm: no decay, no trust ratio
        return w - lr * ratio * update

    np.testing.assert_allclose(kernel.numpy(), reference(w0, grads[0], True), rtol=1e-5)
    np.testing.assert_allclose(bias.numpy(), reference(b0, grads[1], False), rtol=1e-5)
    assert opt.decay == [True, False]


@pytest.mark.parametrize("kind", ["adamw"])
def test_a_frozen_variance_stays_as_it_was_after_the_float32_updates(kind):
    """freeze_variance_after=K (1-bit Adam, under --exchange=onebit): updates K+1.. move m and the
    weights as a NumPy AdamW with v and its bias correction held at update K's; without it, v keeps moving.
    (1-bit LAMB, whose trust ratio freezes too: tests/test_onebit_adam.py.)"""
    rng = np.random.RandomState(1)
    w0 = rng.randn(4, 3).astype(np.float32)
    grads = [rng.randn(4, 3).astype(np.float32) * (1 + 9 * (t >= 2)) for t in range(5)]   # later ones 10x larger
    runs = {}
    for freeze in (0, 2):
        w = tf.Variable(w0, name="kernel")
        opt = optimization.Optimizer([w], kind, weight_decay=0.0, beta_1=0.9, beta_2=0.98, freeze_variance_after=freeze)
        vs = []
        for g in grads:
            opt.apply([tf.constant(g)], [w], 0.01)
            vs.append(opt.v[0].numpy().copy())
        runs[freeze] = w.numpy(), vs
    m, v, w = np.zeros_like(w0), np.zeros_like(w0), w0.astype(np.float64)
    for t, g in enumerate(grads, 1):
        m = 0.9 * m + 0.1 * g
        if t <= 2:
            v = 0.98 * v + 0.02 * g * g
        update = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.98 ** min(t, 2))) + 1e-6)
        w = w - 0.01 * (np.linalg.norm(w) / np.linalg.norm(update) if kind == "lamb" else 1.0) * update
    frozen_w, frozen_v = runs[2]
    np.testing.assert_allclose(frozen_w, w, rtol=1e-5)
    assert all(np.array_equal(frozen_v[1], later) for later in frozen_v[2:])
    assert not np.allclose(runs[0][1][4], frozen_v[4]) and not np.allclose(runs[0][0], frozen_w, rtol=1e-3)


def test_onebit_freezes_the_variance_after_its_float32_updates_and_needs_one():
    comm = lambda method, warmup: CommConfig(exchange=method, compression_warmup_steps=warmup)
    trainer = training.Trainer(tiny_model(), training.TrainConfig(comm=comm("onebit", 3)))
    assert trainer.optimizer.freeze_variance_after == 3
    assert training.Trainer(tiny_model(), training.TrainConfig(comm=comm("powersgd", 3))).optimizer \
        .freeze_variance_after == 0
    with pytest.raises(ConfigError, match="onebit needs --compression_warmup_steps >= 1"):
        training.TrainConfig(comm=comm("onebit", 0))


@pytest.mark.parametrize("jit", [False, True])
def test_norms_equal_the_sum_of_squares_compiled_or_not(jit):
    """The matmul-by-ones sum of squares (optimization.squared_norm) for matrices, the plain one for vectors
    and scalars: float64 references, and tf.linalg.global_norm."""
    rng = np.random.RandomState(1)
    xs = [rng.randn(300, 7), rng.randn(1, 5), rng.randn(6), rng.randn(2, 3, 4), np.float64(-3.0)]
    xs = [np.asarray(x, np.float32) for x in xs]
    norms = tf.function(lambda t: [optimization.norm(x) for x in t], jit_compile=jit)([tf.constant(x) for x in xs])
    for x, n in zip(xs, norms):
        np.testing.assert_allclose(float(n), np.sqrt(np.sum(np.square(x.astype(np.float64)))), rtol=2e-6)
    total = tf.function(optimization.global_norm, jit_compile=jit)([tf.constant(x) for x in xs])
    np.testing.assert_allclose(float(total), float(tf.linalg.global_norm([tf.constant(x) for x in xs])), rtol=2e-6)


def test_adamw_decouples_weight_decay():
    w = tf.Variable([1.0, -2.0], name="kernel")
    opt = optimization.Optimizer([w], "adamw", weight_decay=0.5)
    opt.apply([tf.zeros([2])], [w], 0.1)          # zero gradient: only the decay acts
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.1 * 0.5 * 1.0, -2.0 + 0.1 * 0.5 * 2.0], rtol=1e-6)


def test_learning_rate_warmup_then_polynomial_decay():
    lr = [float(optimization.learning_rate(s, 1.0, 10, 110, power=1.0)) for s in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(lr, [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
    assert float(optimization.learning_rate(60, 1.0, 10, 110, power=0.5)) == pytest.approx(0.5 ** 0.5)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ConfigError, match="valid: float32, mixed_bfloat16, mixed_float16"):
        training.TrainConfig(precision="fp8")
    with pytest.raises(ConfigError, match="valid: lamb, adamw"):
        training.TrainConfig(optimizer="sgd")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_loss_decreases_when_overfitting_a_fixed_batch(precision):
    # one layer of hidden 32: float16 matmuls are emulated on CPUs (60x slower than float32 at the tiny
    # preset's hidden 128); measured 5.29 -> 1.01 in 50 updates in each precision
    tf.random.set_seed(3)
    model = modeling.BertPretrainer(modeling.BertConfig.preset(
        "tiny", vocab_size=100, hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1,
        **NO_DROPOUT))
    trainer = training.Trainer(model, training.TrainConfig(precision=precision, learning_rate=5e-2,
                                                           warmup_steps=5, total_steps=50, weight_decay=0.0))
    batch = features(batch=8, seq=16, preds=3)
    losses = [float(trainer.train_step([batch]).loss) for _ in range(50)]
    assert losses[-1] < 0.5 * losses[0], (precision, losses[0], losses[-1])
    assert int(trainer.skipped_steps.numpy()) <= 1


@pytest.mark.slow
def test_xla_and_plain_function_agree():
    batch = features(batch=4, seq=16, preds=3)
    results = []
    for xla in (False, True):
        trainer = training.Trainer(tiny_model(), training.TrainConfig(xla=xla, learning_rate=1e-3))
        results.append([float(trainer.train_step([batch]).loss) for _ in range(3)])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4)


@pytest.mark.slow
def test_loss_scaling_skips_a_non_finite_gradient_without_touching_weights():
    model = tiny_model()
    trainer = training.Trainer(model, training.TrainConfig(precision="mixed_float16", learning_rate=1e-3))
    trainer.train_step([features()])               # one good step: slots are non-zero
    before, slots = weights(model), [m.numpy().copy() for m in trainer.optimizer.m]
    scale = float(trainer.loss_scale.scale.numpy())
    grads = [tf.zeros_like(v) for v in trainer.variables]
    grads[3] = tf.fill(tf.shape(grads[3]), np.inf)
    info = trainer.apply(grads)
    assert not bool(info["finite"])
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)
    for a, m in zip(slots, trainer.optimizer.m):
        np.testing.assert_array_equal(a, m.numpy())
    assert int(trainer.skipped_steps.numpy()) == 1
    assert float(trainer.loss_scale.scale.numpy()) == scale / 2
    assert int(trainer.loss_scale.good_steps.numpy()) == 0


def test_loss_scale_grows_after_a_run_of_good_steps():
    scale = training.LossScale(initial=8.0, growth_interval=3)
    for _ in range(3):
        scale.update(tf.constant(True))
    assert float(scale.scale.numpy()) == 16.0 and int(scale.good_steps.numpy()) == 0


@pytest.mark.slow
def test_accumulating_n_micro_batches_equals_one_large_batch():
    big = random_features(batch=8, seq=16, preds=3, seed=7)
    micro = [{k: tf.constant(v[i * 2:(i + 1) * 2]) for k, v in big.items()} for i in range(4)]
    m1, m4 = tiny_model(), tiny_model()
    t1 = training.Trainer(m1, training.TrainConfig(accumulation_steps=1))
    t4 = training.Trainer(m4, training.TrainConfig(accumulation_steps=4))
    # the averaged gradient that goes to the allreduce and the optimizer (dropout seeds differ between
    # the two trainers' micro-batches: the tiny model here has no dropout)
    full, _ = t1.gradients([{k: tf.constant(v) for k, v in big.items()}])
    accumulated, outs = t4.gradients(micro)
    assert len(outs) == 4
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in full)
    for a, b in zip(full, accumulated):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5 * scale)
    assert all(float(tf.reduce_max(tf.abs(acc))) == 0.0 for acc in t4.accumulators)  # reset after use
    # and the whole update through train_step gives the same weights
    m1, m4 = tiny_model(), tiny_model()
    t1 = training.Trainer(m1, training.TrainConfig(accumulation_steps=1, learning_rate=1e-3))
    t4 = training.Trainer(m4, training.TrainConfig(accumulation_steps=4, learning_rate=1e-3))
    t1.train_step([{k: tf.constant(v) for k, v in big.items()}])
    t4.train_step(micro)
    for a, b in zip(weights(m1), weights(m4)):
        # a step moves a weight by lr = 1e-3 (LayerNorm, biases) or lr x its tensor's RMS (~2e-5);
        # measured: within 3e-7 (feeding one micro-batch twice instead: 2e-3 apart)
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)


@pytest.mark.slow
def test_allreduce_every_micro_batch_calls_the_allreduce_n_times_with_the_same_result():
    big = random_features(batch=8, seq=16, preds=3, seed=7)
    micro = [{k: tf.constant(v[i * 2:(i + 1) * 2]) for k, v in big.items()} for i in range(4)]
    class Recording(training.Trainer):
        """Keeps the gradients the update applies (apply compiles this _apply)."""
        def _apply(self, grads):
            for kept, g in zip(self.applied, grads):
                kept.assign(g)
            return super()._apply(grads)

    results, calls, applied, waits = {}, {}, {}, {}
    for key, every in (("once", False), ("each", True)):
        count, waited = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)

        class Counting(Stateless):
            def __call__(self, grads, scale=None, count=count):   # traced once, runs at every call: counts them
                count.assign_add(1)
                return [g * 1.0 for g in grads]

            def wait_for_ranks(self, waited=waited):   # a straggler 50 ms late at every barrier
                waited.assign_add(1)
                tf.py_function(lambda: time.sleep(0.05), [], [])
        allreduce = Counting()

        model = tiny_model()
        trainer = Recording(model, training.TrainConfig(accumulation_steps=4, learning_rate=1e-3,
                                                        comm=CommConfig(allreduce_every_micro_batch=every)),
                            exchange=allreduce)
        trainer.applied = [tf.Variable(tf.zeros_like(v)) for v in model.trainable_variables]
        trainer.train_step(micro)                # untimed (and traces): no barrier, no extra collective
        assert int(waited.numpy()) == 0 and trainer.timing == {}
        start = time.perf_counter()
        trainer.train_step(micro, timed=True)
        wall = time.perf_counter() - start
        calls[key], applied[key] = int(count.numpy()), [tf.constant(v) for v in trainer.applied]
        waits[key], results[key] = int(waited.numpy()), weights(model)
        assert set(trainer.timing) == {"compute_seconds", "wait_seconds", "allreduce_seconds", "update_seconds"}
        assert all(v >= 0 for v in trainer.timing.values())
        # the barrier's time is the wait, not the link's (the traced allreduce of a tiny model: ~1 ms)
        assert trainer.timing["wait_seconds"] >= 0.05 * waits[key] > trainer.timing["allreduce_seconds"]
        assert sum(trainer.timing.values()) <= wall     # split, not counted twice (compute excludes the wait)
    assert calls == {"once": 2, "each": 8}
    assert waits == {"once": 1, "each": 4}      # one barrier before each allreduce of a timed update
    # the optimizer gets the same mean gradient (LAMB's first step barely depends on the gradients'
    # scale, so a sum instead of the mean would pass the weight comparison below, not this one)
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in applied["once"])
    assert scale > 0
    for a, b in zip(applied["once"], applied["each"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6 * scale)
    for a, b in zip(results["once"], results["each"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)      # measured: 3e-11; a step: >= 2e-5


@pytest.mark.slow
def test_checkpoint_round_trip_reproduces_the_next_step(tmp_path):
    batch_a, batch_b = features(seed=1), features(seed=2)
    config = training.TrainConfig(precision="mixed_float16", learning_rate=1e-3, accumulation_steps=2)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))  # with dropout
    trainer = training.Trainer(model, config)
    trainer.train_step([batch_a, batch_b])
    ckpt = checkpointing.Checkpoints(str(tmp_path), trainer.checkpoint_items())
    path = ckpt.save(1)
    expected = float(trainer.train_step([batch_b, batch_a]).loss)
    tf.random.set_seed(99)                         # different initial weights, restored over
    other = training.Trainer(modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100)), config)
    checkpointing.Checkpoints(str(tmp_path), other.checkpoint_items()).restore(path)
    assert int(other.step.numpy()) == 1
    assert float(other.train_step([batch_b, batch_a]).loss) == expected


def test_restoring_a_different_model_shape_names_both_shapes(tmp_path):
    trainer = training.Trainer(tiny_model(), training.TrainConfig())
    path = checkpointing.Checkpoints(str(tmp_path), trainer.checkpoint_items()).save(0)
    other = training.Trainer(tiny_model(vocab=120), training.TrainConfig())
    with pytest.raises(ValueError, match=r"word_embeddings: checkpoint \[100, 128\] vs model \[120, 128\]"):
        checkpointing.Checkpoints(str(tmp_path), other.checkpoint_items()).restore(path)


# ----------------------------------------------------------------------------- damaged checkpoints
def saved_checkpoints(directory, steps=(1, 2, 3), keep_last=3):
    trainer = training.Trainer(tiny_model(), training.TrainConfig(learning_rate=1e-3))
    ckpts = checkpointing.Checkpoints(str(directory), trainer.checkpoint_items(), keep_last=keep_last)
    values = {}
    for step in steps:
        trainer.train_step([features(seed=step)])
        values[step] = weights(trainer.model)
        ckpts.save(step, {"step": step})
    return trainer, ckpts, values


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["truncated data", "garbage index", "no manifest", "missing data"])
def test_a_damaged_latest_checkpoint_is_named_and_the_newest_intact_one_restored(tmp_path, fault):
    trainer, ckpts, values = saved_checkpoints(tmp_path)
    latest = str(tmp_path / "ckpt-3")
    assert checkpointing.latest_intact(str(tmp_path)) == latest
    data = glob_one(latest + ".data-*")
    if fault == "truncated data":
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) // 2)
    elif fault == "garbage index":
        size = os.path.getsize(latest + ".index")
        open(latest + ".index", "wb").write(os.urandom(size))                  # same size, other bytes
    elif fault == "no manifest":
        os.remove(latest + checkpointing.MANIFEST)                             # the save stopped before it
    else:
        os.remove(data)
    said = []
    assert checkpointing.latest_intact(str(tmp_path), said.append) == str(tmp_path / "ckpt-2")
    reason = {"truncated data": "bytes, its manifest says", "garbage index": "does not match its manifest",
              "no manifest": "no manifest: its save did not finish", "missing data": "is missing"}[fault]
    assert len(said) == 1 and said[0].startswith(f"checkpoint {latest} is damaged or incomplete (") \
        and reason in said[0] and said[0].endswith(f"resuming from {tmp_path / 'ckpt-2'}, the newest intact "
                                                   f"checkpoint"), said
    other = training.Trainer(tiny_model(seed=9), training.TrainConfig(learning_rate=1e-3))
    fresh = checkpointing.Checkpoints(str(tmp_path), other.checkpoint_items())
    fresh.restore(fresh.latest(log=lambda *_: None))
    assert int(other.step.numpy()) == 2
    for restored, value in zip(weights(other.model), values[2], strict=True):
        np.testing.assert_array_equal(restored, value)


def glob_one(pattern):
    import glob
    (found,) = glob.glob(pattern)
    return found


@pytest.mark.slow
def test_no_intact_checkpoint_is_an_error_naming_each_and_old_folders_resume_as_before(tmp_path):
    _, _, _ = saved_checkpoints(tmp_path, steps=(1, 2))
    for step in (1, 2):
        os.remove(tmp_path / f"ckpt-{step}{checkpointing.MANIFEST}")
    # no checkpoint has a manifest: written before manifests existed, the latest is taken as before
    assert checkpointing.latest_intact(str(tmp_path)) == str(tmp_path / "ckpt-2")
    checkpointing.write_manifest(str(tmp_path / "ckpt-1"))
    with open(glob_one(str(tmp_path / "ckpt-1.data-*")), "ab") as f:
        f.write(b"x")
    with pytest.raises(ConfigError, match=r"no intact checkpoint: .*ckpt-2: no manifest.*ckpt-1: ckpt-1.data-\S+ "
                                          r"has \d+ bytes"):
        checkpointing.latest_intact(str(tmp_path))
    assert checkpointing.latest_intact(str(tmp_path / "none")) is None


@pytest.mark.slow
def test_a_full_disk_during_a_save_names_the_folder_and_bytes_and_keeps_the_previous_checkpoint(tmp_path):
    import subprocess
    mount = tmp_path / "small"
    mount.mkdir()
    trainer = training.Trainer(tiny_model(), training.TrainConfig(learning_rate=1e-3))
    probe = checkpointing.Checkpoints(str(tmp_path / "probe"), trainer.checkpoint_items()).save(0)
    one = sum(os.path.getsize(f) for f in checkpointing.checkpoint_files(probe))
    # room for one checkpoint and a half: the second save fills the disk
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={one * 3 // 2}", "tmpfs", str(mount)], check=True)
    try:
        ckpts = checkpointing.Checkpoints(str(mount), trainer.checkpoint_items(), keep_last=1)
        first = ckpts.save(1, {"step": 1})
        expected = weights(trainer.model)
        trainer.train_step([features(seed=5)])
        with pytest.raises(ConfigError, match=rf"--checkpoint_dir={mount}: the disk filled up while saving step 2"
                           ) as error:
            ckpts.save(2, {"step": 2})
        assert f"the previous checkpoint {first} is intact" in str(error.value)
        assert f"{sum(os.path.getsize(f) for f in checkpointing.checkpoint_files(first)):,} bytes" in str(error.value)
        assert not [p for p in os.listdir(mount) if p.startswith("ckpt-2")]   # no partial files left
        assert checkpointing.latest_intact(str(mount)) == first                  # keep_last=1 kept it
        other = training.Trainer(tiny_model(seed=9), training.TrainConfig(learning_rate=1e-3))
        checkpointing.Checkpoints(str(mount), other.checkpoint_items()).restore(first)
        for restored, value in zip(weights(other.model), expected, strict=True):
            np.testing.assert_array_equal(restored, value)
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow
def test_a_garbled_checkpoint_index_falls_back_to_the_files_and_a_renamed_copy_checks_out(tmp_path):
    import shutil
    saved_checkpoints(tmp_path, steps=(1, 2))
    (tmp_path / "checkpoint").write_bytes(b"\x00\xffnot a text proto {{{")
    said = []
    assert checkpointing.latest_intact(str(tmp_path), said.append) == str(tmp_path / "ckpt-2")
    assert said and "checkpoint is unreadable" in said[0]
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tmp_path.glob("ckpt-2.*"):                      # every file of ckpt-2, manifest included, renamed
        shutil.copy(f, copy / f.name.replace("ckpt-2", "ckpt-9"))
    assert checkpointing.damage(str(copy / "ckpt-9")) is None



FUSE_SCRIPT = """
import glob, json, os, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
from bert_tf.train import training
from test_training import features, tiny_model
batch = features(batch=4, seq=16, preds=3)
out, clustered = {}, {}
for fuse in (False, True):
    trainer = training.Trainer(tiny_model(), training.TrainConfig(fuse=fuse, learning_rate=1e-3))
    before = set(glob.glob(os.path.join(os.environ["TF_DUMP_GRAPH_PREFIX"], "mark_for_compilation_*.pbtxt")))
    out[str(fuse)] = [float(trainer.train_step([batch]).loss) for _ in range(3)]
    out["weights" + str(fuse)] = float(sum(tf.reduce_sum(tf.abs(v)) for v in trainer.variables))
    ops = clustered[str(fuse)] = {}
    from google.protobuf import text_format
    for path in set(glob.glob(os.path.join(os.environ["TF_DUMP_GRAPH_PREFIX"], "mark_for_compilation_*.pbtxt"))) - before:
        graph = tf.compat.v1.GraphDef()
        text_format.Parse(open(path).read(), graph)
        for node in graph.node:
            if "_XlaCluster" in node.attr:
                ops[node.op] = ops.get(node.op, 0) + 1
print(json.dumps({"out": out, "clustered": clustered}))
"""


@pytest.mark.slow
def test_fuse_clusters_the_element_wise_ops_not_the_matmuls_and_trains_like_the_plain_step(tmp_path):
    """A process of its own, started with the flags --fuse needs (and one that dumps the clustering): plain and
    fused trainers side by side, as the ladder runs them."""
    import json
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TF_XLA_FLAGS=" ".join(["--tf_xla_clustering_debug", *training.FUSION_FLAGS]),
               TF_DUMP_GRAPH_PREFIX=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", FUSE_SCRIPT, here], capture_output=True, text=True,
                         timeout=600, cwd=os.path.dirname(here), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    out = result["out"]
    np.testing.assert_allclose(out["True"], out["False"], rtol=1e-4)
    np.testing.assert_allclose(out["weightsTrue"], out["weightsFalse"], rtol=1e-5)
    plain, fused = result["clustered"]["False"], result["clustered"]["True"]
    # the plain step keeps out of the process's auto-clustering: what it compiles is the optimizer update
    assert "Tanh" not in plain and "Softmax" not in plain, plain
    assert not {"MatMul", "BatchMatMulV2", "Einsum"} & set(fused), fused          # TensorFlow's kernels keep them
    assert {"Tanh", "TanhGrad", "Softmax", "Mul", "AddV2"} <= set(fused), fused   # forward and backward fused


def test_fuse_is_not_xla_and_needs_the_flags_at_launch():
    with pytest.raises(ConfigError, match="--fuse with --xla"):
        training.TrainConfig(fuse=True, xla=True)
    assert not training.fusion_enabled()          # the test process runs without auto-clustering
    with pytest.raises(ConfigError, match=r"--fuse needs TF_XLA_FLAGS='--tf_xla_auto_jit=fusible "
                                          r"--tf_xla_cpu_global_jit' in the environment when the process starts"):
        training.Trainer(tiny_model(), training.TrainConfig(fuse=True))
