"""Daemons the deployment tests need and start themselves (CI starts none): Debian packages,
dockerd, the image build (cached by the files it copies), munge and a one-machine Slurm.
Everything they do is printed (run pytest with -s, or read the captured output of a failure)."""
import contextlib
import hashlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# Docker's bridge and every network it makes stay in 198.18.0.0/15 (benchmarking range, RFC 2544).
DOCKER_BIP = "198.18.0.1/24"
DOCKER_POOL = "base=198.19.0.0/16,size=24"
BASE_IMAGE = "debian:bookworm-20241111"       # the Dockerfile's default BASE_IMAGE
IMAGE = "bert_tf:cpu"
GPU_IMAGE = "bert_tf:gpu"                        # --build-arg GPU=build


def say(msg):
    print(f"[services] {msg}", file=sys.__stderr__, flush=True)


def run(cmd, check=True, timeout=600, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def apt_install(packages, commands):
    """Installs Debian packages whose commands are missing; fails with the reason when it cannot."""
    missing = [p for p, c in zip(packages, commands) if not shutil.which(c)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"need root to install {' '.join(missing)} (apt-get install -y {' '.join(missing)})")
    say(f"installing Debian packages {' '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


# ----------------------------------------------------------------------------------------- Docker

def docker(*args, check=True, timeout=600):
    return run(["docker", *args], check=check, timeout=timeout)


def docker_answers():
    return shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@contextlib.contextmanager
def dockerd():
    """A Docker daemon: the running one, or dockerd (Debian's docker.io) started here and stopped after."""
    apt_install(["docker.io"], ["dockerd"])
    if docker_answers():
        say("using the Docker daemon that already answers")
        yield
        return
    log_dir = tempfile.mkdtemp(prefix="bert_tf-dockerd.")
    # overlay2 where the file system takes it (ext4, xfs: layers and containers cost nothing to make);
    # vfs works on any file system (overlay does not nest everywhere) but stores every layer and every
    # container as a full copy of the image. BERT_TF_DOCKER_STORAGE_DRIVER picks one. Addresses: 198.18.0.0/15 only.
    drivers = [os.environ["BERT_TF_DOCKER_STORAGE_DRIVER"]] if os.environ.get("BERT_TF_DOCKER_STORAGE_DRIVER") \
        else ["overlay2", "vfs"]
    for driver in drivers:
        log = open(os.path.join(log_dir, f"dockerd-{driver}.log"), "w")
        cmd = ["dockerd", f"--storage-driver={driver}", f"--bip={DOCKER_BIP}", f"--default-address-pool={DOCKER_POOL}",
               f"--pidfile={log_dir}/dockerd.pid"]
        say(f"starting {' '.join(cmd)} (log {log.name})")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: proc.poll() is not None or docker_answers(), 60, "dockerd")
        if proc.poll() is None:
            break
        log.close()
        said = open(log.name).read()
        if driver == drivers[-1]:
            raise RuntimeError(f"dockerd exited {proc.returncode}: {said[-3000:]}")
        say(f"dockerd --storage-driver={driver} exited {proc.returncode} ({(said.strip().splitlines() or [''])[-1][-300:]}); "
            "trying the next driver")
    try:
        yield
    finally:
        say("stopping the dockerd started here")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def image_exists(name):
    return docker("image", "inspect", name, check=False).returncode == 0


def ensure_base_image():
    """The Dockerfile's Debian base. Docker Hub is not reachable from where these tests run, so the
    same minimal Debian 12 is made with Debian's mmdebstrap and imported under the pinned tag."""
    if image_exists(BASE_IMAGE):
        origin = docker("history", "--no-trunc", "--format", "{{.Comment}}", BASE_IMAGE).stdout.strip()
        say(f"base image {BASE_IMAGE} present ({origin or 'pulled'})")
        return
    apt_install(["mmdebstrap"], ["mmdebstrap"])
    start = time.time()
    say(f"building the {BASE_IMAGE} base locally with mmdebstrap --variant=minbase bookworm "
        "(Docker Hub is not reachable here)")
    with tempfile.TemporaryDirectory(prefix="bert_tf-base.") as tmp:
        tar = os.path.join(tmp, "bookworm.tar")
        run(["mmdebstrap", "--variant=minbase", "--quiet", "bookworm", tar, "http://deb.debian.org/debian"], timeout=1200)
        docker("import", "--message", "minimal Debian 12 made by mmdebstrap --variant=minbase (bert_tf tests)",
               "--change", 'CMD ["bash"]', tar, BASE_IMAGE)
    say(f"imported {BASE_IMAGE} in {time.time() - start:.0f} s")


def dockerfile_sources(dockerfile=REPO / "Dockerfile"):
    """Paths of the build context that the Dockerfile COPYs (not --from another stage)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    sources = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            sources += [p for p in parts[1:-1] if not p.startswith("--") and p not in sources]
    return sources


def build_context(dest, wheels=None, ca_bundle=None, gpu=False):
    """A build context in dest: the files the Dockerfile copies, plus the optional build inputs
    (docker/build-inputs/: a Horovod wheel cache, the CPU or the GPU (NCCL) wheels only, a CA bundle).
    Returns its content key."""
    digest = hashlib.sha256()
    files = [REPO / "Dockerfile", REPO / ".dockerignore"]
    for source in dockerfile_sources():
        path = REPO / source
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        rel = f.relative_to(REPO)
        if "__pycache__" in rel.parts or (rel.parts[:2] == ("docker", "build-inputs") and rel.name != "README.md"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / rel)
        digest.update(str(rel).encode() + b"\0" + f.read_bytes())
    inputs = dest / "docker" / "build-inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    if wheels:
        shutil.copytree(wheels, inputs / "wheels", ignore=lambda folder, names: [
            n for n in names if pathlib.Path(folder) == pathlib.Path(wheels) and ("-nccl" in n) != gpu])
        digest.update(b"gpu" if gpu else b"cpu")
        for sums in sorted((inputs / "wheels").rglob("SHA256SUMS")):
            digest.update(sums.read_bytes())
    if ca_bundle:
        shutil.copy(ca_bundle, inputs / "ca.crt")
        digest.update(pathlib.Path(ca_bundle).read_bytes())
    return digest.hexdigest()[:16]


def pip_cert():
    """The CA bundle this host's pip verifies PyPI with (PIP_CERT or pip.conf's cert), if any."""
    if os.environ.get("PIP_CERT"):
        return os.environ["PIP_CERT"]
    out = run([sys.executable, "-m", "pip", "config", "list"], check=False).stdout
    for line in out.splitlines():
        if line.split("=", 1)[0].endswith(".cert"):
            return line.split("=", 1)[1].strip("'\"")
    return None


def ensure_image(gpu=False):
    """bert_tf:cpu (or bert_tf:gpu: --build-arg GPU=build), built from a copy of the checkout unless an
    image with the same content key (the files the Dockerfile copies, the wheel cache and CA bundle fed
    to it) is there already."""
    image = GPU_IMAGE if gpu else IMAGE
    if os.environ.get("BERT_TF_TEST_IMAGE") and not gpu:
        say(f"testing the image BERT_TF_TEST_IMAGE={os.environ['BERT_TF_TEST_IMAGE']} (not built here)")
        return os.environ["BERT_TF_TEST_IMAGE"], 0.0
    ensure_base_image()
    cache = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf"))
    wheels = cache / "wheels"
    ca = pip_cert()
    with tempfile.TemporaryDirectory(prefix="bert_tf-context.") as ctx:
        key = build_context(pathlib.Path(ctx), wheels if wheels.is_dir() else None, ca, gpu=gpu)
        keyed = f"{image}-{key}"
        if image_exists(keyed):
            say(f"image {keyed} (key = hash of the files it copies) already built: not rebuilding")
            docker("tag", keyed, image)
            return keyed, 0.0
        say(f"building {keyed} with the legacy builder (Debian 12 has no buildx); inputs: Horovod wheel cache "
            f"from {wheels if wheels.is_dir() else '(none: compiled in the image)'}, CA bundle {ca or '(none)'}")
        start = time.time()
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        proc = subprocess.run(["docker", "build", "-t", keyed, "-t", image, *(["--build-arg", "GPU=build"] if gpu else []),
                               ctx], capture_output=True, text=True, env=env, timeout=3600)
        seconds = time.time() - start
        if proc.returncode != 0:
            raise RuntimeError(f"docker build failed after {seconds:.0f} s\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
        say(f"built {keyed} in {seconds:.0f} s")
        # Older keyed images: vfs stores every layer in full.
        for line in docker("images", "--format", "{{.Repository}}:{{.Tag}}", "bert_tf").stdout.split():
            if line.startswith(f"{image}-") and line != keyed:
                docker("rmi", line, check=False)
        # Dangling images are the builder stages (the GPU image's holds 7 GB): the keyed images are the cache
        # that matters, so none is kept (two builds within hours filled the disk with them).
        docker("image", "prune", "-f", check=False)
        return keyed, seconds


# ------------------------------------------------------------------------------------------ Slurm

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def munged(tmp):
    """munge for Slurm's authentication: the running munged, or one started here on its own socket."""
    apt_install(["munge"], ["munged"])
    key = pathlib.Path("/etc/munge/munge.key")
    if not key.exists():
        say("creating /etc/munge/munge.key")
        run(["mungekey", "--create", "--keyfile", str(key)])
        os.chmod(key, 0o400)
    socket_path = str(tmp / "munge.socket")
    cmd = ["munged", "--force", f"--socket={socket_path}", f"--pid-file={tmp}/munged.pid",
           f"--log-file={tmp}/munged.log", f"--seed-file={tmp}/munged.seed"]
    say(f"starting {' '.join(cmd)}")
    run(cmd)
    try:
        yield socket_path
    finally:
        pid = int((tmp / "munged.pid").read_text())
        say(f"stopping munged (pid {pid})")
        os.kill(pid, signal.SIGTERM)


