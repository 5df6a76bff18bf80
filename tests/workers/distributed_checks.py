"""Worker for tests/test_distributed.py (mpirun -np 2): weight agreement, batch equivalence,
compressed allreduce payloads and disjoint input, all in one launch. Writes rankN.json/.npz."""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

from bert_tf import distributed, input_pipeline, modeling, training

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import random_features  # noqa: E402

out_dir, train_glob = sys.argv[1], sys.argv[2]
hvd = distributed.init()
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size}
arrays = {}

full = random_features(batch=8, seq=16, preds=3, vocab=100, seed=11)
half = {k: tf.constant(v[rank * 4:(rank + 1) * 4]) for k, v in full.items()}
everything = {k: tf.constant(v) for k, v in full.items()}


def tiny(seed):
    tf.random.set_seed(seed + rank)        # deliberately different per rank: broadcast must fix it
    return modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))


def digest(model):
    h = hashlib.sha256()
    for v in model.trainable_variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


for compression in (False, True):
    tag = "fp16" if compression else "fp32"
    model = tiny(1)
    trainer = training.Trainer(model, training.TrainConfig(learning_rate=1e-4, optimizer="lamb"),
                               allreduce=distributed.make_gradient_allreduce(compression, name=f"{tag}grad"),
                               seed_offset=rank)
    distributed.broadcast_variables(model.trainable_variables)
    result[f"initial_digest_{tag}"] = digest(model)
    trainer.train_step([half])
    arrays[f"one_step_{tag}"] = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    for _ in range(3):                     # dropout on, different streams per rank
        trainer.train_step([half])
    result[f"digest_after_4_steps_{tag}"] = digest(model)

# 2 ranks x 4 sequences vs 1 process x 8, from the same (broadcast) weights. Dropout off:
# its streams differ per rank by design.
no_drop = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
for compression in (False, True):
    tag = "fp16" if compression else "fp32"
    tf.random.set_seed(5 + rank)
    dist = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **no_drop))
    distributed.broadcast_variables(dist.trainable_variables)
    ref = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **no_drop))
    for r, s in zip(ref.trainable_variables, dist.trainable_variables):
        r.assign(s)
    cfg = training.TrainConfig(learning_rate=1e-4, optimizer="lamb")
    training.Trainer(dist, cfg, distributed.make_gradient_allreduce(compression, name=f"eq{tag}")).train_step([half])
    training.Trainer(ref, cfg).train_step([everything])
    arrays[f"equiv_dist_{tag}"] = np.concatenate([v.numpy().ravel() for v in dist.trainable_variables])
    arrays[f"equiv_ref_{tag}"] = np.concatenate([v.numpy().ravel() for v in ref.trainable_variables])

# disjoint input: the records each rank's pipeline hands out in one pass
files = input_pipeline.list_files(train_glob)
ds = input_pipeline.make_dataset(files, 4, 64, 10, rank, size, seed=1, training=False)
result["record_hashes"] = [hashlib.sha1(ids.tobytes()).hexdigest() for b in ds for ids in b["input_ids"].numpy()]

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
