"""Quiet on a CPU machine: TensorFlow's wheel probes for CUDA when it is imported and when it first
lists devices, and on a machine without an NVIDIA driver it prints "Could not find cuda drivers" and
"failed call to cuInit: ... UNKNOWN ERROR (303)" from every process, which a newcomer reads as a
broken install. `install()` (called when bert_tf is imported) wraps that first import of TensorFlow:
stderr goes to a temporary file meanwhile, and every line of it except the CUDA probe's is written
back. On a machine with a driver (/dev/nvidiactl or /proc/driver/nvidia) nothing is wrapped: a GPU
node's messages are news.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile

# The probe's lines only: everything else TensorFlow prints while importing (oneDNN's notice, real
# errors) is written back.
CUDA_PROBE = (
    "cudart_stub.cc",
    "cuda_platform.cc",
    "cuda_executor.cc",
    "cuda_diagnostics.cc",
    "Could not find cuda drivers",
    "failed call to cuInit",
)


def has_nvidia_driver() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")


def is_cuda_probe(line: str) -> bool:
    return any(marker in line for marker in CUDA_PROBE)


@contextlib.contextmanager
def stderr_without(drop):
    """File descriptor 2 (C++ logging writes there, not to sys.stderr) into a temporary file for the
    block; then every line `drop(line)` refuses is written to the real stderr, also when the block
    raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines(True)
                if not drop(line)
            ]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


class _FirstTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, through the other finders, and runs its module code and first device
    listing (where cuInit is called) inside stderr_without(is_cuda_probe)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once; and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            with stderr_without(is_cuda_probe):
                load(module)
                module.config.list_physical_devices()

        spec.loader.exec_module = exec_module
        return spec


def install():
    """Once per process, before TensorFlow is imported; nothing on a machine with an NVIDIA
    driver."""
    if "tensorflow" in sys.modules or has_nvidia_driver():
        return
    if not any(isinstance(f, _FirstTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FirstTensorFlowImport())
