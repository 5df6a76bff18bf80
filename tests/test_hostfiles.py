"""The shipped hostfiles work with horovodrun and mpirun, and the hostfile command of docs/pretraining.md runs."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, mpi_env
import services

HVDRUN = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
SHIPPED = {"localhost": {"localhost": 2}, "cluster-4x4.example": {f"node{i}": 4 for i in range(1, 5)}}


def horovod_hosts(path):
    """What horovodrun -hostfile makes of a file (its own parser, horovod.runner.common.util.hosts)."""
    from horovod.runner.common.util import hosts
    return hosts.parse_hosts_and_slots(hosts.parse_host_files(str(path)))[1]


def mpirun_map(path, np_):
    """OpenMPI's reading of a hostfile: the job map of a launch that starts nothing (--do-not-launch)."""
    cmd = ["mpirun", "-np", str(np_), "--hostfile", str(path), "--display-map", "--do-not-launch", "true"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    # env: os.environ's copy, not the C environment this process inherits by default, into which an
    # in-process hvd.init() (an MPI singleton, earlier tests) writes variables that make mpirun exit 1
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=mpi_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {m[0]: int(m[1]) for m in re.findall(r"Data for node: (\S+)\s+Num slots: \d+\s+Max slots: \d+\s+Num procs: (\d+)",
                                                proc.stdout)}


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_hostfile_parses_with_horovodrun_and_mpirun(name, tmp_path):
    path = REPO / "hostfiles" / name
    if name == "cluster-4x4.example":      # as hostfiles/README.md says: copy it to hostfiles/hosts
        (tmp_path / "hostfiles").mkdir()
        path = shutil.copy(path, tmp_path / "hostfiles" / "hosts")
    expected = SHIPPED[name]
    assert horovod_hosts(path) == expected
    mapped = mpirun_map(path, sum(expected.values()))
    if name == "localhost":                 # OpenMPI names the local node by its host name
        assert list(mapped.values()) == [2]
    else:
        assert mapped == expected


def test_a_commented_hostfile_is_what_horovod_rejects(tmp_path):
    """Why the shipped files carry no comments (and why launch mode strips them)."""
    path = tmp_path / "hosts"
    path.write_text("# two ranks\nlocalhost slots=2\n")
    with pytest.raises((ValueError, IndexError)):
        horovod_hosts(path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, corpus_dir):
    return services.make_demo_workdir(tmp_path_factory.mktemp("demo_workdir"), corpus_dir)


@pytest.mark.cluster
def test_readme_command_horovodrun_with_the_localhost_hostfile(workdir, tmp_path):
    """docs/pretraining.md: horovodrun -np 2 -hostfile hostfiles/localhost python run/pretrain.py --flagfile=configs/demo.flags
    (steps shortened, checkpoints in a temporary folder)."""
    ckpt = tmp_path / "ckpt"
    cmd = [HVDRUN, "-np", "2", "-hostfile", "hostfiles/localhost", "python", "run/pretrain.py",
           "--flagfile=configs/demo.flags", *services.short_run_flags(20, ckpt)]
    print("running:", " ".join(cmd), f"(in {workdir})")
    proc = subprocess.run(cmd, cwd=workdir, env=services.run_env(workdir), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "held-out MLM accuracy" in out, out[-3000:]
    import tensorflow as tf
    assert (tf.train.latest_checkpoint(str(ckpt)) or "").endswith("-20"), sorted(os.listdir(ckpt))
