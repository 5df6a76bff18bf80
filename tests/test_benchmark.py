"""run/benchmark.py's checks and its self-tuned flagfile (no timing is asserted: figures are the
benchmark's output, not a test's), the honest-peak helpers, and pretrain's precision warning."""
import json
import os
import re
import subprocess
import sys
import types

import pytest
import tensorflow as tf

from bert_tf.studies import matmul_peaks
from bert_tf.train import training
from bert_tf.parallel import device
from conftest import REPO, mpi_env

BENCHMARK = REPO / "run" / "benchmark.py"
PRETRAIN = REPO / "run" / "pretrain.py"
QUICK = ["--model_preset=tiny", "--vocab_size=200", "--max_seq_length=16", "--max_predictions_per_seq=3",
         "--micro_batch_size=2", "--updates=1", "--warmup_updates=1", "--peak_seconds=0.01", "--peak_size=32"]


# what --fuse needs at launch (training.FUSION_ENV)
FUSION = {"TF_XLA_FLAGS": " ".join(training.FUSION_FLAGS)}


def benchmark(args, cwd, env=None):
    return subprocess.run([sys.executable, str(BENCHMARK), *args], cwd=cwd, env=mpi_env(env), capture_output=True,
                          text=True, timeout=300)


def test_hardware_peak_is_the_best_of_every_dtype_and_way():
    peaks = {"float32": {"tensorflow": 3.0, "xla": 2.0}, "bfloat16": {"tensorflow": 9.0, "xla": 1.0}}
    assert matmul_peaks.hardware_peak(peaks) == (9.0, "bfloat16", "tensorflow")


