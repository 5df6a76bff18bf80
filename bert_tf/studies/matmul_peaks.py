"""The hardware's peak: the best dense-matmul FLOP/s measured on this machine over every dtype and
both code paths, TensorFlow's own kernels (oneDNN on CPUs: AMX/AVX-512 bf16 where present) and XLA
(whose CPU backend does not use those kernels, so an XLA-only peak understates the hardware). The
speed ladder's MFU divides by it (bert_tf/tools/flops.py counts the model's FLOPs)."""

from __future__ import annotations

import contextlib
import time

from bert_tf.studies import machine_load


def matmul_peak(dtype="float32", n=2048, seconds=3.0, jit=True) -> float:
    """Sustained FLOP/s of an n x n x n tf.matmul in `dtype` on this machine, XLA-compiled
    (jit=True) or through TensorFlow's own kernel (jit=False). At least one timed call, so a
    dtype without hardware arithmetic (float16 on most CPUs) costs more than `seconds`."""
    # here: the FLOP counts above are arithmetic the planner uses without it
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)
    a = tf.random.normal([n, n], dtype=tf.float32)
    b = tf.random.normal([n, n], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)
    scale = tf.cast(1e-3, dtype)

    @tf.function(jit_compile=jit)
    def chain(x, y):
        # TensorFlow's way stays TensorFlow's where the process auto-clusters (a --fuse ladder)
        with (
            tf.xla.experimental.jit_scope(compile_ops=False)
            if not jit
            else contextlib.nullcontext()
        ):
            for _ in range(4):  # 4 matmuls per call: amortise the call overhead
                x = tf.matmul(x, y) * scale
            return x

    chain(a, b).numpy()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        chain(a, b).numpy()
        calls += 1
    return calls * 4 * 2.0 * n**3 / (time.perf_counter() - start)


WAYS = {"tensorflow": False, "xla": True}  # name -> jit_compile


def matmul_peaks(
    dtypes=("float32", "bfloat16", "float16"),
    n=2048,
    seconds=3.0,
    log=None,
    repeats=1,
    samples=None,
    loads=None,
) -> dict:
    """{dtype: {"tensorflow": FLOP/s, "xla": FLOP/s}}: every dtype measured both ways, `repeats`
    times each (the best counts: the peak is what the hardware can do when nothing else holds it
    back); `samples`, a dict, receives every measurement under the same keys, and `loads` what else
    ran on the machine during each (machine_load; the log names measurements made beside other
    work)."""
    peaks = {}
    for name in dtypes:
        peaks[name] = {}
        for way, jit in WAYS.items():
            runs, seen = [], []
            for _ in range(repeats):
                with machine_load.Meter() as load:
                    runs.append(matmul_peak(name, n, seconds, jit))
                seen.append(load.result)
            peaks[name][way] = max(runs)
            if samples is not None:
                samples.setdefault(name, {})[way] = runs
            if loads is not None:
                loads.setdefault(name, {})[way] = seen
            if log:
                busy = [
                    f"{r / 1e12:.3f} beside {machine_load.describe(s)}"
                    for r, s in zip(runs, seen)
                    if machine_load.busy(s)
                ]
                log(
                    f"matmul peak {name:<8} {way:<10} {max(runs) / 1e12:.3f} TFLOP/s"
                    + (
                        f" (best of {repeats}: {min(runs) / 1e12:.3f}-{max(runs) / 1e12:.3f})"
                        if repeats > 1
                        else ""
                    )
                    + (f"  WARNING: {'; '.join(busy)}" if busy else "")
                )
    return peaks


def hardware_peak(peaks: dict):
    """(FLOP/s, dtype, way) of the best measurement in matmul_peaks' result."""
    return max((value, name, way) for name, ways in peaks.items() for way, value in ways.items())
