"""Time lost when a node is lost: elastic training vs a kill-and-restart from the last checkpoint.

    # root + iproute2, ~5 min:
    python run/elastic_recovery.py --output_json=runs/elastic_recovery.json
    # both jobs' run/pretrain.py flags checked; no root, no cluster:
    python run/elastic_recovery.py --dry_run

The same tiny-BERT job (global batch 24 = micro-batches of 4, checkpoint every --save_interval
updates, commit every --elastic_commit_interval) on a 3-node emulated cluster
(bert_tf/studies/emulated_cluster.py), once per way of surviving; every process of node 2 is killed
after --kill_after updates:

  restart: mpirun job (no --elastic). Time lost = kill -> the job has ended (detection) -> the same
           command started again at once (a scheduler that restarts instantly, node replaced at
           once) -> its first update; plus the updates since the last checkpoint, done again.
  elastic: horovodrun --host-discovery-script job (--elastic). Time lost = kill -> first update on
           the 2 survivors; plus the updates since the last commit, done again. Then node 3 (the
           replacement) is listed: time from listing to the first update on 3 ranks (the survivors
           wait for its start-up; the stall is the gap between the last update on 2 ranks and the
           first on 3).

A benchmark, not a test: it reports what it measured; run it on a quiet machine.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

from bert_tf import cli, knob, knobs
from bert_tf.artifacts.metrics import read_metrics, wait_for_record


@dataclasses.dataclass(frozen=True)
class RecoveryConfig:
    """run/elastic_recovery.py's flags."""

    vocab_file: str = knobs.vocab_file("data/demo/vocab.txt", detail="of the records.")
    train_files: str = knobs.train_files(
        "data/demo/seq128/train-*", "comma-separated globs; sequence length 128."
    )
    kill_after: int = knob(20, "Updates before node 2 is killed.")
    save_interval: int = knob(10, "Checkpoint interval (updates).")
    elastic_commit_interval: int = knob(5, "Elastic commit interval (updates).")
    output_json: str = knobs.output_json("the figures")
    dry_run: bool = knob(
        False,
        "Check both jobs' run/pretrain.py flags and data (its --dry_run), print them and exit: no "
        "root, no emulated cluster, nothing written.",
    )


cli.define_config_flags(RecoveryConfig)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(path):
    return read_metrics(path, growing=True)


def _wait(path, condition, proc, what):
    try:
        return wait_for_record(path, condition, proc, what, timeout=300, poll=0.1)
    except RuntimeError as e:
        raise SystemExit(f"error: {e}") from None


def _start(cmd, log):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def job_args(cfg, work):
    """run/pretrain.py's command line for each way of surviving: {"restart": ..., "elastic":
    ...}."""
    pretrain = [
        sys.executable,
        os.path.join(REPO, "run", "pretrain.py"),
        "--model_preset=tiny",
        f"--vocab_file={os.path.abspath(cfg.vocab_file)}",
        f"--train_files={os.path.abspath(cfg.train_files)}",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        "--micro_batch_size=4",
        "--log_interval=1",
        "--total_steps=100000",
        f"--save_interval={cfg.save_interval}",
    ]
    return {
        "restart": pretrain
        + ["--accumulation_steps=2", f"--checkpoint_dir={os.path.join(work, 'restart')}"],
        "elastic": pretrain
        + [
            "--elastic",
            "--global_batch_size=24",
            f"--elastic_commit_interval={cfg.elastic_commit_interval}",
            f"--checkpoint_dir={os.path.join(work, 'elastic')}",
        ],
    }


