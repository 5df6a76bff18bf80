"""The pre-training loop's pieces in one process: signal handling, interval metrics, the trainer's
state list, and a short run end to end."""
import inspect
import json
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import distributed
from bert_tf.model import modeling
from bert_tf.train import divergence, figures, modes, pretraining, training
from bert_tf.train import pretrain_config


def test_stop_signal_remembers_a_signal_and_puts_the_old_handlers_back():
    def sentinel(signum, frame):
        pass
    previous = signal.signal(signal.SIGTERM, sentinel)
    try:
        with modes.StopSignal() as stop:
            assert signal.getsignal(signal.SIGTERM) == stop.handle
            signal.raise_signal(signal.SIGTERM)
            assert stop.received == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is sentinel
        with pytest.raises(RuntimeError):
            with modes.StopSignal():
                raise RuntimeError("the loop failed")
        assert signal.getsignal(signal.SIGTERM) is sentinel       # also when the loop raises
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_interval_metrics_average_losses_and_count_accuracies_over_the_interval():
    distributed.init()
    interval = figures.IntervalMetrics(global_batch=8, seq_length=16)

    def update(loss, mlm_loss, mlm_correct):      # one update of 8 sequences of 16 tokens (figures.UpdateOutput)
        output = modeling.PretrainOutput(loss=loss, mlm_loss=mlm_loss, mlm_correct=mlm_correct, mlm_weight=10)
        return figures.UpdateOutput(output=output, learning_rate=0.5, grad_norm=2.0, finite=True, sequences=8,
                                     useful_tokens=128)
    interval.add(update(3.0, 2.0, 3), {"compute_seconds": 1.0})
    interval.add(out := update(5.0, 4.0, 5), {"compute_seconds": 3.0})
    record = interval.record(step=2, out=out)
    assert (record.loss, record.mlm_loss, record.mlm_accuracy) == (4.0, 3.0, 0.4)
    assert record.compute_seconds == 2.0 and record.nsp_loss is None
    assert record.sequences_per_second > 0
    assert record.tokens_per_second == pytest.approx(16 * record.sequences_per_second)
    assert interval.updates == 0 and interval.sums == {}                 # the next interval starts empty
    # elastic mode, uneven shares: losses weighted like the gradients (x 0.5 here), counts as they are
    interval = figures.IntervalMetrics(global_batch=8, seq_length=16, loss_weight=0.5)
    interval.add(out := update(3.0, 3.0, 3), {})
    record = interval.record(step=3, out=out)
    assert (record.loss, record.mlm_accuracy) == (1.5, 0.3)


def test_an_evaluation_counts_its_masked_tokens_and_states_the_accuracy_s_standard_error():
    """The held-out record from all ranks' sums: accuracy, the masked tokens scored, and the accuracy's
    binomial standard error over them (what one evaluation's noise is, for a race's claims)."""
    from bert_tf.train import evaluation
    labels = np.zeros([50])
    labels[7], labels[3] = 90, 310
    total = {"mlm_loss": 60.0, "mlm_correct": 100.0, "mlm_weight": 400.0, "sequences": 20.0}
    record = evaluation._eval_record(5, total, labels)
    assert (record.eval_mlm_accuracy, record.eval_mlm_predictions, record.eval_mlm_loss) == (0.25, 400.0, 3.0)
    assert record.eval_mlm_accuracy_se == pytest.approx((0.25 * 0.75 / 400) ** 0.5, rel=1e-12)
    assert (record.eval_most_frequent_token, record.eval_most_frequent_token_accuracy) == (3, 310 / 400)
    # nothing masked: no accuracy, no error, nothing to divide by
    empty = evaluation._eval_record(5, {"sequences": 2.0}, np.zeros([50]))
    assert empty.eval_mlm_predictions is None and empty.eval_mlm_accuracy_se is None


