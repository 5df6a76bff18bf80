"""The recipe race's report (bert_tf/studies/recipe_race.py, run/recipe_race.py --report_only) on runs
written here: the curves, the time each recipe takes to reach the other's final accuracy, the plot."""
import dataclasses
import json
import os
import math
import re
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.studies import emulated_cluster as ec, race_launch, race_planner, recipe_race
from conftest import REPO


def write_run(folder, t0, evals, rate=50.0, batch=100):
    """A metrics.jsonl: the run record at t0, a train record per evaluation, evals [(seconds, accuracy)]."""
    folder.mkdir(parents=True)
    records = [{"kind": "run", "step": 0, "time": t0}]
    for i, (seconds, accuracy) in enumerate(evals, 1):
        records.append({"kind": "train", "step": 10 * i, "time": t0 + seconds - 1, "samples_seen": 10 * i * batch,
                        "sequences_per_second": rate})
        records.append({"kind": "eval", "step": 10 * i, "time": t0 + seconds, "eval_mlm_accuracy": accuracy,
                        "eval_mlm_loss": 10.0 - accuracy})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def race(tmp_path):
    write_run(tmp_path / "classic", 1000.0, [(600, 0.10), (1200, 0.20), (1800, 0.30)])
    write_run(tmp_path / "budget", 5000.0, [(300, 0.15), (600, 0.30), (900, 0.36), (1800, 0.45)], rate=80.0)
    return tmp_path


def test_time_to_reach_the_other_recipe_s_final_accuracy(race):
    runs = {name: recipe_race.curve(str(race / name)) for name in ("classic", "budget")}
    assert runs["classic"]["seconds"] == [600, 1200, 1800] and runs["budget"]["samples_seen"][-1] == 4000
    summary = recipe_race.summarize(runs)
    reach = summary["budget"]["reaches"]["classic"]
    assert reach == {"accuracy": 0.30, "seconds": 600, "fraction_of_their_time": 600 / 1800, "updates": 20,
                     "update_factor": 20 / 30}
    assert summary["classic"]["reaches"]["budget"]["seconds"] is None      # never got to 0.45
    assert summary["budget"]["sequences_per_second"] == 80.0
    lines = recipe_race.describe(summary)
    assert "  reaches classic's final 0.3000 in 10.0 min (0.33 of classic's time), after 20 updates (x0.67 classic's)" \
        in lines
    assert "  reaches budget's final 0.4500 never" in lines


def test_a_run_s_model_size_is_read_from_its_folder_for_the_size_matched_arms(tmp_path):
    """Parameters from the run record; the layers' parameters and forward FLOPs per token from its
    bert_config.json and sequence length, in the race's lines (and over seeds, once: one model)."""
    from bert_tf.model.config import BertConfig
    from bert_tf.studies import race_seeds
    runs = {}
    for name, preset in (("classic", "mini"), ("matched", "modern-mini-matched")):
        write_run(tmp_path / name, 0.0, [(600, 0.10)])
        (tmp_path / name / "bert_config.json").write_text(json.dumps(BertConfig.preset(preset).to_dict()))
        records = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        records[0] = json.dumps({"kind": "run", "step": 0, "time": 0.0, "parameters": 11267900,
                                 "config": {"max_seq_length": 128}})
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(records) + "\n")
        runs[name] = recipe_race.curve(str(tmp_path / name))
    lines = recipe_race.describe(recipe_race.summarize(runs))
    assert "  model: 11.27 M parameters, 3.16 M in its layers, 6.82 MFLOP per token in them" in lines
    assert "  model: 11.27 M parameters, 3.15 M in its layers, 6.82 MFLOP per token in them" in lines
    over_seeds = race_seeds.describe_seeds(race_seeds.summarize_seeds({n: [c, c] for n, c in runs.items()}))
    assert sum("  model: 11.27 M parameters" in line for line in over_seeds) == 2
    write_run(tmp_path / "bare", 0.0, [(600, 0.10)])                  # a run without them: no line
    assert not any("model:" in line for line in recipe_race.describe(
        recipe_race.summarize({"bare": recipe_race.curve(str(tmp_path / "bare"))})))


