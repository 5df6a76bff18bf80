"""Why --local_group=node is refused with --elastic: Horovod 0.28.1's elastic mode with dynamic process sets, on
emulated nodes (bert_tf/studies/emulated_cluster.py; root and iproute2).

    python scripts/probe_elastic_process_sets.py --sets       # one process set per node, re-made at every reset
    python scripts/probe_elastic_process_sets.py --no-sets    # the control: the same loop, global set only

3 nodes x 2 ranks under an elastic horovodrun (Gloo, response cache off as bert_tf runs elastic jobs); every
rank sums a value over its node's set and over all ranks every 0.25 s, committing every 5 steps; node 2 is
killed after --kill_after seconds. Prints how the survivors ended: re-formed (Horovod's reset callbacks ran),
aborted (their exit codes), or still running at --wait seconds (a hang). horovod/horovod#3501 and #4021
describe the same combination failing.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def worker(steps, with_sets):
    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()

    def say(*words):
        print(f"[rank {hvd.rank()}/{hvd.size()}]", *words, flush=True)

    def node_set():
        if not with_sets:
            return hvd.global_process_set
        node_of = hvd.allgather_object(hvd.cross_rank(), name="node_of_rank")
        groups = {}
        for r, node in enumerate(node_of):
            groups.setdefault(node, []).append(r)
        sets = {node: hvd.add_process_set(ranks) for node, ranks in sorted(groups.items())}
        say("node sets", [s.ranks for s in sets.values()])
        return sets[node_of[hvd.rank()]]

    holder = {"set": node_set()}
    state = hvd.elastic.TensorFlowState(variables=[tf.Variable([0.0])], step=0)

    def on_reset():
        say("reset")
        holder["set"] = node_set()
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            x = tf.constant([1.0])
            hvd.allreduce(x, op=hvd.Sum, process_set=holder["set"], name="node_sum")
            hvd.allreduce(x, op=hvd.Sum, name="all_sum")
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
            time.sleep(0.25)
    train(state)
    say("done at step", state.step)


def drive(args):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bert_tf.studies import emulated_cluster as ec
    mode = "--sets" if args.sets else "--no-sets"
    with ec.EmulatedCluster(3, 1.0, slots=2) as cluster, open(args.log, "w") as log:
        cluster.set_live(cluster.hosts)
        command = cluster.horovodrun_elastic_prefix(6, 2, 6, ["--elastic-timeout", "60"])
        env = ec.mpirun_env()
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        job = subprocess.Popen(command + [sys.executable, os.path.abspath(__file__), "--worker", mode,
                                          f"--steps={args.steps}"], stdout=log, stderr=subprocess.STDOUT, env=env)
        time.sleep(args.kill_after)
        cluster.kill_node(2)
        try:
            job.wait(timeout=args.wait)
            outcome = f"horovodrun exited {job.returncode}"
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
            outcome = f"still running {args.wait} s after the kill (killed)"
    text = open(args.log).read()
    exits = re.findall(r"Process (\d+) exit with status code (-?\d+)", text)
    print(f"{mode}: {outcome}; resets seen {text.count('] reset')}; "
          f"'terminate called' {text.count('terminate called')}; exit codes {sorted(set(c for _, c in exits))}; "
          f"finished ranks {text.count('done at step')}; log {args.log}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--sets", action="store_true")
    group.add_argument("--no-sets", dest="sets", action="store_false")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kill_after", type=float, default=40.0)
    parser.add_argument("--wait", type=float, default=240.0)
    parser.add_argument("--log", default="probe_elastic_process_sets.log")
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.sets)
    else:
        drive(args)


if __name__ == "__main__":
    main()