def test_wait_for_record_returns_the_first_match_and_says_why_it_gave_up(tmp_path):
    import subprocess
    import sys
    from bert_tf.artifacts.metrics import wait_for_record
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "step": 2}\n{"kind": "tr')  # last line half-written
    assert wait_for_record(path, lambda r: r["step"] >= 1)["step"] == 1
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended.wait()
    with pytest.raises(RuntimeError, match=r"the job ended while waiting for step 5 \(exit 3\)"):
        wait_for_record(path, lambda r: r["step"] >= 5, ended, "step 5")
    with pytest.raises(RuntimeError, match="no step 5 within 0.3 s"):
        wait_for_record(path, lambda r: r["step"] >= 5, None, "step 5", timeout=0.3, poll=0.1)


@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_state_variables_are_every_variable_a_checkpoint_holds(precision, tmp_path):
    tf.random.set_seed(1)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    trainer = training.Trainer(model, training.TrainConfig(precision=precision, accumulation_steps=2))
    state = {v.ref() for v in trainer.state_variables()}
    path = tf.train.Checkpoint(**trainer.checkpoint_items()).write(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.endswith("VARIABLE_VALUE")]
    expected = {v.ref() for v in list(model.variables) + list(trainer.optimizer.variables)
                + [trainer.step, trainer.skipped_steps]}
    if trainer.loss_scale is not None:
        expected |= {v.ref() for v in trainer.loss_scale.variables}
    assert state == expected and len(saved) == len(state)
    assert not state & {v.ref() for v in trainer.accumulators}           # zero between updates: neither


def read_wandb_run(folder):
    """(history rows, config) of an offline W&B run: its run-*.wandb file is LevelDB's log format (32 KB
    blocks of chunks: crc32, length, type) after a 7-byte ':W&B' header, each record a wandb protobuf."""
    import struct

    from wandb.proto import wandb_internal_pb2
    data = next(folder.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, history, config = 7, 32768, b"", [], {}
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:                                   # a block's tail too short for a header: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):                             # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.HasField("history"):
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)   # "train/loss": nested
                                for i in record.history.item})
            if record.HasField("config"):
                config.update({i.key: i.value_json for i in record.config.update})
    return history, config


def test_a_metrics_writer_that_is_not_rank_0_writes_nothing(tmp_path):
    from bert_tf.artifacts import metrics
    writer = metrics.MetricsWriter(str(tmp_path / "run"), active=False, wandb_project="p", wandb_mode="offline")
    writer.write({"kind": "train", "step": 1, "loss": 2.0})
    writer.close()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="--wandb_mode=cloud: valid are online, offline"):
        metrics.check_wandb("p", "cloud")


@pytest.mark.slow
def test_a_short_run_logs_saves_and_restores_the_signal_handlers(tiny_data, tmp_path):
    def sentinel(signum, frame):
        pass
    previous = signal.signal(signal.SIGTERM, sentinel)
    try:
        cfg = pretrain_config.PretrainConfig(
            model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
            eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4,
            accumulation_steps=2, fit_micro_batch=2, total_steps=3, log_interval=2, eval_batches=2,
            checkpoint_dir=str(tmp_path), wandb_project="bert_tf-test", wandb_mode="offline")
        trainer, last = pretraining.run(cfg, log=lambda *a, **k: None)
        assert signal.getsignal(signal.SIGTERM) is sentinel
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert int(trainer.step.numpy()) == 3 and not last["stopped_early"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("run", 0), ("train", 2), ("train", 3), ("eval", 3), ("end", 3)]
    assert records[-1]["stopped_early"] is False                         # how it ended: a race skips it
    assert records[0]["config"]["comm"] == {"fp16_allreduce": False, "allreduce_every_micro_batch": False,
                                            "fusion_threshold_mb": None, "cycle_time_ms": None,
                                            "gradient_compression": "none", "powersgd_rank": 4,
                                            "powersgd_min_compression_rate": 2.0, "compression_warmup_steps": None,
                                            "onebit_signs": True, "onebit_live": "", "onebit_variance_kappa": 0,
                                            "local_updates": 0,
                                            "local_group": "rank", "outer_learning_rate": 0.7, "outer_momentum": 0.9,
                                            "local_updates_after": 0, "local_fragments": 1, "fragment_delay": 0,
                                            "fragment_update_alpha": 0.0, "outer_delta_bits": 16,
                                            "collective_timeout_minutes": 30.0, "save_timeout_minutes": 60.0}
    # the run record keeps what was asked and what it resolved to (the per-rank batch of 8 re-split)
    asked, resolved = records[0]["config"], records[0]["resolved"]
    assert (asked["micro_batch_size"], asked["accumulation_steps"], asked["fit_micro_batch"]) == (4, 2, 2)
    assert (resolved["micro_batch_size"], resolved["accumulation_steps"], resolved["fit_micro_batch"]) == (2, 4, 0)
    assert records[2]["samples_seen"] == 3 * 8 and records[2]["sequences"] == 8 and "eval_mlm_accuracy" in last
    assert records[0]["device"]["cpu_count"] == os.cpu_count()          # the machine, for races across sessions
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")
    # --wandb_mode=offline: the W&B run folder holds what metrics.jsonl (and TensorBoard) got, and the run record
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history, config = read_wandb_run(runs[0])
    logged = {}
    for row in history:
        logged.setdefault(row["step"], {}).update(row)
    assert sorted(logged) == [0, 2, 3]
    for record in records:
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "time"):
                assert logged[record["step"]][f"{record['kind']}/{key}"] == pytest.approx(value, rel=1e-6), key
    assert json.loads(config["resolved"])["micro_batch_size"] == 2 and "command" in config


