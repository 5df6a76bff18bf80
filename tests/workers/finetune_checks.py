"""Worker for tests/test_finetune.py (mpirun -np 2): fine-tune on a toy task, write each rank's weight digest."""
import hashlib
import json
import os
import sys

from bert_tf.data import tokenization
from bert_tf.parallel import distributed
from bert_tf.model import modeling
from bert_tf.tasks import classification

out_dir = sys.argv[1]
hvd = distributed.init()
vocab = tokenization.google_reserved_tokens() + ["good", "bad", "movie", "plot", "very", "a"]
tok = tokenization.Tokenizer(vocab)
texts = ["a very good movie", "good plot", "a bad movie", "very bad plot"] * 8
examples = classification.Examples(["pos", "pos", "neg", "neg"] * 8, texts, [None] * len(texts))
x, y, _ = classification.encode(examples, tok, 8, ["neg", "pos"])
config = modeling.BertConfig.preset("tiny", vocab_size=len(vocab))
metrics, model = classification.train_and_evaluate(
    config, ["neg", "pos"], (x, y), (x, y), epochs=3, per_rank_batch=4, seed=hvd.rank(),   # different init per rank
    exchange=distributed.make_gradient_allreduce(False, name="ft"), broadcast=distributed.broadcast_variables,
    rank=hvd.rank(), size=hvd.size())
digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).hexdigest()
with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"digest": digest, "accuracy": metrics["accuracy"]}, f)
