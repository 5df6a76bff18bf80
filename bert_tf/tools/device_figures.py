"""Measured device figures (run/benchmark.py --device_figures, scripts/gpu_check.sh), the JSON
run/plan.py reads instead of its per-device speed flags."""

from __future__ import annotations

from bert_tf import ConfigError

# run/plan.py's flag -> the sequence length it is for
DEVICE_FIGURES = {"phase1_device_seq_s": 128, "phase2_device_seq_s": 512}
LINK_FIGURES = ("intra_gbps",)


def record_device_figures(path, model_preset, seq_length, sequences_per_second, **details):
    """Adds one measured figure (the fastest rung's sequences/s at 128 or 512) to the JSON at
    `path`, keeping the other phase's; written to a temporary name, then renamed."""
    import json
    import os

    key = next((k for k, seq in DEVICE_FIGURES.items() if seq == seq_length), None)
    if key is None:
        raise ConfigError(
            f"--device_figures: the plan's phases run at sequence 128 and 512, not {seq_length}"
        )
    figures = {}
    if os.path.exists(path):
        figures = read_device_figures(path, model_preset)
    figures.update({"model_preset": model_preset, key: sequences_per_second, **details})
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(figures, f, indent=1)
    os.replace(tmp, path)
    return figures


def read_device_figures(path, model_preset) -> dict:
    """The JSON of measured figures, checked: written for `model_preset`, every figure a positive
    number."""
    import json

    try:
        with open(path) as f:
            figures = json.load(f)
    except OSError as e:
        raise ConfigError(f"--device_figures={path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--device_figures={path}: not JSON ({e})") from None
    if not isinstance(figures, dict) or figures.get("model_preset") != model_preset:
        found = figures.get("model_preset") if isinstance(figures, dict) else None
        raise ConfigError(
            f"--device_figures={path}: measured on BERT-{found}, but the plan is for "
            f"BERT-{model_preset} (--model_preset)"
        )
    for key in (*DEVICE_FIGURES, *LINK_FIGURES):
        if key in figures and not (isinstance(figures[key], (int, float)) and figures[key] > 0):
            raise ConfigError(
                f"--device_figures={path}: {key} must be a positive number, got {figures[key]!r}"
            )
    if not any(key in figures for key in DEVICE_FIGURES):
        raise ConfigError(f"--device_figures={path}: no {' or '.join(DEVICE_FIGURES)}")
    return figures
