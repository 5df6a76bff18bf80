"""Compressed gradient exchange (bert_tf/parallel/compression.py) in one process: the bytes each method sends,
sign packing, error feedback's bookkeeping, the flags' start-up errors. Two ranks: tests/test_distributed.py."""
import math

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import compression, distributed
from bert_tf.parallel.comm import CommConfig
from bert_tf.model import modeling
from bert_tf.train.train_config import TrainConfig


def shapes(preset, vocab=30522):
    return [tuple(v.shape) for v in
            modeling.BertPretrainer(modeling.BertConfig.preset(preset, vocab_size=vocab)).trainable_variables]


def test_signs_pack_eight_to_a_byte_and_come_back_scaled():
    x = tf.constant(np.random.default_rng(0).normal(size=(3, 64)), tf.float32)
    packed = compression.pack_signs(x)
    assert packed.dtype == tf.uint8 and packed.shape == (3, 8)
    back = compression.unpack_signs(packed, tf.constant([1.0, 2.0, 0.5]))
    np.testing.assert_array_equal(back.numpy(), np.where(x.numpy() >= 0, 1.0, -1.0) * [[1.0], [2.0], [0.5]])


def test_bytes_on_the_wire_per_method():
    mini = shapes("mini")
    elements = sum(math.prod(s) for s in mini)
    for size in (2, 4, 16):
        ring = 2 * (size - 1) / size
        assert compression.wire_bytes("none", mini, size) == ring * 4 * elements
        fp16 = compression.wire_bytes("fp16", mini, size)
        onebit = compression.wire_bytes("onebit", mini, size)
        powersgd = compression.wire_bytes("powersgd", mini, size, rank=4)
        assert 15 < fp16 / onebit < 16.01            # a bit per element, plus a scale per chunk
        assert fp16 / powersgd > 8                    # rank 4 of 256-wide and 30,522 x 256 matrices
    assert compression.wire_bytes("onebit", mini, 1) == 0


def test_flags_that_cannot_work_fail_at_start_up_naming_them():
    with pytest.raises(ConfigError, match="--fp16_allreduce with --exchange=powersgd"):
        CommConfig(fp16_allreduce=True, exchange="powersgd")
    assert CommConfig(fp16_allreduce=True, exchange="fp16").method == "fp16"
    assert CommConfig(fp16_allreduce=True).method == "fp16" and CommConfig().method == "none"
    with pytest.raises(ConfigError, match="--allreduce_every_micro_batch"):
        CommConfig(exchange="onebit", allreduce_every_micro_batch=True)
    with pytest.raises(ConfigError, match="--exchange=zip"):
        CommConfig(exchange="zip")
    with pytest.raises(ConfigError, match=r"--powersgd_rank=200 with --powersgd_min_compression_rate=2 compresses no tensor \(the largest matrix is \d+ x 128\)"):
        compression.powersgd_plan(shapes("tiny", 100), 200)
    with pytest.raises(ConfigError, match=r"--exchange=powersgd: the float32 warmup \(--compression_warmup_steps=50\) is "
                                          r"not shorter than the run \(--total_steps=50\)"):
        TrainConfig(total_steps=50, comm=CommConfig(exchange="powersgd", compression_warmup_steps=50))
    TrainConfig(total_steps=50, comm=CommConfig(exchange="powersgd", compression_warmup_steps=49))
    with pytest.raises(ConfigError, match="--powersgd_min_compression_rate must be >= 1"):
        CommConfig(exchange="powersgd", powersgd_min_compression_rate=0.5)
    tiny = shapes("tiny", 100)
    chosen = compression.powersgd_plan(tiny, 4)
    assert all(len(tiny[i]) == 2 for i in chosen) and (2, 128) not in [tiny[i] for i in chosen]


def test_powersgd_compresses_a_matrix_only_where_its_factors_are_min_rate_times_smaller():
    """PyTorch's test: (n + m) r rate < n m, strict; a 16 x 16 at rank 4 is not compressed (128 x 2 = 256, not
    < 256), a 17 x 17 is; at rate 1, both; vectors and a rank above the smaller side never."""
    plan = compression.powersgd_plan
    assert plan([(16, 16), (17, 17), (17,), (3, 1000)], 4) == [1]
    assert plan([(16, 16), (17, 17), (17,), (3, 1000)], 4, min_rate=1) == [0, 1]
    assert plan([(8, 1000), (1000, 1000)], 8) == [1]             # rank = the smaller side: 1008 x 8 x 2 > 8000


