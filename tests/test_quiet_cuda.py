"""Quiet on a CPU machine (bert_tf/quiet_cuda.py): importing bert_tf wraps TensorFlow's first import so the
CUDA probe's lines ("Could not find cuda drivers", "failed call to cuInit") do not reach stderr, and every
other line does."""
import subprocess
import sys

import pytest

from bert_tf import quiet_cuda


def stderr_of(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_the_wrap_drops_the_probe_lines_and_keeps_the_rest_in_order():
    err = stderr_of("""
import os
from bert_tf import quiet_cuda
with quiet_cuda.stderr_without(quiet_cuda.is_cuda_probe):
    os.write(2, b"before\\n")
    os.write(2, b"E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL\\n")
    os.write(2, b"I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers on your machine\\n")
    print("a real error", file=__import__("sys").stderr)
os.write(2, b"after\\n")
""")
    assert err == "before\na real error\nafter\n", err


def test_the_wrap_gives_back_what_was_written_when_the_block_raises():
    err = subprocess.run([sys.executable, "-c", """
import os
from bert_tf import quiet_cuda
with quiet_cuda.stderr_without(quiet_cuda.is_cuda_probe):
    os.write(2, b"the reason it failed\\n")
    raise SystemExit(3)
"""], capture_output=True, text=True, timeout=60)
    assert err.returncode == 3 and err.stderr == "the reason it failed\n", err.stderr


@pytest.mark.slow
def test_importing_tensorflow_through_bert_tf_prints_no_cuda_probe_on_a_cpu_machine():
    if quiet_cuda.has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver: the wrap is off by design (the GPU path is unchanged)")
    plain = stderr_of("import tensorflow as tf; tf.config.list_physical_devices()")
    assert any(quiet_cuda.is_cuda_probe(line) for line in plain.splitlines()), \
        f"TensorFlow printed no CUDA probe here, so this test shows nothing: {plain[-2000:]}"
    quiet = stderr_of("import bert_tf, tensorflow as tf; tf.config.list_physical_devices(); print(tf.constant(1) + 1)")
    assert not [line for line in quiet.splitlines() if quiet_cuda.is_cuda_probe(line)], quiet[-2000:]
