"""An emulated multi-node cluster on one machine: Linux network namespaces joined by shaped links.

    launcher ns (198.18.0.254) ─┐
    host ns h0 (198.18.0.1) ────┼── bridge ns (br0)     each host's eth0: tc tbf at rate R
    host ns h1 (198.18.0.2) ────┘

Rate is shaped with a token bucket (tc tbf) on each node's sending side. Delay needs tc netem,
which this project's machines lack (`Specified qdisc kind is unknown`): asking for delay there
fails with that message; veth links add only microseconds.

Addresses come only from the benchmarking range 198.18.0.0/15; the namespaces have no route
anywhere else. mpirun runs inside the launcher namespace with an OpenMPI launch agent
(`plm_rsh_agent`) that starts each host's daemon inside that host's namespace, so ranks on
different emulated nodes talk over TCP through the shaped links (OpenMPI's TCP transport is
pinned to 198.18.0.0/24; shared memory is off). Needs root and iproute2.

Elastic jobs (`horovodrun_elastic_prefix`): horovodrun's Gloo launcher starts a rank on a host with
`ssh HOST COMMAND` unless the host is local; the launcher namespace gets an `ssh` of ours first on
PATH that runs COMMAND in HOST's namespace instead and, like ssh with ServerAliveInterval=1 and
ServerAliveCountMax=3, gives up (exit 255, the remote command killed as sshd would on a lost
session) when the host's link has been down for 3 s. Hosts are discovered by
scripts/discover_hosts.sh from the file `live_hosts` (`set_live`); `kill_node` kills every process
of a node, `set_link` takes its link down (the bridge port, as if the cable were pulled) or up.
"""

from __future__ import annotations

import dataclasses
import os
import glob
import shutil
import socket
import subprocess
import tempfile

from bert_tf import ConfigError, knob

PREFIX = "btc"
SUBNET = "198.18.0"
LAUNCHER_ADDRESS = f"{SUBNET}.254"
NETNS_ETC = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts

# What a process that initialised MPI as a singleton (a test, a notebook that imported Horovod)
# leaves to its children: an mpirun started with these fails at once, without a word (exit 1, no
# output).
_SINGLETON_VARS = (
    "OMPI_MCA_ess",
    "OMPI_MCA_orte_launch",
    "OMPI_MCA_orte_precondition_transports",
    "OMPI_MCA_pmix",
    "OMPI_MCA_orte_ess_num_procs",
    "OMPI_APP_CTX_NUM_PROCS",
    "ORTE_SCHIZO_DETECTION",
)


def mpirun_env(env=None):
    """`env` (default: this process's environment) fit to start mpirun with: an MPI singleton's
    variables removed, root allowed when running as root."""
    env = {
        k: v
        for k, v in (os.environ if env is None else env).items()
        if not k.startswith("PMIX_") and k not in _SINGLETON_VARS
    }
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


class ClusterError(RuntimeError):
    pass


