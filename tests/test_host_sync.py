"""The hot loop is GPU-ready: it counts device-to-host fetches (every EagerTensor read goes
through `_EagerTensorBase._numpy`) and stop-signal agreements, and asserts they happen per log
interval or stop check, never per update or per micro-batch."""
import contextlib

import pytest
import tensorflow as tf
from tensorflow.python.framework import ops

from bert_tf.parallel import distributed
from bert_tf.model import modeling
from bert_tf.train import modes, pretraining, training
from bert_tf.train import startup
from bert_tf.train import pretrain_config
from conftest import random_features


@contextlib.contextmanager
def counting(owner, name):
    """Counts calls to owner.name while inside."""
    calls = [0]
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(owner, name, wrapped)
    try:
        yield calls
    finally:
        setattr(owner, name, original)


def fetches():
    return counting(ops._EagerTensorBase, "_numpy")


def test_the_counter_sees_a_fetch():
    with fetches() as n:
        float(tf.constant(1.0) + 1.0)
        tf.Variable(2.0).numpy()
    assert n[0] == 2


@pytest.mark.slow
@pytest.mark.parametrize("precision,comm", [("float32", {}), ("mixed_float16", {}),
                                            ("float32", {"allreduce_every_micro_batch": True})])
def test_an_update_fetches_nothing_from_the_device(precision, comm):
    from bert_tf.parallel.comm import CommConfig
    tf.random.set_seed(0)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    trainer = training.Trainer(model, training.TrainConfig(precision=precision, accumulation_steps=3,
                                                           comm=CommConfig(**comm)))
    micro = [{k: tf.constant(v) for k, v in random_features(seed=i).items()} for i in range(3)]
    trainer.train_step(micro)                                   # traces and compiles
    with fetches() as n:
        for _ in range(3):
            out = trainer.train_step(micro)
        assert n[0] == 0 and trainer.timing == {}
        trainer.train_step(micro, timed=True)                  # waits for the device, fetches nothing
        assert n[0] == 0 and set(trainer.timing) == {"compute_seconds", "wait_seconds", "allreduce_seconds", "update_seconds"}
    assert int(trainer.step.numpy()) == 5 and out.loss.shape == ()


def test_dropout_seeds_differ_per_micro_batch_update_and_rank():
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    a = training.Trainer(model, training.TrainConfig(accumulation_steps=2, seed=5))
    b = training.Trainer(model, training.TrainConfig(accumulation_steps=2, seed=5), seed_offset=1)
    seeds = {tuple(a.micro_batch_seed(tf.constant(i, tf.int64)).numpy()) for i in range(2)} | {tuple(b.micro_batch_seed(tf.constant(0, tf.int64)).numpy())}
    a.step.assign(1)
    seeds.add(tuple(a.micro_batch_seed(tf.constant(0, tf.int64)).numpy()))
    assert len(seeds) == 4
    assert tuple(a.micro_batch_seed(tf.constant(1, tf.int64)).numpy()) == ((5 * 7919) % (2 ** 31 - 1), 1 * 2 + 1)


def _loop_counts(tiny_data, tmp_path, total_steps, log_interval, accumulation_steps):
    """(fetches, stop agreements) of pretraining.train over one run from step 0."""
    cfg = pretrain_config.PretrainConfig(
        model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
        max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=2, accumulation_steps=accumulation_steps,
        total_steps=total_steps, log_interval=log_interval, save_interval=10 ** 6, stop_check_interval=4,
        checkpoint_dir=str(tmp_path))
    distributed.init()
    job = startup.build(cfg, lambda *a, **k: None)
    trainer = job.trainer
    trainer.train_step(job.input.next_update())               # compile outside the count
    trainer.step.assign(0)
    with fetches() as n, counting(distributed, "any_rank") as agreements:
        with modes.StopSignal() as stop:
            pretraining.train(cfg, job, modes.Static(stop, job, lambda *a, **k: None, cfg.stop_check_interval))
    return n[0], agreements[0]


@pytest.mark.slow
def test_the_loop_fetches_per_log_interval_not_per_update_or_micro_batch(tiny_data, tmp_path):
    few = _loop_counts(tiny_data, tmp_path / "a", total_steps=4, log_interval=2, accumulation_steps=1)
    many = _loop_counts(tiny_data, tmp_path / "b", total_steps=16, log_interval=8, accumulation_steps=3)
    # both runs write 2 train records; 4x the updates and 12x the micro-batches add no fetch
    assert few[0] > 0 and few[0] == many[0], (few, many)
    # stop agreement at log steps and every stop_check_interval=4 updates: steps {2, 4} vs {4, 8, 12, 16}
    assert (few[1], many[1]) == (2, 4)