def test_auto_is_checked_at_start_up_and_one_rank_sends_nothing(monkeypatch):
    """--exchange=auto: run/pretrain.py resolves it (two ranks: tests/test_distributed.py); without the
    per-rank speed it weighs the link against, with --fp16_allreduce or elsewhere: an error naming them."""
    from bert_tf.parallel import auto_exchange
    from bert_tf.train.pretrain_config import PretrainConfig
    auto = CommConfig(exchange="auto")
    with pytest.raises(ConfigError, match="--exchange=auto needs --ladder_sequences_per_second"):
        PretrainConfig(checkpoint_dir="x", vocab_file="v", comm=auto)
    # elastic mode chooses at its first start and keeps it (tests/test_elastic.py)
    PretrainConfig(checkpoint_dir="x", vocab_file="v", comm=auto, ladder_sequences_per_second=10.0, elastic=True,
                   global_batch_size=64)
    PretrainConfig(checkpoint_dir="x", vocab_file="v", comm=auto, ladder_sequences_per_second=10.0)
    with pytest.raises(ConfigError, match="--fp16_allreduce with --exchange=auto"):
        CommConfig(fp16_allreduce=True, exchange="auto")
    with pytest.raises(ConfigError, match="--exchange=auto is chosen by run/pretrain.py at start-up"):
        distributed.make_gradient_exchange(auto, [])
    said = []
    monkeypatch.setattr(distributed, "size", lambda: 1)
    tiny = modeling.BertConfig.preset("tiny", vocab_size=100)
    assert auto_exchange.resolve(auto, tiny, True, 4, 1, 16, 10.0, said.append).method == "none"
    assert said == ["gradients: --exchange=auto on one rank: nothing crosses a link, none"]


@pytest.fixture(scope="module")
def one_rank():
    distributed.init()
    tf.random.set_seed(0)
    return modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100)).trainable_variables


@pytest.mark.parametrize("method", ["powersgd"])
def test_error_feedback_delays_what_it_leaves_out_and_loses_nothing(one_rank, method):
    """Over any number of updates, what the exchange delivered plus what its buffers still hold is what it
    was given (in one process the average is the gradient itself): error feedback delays, never drops.
    A non-finite gradient changes no buffer; a loss scale does not enter the buffers. (onebit, which sends
    the momentum: tests/test_onebit_adam.py.)"""
    exchange = compression.CompressedExchange(method, one_rank, rank=2, seed=1)
    given = delivered = 0
    for step in range(5):
        grads = [tf.random.stateless_normal(v.shape, seed=[step, i]) for i, v in enumerate(one_rank)]
        scale = tf.constant(2.0 ** (10 + step))      # a changing loss scale, carried by the gradients
        out = exchange([g * scale for g in grads], scale)
        given = given + np.concatenate([g.numpy().ravel() for g in grads])
        delivered = delivered + np.concatenate([o.numpy().ravel() for o in out]) / scale.numpy()
    held = np.concatenate([e.numpy().ravel() for e in exchange.own()])
    full = np.zeros_like(given)     # PowerSGD's buffers cover the compressed matrices; the rest goes whole
    offsets = np.cumsum([0] + [math.prod(v.shape) for v in one_rank])
    start = 0
    for i in exchange.compressed:
        n = offsets[i + 1] - offsets[i]
        full[offsets[i]:offsets[i + 1]] = held[start:start + n]
        start += n
    held = full
    np.testing.assert_allclose(delivered + held, given, atol=2e-4)
    assert np.abs(held).max() > 0.1               # something was left out each time
    before = [v.numpy().copy() for v in exchange.own()]
    bad = [tf.fill(v.shape, np.nan if i == 3 else 1.0) for i, v in enumerate(one_rank)]
    assert not np.isfinite(np.concatenate([o.numpy().ravel() for o in exchange(bad)])).all()
    for b, v in zip(before, exchange.own()):
        np.testing.assert_array_equal(b, v.numpy())
    assert int(exchange.clock.numpy()) == 6      # alone, it counts its own calls


def test_warmup_updates_go_uncompressed(one_rank):
    exchange = compression.CompressedExchange("onebit", one_rank, warmup_steps=2)
    grads = [tf.random.stateless_normal(v.shape, seed=[9, i]) for i, v in enumerate(one_rank)]
    for _ in range(2):
        for g, o in zip(grads, exchange(grads)):
            np.testing.assert_array_equal(g.numpy(), o.numpy())
    assert not any(np.any(v.numpy()) for v in exchange.own())       # no error to carry yet
    assert not np.allclose(exchange(grads)[0].numpy(), grads[0].numpy())
    assert all(np.any(v.numpy()) for v in exchange.own())


def test_onebit_without_an_alltoall_transport_fails_at_start_up(one_rank, monkeypatch):
    """1-bit needs Horovod's alltoall, which its MPI and Gloo controllers carry: a job running neither
    (a build without them) is told so before the first update, naming the flag."""
    import horovod.tensorflow as hvd
    monkeypatch.setattr(hvd, "size", lambda: 2)
    monkeypatch.setattr(hvd, "mpi_enabled", lambda: False)
    monkeypatch.setattr(hvd, "gloo_enabled", lambda: False)
    with pytest.raises(ConfigError, match="--exchange=onebit needs Horovod's alltoall over MPI or Gloo"):
        distributed.make_gradient_exchange(CommConfig(exchange="onebit"), one_rank)
    assert distributed.make_gradient_exchange(CommConfig(exchange="powersgd"), one_rank) is not None
