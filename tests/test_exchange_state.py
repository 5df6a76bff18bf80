"""The gradient exchange as checkpoint state (bert_tf/parallel/exchange_state.py): the choice kept across resumes, each
rank's own buffers in its own file, and one clock (the optimizer's update count) for every exchange decision."""
import json

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.parallel import compression, exchange_state
from bert_tf.parallel.comm import CommConfig
from bert_tf.model import modeling
from bert_tf.train import pretrain_config, training


def _measured():
    raise AssertionError("auto measured the link although the checkpoint recorded its choice")


def test_auto_keeps_the_recorded_exchange_and_a_named_one_starts_afresh():
    auto = CommConfig(exchange="auto", powersgd_rank=4)
    recorded = {"gradient_compression": "powersgd", "powersgd_rank": 8}
    kept, note = exchange_state.settle_choice(auto, recorded, _measured)
    assert (kept.exchange, kept.powersgd_rank) == ("powersgd", 8)
    assert "the resumed checkpoint's exchange, powersgd rank 8, is kept" in note
    chosen = CommConfig(exchange="fp16")
    assert exchange_state.settle_choice(auto, None, lambda: chosen) == (chosen, "")      # fresh: measured
    named = CommConfig(exchange="powersgd", powersgd_rank=4)
    same, note = exchange_state.settle_choice(named, recorded, _measured)
    assert same is named and "trained with powersgd rank 8, this run names powersgd rank 4" in note
    assert exchange_state.settle_choice(named, exchange_state.record(named), _measured) == (named, "")
    kept, _ = exchange_state.settle_choice(auto, {"gradient_compression": "fp16", "powersgd_rank": 0}, _measured)
    assert kept.method == "fp16" and kept.powersgd_rank == 4


def _exchange(method, variables, rank=2, seed=7, size=2):
    return compression.CompressedExchange(method, variables, rank, seed=seed, size=size)


@pytest.fixture
def variables():
    return [tf.Variable(tf.random.stateless_normal(s, seed=[1, i])) for i, s in enumerate([(32, 24), (24,), (24, 16)])]


def _fill(exchange, value):
    for i, v in enumerate(exchange.own() + exchange.shared()):
        v.assign(tf.fill(tf.shape(v), value + i))


@pytest.mark.parametrize("method", ["powersgd", "onebit"])
def test_each_rank_reads_back_only_its_own_file_and_anything_else_starts_at_zero(method, variables, tmp_path):
    digest = exchange_state.weights_digest(variables)
    for rank in (0, 1):
        ex = _exchange(method, variables)
        _fill(ex, 10.0 * (rank + 1))
        exchange_state.save(ex, str(tmp_path), 20, rank, 2, digest)
    for rank in (0, 1):
        back = _exchange(method, variables)
        assert exchange_state.load(back, str(tmp_path), 20, rank, 2, digest) == ""
        for i, v in enumerate(back.own()):
            np.testing.assert_array_equal(v.numpy(), np.full(v.numpy().shape, 10.0 * (rank + 1) + i))
    # the file holds this rank's buffers only (and rank 0's Q): no other rank's
    with np.load(exchange_state.path(str(tmp_path), 20, 1, 2)) as f:
        assert sorted(k for k in f.files if k != "header") == [f"own_{i}" for i in range(len(back.own()))]
    cases = {"no file of its own": (30, 1, 2, digest, {}),
             "saved at 2 ranks, this run has 4": (20, 1, 4, digest, {}),
             "is from another run": (20, 1, 2, "0123456789abcdef", {}),
             "this run uses powersgd rank 3": (20, 1, 2, digest, {"rank": 3}) if method == "powersgd" else None}
    for expected, case in cases.items():
        if case is None:
            continue
        step, rank, ranks, wanted, kwargs = case
        fresh = _exchange(method, variables, size=ranks, **kwargs)
        _fill(fresh, 5.0)
        problem = exchange_state.load(fresh, str(tmp_path), step, rank if rank < ranks else 0, ranks, wanted)
        assert expected in problem, problem
        assert not any(np.any(v.numpy()) for v in fresh.own())          # zero buffers, never another's
    line = exchange_state.summary(["", "no file of its own (x)"], 2)
    assert line == "gradient compression: rank 1: no file of its own (x): that rank starts at zero, the other 1 " \
                   "restored their own"


def test_each_rank_keeps_its_own_newest_files(variables, tmp_path):
    ex = _exchange("onebit", variables)
    for step in (10, 20, 30, 40):
        exchange_state.save(ex, str(tmp_path), step, 1, 2, "d", keep=2)
    exchange_state.save(ex, str(tmp_path), 10, 0, 2, "d", keep=2)       # another rank's file: not this rank's to prune
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.npz"))
    assert left == ["exchange/ckpt-10/rank-0-of-2.npz", "exchange/ckpt-30/rank-1-of-2.npz",
                    "exchange/ckpt-40/rank-1-of-2.npz"]


