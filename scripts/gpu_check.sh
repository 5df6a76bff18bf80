#!/usr/bin/env bash
# The check to run first on a GPU node (after BERT_TF_GPU=1 bash scripts/setup.sh), a few minutes on
# one GPU: the GPUs and driver it sees, the CUDA/cuDNN TensorFlow was built with and Horovod's backends,
# the GPU ladder on BERT-base at sequence 128 (fp16+XLA, bf16+XLA, TF32+XLA), and, on a node with two
# or more GPUs, an NCCL allreduce between two of them. Writes, in OUT (default runs/gpu_check):
#   gpu_check.json  the figures run/plan.py takes: python run/plan.py --model_preset=base --device_figures=OUT/gpu_check.json
#   node.flags      the fastest configuration as run/pretrain.py flags (--flagfile after the recipe's)
#   ladder/         the ladder's JSON and plot
#
#   bash scripts/gpu_check.sh [OUT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$BERT_TF_REPO"
logs_as gpu_check

out="${1:-runs/gpu_check}"
[ "$BERT_TF_GPU" != 0 ] || die "no GPU on this node (nvidia-smi lists none): this check is for GPU nodes"
BERT_TF_GPU=1
source scripts/gpu_driver.sh
check_gpu_driver
[ -x "$BERT_TF_VENV/bin/python" ] || die "no GPU install in $BERT_TF_VENV: run BERT_TF_GPU=1 bash scripts/setup.sh"
mkdir -p "$out"
# The figures go to a new file, renamed over gpu_check.json at the end: a failed check keeps the last good one.
figures="$out/gpu_check.json.partial"
rm -f "$figures"

say "GPUs"
nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv
n_gpus=$(nvidia-smi -L | grep -c '^GPU ')

say "what TensorFlow and Horovod see"
python - <<'EOF'
import tensorflow as tf
import horovod.tensorflow as hvd
from bert_tf import distributed
info = tf.sysconfig.get_build_info()
gpus = tf.config.list_physical_devices("GPU")
print(f"TensorFlow {tf.__version__}: CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}; "
      f"{len(gpus)} GPU(s): " + ", ".join(tf.config.experimental.get_device_details(g).get("device_name", g.name)
                                            for g in gpus))
if not gpus:
    raise SystemExit("TensorFlow sees no GPU: the driver is too old for CUDA 12.5, or the install lacks the CUDA "
                     "wheels (BERT_TF_GPU=1 bash scripts/setup.sh)")
hvd.init()
print(distributed.describe(hvd))
if not hvd.nccl_built():
    raise SystemExit("Horovod was built without NCCL: BERT_TF_GPU=1 bash scripts/setup.sh")
EOF

say "the GPU ladder: BERT-base, sequence 128, micro-batch 32"
python run/benchmark.py --model_preset=base --max_seq_length=128 --micro_batch_size=32 \
    --rungs=fp16+xla,bf16+xla,tf32+xla --warmup_updates=2 --updates=5 --peak_seconds=1 \
    --output_dir="$out/ladder" --write_flagfile="$out/node.flags" --device_figures="$figures"

if [ "$n_gpus" -ge 2 ]; then
  say "NCCL allreduce between 2 GPUs (Horovod's link probe)"
  probe=$(horovodrun -np 2 -H localhost:2 python run/comm_study.py --probe | grep '^PROBE ' | tail -n 1) \
    || die "the 2-GPU allreduce failed (run it alone: horovodrun -np 2 -H localhost:2 python run/comm_study.py --probe)"
  python - "$figures" "${probe#PROBE }" <<'EOF'
import json, sys
path, probe = sys.argv[1], json.loads(sys.argv[2])
figures = json.load(open(path))
figures["intra_gbps"] = probe["effective_gbit"]
figures["allreduce_probe"] = probe
json.dump(figures, open(path, "w"), indent=1)
print(f"NCCL allreduce: {probe['effective_gbit']:.1f} Gbit/s bus bandwidth, {probe['message_seconds'] * 1e6:.0f} us per message")
EOF
else
  say "one GPU: no allreduce to measure"
fi
mv "$figures" "$out/gpu_check.json"
say "done: $out/gpu_check.json; plan with: python run/plan.py --model_preset=base --device_figures=$out/gpu_check.json"
