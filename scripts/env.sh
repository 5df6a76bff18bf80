# Shared settings for scripts/*.sh: where the cache and the virtual environment live,
# and the pinned versions that are not in requirements.txt. Source it; do not run it.
BERT_TF_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BERT_TF_CACHE="${BERT_TF_CACHE:-$HOME/.cache/bert_tf}"
# GPU nodes: BERT_TF_GPU=auto (default: a node where nvidia-smi lists a GPU is a GPU node), 1 (this is a
# GPU node: its driver is checked), 0 (CPU only), build (the GPU install on a machine without a GPU or
# driver: images, mixed clusters, CI). The GPU install is TensorFlow with its CUDA wheels and Horovod
# with NCCL; it trains on the CPU where there is no GPU, so one install serves every node.
BERT_TF_GPU="${BERT_TF_GPU:-auto}"
if [ "$BERT_TF_GPU" = auto ]; then
  BERT_TF_GPU=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then BERT_TF_GPU=1; fi
fi
if [ "$BERT_TF_GPU" = 0 ]; then
  BERT_TF_VENV="${BERT_TF_VENV:-$BERT_TF_CACHE/venv-py311}"
else
  BERT_TF_VENV="${BERT_TF_VENV:-$BERT_TF_CACHE/venv-py311-cuda}"
fi
BERT_TF_PYTHON="${BERT_TF_PYTHON:-python3.11}"
HOROVOD_VERSION=0.28.1
# gensim's wheel carries the real text the demo and tests use; gensim itself is never installed.
GENSIM_VERSION=4.4.0
# Horovod with Gloo too (horovodrun --gloo: no mpirun needed; elastic mode). Costs about 3 minutes
# more, once, in the cached build (see README); BERT_TF_HOROVOD_GLOO=0 builds MPI only.
BERT_TF_HOROVOD_GLOO="${BERT_TF_HOROVOD_GLOO:-1}"
# The GPU build of Horovod: its kernels for these compute capabilities (V100, A100, H100), the last
# also as PTX for newer GPUs.
BERT_TF_CUDA_CC_LIST="${BERT_TF_CUDA_CC_LIST:-70,80,90}"

export PATH="$BERT_TF_VENV/bin:$PATH"
# OpenMPI refuses root without these; containers and CI run as root.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# say/die for the scripts: `logs_as setup` makes say print "[setup   12s] ..." and die "[setup] ERROR: ...".
logs_as() {
  BERT_TF_LOG_NAME=$1
  t_start=$SECONDS
  say() { printf '[%s %4ds] %s\n' "$BERT_TF_LOG_NAME" "$((SECONDS - t_start))" "$*"; }
  die() { printf '[%s] ERROR: %s\n' "$BERT_TF_LOG_NAME" "$*" >&2; exit 1; }
}