def _trainer(method="powersgd", warmup=3, precision="float32"):
    from bert_tf.parallel import distributed
    distributed.init()                  # one rank: the exchange's collectives are its own
    tf.random.set_seed(5)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    comm = CommConfig(exchange=method, powersgd_rank=2, compression_warmup_steps=warmup)
    exchange = compression.CompressedExchange(method, model.trainable_variables, 2, warmup, seed=7)
    return training.Trainer(model, training.TrainConfig(optimizer="adamw", comm=comm, precision=precision),
                            exchange=exchange)


def test_the_warmup_follows_the_optimizers_updates_through_a_newcomer_and_a_rollback():
    """The warmup's clock is the optimizer's update count, which every start broadcasts from rank 0 and a
    rollback puts back: a newcomer that takes the state is past the warmup exactly when the others are, and a
    rollback across the boundary puts every rank back inside it (with a counter of its own, a newcomer would
    start the warmup again and take the other tf.cond branch: other collectives, a hang)."""
    from conftest import random_features
    features = {k: tf.constant(v) for k, v in random_features(4, 32, 5, 100, seed=1).items()}
    old = _trainer()
    committed = [v.numpy() for v in old.state_variables()]
    for _ in range(4):
        old.train_step([features])
    assert int(old.exchange.clock.numpy()) == 4 and old.exchange.clock is old.optimizer.iterations
    newcomer = _trainer()
    for mine, theirs in zip(newcomer.state_variables(), old.state_variables()):     # the sync's broadcast
        mine.assign(theirs)
    grads = [tf.random.stateless_normal(v.shape, seed=[3, i]) for i, v in enumerate(newcomer.variables)]
    i = newcomer.exchange.compressed[0]                                        # a matrix PowerSGD compresses
    assert not np.allclose(newcomer.exchange(grads)[i].numpy(), grads[i].numpy())   # past the warmup, as the others
    for v, value in zip(old.state_variables(), committed):                     # a rollback to before the warmup
        v.assign(value)
    assert all(np.array_equal(g.numpy(), o.numpy()) for g, o in zip(grads, old.exchange(grads)))


def test_a_skipped_update_moves_neither_the_warmup_nor_the_variance_freeze():
    from conftest import random_features
    trainer = _trainer("onebit", warmup=2, precision="mixed_float16")
    features = {k: tf.constant(v) for k, v in random_features(4, 32, 5, 100, seed=1).items()}
    trainer.loss_scale.scale.assign(1e38)          # overflows: the update is skipped
    trainer.train_step([features])
    assert int(trainer.skipped_steps.numpy()) == 1 and int(trainer.step.numpy()) == 1
    assert int(trainer.exchange.clock.numpy()) == 0 == int(trainer.optimizer.iterations.numpy())


def _run(tiny_data, folder, total, **comm):
    from bert_tf.train import pretraining
    lines = []
    cfg = pretrain_config.PretrainConfig(
        model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"], max_seq_length=64,
        max_predictions_per_seq=10, micro_batch_size=4, learning_rate=1e-3, total_steps=total, log_interval=2,
        save_interval=2, checkpoint_dir=str(folder), ladder_sequences_per_second=10.0, comm=CommConfig(**comm))
    trainer, _ = pretraining.run(cfg, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    return trainer, "\n".join(lines)


@pytest.mark.slow
def test_auto_is_pinned_across_a_resume_and_a_change_of_method_or_rank_never_crashes(tiny_data, tmp_path):
    """A run with PowerSGD rank 2 saves; a resume under `auto` keeps PowerSGD rank 2 (on one rank a fresh `auto`
    would choose none) and restores the rank's buffers; a resume naming rank 3 (Q of another shape) and then 1-bit
    starts the buffers afresh with a line, and every checkpoint records what it was trained with."""
    _, out = _run(tiny_data, tmp_path, 4, exchange="powersgd", powersgd_rank=2)
    record = lambda step: json.loads((tmp_path / f"ckpt-{step}.json").read_text())["exchange"]
    assert record(4) == {"gradient_compression": "powersgd", "powersgd_rank": 2}
    assert (tmp_path / "exchange" / "ckpt-4" / "rank-0-of-1.npz").exists()
    trainer, out = _run(tiny_data, tmp_path, 6, exchange="auto")
    assert "the resumed checkpoint's exchange, powersgd rank 2, is kept" in out, out
    assert "each of the 1 ranks restored its own error buffers from its own file" in out, out
    assert trainer.exchange.method == "powersgd" and trainer.exchange.rank == 2 and record(6) == record(4)
    trainer, out = _run(tiny_data, tmp_path, 8, exchange="powersgd", powersgd_rank=3)
    assert "trained with powersgd rank 2, this run names powersgd rank 3" in out, out
    assert "was written by powersgd rank 2 on 1 ranks, this run uses powersgd rank 3" in out, out
    assert int(trainer.step.numpy()) == 8 and record(8)["powersgd_rank"] == 3
    _, out = _run(tiny_data, tmp_path, 10, exchange="onebit", compression_warmup_steps=1)
    assert "this run names onebit" in out and record(10)["gradient_compression"] == "onebit"
