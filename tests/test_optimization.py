"""The update's pieces the budget recipe takes from ModernBERT (configs/budget_*.flags): the 1-sqrt decay
(--decay_shape), StableAdamW (--optimizer=stable_adamw) against a NumPy transcription of optimi's, the weight
decay's convention, and --clip_norm=0."""
import math

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel.comm import CommConfig
from bert_tf.train import optimization, training
from bert_tf.train.train_config import TrainConfig
from conftest import REPO

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def lr(step, **kw):
    """Peak 2, warmup 10, 110 updates."""
    return float(optimization.learning_rate(step, 2.0, 10, 110, **kw))


# ----------------------------------------------------------------------------- --decay_shape
def test_one_minus_sqrt_follows_its_closed_form_from_the_peak_to_the_end():
    for step in (0, 5, 10, 30, 55, 56, 60, 70, 82, 90, 109, 110, 200):
        p = min(max((step - 55) / 55, 0.0), 1.0)          # wsd over the last half: the decay starts at 55
        expected = 2.0 * step / 10 if step < 10 else 2.0 * (1 - math.sqrt(p))
        assert lr(step, decay_fraction=0.5, shape="1-sqrt") == pytest.approx(expected, rel=1e-6, abs=1e-6), step
    for step in (10, 20, 35, 60, 100, 110):               # polynomial: the decay from the end of warmup
        assert lr(step, shape="1-sqrt") == pytest.approx(2.0 * (1 - math.sqrt((step - 10) / 100)), abs=1e-6)
    # ModernBERT's OneMinusSqrtScheduler (src/scheduler.py): alpha_f + (1 - alpha_f)(1 - sqrt(p)) of the peak,
    # its alpha_f 0.001 being end / peak here
    for step in (55, 60, 82, 110):
        p = (step - 55) / 55
        assert lr(step, decay_fraction=0.5, shape="1-sqrt", end=0.002) == pytest.approx(
            2.0 * (0.001 + 0.999 * (1 - math.sqrt(p))), abs=1e-6)


def test_one_minus_sqrt_is_not_the_square_root_power_and_linear_is_unchanged():
    # p = 0.25 (step 35, polynomial): 1 - sqrt(p) = 0.5, while --decay_power=0.5 gives sqrt(1 - p) = 0.866
    assert lr(35, shape="1-sqrt") == pytest.approx(2.0 * 0.5)
    assert lr(35, power=0.5) == pytest.approx(2.0 * math.sqrt(0.75))
    assert lr(35, power=0.5, shape="linear") == lr(35, power=0.5)
    assert lr(60) == pytest.approx(1.0) and lr(60, shape="linear") == lr(60)      # the default: linear
    # (1 - sqrt(p))^2 = 1 - 2 sqrt(p) + p <= 1 - p: 1-sqrt lies below sqrt(1 - p) inside the decay, equal at its ends
    for step in (20, 35, 60, 85, 100):
        assert lr(step, shape="1-sqrt") < lr(step, power=0.5), step
    assert lr(10, shape="1-sqrt") == lr(10, power=0.5) == 2.0 and lr(110, shape="1-sqrt") == lr(110, power=0.5) == 0.0


def test_the_decay_shape_the_clip_norm_and_stable_adamw_with_onebit_are_checked_naming_the_flag():
    with pytest.raises(ConfigError, match=r"--decay_shape=cosine: valid are linear, 1-sqrt"):
        TrainConfig(decay_shape="cosine")
    with pytest.raises(ConfigError, match=r"--decay_power=0.5 with --decay_shape=1-sqrt"):
        TrainConfig(decay_shape="1-sqrt", decay_power=0.5)
    with pytest.raises(ConfigError, match=r"--decay_shape=sqrt: valid are linear, 1-sqrt"):
        optimization.learning_rate(0, 1.0, 0, 10, shape="sqrt")
    with pytest.raises(ConfigError, match=r"--clip_norm must be >= 0 \(0: no clipping\), got -1"):
        TrainConfig(clip_norm=-1.0)
    with pytest.raises(ConfigError, match="--exchange=onebit with --optimizer=stable_adamw"):
        TrainConfig(optimizer="stable_adamw", comm=CommConfig(exchange="onebit", compression_warmup_steps=2))
    TrainConfig(optimizer="stable_adamw", decay_shape="1-sqrt", clip_norm=0.0,
                comm=CommConfig(exchange="powersgd", compression_warmup_steps=2))


