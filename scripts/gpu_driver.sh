# A GPU node's NVIDIA driver against what TensorFlow 2.21 needs. Sourced by scripts/setup.sh (before it
# installs anything) and scripts/gpu_check.sh; say and die come from the caller.
#
# TensorFlow 2.21 runs CUDA 12.5. CUDA 12 needs driver 525.60.13 or newer; GPUs for which TensorFlow
# ships its kernels as PTX only (Hopper, sm_90) need a driver that compiles CUDA 12.5's PTX: 555+.
GPU_DRIVER_MIN=525.60.13
GPU_DRIVER_PTX=555

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# check_gpu_driver: for BERT_TF_GPU=1, dies unless a driver new enough answers, and sets GPU_DRIVER;
# for BERT_TF_GPU=0 on a node with GPUs, warns.
check_gpu_driver() {
  GPU_DRIVER=""
  if [ "$BERT_TF_GPU" = 1 ]; then
    GPU_DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1) || GPU_DRIVER=""
    if [ -z "$GPU_DRIVER" ]; then
      die "BERT_TF_GPU=1 but no NVIDIA driver answers here (nvidia-smi $(command -v nvidia-smi >/dev/null && echo failed || echo 'not found')). Install the driver ($GPU_DRIVER_PTX or newer), or run BERT_TF_GPU=build bash scripts/setup.sh to make the GPU install on a machine without one."
    fi
    version_ge "$GPU_DRIVER" "$GPU_DRIVER_MIN" \
      || die "NVIDIA driver $GPU_DRIVER is too old for TensorFlow 2.21's CUDA 12.5 runtime: install driver $GPU_DRIVER_PTX or newer (CUDA 12 needs at least $GPU_DRIVER_MIN)"
    if ! version_ge "$GPU_DRIVER" "$GPU_DRIVER_PTX"; then
      say "WARNING: NVIDIA driver $GPU_DRIVER predates CUDA 12.5: Hopper GPUs (H100) will fail to load TensorFlow's PTX kernels; driver $GPU_DRIVER_PTX or newer fixes it"
    fi
    say "GPU node: $(nvidia-smi -L | grep -c '^GPU ') GPU(s), driver $GPU_DRIVER"
  elif [ "$BERT_TF_GPU" = 0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "WARNING: this node has NVIDIA GPUs but BERT_TF_GPU=0 makes the CPU-only install: training will not use them"
  fi
}
