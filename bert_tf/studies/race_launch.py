"""Launching one run of the recipe race: run/pretrain.py on `ranks` processes of this machine, or
on an emulated cluster's nodes, its console in race.log. A run that ends well leaves DONE, so a
race spanning sessions runs only what is left (to_run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bert_tf.studies import emulated_cluster, race_sweep


DONE = "race.done"  # written by launch when a run ends well: its seconds


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
    seconds = time.time() - start
    with open(os.path.join(run_dir, DONE), "w") as f:  # a later session's race skips it
        f.write(f"{seconds:.1f}\n")
    return seconds


def to_run(run_dir: str) -> bool:
    """Whether a race run is still to run: not if it finished (DONE); one cut short (a session
    that ended mid-run) is moved aside to <run_dir>.interrupted, to run again whole."""
    if os.path.exists(os.path.join(run_dir, DONE)):
        return False
    race_sweep.move_aside(run_dir)
    return True
