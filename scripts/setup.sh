#!/usr/bin/env bash
# Installs everything bert_tf needs, idempotently:
#   1. Debian packages (OpenMPI, compilers, CMake 3.x, Python 3.11 venv/headers, iproute2) when missing;
#   2. a virtual environment with the pinned Python packages (requirements*.txt);
#   3. Horovod built from source once, as a wheel cached outside the repo, keyed by the
#      Horovod, TensorFlow and Python versions; later runs install that wheel;
#   4. the bundled real corpus, extracted from gensim's wheel and checked by SHA-256;
#   5. a check that Horovod has TensorFlow and MPI.
# A second run with everything in place takes seconds. Everything it does is printed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$BERT_TF_REPO"

t_start=$SECONDS
say() { printf '[setup %4ds] %s\n' "$((SECONDS - t_start))" "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# The Horovod wheel this machine needs; when it is already cached, no compiler is needed.
TF_VERSION=$(sed -n 's/^tensorflow==\([^ ]*\).*/\1/p' requirements.txt)
variant="mpi"; [ "$BERT_TF_HOROVOD_GLOO" = 1 ] && variant="mpi-gloo"
[ "$BERT_TF_HOROVOD_GPU" = 1 ] && variant="$variant-nccl"
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
req_sum=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_sum" ]; then
  say "installing pinned Python packages"
  "${PIP[@]}" install -r requirements.txt -r requirements-dev.txt \
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
  tf_include="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tensorflow/include"
  gloo_flag=HOROVOD_WITHOUT_GLOO=1; [ "$BERT_TF_HOROVOD_GLOO" = 1 ] && gloo_flag=HOROVOD_WITH_GLOO=1
  gpu_env=(); [ "$BERT_TF_HOROVOD_GPU" = 1 ] && gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL)
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
        "horovod==$HOROVOD_VERSION" -w "$build_dir" > "$build_dir/build.log" 2>&1; then
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
  echo "$check" | sed -n '/Available Frameworks/,$p'
  cp "$hvd_stamp" "$check_stamp"
fi
say "ready: venv $BERT_TF_VENV, Horovod $HOROVOD_VERSION ($variant) with TensorFlow $TF_VERSION, corpus in data/corpus"
