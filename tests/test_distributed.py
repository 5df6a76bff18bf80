"""Distributed pre-training under mpirun/horovodrun: agreement, equivalence, compression,
disjoint input, SIGTERM + resume, shape errors, and a killed rank."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import psutil
import pytest
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.dist.distributed import cpu_threads, timeline_allreduce_dtypes
from conftest import REPO, WORKERS, horovodrun, mpi_env, mpirun, read_rank_results

pytestmark = pytest.mark.cluster      # starts MPI/horovodrun jobs

PRETRAIN = REPO / "run" / "pretrain.py"
TINY_VARIABLES = len(modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100)).trainable_variables)


@pytest.fixture(scope="module")
def checks(tmp_path_factory, tiny_data):
    out = tmp_path_factory.mktemp("distributed_checks")
    timeline = out / "timeline.json"
    mpirun(2, [WORKERS / "distributed_checks.py", out, tiny_data["train"]], env={"HOROVOD_TIMELINE": str(timeline)})
    results = read_rank_results(out, 2)
    arrays = [np.load(out / f"rank{r}.npz") for r in range(2)]
    return results, arrays, timeline


def test_broadcast_then_steps_keep_weights_bit_identical(checks):
    results, _, _ = checks
    for tag in ("fp32", "fp16"):
        assert results[0][f"initial_digest_{tag}"] == results[1][f"initial_digest_{tag}"]
        assert results[0][f"digest_after_4_steps_{tag}"] == results[1][f"digest_after_4_steps_{tag}"]
        assert results[0][f"digest_after_4_steps_{tag}"] != results[0][f"initial_digest_{tag}"]


def test_two_ranks_of_b_equal_one_rank_of_2b(checks):
    _, arrays, _ = checks
    for a in arrays:
        # The averaged gradient, computed independently on each rank from both halves (in float16
        # with compression, as Horovod rounds each rank's gradient), is what the allreduce gave,
        # to the bit, and so is the update. (LAMB's first step hardly depends on the gradients'
        # scale, m / sqrt(v): a sum instead of a mean would pass a weight comparison alone.)
        for tag in ("fp32", "fp16"):
            np.testing.assert_array_equal(a[f"grads_dist_{tag}"], a[f"grads_emu_{tag}"])
            np.testing.assert_array_equal(a[f"equiv_dist_{tag}"], a[f"equiv_emu_{tag}"])
        # fp32: the large batch's gradient and update. A step moves a weight by 1e-4 (LayerNorm,
        # biases) or 1e-4 x its tensor's RMS (~2e-6); 1e-7 is far below either.
        scale = np.abs(a["grads_ref_fp32"]).max()
        np.testing.assert_allclose(a["grads_dist_fp32"], a["grads_ref_fp32"], rtol=1e-5, atol=1e-6 * scale)
        np.testing.assert_allclose(a["equiv_dist_fp32"], a["equiv_ref_fp32"], rtol=0, atol=1e-7)
        # fp16: close to the large batch; rounding may move the first step of a few tiny gradients
        assert np.mean(np.abs(a["equiv_dist_fp16"] - a["equiv_ref_fp16"]) < 1e-6) > 0.99


def test_every_gradient_allreduce_carries_float16_when_compressed(checks):
    _, _, timeline = checks
    dtypes = timeline_allreduce_dtypes(timeline)
    fp16 = {k: v for k, v in dtypes.items() if "fp16grad" in k or "eqfp16" in k}
    fp32 = {k: v for k, v in dtypes.items() if "fp32grad" in k or "eqfp32" in k}
    n_vars = TINY_VARIABLES   # one allreduce per trainable variable
    assert len(fp16) >= n_vars and len(fp32) >= n_vars, sorted(dtypes)[:5]
    assert all(v == ["float16"] for v in fp16.values())
    assert all(v == ["float32"] for v in fp32.values())


def file_record_hashes(pattern):
    """Every record of the files, hashed as tests/workers/distributed_checks.py hashes what a rank reads."""
    import glob
    import hashlib
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
    spec = {k: tf.io.RaggedFeature(tf.int64) for k in keys}
    hashes = []
    for raw in tf.data.TFRecordDataset(sorted(glob.glob(pattern))).batch(512):
        batch = {k: v.numpy() for k, v in tf.io.parse_example(raw, spec).items()}
        for i in range(len(batch["input_ids"])):
            h = hashlib.sha1()
            for key in keys:
                h.update(np.asarray(batch[key][i], np.int64).tobytes())
            hashes.append(h.hexdigest())
    return hashes


def test_ranks_consume_disjoint_records_that_cover_the_files(checks, tiny_data):
    """One pass: no record is read by both ranks, and every record of the files is read exactly
    once (as a multiset: a record read twice by one rank, or one never read, fails)."""
    results, _, _ = checks
    a, b = (Counter(r["record_hashes"]) for r in results)
    assert a and b and not set(a) & set(b)
    every = Counter(file_record_hashes(tiny_data["train"]))
    assert sum(every.values()) > 8
    assert a + b == every, (sum(a.values()), sum(b.values()), sum(every.values()))


def _ranks_of(marker):
    """PIDs of the python ranks whose command line mentions `marker` (not mpirun itself)."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and "python" in os.path.basename(cmd[0]) and any(marker in c for c in cmd):
            pids.append(p.info["pid"])
    return pids


