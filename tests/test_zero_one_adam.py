"""--onebit_variance_kappa: 0/1 Adam's variance schedule (bert_tf/parallel/variance_schedule.py) against a
transcription of DeepSpeed ZeroOneAdam's var_interval / var_counter loop, in Python and in TensorFlow; one rank
of the exchange and the optimizer through the warmup and the freeze (where the variance moves, what the
gradient is between its updates, the bias correction, the error buffers at the freeze); the start-up errors
and the bytes. Two ranks: tests/test_onebit_adam.py's worker."""
import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import comm as comm_module, distributed, onebit, variance_schedule
from bert_tf.parallel.comm import CommConfig
from bert_tf.train import optimization
from bert_tf.train.train_config import TrainConfig

B1, B2, EPS, LR = 0.9, 0.999, 1e-6, 1e-3


def deepspeed_variance_updates(steps, kappa):
    """The updates (from 1) at which ZeroOneAdam.step updates exp_avg_sq: `step % var_interval == 0`, and after
    var_update_scaler (kappa) of them the interval doubles."""
    interval, counter, out = 1, 0, []
    for step in range(1, steps + 1):
        if step % interval == 0:
            out.append(step)
            counter += 1
            if counter == kappa:
                counter, interval = 0, interval * 2
    return out


@pytest.mark.parametrize("kappa", [1, 3, 16])
def test_the_schedule_is_deepspeeds_in_python_and_in_tensorflow(kappa):
    expected = deepspeed_variance_updates(3000, kappa)
    counts = np.searchsorted(expected, np.arange(3001), side="right")        # updates <= t
    assert [variance_schedule.variance_updates(t, kappa) for t in range(3001)] == counts.tolist()
    steps = tf.constant(np.arange(1, 3001), tf.int64)
    got = tf.map_fn(lambda t: variance_schedule.variance_update(t, kappa), steps, fn_output_signature=tf.bool).numpy()
    assert np.flatnonzero(got).tolist() == [t - 1 for t in expected]
    assert variance_schedule.variance_updates(400, 0) == 400                 # kappa 0: 1-bit Adam, all of them
    if kappa == 16:   # 16 at each interval 1, 2, 4, 8, 16: 74 of 400 updates
        assert expected[:18] == list(range(1, 17)) + [18, 20] and counts[400] == 74


def run(kappa, warmup, steps, seed=0):
    """`steps` updates on one rank of the exchange and AdamW with 0/1 Adam's schedule: per update the gradient
    given, the one the exchange returned, v, m, the weights and the worker error after it."""
    distributed.init()
    variables = [tf.Variable(tf.zeros(s), name=n) for s, n in (((32, 16), "a/kernel"), ((16,), "b/kernel"))]
    opt = optimization.Optimizer(variables, "adamw", weight_decay=0.0, freeze_variance_after=warmup)
    opt.variance_kappa = kappa
    ex = onebit.OnebitExchange(variables, size=1, name=f"zo{kappa}", kappa=kappa)
    ex.attach_clock(opt.iterations)
    ex.attach_optimizer(opt)
    rng = np.random.default_rng(seed)
    log = []
    for _ in range(steps):
        grads = [rng.normal(size=v.shape).astype(np.float32) for v in variables]
        error_before = ex.error.numpy().copy()
        out = ex([tf.constant(g) for g in grads])
        opt.apply(out, variables, LR)
        log.append({"grads": grads, "out": [o.numpy() for o in out], "v": [v.numpy().copy() for v in opt.v],
                    "m": [m.numpy().copy() for m in opt.m], "w": [w.numpy().copy() for w in variables],
                    "error_before": error_before, "error": ex.error.numpy().copy()})
    return log, ex


def test_the_variance_moves_only_at_its_updates_and_the_gradient_goes_as_signs_between():
    """kappa 2, warmup 7: the variance's updates are 1, 2, 4 and 6. There the exchange returns the exact
    gradient and v takes it; at 3, 5 and 7 it returns each tensor's signs times its RMS (error feedback: the
    error is what they left out) and v stays; from 8 on v is frozen and the momentum travels. The update after
    the freeze divides by v's own bias correction, 1 - b2^4 (4 updates of v), not 1 - b2^8."""
    log, ex = run(kappa=2, warmup=7, steps=9)
    for t, r in enumerate(log, 1):
        moved = not all(np.array_equal(a, b) for a, b in zip(r["v"], log[t - 2]["v"])) if t > 1 else True
        assert moved == (t in (1, 2, 4, 6)), t
        if t in (1, 2, 4, 6):
            for o, g in zip(r["out"], r["grads"]):
                np.testing.assert_array_equal(o, g)
        elif t <= 7:
            for o, g in zip(r["out"], r["grads"]):      # one magnitude per tensor, the signs of g + error
                assert len(np.unique(np.abs(o))) == 1 and not np.allclose(o, g)
            sent = np.concatenate([g.ravel() for g in r["grads"]])
            assert np.any(r["error"]) and not np.allclose(r["error"], r["error_before"])
            # what the signs left out is the error: received + new error = sent + old error (padding aside)
            received = np.concatenate([o.ravel() for o in r["out"]])
            np.testing.assert_allclose(received + r["error"][:sent.size], sent + r["error_before"][:sent.size],
                                       rtol=1e-5, atol=1e-5)
    # v: 4 updates (1, 2, 4, 6) of the exact gradients
    v = [np.zeros_like(g) for g in log[0]["grads"]]
    for t in (1, 2, 4, 6):
        v = [B2 * x + (1 - B2) * g ** 2 for x, g in zip(v, log[t - 1]["grads"])]
    for got, want in zip(log[8]["v"], v):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # update 9 (frozen): w moves by lr m_hat / (sqrt(v / (1 - b2^4)) + eps)
    step = [(a - b) / LR for a, b in zip(log[7]["w"], log[8]["w"])]
    for s, m, x in zip(step, log[8]["m"], v):
        np.testing.assert_allclose(s, (m / (1 - B1 ** 9)) / (np.sqrt(x / (1 - B2 ** 4)) + EPS), rtol=2e-3)