def test_the_new_choices_are_flags_and_the_budget_flagfiles_are_valid_runs():
    from absl import flags as absl_flags
    from bert_tf import cli
    from bert_tf.train.pretrain_config import PretrainConfig
    for name in ("budget_phase1.flags", "budget_phase2.flags", "race_budget.flags"):
        fv = absl_flags.FlagValues()
        cli.define_config_flags(PretrainConfig, fv)
        assert fv["optimizer"].parser.enum_values == ["lamb", "adamw", "stable_adamw"]
        assert fv["decay_shape"].parser.enum_values == ["linear", "1-sqrt"]
        race = ["--checkpoint_dir=runs/race/budget"] if name.startswith("race") else []   # the race passes it
        fv(["pretrain.py", f"--flagfile={REPO / 'configs' / name}", *race])
        cfg = cli.config_from_flags(PretrainConfig, fv)
        assert (cfg.optimizer, cfg.schedule, cfg.decay_shape, cfg.adam_beta2, cfg.clip_norm) == \
            ("stable_adamw", "wsd", "1-sqrt", 0.98, 0.0)
        # ModernBERT's weight decay, 1e-5 per update at the peak rate (fully decoupled), in bert_tf's
        # convention (lr x --weight_decay per update)
        assert cfg.learning_rate * cfg.weight_decay == pytest.approx(1e-5, rel=1e-3)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("comm*.flags")))
def test_every_communication_race_flagfile_is_a_valid_run(name):
    """The races' flagfiles pass every start-up check (1-bit's optimizer and warmup, DiLoCo's fragments,
    delay and bits against --local_updates, --eval_interval against the rounds)."""
    from absl import flags as absl_flags
    from bert_tf import cli
    from bert_tf.train.pretrain_config import PretrainConfig
    fv = absl_flags.FlagValues()
    cli.define_config_flags(PretrainConfig, fv)
    fv(["pretrain.py", f"--flagfile={REPO / 'configs' / name}", "--checkpoint_dir=runs/race/x"])
    cfg = cli.config_from_flags(PretrainConfig, fv)
    if name.startswith("comm47"):
        assert (cfg.total_steps, cfg.accumulation_steps, cfg.eval_interval) == (400, 1, 40)


# ----------------------------------------------------------------------------- StableAdamW
def optimi_stable_adamw(w0, grads, lrs, decay, beta_1, beta_2, eps, weight_decay, max_lr):
    """optimi's StableAdamW with decouple_lr=True, as ModernBERT builds it (decoupled_stableadamw), from
    optimi/stableadamw.py (_single_param_stableadamw) and optimi/utils.py (debias_beta), in float64: the bias
    corrections folded into the betas, RMS = sqrt(mean(g^2 / max(v, eps^2))) against the v that includes this
    step's gradient, the rate over max(1, RMS), the weight shrunk by (rate / max_lr) x weight_decay before the
    Adam step. Returns the weights and each update's RMS."""
    w, m, v, seen = w0.astype(np.float64), np.zeros(w0.shape), np.zeros(w0.shape), []
    for t, (g, rate) in enumerate(zip(grads, lrs), 1):
        g = g.astype(np.float64)
        beta_1_hat = (beta_1 ** t - beta_1) / (beta_1 ** t - 1)
        beta_2_hat = (beta_2 ** t - beta_2) / (beta_2 ** t - 1)
        m = m + (1 - beta_1_hat) * (g - m)                               # exp_avg.lerp_(grad, 1 - beta1_hat)
        v = beta_2_hat * v + (1 - beta_2_hat) * g * g
        rms = np.sqrt(np.mean(g * g / np.maximum(v, eps ** 2)))
        seen.append(rms)
        rate = rate / max(1.0, rms)
        if decay:
            w = w * (1 - (rate / max_lr) * weight_decay)
        w = w - rate * m / (np.sqrt(v) + eps)
    return w, seen