@pytest.mark.slow
def test_a_checkpoint_from_before_the_input_position_resumes_from_its_json_with_a_fresh_pass(tiny_data, tmp_path):
    """Checkpoints written before the data position moved into them hold only the trainer's items and
    `samples_seen` in the JSON beside them: resuming takes the count from there and says the input
    starts a fresh pass (nothing to seek to), instead of failing or restarting the count at zero."""
    def config(directory, total_steps):
        return pretrain_config.PretrainConfig(
            model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
            eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4,
            total_steps=total_steps, log_interval=1, eval_batches=1, checkpoint_dir=str(directory))

    trainer, _ = pretraining.run(config(tmp_path / "new", 3), log=lambda *a, **k: None)
    old = tmp_path / "old"     # what an older version left: no input_position, the count in ckpt-3.json
    tf.train.CheckpointManager(tf.train.Checkpoint(**trainer.checkpoint_items()), str(old), 1).save(3)
    (old / "ckpt-3.json").write_text(json.dumps({"step": 3, "samples_seen": 12}))
    assert not any(name.startswith("input_position") for name, _ in tf.train.list_variables(str(old / "ckpt-3")))

    lines = []
    resumed, last = pretraining.run(config(old, 5), log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert any("resumed from" in line and "at step 3" in line for line in lines)
    assert any("fresh pass over the training files starts at step 3" in line for line in lines)
    assert int(resumed.step.numpy()) == 5
    records = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    assert [r["samples_seen"] for r in records if r["kind"] == "train"] == [16, 20]   # counted on from 12
    saved = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(old))))
    assert any(name.startswith("input_position/samples_seen") for name in saved)   # new saves carry it


# ----------------------------------------------------------------------------- the divergence guard
def test_guard_fires_on_a_loss_that_stays_high_or_on_skipped_updates_never_on_a_falling_loss():
    guard = divergence.Guard(divergence.GuardConfig(divergence_factor=1.5, divergence_intervals=3, max_skipped_updates=4))
    healthy = [10.0 * 0.97 ** i for i in range(200)]                       # a loss that falls, with noise
    noise = np.random.RandomState(0).uniform(0.9, 1.1, 200)
    assert not any(guard.observe(x * n, 0) for x, n in zip(healthy, noise)) and not guard.suspect
    median = float(np.median(guard.healthy))
    assert guard.observe(median * 1.6, 0) == "" and guard.suspect          # one high interval: suspect only
    assert guard.observe(median, 0) == "" and not guard.suspect            # came back: left alone
    assert [bool(guard.observe(median * 2, 0)) for _ in range(3)] == [False, False, True]
    guard.rolled_back("spike")
    assert guard.observe(float("nan"), 3) == "" and guard.suspect
    assert guard.observe(median, 4) == "4 consecutive updates skipped (non-finite gradients)"
    with pytest.raises(divergence.Diverged, match="after 0 rollback"):
        divergence.Guard(divergence.GuardConfig(max_rollbacks=0)).rolled_back("x")
    with pytest.raises(ConfigError, match="--divergence_factor must be 0 .off. or > 1"):
        divergence.GuardConfig(divergence_factor=0.5).validate()


