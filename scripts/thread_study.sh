#!/usr/bin/env bash
# Thread pools per rank on one CPU node: BERT-base pre-training steps (bf16, sequence 128, micro-batch 8,
# accumulation 2) with 1 rank and with 2 ranks, for each --intra_op_threads/--inter_op_threads setting,
# each setting in fresh processes, ROUNDS rounds alternating (this machine's speed drifts between processes).
# Prints each job's median sequences/s (all ranks) over its updates after the first two, then the
# median per setting. A benchmark: minutes per job; never beside other work.
#   bash scripts/thread_study.sh [OUT] [ROUNDS]      (docs/results.md "Threads")
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
out=${1:-runs/thread_study}; rounds=${2:-2}
mkdir -p "$out"
mpi=(mpirun --oversubscribe --bind-to none -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
# ranks:intra:inter (0 = bert_tf's default: cores / ranks intra-op, 2 inter-op)
settings=${SETTINGS:-"1:2:2 1:2:1 1:1:1 2:1:2 2:1:1 2:2:2"}
for round in $(seq "$rounds"); do
  for s in $settings; do
    IFS=: read -r ranks intra inter <<<"$s"
    dir=$out/np$ranks-intra$intra-inter$inter-r$round
    rm -rf "$dir"
    "${mpi[@]}" -np "$ranks" python run/pretrain.py --model_preset=base --vocab_file=data/demo/vocab.txt \
      --train_files='data/pack/seq128-pack0/train-*' --max_seq_length=128 --max_predictions_per_seq=20 \
      --micro_batch_size=8 --accumulation_steps=2 --precision=mixed_bfloat16 --total_steps=8 --warmup_steps=1 \
      --log_interval=1 --save_interval=100000 --keep_last=1 --intra_op_threads="$intra" \
      --inter_op_threads="$inter" --checkpoint_dir="$dir" >"$dir.log" 2>&1 || { echo "$dir failed: $dir.log"; continue; }
    rm -f "$dir"/ckpt-*
    python - "$dir" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
speeds = [r["sequences_per_second"] for r in rows if r["kind"] == "train"][2:]
print(f"{sys.argv[1]}: {statistics.median(speeds):.3f} seq/s (median of {len(speeds)} updates)", flush=True)
EOF
  done
done | tee "$out/jobs.txt"
python - "$out/jobs.txt" <<'EOF'
import collections, re, statistics, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r".*/(np\d+-intra\d+-inter\d+)-r\d+: ([\d.]+) seq/s", line)
    if m:
        by[m[1]].append(float(m[2]))
for key, v in by.items():
    print(f"{key}: median {statistics.median(v):.3f} seq/s, jobs {', '.join(f'{x:.3f}' for x in v)}")
EOF