SLURM_CONF = """\
ClusterName=berttf
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Refuse at submission what the partition can never run (default NO: the job would pend forever).
EnforcePartLimits=ALL
KillWait=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def write_slurm_conf(tmp, munge_socket, nodes):
    """tmp/slurm.conf (SLURM_CONF with free ports and this machine as the controller); returns sbatch's env."""
    for d in ("state", "spool"):
        (tmp / d).mkdir(exist_ok=True)
    conf = tmp / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], ctld_port=free_port(),
                                      d_port=free_port(), tmp=tmp, munge_socket=munge_socket, nodes=nodes))
    return {**os.environ, "SLURM_CONF": str(conf)}


def stop(procs):
    for p in procs:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


@contextlib.contextmanager
def slurm_controller(tmp, nodes=4, cpus=4, gpus=4):
    """A Slurm controller alone, for `sbatch --test-only`: it schedules on `nodes` nodes of `cpus` CPUs
    and `gpus` GPUs each (node1, node2, ...; declared idle, no slurmd behind them), so it answers
    whether and where a multi-node job would start without running anything. Yields sbatch's env."""
    apt_install(["slurm-wlm"], ["slurmctld"])
    tmp = pathlib.Path(tmp)
    with munged(tmp) as munge_socket:
        env = write_slurm_conf(tmp, munge_socket, f"GresTypes=gpu\nNodeName=node[1-{nodes}] NodeAddr=127.0.0.1 "
                                                  f"CPUs={cpus} Gres=gpu:{gpus} State=IDLE")
        say(f"starting slurmctld alone ({env['SLURM_CONF']}: {nodes} nodes x {cpus} CPUs x {gpus} GPUs, no slurmd)")
        ctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", env["SLURM_CONF"]], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "slurmctld.err", "w"))
        try:
            wait_for(lambda: ctld.poll() is not None
                     or subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0,
                     60, "slurmctld")
            if ctld.poll() is not None:
                raise RuntimeError(f"slurmctld exited {ctld.returncode}: {(tmp / 'slurmctld.err').read_text()[-2000:]}")
            yield env
        finally:
            say("stopping slurmctld")
            stop([ctld])


