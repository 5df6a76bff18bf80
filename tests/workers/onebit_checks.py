"""Worker for tests/test_onebit_adam.py (mpirun -np 2): --exchange=onebit across two ranks. The fused compressed
allreduce on tensors that differ per rank (inputs, outputs and both errors kept for the NumPy reference); 1-bit
Adam and 1-bit LAMB training a tiny model on different data per rank (digests of the weights, m and v after
every update; 1-bit Adam also with --onebit_live=word_embeddings and with 0/1 Adam's variance schedule); and 1-bit
Adam and 0/1 Adam against float32 AdamW memorising a batch per rank (the loss per update).
Writes rankN.json/.npz."""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.parallel import distributed, onebit
from bert_tf.parallel.comm import CommConfig
from bert_tf.train import training

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import random_features  # noqa: E402  (tests/ on sys.path first)
from test_onebit_adam import SHAPES, inputs_of  # noqa: E402  (the same tensors as the reference's)

out_dir = sys.argv[1]
hvd = distributed.init()
rank, size = hvd.rank(), hvd.size()
result, arrays = {"rank": rank}, {}


def flat(xs):
    return np.concatenate([np.asarray(x).ravel() for x in xs])


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


# the compressed allreduce, three calls with the errors carried
layout = onebit.Layout(SHAPES, size)
error, server = tf.zeros([layout.padded]), tf.zeros([layout.served])
for call in range(3):
    xs = inputs_of(rank, call)
    arrays[f"in{call}"] = flat(xs)
    out, error, server = onebit.compressed_allreduce([tf.constant(x) for x in xs], error, server, layout, f"ca{call}")
    arrays[f"out{call}"] = flat(o.numpy() for o in out)
    arrays[f"worker_error{call}"], arrays[f"server_error{call}"] = error.numpy(), server.numpy()

# sequences of 16 tokens: position embeddings 16.. get no gradient (exactly zero momentum, always)
features = random_features(batch=8, seq=16, preds=3, vocab=100, seed=11)
mine = {k: tf.constant(v[rank * 4:(rank + 1) * 4]) for k, v in features.items()}


def trainer_for(kind, exchange, steps, lr=1e-3, warmup=2, name="t", live="", kappa=0):
    tf.random.set_seed(1 + rank)                  # different per rank: the broadcast makes them equal
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    comm = CommConfig(exchange=exchange, compression_warmup_steps=warmup if exchange == "onebit" else None,
                      onebit_live=live, onebit_variance_kappa=kappa)
    config = training.TrainConfig(optimizer=kind, learning_rate=lr, total_steps=steps, comm=comm)
    ex = distributed.make_gradient_exchange(comm, model.trainable_variables, seed=7, name=name)
    trainer = training.Trainer(model, config, exchange=ex, seed_offset=rank)
    distributed.broadcast_variables(model.trainable_variables)
    return model, trainer


# 0/1 Adam (kappa 1, warmup 5): the variance moves at updates 1, 2 and 4, signs at 3 and 5, frozen from 6
for kind, live, kappa, warmup, updates in (("adamw", "", 0, 2, 6), ("lamb", "", 0, 2, 6),
                                           ("adamw", "word_embeddings", 0, 2, 6), ("adamw", "", 1, 5, 8)):
    model, trainer = trainer_for(kind, "onebit", 10, name=f"t{kind}{live}{kappa}", live=live, warmup=warmup,
                                 kappa=kappa)
    names = [v.name for v in model.trainable_variables]
    position = [i for i, n in enumerate(names) if "position" in n][0]
    word = [i for i, n in enumerate(names) if "word_embeddings" in n][0]
    record = {"warmup": trainer.optimizer.freeze_variance_after, "weights": [], "moments": [], "variances": [],
              "word_variances": []}
    for _ in range(updates):
        trainer.train_step([mine])
        record["weights"].append(digest(model.trainable_variables))
        record["moments"].append(digest(trainer.optimizer.m))
        record["variances"].append(digest(v for i, v in enumerate(trainer.optimizer.v) if i != word))
        record["word_variances"].append(digest([trainer.optimizer.v[word]]))
    record["zero_rows_zero"] = bool(not np.any(trainer.optimizer.m[position].numpy()[16:]))
    result[kind + (f"_live_{live}" if live else "") + (f"_kappa{kappa}" if kappa else "")] = record

# learning: 40 updates memorising each rank's batch, dropout off; 1-bit Adam with its default warmup (20%)
for exchange, kappa in (("onebit", 0), ("none", 0), ("onebit", 2)):
    tf.random.set_seed(3)
    config = modeling.BertConfig.preset("tiny", vocab_size=100, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
    model = modeling.BertPretrainer(config)
    # 0/1 Adam: its variance schedule over 30 updates (kappa 2: 11 of them in float32), then frozen
    comm = (CommConfig(exchange=exchange, onebit_variance_kappa=2, compression_warmup_steps=30) if kappa
            else CommConfig(exchange=exchange))
    ex = distributed.make_gradient_exchange(comm, model.trainable_variables, name=f"learn{exchange}{kappa}")
    trainer = training.Trainer(model, training.TrainConfig(optimizer="adamw", learning_rate=2e-3, total_steps=40,
                                                           comm=comm), exchange=ex, seed_offset=rank)
    distributed.broadcast_variables(model.trainable_variables)
    losses = [float(trainer.train_step([mine]).output.loss) for _ in range(40)]
    result[f"learn_{'float32' if exchange == 'none' else exchange}{'_kappa' if kappa else ''}"] = losses

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
