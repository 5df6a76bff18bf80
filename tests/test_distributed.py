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
from bert_tf.parallel.distributed import cpu_threads, timeline_allreduce_dtypes
from conftest import REPO, WORKERS, horovodrun, mpi_env, mpirun, read_rank_results, resume_from

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


TINY_SHAPES = [tuple(v.shape) for v in
               modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100)).trainable_variables]


def split(flat, shapes):
    out, start = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


def powersgd_reference(inputs, errors, qs, chosen):
    """NumPy PowerSGD (Vogels et al. 2019, one power iteration) of the ranks' gradient lists: the averaged
    update, each rank's new error and the next Q. The update P P^T M does not depend on QR's sign
    choices, nor does the next update on the signs of the Q it starts from (only its span counts)."""
    out = [np.mean([g[i] for g in inputs], 0) for i in range(len(inputs[0]))]
    new_errors, new_qs = [[None] * len(chosen) for _ in inputs], []
    for k, i in enumerate(chosen):
        ms = [g[i] + e[k] for g, e in zip(inputs, errors)]
        p = np.linalg.qr(np.mean([m @ qs[k] for m in ms], 0))[0]
        new_qs.append(np.mean([m.T @ p for m in ms], 0))
        out[i] = p @ new_qs[-1].T
        for r, m in enumerate(ms):
            new_errors[r][k] = m - out[i]
    return out, new_errors, new_qs


