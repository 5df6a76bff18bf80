"""run/slurm/pretrain.sbatch on a one-machine Slurm (Debian's slurm-wlm and munge, started here with a
generated slurm.conf): a 2-task job pre-trains and COMPLETES, scancel leaves the last checkpoint
readable, a resubmission resumes from it, and a job asking for more tasks than exist is refused."""
import os
import re
import subprocess
import time

import pytest

from conftest import REPO
import services

pytestmark = pytest.mark.cluster      # starts Slurm (and MPI jobs under it)

SBATCH = str(REPO / "run" / "slurm" / "pretrain.sbatch")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with services.slurm_cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, corpus_dir):
    return services.make_demo_workdir(tmp_path_factory.mktemp("slurm_workdir"), corpus_dir)


def sbatch(slurm, workdir, *args):
    cmd = ["sbatch", "--parsable", *args]
    print("running:", " ".join(map(str, cmd)), f"(in {workdir})")
    proc = subprocess.run(cmd, cwd=workdir, env=services.run_env(workdir, slurm), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job_state(slurm, job):
    out = subprocess.run(["scontrol", "show", "job", job], env=slurm, capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "UNKNOWN"


def wait_job(slurm, job, workdir, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = job_state(slurm, job)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state, (workdir / f"slurm-{job}.out").read_text()
        time.sleep(2)
    subprocess.run(["scancel", job], env=slurm)
    raise AssertionError(f"job {job} still {state} after {timeout} s:\n"
                         + (workdir / f"slurm-{job}.out").read_text()[-4000:])


def latest_step(ckpt):
    import tensorflow as tf
    path = tf.train.latest_checkpoint(str(ckpt))
    return int(path.rsplit("-", 1)[1]) if path else 0


def test_more_tasks_than_the_cluster_has_is_refused_at_once(slurm, workdir):
    start = time.time()
    proc = subprocess.run(["sbatch", f"--ntasks={os.cpu_count() + 1}", SBATCH, "--flagfile=configs/demo.flags"],
                          cwd=workdir, env=services.run_env(workdir, slurm), capture_output=True, text=True, timeout=60)
    print(proc.stderr)
    assert proc.returncode != 0
    assert "More processors requested than permitted" in proc.stderr
    assert time.time() - start < 20


def test_job_completes_scancel_keeps_the_checkpoint_and_a_resubmission_resumes(slurm, workdir, tmp_path):
    ckpt = tmp_path / "ckpt"
    # 1. sbatch --ntasks=2 run/slurm/pretrain.sbatch --flagfile=configs/demo.flags (30 updates): COMPLETED, 2 ranks.
    job = sbatch(slurm, workdir, "--ntasks=2", SBATCH, "--flagfile=configs/demo.flags", *services.short_run_flags(30, ckpt))
    state, out = wait_job(slurm, job, workdir)
    assert state == "COMPLETED", out[-5000:]
    assert "ranks 2 " in out and "held-out MLM accuracy" in out, out[-3000:]
    assert latest_step(ckpt) == 30

    # 2. The same command for many more updates, cancelled after it saved past 30.
    job = sbatch(slurm, workdir, "--ntasks=2", SBATCH, "--flagfile=configs/demo.flags", *services.short_run_flags(100000, ckpt))
    deadline = time.time() + 600
    while latest_step(ckpt) < 40 and time.time() < deadline and job_state(slurm, job) in ("PENDING", "RUNNING"):
        time.sleep(1)
    assert latest_step(ckpt) >= 40, (workdir / f"slurm-{job}.out").read_text()[-4000:]
    subprocess.run(["scancel", job], env=slurm, check=True)
    state, out = wait_job(slurm, job, workdir, timeout=120)
    assert state == "CANCELLED", out[-3000:]
    assert "resumed from" in out and "at step 30" in out
    import tensorflow as tf
    step = latest_step(ckpt)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(ckpt)))   # readable after the cancel
    assert len(reader.get_variable_to_shape_map()) > 10
    print(f"cancelled job {job}; its last checkpoint is step {step}")

    # 3. Resubmitted: resumes from that checkpoint and completes.
    job = sbatch(slurm, workdir, "--ntasks=2", SBATCH, "--flagfile=configs/demo.flags", *services.short_run_flags(step + 10, ckpt))
    state, out = wait_job(slurm, job, workdir)
    assert state == "COMPLETED", out[-5000:]
    assert f"at step {step}" in out and "resumed from" in out, out[-3000:]
    assert latest_step(ckpt) == step + 10