@contextlib.contextmanager
def slurm_cluster(tmp):
    """A one-machine Slurm (slurmctld + slurmd, Debian's slurm-wlm) with a generated slurm.conf.
    Yields the environment for sbatch/squeue/scancel (SLURM_CONF)."""
    apt_install(["slurm-wlm"], ["slurmctld"])
    tmp = pathlib.Path(tmp)
    host = socket.gethostname().split(".")[0]
    with munged(tmp) as munge_socket:
        env = write_slurm_conf(tmp, munge_socket, f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} "
                                                  "State=UNKNOWN")
        conf = env["SLURM_CONF"]
        say(f"starting slurmctld and slurmd ({conf}: one node '{host}', {os.cpu_count()} CPUs)")
        ctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "slurmctld.err", "w"))
        slurmd = subprocess.Popen(["slurmd", "-D", "-f", str(conf)], env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=open(tmp / "slurmd.err", "w"))

        def idle():
            for p, name in ((ctld, "slurmctld"), (slurmd, "slurmd")):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: {(tmp / (name + '.err')).read_text()[-2000:]}"
                                       f"{(tmp / (name + '.log')).read_text()[-2000:] if (tmp / (name + '.log')).exists() else ''}")
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env).stdout
            return out.strip() in ("idle", "idle*") and out.strip() == "idle"
        try:
            wait_for(idle, 60, "the Slurm node to be idle")
            say("Slurm is up: node idle")
            yield env
        finally:
            say("stopping slurmd and slurmctld")
            stop([slurmd, ctld])


