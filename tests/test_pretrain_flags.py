"""run/pretrain.py fails at start-up, naming the flag, when its inputs cannot work."""
import dataclasses
import glob
import json
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.parallel import comm
from bert_tf.studies import recipe_race
from bert_tf.train import pretraining
from bert_tf.train import preflight
from bert_tf.train import pretrain_config
from conftest import REPO, mpi_env


def config(tiny_data, tmp_path, **overrides):
    values = dict(model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                  eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10,
                  checkpoint_dir=str(tmp_path / "ckpt"), total_steps=2)
    values.update(overrides)
    if isinstance(values.get("comm"), dict):
        values["comm"] = comm.CommConfig(**values["comm"])
    return pretrain_config.PretrainConfig(**values)


BAD_CONFIGURATIONS = [
    (dict(max_seq_length=128), r"feature 'input_ids' has length 64 but the run expects 128 \(--max_seq_length\)"),
    (dict(max_predictions_per_seq=20), r"'masked_lm_positions' has length 10 .*--max_predictions_per_seq"),
    (dict(train_files="/nonexistent/train-*"), "no input files match '/nonexistent/train-\\*'"),
    (dict(vocab_file="/nonexistent/vocab.txt"), "vocab file not found: /nonexistent/vocab.txt"),
    (dict(micro_batch_size=0), "--micro_batch_size must be >= 1, got 0"),
    (dict(precision="fp8"), "valid: float32, mixed_bfloat16, mixed_float16"),
    (dict(init_checkpoint="/nonexistent/ckpt-1"), "--init_checkpoint=/nonexistent/ckpt-1: no such checkpoint"),
    (dict(eval_interval=10, eval_files=""), "--eval_interval needs --eval_files"),
    (dict(dynamic_masking=True), "records are already masked"),
    (dict(network_interface="nonexistent0"), "--network_interface=nonexistent0: no such interface here"),
    (dict(accumulation_steps=0), "--accumulation_steps must be >= 1, got 0"),
    (dict(comm=dict(cycle_time_ms=-1)), "--cycle_time_ms must be >= 0, got -1"),
    (dict(inter_op_threads=-2), "--inter_op_threads must be >= 0 \\(0: the default\\), got -2"),
    (dict(comm=dict(exchange="powersgd", fp16_allreduce=True)),
     "--fp16_allreduce with --exchange=powersgd: they disagree"),
    (dict(comm=dict(local_updates=4), save_interval=6),
     "--save_interval=6 and --eval_interval=0 must be multiples of --local_updates=4"),
    (dict(comm=dict(local_updates=2, exchange="onebit")), "--local_updates=2 exchanges no gradients"),
    (dict(comm=dict(local_updates=4), elastic=True, global_batch_size=64, micro_batch_size=4,
          elastic_commit_interval=10, save_interval=20, eval_interval=20), "must be a multiple of --local_updates=4"),
    (dict(comm=dict(local_updates=2, local_group="node"), elastic=True, global_batch_size=64, micro_batch_size=4),
     "--local_group=node with --elastic: not supported"),
    (dict(batch_warmup_sequences=100, elastic=True, global_batch_size=32, micro_batch_size=32),
     "with --elastic needs --global_batch_size of at least 2 micro-batches"),
    (dict(comm=dict(collective_timeout_minutes=-1)), "--collective_timeout_minutes must be >= 0"),
]


def test_thread_pools_default_to_a_fair_share_of_the_cores_and_flags_override_each():
    from bert_tf.parallel.distributed import cpu_threads
    assert cpu_threads(1, cores=2) == (2, 2) and cpu_threads(2, cores=2) == (1, 2)
    assert cpu_threads(3, cores=2) == (1, 2) and cpu_threads(4, cores=32) == (8, 2)
    assert cpu_threads(2, intra_op_threads=2, cores=2) == (2, 2)
    assert cpu_threads(1, inter_op_threads=1, cores=2) == (2, 1)
    with pytest.raises(ConfigError, match="--intra_op_threads must be >= 0"):
        cpu_threads(1, intra_op_threads=-1)


@pytest.mark.parametrize("overrides,error", BAD_CONFIGURATIONS)
def test_bad_configuration_fails_before_training(tiny_data, tmp_path, overrides, error):
    with pytest.raises(ConfigError, match=error):
        pretraining.run(config(tiny_data, tmp_path, **overrides))
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").glob("ckpt-*"))


@pytest.mark.parametrize("overrides,error", BAD_CONFIGURATIONS + [
    (dict(checkpoint_dir="{tmp}/a_file/ckpt"), "--checkpoint_dir=.*/a_file/ckpt cannot be created: .*/a_file is not a "
                                               "writable folder")])
