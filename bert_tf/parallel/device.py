"""The device a rank runs on: what it is (`device_description`) and whether a precision has its own
arithmetic there (`precision_warning`)."""

from __future__ import annotations

import os

import tensorflow as tf


# CPU flags that give a precision its own arithmetic (oneDNN); without them it is emulated.
NATIVE_CPU_FLAGS = {
    "mixed_bfloat16": ("avx512_bf16", "amx_bf16"),
    "mixed_float16": ("avx512_fp16", "amx_fp16"),
}


def precision_warning(precision, device: dict, ladder_sequences_per_second=0.0) -> str:
    """A warning when --precision has no hardware arithmetic on this CPU (allowed, but slow),
    with the ladder's measured figure when there is one; "" otherwise (or on GPUs)."""
    if "gpus" in device or precision not in NATIVE_CPU_FLAGS:
        return ""
    if any(flag in device.get("cpu_features", []) for flag in NATIVE_CPU_FLAGS[precision]):
        return ""
    measured = (
        f"run/benchmark.py measured {ladder_sequences_per_second:.2f} seq/s for it"
        if ladder_sequences_per_second
        else "run/benchmark.py measures what it costs"
    )
    return (
        f"warning: --precision={precision} on a CPU without "
        f"{' or '.join(NATIVE_CPU_FLAGS[precision])} ({device.get('cpu', 'unknown CPU')}): "
        f"emulated and usually slower than float32; {measured}"
    )


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")


def device_description(cpuinfo="/proc/cpuinfo") -> dict:
    """What the ladder ran on: the GPU names if TensorFlow sees any, else the CPU model and
    which of CPU_FEATURES its flags include."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return {
            "gpus": [
                tf.config.experimental.get_device_details(g).get("device_name", g.name)
                for g in gpus
            ]
        }
    model, found = "unknown CPU", []
    if os.path.exists(cpuinfo):
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    found = [name for name in CPU_FEATURES if name in flags]
                    break
    return {"cpu": model, "cpu_features": found, "cpu_count": os.cpu_count()}