def dry_run(jobs):
    """Each job's flags through run/pretrain.py --dry_run (flags, vocabulary, records, checkpoint
    folder)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name, args in jobs.items():
        proc = subprocess.run(
            args + ["--dry_run"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"error: the {name} job's run/pretrain.py flags do not check out: "
                + (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            )
        said = [line for line in proc.stdout.splitlines() if line.startswith("dry run:")]
        print(f"{name} job: {' '.join(args[1:])}\n  {said[-1] if said else proc.stdout.strip()}")


def _train(after, ranks=None):
    """A condition on metrics records: an update after `after` (on `ranks` ranks, if given)."""
    return lambda r: (
        r["kind"] == "train" and r["time"] > after and (ranks is None or r.get("ranks") == ranks)
    )


def _killed(cfg, cluster, metrics, job):
    """Node 2 killed once the job reaches --kill_after: (kill time, the last update before the
    kill)."""
    _wait(
        metrics,
        lambda r: r["kind"] == "train" and r["step"] >= cfg.kill_after,
        job,
        "the kill step",
    )
    t_kill = time.time()
    cluster.kill_node(2)
    return t_kill, max(r["step"] for r in _records(metrics) if r["kind"] == "train")


def restart_figures(cfg, cluster, args, work, log):
    """The mpirun job restarted from its last checkpoint after the kill (no --elastic)."""
    ckpt = os.path.join(work, "restart")
    shutil.rmtree(ckpt, ignore_errors=True)
    metrics = os.path.join(ckpt, "metrics.jsonl")
    job = _start(cluster.mpirun_prefix(3) + args, log)  # the hostfile's first 3 nodes
    t_kill, _ = _killed(cfg, cluster, metrics, job)
    job.wait(300)
    t_ended = time.time()
    step_at_kill = max(r["step"] for r in _records(metrics) if r["kind"] == "train")
    job = _start(cluster.mpirun_prefix(3) + args, log)  # the hostfile's first 3 nodes
    first = _wait(metrics, _train(t_ended), job, "the restarted job's first update")
    _stop(job)
    return {
        "restart: kill -> job ended (s)": t_ended - t_kill,
        "restart: kill -> first update after restart (s)": first["time"] - t_kill,
        "restart: updates done again": step_at_kill - (first["step"] - 1),
    }


def elastic_figures(cfg, cluster, args, work, log):
    """The horovodrun --elastic job going on on the survivors, then taking in the replacement (node
    3)."""
    ckpt = os.path.join(work, "elastic")
    shutil.rmtree(ckpt, ignore_errors=True)
    metrics = os.path.join(ckpt, "metrics.jsonl")
    job = _start(cluster.horovodrun_elastic_prefix(3, 2, 3) + args, log)
    t_kill, step_at_kill = _killed(cfg, cluster, metrics, job)
    resumed = _wait(metrics, _train(t_kill, 2), job, "an update on 2 ranks")
    figures = {
        "elastic: kill -> first update on 2 ranks (s)": resumed["time"] - t_kill,
        "elastic: updates done again": step_at_kill - (resumed["step"] - 1),
    }
    _wait(
        metrics,
        lambda r: r["kind"] == "train" and r["step"] >= resumed["step"] + 10,
        job,
        "10 more updates",
    )
    t_add = time.time()
    cluster.set_live([cluster.hosts[0], cluster.hosts[1], cluster.hosts[3]])
    grown = _wait(metrics, _train(t_add, 3), job, "an update on 3 ranks")
    figures["elastic: replacement listed -> first update on 3 ranks (s)"] = grown["time"] - t_add
    last_on_2 = max(
        r["time"] for r in _records(metrics) if r["kind"] == "train" and r.get("ranks") == 2
    )
    figures["elastic: join stall, last update on 2 ranks -> first on 3 (s)"] = (
        grown["time"] - last_on_2
    )
    steady = [r for r in _records(metrics) if r["kind"] == "train" and r.get("ranks") == 2]
    figures["seconds per update on 2 ranks"] = (steady[-1]["time"] - steady[0]["time"]) / max(
        steady[-1]["step"] - steady[0]["step"], 1
    )
    _stop(job)
    return figures


def main(argv):
    cfg = cli.config_from_flags(RecoveryConfig)
    work = os.path.abspath(os.path.join(REPO, "runs", "elastic_recovery"))
    jobs = job_args(cfg, work)
    if cfg.dry_run:
        dry_run(jobs)
        return
    from bert_tf.studies import emulated_cluster as ec

    os.makedirs(work, exist_ok=True)
    with (
        ec.EmulatedCluster(4, rate_gbit=10) as cluster,
        open(os.path.join(work, "log.txt"), "w") as log,
    ):
        cluster.set_live(cluster.hosts[:3])  # node 3: the replacement the elastic job takes in
        figures = restart_figures(cfg, cluster, jobs["restart"], work, log)
        figures.update(elastic_figures(cfg, cluster, jobs["elastic"], work, log))
    for key, value in figures.items():
        print(f"{key}: {value:.2f}")
    if cfg.output_json:
        with open(cfg.output_json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
