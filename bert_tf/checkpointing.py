"""Checkpoints: rank 0 writes, every rank reads; shapes are checked before anything is restored.

A checkpoint holds what `Trainer.checkpoint_items()` lists (model, optimizer slots, step,
loss scale) and the input position (`input_pipeline.InputPosition`: samples seen, every rank's
iterator state), so it is the only source of truth for resuming; the JSON beside it is for people. `tf.train.CheckpointManager` writes the data files first and the `checkpoint`
index last, so an interrupted save leaves the previous checkpoint as the latest one.
"""
from __future__ import annotations

import json
import os

import tensorflow as tf

from bert_tf import ConfigError


# Items a checkpoint may lack because older versions did not write them.
OPTIONAL_ITEMS = ("input_position",)


class Checkpoints:
    def __init__(self, directory, items: dict, keep_last=3, is_writer=True):
        self.directory = directory
        self.is_writer = is_writer
        self.checkpoint = tf.train.Checkpoint(**items)
        self.items = items
        self.keep_last = keep_last
        if is_writer:
            os.makedirs(directory, exist_ok=True)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep_last) \
            if is_writer else None

    def set_writer(self, is_writer):
        """Elastic mode: after a resize another process may be rank 0."""
        if is_writer and self.manager is None:
            os.makedirs(self.directory, exist_ok=True)
            self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=self.keep_last)
        self.is_writer = is_writer

    def latest(self):
        return tf.train.latest_checkpoint(self.directory) if os.path.isdir(self.directory) else None

    def save(self, step, extra: dict | None = None):
        """Rank 0 only; other ranks return None. `extra` goes to a JSON file beside it."""
        if not self.is_writer:
            return None
        path = self.manager.save(checkpoint_number=int(step))
        if extra is not None:
            tmp = path + ".json.tmp"
            with open(tmp, "w") as f:
                json.dump(extra, f, indent=1)
            os.replace(tmp, path + ".json")
        return path

    def restore(self, path):
        check_compatible(path, self.items.get("model"))
        stored = {name.split("/", 1)[0] for name, _ in tf.train.list_variables(path)}
        missing = [k for k in OPTIONAL_ITEMS if k in self.items and k not in stored]
        if missing:  # an older checkpoint: restore what it has, the optional items keep their initial values
            items = {k: v for k, v in self.items.items() if k not in missing}
            tf.train.Checkpoint(**items).restore(path).assert_existing_objects_matched()
        else:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return read_extra(path)


def read_extra(path):
    try:
        with open(path + ".json") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def model_variable_shapes(model, prefix="model"):
    """{checkpoint key: shape} for the model's variables (tf.Module attribute paths)."""
    flat = model._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
    return {"/".join([prefix, *map(str, path)]) + "/.ATTRIBUTES/VARIABLE_VALUE": var.shape.as_list()
            for path, var in flat}


def check_compatible(path, model, prefix="model"):
    """Raises ValueError naming both shapes when the checkpoint's model differs from `model`."""
    if model is None:
        return
    stored = dict(tf.train.list_variables(path))
    expected = model_variable_shapes(model, prefix)
    mismatches = [f"{name.split('/.ATTRIBUTES')[0]}: checkpoint {list(stored[name])} vs model {shape}"
                  for name, shape in expected.items() if name in stored and list(stored[name]) != shape]
    missing = [name.split("/.ATTRIBUTES")[0] for name in expected if name not in stored]
    extra = [name.split("/.ATTRIBUTES")[0] for name in stored
             if name.startswith(prefix + "/") and name.endswith("VARIABLE_VALUE") and name not in expected]
    if mismatches or missing or extra:
        parts = mismatches[:4]
        if missing:
            parts.append(f"{len(missing)} model variables not in the checkpoint, e.g. {missing[0]}")
        if extra:
            parts.append(f"{len(extra)} checkpoint variables not in the model, e.g. {extra[0]}")
        raise ConfigError(
            f"checkpoint {path} does not fit this model: {'; '.join(parts)}. Use the model preset, "
            f"bert_config.json and vocab of the run that wrote it, or another --checkpoint_dir.")

