"""Daemons the deployment tests need and start themselves (CI starts none): Debian packages,
dockerd, the image build (in two parts, each cached by what it is built from), munge and a one-machine Slurm.
Everything they do is printed (run pytest with -s, or read the captured output of a failure)."""
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import re
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


def remove_leftovers(prefix):
    """Containers and networks named `<prefix><pid>-...` whose test session (that pid) no longer runs."""
    def stale(name):
        m = re.match(re.escape(prefix) + r"(\d+)-", name)
        return m and not os.path.exists(f"/proc/{m.group(1)}")
    containers = [n for n in docker("ps", "-a", "--format", "{{.Names}}").stdout.split() if stale(n)]
    networks = [n for n in docker("network", "ls", "--format", "{{.Name}}").stdout.split() if stale(n)]
    if containers:
        docker("rm", "-f", *containers, check=False)
    for net in networks:
        say(f"removing network {net}, left by a test session that no longer runs")
        docker("network", "rm", net, check=False)


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


def dockerfile_sources(dockerfile=REPO / "Dockerfile", text=None):
    """Paths of the build context that the Dockerfile (or `text`, a part of it) COPYs (not --from a stage)."""
    text = (text if text is not None else dockerfile.read_text()).replace("\\\n", " ")
    sources = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            sources += [p for p in parts[1:-1] if not p.startswith("--") and p not in sources]
    return sources


def dockerfile_instructions(text):
    """[(op, args, text)]: each instruction with its continuation lines and the comments above it."""
    out, pending, current = [], "", None
    for line in text.splitlines(keepends=True):
        if current is not None:                       # a continuation line
            current[2] += line
            if not line.rstrip("\n").endswith("\\"):
                out.append(tuple(current))
                current = None
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            pending += line
            continue
        op, _, args = line.strip().partition(" ")
        current = [op.upper(), args, pending + line]
        pending = ""
        if not line.rstrip("\n").endswith("\\"):
            out.append(tuple(current))
            current = None
    if pending:
        out.append(("", "", pending))                 # comments after the last instruction
    return [(op, " ".join(args.replace("\\\n", " ").split()), text) for op, args, text in out]


def dockerfile_parts(dockerfile=REPO / "Dockerfile"):
    """The Dockerfile cut where the project source comes in, for building it in two images:
      deps:   everything up to the final stage's COPY --from=source (the builder stage and the runtime
              stage's dependency layers), without the source stage, which those do not use;
      source: the source stage (FROM scratch: only COPYs of the project source);
      tail:   the final stage from that COPY on (no RUN, ADD or ARG: only the COPY and settings; the
              legacy builder makes a container for each, which vfs stores as a full copy).
    `source` + "FROM <deps image> AS <final stage>" + `tail` builds, on the deps image, the layers the
    Dockerfile puts on it: the same instructions in the same order."""
    instructions = dockerfile_instructions(dockerfile.read_text())
    stages, preamble = [], []
    for ins in instructions:
        if ins[0] == "FROM":
            words = ins[1].split()
            stages.append({"base": words[0], "name": words[2] if len(words) == 3 and words[1].upper() == "AS" else "",
                           "instructions": [ins]})
        elif stages:
            stages[-1]["instructions"].append(ins)
        else:
            preamble.append(ins)
    names = [s["name"] for s in stages]
    if "source" not in names or names[-1] == "source":
        raise RuntimeError(f"{dockerfile}: expected a stage 'source' before the final stage (stages: {names})")
    source = stages[names.index("source")]
    final = stages[-1]
    if source["base"] != "scratch" or any(op not in ("FROM", "COPY", "") or "--from" in args
                                          for op, args, _ in source["instructions"]):
        raise RuntimeError(f"{dockerfile}: the source stage must be FROM scratch with COPYs of the build context only")
    users = [(s["name"], args) for s in stages for op, args, _ in s["instructions"] if op == "COPY" and "--from=source" in args]
    if len(users) != 1 or users[0][0] != final["name"]:
        raise RuntimeError(f"{dockerfile}: expected one COPY --from=source, in the final stage: {users}")
    cut = next(i for i, (op, args, _) in enumerate(final["instructions"]) if op == "COPY" and "--from=source" in args)
    tail = final["instructions"][cut:]
    if any(op in ("RUN", "ADD", "ARG", "FROM", "ONBUILD") or (op == "COPY" and "--from=source" not in args)
           or "$" in args for op, args, _ in tail):
        raise RuntimeError(f"{dockerfile}: after its COPY --from=source the final stage may only set settings")
    deps = preamble + [ins for s in stages if s is not source and s is not final for ins in s["instructions"]] \
        + final["instructions"][:cut]
    text = lambda part: "".join(t for _, _, t in part)
    return {"deps": text(deps), "source": text(source["instructions"]), "tail": text(tail), "final_stage": final["name"]}


