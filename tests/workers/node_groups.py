"""Worker for tests/test_distributed.py on 2 emulated nodes x 2 ranks: --local_updates with --local_group=node as
run/pretrain.py builds it (startup.make_trainer). Writes rankN.json."""
import hashlib
import json
import os
import sys

import tensorflow as tf

from bert_tf.parallel import distributed
from bert_tf.parallel.comm import CommConfig
from bert_tf.model import modeling
from bert_tf.train import startup
from bert_tf.train.pretrain_config import PretrainConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import random_features  # noqa: E402  (tests/ on sys.path first)

out_dir = sys.argv[1]
comm = CommConfig(local_updates=2, local_group="node")
distributed.configure(comm)
hvd = distributed.init()
rank = hvd.rank()
cfg = PretrainConfig(checkpoint_dir=out_dir, vocab_file="unused", learning_rate=1e-3, optimizer="adamw", comm=comm)
model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
trainer, outer = startup.make_trainer(cfg, model, rank)
distributed.broadcast_variables(model.trainable_variables)
outer.anchor_to(model.trainable_variables)
batch = {k: tf.constant(v) for k, v in random_features(batch=4, seq=16, preds=3, vocab=100, seed=rank).items()}


def digest():
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).hexdigest()


result = {"rank": rank, "node": hvd.cross_rank(), "local_rank": hvd.local_rank(), "describe":
          startup.describe_exchange(comm)}
for _ in range(2):                  # each rank its own data and dropout: only averaging inside the node agrees
    trainer.train_step([batch])
result["after_local_updates"] = digest()
outer.sync(model.trainable_variables)
result["after_outer_step"] = digest()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