def _guarded_run(tiny_data, tmp_path, monkeypatch, inject, **overrides):
    """A tiny run whose input `inject(call, features) -> features` may poison (or set `boost`, the
    learning rate multiplier the schedule is patched with); returns (last record, metrics records,
    [(checkpoint, weights equal its values)] for each rollback)."""
    from bert_tf.artifacts import checkpointing
    from bert_tf.train import optimization
    boost = tf.Variable(1.0, trainable=False)
    real_lr = optimization.learning_rate
    monkeypatch.setattr(optimization, "learning_rate", lambda *a, **k: real_lr(*a, **k) * boost)
    checks, real_train, real_rollback = [], pretraining.train, modes.Static.rollback

    class Injected:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def next_update(self):
            self.calls += 1
            return [inject(self.calls, boost, mb) for mb in self.inner.next_update()]

        def __getattr__(self, name):
            return getattr(self.inner, name)

    def spy_train(cfg, job, mode):
        job.input = Injected(job.input)
        return real_train(cfg, job, mode)

    def spy_rollback(self, before_step=None):
        job = self.job
        target = real_rollback(self, before_step)
        path = str(tmp_path / target)
        stored = {k: tf.train.load_variable(path, checkpointing.variable_key("model", k))
                  for k in checkpointing.module_variables(job.trainer.model)}
        checks.append((target, all(np.array_equal(v.numpy(), stored[k])
                                   for k, v in checkpointing.module_variables(job.trainer.model).items())))
        return target
    monkeypatch.setattr(pretraining, "train", spy_train)
    monkeypatch.setattr(modes.Static, "rollback", spy_rollback)
    settings = dict(model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                    max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=8, learning_rate=1e-3,
                    warmup_steps=5, total_steps=60, log_interval=2, save_interval=10, checkpoint_dir=str(tmp_path))
    settings.update(overrides)
    logs = []
    _, last = pretraining.run(pretrain_config.PretrainConfig(**settings), log=logs.append)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return last, records, checks, logs


@pytest.mark.slow
def test_a_learning_rate_blow_up_is_rolled_back_to_the_last_checkpoint_and_the_run_recovers(tiny_data, tmp_path,
                                                                                           monkeypatch):
    def blow_up(call, boost, features):
        boost.assign(3000.0 if 31 <= call <= 34 else 1.0)                # four updates at 3000x the rate
        return features
    last, records, checks, logs = _guarded_run(tiny_data, tmp_path, monkeypatch, blow_up, rollback_lr_scale=0.5,
                                               save_interval=4)
    rollbacks = [(r["from_step"], r["step"], r["lr_scale"]) for r in records if r["kind"] == "rollback"]
    assert all("above 1.5 x the running median" in r["reason"] for r in records if r["kind"] == "rollback")
    # the loss was high at 34, 36 and 38, so the save due at 36 waited and the first rollback went to 32's;
    # two updates at 3000x had already happened by then, the run diverged again before step 38 and the
    # second rollback went one checkpoint further back, to 28's, from which it recovered
    assert rollbacks == [(38, 32, 0.5), (38, 28, 0.25)], rollbacks
    assert checks == [("ckpt-32", True), ("ckpt-28", True)]               # the weights are the checkpoint's
    train = [r for r in records if r["kind"] == "train"]
    before = [r["loss"] for r in train if r["step"] <= 28][-1]
    assert train[-1]["step"] == 60 and train[-1]["loss"] < 1.2 * before and not last["stopped_early"]
    assert any("divergence guard" in line and "rolled back to ckpt-28 (step 28)" in line for line in logs)