def onebit_reference(inputs, size):
    """NumPy 1-bit Adam exchange, first update (errors and momentum zero): DeepSpeed's compressed allreduce of
    each tensor's local momentum (1 - b1) g (tests/test_onebit_adam.py), returned as the gradient that moves
    m = 0 to it, and each rank's worker errors per tensor."""
    from test_onebit_adam import deepspeed_compressed_allreduce, padded
    per_rank = [split(x, TINY_SHAPES) for x in inputs]
    outs, errors = [], [[] for _ in range(size)]
    for t, s in enumerate(TINY_SHAPES):
        n = int(np.prod(s))
        out, worker, _ = deepspeed_compressed_allreduce([0.1 * r[t].ravel() for r in per_rank],
                                                        [np.zeros(padded(n, size))] * size,
                                                        [np.zeros(padded(n, size) // size)] * size)
        outs.append(out / 0.1)
        for r in range(size):
            errors[r].append(worker[r])
    return np.concatenate(outs), errors


def test_compressed_exchanges_give_every_rank_the_reference_update(checks):
    """powersgd and onebit on gradients that differ per rank: both ranks get the same update, the one a NumPy
    reference computes from both ranks' gradients (PowerSGD also on the second update, from its error
    buffers and warm Q); a non-finite gradient on one rank gives a non-finite update everywhere and leaves
    the buffers as they were; each rank's buffers written to its own file come back to that rank, Q from rank 0."""
    results, arrays, _ = checks
    chosen = [i for i, s in enumerate(TINY_SHAPES) if len(s) == 2 and min(s) >= 16]
    for method in ("powersgd", "onebit"):
        for call in (0, 1):
            np.testing.assert_array_equal(arrays[0][f"{method}_out{call}"], arrays[1][f"{method}_out{call}"])
        assert not results[0][f"{method}_nonfinite_out"] and not results[1][f"{method}_nonfinite_out"]
        assert results[0][f"{method}_nonfinite_kept_state"] and results[1][f"{method}_nonfinite_kept_state"]
        assert results[0][f"{method}_restored_equal"] and results[1][f"{method}_restored_equal"]
        assert results[0][f"{method}_restore_message"] == \
            "gradient compression: each of the 2 ranks restored its own error buffers from its own file"
        # each rank's file holds its own buffers only: the same size on both ranks, not rank 0 holding both
        own = arrays[0][f"{method}_state1"].nbytes
        for r in results:
            assert own <= r[f"{method}_file_bytes"] < 1.5 * own + 2 ** 16, (method, r[f"{method}_file_bytes"], own)
    assert results[0]["powersgd_q_restored"] and results[1]["powersgd_q_restored"]
    # PowerSGD, two updates: the reference carries each rank's error and the averaged Q forward
    qs = split(arrays[0]["powersgd_q0"], [(TINY_SHAPES[i][1], 2) for i in chosen])
    errors = [[np.zeros(TINY_SHAPES[i]) for i in chosen] for _ in range(2)]
    for call in (0, 1):
        inputs = [split(a[f"powersgd_in{call}"], TINY_SHAPES) for a in arrays]
        expected, errors, qs = powersgd_reference(inputs, errors, qs, chosen)
        got = split(arrays[0][f"powersgd_out{call}"], TINY_SHAPES)
        for i, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * np.abs(e).max(), err_msg=f"update {call}, {i}")
        for r in range(2):
            np.testing.assert_allclose(arrays[r][f"powersgd_state{call}"],
                                       np.concatenate([e.ravel() for e in errors[r]]), atol=1e-4)
    # the low-rank update differs from the plain mean: the compression is in effect
    mean = np.mean([a["powersgd_in0"] for a in arrays], 0)
    assert np.abs(arrays[0]["powersgd_out0"] - mean).max() > 0.1
    # 1-bit Adam, first update (the exchange alone: its own momentum, no warmup)
    from test_onebit_adam import split_worker_error
    total, worker_errors = onebit_reference([a["onebit_in0"] for a in arrays], 2)
    np.testing.assert_allclose(arrays[0]["onebit_out0"], total, rtol=1e-4, atol=1e-5)
    for r in range(2):
        worker = arrays[r]["onebit_state0"][:sum(e.size for e in worker_errors[r])]
        for got, expected in zip(split_worker_error(worker, TINY_SHAPES, 2), worker_errors[r]):
            np.testing.assert_allclose(got, expected, atol=1e-5)
    for out in split(arrays[0]["onebit_out0"], TINY_SHAPES):             # one magnitude per tensor's chunk
        assert len(np.unique(np.round(np.abs(out), 5))) <= 2


def test_compressed_training_keeps_ranks_equal(checks):
    results, arrays, _ = checks
    for method in ("powersgd", "onebit"):
        assert results[0][f"{method}_digest_after_4_steps"] == results[1][f"{method}_digest_after_4_steps"]
        assert results[0][f"{method}_moved"] and results[0][f"{method}_exchanges"] == 4
        # reset (an elastic re-form): buffers that held something are zero on both ranks, Q the initial one again
        for r in results:
            assert r[f"{method}_state_before_reset_nonzero"] and r[f"{method}_reset_zero"]
    for a in arrays:                # the same seed (7) and shapes as the exchange whose first Q is powersgd_q0
        np.testing.assert_array_equal(a["powersgd_q_after_reset"], arrays[0]["powersgd_q0"])


def test_auto_exchange_measures_the_link_together_and_every_rank_chooses_the_same(checks):
    """--exchange=auto in a job: rank 0's link figures on both ranks, one choice, said on rank 0."""
    results, _, _ = checks
    assert results[0]["auto_link"] == results[1]["auto_link"] and results[0]["auto_link"]["effective_gbit"] > 0
    chosen = results[0]["auto_chosen"]
    assert chosen == results[1]["auto_chosen"] and chosen in ("none", "fp16", "powersgd")
    line = results[0]["auto_said"][-1]
    assert line.startswith(f"gradients: --exchange=auto chose {chosen}") and "(measured now)" in line
    assert "powersgd rank 4 computation " in line and "onebit: " in line and "never reached" in line


def test_diloco_s_outer_step_is_the_reference_and_the_same_on_every_rank(checks):
    """Two local updates part the ranks' weights; the outer step (the float16 average of anchor - weights,
    Nesterov momentum 0.9, learning rate 0.7) gives both the same weights, the reference's."""
    results, arrays, _ = checks
    assert not np.array_equal(arrays[0]["diloco_before"], arrays[1]["diloco_before"])
    np.testing.assert_array_equal(arrays[0]["diloco_after"], arrays[1]["diloco_after"])
    anchor = arrays[0]["diloco_anchor"]
    np.testing.assert_array_equal(anchor, arrays[1]["diloco_anchor"])
    deltas = [(anchor - a["diloco_before"]).astype(np.float16) for a in arrays]
    mean = ((deltas[0] + deltas[1]) * np.float16(0.5)).astype(np.float32)     # Horovod's float16 average
    np.testing.assert_allclose(arrays[0]["diloco_velocity"], mean, rtol=1e-6, atol=0)
    expected = anchor - np.float32(0.7) * (mean + np.float32(0.9) * mean)
    np.testing.assert_allclose(arrays[0]["diloco_after"], expected, rtol=1e-6, atol=1e-7)
    assert results[0]["diloco_rounds"] == 1


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
    assert first[-1] == {**first[-1], "kind": "end", "step": stop_step, "stopped_early": True}  # a race reruns it
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


def test_a_stopped_rank_ends_the_job_within_the_collective_timeout(tmp_path, tiny_data):
    """A rank that stops taking part (SIGSTOP: alive, silent, its sockets open) is a hang Horovod does not end:
    the other rank's watchdog ends the job after --collective_timeout_minutes, naming itself, the collective it
    waited in and the stopped rank as the one that did not arrive (its heartbeat went quiet); the last
    checkpoint stays readable."""
    ckpt = tmp_path / "stopped"
    job = _launch_background(tiny_data["flags"] + ["--total_steps=100000", "--save_interval=2",
                                                   "--collective_timeout_minutes=0.25"], ckpt)
    _wait_for_step(ckpt / "metrics.jsonl", 3, job)
    stopped = max(_ranks_of(str(ckpt)))
    os.kill(stopped, signal.SIGSTOP)
    start = time.time()
    try:
        output = job.communicate(timeout=90)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        raise AssertionError("job still running 90 s after a rank was stopped")
    finally:
        if psutil.pid_exists(stopped):
            os.kill(stopped, signal.SIGKILL)
    assert job.returncode != 0 and 15 + 5 <= time.time() - start < 60, output[-3000:]   # timeout + grace
    # stopped mid-save, rank 0 is waited for in the save's barrier: silent, it ends that wait at the same timeout
    assert re.search(r"error: rank [01] has waited 0\.\d min in (the [a-z' -]+|rank 0's save of checkpoint \d+) "
                     r"\(update \d+\), longer than --collective_timeout_minutes=0\.25", output), output[-3000:]
    # the stopped rank printed nothing: the line names the one that waited, and only it, and the stopped one
    stuck = 1 - int(re.search(r"error: rank (\d) has waited", output).group(1))
    assert f"error: rank {stuck} has waited" not in output
    assert re.search(rf"--collective_timeout_minutes=0\.25: rank {stuck} did not arrive \(no sign of life for \d+ s: "
                     r"frozen, dead or cut off\)", output), output[-3000:]
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest and len(_weights(latest)) == TINY_VARIABLES


def test_the_other_ranks_wait_for_a_slow_save_under_the_save_timeout(tmp_path, tiny_data):
    """Rank 0's first save takes 25 s (tests/workers/slow_save.py), longer than --collective_timeout_minutes=0.25
    and its grace: rank 1 waits for it in the save's barrier under --save_timeout_minutes (rank 0 alive, its
    heartbeat fresh), the job finishes, and the next checkpoint's JSON holds the measured save."""
    ckpt = tmp_path / "slow_save"
    proc = mpirun(2, [WORKERS / "slow_save.py", *tiny_data["flags"], "--total_steps=2", "--save_interval=1",
                      "--collective_timeout_minutes=0.25", "--cycle_time_ms=10", f"--checkpoint_dir={ckpt}"],
                  check=False, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "has waited" not in output, output[-3000:]
    assert re.search(r"saved \S*ckpt-1 in 2\d\.\d s", output), output[-3000:]
    assert json.loads((ckpt / "ckpt-2.json").read_text())["save_seconds"] >= 25


def test_a_compressed_run_resumes_bit_exactly(tmp_path, tiny_data):
    """--exchange=onebit: each rank's error buffers are in its own file beside the checkpoint
    (exchange_state.py): 6 updates straight, and 3 + 3 resumed from the step-3 checkpoint and the ranks' files,
    give the same weights to the bit."""
    flags = tiny_data["flags"] + ["--exchange=onebit", "--compression_warmup_steps=1", "--total_steps=6",
                                  "--save_interval=3", "--optimizer=adamw", "--cycle_time_ms=10"]
    straight = tmp_path / "straight"
    first = mpirun(2, [PRETRAIN, *flags, f"--checkpoint_dir={straight}"])
    assert "gradients 1-bit after 1 uncompressed updates" in first.stdout, first.stdout[-2000:]
    for rank in range(2):    # each rank's own buffers only: its error of every element and its half's (2 ranks)
        with np.load(straight / "exchange" / "ckpt-3" / f"rank-{rank}-of-2.npz") as f:
            error, chunk = f["own_0"], f["own_1"]
            assert sorted(f.files) == ["header", "own_0", "own_1"]
        assert 0 <= 2 * chunk.size - error.size < 16 and np.abs(error).max() > 0 and np.abs(chunk).max() > 0
    resumed = resume_from(straight, tmp_path / "resumed", 3)
    again = mpirun(2, [PRETRAIN, *flags, f"--checkpoint_dir={resumed}"])
    log = again.stdout + again.stderr
    assert "resumed from" in log and "each of the 2 ranks restored its own error buffers from its own file" in log, \
        log[-3000:]
    a, b = _weights(str(straight / "ckpt-6")), _weights(str(resumed / "ckpt-6"))
    assert a.keys() == b.keys() and len(a) == TINY_VARIABLES
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_diloco_run_synchronises_every_h_updates_saves_in_step_and_resumes(tmp_path, tiny_data):
    """--local_updates=2 on 2 ranks for 5 updates: outer steps after updates 2 and 4, and one more before the
    last save (5 is between two); evaluations and saves on synchronised weights; resumed to 6, the outer
    state (rounds, anchor, velocity) comes back from the checkpoint and the next round goes on."""
    flags = tiny_data["flags"] + ["--local_updates=2", "--save_interval=2", "--eval_interval=2", "--optimizer=adamw",
                                  "--cycle_time_ms=10"]
    ckpt = tmp_path / "diloco"
    first = mpirun(2, [PRETRAIN, *flags, "--total_steps=5", f"--checkpoint_dir={ckpt}"])
    assert "gradients DiLoCo: the weights' change in float16 every 2 updates" in first.stdout, first.stdout[-2000:]
    rounds = {s: tf.train.load_checkpoint(str(ckpt / f"ckpt-{s}")).get_tensor(
        "outer_step/rounds/.ATTRIBUTES/VARIABLE_VALUE") for s in (2, 4, 5)}
    assert rounds == {2: 1, 4: 2, 5: 3}
    evaluations = [json.loads(line) for line in open(ckpt / "metrics.jsonl") if '"eval"' in line]
    assert [e["step"] for e in evaluations][:2] == [2, 4]
    again = mpirun(2, [PRETRAIN, *flags, "--total_steps=6", f"--checkpoint_dir={ckpt}"])
    assert re.search(r"resumed from \S*ckpt-5 at step 5\b", again.stdout + again.stderr), again.stdout[-2000:]
    reader = tf.train.load_checkpoint(str(ckpt / "ckpt-6"))
    assert reader.get_tensor("outer_step/rounds/.ATTRIBUTES/VARIABLE_VALUE") == 4


def test_local_group_node_makes_each_node_one_diloco_worker(tmp_path):
    """--local_updates=2 --local_group=node on 2 emulated nodes x 2 ranks: between synchronisations the ranks of a
    node hold the same weights (their gradients averaged inside the node) and the nodes differ; the outer step gives
    every rank the same weights."""
    from bert_tf.studies import emulated_cluster as ec
    if ec.preflight() is not None:
        pytest.skip(f"emulated cluster unavailable: {ec.preflight()}")
    with ec.EmulatedCluster(2, rate_gbit=1, slots=2) as cluster:
        cmd = cluster.mpirun_prefix(4, extra_env=("PYTHONPATH",)) + [sys.executable, str(WORKERS / "node_groups.py"),
                                                                     str(tmp_path)]
        proc = subprocess.run(cmd, env=ec.mpirun_env(mpi_env()), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = read_rank_results(tmp_path, 4)
    nodes = {}
    for r in results:
        nodes.setdefault(r["node"], []).append(r)
    assert sorted(len(v) for v in nodes.values()) == [2, 2], results
    inside = [{r["after_local_updates"] for r in ranks} for ranks in nodes.values()]
    assert all(len(digests) == 1 for digests in inside) and inside[0] != inside[1]
    assert len({r["after_outer_step"] for r in results}) == 1
    assert results[0]["describe"].startswith("DiLoCo (each node one worker): the weights' change in float16 every 2")