def test_the_report_script_draws_and_checks_the_recipes(race):
    flags = race / "a.flags"
    flags.write_text("--eval_files=data/x/eval-*\n--eval_batches=30\n")
    other = race / "b.flags"
    other.write_text("--eval_files=data/y/eval-*\n--eval_batches=30\n")
    cmd = [sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={race}", "--report_only"]
    proc = subprocess.run(cmd + [f"--recipes=classic={flags},budget={flags}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "budget: final held-out MLM accuracy 0.4500 after 30.0 min (40 updates, 4,000 sequences" in proc.stdout
    assert (race / "race.png").stat().st_size > 10000 and json.load(open(race / "race.json"))["summary"]
    proc = subprocess.run(cmd + [f"--recipes=classic={flags},budget={other}"], capture_output=True, text=True)
    assert proc.returncode != 0 and "must evaluate on the same held-out records" in proc.stderr
    with pytest.raises(ConfigError, match="has not run"):
        recipe_race.curve(str(race / "missing"))


@pytest.mark.slow
@pytest.mark.long   # a study's own run (pytest.ini): out of the default run
def test_a_race_of_two_tiny_recipes_runs_both_and_reports(tiny_data, tmp_path):
    """run/recipe_race.py end to end: a classic tiny and a modern tiny (MLM only, AdamW, wsd, batch warmup)
    raced for a few updates each on 2 ranks, scored on the same held-out records."""
    from bert_tf.model import modeling
    size = sum(1 for _ in open(tiny_data["vocab_file"]))
    config = tmp_path / "modern.json"
    modeling.BertConfig.preset("modern-tiny", vocab_size=size, local_attention=32).to_json_file(str(config))
    common = [f for f in tiny_data["flags"] if not f.startswith(("--model_preset", "--log_interval"))]
    common += ["--total_steps=6", "--eval_interval=3", "--log_interval=3", "--save_interval=100"]
    (tmp_path / "classic.flags").write_text("\n".join(common + ["--model_preset=tiny"]) + "\n")
    (tmp_path / "budget.flags").write_text("\n".join(common + [
        f"--bert_config_file={config}", "--mlm_only", "--optimizer=adamw", "--adam_beta2=0.98",
        "--schedule=wsd", "--accumulation_steps=2", "--batch_warmup_sequences=16"]) + "\n")
    out = tmp_path / "race"
    proc = subprocess.run([sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={out}",
                           f"--recipes=classic={tmp_path / 'classic.flags'},budget={tmp_path / 'budget.flags'}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    race = json.load(open(out / "race.json"))
    assert [len(race["curves"][name]["accuracy"]) for name in ("classic", "budget")] == [2, 2]   # steps 3 and 6
    assert race["summary"]["budget"]["steps"] == 6 and (out / "race.png").exists()
    assert "classic: final held-out MLM accuracy" in proc.stdout and "reaches budget's final" in proc.stdout


def write_timed_run(folder, comm, records, config_preset="modern-tiny", resolved=None):
    """A finished run as the emulated race reads it: the run record (its config's comm settings and batch; the
    comm as run, `resolved`, when it differs), bert_config.json and `records` after it."""
    from bert_tf.model import modeling
    folder.mkdir(parents=True)
    cfg = {"comm": comm, "micro_batch_size": 8, "accumulation_steps": 2, "mlm_only": True, "max_seq_length": 128,
           "log_interval": 10, "total_steps": 40}
    run = {"kind": "run", "step": 0, "time": 0.0, "config": cfg}
    if resolved:
        run["resolved"] = dict(cfg, comm=resolved)
    lines = [run] + records
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    modeling.BertConfig.preset(config_preset, vocab_size=1000).to_json_file(str(folder / "bert_config.json"))


def train(step, rate, compute=0.5, **more):
    return {"kind": "train", "step": step, "time": float(step), "sequences_per_second": rate,
            "compute_seconds": compute, "wait_seconds": 0.0, "update_seconds": 0.0, "samples_seen": step * 32, **more}


def test_the_emulated_race_measures_between_evaluations_and_asks_the_planner(tmp_path):
    """Training speed comes from the intervals with no evaluation inside, after the first (compilation) and
    after a compressed exchange's float32 warmup; the planner gets the run's own compute speed and link."""
    from bert_tf.parallel.comm import CommConfig
    from bert_tf.model import modeling
    from bert_tf.tools import model_shapes
    comm = dataclasses.asdict(CommConfig(exchange="fp16", cycle_time_ms=0))
    sent = {"tx_bytes_per_update": 4e5}
    records = [train(10, 1.0), train(20, 20.0, **sent), {"kind": "eval", "step": 20, "time": 21.0,
               "eval_mlm_accuracy": 0.1}, train(30, 2.0, **sent), train(40, 30.0, **sent)]
    write_timed_run(tmp_path / "fp16", comm, records)
    assert [r["step"] for r in race_planner.training_intervals(records)] == [20, 40]
    got = race_planner.planned_vs_measured(str(tmp_path / "fp16"), nodes=2, rate_gbit=0.1)
    assert got["measured"] == pytest.approx(2 / (1 / 20 + 1 / 30))          # not the first, not after the eval
    assert got["device_seq_s"] == pytest.approx(16 / 0.5)
    assert got["scaling_efficiency"] == pytest.approx(got["measured"] / (2 * 32))   # 2 ranks' own speed
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("modern-tiny", vocab_size=1000), nsp=False)
    fp16_bytes = 2 * sum(map(math.prod, shapes))
    exchange = fp16_bytes / (0.1e9 / 8)                      # 2 nodes: a ring sends the whole buffer once
    assert got["predicted_exchange_seconds"] == pytest.approx(exchange, rel=1e-6)
    assert got["predicted_sequences_per_second"] == pytest.approx(32 / (0.5 + exchange), rel=1e-6)
    probed = race_planner.planned_vs_measured(str(tmp_path / "fp16"), 2, 0.1, {"effective_gbit": 0.05,
                                                                              "message_seconds": 0.001})
    assert probed["predicted_exchange_seconds"] == pytest.approx(fp16_bytes / (0.05e9 / 8) + 0.001, rel=1e-6)
    curve = recipe_race.curve(str(tmp_path / "fp16"))
    assert curve["bytes_per_update"] == 4e5
    summary = recipe_race.summarize({"fp16": {**curve, "planner": got}}, target=0.1)
    assert summary["fp16"]["target"] == {"accuracy": 0.1, "seconds": 21.0}
    lines = recipe_race.describe(summary)
    assert f"  0.40 MB sent per update by rank 0's node (the planner: {fp16_bytes / 1e6:.2f})" in lines and "  reaches 0.1000 in 0.3 min" in lines
    # a compressed run: the intervals of its float32 warmup are not its speed
    comm = dataclasses.asdict(CommConfig(exchange="powersgd", compression_warmup_steps=15))
    write_timed_run(tmp_path / "powersgd", comm, [train(10, 1.0), train(20, 5.0), train(30, 40.0)])
    got = race_planner.planned_vs_measured(str(tmp_path / "powersgd"), nodes=2, rate_gbit=0.1)
    assert got["measured"] == 40.0 and got["compression_seconds"] > 0
    # --exchange=auto: the planner takes the exchange the run chose
    write_timed_run(tmp_path / "auto", dataclasses.asdict(CommConfig(exchange="auto")),
                    [train(10, 1.0), train(20, 5.0), train(30, 40.0)], resolved=comm)
    assert race_planner.planned_vs_measured(str(tmp_path / "auto"), nodes=2, rate_gbit=0.1)["compression_seconds"] > 0
    # --local_updates: the bytes averaged over the run's rounds (40 updates, one float16 exchange every 4),
    # not over one update's share of a round (which rounds to none)
    write_timed_run(tmp_path / "local", dataclasses.asdict(CommConfig(local_updates=4, outer_delta_bits=16)),
                    [train(10, 1.0), train(20, 5.0), train(30, 40.0)])
    local = race_planner.planned_vs_measured(str(tmp_path / "local"), nodes=2, rate_gbit=0.1)
    assert local["predicted_bytes"] == pytest.approx(fp16_bytes / 4, rel=1e-3)


def test_the_link_for_an_efficiency_inverts_the_planner_on_the_runs_own_speed(tmp_path):
    """A float16 run computing an update of 16 sequences per rank in 0.5 s: on 2 nodes the ring sends the whole
    buffer once, so 25% efficiency (0.5 / (0.5 + exchange)) needs a 1.5 s exchange; a probe's measured/set ratio
    (0.05 of 0.1) and per-message cost carry over to the new rate."""
    from bert_tf.parallel.comm import CommConfig
    from bert_tf.model import modeling
    from bert_tf.tools import model_shapes
    comm = dataclasses.asdict(CommConfig(exchange="fp16", cycle_time_ms=0))
    write_timed_run(tmp_path / "fp16", comm, [train(10, 1.0), train(20, 20.0), train(30, 2.0)])
    shapes = model_shapes.gradient_tensor_shapes(modeling.BertConfig.preset("modern-tiny", vocab_size=1000), nsp=False)
    bits = 8 * 2 * sum(map(math.prod, shapes))
    got = race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 0.25)
    assert got["link_gbit"] == pytest.approx(bits / 1.5 / 1e9, rel=1e-6) == got["effective_gbit"]
    assert got["scaling_efficiency"] == pytest.approx(0.25, rel=1e-6)
    assert got["exchange_seconds_per_update"] == pytest.approx(1.5, rel=1e-6) and got["device_seq_s"] == 32
    probe = {"effective_gbit": 0.05, "message_seconds": 0.001}
    probed = race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 0.25, probe, probed_gbit=0.1)
    assert probed["effective_gbit"] == pytest.approx(bits / 1.499 / 1e9, rel=1e-6)
    assert probed["link_gbit"] == pytest.approx(2 * probed["effective_gbit"], rel=1e-9)
    assert race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 0.8)["link_gbit"] > got["link_gbit"]
    with pytest.raises(ConfigError, match="in \\(0, 1\\)"):
        race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 1.0)
    with pytest.raises(ConfigError, match="needs the rate it was made at"):
        race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 0.25, probe)
    with pytest.raises(ConfigError, match="out of reach"):     # 0.5 s per message: 25% is never reached
        race_planner.link_for_efficiency(str(tmp_path / "fp16"), 2, 0.25, dict(probe, message_seconds=5.0), 0.1)
    with pytest.raises(ConfigError, match="--link_for_efficiency=0.25 needs a value in \\(0, 1\\) and --nodes"):
        recipe_race.RaceConfig(recipes=["a=b"], output_dir="x", link_for_efficiency=0.25, nodes=1)
    with pytest.raises(ConfigError, match="--link_probe is read by --link_for_efficiency only"):
        recipe_race.RaceConfig(recipes=["a=b"], output_dir="x", link_probe="link.json", nodes=4)


