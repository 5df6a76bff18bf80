#!/usr/bin/env bash
# Installs everything bert_tf needs, idempotently:
#   1. Debian packages (OpenMPI, compilers, CMake 3.x, Python 3.11 venv/headers, iproute2) when missing;
#   2. a virtual environment with the pinned Python packages (requirements*.txt);
#   3. Horovod built from source once, as a wheel cached outside the repo, keyed by the
#      Horovod, TensorFlow and Python versions (GPU: also CUDA, compute capabilities and patches);
#      later runs install that wheel;
#   4. the bundled real corpus, extracted from gensim's wheel and checked by SHA-256;
#   5. a check that Horovod has TensorFlow and MPI.
# On a GPU node (BERT_TF_GPU, see env.sh), TensorFlow comes with its CUDA wheels (versions in
# requirements-cuda.txt) and Horovod with NCCL, built with scripts/cuda_toolkit.sh's compiler and
# the source patches in scripts/horovod_patches/ (docs/design.md says why each exists).
# A second run with everything in place takes seconds. Everything it does is printed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$BERT_TF_REPO"

logs_as setup

case "$BERT_TF_GPU" in
  0|1|build) ;;
  *) die "BERT_TF_GPU=$BERT_TF_GPU: use auto, 1 (a GPU node), 0 (CPU only) or build (the GPU install without a GPU)" ;;
esac
# A GPU node's driver, checked before anything is installed (scripts/gpu_driver.sh).
source "$BERT_TF_REPO/scripts/gpu_driver.sh"
check_gpu_driver

