"""Worker for tests/test_horovod_stack.py: every rank runs the checks and writes rankN.json."""
import json
import os
import sys

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import horovod.tensorflow as hvd

out_dir = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()
result = {"hvd_rank": rank, "hvd_size": size,
          "mpi_rank": MPI.COMM_WORLD.Get_rank(), "mpi_size": MPI.COMM_WORLD.Get_size()}

# 1. Allreduce of known per-rank tensors: rank r sends (r + 1) * base.
base = np.array([0.1, 1.0, 3.3333333, -7.25, 1000.125, 1e-3], np.float32)
mine = tf.constant(base * (rank + 1))
result["avg"] = hvd.allreduce(mine, op=hvd.Average, name="exact").numpy().tolist()
result["avg_fp16"] = hvd.allreduce(mine, op=hvd.Average, name="compressed",
                                   compression=hvd.Compression.fp16).numpy().tolist()
result["avg_fp16_dtype"] = hvd.allreduce(mine, op=hvd.Average, name="compressed_dtype",
                                         compression=hvd.Compression.fp16).dtype.name
result["base"] = base.tolist()

# 2. Broadcast: each rank starts from different values.
v = tf.Variable(tf.fill([3, 2], float(rank + 10)))
w = tf.Variable(tf.range(4, dtype=tf.float32) * (rank + 1))
hvd.broadcast_variables([v, w], root_rank=0)
result["broadcast"] = [v.numpy().tolist(), w.numpy().tolist()]

# 3. DistributedGradientTape on half batches vs the plain gradient of the whole batch.
rng = np.random.RandomState(1234)          # same data on every rank
x_all = rng.randn(8, 5).astype(np.float32)
y_all = rng.randn(8, 1).astype(np.float32)
kernel = tf.Variable(rng.randn(5, 1).astype(np.float32))
bias = tf.Variable([0.5])


def loss_fn(x, y):
    return tf.reduce_mean(tf.square(tf.tanh(x @ kernel + bias) - y))


half = len(x_all) // size
xs, ys = x_all[rank * half:(rank + 1) * half], y_all[rank * half:(rank + 1) * half]
with tf.GradientTape() as tape:
    loss = loss_fn(xs, ys)
dist = hvd.DistributedGradientTape(tape).gradient(loss, [kernel, bias])
with tf.GradientTape() as tape:
    loss = loss_fn(x_all, y_all)
full = tape.gradient(loss, [kernel, bias])
result["grad_distributed"] = [g.numpy().ravel().tolist() for g in dist]
result["grad_full_batch"] = [g.numpy().ravel().tolist() for g in full]

hvd.join()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
