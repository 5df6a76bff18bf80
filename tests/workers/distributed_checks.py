"""Worker for tests/test_distributed.py (mpirun -np 2): weight agreement, batch equivalence,
compressed allreduce payloads and disjoint, complete input, all in one launch. Writes rankN.json/.npz."""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

from bert_tf.data import input_pipeline
from bert_tf.parallel import distributed
from bert_tf.model import modeling
from bert_tf.train import training

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import random_features  # noqa: E402  (tests/ on sys.path first)

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
                               exchange=distributed.make_gradient_allreduce(compression, name=f"{tag}grad"),
                               seed_offset=rank)
    distributed.broadcast_variables(model.trainable_variables)
    result[f"initial_digest_{tag}"] = digest(model)
    trainer.train_step([half])
    arrays[f"one_step_{tag}"] = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    for _ in range(3):                     # dropout on, different streams per rank
        trainer.train_step([half])
    result[f"digest_after_4_steps_{tag}"] = digest(model)

# 2 ranks x 4 sequences vs 1 process x 8, from the same (broadcast) weights. Dropout off:
# its streams differ per rank by design. LAMB's first step hardly depends on the gradients'
# scale (m / sqrt(v)), so the averaged gradients are compared too, not only the weights.
no_drop = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
halves = [{k: tf.constant(v[r * 4:(r + 1) * 4]) for k, v in full.items()} for r in range(2)]


def flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def emulated_average(grads_of_halves, compression):
    """What Horovod's averaging allreduce of the two ranks' gradients should give, computed here:
    with fp16 compression each rank's gradient is rounded to float16, summed and halved in float16."""
    a, b = grads_of_halves
    if not compression:
        return [(x + y) * 0.5 for x, y in zip(a, b)]
    half16 = tf.constant(0.5, tf.float16)
    return [tf.cast((tf.cast(x, tf.float16) + tf.cast(y, tf.float16)) * half16, tf.float32) for x, y in zip(a, b)]


for compression in (False, True):
    tag = "fp16" if compression else "fp32"
    tf.random.set_seed(5 + rank)
    dist = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **no_drop))
    distributed.broadcast_variables(dist.trainable_variables)
    ref = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **no_drop))
    emu = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, **no_drop))
    for r, e, s in zip(ref.trainable_variables, emu.trainable_variables, dist.trainable_variables):
        r.assign(s)
        e.assign(s)
    cfg = training.TrainConfig(learning_rate=1e-4, optimizer="lamb")
    sent = {}
    allreduce = distributed.make_gradient_allreduce(compression, name=f"eq{tag}")
    # an update by hand (what train_step does), the allreduce eager so its result is kept
    dist_trainer = training.Trainer(dist, cfg)
    sent["dist"] = allreduce(dist_trainer.gradients([halves[rank]])[0])
    dist_trainer.apply(sent["dist"])
    ref_trainer = training.Trainer(ref, cfg)
    sent["ref"] = list(ref_trainer.gradients([everything])[0])
    ref_trainer.apply(sent["ref"])
    # the independent computation: both halves' gradients on this rank, averaged here
    emu_trainer = training.Trainer(emu, cfg)
    sent["emu"] = emulated_average([emu_trainer.gradients([h])[0] for h in halves], compression)
    emu_trainer.apply(sent["emu"])
    arrays[f"equiv_dist_{tag}"] = flat(v.numpy() for v in dist.trainable_variables)
    arrays[f"equiv_ref_{tag}"] = flat(v.numpy() for v in ref.trainable_variables)
    arrays[f"equiv_emu_{tag}"] = flat(v.numpy() for v in emu.trainable_variables)
    for key in ("dist", "ref", "emu"):
        arrays[f"grads_{key}_{tag}"] = flat(g.numpy() for g in sent[key])

# disjoint input: the records each rank's pipeline hands out in one pass (every feature of a record,
# as int64, hashed: tests/test_distributed.py hashes the files' records the same way)
RECORD_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


def record_hash(batch, i):
    h = hashlib.sha1()
    for key in RECORD_KEYS:
        h.update(np.asarray(batch[key][i], np.int64).tobytes())
    return h.hexdigest()


files = input_pipeline.list_files(train_glob)
ds = input_pipeline.make_dataset(files, 4, 64, 10, rank, size, seed=1, training=False)
result["record_hashes"] = [record_hash(b, i) for b in (
    {k: v.numpy() for k, v in batch.items()} for batch in ds) for i in range(len(b["input_ids"]))]



# --exchange=powersgd|onebit (bert_tf/parallel/compression.py): the exchange itself on gradients that
# differ per rank (its inputs, outputs and buffers kept for a NumPy reference), a non-finite gradient on one
# rank, the buffers' capture for a checkpoint, and trainer updates keeping the weights equal on both ranks
from bert_tf.parallel import compression  # noqa: E402  (after the set-up above)
from bert_tf.parallel.comm import CommConfig  # noqa: E402  (after the set-up above)


def local_state(exchange):
    return flat(v.numpy() for v in exchange.own())


