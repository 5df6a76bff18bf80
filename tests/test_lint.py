"""Lint and types in the unit tier: ruff (ruff.toml's rules) over bert_tf/, run/, tests/ and scripts/, its file
list covering every module, ruff's formatter at 100 columns over bert_tf/ and run/, mypy (mypy.ini) over bert_tf/ and run/, and no `# noqa` without a reason on its
line."""
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import CACHE, REPO

RUFF = [sys.executable, "-m", "ruff"]
FOLDERS = ("bert_tf", "run", "tests", "scripts")


def test_ruff_passes():
    proc = subprocess.run(RUFF + ["check", "--output-format=concise", *FOLDERS], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_formatter_passes_at_100_columns_on_the_library_and_the_entry_points():
    """`ruff format --check` over bert_tf/ and run/, with ruff.toml's limit at most 100 and the long-line rule
    (E501) on for them: the formatter leaves a long string or comment alone, the linter does not."""
    import tomllib
    config = tomllib.loads((REPO / "ruff.toml").read_text())
    assert config["line-length"] <= 100
    assert "E501" not in config["lint"].get("ignore", [])
    ignored = {glob for glob, rules in config["lint"].get("per-file-ignores", {}).items() if "E501" in rules}
    assert not {g for g in ignored if g.startswith(("bert_tf", "run"))}, ignored
    proc = subprocess.run(RUFF + ["format", "--check", "bert_tf", "run"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_linter_reads_every_module():
    """A folder a tool skips by default (`dist/` was one: bert_tf/dist/ went unread) would be missing here."""
    proc = subprocess.run(RUFF + ["check", "--show-files", "bert_tf", "run"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    read = {Path(line).resolve() for line in proc.stdout.split()}
    modules = {p.resolve() for folder in ("bert_tf", "run") for p in (REPO / folder).rglob("*.py")}
    assert modules and not modules - read, sorted(str(p.relative_to(REPO)) for p in modules - read)


def test_mypy_passes():
    """mypy.ini's settings over the library and the entry points (native packages' names are Any). Its
    cache is kept in $BERT_TF_CACHE, so a fresh clone re-checks only what changed (mypy compares the files'
    hashes)."""
    env = {**os.environ, "MYPY_CACHE_DIR": str(CACHE / "mypy")}
    proc = subprocess.run([sys.executable, "-m", "mypy", "bert_tf", "run"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_every_noqa_says_why():
    bare = [f"{path.relative_to(REPO)}:{n}" for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if "# noqa" in line and not re.search(r"# noqa: [A-Z0-9, ]+\s+[(-]", line) and path.name != "test_lint.py"]
    assert not bare, bare
