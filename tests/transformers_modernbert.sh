#!/usr/bin/env bash
# Manual check, outside the project's dependencies and CI (PyTorch stays out of both), against transformers'
# own PyTorch ModernBERT in both config layouts, v4 (4.57.6: *_rope_theta, global_attn_every_n_layers) and
# v5 (5.25.0: rope_parameters, layer_types):
#   1. a modern export of bert_tf loads in each version's ModernBertForMaskedLM with bert_tf's masked-LM
#      logits (max abs diff <= 1e-4 at the real positions);
#   2. with --write-fixtures, each version builds a random-init ModernBertForMaskedLM from its own
#      ModernBertConfig, saves it with save_pretrained and records its logits on a padded batch, into
#      tests/data/transformers_modernbert/v4|v5 (config.json, model.safetensors, logits.npz); the CI test
#      tests/test_transformers_modernbert.py loads them here, compares logits and continues pre-training.
#   bash tests/transformers_modernbert.sh [--write-fixtures] [work dir]
# Makes throwaway venvs (torch 2.13.0 CPU, transformers 4.57.6 / 5.25.0) in <work dir>/venv-<version>.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
write=0
if [ "${1:-}" = --write-fixtures ]; then write=1; shift; fi
work=${1:-/tmp/bert_tf-transformers-check}
cd "$BERT_TF_REPO"
mkdir -p "$work"
python - "$work" <<'PY'
import sys, numpy as np, tensorflow as tf
sys.path.insert(0, "tests")
import bert_reference
from bert_tf.artifacts import checkpoint_formats as cf
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
status=0
for version in 4.57.6 5.25.0; do
  venv="$work/venv-$version"
  [ -x "$venv/bin/python" ] || { python3 -m venv "$venv" &&
    "$venv/bin/pip" install -q torch==2.13.0 "transformers==$version" safetensors numpy; }
  "$venv/bin/python" - "$work" "$write" "$BERT_TF_REPO/tests/data/transformers_modernbert" <<'PY' || status=1
import json, os, sys, numpy as np, torch, transformers
work, write, fixtures = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
major = transformers.__version__.split(".")[0]
ours = np.load(f"{work}/ours.npz")

def logits_of(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()

model = transformers.ModernBertForMaskedLM.from_pretrained(f"{work}/export", attn_implementation="eager").eval()
theirs = logits_of(model, ours["ids"], ours["mask"])
real = ours["mask"].astype(bool)
diff = np.abs(theirs.astype(np.float64) - ours["logits"])[real].max()
print(f"transformers {transformers.__version__} ModernBertForMaskedLM (torch {torch.__version__}) reads bert_tf's "
      f"export: masked-LM logits at the {real.sum()} real positions, max abs diff {diff:.2e} (logits up to "
      f"{np.abs(theirs[real]).max():.1f})")
if write:
    # transformers' own config (no default period or theta, so a field read wrong shows) and init (a wider initializer_range so logits are O(1), norm scales moved off 1
    # so a norm read into the wrong place shows), saved by save_pretrained
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=2000, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=48,
        local_attention=8, global_attn_every_n_layers=2, global_rope_theta=50000.0, local_rope_theta=2500.0,
        initializer_range=0.2, pad_token_id=0, bos_token_id=101, eos_token_id=102,
        cls_token_id=101, sep_token_id=102, mask_token_id=103)  # the size and ids of the test corpus's vocab
    made = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, p in made.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.1 * torch.randn_like(p))
    out = f"{fixtures}/v{major}"
    os.makedirs(out, exist_ok=True)
    made.save_pretrained(out)
    rng = np.random.RandomState(7)
    ids = rng.randint(104, 2000, (2, 16)).astype(np.int32)  # 16 tokens: the window of +-4 matters
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    made = transformers.ModernBertForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    np.savez(f"{out}/logits.npz", ids=ids, mask=mask, logits=logits_of(made, ids, mask),
             transformers=transformers.__version__, torch=torch.__version__)
    print(f"wrote {out}: {sorted(os.listdir(out))}, config keys {sorted(json.load(open(out + '/config.json')))[:6]}...")
sys.exit(0 if diff <= 1e-4 else 1)
PY
done
exit $status
