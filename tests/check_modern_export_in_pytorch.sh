#!/usr/bin/env bash
# Manual check, outside the project's dependencies and CI (PyTorch stays out of both): a modern export
# loads in transformers' ModernBertForMaskedLM (PyTorch) with the masked-LM logits bert_tf computes.
#   bash tests/check_modern_export_in_pytorch.sh [work dir]
# Makes a throwaway venv (torch 2.13.0 CPU, transformers 4.57.6) in <work dir>/torchvenv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
work=${1:-/tmp/bert_tf-modern-check}
cd "$BERT_TF_REPO"
mkdir -p "$work"
python - "$work" <<'PY'
import sys, numpy as np, tensorflow as tf
sys.path.insert(0, "tests")
import bert_reference
from bert_tf.artifacts import checkpoint_formats as cf
from bert_tf.model import modeling
from test_modern import CONFIG, perturbed_model, batch
work = sys.argv[1]
model = perturbed_model()
vocab = bert_reference.write_vocab(f"{work}/vocab.txt", size=CONFIG.vocab_size)
cf.write_huggingface(cf.to_numpy(model), CONFIG, vocab, f"{work}/export")
ids, mask = batch()
seq, _ = model.encoder(tf.constant(ids), tf.constant(mask), tf.zeros_like(ids))
logits = model.mlm_logits(seq, tf.broadcast_to(tf.range(ids.shape[1])[None], ids.shape)).numpy()
np.savez(f"{work}/ours.npz", ids=ids, mask=mask, logits=logits)
PY
[ -x "$work/torchvenv/bin/python" ] || { python3 -m venv "$work/torchvenv" &&
  "$work/torchvenv/bin/pip" install -q torch==2.13.0 transformers==4.57.6 safetensors numpy; }
"$work/torchvenv/bin/python" - "$work" <<'PY'
import sys, numpy as np, torch, transformers
work = sys.argv[1]
ours = np.load(f"{work}/ours.npz")
model = transformers.ModernBertForMaskedLM.from_pretrained(f"{work}/export", attn_implementation="eager").eval()
with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ours["ids"], dtype=torch.long),
                   attention_mask=torch.tensor(ours["mask"], dtype=torch.long)).logits.numpy()
real = ours["mask"].astype(bool)
diff = np.abs(theirs.astype(np.float64) - ours["logits"])[real].max()
print(f"transformers {transformers.__version__} ModernBertForMaskedLM (torch {torch.__version__}) vs bert_tf, "
      f"masked-LM logits at the {real.sum()} real positions: max abs diff {diff:.2e} (logits up to "
      f"{np.abs(theirs[real]).max():.1f})")
sys.exit(0 if diff <= 1e-4 else 1)
PY