for method in compression.METHODS:
    tf.random.set_seed(3)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    exchange = distributed.make_gradient_exchange(CommConfig(exchange=method, powersgd_rank=2),
                                                  model.trainable_variables, seed=7, name=f"x{method}")
    if method == "powersgd":
        arrays[f"{method}_q0"] = flat(q.numpy() for q in exchange.qs)
    for call in range(2):
        grads = [tf.random.stateless_normal(v.shape, seed=[rank, 10 * call + i]) for i, v in
                 enumerate(model.trainable_variables)]
        arrays[f"{method}_in{call}"] = flat(g.numpy() for g in grads)
        arrays[f"{method}_out{call}"] = flat(g.numpy() for g in exchange(grads))
        arrays[f"{method}_state{call}"] = local_state(exchange)
    before = local_state(exchange)
    bad = [tf.fill(v.shape, np.inf if rank == 1 and i == 0 else 1.0) for i, v in enumerate(model.trainable_variables)]
    result[f"{method}_nonfinite_out"] = bool(np.isfinite(flat(g.numpy() for g in exchange(bad))).all())
    result[f"{method}_nonfinite_kept_state"] = bool(np.array_equal(before, local_state(exchange)))
    # what a checkpoint and a resume do: each rank writes its own buffers to its own file, then a fresh exchange
    # on each rank reads back only its own (and rank 0's Q is broadcast)
    from bert_tf.parallel import exchange_state  # noqa: E402  (after the set-up above)
    folder = os.path.join(out_dir, "exchange_files")
    weights = exchange_state.weights_digest(model.trainable_variables)
    written = exchange_state.save(exchange, folder, 10, rank, size, weights)
    result[f"{method}_file_bytes"] = os.path.getsize(written)
    fresh = compression.CompressedExchange(method, model.trainable_variables, 2, seed=7, size=size,
                                           name=f"y{method}")
    problem = exchange_state.load(fresh, folder, 10, rank, size, weights)
    problems = [p.decode() for p in distributed.gather_bytes(problem.encode())]
    if fresh.shared():
        distributed.broadcast_variables(fresh.shared())
    result[f"{method}_restore_message"] = exchange_state.summary(problems, size)
    result[f"{method}_restored_equal"] = bool(np.array_equal(local_state(fresh), before))
    if method == "powersgd":
        result["powersgd_q_restored"] = bool(np.array_equal(flat(q.numpy() for q in fresh.qs),
                                                            flat(q.numpy() for q in exchange.qs)))
    # training: four updates with dropout (streams differ per rank), then the weights on both ranks
    model = tiny(1)
    exchange = distributed.make_gradient_exchange(
        CommConfig(exchange=method, powersgd_rank=2, compression_warmup_steps=1),
        model.trainable_variables, seed=7, name=f"t{method}")
    trainer = training.Trainer(model, training.TrainConfig(learning_rate=1e-3, optimizer="adamw"),
                               exchange=exchange, seed_offset=rank)
    distributed.broadcast_variables(model.trainable_variables)
    initial = digest(model)
    for _ in range(4):
        trainer.train_step([half])
    result[f"{method}_digest_after_4_steps"] = digest(model)
    result[f"{method}_moved"] = digest(model) != initial
    result[f"{method}_exchanges"] = int(exchange.clock.numpy())     # the optimizer's updates
    # an elastic re-form (bert_tf/train/elastic.py): the buffers restart at zero and Q afresh, on every rank alike
    result[f"{method}_state_before_reset_nonzero"] = bool(np.any(local_state(exchange)))
    exchange.reset(size)
    result[f"{method}_reset_zero"] = not np.any(local_state(exchange))
    if method == "powersgd":
        arrays["powersgd_q_after_reset"] = flat(q.numpy() for q in exchange.qs)

# --local_updates (DiLoCo, bert_tf/parallel/local_sgd.py): two local updates (the ranks' weights part), then the
# outer step (they agree again, on the reference's value)
from bert_tf.parallel import local_sgd  # noqa: E402  (after the set-up above)

model = tiny(1)
trainer = training.Trainer(model, training.TrainConfig(learning_rate=1e-3, optimizer="adamw"), seed_offset=rank)
distributed.broadcast_variables(model.trainable_variables)
outer = local_sgd.OuterStep(model.trainable_variables, 0.7, 0.9, every=2)
outer.anchor_to(model.trainable_variables)
arrays["diloco_anchor"] = flat(v.numpy() for v in model.trainable_variables)
for _ in range(2):
    trainer.train_step([half])
arrays["diloco_before"] = flat(v.numpy() for v in model.trainable_variables)
outer.sync(model.trainable_variables)
arrays["diloco_after"] = flat(v.numpy() for v in model.trainable_variables)
arrays["diloco_velocity"] = flat(v.numpy() for v in outer.velocity)
result["diloco_rounds"] = int(outer.rounds.numpy())

# --exchange=auto (bert_tf/parallel/auto_exchange.py): the link measured by both ranks together, rank 0's
# figures on both, so both choose the same exchange
from bert_tf.parallel import auto_exchange  # noqa: E402  (after the set-up above)

result["auto_link"] = auto_exchange.measure_link(elements=2 ** 16, repeats=2)
said = []
result["auto_chosen"] = auto_exchange.resolve(CommConfig(exchange="auto"),
                                              modeling.BertConfig.preset("tiny", vocab_size=100), True, 4, 1, 16, 100.0,
                                              said.append).exchange
result["auto_said"] = said

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