# ------------------------------------------------------------------------------------ demo work dir

def make_demo_workdir(root, corpus_dir):
    """A directory laid out like the checkout for configs/demo.flags's relative paths (run/, configs/,
    hostfiles/, scripts/ linked; data/demo/ made here, small: one corpus file, 2000-word vocabulary),
    so the README's command lines run verbatim without writing into the checkout."""
    from bert_tf.data import corpus, pretraining_data as pd, tokenization

    root = pathlib.Path(root)
    for name in ("run", "configs", "hostfiles", "scripts", "bert_tf"):
        (root / name).symlink_to(REPO / name)
    demo = root / "data" / "demo"
    (demo / "seq128").mkdir(parents=True)
    inputs = [str(pathlib.Path(corpus_dir) / "lee_background.cor") + "@documents"]
    docs = list(corpus.read_documents(inputs))
    vocab = tokenization.learn_vocab([s for d in docs for s in d], vocab_size=2000)
    tokenization.write_vocab(vocab, str(demo / "vocab.txt"))
    config = pd.InstanceConfig(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2, random_seed=5)
    pd.create_pretraining_data(inputs, "auto", tokenization.Tokenizer(vocab), str(demo / "seq128"), config,
                               num_shards=2, heldout_fraction=0.05, log=lambda *a: None)
    say(f"demo work dir {root}: data/demo made from lee_background.cor (2000-word vocabulary)")
    return root


def short_run_flags(total_steps, checkpoint_dir):
    """What the tests change in configs/demo.flags: step counts, and where checkpoints go."""
    return [f"--total_steps={total_steps}", "--warmup_steps=3", "--log_interval=10",
            f"--save_interval={min(10, total_steps)}", f"--checkpoint_dir={checkpoint_dir}"]


def run_env(workdir, extra=None):
    """Environment for launches from a demo work dir: the checkout's bert_tf first on sys.path."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra or {})
    return env
