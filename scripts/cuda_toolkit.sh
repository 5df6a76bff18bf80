# The CUDA compiler for Horovod's GPU build, made once into $BERT_TF_CACHE/toolkits/ and kept there.
# Sourced by scripts/setup.sh, only when the GPU wheel it needs is not cached yet.
#
# PyPI's CUDA wheels have ptxas but no nvcc, and NVIDIA's own downloads are not reachable everywhere
# Debian is, so the toolkit is CUDA 12.4.1 as Debian trixie packages it (non-free). Its binaries are
# NVIDIA's own (built for glibc 2.17+), so they run on bookworm; the packages are unpacked, not
# installed: installing them would pull trixie's libc into a bookworm system. Only what nvcc needs to
# compile Horovod's kernels is kept (about 150 MB of the 1 GB downloaded). CUDA 12.4 code runs on
# TensorFlow 2.21's CUDA 12.5 runtime (CUDA's minor-version compatibility).
CUDA_TOOLKIT_VERSION=12.4.1-2
# Each: path under the mirror, SHA-256 (from trixie's Packages index), the members to unpack.
CUDA_TOOLKIT_DEBS=(
  "pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319 ./usr/bin/* ./usr/lib/nvidia-cuda-toolkit/*"
  "pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0 ./usr/include/* ./usr/lib/x86_64-linux-gnu/libcudart_static.a ./usr/lib/x86_64-linux-gnu/libcudadevrt.a ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so"
  "pool/non-free/n/nvidia-cuda-toolkit/libcudart12_12.4.127~12.4.1-2_amd64.deb 361b3721cf84bf068e111ff013c819de61cb475268b0d38db99839471f1b4130 ./usr/lib/*"
  "pool/main/c/cccl/libcu++-dev_2.3.2-2_all.deb 30e911c1909265591b5ea793df0e49e56bed631238b68b3e75c97590c4985686 ./usr/include/*"
)
CUDA_TOOLKIT_MIRROR="${CUDA_TOOLKIT_MIRROR:-http://deb.debian.org/debian}"

# ensure_cuda_toolkit: sets CUDA_TOOLKIT to a folder laid out as NVIDIA's (bin/nvcc, include, lib64,
# nvvm/bin/cicc), making it when missing. say and die come from setup.sh.
ensure_cuda_toolkit() {
  CUDA_TOOLKIT="$BERT_TF_CACHE/toolkits/cuda-$CUDA_TOOLKIT_VERSION"
  if [ -f "$CUDA_TOOLKIT/.complete" ] && "$CUDA_TOOLKIT/bin/nvcc" --version >/dev/null 2>&1; then
    return 0
  fi
  command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is needed to unpack the CUDA toolkit (Debian's dpkg package)"
  command -v curl >/dev/null 2>&1 || die "curl is needed to download the CUDA toolkit"
  local t0=$SECONDS work deb path sum file members
  work=$(mktemp -d "${TMPDIR:-/tmp}/bert_tf-cuda.XXXXXX")
  say "making the CUDA $CUDA_TOOLKIT_VERSION compiler from Debian trixie's packages (1 GB download, once)"
  for deb in "${CUDA_TOOLKIT_DEBS[@]}"; do
    read -r path sum members <<<"$deb"
    file="$work/$(basename "$path")"
    curl -fsSL --retry 3 -o "$file" "$CUDA_TOOLKIT_MIRROR/$path" \
      || { rm -rf "$work"; die "could not download $CUDA_TOOLKIT_MIRROR/$path (set CUDA_TOOLKIT_MIRROR to a Debian mirror)"; }
    echo "$sum  $file" | sha256sum --quiet -c - \
      || { rm -rf "$work"; die "$file: SHA-256 is not $sum (a corrupt download, or the mirror has other files)"; }
    mkdir -p "$work/root"
    # shellcheck disable=SC2086  # members: tar's wildcards, split but not globbed here (set -f)
    (set -f; dpkg-deb --fsys-tarfile "$file" | tar -x -C "$work/root" --wildcards $members) \
      || { rm -rf "$work"; die "could not unpack $file"; }
    rm -f "$file"
  done
  local src="$work/root/usr" lib="$work/root/usr/lib/x86_64-linux-gnu" dst="$CUDA_TOOLKIT.partial"
  rm -rf "$dst" && mkdir -p "$dst/bin" "$dst/nvvm/bin" "$dst/nvvm/libdevice" "$dst/lib64/stubs" "$dst/include"
  cp "$src/lib/nvidia-cuda-toolkit/bin/nvcc" "$src/lib/nvidia-cuda-toolkit/bin/cicc" "$dst/bin/"
  mv "$dst/bin/cicc" "$dst/nvvm/bin/"
  cp -r "$src/lib/nvidia-cuda-toolkit/bin/crt" "$dst/bin/"
  cp "$src"/bin/{cudafe++,fatbinary,nvlink,ptxas,bin2c,nvprune,cuobjdump} "$dst/bin/"
  cp "$src/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc" "$dst/nvvm/libdevice/"
  cp -r "$src/include/." "$dst/include/"
  cp -a "$lib"/libcudart.so.12* "$lib/libcudart_static.a" "$lib/libcudadevrt.a" "$dst/lib64/"
  ln -sf libcudart.so.12 "$dst/lib64/libcudart.so"
  cp "$lib/stubs/libcuda.so" "$dst/lib64/stubs/"
  # NVIDIA's layout, relative to nvcc (Debian's profile points at /usr).
  cat > "$dst/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
EOF
  rm -rf "$work"
  # The check: a kernel compiles for every compute capability the wheel targets.
  printf '__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\nint main() { return 0; }\n' > "$dst/check.cu"
  "$dst/bin/nvcc" -o "$dst/check" "$dst/check.cu" -gencode arch=compute_70,code=sm_70 \
      -gencode arch=compute_90,code=sm_90 >"$dst/check.log" 2>&1 \
    || { cat "$dst/check.log" >&2; die "the CUDA toolkit in $dst does not compile a kernel (log above)"; }
  rm -f "$dst/check" "$dst/check.cu" "$dst/check.log"
  rm -rf "$CUDA_TOOLKIT" && mv "$dst" "$CUDA_TOOLKIT" && touch "$CUDA_TOOLKIT/.complete"
  say "CUDA toolkit ready in $CUDA_TOOLKIT ($(du -sh "$CUDA_TOOLKIT" | cut -f1), $((SECONDS - t0)) s)"
}
