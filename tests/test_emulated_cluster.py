"""The emulated cluster: namespaces and shaped links come and go cleanly; traffic really crosses them."""
import subprocess
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.studies import emulated_cluster as ec
from conftest import WORKERS, mpi_env

PROBLEM = ec.preflight()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=f"emulated cluster unavailable: {PROBLEM}")


def leftovers():
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ec.existing_namespaces(), [l for l in links.splitlines() if "br0" in l or " p0" in l or "btc" in l]


@pytest.mark.cluster
@needs_namespaces
def test_up_and_down_leave_nothing_behind_even_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with ec.EmulatedCluster(3, rate_gbit=1) as cluster:
            assert sorted(ec.existing_namespaces()) == ["btc-br", "btc-h0", "btc-h1", "btc-h2", "btc-launch"]
            qdisc = subprocess.run(["ip", "netns", "exec", "btc-h1", "tc", "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True).stdout
            assert "tbf" in qdisc and "rate 1Gbit" in qdisc
            hostfile = open(cluster.hostfile).read()
            assert hostfile == "198.18.0.1 slots=1\n198.18.0.2 slots=1\n198.18.0.3 slots=1\n"
            raise RuntimeError("boom")
    assert leftovers() == ([], [])


@pytest.mark.cluster
@needs_namespaces
def test_a_stale_cluster_is_cleaned_by_the_next_up():
    stale = ec.EmulatedCluster(2, rate_gbit=1).up()          # never brought down, as after a crash
    assert ec.existing_namespaces()
    with ec.EmulatedCluster(2, rate_gbit=5):
        qdisc = subprocess.run(["ip", "netns", "exec", "btc-h0", "tc", "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "rate 5Gbit" in qdisc
    stale.down()
    assert leftovers() == ([], [])


@pytest.mark.cluster
@needs_namespaces
def test_two_node_allreduce_puts_the_ring_volume_on_the_link():
    count, tensor_bytes = 20, 4 * 2 ** 20
    with ec.EmulatedCluster(2, rate_gbit=1) as cluster:
        before = cluster.tx_bytes()
        proc = subprocess.run(cluster.mpirun_prefix(2) + [sys.executable, str(WORKERS / "allreduce_volume.py"),
                                                          str(count)],
                              env=mpi_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        sent = [a - b for a, b in zip(cluster.tx_bytes(), before)]
    ring = 2 * (2 - 1) / 2 * tensor_bytes * count        # per rank, ring allreduce
    for s in sent:
        assert ring <= s < 1.05 * ring, (s, ring)             # payload plus TCP/IP and MPI headers


def test_bad_cluster_arguments_are_named():
    with pytest.raises(ConfigError, match="rate_gbit must be > 0"):
        ec.EmulatedCluster(2, rate_gbit=0)
    with pytest.raises(ConfigError, match="nodes must be in"):
        ec.EmulatedCluster(0)
