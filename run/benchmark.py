"""The single-device optimisation ladder: how fast one BERT update runs with each lever.

    python run/benchmark.py --model_preset=base --max_seq_length=128 --batch_size=8 --output_dir=runs/bench_base

Rungs, each measured after warm-up (compile) steps, in one process:
    fp32        tf.function, float32
    fp32+xla    + jit_compile
    bf16+xla    + mixed_bfloat16
    fp16+xla    + mixed_float16 (dynamic loss scaling)
    best+accum  the fastest precision above, + gradient accumulation (--accumulation_steps)
For each: sequences/s, tokens/s, model TFLOP/s (bert_tf/flops.py), MFU against the dense
matmul peak of the same dtype measured in this run, and compile time. Writes ladder.json
and ladder.png to --output_dir, prints a table and the peak host memory.
"""
import json
import os
import resource
import time

from absl import flags

from bert_tf import cli

cli.define_model_preset("base")
cli.define_sequence()
flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size.")
flags.DEFINE_integer("batch_size", 8, "Micro-batch.")
flags.DEFINE_integer("accumulation_steps", 4, "Micro-batches per update on the accumulation rung.")
flags.DEFINE_integer("warmup_updates", 2, "Updates not timed (compilation).")
flags.DEFINE_integer("updates", 5, "Timed updates per rung.")
flags.DEFINE_list("rungs", ["fp32", "fp32+xla", "bf16+xla", "fp16+xla", "best+accum"], "Rungs to run.")
flags.DEFINE_float("peak_seconds", 3.0, "Seconds per matmul-peak measurement.")
flags.DEFINE_string("output_dir", "runs/benchmark", "Where ladder.json and ladder.png go.")
FLAGS = flags.FLAGS

PRECISION = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
DTYPE_NAME = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def random_batch(batch, seq, preds, vocab, seed):
    import numpy as np
    import tensorflow as tf
    r = np.random.RandomState(seed)
    positions = np.sort(np.stack([r.choice(np.arange(1, seq), preds, replace=False) for _ in range(batch)]), 1)
    return {
        "input_ids": tf.constant(r.randint(104, vocab, (batch, seq)), tf.int32),
        "input_mask": tf.ones((batch, seq), tf.int32),
        "segment_ids": tf.constant(np.repeat([[0] * (seq // 2) + [1] * (seq - seq // 2)], batch, 0), tf.int32),
        "masked_lm_positions": tf.constant(positions, tf.int32),
        "masked_lm_ids": tf.constant(r.randint(104, vocab, (batch, preds)), tf.int32),
        "masked_lm_weights": tf.ones((batch, preds), tf.float32),
        "next_sentence_labels": tf.constant(r.randint(0, 2, (batch, 1)), tf.int32),
    }


def run_rung(config, precision, xla, accumulation):
    import tensorflow as tf

    from bert_tf import modeling, training
    tf.random.set_seed(0)
    model = modeling.BertPretrainer(config)
    trainer = training.Trainer(model, training.TrainConfig(precision=precision, xla=xla,
                                                           accumulation_steps=accumulation, total_steps=10 ** 6))
    micro = [random_batch(FLAGS.batch_size, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, config.vocab_size,
                          i) for i in range(accumulation)]
    start = time.perf_counter()
    float(trainer.train_step(micro)["loss"])
    first = time.perf_counter() - start
    for _ in range(FLAGS.warmup_updates - 1):
        float(trainer.train_step(micro)["loss"])
    times = []
    for _ in range(FLAGS.updates):
        start = time.perf_counter()
        float(trainer.train_step(micro)["loss"])
        times.append(time.perf_counter() - start)
    step = sorted(times)[len(times) // 2]           # median update time
    return {"update_seconds": step, "first_update_seconds": first,
            "compile_seconds_estimate": max(first - step, 0.0)}


def main(_):
    import tensorflow as tf

    from bert_tf import flops, modeling
    config = modeling.BertConfig.preset(FLAGS.model_preset, vocab_size=FLAGS.vocab_size)
    flops_per_seq = flops.training_flops_per_sequence(config, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq)
    print(f"{FLAGS.model_preset}: {config.num_hidden_layers} layers, hidden {config.hidden_size}; "
          f"seq {FLAGS.max_seq_length}, micro-batch {FLAGS.batch_size}; {flops_per_seq / 1e9:.2f} GFLOP per sequence (train)", flush=True)
    peaks = {}
    for name in ("float32", "bfloat16", "float16"):
        peaks[name] = flops.matmul_peak(getattr(tf, name), seconds=FLAGS.peak_seconds)
        print(f"matmul peak {name}: {peaks[name] / 1e12:.3f} TFLOP/s", flush=True)

    rows, best = [], None
    for rung in FLAGS.rungs:
        if rung == "best+accum":
            base = max((r for r in rows if r["xla"]), key=lambda r: r["sequences_per_second"], default=None)
            precision = base["precision"] if base else "float32"
            xla, accumulation = True, FLAGS.accumulation_steps
        else:
            short, _, opt = rung.partition("+")
            precision, xla, accumulation = PRECISION[short], opt == "xla", 1
        result = run_rung(config, precision, xla, accumulation)
        seqs = FLAGS.batch_size * accumulation / result["update_seconds"]
        achieved = seqs * flops_per_seq
        peak = peaks[DTYPE_NAME[precision]]
        row = {"rung": rung, "precision": precision, "xla": xla, "accumulation_steps": accumulation,
               "sequences_per_second": seqs, "tokens_per_second": seqs * FLAGS.max_seq_length,
               "model_tflops": achieved / 1e12, "matmul_peak_tflops": peak / 1e12, "mfu": achieved / peak, **result}
        rows.append(row)
        print(f"{rung:<11} {seqs:8.2f} seq/s {seqs * FLAGS.max_seq_length:9.0f} tok/s {achieved / 1e12:7.3f} TFLOP/s  "
              f"MFU {achieved / peak:6.1%} of {DTYPE_NAME[precision]} peak  first update {result['first_update_seconds']:.1f} s",
              flush=True)
        best = row if best is None or seqs > best["sequences_per_second"] else best
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(f"best: {best['rung']} at {best['sequences_per_second']:.2f} seq/s, MFU {best['mfu']:.1%}; "
          f"peak host memory {peak_rss_gb:.2f} GB")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    report = {"model_preset": FLAGS.model_preset, "seq_length": FLAGS.max_seq_length, "batch_size": FLAGS.batch_size,
              "flops_per_sequence": flops_per_seq, "matmul_peak_flops": peaks, "rungs": rows,
              "peak_host_memory_gb": peak_rss_gb, "cpu_count": os.cpu_count(),
              "command": "python run/benchmark.py " + " ".join(
                  f"--{k}={FLAGS[k].value if not isinstance(FLAGS[k].value, list) else ','.join(FLAGS[k].value)}"
                  for k in ("model_preset", "max_seq_length", "batch_size", "accumulation_steps", "updates"))}
    with open(os.path.join(FLAGS.output_dir, "ladder.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot(report, os.path.join(FLAGS.output_dir, "ladder.png"))
    print(f"wrote {FLAGS.output_dir}/ladder.json and ladder.png")


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = report["rungs"]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar([r["rung"] for r in rows], [r["sequences_per_second"] for r in rows], color="tab:blue")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['model_tflops']:.2f} TFLOP/s\nMFU {r['mfu']:.0%}", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("sequences / s")
    ax.set_title(f"BERT-{report['model_preset']} seq {report['seq_length']} micro-batch {report['batch_size']}, "
                 f"{report['cpu_count']} CPU cores")
    ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    cli.run(main)
