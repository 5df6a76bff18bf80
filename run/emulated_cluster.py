"""An emulated multi-node cluster on this machine (network namespaces + shaped links; needs root).

    python run/emulated_cluster.py up --nodes=2 --rate_gbit=1   # prints the mpirun prefix, hostfile
    python run/emulated_cluster.py status
    python run/emulated_cluster.py down

In Python, `with bert_tf.studies.emulated_cluster.EmulatedCluster(2, rate_gbit=1) as c:` brings it
down whatever happens. Addresses: 198.18.0.0/24 (benchmarking range) only, no route out.
"""

import dataclasses
import shlex
import sys

from bert_tf import ConfigError, cli
from bert_tf.studies import emulated_cluster as ec

cli.define_config_flags(ec.EmulatedClusterConfig)


def main(argv):
    cfg = cli.config_from_flags(ec.EmulatedClusterConfig)
    action = argv[1] if len(argv) > 1 else "status"
    if action == "down":
        print("down" if ec.down() else f"still there: {ec.existing_namespaces()}")
    elif action == "status":
        print("namespaces: " + (" ".join(ec.existing_namespaces()) or "none"))
    elif action == "up":
        try:
            cluster = ec.EmulatedCluster(**dataclasses.asdict(cfg)).up()
        except ec.ClusterError as e:  # the machine cannot host it: say what is missing
            sys.exit(f"error: {e}")
        print(f"up: {cfg.nodes} nodes at {cfg.rate_gbit:g} Gbit/s; hostfile {cluster.hostfile}")
        print(
            "run ranks with:  "
            + shlex.join(cluster.mpirun_prefix(cfg.nodes * cfg.slots))
            + " python ..."
        )
        print("bring down with: python run/emulated_cluster.py down")
    else:
        raise ConfigError(f"unknown action {action!r}; valid: up, down, status")


if __name__ == "__main__":
    cli.run(main)