@pytest.mark.slow
def test_a_poisoned_batch_is_skipped_after_a_rollback_and_one_that_never_ends_stops_the_run(tiny_data, tmp_path,
                                                                                          monkeypatch):
    def poison(first, last):
        def inject(call, boost, features):
            if first <= call <= last:        # infinite masked-LM weights: a NaN loss, non-finite gradients
                features = dict(features, masked_lm_weights=features["masked_lm_weights"] * float("inf"))
            return features
        return inject
    last, records, checks, _ = _guarded_run(tiny_data, tmp_path / "a", monkeypatch, poison(23, 26),
                                            max_skipped_updates=4)
    rollbacks = [r for r in records if r["kind"] == "rollback"]
    assert [(r["step"], r["from_step"]) for r in rollbacks] == [(20, 26)], rollbacks
    assert "consecutive updates skipped" in rollbacks[0]["reason"] and checks == [("ckpt-20", True)]
    assert not last["stopped_early"] and [r for r in records if r["kind"] == "train"][-1]["step"] == 60
    monkeypatch.undo()
    with pytest.raises(divergence.Diverged, match=r"diverged again .* after 2 rollback"):
        _guarded_run(tiny_data, tmp_path / "b", monkeypatch, poison(23, 10 ** 6), max_skipped_updates=4,
                     max_rollbacks=2)



# ----------------------------------------------------------------------------- wall-clock: budgets and targets
def _tiny(tiny_data, folder, **overrides):
    settings = dict(model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                    eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=8,
                    learning_rate=1e-3, warmup_steps=100, total_steps=10000, log_interval=5, save_interval=50,
                    eval_batches=2, checkpoint_dir=str(folder))
    settings.update(overrides)
    return pretrain_config.PretrainConfig(**settings)


@pytest.mark.slow
def test_a_time_budget_stretches_the_schedule_over_the_clock_and_a_restart_spends_only_what_is_left(tiny_data,
                                                                                                   tmp_path):
    from bert_tf.artifacts import checkpointing
    budget_s = 10.0
    logs = []
    # every update logged: the peak learning rate is seen even where compilation leaves few updates in 10 s
    _, last = pretraining.run(_tiny(tiny_data, tmp_path, time_budget_hours=budget_s / 3600,
                                    ladder_sequences_per_second=1.0, log_interval=1), log=logs.append)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    # the planner's line at start-up: 10,000 updates of 8 sequences at 1 seq/s do not fit 10 s
    assert any("the planner gives 22.22 h for --total_steps=10000" in line and "WARNING: they will not fit" in line
               for line in logs), logs[:6]
    assert any("stopping at step" in line and "on the time budget" in line for line in logs)
    assert not last["stopped_early"] and "eval_mlm_accuracy" in last and records[-2]["kind"] == "eval"
    assert records[-1]["kind"] == "end" and not records[-1]["stopped_early"]   # a budget's end is a finish
    predicted = train[-1]["budget_predicted_steps"]
    assert train[-1]["step"] <= predicted < 10000 and abs(predicted - train[-1]["step"]) < 0.2 * predicted
    # the schedule follows the clock: warmup over 1% of the predicted updates, then decay to ~0 at its end
    peak = max(r["learning_rate"] for r in train)
    assert peak > 0.7e-3 and train[-1]["learning_rate"] < 0.25 * peak
    first = checkpointing.latest_intact(str(tmp_path))
    spent = tf.train.load_variable(first, "clock/seconds/.ATTRIBUTES/VARIABLE_VALUE")
    assert budget_s <= spent < budget_s + 3
    # run again with twice the budget: it trains only the second half, and the clock goes on from the first
    start = [r["step"] for r in train][-1]
    _, again = pretraining.run(_tiny(tiny_data, tmp_path, time_budget_hours=2 * budget_s / 3600), log=logs.append)
    second = checkpointing.latest_intact(str(tmp_path))
    total = tf.train.load_variable(second, "clock/seconds/.ATTRIBUTES/VARIABLE_VALUE")
    steps = int(second.rsplit("-", 1)[1])
    # ~10 s more on the clock, not 20 (the first run spent more of its 10 s compiling, so it made fewer steps)
    assert 2 * budget_s <= total < 2 * budget_s + 3 and start < steps < 4 * start
    assert any(re.search(r"\(0:00:1[0-2] spent by earlier runs\)", line) for line in logs), logs


