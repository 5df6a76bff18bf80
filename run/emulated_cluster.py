"""An emulated multi-node cluster on this machine (network namespaces + shaped links; needs root).

    python run/emulated_cluster.py up --nodes=2 --rate_gbit=1     # prints the mpirun prefix and hostfile
    python run/emulated_cluster.py status
    python run/emulated_cluster.py down

In Python, `with bert_tf.studies.emulated_cluster.EmulatedCluster(2, rate_gbit=1) as c:` brings it down
whatever happens. Addresses: 198.18.0.0/24 (benchmarking range) only, no route out.
"""
import shlex
import sys

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_integer("nodes", 2, "Emulated nodes.")
flags.DEFINE_float("rate_gbit", 10.0, "Link rate of each node, Gbit/s.")
flags.DEFINE_float("delay_ms", 0.0, "One-way delay (needs tc netem in the kernel).")
flags.DEFINE_integer("slots", 1, "Ranks per node in the hostfile.")
FLAGS = flags.FLAGS


def main(argv):
    from bert_tf.studies import emulated_cluster as ec
    action = argv[1] if len(argv) > 1 else "status"
    if action == "down":
        print("down" if ec.down() else f"still there: {ec.existing_namespaces()}")
    elif action == "status":
        print("namespaces: " + (" ".join(ec.existing_namespaces()) or "none"))
    elif action == "up":
        try:
            cluster = ec.EmulatedCluster(FLAGS.nodes, FLAGS.rate_gbit, FLAGS.delay_ms, FLAGS.slots).up()
        except ec.ClusterError as e:          # the machine cannot host it: say what is missing
            sys.exit(f"error: {e}")
        print(f"up: {FLAGS.nodes} nodes at {FLAGS.rate_gbit:g} Gbit/s; hostfile {cluster.hostfile}")
        print("run ranks with:  " + shlex.join(cluster.mpirun_prefix(FLAGS.nodes * FLAGS.slots)) + " python ...")
        print("bring down with: python run/emulated_cluster.py down")
    else:
        raise ConfigError(f"unknown action {action!r}; valid: up, down, status")


if __name__ == "__main__":
    cli.run(main)
