"""Verification stamps for the expensive deployment checks (the images' checks, the GPU install's).

A check that passes records a stamp: a file in $BERT_TF_CACHE/stamps/ (default ~/.cache/bert_tf/stamps/)
named by the check and the hash of every input it depends on (`digest`), the way scripts/setup.sh keys
the Horovod wheel. When the stamp for the current inputs is there, the test runs only a cheap check
that could still fail (e.g. the keyed image is the very image that was checked), prints that the
expensive part was verified earlier for exactly these inputs, naming the stamp, and ends as skipped with
that reason (pytest -ra lists it). A fresh machine (no stamp) or any change of the inputs runs the whole
check; BERT_TF_IGNORE_STAMPS=1 runs it whatever the stamps say."""
import datetime
import hashlib
import json
import os
import pathlib
import platform
import re
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CACHE = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf"))
DIR = CACHE / "stamps"


def say(msg):
    print(f"[stamps] {msg}", file=sys.__stderr__, flush=True)


def digest(*items):
    """sha256 (16 hex digits) of items: str, bytes, or pathlib.Path (a file: its path relative to the
    repository and its content; a folder: every file under it, __pycache__ aside; missing: that fact)."""
    h = hashlib.sha256()
    for item in items:
        if isinstance(item, pathlib.Path):
            files = sorted(p for p in item.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if item.is_dir() else [item]
            for f in files:
                name = str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f)
                h.update(b"file\0" + name.encode() + b"\0")
                h.update(f.read_bytes() if f.exists() else b"(missing)")
        else:
            h.update(b"item\0" + (item if isinstance(item, bytes) else str(item).encode()) + b"\0")
    return h.hexdigest()[:16]


def machine():
    """What the checks' results could depend on besides their inputs: CPU model, Python, OpenMPI."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return f"{platform.machine()} {cpu} | Python {platform.python_version()} | {mpi}"


class Stamp:
    """One check's stamp: `check` names it (e.g. "docker-cpu.test_demo_in_the_image"), `key` is the
    digest of every input it depends on, `inputs` says what went into the key (written into the stamp)."""

    def __init__(self, check, key, inputs):
        self.check, self.key, self.inputs = check, key, inputs
        self.path = DIR / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', check)}-{key}.json"
        self.start = time.time()

    def recorded(self):
        """The stamp's record when it exists for exactly this check and key (else None)."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return record if record.get("check") == self.check and record.get("key") == self.key else None

    def skip_if_verified(self, cheap_check=None):
        """When the stamp for these inputs exists: cheap_check(record) runs (it fails the test by raising;
        it returns False when what is here is not what was verified, e.g. an image rebuilt since: then
        the whole check runs), and the test ends as skipped, saying so. Otherwise returns, and the test
        runs the whole check, then calls record()."""
        __tracebackhide__ = True             # pytest -ra names the test's line, not this one
        if os.environ.get("BERT_TF_IGNORE_STAMPS", "") not in ("", "0"):
            say(f"{self.check}: BERT_TF_IGNORE_STAMPS is set: running the whole check")
            return
        record = self.recorded()
        if record is None:
            say(f"{self.check}: no stamp for these inputs ({self.path.name}): running the whole check")
            return
        if cheap_check is not None and cheap_check(record) is False:
            say(f"{self.check}: stamp {self.path} is for other artefacts than the ones here: running the whole check")
            return
        took = f", {record['seconds']:.0f} s" if isinstance(record.get("seconds"), (int, float)) else ""
        message = (f"{self.check}: verified earlier for exactly these inputs (stamp {self.path}, passed "
                   f"{record.get('passed', '?')}{took}); the cheap check passed: not repeated")
        say(message)
        print(message)
        pytest.skip(message)

    def record(self, **facts):
        """After the whole check passed: writes the stamp (atomically)."""
        DIR.mkdir(parents=True, exist_ok=True)
        record = {"check": self.check, "key": self.key, "passed": datetime.datetime.now().isoformat(timespec="seconds"),
                  "seconds": round(time.time() - self.start, 1), "host": socket.gethostname(),
                  "inputs": self.inputs, **facts}
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, self.path)
        say(f"{self.check}: passed; stamp {self.path}")


def for_test(request, group, inputs, name=None):
    """The stamp of the running test (or of test `name` in its module): check "<group>.<test name>", key =
    digest of `inputs` (a dict: name -> str, bytes, Path or a list of them; recorded by name with each
    one's own digest), of the test's module file and of this file."""
    inputs = {**inputs, "test module": pathlib.Path(request.node.fspath), "tests/stamps.py": pathlib.Path(__file__)}
    parts = {}
    for what, value in inputs.items():
        if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16}", value):
            parts[what] = value                                     # a key already
        else:
            parts[what] = digest(*value) if isinstance(value, (list, tuple)) else digest(value)
    key = digest(*(f"{what}={part}" for what, part in sorted(parts.items())))
    return Stamp(f"{group}.{name or request.node.name}", key, parts)


class NoStamp:
    """For an artefact without a content key (e.g. BERT_TF_TEST_IMAGE): the whole check, nothing recorded."""

    def skip_if_verified(self, cheap_check=None):
        say("no content key for what is checked here: running the whole check")

    def recorded(self):
        return None

    def record(self, **facts):
        pass
