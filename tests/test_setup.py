"""scripts/setup.sh: warm runs are quick and repair the corpus; a machine it cannot fix gets a clear message."""
import pytest
import os
import shutil
import subprocess
import sys
import time

from conftest import REPO

SETUP = str(REPO / "scripts" / "setup.sh")


def run_setup(env=None, setup=SETUP):
    return subprocess.run(["bash", str(setup)], env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


def test_warm_setup_is_quick_and_restores_a_corrupted_corpus_file(tmp_path):
    # a copy of the checkout, so that nothing here writes into the real one; bert_tf imported
    # from the copy, so that setup does not re-point the editable install to it
    copy = tmp_path / "checkout"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "data", "runs", "*.egg-info", "__pycache__"))
    shutil.copytree(REPO / "data" / "corpus", copy / "data" / "corpus")
    target = copy / "data" / "corpus" / "pang_lee_polarity.cor"
    good = target.read_bytes()
    target.write_bytes(good[:-100] + b"tampered")
    start = time.time()
    proc = run_setup({"PYTHONPATH": str(copy)}, setup=copy / "scripts" / "setup.sh")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "extracting the bundled corpus" in proc.stdout
    assert target.read_bytes() == good
    assert time.time() - start < 60


def test_missing_packages_without_apt_get_are_listed_and_fail(tmp_path):
    # A PATH with every usual tool except apt-get and OpenMPI's programs.
    hidden = {"apt-get", "mpirun", "mpicxx", "mpiexec", "orterun"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for name in os.listdir(folder):
            if name not in hidden and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(folder, name))
    proc = run_setup({"PATH": str(bin_dir), "BERT_TF_PYTHON": sys.executable})
    assert proc.returncode != 0
    assert "no apt-get on this machine" in proc.stderr
    assert "openmpi-bin" in proc.stderr and "libopenmpi-dev" in proc.stderr


@pytest.mark.slow
def test_a_corrupt_cached_wheel_is_never_installed_and_no_network_is_reported(tmp_path):
    """A copy of the wheel cache with one byte appended: setup must refuse it and rebuild. The
    rebuild then meets a package index that does not answer (a dead loopback port), as on a
    machine without network, and must stop with a message instead of installing anything."""
    import glob
    import shutil
    source = os.path.expanduser(os.environ.get("BERT_TF_CACHE", "~/.cache/bert_tf"))
    wheels = glob.glob(os.path.join(source, "wheels", "horovod-*"))
    assert wheels, "no cached Horovod wheel: run scripts/setup.sh first"
    cache = tmp_path / "cache"
    shutil.copytree(os.path.join(source, "wheels"), cache / "wheels")
    for whl in glob.glob(str(cache / "wheels" / "*" / "horovod-*.whl")):
        with open(whl, "ab") as f:
            f.write(b"x")
    venv = os.path.dirname(os.path.dirname(sys.executable))
    before = subprocess.run([sys.executable, "-m", "pip", "show", "horovod"], capture_output=True, text=True).stdout
    proc = run_setup({"BERT_TF_CACHE": str(cache), "BERT_TF_VENV": venv, "PIP_CONFIG_FILE": os.devnull,
                      "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
                      "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "5", "TMPDIR": str(tmp_path)})
    assert "is missing or corrupt: rebuilding" in proc.stdout
    assert proc.returncode != 0 and "Horovod build failed; full log:" in proc.stderr
    rebuilt = proc.stdout.split("cached Horovod wheel in ")[1].split(" is missing")[0]
    assert rebuilt.startswith(str(cache)) and not glob.glob(os.path.join(rebuilt, "*.whl"))  # corrupt one gone
    after = subprocess.run([sys.executable, "-m", "pip", "show", "horovod"], capture_output=True, text=True).stdout
    assert after == before                                                # nothing was installed