def build_context(dest, dockerfile_text, wheels=None, ca_bundle=None, gpu=False, extra=()):
    """A build context in dest: `dockerfile_text` as its Dockerfile, the files it copies, plus for the
    builder stage the optional build inputs (docker/build-inputs/: a Horovod wheel cache, the CPU or the
    GPU (NCCL) wheels only, a CA bundle). Returns its content key: a hash of all that and of `extra`."""
    digest = hashlib.sha256()
    for item in extra:
        digest.update(str(item).encode() + b"\0")
    (dest / "Dockerfile").write_text(dockerfile_text)
    digest.update(b"Dockerfile\0" + dockerfile_text.encode())
    files = [REPO / ".dockerignore"]
    for source in dockerfile_sources(text=dockerfile_text):
        path = REPO / source
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        rel = f.relative_to(REPO)
        if "__pycache__" in rel.parts or (rel.parts[:2] == ("docker", "build-inputs") and rel.name != "README.md"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / rel)
        digest.update(str(rel).encode() + b"\0" + f.read_bytes())
    if "docker/build-inputs" in dockerfile_text:
        inputs = dest / "docker" / "build-inputs"
        inputs.mkdir(parents=True, exist_ok=True)
        digest.update(b"gpu" if gpu else b"cpu")
        if wheels:
            shutil.copytree(wheels, inputs / "wheels", ignore=lambda folder, names: [
                n for n in names if pathlib.Path(folder) == pathlib.Path(wheels) and ("-nccl" in n) != gpu])
            for sums in sorted((inputs / "wheels").rglob("SHA256SUMS")):
                digest.update(str(sums.relative_to(inputs)).encode() + b"\0" + sums.read_bytes())
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


@dataclasses.dataclass
class Image:
    name: str            # bert_tf:cpu-<key>, tagged bert_tf:cpu too (or BERT_TF_TEST_IMAGE)
    key: str             # hash of every input of the image (None: an image not built here)
    id: str
    seconds: float       # build time here (0: cached)
    deps: str = ""       # bert_tf:cpu-deps-<deps key>: the image up to the project source
    deps_key: str = ""
    deps_seconds: float = 0.0


def image_id(name):
    return docker("image", "inspect", "-f", "{{.Id}}", name).stdout.strip()


def image_layers(name):
    return json.loads(docker("image", "inspect", "-f", "{{json .RootFS.Layers}}", name).stdout)


def docker_build(tag_args, ctx, what, build_args=()):
    start = time.time()
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    proc = subprocess.run(["docker", "build", *tag_args, *build_args, str(ctx)], capture_output=True, text=True,
                          env=env, timeout=3600)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"docker build of {what} failed after {seconds:.0f} s\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return seconds


