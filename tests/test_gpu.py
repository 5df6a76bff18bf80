"""GPU nodes, checked on a machine without a GPU.

The GPU install (BERT_TF_GPU=build: TensorFlow with its CUDA wheels, Horovod built with NCCL through
scripts/horovod_patches/) builds, loads with every symbol resolved, reports CUDA and NCCL, and trains
on the CPU under mpirun, so one install serves mixed clusters. Setup refuses a GPU node it cannot
serve before installing anything; start-up names an install that does not fit its node.
The expensive checks of the install record a stamp when they pass (tests/stamps.py), keyed by every
input of the install (and, for the training, the source it trains with): for the same inputs they are
not repeated (a cheap check and a skip that says so).
"""
import json
import os
import pathlib
import re
import subprocess

import pytest

import stamps
from conftest import REPO, mpirun

SETUP = str(REPO / "scripts" / "setup.sh")
CACHE = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf"))
CUDA_VENV = CACHE / "venv-py311-cuda"
CUDA_PY = str(CUDA_VENV / "bin" / "python")


def fake_nvidia_smi(folder, driver):
    """An nvidia-smi that reports one GPU with this driver (the driver checks run before any install)."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\ncase \"$*\" in\n  *driver_version*) echo %s ;;\n"
                      "  *) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)' ;;\nesac\n" % driver)
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def setup(env, timeout=120):
    return subprocess.run(["bash", SETUP], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_node_without_a_driver_is_refused_before_anything_is_installed(tmp_path):
    venv = tmp_path / "venv"
    proc = setup({"BERT_TF_GPU": "1", "BERT_TF_VENV": str(venv),
                  "PATH": "/usr/local/bin:/usr/bin:/bin"})               # no nvidia-smi on this PATH
    assert proc.returncode != 0
    assert "BERT_TF_GPU=1 but no NVIDIA driver answers here (nvidia-smi not found)" in proc.stderr
    assert "BERT_TF_GPU=build" in proc.stderr
    assert not venv.exists()


def test_a_driver_too_old_for_cuda_12_5_is_refused_and_one_too_old_for_hopper_is_warned_about(tmp_path):
    venv = tmp_path / "venv"
    old = setup({"BERT_TF_GPU": "1", "BERT_TF_VENV": str(venv), **fake_nvidia_smi(tmp_path / "old", "470.82.01")})
    assert old.returncode != 0
    assert "NVIDIA driver 470.82.01 is too old for TensorFlow 2.21's CUDA 12.5 runtime" in old.stderr
    assert not venv.exists()
    # 535 runs CUDA 12 but not 12.5's PTX: a warning, and setup goes on (the check alone here)
    mid = subprocess.run(["bash", "-c", f"source {REPO}/scripts/gpu_driver.sh; say() {{ echo \"$*\"; }}; "
                          "die() { echo \"$*\" >&2; exit 1; }; BERT_TF_GPU=1 check_gpu_driver"],
                         env={**os.environ, **fake_nvidia_smi(tmp_path / "mid", "535.104.05")}, capture_output=True,
                         text=True, timeout=60)
    assert mid.returncode == 0, mid.stderr
    assert "WARNING: NVIDIA driver 535.104.05 predates CUDA 12.5: Hopper GPUs (H100)" in mid.stdout
    assert "GPU node: 1 GPU(s), driver 535.104.05" in mid.stdout


def test_a_gpu_node_gets_the_gpu_install_by_default_and_a_cpu_only_one_only_with_a_warning(tmp_path):
    """A GPU node never takes the CPU venv and wheel by default; asked for them, setup says what is lost."""
    script = (f"source {REPO}/scripts/env.sh; source {REPO}/scripts/gpu_driver.sh; say() {{ echo \"$*\"; }}; "
              "die() { echo \"$*\" >&2; exit 1; }; echo \"$BERT_TF_GPU $BERT_TF_VENV\"; check_gpu_driver")
    env = {k: v for k, v in os.environ.items() if k not in ("BERT_TF_GPU", "BERT_TF_VENV")}
    env.update(fake_nvidia_smi(tmp_path / "bin", "560.35.03"), BERT_TF_CACHE=str(tmp_path / "cache"))
    auto = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.splitlines()[0] == f"1 {tmp_path / 'cache'}/venv-py311-cuda"
    assert "GPU node: 1 GPU(s), driver 560.35.03" in auto.stdout and "WARNING" not in auto.stdout
    cpu = subprocess.run(["bash", "-c", script], env={**env, "BERT_TF_GPU": "0"}, capture_output=True, text=True,
                         timeout=60)
    assert cpu.stdout.splitlines()[0] == f"0 {tmp_path / 'cache'}/venv-py311"
    assert "WARNING: this node has NVIDIA GPUs but BERT_TF_GPU=0 makes the CPU-only install" in cpu.stdout


def test_each_trainer_sets_tensorfloat32_as_its_config_says():
    """--tf32 / --notf32: process-wide in TensorFlow, so each trainer (each ladder rung) sets it."""
    import tensorflow as tf

    from bert_tf.model import modeling
    from bert_tf.train import training
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=64))
    try:
        for tf32 in (False, True, False):
            training.Trainer(model, training.TrainConfig(tf32=tf32))
            assert tf.config.experimental.tensor_float_32_execution_enabled() is tf32
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)     # TensorFlow's default


def test_an_unknown_gpu_mode_is_named(tmp_path):
    proc = setup({"BERT_TF_GPU": "yes", "BERT_TF_VENV": str(tmp_path / "venv")})
    assert proc.returncode != 0 and "BERT_TF_GPU=yes: use auto, 1" in proc.stderr


def test_one_gpu_per_local_rank_and_two_ranks_never_share_one():
    from bert_tf import ConfigError
    from bert_tf.parallel.distributed import assign_gpu
    assert [assign_gpu(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [assign_gpu(r, 2, 8) for r in range(2)] == [0, 1]                   # fewer ranks than GPUs
    assert [assign_gpu(r, 4, 1, "3") for r in range(4)] == [0, 0, 0, 0]         # the launcher pinned each rank
    for n_gpus, visible in ((1, None), (1, ""), (2, "0,1"), (3, None)):
        with pytest.raises(ConfigError, match=r"4 ranks on this node but .* GPU\(s\).*would share a GPU"):
            assign_gpu(0, 4, n_gpus, visible)


def test_a_node_whose_install_does_not_fit_its_hardware_is_named_with_the_command_that_fixes_it():
    from bert_tf.parallel.distributed import gpu_install_problem
    assert gpu_install_problem(0, False, False) == ""                            # a CPU node
    assert gpu_install_problem(0, True, False) == ""                             # the GPU install on a CPU node
    assert gpu_install_problem(1, True, True) == ""                              # a GPU node, GPU install
    cpu_wheels = gpu_install_problem(0, False, True)
    assert "TensorFlow sees none" in cpu_wheels and "BERT_TF_GPU=1 bash scripts/setup.sh" in cpu_wheels
    no_nccl = gpu_install_problem(2, False, True)
    assert "without NCCL" in no_nccl and "BERT_TF_GPU=1 bash scripts/setup.sh" in no_nccl


# ------------------------------------------------------------------ the GPU install, for real (cluster tier)

@pytest.fixture(scope="module")
def gpu_install():
    """BERT_TF_GPU=build bash scripts/setup.sh: the GPU venv and its Horovod wheel, cached like the CPU
    ones (seconds when cached; measured cold: see the README's GPU nodes section)."""
    proc = setup({"BERT_TF_GPU": "build", "BERT_TF_VENV": str(CUDA_VENV)}, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def install_stamp(request, trains=False):
    """The stamp of a check of the GPU install, keyed by what the install is made from (as setup.sh keys
    the Horovod wheel, and more): requirements, setup.py, scripts/ (setup.sh, what it sources, the Horovod
    patches and compatibility headers, the corpus sums), the settings it reads, the state it made (the
    venv's stamps: requirement set, Horovod wheel and its check), this machine and this module's code;
    a check that trains adds bert_tf/, run/ and tests/conftest.py. When the stamp exists: the cheap check
    (the fixture ran setup.sh, which verifies the wheel and the stamps; the venv answers), then a skip."""
    __tracebackhide__ = True
    inputs = {"requirements": [REPO / "requirements.txt", REPO / "requirements-dev.txt", REPO / "requirements-cuda.txt"],
              "setup.py": REPO / "setup.py", "scripts/": REPO / "scripts",
              "settings": " ".join(f"{k}={os.environ.get(k, '')}" for k in
                                   ("BERT_TF_CUDA_CC_LIST", "BERT_TF_HOROVOD_GLOO", "BERT_TF_PYTHON", "CUDA_TOOLKIT_MIRROR")),
              "install": [CUDA_VENV / ".bert_tf-requirements.sha256", CUDA_VENV / ".bert_tf-horovod",
                          CUDA_VENV / ".bert_tf-horovod-checked"],
              "machine": stamps.machine()}
    if trains:
        inputs.update({"bert_tf/": REPO / "bert_tf", "run/": REPO / "run", "tests/conftest.py": REPO / "tests" / "conftest.py"})
    stamp = stamps.for_test(request, "gpu-install", inputs)

    def venv_answers(record):
        proc = subprocess.run([CUDA_PY, "-c", "import importlib.metadata as m; print(m.version('horovod'), "
                               "m.version('tensorflow'), m.version('nvidia-nccl-cu12'))"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and len(proc.stdout.split()) == 3, proc.stderr[-2000:]
    stamp.skip_if_verified(venv_answers)
    return stamp


@pytest.mark.cluster
def test_gpu_horovod_loads_every_symbol_and_reports_cuda_and_nccl(gpu_install, request):
    stamp = install_stamp(request)
    script = ("import json, horovod.tensorflow as hvd, tensorflow as tf, importlib.metadata as m; "
              "info = tf.sysconfig.get_build_info(); print(json.dumps({'cuda': hvd.cuda_built(), "
              "'nccl': hvd.nccl_built(), 'mpi': hvd.mpi_built(), 'gloo': hvd.gloo_built(), "
              "'tf_cuda': info['is_cuda_build'], 'cuda_version': info['cuda_version'], "
              "'nccl_wheel': m.version('nvidia-nccl-cu12'), 'gpus': len(tf.config.list_physical_devices('GPU'))}))")
    # LD_BIND_NOW: an undefined symbol (TensorFlow 2.21 no longer exports AsGpuStreamValue) fails the import
    proc = subprocess.run([CUDA_PY, "-c", script], env={**os.environ, "LD_BIND_NOW": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    major, minor, patch = map(int, got["nccl_wheel"].split("."))
    assert got["cuda"] is True and got["mpi"] is True and got["gloo"] is True
    assert got["nccl"] == major * 10000 + minor * 100 + patch          # Horovod loaded the wheel's NCCL
    assert got["tf_cuda"] is True and got["cuda_version"].startswith("12.5")
    assert got["gpus"] == 0
    stamp.record()


@pytest.mark.cluster
def test_the_gpu_wheel_finds_nccl_beside_tensorflow_and_holds_kernels_for_volta_ampere_hopper(gpu_install):
    lib = next((CUDA_VENV / "lib" / "python3.11" / "site-packages" / "horovod" / "tensorflow").glob("mpi_lib*.so"))
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    runpath = re.search(r"RUNPATH\).*\[(.*)\]", dynamic).group(1).split(":")
    assert runpath[0] == "$ORIGIN/../../nvidia/nccl/lib" and not any("/tmp" in p for p in runpath), runpath
    assert "libnccl.so.2" in dynamic
    toolkit = subprocess.run(["bash", "-c", f"source {REPO}/scripts/env.sh; source {REPO}/scripts/cuda_toolkit.sh; "
                              "say() { :; }; die() { echo \"$*\" >&2; exit 1; }; ensure_cuda_toolkit; echo $CUDA_TOOLKIT"],
                             capture_output=True, text=True, timeout=1800)
    assert toolkit.returncode == 0, toolkit.stderr
    cuobjdump = pathlib.Path(toolkit.stdout.split()[-1]) / "bin" / "cuobjdump"
    listing = subprocess.run([str(cuobjdump), "--list-elf", "--list-ptx", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert {"sm_70", "sm_80", "sm_90"} <= set(re.findall(r"\.(sm_\d+)\.cubin", listing)), listing[:2000]
    assert re.findall(r"\.(sm_\d+)\.ptx", listing) and set(re.findall(r"\.(sm_\d+)\.ptx", listing)) == {"sm_90"}


@pytest.mark.cluster
def test_horovodrun_check_build_lists_nccl(gpu_install, request):
    stamp = install_stamp(request)
    proc = subprocess.run([str(CUDA_VENV / "bin" / "horovodrun"), "--check-build"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo", "[X] NCCL"):
        assert line in proc.stdout, proc.stdout
    stamp.record()


@pytest.mark.cluster
def test_two_rank_pretraining_on_the_cpu_with_the_gpu_install(gpu_install, tiny_data, tmp_path, request):
    stamp = install_stamp(request, trains=True)
    ckpt = tmp_path / "ckpt"
    proc = mpirun(2, [REPO / "run" / "pretrain.py", *tiny_data["flags"], "--total_steps=6", "--save_interval=6",
                      f"--checkpoint_dir={ckpt}", "--xla=false"], python=CUDA_PY, timeout=900)
    assert re.search(r"Horovod 0\.28\.1 \(MPI, Gloo, NCCL\), TensorFlow 2\.21\.0 \(CUDA 12\.5[\d.]*\); device: CPU",
                     proc.stdout), proc.stdout[-3000:]
    assert "step 6/6" in proc.stdout
    assert (ckpt / "ckpt-6.index").exists()
    stamp.record()


def test_the_gpu_node_check_says_what_is_missing_on_a_machine_without_a_gpu(tmp_path):
    check = str(REPO / "scripts" / "gpu_check.sh")
    proc = subprocess.run(["bash", check, str(tmp_path / "out")], env={**os.environ, "BERT_TF_GPU": "auto"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no GPU on this node (nvidia-smi lists none)" in proc.stderr
    forced = subprocess.run(["bash", check, str(tmp_path / "out")], env={**os.environ, "BERT_TF_GPU": "1"},
                            capture_output=True, text=True, timeout=60)
    assert forced.returncode != 0 and "no NVIDIA driver answers here" in forced.stderr
    assert not (tmp_path / "out").exists()