def test_device_description_reads_the_cpu_flags_or_names_the_gpus(tmp_path, monkeypatch):
    """Both branches on any host: TensorFlow's device list is replaced, not read."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
                       "processor\t: 1\nmodel name\t: Other CPU\nflags\t\t: fpu\n")
    listed = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: listed.append(kind) or [])
    assert device.device_description(str(cpuinfo)) == {
        "cpu": "Some Xeon", "cpu_features": ["avx2", "avx512f", "amx_bf16", "amx_tile"], "cpu_count": os.cpu_count()}
    assert listed == ["GPU"]
    assert device.device_description(str(tmp_path / "none")) == {"cpu": "unknown CPU", "cpu_features": [],
                                                                 "cpu_count": os.cpu_count()}
    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: gpus if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda g: {"device_name": "Tesla V100-SXM2-16GB"} if g is gpus[0] else {})
    assert device.device_description(str(cpuinfo)) == {"gpus": ["Tesla V100-SXM2-16GB", "/physical_device:GPU:1"]}


def test_precision_warning_names_the_missing_arithmetic_and_the_measured_figure():
    avx2 = {"cpu": "EPYC", "cpu_features": ["avx2"]}
    warning = device.precision_warning("mixed_float16", avx2, 1.25)
    assert "--precision=mixed_float16" in warning and "avx512_fp16" in warning and "1.25 seq/s" in warning
    assert "measures" in device.precision_warning("mixed_bfloat16", avx2)
    assert device.precision_warning("mixed_bfloat16", {"cpu": "x", "cpu_features": ["avx512_bf16"]}) == ""
    assert device.precision_warning("float32", avx2) == ""
    assert device.precision_warning("mixed_float16", {"gpus": ["V100"]}) == ""


def test_the_library_never_imports_keras():
    sources = sorted((REPO / "bert_tf").rglob("*.py"))
    offenders = [p.name for p in sources if re.search(r"^\s*(import|from)\s+(keras|keras_hub|tf_keras)\b|tf\.keras",
                                                      p.read_text(), re.M)]
    assert len(sources) > 10 and offenders == []


@pytest.mark.slow
def test_bad_rungs_and_an_unwritable_flagfile_fail_before_measuring(tmp_path):
    bad = benchmark([*QUICK, "--rungs=fp32,fp8+xla"], tmp_path)
    assert bad.returncode == 1 and "error: --rungs: unknown 'fp8+xla'; valid: fp32, bf16" in bad.stderr
    assert "matmul peak" not in bad.stdout
    bad = benchmark([*QUICK, "--rungs=fp32,tf32+xla"], tmp_path)       # no GPU here
    assert bad.returncode == 1 and "error: --rungs: tf32 needs a GPU with TensorFloat-32" in bad.stderr
    bad = benchmark([*QUICK, "--rungs=fp32", f"--device_figures={tmp_path}/f.json"], tmp_path)
    assert bad.returncode == 1 and "the plan's phases run at sequence 128 and 512, not --max_seq_length=16" in bad.stderr
    bad = benchmark([*QUICK, "--rungs=fp32,bf16+fuse"], tmp_path)
    assert bad.returncode == 1 and "error: --rungs: the +fuse rungs need TF_XLA_FLAGS='--tf_xla_auto_jit" in bad.stderr
    bad = benchmark([*QUICK, "--rungs=best-dropout,fp32"], tmp_path)
    assert bad.returncode == 1 and "error: --rungs: best-dropout needs a bert_tf rung before it" in bad.stderr
    bad = benchmark([*QUICK, "--rungs=fp32", f"--input_files={tmp_path}/none-*"], tmp_path)
    assert bad.returncode == 1 and "error: --input_files needs --vocab_file" in bad.stderr
    for target in (tmp_path / "no" / "such" / "node.flags", tmp_path):
        bad = benchmark([*QUICK, "--rungs=fp32", f"--write_flagfile={target}"], tmp_path)
        assert bad.returncode == 1 and f"error: --write_flagfile={target}: " in bad.stderr, bad.stderr[-500:]
        assert "matmul peak" not in bad.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []                 # nothing written


@pytest.mark.slow
def test_the_self_tuned_flagfile_is_taken_by_pretrain_after_the_recipe(tiny_data, tmp_path):
    node = tmp_path / "node.flags"
    out = benchmark([*QUICK, "--rungs=fp32,bf16+fuse,best-dropout", f"--output_dir={tmp_path / 'ladder'}",
                     f"--write_flagfile={node}", f"--profile_dir={tmp_path / 'trace'}", "--tune_micro_batch_sizes=1,4"],
                    tmp_path, env=FUSION)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "hardware peak:" in out.stdout and "cpu_features" in out.stdout
    shares = re.findall(r"^\s+([\d.]+)%\s+(\w+)$", out.stdout.split("op time by type:")[1], re.M)
    assert any("MatMul" in op for _, op in shares) and 0 < sum(float(s) for s, _ in shares) <= 100.05
    assert {"ladder.json", "ladder.png"} <= {p.name for p in (tmp_path / "ladder").iterdir()}
    report = json.loads((tmp_path / "ladder" / "ladder.json").read_text())
    rows = {r["rung"]: r for r in report["rungs"]}
    names = list(rows)
    assert names[:3] == ["fp32", "bf16+fuse", "best-dropout"] and rows["best-dropout"]["diagnostic"]
    assert rows["bf16+fuse"]["fuse"] and not rows["fp32"]["fuse"]
    base = max(("fp32", "bf16+fuse"), key=lambda r: rows[r]["sequences_per_second"])
    assert names[3:] == [f"{base} b1", f"{base} b4"]                     # --tune_micro_batch_sizes on the fastest rung
    fastest = max([base] + names[3:], key=lambda r: rows[r]["sequences_per_second"])
    assert f"fastest bert_tf rung {fastest}" in node.read_text()          # never the diagnostic rung
    assert report["hardware_peak_flops"] == max(v for ways in report["matmul_peak_flops"].values()
                                                for v in ways.values())
    assert all(r["mfu"] <= r["mfu_same_dtype"] for r in rows.values())
    lines = [line for line in node.read_text().splitlines() if not line.startswith("#")]
    # the flags are the fastest row's, each of them
    best = rows[fastest]
    assert [rows[n]["batch_size"] for n in names] == [2, 2, 2, 1, 4]
    assert lines[:4] == [f"--precision={best['precision']}", "--xla" if best["xla"] else "--noxla",
                         "--fuse" if best["fuse"] else "--nofuse",
                         f"--ladder_sequences_per_second={best['sequences_per_second']:.3f}"]
    assert best["precision"] == {"fp32": "float32", "bf16+fuse": "mixed_bfloat16"}[base] and not best["xla"]
    ladder = float(lines[3].split("=")[1])
    assert ladder > 0
    micro = int(lines[4].removeprefix("--fit_micro_batch="))        # the fastest of 2 (--micro_batch_size), 1, 4
    assert micro == best["batch_size"] and len(lines) == 5
    recipe = tmp_path / "recipe.flags"
    recipe.write_text("\n".join(tiny_data["flags"] + ["--precision=mixed_float16", "--xla", "--total_steps=2"]))
    run = subprocess.run([sys.executable, str(PRETRAIN), f"--flagfile={recipe}", f"--flagfile={node}",
                          f"--checkpoint_dir={tmp_path / 'ckpt'}"], env=mpi_env(FUSION if best["fuse"] else None),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    precision = lines[0].split("=")[1]
    assert f"precision {precision}  xla {lines[1] == '--xla'}{'  fuse' if best['fuse'] else ''}  gradients" \
        in run.stdout                                                                  # the node's flags won
    assert f"micro-batch {micro}/rank  accumulation {4 // micro}" in run.stdout      # the recipe's 4 per rank, re-split
    assert f"(ladder: {ladder:.2f} seq/s per rank)" in run.stdout
    assert re.search(rf"measured [\d.]+ seq/s per rank \(last interval\) vs the ladder's {ladder:.2f}", run.stdout)


def test_input_headroom_measures_static_and_dynamic_masking(tiny_data, monkeypatch):
    """Each rate is sequences over the seconds they took, of the real pipelines, the dynamic one re-masking:
    on a clock that advances 1 s per reading, with seconds=2.5, three batches of 4 are timed over 4 s."""
    from bert_tf.data import input_pipeline
    from bert_tf.studies import input_headroom
    clock, pipelines = iter(range(1, 1000)), []
    monkeypatch.setattr(input_headroom, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    real = input_pipeline.make_dataset

    def recording(*args, masker=None, **kwargs):
        dataset = real(*args, masker=masker, **kwargs)
        pipelines.append((masker, next(iter(dataset))))
        return dataset
    monkeypatch.setattr(input_pipeline, "make_dataset", recording)
    rates = input_headroom.measure(tiny_data["train"], tiny_data["vocab_file"], micro_batch=4, max_seq_length=64,
                                   max_predictions_per_seq=10, seconds=2.5)
    assert rates == {"static": 3.0, "dynamic": 3.0}
    (static, static_batch), (masker, dynamic_batch) = pipelines
    assert static is None and masker is not None
    for batch in (static_batch, dynamic_batch):
        assert batch["input_ids"].shape == (4, 64) and batch["masked_lm_weights"].numpy().sum(1).min() >= 1


@pytest.mark.slow
def test_the_gpu_ladder_is_the_default_where_a_gpu_is_seen_and_its_rungs_pass_the_checks():
    script = ("import sys; sys.path.insert(0, 'run'); import benchmark as b; "
              "b.check_rungs(b.default_rungs(True, False), gpu=True); print(b.default_rungs(True, False)); "
              "print(b.default_rungs(False, False)); print(b.default_rungs(False, True))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=mpi_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    gpu, cpu, cpu_fusion = (eval(line) for line in proc.stdout.strip().splitlines()[-3:])
    assert [r for r in cpu_fusion if r.endswith("+fuse")] == ["fp32+fuse", "bf16+fuse"]
    assert cpu == [r for r in cpu_fusion if not r.endswith("+fuse")]          # left out only without the flags
    assert gpu[:3] == ["fp16+xla", "bf16+xla", "tf32+xla"] and "fp32+xla" in gpu   # tensor cores first, strict fp32 too
    assert not any(r.startswith("tf32") for r in cpu) and cpu[:2] == ["fp32", "fp32+xla"]


@pytest.mark.slow
def test_the_records_rung_counts_the_useful_tokens_of_the_rows_it_timed(tmp_path):
    """Records of instances 5..24 tokens long in 64-token rows: at most 24/64 of the rows' tokens are useful."""
    import tensorflow as tf

    from bert_tf.data import instances as ins, records as rec
    from test_packing import random_instances
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    with tf.io.TFRecordWriter(str(tmp_path / "short.tfrecord")) as w:
        for inst in random_instances(64, 24, 10):
            w.write(rec.serialize(inst, config))
    # ... timed beside a busy neighbour, which every figure's line and the summary name
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = benchmark(["--model_preset=tiny", "--vocab_size=300", "--max_seq_length=64",
                         "--max_predictions_per_seq=10", "--micro_batch_size=2", "--updates=30", "--warmup_updates=1",
                         "--peak_seconds=0.2", "--peak_size=32", "--peak_repeats=1", "--rungs=fp32",
                         f"--rung_train_files={tmp_path / 'short.tfrecord'}", f"--output_dir={tmp_path / 'out'}"], tmp_path)
    finally:
        neighbour.kill()
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "ladder.json").read_text())
    rows = {r["rung"]: r for r in report["rungs"]}
    # /proc/stat counts in 10 ms ticks: 30 updates make a window long enough to see the neighbour's core
    assert all(r["machine_load"]["seconds"] > 0.2 for r in rows.values()), rows
    assert all(r["machine_load"]["other_cores"] > 0.5 for r in rows.values()), rows
    assert all(s["other_cores"] > 0.5 for ways in report["matmul_peak_machine_load"].values()
               for seen in ways.values() for s in seen)
    assert re.search(r"^fp32 .* WARNING: timed beside other work \(other processes [\d.]+ cores", out.stdout, re.M)
    assert re.search(r"^matmul peak float32  tensorflow .* WARNING: [\d.]+ beside other processes", out.stdout, re.M)
    assert re.search(r"^timed beside other work: 2 rungs \(fp32, fp32 on records\) and 6 peak measurements, with up "
                     r"to [\d.]+ cores of other processes", out.stdout, re.M), out.stdout[-1500:]
    assert "the machine was quiet" not in out.stdout
    row = rows["fp32 on records"]
    assert row["diagnostic"] and row["instances_per_row"] == 0
    assert row["instances_per_second"] == row["sequences_per_second"]          # one instance per row
    assert 5 / 64 * row["tokens_per_second"] <= row["useful_tokens_per_second"] <= 24 / 64 * row["tokens_per_second"]
    assert f"{row['useful_tokens_per_second']:.0f} useful tokens/s" in out.stdout


