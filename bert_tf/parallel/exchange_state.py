"""The gradient exchange as checkpoint state: which exchange a run uses, and each rank's own error
buffers.

Which exchange: the method and PowerSGD rank that --exchange named, or that `auto` chose, are
recorded in every checkpoint's JSON ("exchange"). A resume keeps them (`settle_choice`) and says so,
so `auto` is chosen once per job, not afresh at every start on a link that measures differently; a
run that names another method uses it, and its buffers start afresh, with a log line.

Whose buffers: error feedback is each rank's own and O(model) (PowerSGD's residuals, 1-bit's two
errors). No rank ever holds another rank's: before a checkpoint each rank writes its own to

    <checkpoint_dir>/exchange/ckpt-<step>/rank-<r>-of-<ranks>.npz

and a resumed run's rank r reads back only that file (`save` / `load`); rank 0's also holds Q (the
same on every rank), which a resume broadcasts. So a rank's memory for the exchange is its own
buffers whatever the rank count (docs/results.md, "Exchange state per rank"). With the checkpoint
folder on shared storage every file is where every rank looks; on node-local disks each node keeps
its own ranks' files and a resume finds them when every rank comes back on the node that wrote them
(otherwise those ranks start at zero). Each file names the exchange, the rank count, the step and a
digest of the weights it was saved with: a file of another method, PowerSGD rank or rank count, one
from another run, or none at all gives a log line and zero buffers on that rank, never a crash and
never another rank's buffers. Error feedback restarting at zero loses only the not-yet-sent residual
of one update.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os

import numpy as np

from bert_tf.parallel.comm import RECORD_KEY

FOLDER = "exchange"


def record(comm) -> dict:
    """What a checkpoint records of the exchange a run uses (comm: a resolved CommConfig)."""
    return {
        RECORD_KEY: comm.method,
        "powersgd_rank": comm.powersgd_rank if comm.method == "powersgd" else 0,
    }


def method_of(recorded: dict):
    """The exchange a record names: under RECORD_KEY ("gradient_compression", as this version and
    older ones write it) or "exchange"."""
    return recorded["exchange"] if "exchange" in recorded else recorded.get(RECORD_KEY)


def normalized(recorded: dict) -> dict:
    """A record (or a file's header) with its exchange under RECORD_KEY, whichever key it was
    written with."""
    return {
        **{k: v for k, v in recorded.items() if k != "exchange"},
        RECORD_KEY: method_of(recorded),
    }


def name(recorded: dict) -> str:
    method = method_of(recorded)
    return f"powersgd rank {recorded['powersgd_rank']}" if method == "powersgd" else method


def settle_choice(asked, recorded: dict | None, choose):
    """(the CommConfig this run uses, a log line or ""). asked: the run's CommConfig; recorded: the
    resumed checkpoint's `record` (None: a fresh run, or a checkpoint from before it was recorded);
    choose(): `auto`'s measurement, called only when nothing is recorded."""
    if asked.exchange == "auto":
        if recorded is None:
            return choose(), ""
        kept = dataclasses.replace(
            asked,
            exchange=method_of(recorded),
            powersgd_rank=recorded["powersgd_rank"] or asked.powersgd_rank,
            fp16_allreduce=False,
        )
        return kept, (
            f"gradients: the resumed checkpoint's exchange, {name(recorded)}, is kept "
            f"(--exchange=auto chooses once per job; name a method to change it)"
        )
    if recorded is None or record(asked) == normalized(recorded):
        return asked, ""
    return asked, (
        f"gradients: the checkpoint was trained with {name(recorded)}, this run names "
        f"{name(record(asked))}: the exchange's buffers start afresh"
    )


def weights_digest(variables) -> str:
    """A short hash of the variables' values: identifies the state a file was saved with."""
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def path(directory, step, rank, ranks) -> str:
    return os.path.join(directory, FOLDER, f"ckpt-{int(step)}", f"rank-{rank}-of-{ranks}.npz")


def save(exchange, directory, step, rank, ranks, digest, keep=3) -> str:
    """This rank's own buffers (and on rank 0, Q) beside checkpoint `step`; atomic (a temporary file
    renamed); this rank's files of older checkpoints beyond the newest `keep` are removed. Returns
    the path."""
    target = path(directory, step, rank, ranks)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    arrays = {f"own_{i}": v.numpy() for i, v in enumerate(exchange.own())}
    if rank == 0:
        arrays.update({f"shared_{i}": v.numpy() for i, v in enumerate(exchange.shared())})
    header = dict(exchange.describe(), ranks=ranks, rank=rank, step=int(step), digest=digest)
    tmp = target + ".tmp.npz"
    np.savez(tmp, header=np.array(repr(sorted(header.items()))), **arrays)
    os.replace(tmp, target)
    _prune(directory, rank, keep)
    return target


def _prune(directory, rank, keep):
    """This rank's files beyond the newest `keep` checkpoints (each rank its own: node-local disks
    too)."""
    mine = glob.glob(
        os.path.join(glob.escape(directory), FOLDER, "ckpt-*", f"rank-{rank}-of-*.npz")
    )
    step = lambda p: int(os.path.basename(os.path.dirname(p))[len("ckpt-") :])
    steps = sorted({step(p) for p in mine}, reverse=True)
    for p in mine:
        if step(p) not in steps[:keep]:
            os.remove(p)
            try:
                os.rmdir(os.path.dirname(p))  # the last rank's file of that checkpoint
            except OSError:
                pass


def _header(loaded) -> dict:
    import ast

    return dict(ast.literal_eval(str(loaded["header"])))


def load(exchange, directory, step, rank, ranks, digest) -> str:
    """This rank's buffers from its own file for checkpoint `step` (and on rank 0, Q): "" when
    restored, else why not, the buffers then at zero (`exchange.reset(ranks)`). The caller
    broadcasts Q from rank 0."""
    exchange.reset(ranks)
    target = path(directory, step, rank, ranks)
    if not os.path.exists(target):
        others = glob.glob(
            os.path.join(glob.escape(os.path.dirname(target)), f"rank-{rank}-of-*.npz")
        )
        if others:
            saved = os.path.basename(others[0]).split("-of-")[1][: -len(".npz")]
            return f"saved at {saved} ranks, this run has {ranks}"
        return f"no file of its own ({target})"
    try:
        with np.load(target) as loaded:
            header, arrays = normalized(_header(loaded)), {k: loaded[k] for k in loaded.files}
    except (OSError, ValueError, SyntaxError, KeyError) as e:
        return f"{target} is unreadable ({e.__class__.__name__})"
    wanted = dict(exchange.describe(), ranks=ranks, rank=rank, step=int(step), digest=digest)
    if {k: header.get(k) for k in wanted if k != "digest"} != {
        k: v for k, v in wanted.items() if k != "digest"
    }:
        return (
            f"{target} was written by {name(header)} on {header.get('ranks')} ranks, this run uses "
            f"{name(wanted)}"
        )
    if header.get("digest") != digest:
        return (
            f"{target} is from another run (saved with weights {header.get('digest')}, this "
            f"checkpoint's are {digest})"
        )
    variables = exchange.own() + (exchange.shared() if rank == 0 else [])
    values = [arrays[f"own_{i}"] for i in range(len(exchange.own()))] + (
        [arrays[f"shared_{i}"] for i in range(len(exchange.shared()))] if rank == 0 else []
    )
    if any(v.numpy().shape != a.shape for v, a in zip(variables, values)):
        return f"{target} holds buffers of other shapes (another model)"
    for v, a in zip(variables, values):
        v.assign(a)
    return ""


def summary(problems: list, ranks) -> str:
    """One log line from every rank's `load` answer (rank order)."""
    failed = [(r, p) for r, p in enumerate(problems) if p]
    if not failed:
        return (
            f"gradient compression: each of the {ranks} ranks restored its own error buffers from "
            "its own file"
        )
    kept = ranks - len(failed)
    return (
        "gradient compression: "
        + "; ".join(f"rank {r}: {p}" for r, p in failed)
        + (": those ranks start at zero" if len(failed) > 1 else ": that rank starts at zero")
        + (f", the other {kept} restored their own" if kept else "")
    )


def restore(trainer, directory, step, rank, size, gather, broadcast_variables) -> str:
    """Every rank takes its own error buffers back from its own file for checkpoint `step` (or
    zeros, and why), and rank 0's Q (a collective: `gather` and `broadcast_variables` of the job's
    world). Returns the log line."""
    exchange = trainer.exchange
    digest = weights_digest(trainer.variables)
    problem = load(exchange, directory, step, rank, size, digest)
    problems = [p.decode() for p in gather(problem.encode())]
    if exchange.shared():
        broadcast_variables(exchange.shared())
    return summary(problems, size)


def save_own(trainer, directory, step, rank, size, keep) -> None:
    """Before checkpoint `step`: this rank's own error buffers to its own file (every rank; no
    collective)."""
    if trainer.exchange.own():
        save(trainer.exchange, directory, step, rank, size, weights_digest(trainer.variables), keep)
