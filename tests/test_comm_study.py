"""The communication study on a small case: the planner predicts the emulated cluster's measured
throughput within 25%, fp16 compression halves the bytes on the link, and without the tools the
study says what is missing and skips the emulated part."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from bert_tf import emulated_cluster as ec
from conftest import REPO, mpi_env

STUDY = REPO / "run" / "comm_study.py"


@pytest.mark.skipif(ec.preflight() is not None, reason=f"emulated cluster unavailable: {ec.preflight()}")
def test_planner_predicts_the_emulated_study_within_25_percent(tiny_data, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(
        [sys.executable, str(STUDY), "--model_preset=mini", f"--vocab_file={tiny_data['vocab_file']}",
         f"--train_files={tiny_data['train']}", "--max_seq_length=64", "--max_predictions_per_seq=10",
         "--batch_size=4", "--accumulation_steps=4", "--updates=3", "--rates=1", "--fusion_mb=", "--cycle_ms=",
         "--rungs=fp32/every-mb,fp32/accum,fp16/accum", f"--output_dir={out}"],
        env=mpi_env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    rows = {r["config"]: r for r in study["rows"]}
    assert set(rows) == {"fp32/every-mb", "fp32/accum", "fp16/accum"}, rows
    for r in rows.values():
        assert "error" not in r, r
        assert abs(r["prediction_error"]) <= 0.25, r
    # bytes come from the interface counter; the ladder's order is real on the link
    every, fp32, fp16 = (rows[c]["tx_bytes_per_update"] for c in ("fp32/every-mb", "fp32/accum", "fp16/accum"))
    assert every == pytest.approx(4 * fp32, rel=0.05)
    assert fp16 / fp32 == pytest.approx(0.5, abs=0.02)
    assert rows["fp16/accum"]["speedup_vs_baseline"] > 1.0
    assert (out / "study.png").stat().st_size > 10_000
    assert "fp32/every-mb" in proc.stdout and "planner" in proc.stdout


NO_UNSHARE = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")


@pytest.mark.parametrize("case,prefix,message", [
    ("no tc", [], "the emulated cluster needs 'tc' (Debian package iproute2)"),
    pytest.param("not root", ["unshare", "--user"], "the emulated cluster needs root (network namespaces)",
                 marks=NO_UNSHARE),
    pytest.param("namespaces not permitted", ["unshare", "--user", "--map-root-user"],
                 "network namespaces are not permitted here", marks=NO_UNSHARE),
])
def test_without_what_it_needs_the_study_says_so_and_skips_the_emulated_part(tmp_path, case, prefix, message):
    env = mpi_env()
    if case == "no tc":
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin"])   # no /usr/sbin: no tc
    # "not root": an unprivileged user namespace (uid 65534); "not permitted": root inside a user
    # namespace, without the rights over the host's network namespaces
    proc = subprocess.run(prefix + [sys.executable, str(STUDY), "--device_seq_s=10", "--rates=1,10",
                                    f"--output_dir={tmp_path}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"emulated part skipped: {message}" in proc.stdout
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["skipped"].startswith(message)
    assert {r["rate_gbit"] for r in study["rows"]} == {1.0, 10.0}
    assert all(r["predicted_sequences_per_second"] > 0 for r in study["rows"])


def test_bad_study_flags_are_named(tmp_path):
    proc = subprocess.run([sys.executable, str(STUDY), "--rungs=fp64/everything", f"--output_dir={tmp_path}"],
                          env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--rungs: unknown ['fp64/everything']; valid: fp32/every-mb" in proc.stderr
