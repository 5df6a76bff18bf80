"""Worker for tests/test_local_updates.py (mpirun -np 2): DiLoCo's outer step (bert_tf/parallel/local_sgd.py) as
periodic averaging, the synchronous updates before the local ones (with a resume in each phase), fragments, the
overlapped exchange (against the blocking one and a reference of the merge, and timed), and the 8- and 4-bit
deltas, in one launch. Writes rankN.json and rankN.npz; `sections` (argv[2], comma-separated) limits what runs."""
import hashlib
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

from bert_tf.parallel import distributed, local_sgd

out_dir = sys.argv[1]
sections = sys.argv[2].split(",") if len(sys.argv) > 2 else ["average", "phases", "fragments", "overlap", "bits",
                                                               "timing"]
hvd = distributed.init()
rank, size = hvd.rank(), hvd.size()
result, arrays = {"rank": rank}, {}


def flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def digest(variables):
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables)).hexdigest()[:16]


def alike(variables):
    """True on every rank when both ranks hold the same values (a collective)."""
    mine = np.frombuffer(bytes.fromhex(digest(variables)), np.uint8)
    both = hvd.allgather(tf.constant(mine[None]), name=f"alike_{alike.calls}").numpy()
    alike.calls += 1
    return bool((both == both[0]).all())


alike.calls = 0


def small_variables(seed=0):
    """Four 'layers' of weights, the same on every rank."""
    r = np.random.RandomState(seed)
    return [tf.Variable(r.randn(*s).astype(np.float32)) for s in ((40, 30), (30,), (30, 20), (20,))]


def local_update(variables, step, scale=0.01):
    """Each rank its own change (a stand-in for an inner update)."""
    r = np.random.RandomState(1000 * step + rank)
    for v in variables:
        v.assign_sub(scale * r.randn(*v.shape).astype(np.float32))


# -- momentum 0, learning rate 1: the outer step is the ranks' mean (float32 deltas: no rounding on the way)
if "average" in sections:
    for bits in (32, 16):
        vs = small_variables()
        outer = local_sgd.OuterStep(vs, 1.0, 0.0, every=1, bits=bits)
        outer.anchor_to(vs)
        local_update(vs, 1)
        arrays[f"average_anchor_{bits}"] = flat(v.numpy() for v in outer.anchor)
        arrays[f"average_before_{bits}"] = flat(v.numpy() for v in vs)
        outer.sync(vs)
        arrays[f"average_after_{bits}"] = flat(v.numpy() for v in vs)


# -- --local_updates_after=2 with H=2: updates 1-2 averaged (the gradients through the outer step's allreduce, as the
# trainer's exchange), the anchor after 2, syncs after 4 and 6; a resume from update 1 (synchronous) and from update 4
# (local) ends where the straight run does. (run/pretrain.py's trainer: tests/test_local_updates.py's run.)
def phase_job():
    vs, step = small_variables(), tf.Variable(0, dtype=tf.int64)
    outer = local_sgd.OuterStep(vs, 0.7, 0.9, every=2, after=2)
    outer.count_on(step)
    outer.anchor_to(vs)

    @tf.function
    def update(grads):
        for v, g in zip(vs, outer(grads)):
            v.assign_sub(0.01 * g)
        step.assign_add(1)

    return vs, step, outer, update, tf.train.Checkpoint(vs=vs, step=step, outer_step=outer)


def run_to(job, end, saves=(), record=None):
    vs, step, outer, update, ckpt = job
    while int(step.numpy()) < end:
        r = np.random.RandomState(100 * int(step.numpy()) + rank)        # each rank its own gradients
        update([tf.constant(r.randn(*v.shape).astype(np.float32)) for v in vs])
        done = int(step.numpy())
        outer.after_update(done, vs)
        if record is not None:
            record[done] = {"alike": alike(vs), "anchor_is_weights": all(
                bool(tf.reduce_all(a == v)) for a, v in zip(outer.anchor, vs))}
        if done in saves:
            outer.agree(done, vs)
            ckpt.write(os.path.join(out_dir, f"phases-rank{rank}-{done}"))


if "phases" in sections:
    job = phase_job()
    record = {}
    run_to(job, 6, saves=(1, 4), record=record)
    result["phases"] = record
    result["phases_rounds"] = int(job[2].rounds.numpy())
    straight = digest(job[0])
    result["phases_resumed"] = {}
    for saved in (1, 4):
        job = phase_job()
        job[4].read(os.path.join(out_dir, f"phases-rank{rank}-{saved}")).assert_consumed()
        run_to(job, 6)
        result["phases_resumed"][saved] = digest(job[0]) == straight


