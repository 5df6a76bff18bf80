"""Worker for the emulated-cluster test: K fp32 allreduces of a 4 MB tensor (no compression)."""
import sys

import tensorflow as tf

import horovod.tensorflow as hvd

hvd.init()
count = int(sys.argv[1])
tensor = tf.ones([1024 * 1024], tf.float32) * (hvd.rank() + 1)
for i in range(count):
    out = hvd.allreduce(tensor, op=hvd.Sum, name=f"volume_{i}")
assert float(out[0]) == sum(range(1, hvd.size() + 1))
print("ok", hvd.rank(), flush=True)