SHAPES = {"spiky_kernel": (4, 3), "calm_kernel": (2, 5), "calm_bias": (3,)}
# each tensor's gradient scale at updates 1, 2, 3: the spike at update 2 outgrows its history
SCALES = {"spiky_kernel": (0.1, 10.0, 1.0), "calm_kernel": (1.0, 0.1, 0.1), "calm_bias": (1.0, 0.5, 0.5)}


def _stable_adamw_case():
    rng = np.random.RandomState(0)
    w0 = {n: rng.randn(*s).astype(np.float32) for n, s in SHAPES.items()}
    grads = [[(rng.randn(*SHAPES[n]) * SCALES[n][t]).astype(np.float32) for n in SHAPES] for t in range(3)]
    return w0, grads


def _run(kind, w0, grads, lrs, weight_decay, jit=False):
    variables = [tf.Variable(w0[n], name=n) for n in SHAPES]
    opt = optimization.Optimizer(variables, kind, weight_decay=weight_decay, beta_1=0.9, beta_2=0.98, epsilon=1e-6)
    apply = tf.function(opt.apply, jit_compile=True) if jit else opt.apply
    for step_grads, rate in zip(grads, lrs):
        apply([tf.constant(g) for g in step_grads], variables, tf.constant(rate))
    return opt, [v.numpy() for v in variables]


@pytest.mark.parametrize("jit", [False, True])
def test_stable_adamw_matches_optimi_and_clips_only_the_tensor_whose_gradient_outgrows_its_history(jit):
    w0, grads = _stable_adamw_case()
    lrs = [0.1, 0.1, 0.05]                     # a schedule peaking at 0.1: ModernBERT's max_lr
    # ModernBERT-style weight decay 0.01 (fully decoupled, at the peak 0.1) is bert_tf's 0.01 / 0.1
    opt, got = _run("stable_adamw", w0, grads, lrs, weight_decay=0.1, jit=jit)
    assert opt.decay == [True, True, False]
    rms = {}
    for i, name in enumerate(SHAPES):
        expected, rms[name] = optimi_stable_adamw(w0[name], [g[i] for g in grads], lrs, opt.decay[i], 0.9, 0.98,
                                                  1e-6, weight_decay=0.01, max_lr=0.1)
        np.testing.assert_allclose(got[i], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    assert all(r[0] == pytest.approx(1.0) for r in rms.values())   # the first update: v = g^2, RMS 1, no clip
    assert rms["spiky_kernel"][1] > 1.3                             # the spike: its rate divided by RMS
    assert max(rms["calm_kernel"][1:]) < 1                          # never clipped
    # an unclipped tensor moves as under AdamW (same decay convention); the clipped one does not
    _, adamw = _run("adamw", w0, grads, lrs, weight_decay=0.1, jit=jit)
    np.testing.assert_allclose(got[1], adamw[1], rtol=1e-6)
    assert not np.allclose(got[0], adamw[0], rtol=1e-3)


def test_stable_adamw_checkpoints_its_slots_and_reads_adamws(tmp_path):
    w0, grads = _stable_adamw_case()
    variables = [tf.Variable(w0[n], name=n) for n in SHAPES]
    opt = optimization.Optimizer(variables, "stable_adamw", weight_decay=0.1, beta_2=0.98)
    for step_grads in grads[:2]:
        opt.apply([tf.constant(g) for g in step_grads], variables, 0.1)
    path = tf.train.Checkpoint(weights=variables, optimizer=opt).write(str(tmp_path / "stable"))
    opt.apply([tf.constant(g) for g in grads[2]], variables, 0.05)
    expected = [v.numpy() for v in variables]
    fresh = [tf.Variable(np.zeros_like(w0[n]), name=n) for n in SHAPES]
    other = optimization.Optimizer(fresh, "stable_adamw", weight_decay=0.1, beta_2=0.98)
    tf.train.Checkpoint(weights=fresh, optimizer=other).read(path).assert_consumed()
    assert int(other.iterations.numpy()) == 2
    other.apply([tf.constant(g) for g in grads[2]], fresh, 0.05)
    for a, b in zip(expected, fresh):
        np.testing.assert_array_equal(a, b.numpy())
    # the slots have AdamW's names: an AdamW checkpoint restores into StableAdamW
    adamw_vars = [tf.Variable(w0[n], name=n) for n in SHAPES]
    adamw = optimization.Optimizer(adamw_vars, "adamw", weight_decay=0.1, beta_2=0.98)
    adamw.apply([tf.constant(g) for g in grads[0]], adamw_vars, 0.1)
    path = tf.train.Checkpoint(weights=adamw_vars, optimizer=adamw).write(str(tmp_path / "adamw"))
    tf.train.Checkpoint(weights=fresh, optimizer=other).read(path).assert_consumed()
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(adamw.v, other.v))


