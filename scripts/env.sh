# Shared settings for scripts/*.sh: where the cache and the virtual environment live,
# and the pinned versions that are not in requirements.txt. Source it; do not run it.
BERT_TF_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BERT_TF_CACHE="${BERT_TF_CACHE:-$HOME/.cache/bert_tf}"
BERT_TF_VENV="${BERT_TF_VENV:-$BERT_TF_CACHE/venv-py311}"
BERT_TF_PYTHON="${BERT_TF_PYTHON:-python3.11}"
HOROVOD_VERSION=0.28.1
# gensim's wheel carries the real text the demo and tests use; gensim itself is never installed.
GENSIM_VERSION=4.4.0
# Horovod with Gloo too (horovodrun --gloo: no mpirun needed; elastic mode). Costs about 3 minutes
# more, once, in the cached build (see README); BERT_TF_HOROVOD_GLOO=0 builds MPI only.
BERT_TF_HOROVOD_GLOO="${BERT_TF_HOROVOD_GLOO:-1}"
# GPU nodes (the GPU Docker image): Horovod with NCCL for GPU collectives. Needs CUDA and NCCL headers.
BERT_TF_HOROVOD_GPU="${BERT_TF_HOROVOD_GPU:-0}"

export PATH="$BERT_TF_VENV/bin:$PATH"
# OpenMPI refuses root without these; containers and CI run as root.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
