"""Checkpoints: rank 0 writes them; shapes are checked before anything is restored.

Who reads: in a static run every rank restores the latest checkpoint (and rank 0's state is then
broadcast); in elastic mode rank 0 alone reads it and the other ranks take the state by broadcast.
A checkpoint holds what `Trainer.checkpoint_items()` lists (model, optimizer slots, step, skipped
steps, loss scale) and the input position (`input_pipeline.InputPosition`: samples seen and every
rank's iterator state, or elastic mode's one shared-stream state). The JSON file beside it (`save`'s
`extra`: step, samples seen, ranks, global batch, model config) is written for people, with one
exception: resuming takes `samples_seen` from it when the checkpoint's own position holds none (a
checkpoint written before the position was part of it; `pretraining.restore`).
`tf.train.CheckpointManager` writes the data files first and the `checkpoint` index last, so an
interrupted save leaves the previous checkpoint as the latest one; the JSON comes after the index, so
a save interrupted between the two leaves a latest checkpoint without its JSON (`read_extra` gives {}).

Keys: `tf.train.Checkpoint` stores the value of the variable at object path "model/nsp/bias" under
"model/nsp/bias/.ATTRIBUTES/VARIABLE_VALUE"; `variable_key` and `variable_path` are the only code
that spells that suffix out (checkpoint_formats uses them too). `shape_differences` is the one shape
comparison behind every check of a checkpoint against a model (here and in checkpoint_formats).
"""
from __future__ import annotations

import json
import os

import tensorflow as tf

from bert_tf import ConfigError


# Items a checkpoint may lack because older versions did not write them.
OPTIONAL_ITEMS = ("input_position",)

# What tf.train.Checkpoint appends to a variable's object path to make the key of its value.
VARIABLE_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def variable_key(*path) -> str:
    """The checkpoint key of the value of the variable at object path `path` (attribute names and
    list indices from the checkpoint's root, joined by "/"): variable_key("model", "nsp/bias") and
    variable_key("model/nsp/bias") are both "model/nsp/bias/.ATTRIBUTES/VARIABLE_VALUE"."""
    return "/".join(map(str, path)) + VARIABLE_VALUE


def variable_path(key: str, prefix: str):
    """The inverse of variable_key below `prefix`: "nsp/bias" for the key above and prefix "model";
    None for any other key (another item's, the object graph's, a Keras optimizer's .OPTIMIZER_SLOT)."""
    head = prefix + "/"
    if key.startswith(head) and key.endswith(VARIABLE_VALUE) and ".OPTIMIZER_SLOT" not in key:
        return key[len(head):-len(VARIABLE_VALUE)]
    return None


def shape_differences(expected: dict, found: dict):
    """{name: shape} of the variables to be filled (`expected`) against {name: shape} of what a
    checkpoint holds (`found`). Returns (mismatches as [(name, found shape, expected shape)] in
    `expected`'s order, names of `expected` missing from `found`, names of `found` not in `expected`)."""
    expected = {name: list(shape) for name, shape in expected.items()}
    found = {name: list(shape) for name, shape in found.items()}
    mismatches = [(name, found[name], shape) for name, shape in expected.items()
                  if name in found and found[name] != shape]
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected]
    return mismatches, missing, extra


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
        names = {name for name, _ in tf.train.list_variables(path)}
        stored = {name.split("/", 1)[0] for name in names}
        # an older checkpoint: an optional item it lacks keeps its initial values; one it holds with fewer
        # variables than today (e.g. input_position before `shared`) gets the variables it has, by name
        partial = {k for k in OPTIONAL_ITEMS if k in self.items and k in stored
                   and any(variable_key(k, v) not in names for v in _variable_names(self.items[k]))}
        missing = {k for k in OPTIONAL_ITEMS if k in self.items and k not in stored} | partial
        checkpoint = tf.train.Checkpoint(**{k: v for k, v in self.items.items() if k not in missing}) \
            if missing else self.checkpoint
        checkpoint.restore(path).assert_existing_objects_matched()
        for k in partial:
            for v in _variable_names(self.items[k]):
                key = variable_key(k, v)
                if key in names:
                    getattr(self.items[k], v).assign(tf.train.load_variable(path, key))
        return read_extra(path)


def _variable_names(module) -> list:
    """The attribute names of a tf.Module's own variables (what a checkpoint's keys are made of)."""
    return [name for name, value in vars(module).items() if isinstance(value, tf.Variable)]


def read_extra(path):
    try:
        with open(path + ".json") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def module_variables(module) -> dict:
    """{object path below the module: tf.Variable} for every variable of a tf.Module, the paths
    its checkpoint keys are made of (attribute names and list indices joined by "/")."""
    flat = module._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
    return {"/".join(map(str, path)): var for path, var in flat}


def check_compatible(path, model, prefix="model"):
    """Raises ConfigError when the checkpoint's model (its `prefix` item) differs from `model`: a
    variable of another shape (both shapes named), one only the checkpoint has, or one it lacks."""
    if model is None:
        return
    found = {}
    for key, shape in tf.train.list_variables(path):
        name = variable_path(key, prefix)
        if name is not None:
            found[name] = shape
    expected = {name: var.shape.as_list() for name, var in module_variables(model).items()}
    mismatches, missing, extra = shape_differences(expected, found)
    if mismatches or missing or extra:
        parts = [f"{prefix}/{name}: checkpoint {got} vs model {want}" for name, got, want in mismatches[:4]]
        if missing:
            parts.append(f"{len(missing)} model variables not in the checkpoint, e.g. {prefix}/{missing[0]}")
        if extra:
            parts.append(f"{len(extra)} checkpoint variables not in the model, e.g. {prefix}/{extra[0]}")
        raise ConfigError(
            f"checkpoint {path} does not fit this model: {'; '.join(parts)}. Use the model preset, "
            f"bert_config.json and vocab of the run that wrote it, or another --checkpoint_dir.")
