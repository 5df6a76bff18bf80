"""Launching one run of the recipe race: run/pretrain.py on `ranks` processes of this machine, or
on an emulated cluster's nodes, its console in race.log. A run records how it ended (metrics.jsonl's
"end" record), so a race spanning sessions runs only what is left (to_run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bert_tf import ConfigError
from bert_tf.artifacts import metrics
from bert_tf.studies import emulated_cluster, race_sweep


def launch(flagfile: str, run_dir: str, ranks: int, extra=(), log=print, mpirun=None) -> float:
    """One recipe: `ranks` processes on this machine (mpirun), run/pretrain.py --flagfile; returns
    seconds. `mpirun`: another launch prefix for the ranks (an emulated cluster's)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mpirun = mpirun or [
        "mpirun",
        "-np",
        str(ranks),
        "--oversubscribe",
        "--bind-to",
        "none",
        "-x",
        "PATH",
        "-x",
        "TF_CPP_MIN_LOG_LEVEL",
    ]
    command = [
        *mpirun,
        sys.executable,
        os.path.join(repo, "run", "pretrain.py"),
        f"--flagfile={flagfile}",
        f"--checkpoint_dir={run_dir}",
        *extra,
    ]
    env = emulated_cluster.mpirun_env()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    os.makedirs(run_dir, exist_ok=True)
    log(f"racing {os.path.basename(run_dir)}: {' '.join(command)}")
    start = time.time()
    for attempt in (1, 2):
        with open(os.path.join(run_dir, "race.log"), "a") as out:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=repo)
        # a launch that failed before the run started (seen here: OpenMPI's daemons on 4 emulated
        # nodes, once in two launches: "ORTE does not know how to route a message") is tried once
        # more
        if not proc.returncode or os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
            break
        log(
            f"{os.path.basename(run_dir)}: the launch failed (exit {proc.returncode}) before the "
            "run began" + ("; trying once more" if attempt == 1 else "")
        )
    if proc.returncode:
        raise RuntimeError(f"{flagfile} exited {proc.returncode}: see {run_dir}/race.log")
    return time.time() - start


def to_run(run_dir: str) -> bool:
    """Whether a race run is still to run: not if its metrics.jsonl ends with an "end" record that
    did not stop early; one cut short (a session that ended mid-run, a signal) is moved aside to
    <run_dir>.interrupted, to run again whole. A folder holding a sweep, or a run from before runs
    recorded their end, is an error: neither is moved or run again unasked."""
    if not os.path.exists(run_dir):
        return True
    if os.path.exists(os.path.join(run_dir, "sweep")):
        raise ConfigError(
            f"{run_dir} holds a sweep ({run_dir}/sweep): race into another --output_dir"
        )
    path = os.path.join(run_dir, "metrics.jsonl")
    records = metrics.read_metrics(path, growing=True) if os.path.exists(path) else []
    ends = [r for r in records if r.get("kind") == "end"]
    if ends:
        if not ends[-1]["stopped_early"]:
            return False
    elif any(r.get("kind") == "run" and "device" not in r for r in records):
        raise ConfigError(
            f"{run_dir}: a run from before runs recorded their end (2026-12-07), so whether it "
            "finished is not known: move or delete it to run it again, or report it with "
            "--report_only"
        )
    race_sweep.move_aside(run_dir)
    return True