# The Horovod wheel this machine needs; when it is already cached, no compiler is needed.
TF_VERSION=$(sed -n 's/^tensorflow==\([^ ]*\).*/\1/p' requirements.txt)
variant="mpi"; [ "$BERT_TF_HOROVOD_GLOO" = 1 ] && variant="mpi-gloo"
if [ "$BERT_TF_GPU" != 0 ]; then
  source "$BERT_TF_REPO/scripts/cuda_toolkit.sh"
  patches_sum=$(cat "$BERT_TF_REPO"/scripts/horovod_patches/*.patch | sha256sum | cut -c1-8)
  variant="$variant-nccl-cuda${CUDA_TOOLKIT_VERSION%%-*}-cc${BERT_TF_CUDA_CC_LIST//,/.}-patches$patches_sum"
fi
wheel_key="horovod-${HOROVOD_VERSION}-tf${TF_VERSION}-py311-${variant}"
wheel_dir="$BERT_TF_CACHE/wheels/$wheel_key"
wheel_cached=0
(cd "$wheel_dir" 2>/dev/null && sha256sum --quiet -c SHA256SUMS) >/dev/null 2>&1 && wheel_cached=1

# ---------------------------------------------------------------- 1. Debian packages
missing=()
need() {  # need <package> <test command...>
  local pkg=$1; shift
  "$@" >/dev/null 2>&1 || missing+=("$pkg")
}
need openmpi-bin      command -v mpirun
need libopenmpi-dev   command -v mpicxx
need iproute2         command -v tc
need bzip2            command -v bzip2
need "python3.11"     command -v "$BERT_TF_PYTHON"
# venv and headers are checked with the interpreter; when it is missing, they are missing too
# (a minimal Debian has neither: tests/test_docker.py replays this on a minbase root).
need python3.11-venv  "$BERT_TF_PYTHON" -c 'import ensurepip, venv'
# Python.h: Horovod's build, and pip building any sdist (e.g. mpi4py) needs it.
need python3.11-dev   "$BERT_TF_PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
if [ "$wheel_cached" = 0 ]; then   # only to build Horovod
  need g++              command -v g++
  need make             command -v make
  need cmake            test -x /usr/bin/cmake
  if [ "$BERT_TF_GPU" != 0 ]; then  # the CUDA toolkit's download, and the source patches
    need curl             command -v curl
    need patch            command -v patch
  fi
fi
if ((${#missing[@]})); then
  say "missing Debian packages: ${missing[*]}"
  if ! command -v apt-get >/dev/null 2>&1; then
    die "no apt-get on this machine. Install by hand: ${missing[*]} (OpenMPI with headers, Python 3.11 with venv, iproute2, bzip2; to build Horovod also a C++ compiler, make, CMake 3.x and Python headers), then run this again."
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo: run as root: apt-get install -y ${missing[*]}"
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || die "apt-get update failed (no network?). Install by hand: apt-get install -y ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed. Install by hand: apt-get install -y ${missing[*]}"
  say "installed ${missing[*]}"
fi
if [ "$wheel_cached" = 0 ]; then
  cmake_version=$(/usr/bin/cmake --version | head -n 1 | awk '{print $3}')
  case "$cmake_version" in
    3.*) ;;
    *) die "/usr/bin/cmake is $cmake_version; Horovod 0.28.1's bundled gloo needs CMake 3.x (Debian's cmake package)." ;;
  esac
fi

# ---------------------------------------------------------------- 2. virtual environment
"$BERT_TF_PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$BERT_TF_PYTHON is not Python 3.11 (set BERT_TF_PYTHON)"
if [ ! -x "$BERT_TF_VENV/bin/python" ]; then
  say "creating virtual environment $BERT_TF_VENV"
  "$BERT_TF_PYTHON" -m venv "$BERT_TF_VENV"
fi
PY="$BERT_TF_VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
req_stamp="$BERT_TF_VENV/.bert_tf-requirements.sha256"
req_files=(requirements.txt requirements-dev.txt)
cuda_args=()
if [ "$BERT_TF_GPU" != 0 ]; then  # TensorFlow's CUDA wheels, at the versions it was built with
  req_files+=(requirements-cuda.txt)
  cuda_args=("tensorflow[and-cuda]==$TF_VERSION" -c requirements-cuda.txt)
fi
req_sum=$(cat "${req_files[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_sum" ]; then
  say "installing pinned Python packages${cuda_args:+ (with CUDA: about 3 GB)}"
  rm -f "$req_stamp"  # a failed install is never taken for a complete one
  "${PIP[@]}" install -r requirements.txt -r requirements-dev.txt "${cuda_args[@]}" \
    || die "pip install -r requirements.txt failed (see above); is PyPI reachable?"
  echo "$req_sum" > "$req_stamp"
fi

# ---------------------------------------------------------------- 3. Horovod wheel (built once)

wheel_ok() {  # the cached wheel exists, matches the checksum written when it was built, and unzips
  local whl
  whl=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1) || return 1
  [ -n "$whl" ] && [ -f "$wheel_dir/SHA256SUMS" ] || return 1
  (cd "$wheel_dir" && sha256sum --quiet -c SHA256SUMS) >/dev/null 2>&1 || return 1
  "$PY" -c 'import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)' "$whl" 2>/dev/null
}

if ! wheel_ok; then
  if [ -d "$wheel_dir" ]; then say "cached Horovod wheel in $wheel_dir is missing or corrupt: rebuilding"; fi
  rm -rf "$wheel_dir"
  build_dir=$(mktemp -d "${TMPDIR:-/tmp}/bert_tf-horovod-build.XXXXXX")
  say "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION ($variant); about 2.5 min on 2 cores (measured), once"
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  tf_include="$site/tensorflow/include"
  gloo_flag=HOROVOD_WITHOUT_GLOO=1; [ "$BERT_TF_HOROVOD_GLOO" = 1 ] && gloo_flag=HOROVOD_WITH_GLOO=1
  source_spec="horovod==$HOROVOD_VERSION"
  gpu_env=()
  if [ "$BERT_TF_GPU" != 0 ]; then
    ensure_cuda_toolkit
    "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build_dir" >/dev/null \
      || die "could not download Horovod $HOROVOD_VERSION's source from PyPI"
    tar -xzf "$build_dir/horovod-$HOROVOD_VERSION.tar.gz" -C "$build_dir"
    source_spec="$build_dir/horovod-$HOROVOD_VERSION"
    for p in "$BERT_TF_REPO"/scripts/horovod_patches/*.patch; do
      patch -s -p1 -d "$source_spec" < "$p" || die "$p does not apply to Horovod $HOROVOD_VERSION's source"
      say "applied $(basename "$p")"
    done
    # NCCL from TensorFlow's own wheel (nvidia-nccl-cu12): it ships libnccl.so.2 only, so the linker
    # gets an unversioned name in the build folder; the library finds it at run time by its RUNPATH.
    [ -f "$site/nvidia/nccl/include/nccl.h" ] || die "no nccl.h in $site/nvidia/nccl: TensorFlow's CUDA wheels are not installed"
    mkdir -p "$build_dir/nccl-lib" && ln -s "$site/nvidia/nccl/lib/libnccl.so.2" "$build_dir/nccl-lib/libnccl.so"
    gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_TOOLKIT" HOROVOD_NCCL_LINK=SHARED
             HOROVOD_NCCL_INCLUDE="$site/nvidia/nccl/include" HOROVOD_NCCL_LIB="$build_dir/nccl-lib"
             HOROVOD_BUILD_CUDA_CC_LIST="$BERT_TF_CUDA_CC_LIST")
  fi
  t_build=$SECONDS
  # CMAKE_POLICY_VERSION_MINIMUM: gloo's CMakeLists declare a minimum below 3.5.
  # --no-cache-dir: pip would otherwise hand back a wheel it built earlier with other HOROVOD_* flags.
  # HOROVOD_CMAKE: Debian's CMake 3.x, never a pip-installed CMake 4 earlier on PATH.
  # CPLUS_INCLUDE_PATH: a forwarding header for the XLA builder's old include path (see the header),
  # and two header-only libraries that TensorFlow's wheel ships under include/external/ but that
  # its XLA headers include by their short names.
  if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 "$gloo_flag" "${gpu_env[@]}" \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_CMAKE=/usr/bin/cmake \
        MAKEFLAGS="-j$(nproc)" \
        CPLUS_INCLUDE_PATH="$BERT_TF_REPO/scripts/horovod_compat:$tf_include/external/highwayhash:$tf_include/external/farmhash_archive/src" \
        "${PIP[@]}" wheel --no-cache-dir --no-deps --no-build-isolation --no-binary horovod \
        "$source_spec" -w "$build_dir" > "$build_dir/build.log" 2>&1; then
    tail -n 40 "$build_dir/build.log" >&2
    die "Horovod build failed; full log: $build_dir/build.log"
  fi
  mkdir -p "$wheel_dir"
  mv "$build_dir"/horovod-*.whl "$wheel_dir/"
  (cd "$wheel_dir" && sha256sum horovod-*.whl > SHA256SUMS)
  echo "$((SECONDS - t_build))" > "$wheel_dir/build-seconds"
  rm -rf "$build_dir"
  say "built $(ls "$wheel_dir"/horovod-*.whl) in $((SECONDS - t_build)) s"
fi
hvd_stamp="$BERT_TF_VENV/.bert_tf-horovod"
if [ "$(cat "$hvd_stamp" 2>/dev/null)" != "$(cat "$wheel_dir/SHA256SUMS")" ]; then
  say "installing the cached Horovod wheel ($wheel_key)"
  "${PIP[@]}" install --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
  cp "$wheel_dir/SHA256SUMS" "$hvd_stamp"
fi

# ---------------------------------------------------------------- 4. bundled corpus
corpus_dir="$BERT_TF_REPO/data/corpus"
corpus_sums="$BERT_TF_REPO/scripts/corpus.sha256"
if ! (cd "$corpus_dir" 2>/dev/null && sha256sum --quiet -c "$corpus_sums") >/dev/null 2>&1; then
  say "extracting the bundled corpus from gensim==$GENSIM_VERSION's wheel"
  dl_dir="$BERT_TF_CACHE/downloads/gensim-$GENSIM_VERSION"
  extract() {
    "$PY" - "$dl_dir" "$corpus_dir" "$corpus_sums" <<'PYEOF'
import glob, hashlib, os, sys, zipfile
dl_dir, out_dir, sums_file = sys.argv[1:]
wheels = glob.glob(os.path.join(dl_dir, "gensim-*.whl"))
if not wheels:
    sys.exit(1)
expected = dict(reversed(line.split()) for line in open(sums_file) if line.strip())
os.makedirs(out_dir, exist_ok=True)
with zipfile.ZipFile(wheels[0]) as whl:
    for name, digest in expected.items():
        data = whl.read("gensim/test/test_data/" + name)
        if hashlib.sha256(data).hexdigest() != digest:
            print(f"checksum mismatch for {name} in {wheels[0]}", file=sys.stderr)
            sys.exit(1)
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out_dir, name))
PYEOF
  }
  if ! extract 2>/dev/null; then
    rm -rf "$dl_dir"; mkdir -p "$dl_dir"
    "${PIP[@]}" download --no-deps "gensim==$GENSIM_VERSION" -d "$dl_dir" \
      || die "could not download gensim==$GENSIM_VERSION's wheel (no network?); the corpus comes from it"
    extract || die "the corpus in gensim==$GENSIM_VERSION's wheel does not match scripts/corpus.sha256"
  fi
fi

# ---------------------------------------------------------------- 5. the package and a build check
if ! (cd / && "$PY" -c 'import bert_tf, sys, os; sys.exit(os.path.dirname(os.path.dirname(bert_tf.__file__)) != sys.argv[1])' "$BERT_TF_REPO") 2>/dev/null; then
  say "installing bert_tf from $BERT_TF_REPO (editable)"
  "${PIP[@]}" install --no-deps --no-build-isolation -e "$BERT_TF_REPO"
fi
# horovodrun --check-build imports TensorFlow (slow): once per installed wheel.
check_stamp="$BERT_TF_VENV/.bert_tf-horovod-checked"
if [ "$(cat "$check_stamp" 2>/dev/null)" != "$(cat "$hvd_stamp")" ]; then
  check=$("$BERT_TF_VENV/bin/horovodrun" --check-build 2>&1) || true
  if ! grep -q '\[X\] TensorFlow' <<<"$check" || ! grep -q '\[X\] MPI' <<<"$check"; then
    echo "$check" >&2
    die "Horovod lacks TensorFlow or MPI support (horovodrun --check-build above). Delete $wheel_dir and run again."
  fi
  if [ "$BERT_TF_GPU" != 0 ]; then
    # LD_BIND_NOW: every symbol the library needs is resolved at import, not at its first GPU op.
    gpu_check=$(cd / && LD_BIND_NOW=1 "$PY" -c 'import horovod.tensorflow as hvd; print(hvd.cuda_built(), bool(hvd.nccl_built()))' 2>&1 | tail -n 1) || true
    if [ "$gpu_check" != "True True" ] || ! grep -q '\[X\] NCCL' <<<"$check"; then
      echo "$check" >&2
      die "the GPU build of Horovod does not load with CUDA and NCCL (import says: $gpu_check). Delete $wheel_dir and run again."
    fi
  fi
  echo "$check" | sed -n '/Available Frameworks/,$p'
  cp "$hvd_stamp" "$check_stamp"
fi
say "ready: venv $BERT_TF_VENV, Horovod $HOROVOD_VERSION ($variant) with TensorFlow $TF_VERSION, corpus in data/corpus"
