"""Checkpoints: rank 0 writes them; shapes are checked before anything is restored.

Who reads: in a static run every rank restores the latest checkpoint (and rank 0's state is then
broadcast); in elastic mode rank 0 alone reads it and the other ranks take the state by broadcast.
A checkpoint holds what `Trainer.checkpoint_items()` lists (model, optimizer slots, step, skipped
steps, loss scale) and the input position (`input_pipeline.InputPosition`: samples seen and every
rank's iterator state, or elastic mode's one shared-stream state). The JSON file beside it (`save`'s
`extra`: step, samples seen, ranks, global batch, model config) is written for people, with one
exception: resuming takes `samples_seen` from it when the checkpoint's own position holds none (a
checkpoint written before the position was part of it; `startup.restore`).
`tf.train.CheckpointManager` writes the data files first and the `checkpoint` index last, so an
interrupted save leaves the previous checkpoint as the latest one; the JSON comes after the index,
so a save interrupted between the two leaves a latest checkpoint without its JSON (`read_extra`
gives {}).

Damage: each save ends by writing `ckpt-N.manifest.json`, the sizes and SHA-256 of the checkpoint's
files, read back from the disk. `latest_intact` takes the newest checkpoint whose files match its
manifest and says which newer ones it passed over and why (a file truncated, overwritten, missing,
or no manifest: the save did not finish); a folder none of whose checkpoints has a manifest was
written before manifests existed and resumes from its latest, as it did. A save that fills the disk
removes its partial files and stops with the folder, the bytes it needed and what is free, the
previous checkpoint untouched.

Keys: `tf.train.Checkpoint` stores the value of the variable at object path "model/nsp/bias" under
"model/nsp/bias/.ATTRIBUTES/VARIABLE_VALUE"; `variable_key` and `variable_path` are the only code
that spells that suffix out (checkpoint_formats uses them too). `shape_differences` is the one shape
comparison behind every check of a checkpoint against a model (here and in checkpoint_formats).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil

import tensorflow as tf

from bert_tf import ConfigError, sha256


# Items a checkpoint may lack because older versions (or runs without --exchange=onebit and LAMB:
# onebit_lamb, optimization.FrozenTrust) did not write them.
OPTIONAL_ITEMS = ("input_position", "clock", "gradient_exchange", "outer_step", "onebit_lamb")

# What tf.train.Checkpoint appends to a variable's object path to make the key of its value.
VARIABLE_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def variable_key(*path) -> str:
    """The checkpoint key of the value of the variable at object path `path` (attribute names and
    list indices from the checkpoint's root, joined by "/"): variable_key("model", "nsp/bias") and
    variable_key("model/nsp/bias") are both "model/nsp/bias/.ATTRIBUTES/VARIABLE_VALUE"."""
    return "/".join(map(str, path)) + VARIABLE_VALUE


def variable_path(key: str, prefix: str):
    """The inverse of variable_key below `prefix`: "nsp/bias" for the key above and prefix "model";
    None for any other key (another item's, the object graph's, a Keras optimizer's
    .OPTIMIZER_SLOT)."""
    head = prefix + "/"
    if key.startswith(head) and key.endswith(VARIABLE_VALUE) and ".OPTIMIZER_SLOT" not in key:
        return key[len(head) : -len(VARIABLE_VALUE)]
    return None


def shape_differences(expected: dict, found: dict):
    """{name: shape} of the variables to be filled (`expected`) against {name: shape} of what a
    checkpoint holds (`found`). Returns (mismatches as [(name, found shape, expected shape)] in
    `expected`'s order, names of `expected` missing from `found`, names of `found` not in
    `expected`)."""
    expected = {name: list(shape) for name, shape in expected.items()}
    found = {name: list(shape) for name, shape in found.items()}
    mismatches = [
        (name, found[name], shape)
        for name, shape in expected.items()
        if name in found and found[name] != shape
    ]
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected]
    return mismatches, missing, extra


MANIFEST = ".manifest.json"


def checkpoint_files(path) -> list:
    """The files of the checkpoint with prefix `path` (its .index and .data-* shards)."""
    return sorted(
        glob.glob(glob.escape(path) + ".index") + glob.glob(glob.escape(path) + ".data-*")
    )


def write_manifest(path):
    """Sizes and checksums of the checkpoint's files as they are on the disk, written last
    (atomically)."""
    # by suffix (".index", ".data-00000-of-00001"): a checkpoint copied under another name still
    # checks out
    files = {
        f[len(path) :]: {"bytes": os.path.getsize(f), "sha256": sha256(f)}
        for f in checkpoint_files(path)
    }
    tmp = path + MANIFEST + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, indent=1)
    os.replace(tmp, path + MANIFEST)


def damage(path):
    """Why the checkpoint `path` cannot be trusted, or None when its files match its manifest."""
    try:
        with open(path + MANIFEST) as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        return "no manifest: its save did not finish"
    except (ValueError, KeyError, TypeError) as e:
        return f"its manifest is unreadable ({e})"
    for suffix, want in sorted(files.items()):
        file, name = path + suffix, os.path.basename(path) + suffix
        if not os.path.exists(file):
            return f"{name} is missing"
        size = os.path.getsize(file)
        if size != want["bytes"]:
            return (
                f"{name} has {size} bytes, its manifest says {want['bytes']} (truncated or "
                "overwritten)"
            )
        if sha256(file) != want["sha256"]:
            return f"{name} does not match its manifest's SHA-256 (damaged)"
    if ".index" not in files or len(files) < 2:
        return "its manifest lists no index and data files"
    return None


def _step_of(path):
    return int(re.search(r"-(\d+)$", path).group(1))


def latest_intact(directory, log=print, before_step=None):
    """The newest checkpoint in `directory` whose files match its manifest (None: no checkpoint),
    logging each newer one passed over and why; ConfigError when there are checkpoints and none is
    intact. `before_step`: only checkpoints of earlier steps (the divergence guard going further
    back)."""
    if "://" in directory:  # a remote file system: TensorFlow's own index
        return tf.train.latest_checkpoint(directory)
    if not os.path.isdir(directory):
        return None
    try:  # the checkpoints the folder's `checkpoint` index lists, as TensorFlow's
        state = tf.train.get_checkpoint_state(directory)
    except Exception as e:  # noqa: BLE001 (a garbled index: the files on disk instead)
        log(
            f"{directory}/checkpoint is unreadable ({e.__class__.__name__}): looking at the "
            "checkpoint files"
        )
        state = None
        listed = [
            f[: -len(".index")]
            for f in glob.glob(os.path.join(glob.escape(directory), "ckpt-*.index"))
        ]
    else:
        if state is None:
            return None
        listed = list(state.all_model_checkpoint_paths) or [
            state.model_checkpoint_path
        ]  # joined to directory
    prefixes = sorted({p for p in listed if re.search(r"-\d+$", p)}, key=_step_of, reverse=True)
    if before_step is not None:
        prefixes = [p for p in prefixes if _step_of(p) < before_step]
        if not prefixes:
            return None
    if not prefixes:
        return tf.train.latest_checkpoint(directory) if state else None
    if not any(os.path.exists(p + MANIFEST) for p in prefixes):
        return (
            tf.train.latest_checkpoint(directory) or prefixes[0]
        )  # saved before manifests existed
    passed = []
    for path in prefixes:
        reason = damage(path)
        if reason is None:
            if passed:
                log(
                    f"checkpoint {passed[0][0]} is damaged or incomplete ({passed[0][1]})"
                    + "".join(f"; so is {p} ({r})" for p, r in passed[1:])
                    + f": resuming from {path}, the newest intact checkpoint"
                )
            return path
        passed.append((path, reason))
    raise ConfigError(
        f"--checkpoint_dir={directory}: no intact checkpoint: "
        + "; ".join(f"{p}: {r}" for p, r in passed)
        + " (move the folder aside to start afresh, or --init_checkpoint= one of them at your own "
        "risk)"
    )


class Checkpoints:
    def __init__(self, directory, items: dict, keep_last=3, is_writer=True):
        self.directory = directory
        self.is_writer = is_writer
        self.checkpoint = tf.train.Checkpoint(**items)
        self.items = items
        self.keep_last = keep_last
        if is_writer:
            os.makedirs(directory, exist_ok=True)
        self.manager = (
            tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep_last)
            if is_writer
            else None
        )

    def set_writer(self, is_writer):
        """Elastic mode: after a resize another process may be rank 0."""
        if is_writer and self.manager is None:
            os.makedirs(self.directory, exist_ok=True)
            self.manager = tf.train.CheckpointManager(
                self.checkpoint, self.directory, max_to_keep=self.keep_last
            )
        self.is_writer = is_writer

    def latest(self, log=print, before_step=None):
        return latest_intact(self.directory, log, before_step)

    def save(self, step, extra: dict | None = None):
        """Rank 0 only; other ranks return None. `extra` goes to a JSON file beside it."""
        if not self.is_writer or self.manager is None:
            return None
        previous = self.manager.latest_checkpoint
        try:
            path = self.manager.save(checkpoint_number=int(step))
            if extra is not None:
                tmp = path + ".json.tmp"
                with open(tmp, "w") as f:
                    json.dump(extra, f, indent=1)
                os.replace(tmp, path + ".json")
            if (
                "://" not in self.directory
            ):  # local folders (gs:// and the like have their own checksums)
                write_manifest(path)
            for orphan in glob.glob(os.path.join(glob.escape(self.directory), "ckpt-*" + MANIFEST)):
                if not os.path.exists(orphan[: -len(MANIFEST)] + ".index"):  # swept by keep_last
                    os.remove(orphan)
        except (OSError, tf.errors.OpError) as e:
            if not _disk_full(e):
                raise
            self._disk_full(int(step), previous, e)
        return path

    def _disk_full(self, step, previous, error):
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        for f in glob.glob(
            glob.escape(prefix) + "*"
        ):  # this save's partial files (shards, temp folders)
            shutil.rmtree(f) if os.path.isdir(f) else os.remove(f)
        needed = sum(os.path.getsize(f) for f in checkpoint_files(previous)) if previous else None
        free = shutil.disk_usage(self.directory).free
        raise ConfigError(
            f"--checkpoint_dir={self.directory}: the disk filled up while saving step {step} ("
            f"{error.__class__.__name__}); a checkpoint needs about "
            + (f"{needed:,} bytes" if needed else "as much as the model and optimizer state")
            + f", {free:,} are free; "
            + (f"the previous checkpoint {previous} is intact" if previous else "nothing was saved")
            + ": free space or move --checkpoint_dir, then run again to resume"
        )

    def restore(self, path):
        check_compatible(path, self.items.get("model"))
        names = {name for name, _ in tf.train.list_variables(path)}
        stored = {name.split("/", 1)[0] for name in names}
        # an older checkpoint: an optional item it lacks keeps its initial values; one it holds with
        # fewer variables than today (e.g. input_position before `shared`) gets the variables it
        # has, by name
        partial = {
            k
            for k in OPTIONAL_ITEMS
            if k in self.items
            and k in stored
            and any(variable_key(k, v) not in names for v in _variable_names(self.items[k]))
        }
        missing = {k for k in OPTIONAL_ITEMS if k in self.items and k not in stored} | partial
        checkpoint = (
            tf.train.Checkpoint(**{k: v for k, v in self.items.items() if k not in missing})
            if missing
            else self.checkpoint
        )
        checkpoint.restore(path).assert_existing_objects_matched()
        for k in partial:
            for v in _variable_names(self.items[k]):
                key = variable_key(k, v)
                if key in names:
                    getattr(self.items[k], v).assign(tf.train.load_variable(path, key))
        return read_extra(path)


def _disk_full(error) -> bool:
    return (
        getattr(error, "errno", None) == errno.ENOSPC
        or "No space left on device" in str(error)
        or "ENOSPC" in str(error)
    )


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
        parts = [
            f"{prefix}/{name}: checkpoint {got} vs model {want}"
            for name, got, want in mismatches[:4]
        ]
        if missing:
            parts.append(
                f"{len(missing)} model variables not in the checkpoint, e.g. {prefix}/{missing[0]}"
            )
        if extra:
            parts.append(
                f"{len(extra)} checkpoint variables not in the model, e.g. {prefix}/{extra[0]}"
            )
        raise ConfigError(
            f"checkpoint {path} does not fit this model: {'; '.join(parts)}. Use the model preset, "
            f"bert_config.json and vocab of the run that wrote it, or another --checkpoint_dir."
        )
