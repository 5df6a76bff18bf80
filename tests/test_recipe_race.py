"""The recipe race's report (bert_tf/tools/recipe_race.py, run/recipe_race.py --report_only) on runs
written here: the curves, the time each recipe takes to reach the other's final accuracy, the plot."""
import json
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.tools import recipe_race
from conftest import REPO


def write_run(folder, t0, evals, rate=50.0, batch=100):
    """A metrics.jsonl: the run record at t0, a train record per evaluation, evals [(seconds, accuracy)]."""
    folder.mkdir(parents=True)
    records = [{"kind": "run", "step": 0, "time": t0}]
    for i, (seconds, accuracy) in enumerate(evals, 1):
        records.append({"kind": "train", "step": 10 * i, "time": t0 + seconds - 1, "samples_seen": 10 * i * batch,
                        "sequences_per_second": rate})
        records.append({"kind": "eval", "step": 10 * i, "time": t0 + seconds, "eval_mlm_accuracy": accuracy})
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
    assert reach == {"accuracy": 0.30, "seconds": 600, "fraction_of_their_time": 600 / 1800}
    assert summary["classic"]["reaches"]["budget"]["seconds"] is None      # never got to 0.45
    assert summary["budget"]["sequences_per_second"] == 80.0
    lines = recipe_race.describe(summary)
    assert "  reaches classic's final 0.3000 in 10.0 min (0.33 of classic's time)" in lines
    assert "  reaches budget's final 0.4500 never" in lines


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