@pytest.mark.slow
@pytest.mark.long   # the benchmark's comparison with its peer, a study (pytest.ini): out of the default run
def test_the_peer_is_also_timed_with_its_own_accumulation_and_at_the_tuned_micro_batches(tmp_path):
    out = benchmark([*QUICK, "--peak_repeats=1", "--rungs=fp32,keras-hub", "--accumulation_steps=2",
                     "--tune_micro_batch_sizes=4", f"--output_dir={tmp_path / 'out'}",
                     f"--profile_dir={tmp_path / 'trace'}"],
                    tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "ladder.json").read_text())
    # both sides' fastest traced, their time shared out by kind, and what 1.3x would need
    profiles = report["profiles"]
    for side in ("bert_tf", "keras-hub"):
        p = profiles[side]
        assert (tmp_path / "trace" / side / "plugins" / "profile").is_dir()
        per_seq = p["kind_ms_per_sequence"]
        assert sum(per_seq.values()) == pytest.approx(p["wall_seconds"] / p["sequences"] * 1e3)
        assert per_seq["matmul"] > 0 and per_seq["element-wise"] > 0, p
    assert profiles["keras-hub"]["rung"] == max((r for r in report["rungs"] if r["peer"]),
                                                key=lambda r: r["sequences_per_second"])["rung"]
    c = profiles["comparison"]
    assert c["ours_matmul_ms"] == profiles["bert_tf"]["kind_ms_per_sequence"]["matmul"]
    assert f"other time must fall from {c['ours_rest_ms']:.1f} to {c['rest_needed_ms']:.1f} ms" in out.stdout
    assert re.search(r"^  matmul +[\d.]+ +[\d.]+$", out.stdout, re.M)
    again = subprocess.run([sys.executable, str(REPO / "run" / "profile_report.py"),
                            f"--ladder={tmp_path / 'out' / 'ladder.json'}"], cwd=tmp_path, env=mpi_env(),
                           capture_output=True, text=True, timeout=300)       # the same traces read again
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"other time must fall from {c['ours_rest_ms']:.1f} to {c['rest_needed_ms']:.1f} ms" in again.stdout
    bad = subprocess.run([sys.executable, str(REPO / "run" / "profile_report.py"), f"--ladder={tmp_path / 'none.json'}"],
                         cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and f"error: --ladder={tmp_path / 'none.json'}: " in bad.stderr
    rows = report["rungs"]
    shapes = [(r["rung"], r["peer"], r["accumulation_steps"], r["batch_size"]) for r in rows]
    peers = rows[1:5]
    assert [r["rung"] for r in peers] == ["keras-hub float32", "keras-hub float32+xla", "keras-hub bfloat16",
                                          "keras-hub bfloat16+xla"]
    best = max(peers, key=lambda r: r["sequences_per_second"])["rung"]
    assert shapes[0] == ("fp32", False, 1, 2) and shapes[5] == (f"{best}+accum", True, 2, 2), shapes
    fastest_peer = max(rows[1:6], key=lambda r: r["sequences_per_second"])
    assert shapes[6:] == [("fp32 b4", False, 1, 4), (f"{fastest_peer['rung']} b4", True,
                                                     fastest_peer["accumulation_steps"], 4)], shapes
    for r in rows:                  # Keras accumulated as the row says and applied one update per timed update
        if r["peer"]:
            assert r["peer_gradient_accumulation_steps"] == r["accumulation_steps"], r
            assert r["peer_applied_per_update"] == 1, r
    peer = max((r for r in rows if r["peer"]), key=lambda r: r["sequences_per_second"])
    bert_tf = max((r for r in rows if not r["peer"]), key=lambda r: r["sequences_per_second"])
    assert report["ratio_to_keras_hub"] == bert_tf["sequences_per_second"] / peer["sequences_per_second"]