# -- fragments: H=4, F=2 (layers 0, 2 | 1, 3): each exchange touches its fragment only; all alike after `agree`
if "fragments" in sections:
    vs = small_variables()
    outer = local_sgd.OuterStep(vs, 0.7, 0.9, every=4, fragments=[[0, 1], [2, 3]])
    outer.anchor_to(vs)
    events = {}
    for step in range(1, 9):
        local_update(vs, step)
        before = [v.numpy().copy() for v in vs]
        outer.after_update(step, vs)
        changed = [i for i, (b, v) in enumerate(zip(before, vs)) if not np.array_equal(b, v.numpy())]
        events[step] = {"changed": changed, "alike": [alike(vs[0:2]), alike(vs[2:4])]}
    outer.agree(8, vs)
    result["fragments"] = events
    result["fragments_alike_after_agree"] = alike(vs)
    result["fragments_rounds"] = int(outer.rounds.numpy())


# -- the overlapped exchange: (a) tau=1 with no update while in flight = the blocking exchange, bit for bit;
# (b) tau=1, alpha=0.25: fragment 0's weights after its completion, against a reference computed by the test
if "overlap" in sections:
    finals = {}
    for delay in (0, 1):
        vs = small_variables()
        outer = local_sgd.OuterStep(vs, 0.7, 0.9, every=4, fragments=[[0, 1], [2, 3]], delay=delay)
        outer.anchor_to(vs)
        local_update(vs, 1)
        local_update(vs, 2)
        outer.after_update(1, vs)
        outer.after_update(2, vs)          # fragment 0 starts (and with no delay, completes)
        outer.after_update(3, vs)          # no update in between: with tau=1 it completes here
        finals[delay] = digest(vs + outer.anchor + outer.velocity)
    result["overlap_same_as_blocking"] = finals[0] == finals[1]
    vs = small_variables()
    outer = local_sgd.OuterStep(vs, 0.7, 0.9, every=4, fragments=[[0, 1], [2, 3]], delay=1, alpha=0.25, bits=32)
    outer.anchor_to(vs)
    for step in range(1, 3):
        local_update(vs, step)
        outer.after_update(step, vs)
    arrays["merge_started"] = flat(v.numpy() for v in vs)
    arrays["merge_anchor"] = flat(v.numpy() for v in outer.anchor)
    local_update(vs, 3)
    arrays["merge_local"] = flat(v.numpy() for v in vs)
    outer.after_update(3, vs)
    arrays["merge_after"] = flat(v.numpy() for v in vs)
    arrays["merge_new_anchor"] = flat(v.numpy() for v in outer.anchor)


# -- 8 and 4 bits: every rank the same outer step, from every rank's decoded codes; the residuals kept
if "bits" in sections:
    for bits in (8, 4):
        vs = small_variables()
        outer = local_sgd.OuterStep(vs, 1.0, 0.0, every=1, bits=bits)
        outer.anchor_to(vs)
        local_update(vs, 1)
        arrays[f"bits{bits}_anchor"] = flat(v.numpy() for v in outer.anchor)
        arrays[f"bits{bits}_before"] = flat(v.numpy() for v in vs)
        outer.sync(vs)
        arrays[f"bits{bits}_after"] = flat(v.numpy() for v in vs)
        arrays[f"bits{bits}_residual"] = outer._host.residuals[0].numpy().reshape(-1)
        arrays[f"bits{bits}_mean_residual"] = outer._host.mean_residuals[0].numpy().reshape(-1)
        result[f"bits{bits}_alike"] = alike(vs)


# -- timing: a slow exchange (one large fragment, float32) against updates that take a fixed time, blocking (tau=0)
# and overlapped (tau=3); the second cycle is timed. The update sleeps (as a thread waiting for its GPU does), or
# with LOCAL_UPDATES_TIMING_COMPUTE=1 multiplies matrices (TensorFlow ops on this CPU, which the exchange shares)
def fake_update(seconds, compute):
    if not compute:
        time.sleep(seconds)
        return
    a = tf.random.normal([512, 512])
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = tf.linalg.matmul(a, a) / 512.0
        a.numpy()


def timed_loop(delay, update_seconds, elements, compute):
    vs = [tf.Variable(tf.ones([elements])), tf.Variable(tf.ones([8]))]
    outer = local_sgd.OuterStep(vs, 1.0, 0.0, every=8, fragments=[[0], [1]], delay=delay, bits=32)
    outer.anchor_to(vs)
    for step in range(1, 17):
        if step == 9:
            waited, start = outer.waited, time.perf_counter()
        fake_update(update_seconds if step > 8 else 0.0, compute)
        outer.after_update(step, vs)
    timed = {"waited": outer.waited - waited, "seconds": time.perf_counter() - start}
    outer.agree(16, vs)
    return timed


if "timing" in sections:
    elements = int(os.environ.get("LOCAL_UPDATES_TIMING_ELEMENTS", 16 * 2 ** 20))
    update_seconds = float(os.environ.get("LOCAL_UPDATES_TIMING_SECONDS", 0.25))
    compute = os.environ.get("LOCAL_UPDATES_TIMING_COMPUTE") == "1"
    result["timing"] = {str(d): timed_loop(d, update_seconds, elements, compute) for d in (0, 3)}

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