# ----------------------------------------------------------------------------- the trainer
def tiny_model(seed=3):
    from bert_tf.model import modeling
    tf.random.set_seed(seed)
    return modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **NO_DROPOUT))


def test_the_trainer_decays_by_decay_shape_over_its_schedule_and_clip_norm_0_clips_nothing():
    config = TrainConfig(optimizer="adamw", learning_rate=1.0, warmup_steps=0, total_steps=100,
                         decay_shape="1-sqrt", clip_norm=0.0, weight_decay=0.0)
    trainer = training.Trainer(tiny_model(), config)
    trainer.schedule.assign([0.0, 16.0])      # a time budget's stretched schedule: the shape follows it
    trainer.step.assign(4)
    grads = [tf.fill(tf.shape(v), 3.0) for v in trainer.variables]   # a global norm far above 1
    info = trainer.apply(grads)
    assert float(info["learning_rate"]) == pytest.approx(1 - math.sqrt(4 / 16))
    np.testing.assert_allclose(trainer.optimizer.m[0].numpy(), 0.1 * 3.0, rtol=1e-6)   # m = (1 - b1) g, unclipped
    # the default --clip_norm=1 scales the same gradients to norm 1 first
    clipped = training.Trainer(tiny_model(), TrainConfig(optimizer="adamw", weight_decay=0.0))
    clipped.apply(grads)
    norm = 3.0 * math.sqrt(sum(int(tf.size(v)) for v in clipped.variables))
    np.testing.assert_allclose(clipped.optimizer.m[0].numpy(), 0.1 * 3.0 / norm, rtol=1e-5)


@pytest.mark.slow
def test_a_stable_adamw_trainer_round_trip_through_a_checkpoint_reproduces_the_next_step(tmp_path):
    from bert_tf.artifacts import checkpointing
    from conftest import random_features
    batches = [{k: tf.constant(v) for k, v in random_features(seed=s).items()} for s in (1, 2, 3)]
    config = TrainConfig(optimizer="stable_adamw", clip_norm=0.0, schedule="wsd", decay_shape="1-sqrt",
                         decay_fraction=0.5, learning_rate=1e-3, warmup_steps=1, total_steps=4, weight_decay=1.25e-2)
    trainer = training.Trainer(tiny_model(), config)
    trainer.train_step([batches[0]])
    trainer.train_step([batches[1]])
    path = checkpointing.Checkpoints(str(tmp_path), trainer.checkpoint_items()).save(2)
    expected = float(trainer.train_step([batches[2]]).loss)
    after = [v.numpy() for v in trainer.variables]
    other = training.Trainer(tiny_model(seed=99), config)
    checkpointing.Checkpoints(str(tmp_path), other.checkpoint_items()).restore(path)
    assert int(other.step.numpy()) == 2 and int(other.optimizer.iterations.numpy()) == 2
    assert float(other.train_step([batches[2]]).loss) == expected
    for a, b in zip(after, other.variables):
        np.testing.assert_array_equal(a, b.numpy())
