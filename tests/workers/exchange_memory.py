"""A study (issue 46): per rank, the exchange-state file it writes and its peak resident memory during
exchange_state.save and exchange_state.load, at any rank count; docs/results.md "Exchange state per rank".

    mpirun --oversubscribe -np N python tests/workers/exchange_memory.py PRESET [FOLDER]

(PRESET e.g. medium; FOLDER default /tmp/exchange_memory). Peaks: VmRSS sampled every ms around the call, and
VmHWM after a reset (clear_refs 5), each minus the RSS just before it."""
import json
import os
import shutil
import sys
import threading
import time

import tensorflow as tf
from bert_tf.parallel import distributed, exchange_state
from bert_tf.parallel.comm import CommConfig
from bert_tf.model import modeling
import horovod.tensorflow as hvd

_n = [0]
def barrier():
    _n[0] += 1
    hvd.allreduce(tf.constant(0.0), name=f"barrier_{_n[0]}").numpy()

MiB = 2 ** 20
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))

def peak_during(fn):
    """(fn(), sampled peak RSS - RSS before, VmHWM after a reset - RSS before), bytes."""
    with open("/proc/self/clear_refs", "w") as f:   # "5": VmHWM := current RSS
        f.write("5")
    before, top, stop = rss(), [0], threading.Event()
    def sample():
        while not stop.is_set():
            top[0] = max(top[0], rss())
            time.sleep(0.001)
    t = threading.Thread(target=sample)
    t.start()
    out = fn()
    stop.set()
    t.join()
    top[0] = max(top[0], rss())
    return out, top[0] - before, hwm() - before

distributed.init()
rank, size, preset = hvd.rank(), hvd.size(), sys.argv[1]
model = modeling.BertPretrainer(modeling.BertConfig.preset(preset, vocab_size=30522))
variables = model.trainable_variables
out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/exchange_memory"
folder = os.path.join(out, f"ckpt-{preset}-{size}")
if rank == 0:
    shutil.rmtree(folder, ignore_errors=True)
barrier()
digest = exchange_state.weights_digest(variables)
rows = []
for method in ("powersgd", "onebit"):
    comm = CommConfig(exchange=method, powersgd_rank=4)
    ex = distributed.make_gradient_exchange(comm, variables, seed=0)
    for _ in range(2):
        ex([tf.random.normal(v.shape, seed=None) for v in variables])
    own = sum(v.numpy().nbytes for v in ex.own())
    barrier()
    target, save_peak, save_hwm = peak_during(lambda: exchange_state.save(ex, folder, 10, rank, size, digest))
    barrier()
    fresh = distributed.make_gradient_exchange(comm, variables, seed=0)
    problem, load_peak, load_hwm = peak_during(lambda: exchange_state.load(fresh, folder, 10, rank, size, digest))
    assert problem == "", problem
    same = all(bool(tf.reduce_all(a == b)) for a, b in zip(ex.own(), fresh.own()))
    rows.append(dict(method=method, ranks=size, rank=rank, own=own / MiB, file=os.path.getsize(target) / MiB,
                     save=save_peak / MiB, save_hwm=save_hwm / MiB, load=load_peak / MiB, load_hwm=load_hwm / MiB,
                     restored_equal=same, rss=rss() / MiB))
    ex = fresh = None          # freed before the next method
    barrier()
    if rank == 0:
        shutil.rmtree(os.path.join(folder, "exchange"), ignore_errors=True)
    barrier()
allrows = hvd.allgather_object(rows)
if rank == 0:
    flat = sorted((r for rs in allrows for r in rs), key=lambda r: (r["method"], r["rank"]))
    n = sum(v.numpy().size for v in variables)
    print(f"preset {preset}: {n / 1e6:.1f} M trainable parameters ({n * 4 / MiB:.1f} MiB float32), {size} ranks")
    print("method    ranks rank  own MiB  file MiB  save +MiB (sampled/HWM)  load +MiB (sampled/HWM)  restored  RSS MiB")
    for r in flat:
        print(f"{r['method']:9s} {r['ranks']:5d} {r['rank']:4d} {r['own']:8.1f} {r['file']:9.1f} "
              f"{r['save']:11.1f} / {r['save_hwm']:6.1f}  {r['load']:11.1f} / {r['load_hwm']:6.1f}  "
              f"{str(r['restored_equal']):8s} {r['rss']:8.0f}")
    for m in ("powersgd", "onebit"):
        r0 = [r for r in flat if r["method"] == m and r["rank"] == 0][0]
        print(f"OLD design, rank 0 would hold {m}: {size} x {r0['own']:.1f} = {size * r0['own']:.1f} MiB of buffers")
    with open(os.path.join(out, f"result-{preset}-{size}.json"), "w") as f:
        json.dump(flat, f, indent=1)