def test_dry_run_finds_what_a_run_would_stop_at_and_writes_nothing(tiny_data, tmp_path, overrides, error):
    """--dry_run (no Horovod, no model) stops at the same bad inputs, plus a --checkpoint_dir it cannot make."""
    (tmp_path / "a_file").write_text("not a folder\n")
    overrides = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    with pytest.raises(ConfigError, match=error):
        preflight.dry_run(config(tiny_data, tmp_path, **overrides))
    assert not (tmp_path / "ckpt").exists()


def test_dry_run_says_what_the_run_would_be(tiny_data, tmp_path):
    lines = []
    preflight.dry_run(config(tiny_data, tmp_path, micro_batch_size=3, accumulation_steps=5), log=lines.append)
    vocab = len(open(tiny_data["vocab_file"]).read().splitlines())
    train, evaluation = len(glob.glob(tiny_data["train"])), len(glob.glob(tiny_data["eval"]))
    assert train >= 2 and evaluation >= 1
    assert lines[0].startswith(f"dry run: flags and inputs check out: model 2 layers, hidden 128, vocab {vocab}; "
                               f"{train} training and {evaluation} evaluation files of 64-token records; 3 x 5 "
                               "sequences per rank per update (x ranks = global batch); starts from random weights; checkpoints in "), lines
    assert not (tmp_path / "ckpt").exists()


def test_model_too_small_for_data(tiny_data, tmp_path):
    bert_config = tmp_path / "bert_config.json"
    bert_config.write_text(json.dumps({"vocab_size": 500, "hidden_size": 64, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "intermediate_size": 128,
                                       "max_position_embeddings": 512}))
    with pytest.raises(ConfigError, match="the model's vocab_size is 500"):
        pretraining.run(config(tiny_data, tmp_path, model_preset="", bert_config_file=str(bert_config)))
    with pytest.raises(ConfigError, match="give --bert_config_file or --model_preset, not both"):
        pretraining.run(config(tiny_data, tmp_path, model_preset="mini", bert_config_file=str(bert_config)))