def test_the_link_for_an_efficiency_from_the_command_line(tmp_path):
    """run/recipe_race.py --link_for_efficiency prints each finished run's link, and names a missing run."""
    from bert_tf.parallel.comm import CommConfig
    comm = dataclasses.asdict(CommConfig(exchange="fp16", cycle_time_ms=0))
    write_timed_run(tmp_path / "fp16", comm, [train(10, 1.0), train(20, 20.0), train(30, 2.0)])
    (tmp_path / "probe.json").write_text(json.dumps({"effective_gbit": 0.05, "message_seconds": 0.001}))
    flags = tmp_path / "fp16.flags"
    flags.write_text("--eval_files=held\n--eval_batches=2\n")
    command = [sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={tmp_path}", "--nodes=2",
               "--link_gbit=0.1", f"--link_probe={tmp_path / 'probe.json'}", "--link_for_efficiency=0.25"]
    proc = subprocess.run(command + [f"--recipes=fp16={flags}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"fp16: 25% scaling efficiency on 2 nodes at --link_gbit=[\d.e-]+ \(effective [\d.e-]+ Gbit/s\); "
                     r"per rank 32\.00 seq/s without communication: an update computes in 0\.5 s and exchanges in "
                     r"1\.5 s", proc.stdout), proc.stdout
    proc = subprocess.run(command + [f"--recipes=gone={flags}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "gone: no finished run (metrics.jsonl) to measure" in proc.stderr, proc.stderr


@pytest.mark.cluster
@pytest.mark.long   # a study's own run (pytest.ini): out of the default run
@pytest.mark.skipif(ec.preflight() is not None, reason=f"emulated cluster unavailable: {ec.preflight()}")
def test_a_race_on_emulated_nodes_counts_the_bytes_each_exchange_sends(tiny_data, tmp_path):
    """run/recipe_race.py --nodes=2: float16 allreduce against DiLoCo every 2 updates on two emulated nodes; the
    bytes rank 0's node sent per update (its link's counter) and the planner's prediction beside each."""
    common = [f for f in tiny_data["flags"] if not f.startswith("--log_interval")]
    common += ["--total_steps=8", "--eval_interval=4", "--log_interval=2", "--save_interval=100"]
    (tmp_path / "fp16.flags").write_text("\n".join(common + ["--exchange=fp16"]) + "\n")
    (tmp_path / "diloco.flags").write_text("\n".join(common + ["--local_updates=2"]) + "\n")
    out = tmp_path / "race"
    proc = subprocess.run([sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={out}", "--nodes=2",
                           "--link_gbit=1", "--target_accuracy=0.01",
                           f"--recipes=fp16={tmp_path / 'fp16.flags'},diloco={tmp_path / 'diloco.flags'}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.load(open(out / "race.json"))["summary"]
    fp16, diloco = summary["fp16"], summary["diloco"]
    assert fp16["bytes_per_update"] > 1.5 * diloco["bytes_per_update"] > 0     # one float16 exchange per 2 updates
    assert fp16["planner"]["predicted_bytes"] == pytest.approx(2 * diloco["planner"]["predicted_bytes"])
    assert "2 emulated nodes at 1 Gbit/s" in json.load(open(out / "race.json"))["title"]
    assert "MB sent per update by rank 0's node" in proc.stdout and "planner:" in proc.stdout
    link = json.load(open(out / "link.json"))              # the link as probed after the recipes: the planner's
    assert 0.2 < link["effective_gbit"] <= 1.05 and fp16["planner"]["predicted_exchange_seconds"] > 0


def test_a_launch_that_dies_before_the_run_begins_is_tried_once_more(tmp_path):
    """OpenMPI's daemons on emulated nodes sometimes fail before any rank starts: the race launches again,
    once; a run that failed after it began (metrics.jsonl written) is not repeated."""
    marker, run_dir = tmp_path / "tried", tmp_path / "run"
    fake = tmp_path / "fake_mpirun.py"         # stands in for mpirun: fails the first time, then succeeds
    fake.write_text(f"import os, sys\np = {str(marker)!r}\n"
                    "if not os.path.exists(p): open(p, 'w').close(); sys.exit(213)\n")
    race_launch.launch("x.flags", str(run_dir), 2, log=lambda *a: None, mpirun=[sys.executable, str(fake)])
    assert marker.exists()
    failing = tmp_path / "fail_after_start.py"
    failing.write_text(f"import sys\nopen({str(run_dir / 'metrics.jsonl')!r}, 'a').write('x')\nsys.exit(1)\n")
    with pytest.raises(RuntimeError, match="exited 1"):
        race_launch.launch("x.flags", str(run_dir), 2, log=lambda *a: None, mpirun=[sys.executable, str(failing)])
    assert open(run_dir / "metrics.jsonl").read() == "x"          # launched once only


def test_a_race_spanning_sessions_runs_only_what_is_left_and_names_mixed_machines(tmp_path):
    """A run whose metrics.jsonl ends with an "end" record that did not stop early is not run again; one cut
    short or stopped by a signal is moved aside to run again whole; a folder holding a sweep, or a run from
    before runs recorded their end, is an error, never moved. Curves from different machines are named."""
    from bert_tf.studies import race_seeds

    def run(name, *records):
        (tmp_path / name).mkdir()
        lines = [{"kind": "run", "step": 0, "device": {"cpu": "x"}}, *records]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return str(tmp_path / name)
    done = run("done", {"kind": "eval", "step": 9}, {"kind": "end", "step": 9, "stopped_early": False})
    signalled = run("signalled", {"kind": "end", "step": 4, "stopped_early": True})
    cut = run("cut", {"kind": "train", "step": 4})
    assert not race_launch.to_run(done) and os.path.exists(done)
    for folder in (signalled, cut):
        assert race_launch.to_run(folder) and not os.path.exists(folder)
        assert os.path.exists(folder + ".interrupted/metrics.jsonl")
    assert race_launch.to_run(str(tmp_path / "never"))
    # seed by seed: a session's end leaves whole seeds, each seed's recipes on one machine
    cfg = recipe_race.RaceConfig(recipes=["a=x", "b=y"], output_dir="o", seeds=[1, 2])
    assert [(n, k, d) for n, _, k, d in cfg.runs({"a": "x", "b": "y"})] == [
        ("a", 1, "o/a/seed1"), ("b", 1, "o/b/seed1"), ("a", 2, "o/a/seed2"), ("b", 2, "o/b/seed2")]
    (tmp_path / "old").mkdir()                                  # no "device", no "end": from before
    (tmp_path / "old" / "metrics.jsonl").write_text(json.dumps({"kind": "run", "step": 0}) + "\n")
    (tmp_path / "sweeps" / "sweep").mkdir(parents=True)
    for folder, why in (("old", "before runs recorded their end"), ("sweeps", "holds a sweep")):
        with pytest.raises(ConfigError, match=why):
            race_launch.to_run(str(tmp_path / folder))
        assert (tmp_path / folder).exists()
    one, other = {"cpu": "AMD EPYC", "cpu_count": 2}, {"cpu": "Intel Xeon", "cpu_count": 2}
    assert race_seeds.machines({"a": [{"device": one}, {"device": one}], "b": [{"device": one}, {}]}) == [
        json.dumps(one, sort_keys=True)]
    assert len(race_seeds.machines({"a": [{"device": one}], "b": [{"device": other}]})) == 2
    # a plot's title names the runs' machine, not the one drawing it, and says when there were several
    here = {"cpu": "here", "cpu_count": 8, "cpu_features": ["avx2"]}
    assert race_seeds.ran_on({"a": [{"device": one}, {}]}, lambda: here) == "AMD EPYC (2 cores; )"
    assert race_seeds.ran_on({"a": [{}]}, lambda: here) == "here (8 cores; avx2)"
    assert race_seeds.ran_on({"a": [{"device": one}], "b": [{"device": other}]}, lambda: here).startswith(
        "2 different machines")


def test_the_time_to_reach_is_interpolated_between_the_evaluations_around_it(race):
    """budget's curve: 0.15 at 300 s (update 10), 0.30 at 600 s (update 20): it crosses 0.25 two thirds of the way,
    at 500 s and update 16.7, not at the grid's 600 s; at or above the first evaluation it is that evaluation."""
    budget = recipe_race.curve(str(race / "budget"))
    seconds, updates = recipe_race.first_reach(budget, 0.25)
    assert seconds == pytest.approx(500.0) and updates == pytest.approx(50 / 3)
    assert recipe_race.first_reach(budget, 0.10) == (300, 10)
    assert recipe_race.first_reach(budget, 0.30) == (600, 20)
    assert recipe_race.first_reach(budget, 0.50) == (None, None)
    assert recipe_race.time_to_reach(budget, 0.40) == pytest.approx(900 + (0.04 / 0.09) * 900)


def test_over_seeds_each_figure_has_its_mean_and_spread_and_the_times_pair_seed_with_seed(tmp_path):
    """run/recipe_race.py --seeds=1,2 --report_only on runs written per seed: final accuracy as mean ± sd (s.e.),
    the time to reach the other's final accuracy taken seed by seed (seed 2 of budget never reaches seed 2 of
    classic: 1 of 2 seeds), and every seed's curve in race.json."""
    from bert_tf.studies import race_seeds
    write_run(tmp_path / "classic" / "seed1", 0.0, [(600, 0.20), (1200, 0.30)])
    write_run(tmp_path / "classic" / "seed2", 0.0, [(600, 0.20), (1200, 0.34)])
    write_run(tmp_path / "budget" / "seed1", 0.0, [(300, 0.25), (600, 0.35)])
    write_run(tmp_path / "budget" / "seed2", 0.0, [(300, 0.25), (600, 0.33)])
    flags = tmp_path / "a.flags"
    flags.write_text("--eval_files=data/x/eval-*\n--eval_batches=30\n")
    proc = subprocess.run([sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={tmp_path}",
                           "--report_only", "--seeds=1,2", f"--recipes=classic={flags},budget={flags}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.load(open(tmp_path / "race.json"))
    budget = report["summary_over_seeds"]["budget"]
    assert budget["final_accuracy"]["mean"] == pytest.approx(0.34)
    assert budget["final_accuracy"]["sd"] == pytest.approx(math.sqrt(2) * 0.01)
    assert budget["final_accuracy"]["se"] == pytest.approx(0.01)
    reach = budget["reaches"]["classic"]
    # seed 1: 0.30 crossed between (300 s, 0.25) and (600 s, 0.35): 450 s; seed 2 never reaches 0.34
    assert reach["reached"] == 1 and reach["seconds"]["mean"] == pytest.approx(450.0)
    assert len(report["curves"]["classic"]) == 2
    assert "budget: final held-out MLM accuracy 0.3400 ± 0.0141 (s.e. 0.0100) over 2 seeds" in proc.stdout
    assert "  reaches classic's final in 7.5 ± 0.0 (s.e. 0.0) min on 1/2 seeds" in proc.stdout
    assert race_seeds.spread([None, None]) == {"n": 0, "mean": None}
    one = {"a": {"seeds": 1, "final_accuracy": race_seeds.spread([0.07]), "seconds": race_seeds.spread([1800.0]),
                 "reaches": {"b": {"reached": 0, "seconds": race_seeds.spread([None]),
                                   "fraction_of_their_time": race_seeds.spread([None])}}}}
    assert race_seeds.describe_seeds(one) == [
        "a: final held-out MLM accuracy 0.0700 ± 0.0000 (s.e. 0.0000) over 1 seed, after 30.0 ± 0.0 (s.e. 0.0) min",
        "  never reaches b's final (0/1 seeds)"]
    with pytest.raises(ConfigError, match="--seeds=1,1: a seed given twice"):
        recipe_race.RaceConfig(recipes=["a=b"], output_dir="x", seeds=[1, 1])


def test_over_seeds_an_emulated_race_gives_bytes_planner_error_and_efficiency_their_spread():
    """The communication race over seeds: what rank 0's node sent per update, the planner's error and the
    scaling efficiency each as mean ± sd (s.e.); a race without them (on one machine) shows none."""
    from bert_tf.studies import race_seeds

    def curve(accuracy, sent=None, error=None, efficiency=None, planned=None):
        out = {"seconds": [60.0, 120.0], "step": [10, 20], "samples_seen": [640, 1280], "instances": [640, 1280],
               "tokens": [1, 2], "accuracy": [0.05, accuracy], "sequences_per_second": 10.0}
        if sent:
            out.update(bytes_per_update=sent, planner={"error": error, "scaling_efficiency": efficiency,
                                                       "predicted_wire_bytes": planned})
        return out

    summary = race_seeds.summarize_seeds({"fp16": [curve(0.10, 30e6, 0.1, 0.2, 29e6), curve(0.12, 32e6, 0.3, 0.4, 31e6)],
                                          "local": [curve(0.11, 0.5e6, -0.1, 0.9), curve(0.11, 0.5e6, 0.1, 0.9)]})
    assert summary["fp16"]["bytes_per_update"]["mean"] == pytest.approx(31e6)
    assert summary["fp16"]["planner_error"]["mean"] == pytest.approx(0.2)
    assert summary["local"]["scaling_efficiency"]["sd"] == 0.0
    lines = race_seeds.describe_seeds(summary)
    assert "  31.00 ± 1.41 (s.e. 1.00) MB sent per update by rank 0's node (the planner: 30.00 ± 1.41 (s.e. 1.00))" in lines
    assert "  0.50 ± 0.00 (s.e. 0.00) MB sent per update by rank 0's node" in lines    # no prediction: none shown
    assert "  planner 20 ± 14 (s.e. 10) % off the measured speed; scaling efficiency 30 ± 14 (s.e. 10) %" in lines
    plain = race_seeds.summarize_seeds({"a": [curve(0.1)], "b": [curve(0.2)]})
    assert "bytes_per_update" not in plain["a"] and "planner_error" not in plain["a"]


def test_the_race_counts_instances_and_tokens_not_only_rows():
    """Packed rows hold several instances and fewer useful tokens than their length: each interval's rows are
    converted by the ratio of its rates (1.5 instances and 60 non-padding tokens per row here; a record without
    those rates: one instance per row, its padded tokens)."""
    train = [{"kind": "train", "step": 10, "samples_seen": 1000, "sequences_per_second": 100.0,
              "instances_per_second": 150.0, "useful_tokens_per_second": 6000.0},
             {"kind": "train", "step": 20, "samples_seen": 3000, "sequences_per_second": 200.0,
              "instances_per_second": 400.0, "useful_tokens_per_second": 10000.0},
             {"kind": "train", "step": 30, "samples_seen": 3500, "sequences_per_second": 50.0,
              "tokens_per_second": 3200.0}]
    counts = recipe_race.trained_counts(train)
    assert counts[10] == (1000, 1500.0, 60000)
    assert counts[20] == (3000, 1500.0 + 4000.0, 60000 + 100000)
    assert counts[30] == (3500, 5500.0 + 500.0, 160000 + 32000)


def test_a_sweep_gives_each_recipe_the_same_effort_and_writes_its_best_setting_as_a_flagfile(tmp_path):
    """run/recipe_race.py --sweep_learning_rates (5 rates over 30x) x --sweep_warmup_steps, LAMB and AdamW for
    classic only, --report_only on runs written per setting: sweep.json ranks each recipe's settings by final
    held-out accuracy, and <name>.best.flags is its flagfile then the best setting (read back as the race reads
    flagfiles). Too few rates, too narrow a span, no budget, or an optimizer for a recipe not raced fail at
    start."""
    from bert_tf.studies import race_sweep
    rates, warmups = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], [10, 50]
    flags = tmp_path / "a.flags"
    flags.write_text("--eval_files=data/x/eval-*\n--eval_batches=30\n--learning_rate=5e-4\n")
    settings = {name: race_sweep.settings(name, rates, warmups, ["classic=lamb+adamw"]) for name in ("classic", "budget")}
    assert len(settings["classic"]) == 20 and len(settings["budget"]) == 10
    for name, chosen in (("classic", {"learning_rate": 1e-3, "warmup_steps": 50, "optimizer": "adamw"}),
                         ("budget", {"learning_rate": 3e-3, "warmup_steps": 10})):
        for i, setting in enumerate(settings[name]):
            best = setting == chosen
            write_run(tmp_path / name / "sweep" / race_sweep.label(setting), 0.0,
                      [(600, 0.10), (1200, 0.40 if best else 0.20 + 0.001 * i)])
    proc = subprocess.run([sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={tmp_path}",
                           "--report_only", "--time_budget_hours=0.5", f"--recipes=classic={flags},budget={flags}",
                           f"--sweep_learning_rates={','.join(map(str, rates))}", "--sweep_warmup_steps=10,50",
                           "--sweep_optimizers=classic=lamb+adamw"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = json.load(open(tmp_path / "sweep.json"))
    assert table["classic"][0]["setting"] == {"learning_rate": 1e-3, "warmup_steps": 50, "optimizer": "adamw"}
    assert len(table["classic"]) == 20 and table["budget"][0]["final_accuracy"] == 0.40
    best = recipe_race.read_flagfile(str(tmp_path / "budget.best.flags"))
    assert best["learning_rate"] == "0.003" and best["warmup_steps"] == "10" and best["eval_batches"] == "30"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the sweep's plot
    # the second stage: classic's best LAMB and best AdamW setting, budget's best two
    classic2 = recipe_race.read_flagfile(str(tmp_path / "classic.finalist2.flags"))
    assert recipe_race.read_flagfile(str(tmp_path / "classic.finalist1.flags"))["optimizer"] == "adamw"
    assert classic2["optimizer"] == "lamb" and classic2["learning_rate"] == "0.01"   # lamb's best: its last
    assert [r["setting"] for r in race_sweep.finalists(table["budget"])] == [
        {"learning_rate": 3e-3, "warmup_steps": 10}, table["budget"][1]["setting"]]
    assert not (tmp_path / "budget.finalist3.flags").exists() and "finalists (classic" in proc.stdout
    # diverged settings only if nothing else is left; never more than FINALISTS, whatever the optimizers

    def row(opt, loss, accuracy=0.1):
        return {"setting": {"optimizer": opt}, "final_loss": loss, "final_accuracy": accuracy}
    nan = float("nan")
    rows = [row("lamb", nan, nan), row("adamw", 7.0, 0.2), row("adamw", 7.1, 0.19), row("sgd", 8.0, 0.1)]
    assert race_sweep.finalists(rows) == [rows[1], rows[3]]
    assert race_sweep.finalists([rows[1], row("lamb", nan)]) == [rows[1], row("lamb", nan)]
    assert race_sweep.finalists(rows[:3]) == [rows[1], rows[2]]   # a sound runner-up before a diverged optimizer
    assert race_sweep.finalists([rows[1]]) == [rows[1]]
    assert "classic: 20 settings, best first" in proc.stdout
    base = dict(recipes=["a=b"], output_dir="x", time_budget_hours=0.5)
    for overrides, message in [
            (dict(sweep_learning_rates=[1e-4, 3e-4, 1e-3, 3e-3]), "give at least 5 different positive rates"),
            (dict(sweep_learning_rates=[1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]), "spanning at least 30x"),
            (dict(sweep_learning_rates=rates, time_budget_hours=0.0), "needs one budget"),
            (dict(sweep_learning_rates=rates, sweep_updates=100), "needs one budget"),
            (dict(sweep_updates=100), "need --sweep_learning_rates"),
            (dict(sweep_learning_rates=rates, sweep_updates=-1, time_budget_hours=0.0), "--sweep_updates must be >= 0"),
            (dict(sweep_warmup_steps=[10]), "need --sweep_learning_rates"),
            (dict(sweep_learning_rates=rates, seeds=[1, 2]), "no --nodes, no --seeds")]:
        with pytest.raises(ConfigError, match=message):
            recipe_race.RaceConfig(**{**base, **overrides})
    with pytest.raises(ConfigError, match="--sweep_optimizers: 'modern' is not one of --recipes"):
        race_sweep.check(rates, None, ["modern=adamw"], 0.5, {"classic": "a", "budget": "b"})


def test_a_sweep_by_updates_keeps_the_schedule_s_shape_ranks_ties_by_loss_and_goes_on_where_it_stopped(tmp_path):
    """--sweep_updates: each setting runs that many updates with the recipe's warmup and batch warmup scaled
    by updates / --total_steps and no time budget; the best flagfile keeps the unscaled setting. Equal
    accuracy (the unigram plateau) is ranked by held-out loss, a diverged run last. A setting that reached
    its updates is not run again; one cut short is set aside to be run whole; --report_only part-way
    reports the settings that finished, leaves one cut short where it is, and names the rest."""
    from bert_tf.studies import race_sweep
    recipe = {"total_steps": "1000", "warmup_steps": "100", "batch_warmup_sequences": "20000"}
    assert race_sweep.scaled(recipe, {"learning_rate": 1e-3, "warmup_steps": 200}, 100) == {
        "learning_rate": 1e-3, "warmup_steps": 20, "total_steps": 100, "time_budget_hours": 0,
        "batch_warmup_sequences": 2000}
    assert race_sweep.scaled({"total_steps": "1000", "warmup_steps": "100"}, {"learning_rate": 1e-3}, 5) == {
        "learning_rate": 1e-3, "warmup_steps": 1, "total_steps": 5, "time_budget_hours": 0}
    with pytest.raises(ConfigError, match="sets no --total_steps"):
        race_sweep.scaled({}, {"learning_rate": 1e-3}, 100)
    done, cut = tmp_path / "done", tmp_path / "cut"
    write_run(done, 0.0, [(60, 0.1), (120, 0.2)])          # evaluations at updates 10 and 20
    write_run(cut, 0.0, [(60, 0.1)])
    with open(cut / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')                               # killed mid-write
    assert race_sweep.finished(str(done), 20) and not race_sweep.finished(str(tmp_path / "never"), 20)
    assert not race_sweep.finished(str(cut), 20)
    assert not cut.exists() and (tmp_path / "cut.interrupted" / "metrics.jsonl").exists()

    rates = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]
    flags = tmp_path / "a.flags"
    flags.write_text("--eval_files=data/x/eval-*\n--eval_batches=30\n--total_steps=1000\n")
    out = tmp_path / "sweep"
    cut_short = out / "only" / "sweep" / race_sweep.label({"learning_rate": 3e-3})
    write_run(cut_short, 0.0, [(60, 0.3)])                                   # stopped at update 10 of 20
    for rate, loss in ((1e-4, 7.9), (3e-4, 7.5), (1e-3, float("nan"))):
        folder = out / "only" / "sweep" / race_sweep.label({"learning_rate": rate})
        write_run(folder, 0.0, [(30, 0.05), (60, 0.056)])
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        record = json.loads(lines[-1])
        record["eval_mlm_loss"] = loss
        (folder / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")
    proc = subprocess.run([sys.executable, str(REPO / "run" / "recipe_race.py"), f"--output_dir={out}",
                           "--report_only", "--sweep_updates=20", f"--recipes=only={flags}",
                           f"--sweep_learning_rates={','.join(map(str, rates))}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = json.load(open(out / "sweep.json"))
    assert [r["setting"]["learning_rate"] for r in table["only"]] == [3e-4, 1e-4, 1e-3]
    assert "not yet run (2): only/learning_rate=0.003, only/learning_rate=0.01" in proc.stdout
    assert cut_short.exists() and not (cut_short.parent / (cut_short.name + ".interrupted")).exists()
    assert recipe_race.read_flagfile(str(out / "only.best.flags"))["learning_rate"] == "0.0003"
