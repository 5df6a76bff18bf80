"""The spot-cluster run, whole, on emulated nodes (bert_tf/studies/emulated_cluster.py):
run/pretrain.py under an elastic horovodrun, with nodes killed at given updates (Horovod takes a
killed node back when its blacklist cooldown ends: a spot node replaced) and the whole job stopped
at a given update and started again from its checkpoint. One scenario for the cluster-tier test
(tests/test_elastic.py::test_the_spot_cluster_run_whole) and for the longer study (run/spot_run.py).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

from bert_tf import ConfigError, knob, knobs
from bert_tf.artifacts.metrics import read_metrics, wait_for_record
from bert_tf.studies import emulated_cluster as ec

PRETRAIN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "run",
    "pretrain.py",
)


@dataclasses.dataclass
class Event:
    """At the first update >= `step` after the previous event: kill `node` (an int) or stop the job
    ("stop")."""

    step: int
    node: int | str


def parse_events(texts) -> list:
    """["kill:3@5", "kill:2@23", "stop@43"] -> Events, in order."""
    events = []
    for text in texts:
        what, _, step = text.partition("@")
        if not step.isdigit() or not (
            what == "stop" or what.startswith("kill:") and what[5:].isdigit()
        ):
            raise ValueError(f"event {text!r}: write kill:NODE@STEP or stop@STEP")
        events.append(Event(int(step), "stop" if what == "stop" else int(what[5:])))
    return events


@dataclasses.dataclass(frozen=True)
class SpotRunConfig:
    """run/spot_run.py's flags; constructing one checks them (the events parse, at least 2
    nodes)."""

    output_dir: str | None = knobs.output_dir("faults/, clean/ and spot.json", required=True)
    flagfile_for_pretrain: str = knob(
        "configs/spot_budget.flags", "run/pretrain.py's flagfile (--elastic)."
    )
    pretrain_flag: list[str] = knob(
        [], "More run/pretrain.py flags, e.g. --pretrain_flag=--seed=2.", multi=True
    )
    events: list[str] = knob(
        ["kill:3@15", "kill:2@47", "stop@63"], "kill:NODE@UPDATE or stop@UPDATE, in order."
    )
    nodes: int = knob(4, "Emulated nodes, one rank each.")
    link_gbit: float = knob(1.0, "Each node's link, Gbit/s.")
    skip_clean: bool = knob(False, "Only the run with faults.")

    def __post_init__(self):
        if self.nodes < 2:
            raise ConfigError(f"--nodes must be >= 2, got {self.nodes}")
        if self.link_gbit < 0.001:
            raise ConfigError(f"--link_gbit must be >= 0.001, got {self.link_gbit}")
        self.parsed_events()

    def parsed_events(self) -> list:
        try:
            return parse_events(self.events)
        except ValueError as e:
            raise ConfigError(f"--events: {e}") from None


def _start(command, flags, log_path, env):
    with open(log_path, "w") as out:
        job = subprocess.Popen(
            command + [sys.executable, PRETRAIN, *flags],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    job.log = log_path
    return job


def run(
    cluster: ec.EmulatedCluster,
    flags,
    checkpoint_dir,
    log_dir,
    events,
    min_np=2,
    timeout=900,
    env=None,
) -> dict:
    """Runs the scenario to the job's end; returns {"returncode", "events": [(event, step seen,
    time)], "logs", "records"}. flags: run/pretrain.py's (--elastic ...,
    --checkpoint_dir=checkpoint_dir)."""
    n = len(cluster.hosts)
    cluster.set_live(cluster.hosts)
    command = cluster.horovodrun_elastic_prefix(
        n, min_np, n, ["--elastic-timeout", "120", "--blacklist-cooldown-range", "5", "10"]
    )
    env = ec.mpirun_env(env)
    env["PYTHONPATH"] = (
        os.path.dirname(os.path.dirname(PRETRAIN)) + os.pathsep + env.get("PYTHONPATH", "")
    )
    metrics, logs, done, since = os.path.join(checkpoint_dir, "metrics.jsonl"), [], [], 0.0
    job = _start(command, flags, os.path.join(log_dir, "job-1.log"), env)
    logs.append(job.log)
    try:
        for event in events:
            seen = wait_for_record(
                metrics,
                lambda r: r["kind"] == "train" and r["step"] >= event.step and r["time"] > since,
                job,
                f"update {event.step}",
                timeout,
            )
            since = time.time()
            done.append((event, seen["step"], since))
            if event.node != "stop":
                cluster.kill_node(event.node)
                continue
            job.kill()
            job.wait()
            for node in range(n):  # every rank of the job, on every node
                cluster.kill_node(node)
            job = _start(command, flags, os.path.join(log_dir, f"job-{len(logs) + 1}.log"), env)
            logs.append(job.log)
        job.wait(timeout=timeout)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return {
        "returncode": job.returncode,
        "events": done,
        "logs": logs,
        "records": read_metrics(metrics),
    }


def check(result) -> list:
    """What went wrong in a finished scenario (empty: nothing): a rank disagreeing on the weights at
    any start, first update, synchronisation or end, or a job that did not end cleanly."""
    problems = [] if result["returncode"] == 0 else [f"the last job exited {result['returncode']}"]
    for r in result["records"]:
        if r["kind"] == "elastic" and (
            len(set(r["weights_digests"])) != 1 or len(r["weights_digests"]) != r["ranks"]
        ):
            problems.append(
                f"ranks disagree after {r['event']} at step {r['step']}: {r['weights_digests']}"
            )
    return problems


def summary(result) -> dict:
    """The figures of a finished scenario: final held-out accuracy and sequences, starts, time,
    problems."""
    records = result["records"]
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    starts = [(r["step"], r["ranks"]) for r in records if r.get("event") == "start"]
    return {
        "returncode": result["returncode"],
        "problems": check(result),
        "events": [(str(e.node), e.step, seen) for e, seen, _ in result["events"]],
        "starts": starts,
        "final_step": trains[-1]["step"] if trains else 0,
        "sequences": trains[-1].get("samples_seen") if trains else 0,
        "eval": [(r["step"], r.get("eval_mlm_accuracy")) for r in evals],
        "seconds": (records[-1]["time"] - records[0]["time"]) if records else 0.0,
    }