def test_the_momentums_signs_start_from_zero_errors_at_the_freeze():
    """The errors of the gradient's signs (0/1 Adam's warmup) are not carried into the momentum's: the first
    update after the freeze compresses the local momentum as a fresh exchange would (DeepSpeed zeroes both
    error buffers at the freeze)."""
    log, ex = run(kappa=1, warmup=3, steps=4)          # variance at 1 and 2; signs at 3; frozen at 4
    assert np.any(log[2]["error"])
    r, previous = log[3], log[2]["m"]
    local = [B1 * m + (1 - B1) * g for m, g in zip(previous, r["grads"])]
    layout = onebit.Layout(ex.frozen_shapes, 1)
    fresh, _, _ = onebit.compressed_allreduce([tf.constant(x) for x in local], tf.zeros([layout.padded]),
                                              tf.zeros([layout.served]), layout, "fresh", alone=True)
    for m, want in zip(r["m"], fresh):
        np.testing.assert_allclose(m, want.numpy(), rtol=1e-5, atol=1e-7)


def test_kappa_bad_input_fails_at_start_up_naming_the_flags():
    with pytest.raises(ConfigError, match=r"--onebit_variance_kappa=16 with --optimizer=lamb: 0/1 Adam"):
        TrainConfig(optimizer="lamb", comm=CommConfig(exchange="onebit", onebit_variance_kappa=16))
    with pytest.raises(ConfigError, match=r"--onebit_variance_kappa=16 with --exchange=fp16: .*needs --exchange"):
        CommConfig(exchange="fp16", onebit_variance_kappa=16)
    with pytest.raises(ConfigError, match="--onebit_variance_kappa must be >= 0, got -1"):
        CommConfig(exchange="onebit", onebit_variance_kappa=-1)
    TrainConfig(optimizer="adamw", comm=CommConfig(exchange="onebit", onebit_variance_kappa=16))


def test_bytes_count_only_the_variances_updates_as_float32():
    """A run of 400 updates with a warmup of 320 and kappa 16: 69 float32 updates (16 at each interval 1, 2,
    4 and 8, then 5 at 16 by update 320), 331 as signs; the planner's bytes per update say the same."""
    from bert_tf.model import modeling
    from bert_tf.tools import model_shapes, planner
    shapes = [(30522, 128), (128,), (512, 128)]
    comm = CommConfig(exchange="onebit", onebit_variance_kappa=16, compression_warmup_steps=320)
    assert comm_module.float32_updates(comm, 400) == 69
    plain, wire = comm_module.wire_bytes("none", shapes, 4), comm_module.wire_bytes("onebit", shapes, 4)
    assert comm_module.run_wire_bytes(comm, shapes, 4, 400) == pytest.approx((69 * plain + 331 * wire) / 400)
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("mini", vocab_size=30522))
    phase = planner.Phase("p", 128, 128 * 400, 128, 1000.0)                  # 400 updates
    cluster = planner.Cluster(4, 1, 10.0, inter_latency_us=0)
    row = lambda **kw: planner.plan_phase(shapes, phase, cluster, CommConfig(cycle_time_ms=0, **kw), 1)
    plain, signs = row()["gradient_bytes"], row(exchange="onebit", compression_warmup_steps=0)["gradient_bytes"]
    for kappa, float32 in ((0, 320), (16, 69)):
        got = row(exchange="onebit", compression_warmup_steps=320, onebit_variance_kappa=kappa)["gradient_bytes"]
        assert got == pytest.approx((float32 * plain + (400 - float32) * signs) / 400, rel=1e-6), kappa


def test_the_trainer_gives_the_schedule_to_both_halves_and_the_log_and_state_file_name_it():
    from bert_tf.model import modeling
    from bert_tf.train import startup, training
    distributed.init()
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    comm = CommConfig(exchange="onebit", onebit_variance_kappa=16, compression_warmup_steps=40)
    exchange = distributed.make_gradient_exchange(comm, model.trainable_variables)
    trainer = training.Trainer(model, TrainConfig(optimizer="adamw", total_steps=50, comm=comm), exchange=exchange)
    assert trainer.optimizer.variance_kappa == exchange.kappa == 16
    assert exchange.describe()["onebit_variance_kappa"] == 16                 # its error buffers' meaning
    assert "onebit_variance_kappa" not in onebit.OnebitExchange(model.trainable_variables, size=1).describe()
    said = startup.describe_exchange(comm, 50)
    assert said.startswith("1-bit after 40 warmup updates") and "float32 only at the variance's updates (kappa 16)" in said


def test_the_sign_updates_skip_the_float32_allreduce(monkeypatch):
    """Only the variance's updates (1, 2, 4 and 6 of a 7-update warmup with kappa 2) average in float32: the
    allreduce sits inside its branch, so the updates that send signs do not pay for it too."""
    calls = []
    real = onebit.average
    monkeypatch.setattr(onebit, "average", lambda *a, **k: calls.append(1) or real(*a, **k))
    run(kappa=2, warmup=7, steps=7)
    assert len(calls) == 4
