#!/usr/bin/env bash
# The demo: bundled corpus -> WordPiece vocabulary -> masked-LM/NSP TFRecords (2 ranks)
# -> tiny BERT pre-trained by 2 local Horovod ranks -> held-out MLM accuracy and throughput.
# Installs what is missing first (scripts/setup.sh). Extra arguments go to run/pretrain.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$BERT_TF_REPO/scripts/setup.sh"
cd "$BERT_TF_REPO"
start=$SECONDS
mpi=(mpirun -np 2 --oversubscribe --bind-to none -x PATH -x TF_CPP_MIN_LOG_LEVEL)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
corpus=(data/corpus/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2
        data/corpus/lee_background.cor@documents)

if [ ! -f data/demo/vocab.txt ]; then
  echo "== learning a WordPiece vocabulary from the bundled corpus"
  python run/learn_vocab.py --input_files="$(IFS=,; echo "${corpus[*]}")" --vocab_size=8192 \
    --output_file=data/demo/vocab.txt
fi
if [ ! -f data/demo/seq128/summary.json ]; then
  echo "== writing pre-training TFRecords (2 ranks)"
  "${mpi[@]}" python run/create_pretraining_data.py --input_files="$(IFS=,; echo "${corpus[*]}")" \
    --vocab_file=data/demo/vocab.txt --output_dir=data/demo/seq128 --max_seq_length=128 \
    --max_predictions_per_seq=20 --dupe_factor=5 --heldout_fraction=0.05
fi
node_flags=runs/node-tiny.flags   # self-tuned once per machine type: precision and XLA that run fastest here
if [ ! -f "$node_flags" ]; then
  mkdir -p "$(dirname "$node_flags")"
  echo "== self-tuning: timing tiny BERT's precision x XLA rungs on this machine -> $node_flags"
  python run/benchmark.py --model_preset=tiny --vocab_size=8192 --max_seq_length=128 --micro_batch_size=16 \
    --rungs=fp32,fp32+xla,bf16,bf16+xla --updates=3 --warmup_updates=1 --peak_seconds=0.5 \
    --output_dir=runs/node-tiny --write_flagfile="$node_flags"
fi
echo "== pre-training tiny BERT on 2 ranks ($(grep -v '^#' "$node_flags" | tr '\n' ' '))"
rm -rf runs/demo
"${mpi[@]}" python run/pretrain.py --flagfile=configs/demo.flags --flagfile="$node_flags" "$@"
python run/plot_metrics.py --metrics=runs/demo/metrics.jsonl --output_png=runs/demo/metrics.png
echo "demo finished in $((SECONDS - start)) s after setup; curves: runs/demo/metrics.png"