@pytest.mark.slow
def test_unknown_flag_fails_at_start_up():
    proc = subprocess.run([sys.executable, str(REPO / "run" / "pretrain.py"), "--batch_sise=4"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "batch_sise" in proc.stderr


@pytest.mark.slow
def test_a_bad_value_is_one_line_without_traceback(tiny_data, tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "run" / "pretrain.py"), *tiny_data["flags"], "--micro_batch_size=0",
                           f"--checkpoint_dir={tmp_path}"], env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "error: --micro_batch_size must be >= 1, got 0" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_recipes_give_their_stated_global_batch():
    def read(name):
        values = {}
        for line in (REPO / "configs" / name).read_text().splitlines():
            if line.startswith("--"):
                key, _, value = line[2:].partition("=")
                values[key] = value
        return values
    known = {f.name for f in dataclasses.fields(pretrain_config.PretrainConfig) if f.name != "comm"}
    known |= {f.name for f in dataclasses.fields(comm.CommConfig)}
    for model in ("base", "large"):
        for phase, batch in (("phase1", 61440), ("phase2", 30720)):
            flags = read(f"{model}_{phase}.flags")
            assert set(flags) <= known
            assert int(flags["micro_batch_size"]) * int(flags["accumulation_steps"]) * 16 == batch
    assert read("demo.flags")["model_preset"] == "tiny"
    # the budget recipe at 4,096 sequences on 16 ranks; the race's two recipes at 128 on 2, scored alike
    for name, batch, ranks in (("budget_phase1.flags", 4096, 16), ("race_classic.flags", 128, 2),
                               ("race_budget.flags", 128, 2)):
        flags = read(name)
        assert set(flags) <= known, set(flags) - known
        assert int(flags["micro_batch_size"]) * int(flags["accumulation_steps"]) * ranks == batch
    assert set(read("budget_phase2.flags")) <= known
    assert all(read("race_classic.flags")[k] == read("race_budget.flags")[k]
               for k in ("eval_files", "eval_batches", "eval_interval", "vocab_file", "time_budget_hours", "precision"))


def test_each_one_change_race_differs_from_the_classic_recipe_in_that_change_only():
    classic = recipe_race.read_flagfile(str(REPO / "configs" / "race_classic.flags"), str(REPO))
    changes = {"masking": {"train_files", "max_predictions_per_seq", "eval_max_predictions_per_seq"},
               "no_nsp": {"mlm_only"}, "modern": {"model_preset"}, "wsd": {"schedule", "decay_fraction"},
               "batch_warmup": {"batch_warmup_sequences"},
               "contiguous": {"train_files", "mlm_only", "dynamic_masking", "eval_max_predictions_per_seq"}}
    assert {p.name for p in (REPO / "configs").glob("race_only_*.flags")} == {f"race_only_{c}.flags" for c in changes}
    for change, keys in changes.items():
        flags = recipe_race.read_flagfile(str(REPO / "configs" / f"race_only_{change}.flags"), str(REPO))
        assert {k for k in flags.keys() | classic.keys() if flags.get(k) != classic.get(k)} == keys, change
    assert recipe_race.read_flagfile(str(REPO / "configs" / "race_only_masking.flags"), str(REPO))["train_files"] \
        == "data/race/mask30/train-*"


def test_each_budget_variant_differs_from_the_budget_recipe_in_its_one_choice_only():
    """Issue 49's single-change table for the choices the budget recipe added: race_budget_with_<x>.flags
    is race_budget.flags with that one choice swapped; race_budget_matched.flags changes the size alone."""
    budget = recipe_race.read_flagfile(str(REPO / "configs" / "race_budget.flags"), str(REPO))
    changes = {"pairs": {"train_files": "data/race/budget/train-*"}, "linear_decay": {"decay_shape": "linear"},
               "theta_160k": {"global_rope_theta": "160000"}, "adamw": {"optimizer": "adamw"},
               "wd_1e-5": {"weight_decay": "1e-5"}, "mask_schedule": {"masked_lm_prob_end": "0.15"}}
    names = {p.name for p in (REPO / "configs").glob("race_budget_with_*.flags")}
    assert names == {f"race_budget_with_{c}.flags" for c in changes}
    changes = {f"with_{c}": v for c, v in changes.items()} | {"matched": {"model_preset": "modern-mini-matched"}}
    for change, swapped in changes.items():
        flags = recipe_race.read_flagfile(str(REPO / "configs" / f"race_budget_{change}.flags"), str(REPO))
        assert {k: flags[k] for k in flags.keys() | budget.keys() if flags.get(k) != budget.get(k)} == swapped


def test_fit_micro_batch_re_splits_the_per_rank_batch_or_names_why_it_cannot(tiny_data, tmp_path):
    asked = config(tiny_data, tmp_path, micro_batch_size=8, accumulation_steps=2, fit_micro_batch=4)
    cfg = asked.resolved()
    assert (cfg.micro_batch_size, cfg.accumulation_steps, cfg.fit_micro_batch) == (4, 4, 0)
    assert (asked.micro_batch_size, asked.accumulation_steps, asked.fit_micro_batch) == (8, 2, 4)  # checked, not changed
    assert cfg.resolved() == cfg and dataclasses.replace(cfg).micro_batch_size == 4     # resolving again changes nothing
    with pytest.raises(ConfigError, match=r"--fit_micro_batch=3: the per-rank batch --micro_batch_size x "
                                          r"--accumulation_steps = 8 x 2 = 16 is not a positive multiple"):
        config(tiny_data, tmp_path, micro_batch_size=8, accumulation_steps=2, fit_micro_batch=3)
    elastic = config(tiny_data, tmp_path, micro_batch_size=8, elastic=True, global_batch_size=32, fit_micro_batch=4).resolved()
    assert (elastic.micro_batch_size, elastic.accumulation_steps, elastic.global_batch_size) == (4, 1, 32)


@pytest.mark.slow
def test_a_flagfile_with_the_old_batch_flag_still_works_with_a_warning_naming_the_new_one(tiny_data, tmp_path):
    """--batch_size was the micro-batch's name until this release: a flagfile that still says it runs,
    warned; the run is what --micro_batch_size would give."""
    old = tmp_path / "old.flags"
    flags = [f for f in tiny_data["flags"] if not f.startswith("--micro_batch_size=")]
    old.write_text("\n".join([*flags, "--batch_size=3", f"--checkpoint_dir={tmp_path / 'ckpt'}"]) + "\n")
    proc = subprocess.run([sys.executable, str(REPO / "run" / "pretrain.py"), f"--flagfile={old}", "--dry_run"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: --batch_size is deprecated and goes in the next release: use --micro_batch_size" in proc.stderr
    assert "; 3 x 1 sequences per rank per update" in proc.stdout


def test_the_old_and_the_new_name_of_a_flag_together_fail_at_start_up_naming_both(tmp_path):
    from absl import flags as absl_flags
    from bert_tf import cli
    from bert_tf.train.pretrain_config import PretrainConfig
    fv = absl_flags.FlagValues()
    cli.define_config_flags(PretrainConfig, fv)
    cli.define_renamed("batch_size", "micro_batch_size", fv)
    flagfile = tmp_path / "both.flags"
    flagfile.write_text("--batch_size=8\n")
    fv(["pretrain.py", f"--flagfile={flagfile}", "--micro_batch_size=4"])
    with pytest.raises(ConfigError, match="--batch_size and --micro_batch_size both given: --batch_size is the old "
                                          "name of --micro_batch_size"):
        cli.apply_renamed(warn=lambda message: None)
    fv.unparse_flags()
    fv(["pretrain.py", f"--flagfile={flagfile}"])
    said = []
    cli.apply_renamed(warn=said.append)
    assert fv.micro_batch_size == 8 and said == [
        "warning: --batch_size is deprecated and goes in the next release: use --micro_batch_size (Sequences per "
        "rank per forward/backward pass (one micro-batch))"]


def test_the_old_exchange_flags_still_work_with_a_warning_and_the_old_and_new_name_together_fail(monkeypatch):
    """--gradient_compression and --fp16_allreduce were --exchange's names until this release (issue 48)."""
    from absl import flags as absl_flags
    from bert_tf import cli
    from bert_tf.train.pretrain_config import PretrainConfig
    monkeypatch.setattr(cli, "_RENAMED", [])        # only this test's flags, none another test left
    monkeypatch.setattr(cli, "_SYNONYMS", [])
    fv = absl_flags.FlagValues()
    cli.define_config_flags(PretrainConfig, fv)
    for script in ("pretrain.py", "plan.py"):        # as the scripts that take the exchange flags register them
        source = (REPO / "run" / script).read_text()
        assert 'cli.define_renamed("gradient_compression", "exchange")' in source, script
        assert 'cli.define_synonym("fp16_allreduce", "exchange", "fp16")' in source, script
    cli.define_renamed("gradient_compression", "exchange", fv)
    cli.define_synonym("fp16_allreduce", "exchange", "fp16", fv)
    base = ["pretrain.py", "--vocab_file=v", "--checkpoint_dir=c"]
    said = []
    fv([*base, "--gradient_compression=powersgd"])
    cli.apply_renamed(warn=said.append)
    assert cli.config_from_flags(PretrainConfig, fv).comm.exchange == "powersgd"
    assert len(said) == 1 and said[0].startswith(
        "warning: --gradient_compression is deprecated and goes in the next release: use --exchange")
    fv.unparse_flags()
    fv([*base, "--gradient_compression=powersgd", "--exchange=onebit"])
    with pytest.raises(ConfigError, match="--gradient_compression and --exchange both given"):
        cli.apply_renamed(warn=said.append)
    fv.unparse_flags()
    said.clear()
    fv([*base, "--fp16_allreduce"])
    cli.apply_renamed(warn=said.append)
    assert cli.config_from_flags(PretrainConfig, fv).comm.exchange == "fp16"
    assert said == ["warning: --fp16_allreduce is deprecated and goes in the next release: use --exchange=fp16"]
    fv.unparse_flags()
    fv([*base, "--fp16_allreduce", "--exchange=powersgd"])
    cli.apply_renamed(warn=said.append)
    with pytest.raises(ConfigError, match="--fp16_allreduce with --exchange=powersgd: they disagree"):
        cli.config_from_flags(PretrainConfig, fv)


def test_every_pretraining_flag_is_a_config_field_with_its_help_and_the_config_round_trips():
    """The flags of run/pretrain.py come from PretrainConfig's fields (one name, default and help each)."""
    from absl import flags as absl_flags
    from bert_tf import cli
    from bert_tf.train.pretrain_config import PretrainConfig
    fv = absl_flags.FlagValues()
    cli.define_config_flags(PretrainConfig, fv)
    fields = {f.name for f in dataclasses.fields(PretrainConfig) if f.name != "comm"}
    assert set(fv) == fields | {f.name for f in dataclasses.fields(comm.CommConfig)}
    assert all(fv[name].help for name in fv)
    assert fv["precision"].parser.enum_values == ["float32", "mixed_bfloat16", "mixed_float16"]
    fv(["pretrain.py", "--vocab_file=v", "--checkpoint_dir=c", "--micro_batch_size=6", "--fp16_allreduce",
        "--recompute=layer"])
    cfg = cli.config_from_flags(PretrainConfig, fv)
    assert (cfg.micro_batch_size, cfg.comm.fp16_allreduce, cfg.recompute, cfg.seed) == (6, True, "layer", 12345)
    with pytest.raises(absl_flags.IllegalFlagValueError):
        fv(["pretrain.py", "--recompute=all"])
