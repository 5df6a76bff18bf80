"""scripts/setup.sh: warm runs are quick and repair the corpus; a machine it cannot fix gets a clear message."""
import os
import subprocess
import sys
import time

from conftest import REPO

SETUP = str(REPO / "scripts" / "setup.sh")


def run_setup(env=None):
    return subprocess.run(["bash", SETUP], env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


def test_warm_setup_is_quick_and_restores_a_corrupted_corpus_file():
    target = REPO / "data" / "corpus" / "pang_lee_polarity.cor"
    good = target.read_bytes()
    target.write_bytes(good[:-100] + b"tampered")
    start = time.time()
    proc = run_setup()
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