def ensure_image(gpu=False):
    """bert_tf:cpu (or bert_tf:gpu: --build-arg GPU=build) from a copy of the checkout, in two builds
    (dockerfile_parts): the deps image bert_tf:cpu-deps-<deps key> (builder stage, Debian packages, venv,
    Horovod: keyed by the files that part copies, the wheel cache and CA bundle fed to it, the base image),
    kept while its key holds; then the project source on it, bert_tf:cpu-<key> (key: the deps image's key
    and id, and the source). Either is built only when no image has its key; a source-only change builds
    the last layer alone. Older keyed images of the same kind and dangling build stages are removed (vfs stores
    every layer in full)."""
    image = GPU_IMAGE if gpu else IMAGE
    if os.environ.get("BERT_TF_TEST_IMAGE") and not gpu:
        name = os.environ["BERT_TF_TEST_IMAGE"]
        say(f"testing the image BERT_TF_TEST_IMAGE={name} (not built here: no content key, no stamps)")
        return Image(name, None, image_id(name), 0.0)
    ensure_base_image()
    cache = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf"))
    wheels = cache / "wheels"
    ca = pip_cert()
    parts = dockerfile_parts()
    base_id = image_id(BASE_IMAGE)
    built = {}
    with tempfile.TemporaryDirectory(prefix="bert_tf-context.") as ctx:
        deps_key = build_context(pathlib.Path(ctx), parts["deps"], wheels if wheels.is_dir() else None, ca, gpu=gpu,
                                 extra=[f"base {BASE_IMAGE} {base_id}"])
        deps = f"{image}-deps-{deps_key}"
        if image_exists(deps):
            say(f"dependency image {deps} (key = hash of what it is built from) already built: not rebuilding")
        else:
            say(f"building {deps} (the Dockerfile up to the project source) with the legacy builder (Debian 12 has "
                f"no buildx); inputs: Horovod wheel cache from {wheels if wheels.is_dir() else '(none: compiled in the image)'}, "
                f"CA bundle {ca or '(none)'}")
            built["deps"] = docker_build(["-t", deps], ctx, deps, ["--build-arg", "GPU=build"] if gpu else [])
            say(f"built {deps} in {built['deps']:.0f} s")
    with tempfile.TemporaryDirectory(prefix="bert_tf-context.") as ctx:
        text = f"{parts['source']}FROM {deps} AS {parts['final_stage']}\n{parts['tail']}"
        key = build_context(pathlib.Path(ctx), text, extra=[f"deps {deps_key} {image_id(deps)}"])
        keyed = f"{image}-{key}"
        if image_exists(keyed):
            say(f"image {keyed} (key = hash of every file it is built from) already built: not rebuilding")
            docker("tag", keyed, image)
        else:
            say(f"building {keyed}: the project source on {deps}")
            built["image"] = docker_build(["-t", keyed, "-t", image], ctx, keyed)
            say(f"built {keyed} in {built['image']:.0f} s")
    if built:
        remove_older_images(image, keyed, deps)
    return Image(keyed, key, image_id(keyed), sum(built.values()), deps, deps_key, built.get("deps", 0.0))


def docker_daemon():
    """What the image checks could depend on besides the image: the daemon's version and storage driver."""
    return docker("info", "-f", "{{.ServerVersion}} {{.Driver}}").stdout.strip()


CUDA_VENV = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf")) / "venv-py311-cuda"


def gpu_install(timeout=3600):
    """The GPU install (BERT_TF_GPU=build bash scripts/setup.sh, as tests/test_gpu.py makes it): the GPU
    venv and its Horovod wheel with NCCL, cached in the wheel cache (seconds when it is). The GPU image
    takes that wheel as a build input instead of compiling it again."""
    say(f"the GPU install (BERT_TF_GPU=build bash scripts/setup.sh, venv {CUDA_VENV})")
    start = time.time()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "BERT_TF_GPU": "build", "BERT_TF_VENV": str(CUDA_VENV)})
    if proc.returncode != 0:
        raise RuntimeError(f"the GPU install failed after {time.time() - start:.0f} s\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    say(f"GPU install ready after {time.time() - start:.0f} s")
    return proc


def remove_older_images(image, keyed, deps):
    """Older keyed images of this kind (bert_tf:cpu-<key>, then bert_tf:cpu-deps-<key>) and dangling images
    (the builder and source stages: the GPU builder stage holds 7 GB; two builds within hours filled the
    disk with them). The deps image is the build cache that matters: it is kept while its key holds."""
    tags = docker("images", "--format", "{{.Repository}}:{{.Tag}}", "bert_tf").stdout.split()
    older = [t for t in tags if re.fullmatch(rf"{re.escape(image)}-[0-9a-f]{{16}}", t) and t != keyed]
    older += [t for t in tags if re.fullmatch(rf"{re.escape(image)}-deps-[0-9a-f]{{16}}", t) and t != deps]
    for tag in older:
        say(f"removing the older image {tag}")
        docker("rmi", tag, check=False)
    docker("image", "prune", "-f", check=False)


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