def _ip(*args, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


def preflight():
    """Says what is missing for an emulated cluster, or returns None when all is there."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"the emulated cluster needs '{tool}' (Debian package iproute2)"
    probe = f"{PREFIX}-probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"network namespaces are not permitted here: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def existing_namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX + "-")]


def down():
    """Deletes every namespace of ours (their veths and qdiscs go with them), their /etc/netns files
    and the hostfile/agent folders. Safe to repeat."""
    for ns in existing_namespaces():
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for folder in glob.glob(os.path.join(NETNS_ETC, PREFIX + "-*")):
        shutil.rmtree(folder, ignore_errors=True)
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), "bert_tf_cluster_*")):
        shutil.rmtree(folder, ignore_errors=True)
    return existing_namespaces() == []


@dataclasses.dataclass(frozen=True)
class EmulatedClusterConfig:
    """run/emulated_cluster.py's flags: the cluster `up` brings up (EmulatedCluster's arguments, by
    name)."""

    nodes: int = knob(2, "Emulated nodes.")
    rate_gbit: float = knob(10.0, "Link rate of each node, Gbit/s.")
    delay_ms: float = knob(0.0, "One-way delay (needs tc netem in the kernel).")
    slots: int = knob(1, "Ranks per node in the hostfile.")


class EmulatedCluster:
    """`with EmulatedCluster(2, rate_gbit=1, delay_ms=0.1) as c:` ... c.mpirun_prefix(np) ..."""

    def __init__(self, nodes, rate_gbit=10.0, delay_ms=0.0, slots=1):
        if nodes < 1 or nodes > 200:
            raise ConfigError(f"nodes must be in [1, 200], got {nodes}")
        if rate_gbit <= 0:
            raise ConfigError(f"rate_gbit must be > 0, got {rate_gbit}")
        self.nodes, self.rate_gbit, self.delay_ms, self.slots = nodes, rate_gbit, delay_ms, slots
        self.hosts = [f"{SUBNET}.{i + 1}" for i in range(nodes)]
        self.namespaces = [f"{PREFIX}-h{i}" for i in range(nodes)]
        self.workdir = None

    # -- lifecycle ------------------------------------------------------------------------
    def up(self):
        problem = preflight()
        if problem:
            raise ClusterError(problem)
        down()  # a stale cluster from a crashed run
        try:
            bridge = f"{PREFIX}-br"
            _ip("ip", "netns", "add", bridge)
            _ip("ip", "link", "add", "br0", "type", "bridge", ns=bridge)
            _ip("ip", "link", "set", "br0", "up", ns=bridge)
            members = list(zip(self.namespaces, self.hosts)) + [
                (f"{PREFIX}-launch", LAUNCHER_ADDRESS)
            ]
            for i, (ns, address) in enumerate(members):
                self._join(i, ns, address, bridge)
            self._write_launchers()
            self.live_hosts = os.path.join(self.workdir, "live_hosts")
            self.set_live(self.hosts)
        except BaseException:
            self.down()
            raise
        return self

    def _join(self, i, ns, address, bridge):
        """Namespace `ns` with its eth0 at `address`, cabled to the bridge's port p{i} (shaped
        unless it is the launcher's), and this machine's hostname resolving to `address` in it."""
        _ip("ip", "netns", "add", ns)
        _ip("ip", "link", "set", "lo", "up", ns=ns)
        veth = ["type", "veth", "peer", "name", f"p{i}", "netns", bridge]
        _ip("ip", "link", "add", "eth0", "netns", ns, *veth)
        _ip("ip", "addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
        _ip("ip", "link", "set", "eth0", "up", ns=ns)
        _ip("ip", "link", "set", f"p{i}", "master", "br0", "up", ns=bridge)
        if ns != f"{PREFIX}-launch":  # the launcher's control traffic is not shaped
            self._shape(ns)
        # This machine's hostname resolves to the node's own address inside the node, as on a real
        # cluster: Horovod 0.28.1 makes its process-set Gloo contexts on the hostname's address,
        # not on HOROVOD_GLOO_IFACE (with 127.0.0.1 the elastic ranks cannot connect).
        os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
        with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")

    def _write_launchers(self):
        """The work folder: the hostfile, OpenMPI's launch agent and the ssh shim (bin/ssh)."""
        self.workdir = tempfile.mkdtemp(prefix="bert_tf_cluster_")
        self.hostfile = os.path.join(self.workdir, "hosts")
        with open(self.hostfile, "w") as f:
            f.write("".join(f"{h} slots={self.slots}\n" for h in self.hosts))
        mapping = " ".join(f"{h}={ns}" for h, ns in zip(self.hosts, self.namespaces))
        self.agent = os.path.join(self.workdir, "netns_agent.sh")
        with open(self.agent, "w") as f:
            f.write(AGENT.format(mapping=mapping))
        os.chmod(self.agent, 0o755)
        bin_dir = os.path.join(self.workdir, "bin")
        os.makedirs(bin_dir)
        with open(os.path.join(bin_dir, "ssh"), "w") as f:
            f.write(
                SSH_SHIM.format(
                    mapping=mapping,
                    ports=" ".join(f"{h}=p{i}" for i, h in enumerate(self.hosts)),
                    bridge=f"{PREFIX}-br",
                )
            )
        os.chmod(os.path.join(bin_dir, "ssh"), 0o755)
        self.ssh_dir = bin_dir

    def _shape(self, ns):
        """Token bucket at the link rate on the node's sending side (+ netem delay when asked)."""
        burst = max(64 * 1024, int(self.rate_gbit * 1e9 / 8 * 1e-3))  # 1 ms of traffic
        tbf = ["tbf", "rate", f"{self.rate_gbit}gbit", "burst", str(burst), "latency", "50ms"]
        if self.delay_ms > 0:
            proc = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "handle",
                    "1:",
                    "netem",
                    "delay",
                    f"{self.delay_ms}ms",
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise ClusterError(
                    f"cannot emulate {self.delay_ms} ms of delay: tc netem failed "
                    f"({proc.stderr.strip()}); the kernel lacks sch_netem. Use delay_ms=0."
                )
            _ip("tc", "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:", *tbf, ns=ns)
        else:
            _ip("tc", "qdisc", "add", "dev", "eth0", "root", *tbf, ns=ns)

    def down(self):
        ok = down()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        return ok

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # -- use ------------------------------------------------------------------------------
    def mpirun_prefix(self, np_, extra_env=()):
        """The command prefix that runs `np_` ranks over the emulated nodes."""
        cmd = [
            "ip",
            "netns",
            "exec",
            f"{PREFIX}-launch",
            "mpirun",
            "-np",
            str(np_),
            "--hostfile",
            self.hostfile,
            "--map-by",
            "node",
            "--bind-to",
            "none",
            "--oversubscribe",
            "-mca",
            "plm_rsh_agent",
            self.agent,
            "-mca",
            "btl",
            "tcp,self",
            "-mca",
            "btl_tcp_if_include",
            f"{SUBNET}.0/24",
            "-mca",
            "oob_tcp_if_include",
            f"{SUBNET}.0/24",
            # OpenMPI 4.1's daemons share the hwloc topology through shared memory mapped at a
            # "hole" in their address space; that segfaulted one daemon in ~10 launches here
            # (hwloc_shmem_topology_write). Without a hole they read the topology themselves.
            "-mca",
            "rtc_hwloc_vmhole",
            "none",
            "-x",
            "PATH",
            "-x",
            "HOROVOD_GLOO_IFACE=eth0",
        ]
        for var in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL"):
            if var in os.environ:
                cmd += ["-x", var]
        for var in extra_env:
            cmd += ["-x", var]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd

    def horovodrun_elastic_prefix(self, np_, min_np, max_np, extra_args=()):
        """horovodrun in elastic mode (Gloo) from the launcher namespace: hosts from `live_hosts`,
        ranks started in the hosts' namespaces by the ssh shim, Gloo on the emulated links
        (eth0)."""
        import sys

        hvdrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
        # the checkout's scripts/: this file is bert_tf/studies/emulated_cluster.py
        discover = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "scripts",
            "discover_hosts.sh",
        )
        return [
            "ip",
            "netns",
            "exec",
            f"{PREFIX}-launch",
            "env",
            f"PATH={self.ssh_dir}:{os.environ.get('PATH', '')}",
            hvdrun,
            "-np",
            str(np_),
            "--min-np",
            str(min_np),
            "--max-np",
            str(max_np),
            "--gloo",
            "--network-interface",
            "eth0",
            "--host-discovery-script",
            f"{discover} {self.live_hosts}",
            *extra_args,
        ]

    def set_live(self, hosts):
        """The hosts the discovery script reports from now on (replaced atomically)."""
        tmp = self.live_hosts + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{h}:{self.slots}\n" for h in hosts))
        os.replace(tmp, self.live_hosts)

    def node_pids(self, node):
        return [int(p) for p in _ip("ip", "netns", "pids", self.namespaces[node]).split()]

    def kill_node(self, node):
        """SIGKILL every process of the node (a preempted machine); returns their pids."""
        import signal

        pids = self.node_pids(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def set_link(self, node, up):
        """The node's cable, pulled or plugged back (its bridge port down or up)."""
        _ip("ip", "link", "set", f"p{node}", "up" if up else "down", ns=f"{PREFIX}-br")

    def tx_bytes(self):
        """Bytes each emulated node has sent on its link so far (interface counters)."""
        return [
            int(_ip("cat", "/sys/class/net/eth0/statistics/tx_bytes", ns=ns))
            for ns in self.namespaces
        ]


# OpenMPI calls the agent like ssh: AGENT [options] HOST COMMAND...; run COMMAND in HOST's
# namespace.
AGENT = """#!/usr/bin/env bash
declare -A ns_of=()
for pair in {mapping}; do ns_of[${{pair%%=*}}]=${{pair#*=}}; done
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
ns=${{ns_of[$host]:-}}
[ -n "$ns" ] || {{ echo "netns agent: unknown host $host" >&2; exit 1; }}
exec ip netns exec "$ns" bash -c "$*"
"""


# horovodrun's Gloo launcher runs `ssh -o ... HOST [-p PORT] [-i FILE] COMMAND` for a remote host.
SSH_SHIM = """#!/usr/bin/env bash
declare -A ns_of=() port_of=()
for pair in {mapping}; do ns_of[${{pair%%=*}}]=${{pair#*=}}; done
for pair in {ports}; do port_of[${{pair%%=*}}]=${{pair#*=}}; done
while [[ "$1" == -* ]]; do
  case "$1" in -o|-p|-i|-l|-F) shift 2 ;; *) shift ;; esac
done
host=$1; shift
ns=${{ns_of[$host]:-}}
[ -n "$ns" ] || {{ echo "ssh shim: unknown host $host" >&2; exit 255; }}
link_up() {{ ip -n {bridge} -o link show "${{port_of[$host]}}" | grep -Eq '[<,]UP[,>]'; }}
link_up || {{ echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255; }}
ip netns exec "$ns" setsid bash -c "$*" &
child=$!
lost=$(mktemp)
on_signal() {{
  kill -KILL -- -$child 2>/dev/null; kill ${{watchdog:-}} 2>/dev/null; rm -f "$lost"; exit 143
}}
trap on_signal TERM INT
# the watchdog must not hold the launcher's output pipe: horovodrun waits for its EOF
(down=0
 while sleep 1; do
   if link_up; then down=0; else down=$((down + 1)); fi
   if [ $down -ge 3 ]; then echo lost > "$lost"; kill -KILL -- -$child 2>/dev/null; exit 0; fi
 done) </dev/null >/dev/null 2>&1 &
watchdog=$!
wait $child
rc=$?
kill $watchdog 2>/dev/null
if [ -s "$lost" ]; then
  rm -f "$lost"
  echo "Connection to $host closed by remote host (link down for 3 s)." >&2
  exit 255
fi
rm -f "$lost"
exit $rc
"""