def _wait_for_step(metrics_file, step, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"job ended early: {proc.returncode}\n{proc.stdout.read()[-3000:]}")
        if os.path.exists(metrics_file):
            steps = [json.loads(l).get("step", 0) for l in open(metrics_file) if '"train"' in l]
            if steps and max(steps) >= step:
                return
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _launch_background(args, ckpt_dir):
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(PRETRAIN), *args, f"--checkpoint_dir={ckpt_dir}"]
    return subprocess.Popen(cmd, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _weights(ckpt):
    reader = tf.train.load_checkpoint(ckpt)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith("model/") and k.endswith("VARIABLE_VALUE")}


def _runs(metrics_file):
    """metrics.jsonl cut into runs: one list of records per "run" record (each start or resume)."""
    runs = []
    for line in open(metrics_file):
        record = json.loads(line)
        if record.get("kind") == "run":
            runs.append([])
        if runs:
            runs[-1].append(record)
    return runs


def _single(args):
    """run/pretrain.py in one process (no launcher), started now; finish with .communicate()."""
    return subprocess.Popen([sys.executable, str(PRETRAIN), *args], env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigterm_then_resume_matches_an_uninterrupted_run_and_horovodrun_end_to_end(tmp_path, tiny_data):
    # 20 short steps: room for the signal to land before the end even on a busy machine (every update
    # is logged: tiny_data's --log_interval=1); a 10 ms cycle keeps Horovod's threads off the 2 cores
    flags = tiny_data["flags"] + ["--total_steps=20", "--save_interval=100", "--cycle_time_ms=10"]
    # uninterrupted, through horovodrun
    straight = tmp_path / "straight"
    proc = horovodrun(2, [PRETRAIN, *flags, f"--checkpoint_dir={straight}"])
    assert "held-out MLM accuracy" in proc.stdout
    intra, inter = cpu_threads(2)                         # each rank's share of this node's cores
    assert f"device: CPU ({intra} intra-op, {inter} inter-op threads)" in proc.stdout, proc.stdout[-2000:]
    assert os.path.exists(straight / "ckpt-20.index")
    # interrupted at step >= 2 by SIGTERM to the ranks (what a scheduler sends), then resumed
    resumed = tmp_path / "resumed"
    job = _launch_background(flags, resumed)
    _wait_for_step(resumed / "metrics.jsonl", 2, job)
    for pid in _ranks_of(str(resumed)):
        os.kill(pid, signal.SIGTERM)
    output = job.communicate(timeout=120)[0]
    assert job.returncode == 0, output[-3000:]
    stopped = tf.train.latest_checkpoint(str(resumed))
    stop_step = int(stopped.rsplit("-", 1)[1])
    assert 2 <= stop_step < 20, output[-2000:]
    assert f"stopping at step {stop_step}" in output, output[-2000:]
    [first] = _runs(resumed / "metrics.jsonl")
    assert [r["step"] for r in first if r["kind"] == "train"] == list(range(1, stop_step + 1))
    # resumed: from the stop checkpoint, making exactly the missing updates (a run that ignored the
    # checkpoint and began again at step 0 would make 20)
    again = mpirun(2, [PRETRAIN, *flags, f"--checkpoint_dir={resumed}"])
    log = again.stdout + again.stderr
    assert re.search(rf"resumed from \S*ckpt-{stop_step} at step {stop_step}\b", log), log[-3000:]
    runs = _runs(resumed / "metrics.jsonl")
    assert len(runs) == 2 and runs[1][0]["step"] == stop_step, [r[0] for r in runs]
    assert [r["step"] for r in runs[1] if r["kind"] == "train"] == list(range(stop_step + 1, 21)), runs[1]
    a, b = _weights(str(straight / "ckpt-20")), _weights(str(resumed / "ckpt-20"))
    assert a.keys() == b.keys() and len(a) == TINY_VARIABLES
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # the position is in the checkpoint: 2 ranks x 4 sequences x 20 updates
    reader = tf.train.load_checkpoint(str(resumed / "ckpt-20"))
    assert reader.get_tensor("input_position/samples_seen/.ATTRIBUTES/VARIABLE_VALUE") == 160
    assert len(reader.get_tensor("input_position/iterator_states/.ATTRIBUTES/VARIABLE_VALUE")) == 2
    # three single-process runs at once (each mostly one core's work):
    # resumed on another rank count (1): a fresh pass, said so, and the sample count goes on;
    # phase 2: a new run initialised from the checkpoint's model, with a fresh optimizer and schedule;
    # another model shape than the checkpoint's fails at start-up, naming both shapes
    one = _single([*flags, "--total_steps=22", f"--checkpoint_dir={resumed}"])
    phase2 = _single([*flags, "--total_steps=2", f"--init_checkpoint={straight / 'ckpt-20'}",
                      f"--checkpoint_dir={tmp_path / 'phase2'}", "--intra_op_threads=1", "--inter_op_threads=1"])
    bad = _single([*[f for f in flags if "model_preset" not in f], "--model_preset=mini",
                   f"--checkpoint_dir={straight}"])
    (one_out, one_err), (phase2_out, phase2_err), (_, bad_err) = (p.communicate(timeout=300) for p in (one, phase2, bad))
    assert one.returncode == 0, one_err[-2000:]
    assert "saved by 2 ranks, this run has 1: a fresh pass over the training files starts at step 20" in one_out
    last = [json.loads(line) for line in open(resumed / "metrics.jsonl") if '"train"' in line][-1]
    assert last["step"] == 22 and last["samples_seen"] == 160 + 2 * 4
    assert phase2.returncode == 0, phase2_err[-2000:]
    assert f"initialised encoder and heads from {straight / 'ckpt-20'}" in phase2_out
    assert "device: CPU (1 intra-op, 1 inter-op threads)" in phase2_out, phase2_out[-2000:]
    assert os.path.exists(tmp_path / "phase2" / "ckpt-2.index")          # the step count started again
    assert bad.returncode != 0
    assert "does not fit this model" in bad_err and "checkpoint [" in bad_err and "vs model [" in bad_err, bad_err[-2000:]


def test_a_killed_rank_ends_the_job_and_keeps_the_checkpoint(tmp_path, tiny_data):
    ckpt = tmp_path / "killed"
    job = _launch_background(tiny_data["flags"] + ["--total_steps=100000", "--save_interval=2"], ckpt)
    _wait_for_step(ckpt / "metrics.jsonl", 3, job)
    ranks = _ranks_of(str(ckpt))
    assert len(ranks) == 2
    os.kill(max(ranks), signal.SIGKILL)
    start = time.time()
    try:
        job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        raise AssertionError("job still running 60 s after a rank was killed")
    assert job.returncode != 0 and time.time() - start < 60
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest and len(_weights(latest)) == TINY_VARIABLES