@pytest.mark.slow
def test_a_target_mlm_accuracy_stops_the_run_and_logs_the_time_to_train(tiny_data, tmp_path):
    logs = []
    _, last = pretraining.run(_tiny(tiny_data, tmp_path, target_mlm_accuracy=0.02, eval_interval=5,
                                    learning_rate=5e-3, warmup_steps=5), log=logs.append)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    target = [r for r in records if r["kind"] == "target"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(target) == 1 and target[0]["eval_mlm_accuracy"] >= 0.02 > max(r["eval_mlm_accuracy"] for r in evals[:-1])
    assert target[0]["step"] == evals[-1]["step"] < 10000 and not last["stopped_early"]
    assert 0 < target[0]["time_to_train_seconds"] < 120
    assert any(line.startswith("target reached: held-out MLM accuracy") and "time to train 0:0" in line
               for line in logs)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{target[0]['step']}")


def test_wall_clock_flags_are_checked_at_start():
    with pytest.raises(ConfigError, match="--target_mlm_accuracy needs --eval_files and --eval_interval"):
        pretrain_config.PretrainConfig(checkpoint_dir="x", vocab_file="v", target_mlm_accuracy=0.5, eval_files="e")
    with pytest.raises(ConfigError, match="--time_budget_hours with --elastic: not supported"):
        pretrain_config.PretrainConfig(checkpoint_dir="x", vocab_file="v", time_budget_hours=1, elastic=True,
                                   global_batch_size=8)
    with pytest.raises(ConfigError, match="--recompute=all: valid are none, layer"):
        pretrain_config.PretrainConfig(checkpoint_dir="x", vocab_file="v", recompute="all")
    with pytest.raises(ConfigError, match=r"--target_mlm_accuracy must be in \[0, 1\)"):
        pretrain_config.PretrainConfig(checkpoint_dir="x", vocab_file="v", target_mlm_accuracy=1.5)


def _protocol_members(protocol):
    methods = {name: inspect.signature(getattr(protocol, name)) for name, value in vars(protocol).items()
               if callable(value) and not name.startswith("_")}
    return methods, set(getattr(protocol, "__annotations__", {}))


def _same_parameters(cls, name, expected):
    got = inspect.signature(getattr(cls, name))
    return [p.name for p in got.parameters.values()] == [p.name for p in expected.parameters.values()]


def test_both_modes_and_both_training_inputs_satisfy_the_loops_protocols():
    """The loop's contracts are typing.Protocols (modes.Mode, input_pipeline.TrainingInput): every
    hook with the protocol's parameters, in both implementations; a missing hook or another signature fails."""
    import ast
    import textwrap
    import types
    from bert_tf.data import input_pipeline
    from bert_tf.train import elastic
    for protocol, implementations in ((modes.Mode, (modes.Static, elastic.Elastic)),
                                      (input_pipeline.TrainingInput, (input_pipeline.PerRankInput,
                                                                      elastic.SharedStream))):
        methods, data = _protocol_members(protocol)
        assert methods, protocol
        for cls in implementations:
            for name, signature in methods.items():
                assert hasattr(cls, name) and _same_parameters(cls, name, signature), (cls, name)
            init = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
            assigned = {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for target in node.targets
                        for t in ast.walk(target) if isinstance(t, ast.Attribute)}
            assert data <= assigned | set(vars(cls)), (cls, data - assigned)
    static = modes.Static(None, types.SimpleNamespace(samples_seen=5), print, 10)
    assert isinstance(static, modes.Mode) and static.samples_seen == 5
    stream = input_pipeline.PerRankInput(tf.data.Dataset.range(3), 1, gather=lambda b: [b])
    assert isinstance(stream, input_pipeline.TrainingInput)


def test_a_typed_record_is_written_as_its_fields_in_order_with_the_unset_ones_left_out(tmp_path):
    """metrics.TrainRecord on disk: its fields in declaration order, None fields absent (no "loss_scale": null in
    a float32 run), numbers as JSON numbers."""
    from bert_tf.artifacts import metrics
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(metrics.TrainRecord(step=2, loss=3.5, mlm_loss=3.5, learning_rate=1e-3, grad_norm=0.5,
                                     sequences_per_second=10.0, tokens_per_second=640.0, ranks=2))
    writer.close()
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert list(line)[:-1] == ["kind", "step", "loss", "mlm_loss", "learning_rate", "grad_norm",
                               "sequences_per_second", "tokens_per_second", "ranks"]
    assert line["kind"] == "train" and line["step"] == 2 and line["ranks"] == 2 and list(line)[-1] == "time"
