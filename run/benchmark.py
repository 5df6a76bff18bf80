"""The single-device optimisation ladder: how fast one BERT update runs with each lever, next to
the library a Keras user would pick instead, and the configuration to run on this machine.

    python run/benchmark.py --model_preset=base --max_seq_length=128 --batch_size=8 --output_dir=runs/bench_base
    python run/benchmark.py --model_preset=base --write_flagfile=node.flags    # once per node type

Rungs, each measured after warm-up (compile) steps, in one process:
    fp32, bf16, fp16    tf.function in float32, mixed_bfloat16, mixed_float16 (dynamic loss scaling)
    ...+xla             the same with jit_compile (the whole step under XLA)
    ...+fuse            TensorFlow's matmul kernels, the element-wise ops between them fused by XLA
                        auto-clustering (run/pretrain.py --fuse); needs training.FUSION_ENV at launch, and
                        then keras-hub's steps without XLA are auto-clustered too (+autojit)
    best+accum          the fastest of the above, + gradient accumulation (--accumulation_steps)
    best-dropout        diagnostic: the fastest without dropout, what the stateless random numbers
                        cost (never chosen as the fastest; pre-training keeps dropout)
    (the optimizer update is XLA-compiled in every bert_tf rung: it has no matmul)
    keras-hub           the peer: keras_hub.models.BertMaskedLM (Keras 3 on TensorFlow), same shapes,
                        micro-batch and sparse masked positions; its best of fp32/bf16 x XLA on/off,
                        then that best with Keras's gradient accumulation (+accum) and at each
                        --tune_batch_sizes micro-batch, so both sides are timed at the same shapes
For each: sequences/s, tokens/s, model TFLOP/s (bert_tf/tools/flops.py), MFU against the hardware peak
(the best dense-matmul FLOP/s over every dtype, TensorFlow kernels and XLA, measured in this run)
and against the same dtype's peak, compile time, and what else the machine ran meanwhile (other
processes' cores and hypervisor steal, bert_tf/tools/machine_load.py: a figure timed beside other work is
flagged; on 2 cores one busy neighbour halves the matmul peak). Prints the CPU features (or GPU) it saw and
bert_tf's speed as a ratio to keras-hub's; writes ladder.json and ladder.png to --output_dir.

--write_flagfile: also writes the fastest bert_tf precision/XLA as flags `run/pretrain.py
--flagfile` takes after the recipe's flagfile, with the measured sequences/s (pretrain logs its
own figure next to it). keras-hub is a benchmark-only dependency (requirements-dev.txt).
"""
import json
import os
import resource
import time

from absl import flags

from bert_tf import ConfigError, cli
from bert_tf.tools import machine_load
from bert_tf.dist import device

cli.define_model_preset("base")
cli.define_sequence()
flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size.")
flags.DEFINE_integer("batch_size", 8, "Micro-batch.")
flags.DEFINE_list("tune_batch_sizes", [], "Also time the fastest bert_tf rung at these micro-batches "
                  "(the flagfile then names the fastest per sequence).")
flags.DEFINE_integer("accumulation_steps", 4, "Micro-batches per update on the accumulation rung.")
flags.DEFINE_integer("warmup_updates", 2, "Updates not timed (compilation).")
flags.DEFINE_integer("updates", 5, "Timed updates per rung.")
flags.DEFINE_list("rungs", None, "Rungs to run (default: the CPU ladder, or the GPU ladder where TensorFlow sees a "
                  "GPU; see CPU_RUNGS and GPU_RUNGS).")
flags.DEFINE_float("peak_seconds", 3.0, "Seconds per matmul-peak measurement (each dtype, both ways).")
flags.DEFINE_integer("peak_size", 2048, "n of the n x n x n matmul the peak is measured with.")
flags.DEFINE_integer("peak_repeats", 3, "Times each matmul peak is measured (the best counts; the spread is reported).")
flags.DEFINE_string("output_dir", "runs/benchmark", "Where ladder.json and ladder.png go.")
flags.DEFINE_string("input_files", "", "Also measure input_pipeline.make_dataset alone on these TFRecords (static and "
                    "dynamic masking, sequences/s per rank) next to the model's consumption; needs --vocab_file.")
flags.DEFINE_string("vocab_file", "", "vocab.txt of --input_files (dynamic masking's special and [MASK] ids).")
flags.DEFINE_list("records", [], "After the ladder, train the fastest bert_tf rung on batches of these TFRecord globs "
                  "(each glob a rung: one made without and one with create_pretraining_data.py --pack) and report "
                  "useful (non-padding) tokens/s and instances/s next to rows/s.")
flags.DEFINE_float("input_seconds", 5.0, "Seconds per input-pipeline measurement.")
flags.DEFINE_string("profile_dir", "", "After the ladder, trace 3 updates of the fastest bert_tf rung and of "
                    "keras-hub's fastest with the TensorFlow profiler into DIR/bert_tf and DIR/keras-hub (TensorBoard's "
                    "profile tab reads them) and print where each spends its time, by kind of op.")
flags.DEFINE_string("write_flagfile", "", "Write the fastest bert_tf configuration here as run/pretrain.py flags.")
flags.DEFINE_string("device_figures", "", "Add the fastest bert_tf rung's sequences/s to this JSON as the device's "
                    "phase-1 (sequence 128) or phase-2 (512) speed, for run/plan.py --device_figures.")
FLAGS = flags.FLAGS

# tf32: float32 with TensorFloat-32 matmuls (GPUs from Ampere on); fp32 is then strict float32.
PRECISION = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16", "tf32": "float32"}
DTYPE_NAME = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
PRECISION_RUNGS = [*PRECISION, *(f"{p}+{way}" for way in ("xla", "fuse") for p in PRECISION)]
RUNGS = [*PRECISION_RUNGS, "best+accum", "best-dropout", "keras-hub"]
# Without a GPU, XLA's CPU backend misses the bf16 matrix units, so both ways are timed; on a GPU, XLA
# fuses around cuBLAS and float16/bfloat16 use the tensor cores: the fast rungs first.
CPU_RUNGS = ["fp32", "fp32+xla", "fp32+fuse", "bf16", "bf16+xla", "bf16+fuse", "fp16", "fp16+xla", "best+accum",
             "best-dropout", "keras-hub"]
GPU_RUNGS = ["fp16+xla", "bf16+xla", "tf32+xla", "fp32+xla", "fp16", "best+accum", "best-dropout", "keras-hub"]


def default_rungs(gpu: bool, fusion: bool):
    """The ladder for this device; the +fuse rungs only where the process started with auto-clustering on
    (training.FUSION_ENV), and main says so when it leaves them out."""
    return [r for r in (GPU_RUNGS if gpu else CPU_RUNGS) if fusion or not r.endswith("+fuse")]


def check_rungs(rungs, gpu=False, fusion=False):
    from bert_tf.train import training
    unknown = [r for r in rungs if r not in RUNGS]
    if unknown:
        raise ConfigError(f"--rungs: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(RUNGS)}")
    if not rungs:
        raise ConfigError("--rungs is empty")
    if not gpu and any(r.startswith("tf32") for r in rungs):
        raise ConfigError("--rungs: tf32 needs a GPU with TensorFloat-32 (Ampere or newer); TensorFlow sees no GPU here")
    if not fusion and any(r.endswith("+fuse") for r in rungs):
        raise ConfigError(f"--rungs: the +fuse rungs need {training.FUSION_ENV} in the environment when the "
                          "benchmark starts (TensorFlow reads it once, early); the other rungs keep out of it")
    if "best-dropout" in rungs and not any(r in rungs[:rungs.index("best-dropout")] for r in PRECISION_RUNGS):
        raise ConfigError("--rungs: best-dropout needs a bert_tf rung before it")
    if "keras-hub" in rungs:
        try:
            import keras_hub  # noqa: F401  (the peer; benchmark-only dependency)
        except ImportError as e:
            raise ConfigError(f"--rungs=keras-hub needs keras-hub ({e}): pip install -r requirements-dev.txt, "
                              "or leave the rung out") from None


def check_writable(path, flag="write_flagfile"):
    """Fails before an hour of measuring if the file could not be written at the end."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"--{flag}={path}: directory {directory} does not exist")
    if os.path.isdir(path) or not os.access(directory, os.W_OK) or (os.path.exists(path) and
                                                                   not os.access(path, os.W_OK)):
        raise ConfigError(f"--{flag}={path}: not writable")


def write_flagfile(path, best, report):
    """The fastest bert_tf rung as pretrain flags; written to a temporary name, then renamed
    (an interrupted run leaves no half-written flagfile)."""
    lines = [f"# run/benchmark.py on {report['device'].get('cpu') or report['device'].get('gpus')}, "
             f"{report['model_preset']} seq {report['seq_length']}: fastest bert_tf rung {best['rung']}",
             f"# command: {report['command']}",
             f"# micro-batch measured {best['batch_size']}"
             + (" (fastest of --tune_batch_sizes; --fit_micro_batch keeps the recipe's per-rank batch)"
                if report.get("tune_batch_sizes") else ""),
             f"--precision={best['precision']}",
             *([f"--{'' if best['tf32'] else 'no'}tf32"] if report["device"].get("gpus") else []),
             f"--{'' if best['xla'] else 'no'}xla",
             f"--{'' if best['fuse'] else 'no'}fuse",
             f"--ladder_sequences_per_second={best['sequences_per_second']:.3f}"]
    if report.get("tune_batch_sizes"):  # the micro-batch was tuned: keep the recipe's per-rank batch, split it so
        lines.append(f"--fit_micro_batch={best['batch_size']}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


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


def timed_updates(step):
    """{"update_seconds": median of FLAGS.updates calls of step(), "first_update_seconds", "compile_seconds_estimate",
    "machine_load": what other processes and the hypervisor took meanwhile (bert_tf/tools/machine_load.py)}."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(FLAGS.warmup_updates - 1):
        step()
    times = []
    with machine_load.Meter() as load:      # what else the machine ran while the updates were timed
        for _ in range(FLAGS.updates):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    median = sorted(times)[len(times) // 2]
    return {"update_seconds": median, "first_update_seconds": first, "compile_seconds_estimate": max(first - median, 0),
            "machine_load": load.result}


def run_rung(config, precision, xla, accumulation, batch_size, profile_dir="", tf32=False, fuse=False, records=None):
    """One rung's timing (timed_updates) on random full rows, or with records=(glob, instances per row) on
    the records' own batches, a new update's worth each call, read before the clock starts; then
    useful_tokens_per_second and instances_per_second count what the timed updates held."""
    import tensorflow as tf

    from bert_tf.data import input_pipeline
    from bert_tf.model import modeling
    from bert_tf.train import training
    tf.random.set_seed(0)
    model = modeling.BertPretrainer(config)
    trainer = training.Trainer(model, training.TrainConfig(precision=precision, xla=xla, tf32=tf32, fuse=fuse,
                                                           accumulation_steps=accumulation, total_steps=10 ** 6))
    if records:
        pattern, pack = records
        batches = iter(input_pipeline.make_dataset(input_pipeline.list_files(pattern), batch_size,
                                                   FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, pack=pack))
        updates = [[next(batches) for _ in range(accumulation)] for _ in range(FLAGS.warmup_updates + FLAGS.updates)]
        queue = list(updates)
        result = timed_updates(lambda: float(trainer.train_step(queue.pop(0))["loss"]))
        timed = [mb for update in updates[FLAGS.warmup_updates:] for mb in update]
        seconds = result["update_seconds"] * FLAGS.updates          # the median update, as the rows/s figure
        result["useful_tokens_per_second"] = sum(int(tf.reduce_sum(mb["input_mask"])) for mb in timed) / seconds
        result["instances_per_second"] = sum(float(tf.reduce_sum(mb["next_sentence_weights"])) if pack else
                                             int(mb["input_ids"].shape[0]) for mb in timed) / seconds
        return result
    micro = [random_batch(batch_size, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, config.vocab_size,
                          i) for i in range(accumulation)]
    step = lambda: float(trainer.train_step(micro)["loss"])  # noqa: E731
    return traced_updates(step, profile_dir) if profile_dir else timed_updates(step)


TRACED_UPDATES = 3


def traced_updates(step, profile_dir):
    """Warm up, then trace TRACED_UPDATES calls of step() with the TensorFlow profiler into profile_dir;
    returns their wall seconds (the profiler's own cost included)."""
    import tensorflow as tf
    for _ in range(FLAGS.warmup_updates):
        step()
    tf.profiler.experimental.start(profile_dir)
    start = time.perf_counter()
    for _ in range(TRACED_UPDATES):
        step()
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    return seconds


def run_keras_hub(config, precision, xla, batch_size, accumulation=1, profile_dir=""):
    """One update of keras_hub.models.BertMaskedLM (the peer) on the same shapes: same encoder
    size, dropout and masked positions; masked-LM loss only (no next-sentence head), AdamW. With
    accumulation > 1, Keras's own gradient accumulation: an update is that many train_on_batch calls."""
    import keras
    import keras_hub
    keras.mixed_precision.set_global_policy(precision)
    try:
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
            intermediate_dim=config.intermediate_size, dropout=config.hidden_dropout_prob,
            max_sequence_length=config.max_position_embeddings, num_segments=config.type_vocab_size)
        model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        model.compile(optimizer=keras.optimizers.AdamW(
                          1e-4, gradient_accumulation_steps=accumulation if accumulation > 1 else None),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=[], jit_compile=xla)
        b = random_batch(batch_size, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, config.vocab_size, 0)
        x = {"token_ids": b["input_ids"], "segment_ids": b["segment_ids"], "padding_mask": b["input_mask"] > 0,
             "mask_positions": b["masked_lm_positions"]}
        step = lambda: [float(model.train_on_batch(x, b["masked_lm_ids"], sample_weight=b["masked_lm_weights"]))  # noqa: E731
                        for _ in range(accumulation)]
        if profile_dir:
            return traced_updates(step, profile_dir)
        result = timed_updates(step)
        # what Keras itself did: weight updates it applied per timed update (its `iterations` counts
        # applied updates, not calls, when it accumulates) and the accumulation it was given
        result["peer_applied_per_update"] = int(model.optimizer.iterations) / (FLAGS.warmup_updates + FLAGS.updates)
        result["peer_gradient_accumulation_steps"] = model.optimizer.gradient_accumulation_steps or 1
        return result
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main(_):
    import tensorflow as tf

    from bert_tf.model import modeling
    from bert_tf.tools import flops, op_profile, planner
    from bert_tf.train import training
    gpu = bool(tf.config.list_physical_devices("GPU"))
    fusion = training.fusion_enabled()
    rungs = FLAGS.rungs if FLAGS.rungs is not None else default_rungs(gpu, fusion)
    if FLAGS.rungs is None and not fusion and not gpu:
        print(f"not timed: the +fuse rungs (start the benchmark with {training.FUSION_ENV} to time them)")
    check_rungs(rungs, gpu, fusion)
    try:
        batch_sizes = [int(b) for b in FLAGS.tune_batch_sizes]
    except ValueError:
        raise ConfigError(f"--tune_batch_sizes: not integers: {','.join(FLAGS.tune_batch_sizes)}") from None
    if any(b < 1 for b in batch_sizes) or FLAGS.batch_size < 1:
        raise ConfigError(f"--batch_size/--tune_batch_sizes must be >= 1, got {FLAGS.batch_size}, {batch_sizes}")
    for flag in ("write_flagfile", "device_figures"):
        if FLAGS[flag].value:
            check_writable(FLAGS[flag].value, flag)
            if not any(r in PRECISION_RUNGS for r in rungs):
                raise ConfigError(f"--{flag} needs at least one bert_tf precision rung in --rungs")
    if FLAGS.device_figures:
        if FLAGS.max_seq_length not in planner.DEVICE_FIGURES.values():
            raise ConfigError(f"--device_figures: the plan's phases run at sequence 128 and 512, not "
                              f"--max_seq_length={FLAGS.max_seq_length}")
        if os.path.exists(FLAGS.device_figures):
            planner.read_device_figures(FLAGS.device_figures, FLAGS.model_preset)   # one it can add to
    from bert_tf.data import input_pipeline
    records = []
    for pattern in FLAGS.records:       # (glob, instances per row), checked before an hour of measuring
        files = input_pipeline.list_files(pattern)
        records.append((pattern, input_pipeline.check_files(files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq)))
    if FLAGS.input_files:
        if not FLAGS.vocab_file:
            raise ConfigError("--input_files needs --vocab_file")
        input_pipeline.check_files(input_pipeline.list_files(FLAGS.input_files), FLAGS.max_seq_length,
                                   FLAGS.max_predictions_per_seq)
    config = modeling.BertConfig.preset(FLAGS.model_preset, vocab_size=FLAGS.vocab_size)
    flops_per_seq = flops.training_flops_per_sequence(config, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq)
    device = device.device_description()
    print(f"device: {device}")
    print(f"{FLAGS.model_preset}: {config.num_hidden_layers} layers, hidden {config.hidden_size}; "
          f"seq {FLAGS.max_seq_length}, micro-batch {FLAGS.batch_size}; {flops_per_seq / 1e9:.2f} GFLOP per sequence (train)", flush=True)
    if FLAGS.peak_repeats < 1:
        raise ConfigError(f"--peak_repeats must be >= 1, got {FLAGS.peak_repeats}")
    peak_samples, peak_loads = {}, {}
    peaks = flops.matmul_peaks(n=FLAGS.peak_size, seconds=FLAGS.peak_seconds, log=lambda line: print(line, flush=True),
                               repeats=FLAGS.peak_repeats, samples=peak_samples, loads=peak_loads)
    hw_peak, hw_dtype, hw_way = flops.hardware_peak(peaks)
    print(f"hardware peak: {hw_peak / 1e12:.3f} TFLOP/s ({hw_dtype}, {hw_way})", flush=True)

    rows = []

    def record(rung, precision, xla, accumulation, batch_size, result, peer=False, diagnostic=False, tf32=False,
               fuse=False):
        seqs = batch_size * accumulation / result["update_seconds"]
        achieved = seqs * flops_per_seq
        dtype_peak = max(peaks[DTYPE_NAME[precision]].values())
        row = {"rung": rung, "precision": precision, "tf32": tf32, "xla": xla, "fuse": fuse,
               "accumulation_steps": accumulation,
               "batch_size": batch_size, "peer": peer, "diagnostic": diagnostic,
               "sequences_per_second": seqs, "tokens_per_second": seqs * FLAGS.max_seq_length,
               "model_tflops": achieved / 1e12, "mfu": achieved / hw_peak, "mfu_same_dtype": achieved / dtype_peak,
               **result}
        rows.append(row)
        print(f"{rung:<22} {seqs:8.2f} seq/s {seqs * FLAGS.max_seq_length:9.0f} tok/s {achieved / 1e12:7.3f} TFLOP/s  "
              f"MFU {achieved / hw_peak:6.1%} of hardware peak ({achieved / dtype_peak:6.1%} of "
              f"{DTYPE_NAME[precision]})  first update {result['first_update_seconds']:.1f} s"
              + (f"  WARNING: timed beside other work ({machine_load.describe(result['machine_load'])})"
                 if machine_load.busy(result.get("machine_load")) else ""), flush=True)
        return row

    def fastest(peer=False):
        return max((r for r in rows if r["peer"] == peer and not r["diagnostic"]), key=lambda r: r["sequences_per_second"], default=None)

    for rung in rungs:
        if rung == "keras-hub":
            for precision in ("float32", "mixed_bfloat16"):
                for xla in (False, True):
                    name = f"keras-hub {precision.replace('mixed_', '')}{'+xla' if xla else ''}"
                    if not xla and fusion:     # the peer with the same lever: its steps are auto-clustered too
                        name += "+autojit"
                    record(name, precision, xla, 1, FLAGS.batch_size,
                           run_keras_hub(config, precision, xla, FLAGS.batch_size), peer=True)
            if FLAGS.accumulation_steps > 1:      # the peer's best with its own accumulation, as best+accum
                base = fastest(peer=True)
                record(f"{base['rung']}+accum", base["precision"], base["xla"], FLAGS.accumulation_steps,
                       FLAGS.batch_size, run_keras_hub(config, base["precision"], base["xla"], FLAGS.batch_size,
                                                       FLAGS.accumulation_steps), peer=True)
            continue
        if rung == "best-dropout":
            base = fastest()
            import dataclasses
            row = record(rung, base["precision"], base["xla"], base["accumulation_steps"], base["batch_size"],
                         run_rung(dataclasses.replace(config, hidden_dropout_prob=0.0,
                                                      attention_probs_dropout_prob=0.0),
                                  base["precision"], base["xla"], base["accumulation_steps"], base["batch_size"],
                                  tf32=base["tf32"], fuse=base["fuse"]),
                         diagnostic=True, tf32=base["tf32"], fuse=base["fuse"])
            print(f"dropout costs {1 - base['sequences_per_second'] / row['sequences_per_second']:.1%} of the "
                  f"fastest rung's ({base['rung']}) time", flush=True)
            continue
        if rung == "best+accum":
            base = fastest()
            precision, xla, tf32, fuse = (base["precision"], base["xla"], base["tf32"], base["fuse"]) if base else \
                ("float32", True, False, False)
            accumulation = FLAGS.accumulation_steps
        else:
            short, _, opt = rung.partition("+")
            precision, xla, tf32, fuse, accumulation = PRECISION[short], opt == "xla", short == "tf32", opt == "fuse", 1
        record(rung, precision, xla, accumulation, FLAGS.batch_size,
               run_rung(config, precision, xla, accumulation, FLAGS.batch_size, tf32=tf32, fuse=fuse), tf32=tf32,
               fuse=fuse)
    if batch_sizes and fastest():
        base = fastest()
        for b in batch_sizes:
            if b != base["batch_size"]:
                record(f"{base['rung']} b{b}", base["precision"], base["xla"], base["accumulation_steps"], b,
                       run_rung(config, base["precision"], base["xla"], base["accumulation_steps"], b,
                                tf32=base["tf32"], fuse=base["fuse"]), tf32=base["tf32"], fuse=base["fuse"])
        peer = fastest(peer=True)        # the peer's best at the same micro-batches
        for b in batch_sizes if peer else ():
            if b != peer["batch_size"]:
                record(f"{peer['rung']} b{b}", peer["precision"], peer["xla"], peer["accumulation_steps"], b,
                       run_keras_hub(config, peer["precision"], peer["xla"], b, peer["accumulation_steps"]), peer=True)
    best, peer = fastest(), fastest(peer=True)
    for pattern, pack in records:
        if not best:
            break
        result = run_rung(config, best["precision"], best["xla"], best["accumulation_steps"], best["batch_size"],
                          tf32=best["tf32"], fuse=best["fuse"], records=(pattern, pack))
        row = record(f"{best['rung']} on {'packed ' if pack else ''}records", best["precision"], best["xla"],
                     best["accumulation_steps"], best["batch_size"], result, diagnostic=True, tf32=best["tf32"],
                     fuse=best["fuse"])
        row.update(records=pattern, instances_per_row=pack)
        print(f"  {pattern}: {row['useful_tokens_per_second']:.0f} useful tokens/s "
              f"({1 - row['useful_tokens_per_second'] / row['tokens_per_second']:.1%} of the rows' tokens are padding), "
              f"{row['instances_per_second']:.2f} instances/s", flush=True)
    profiles = {}
    if FLAGS.profile_dir and best:       # the fastest of each side traced, the same number of updates
        where = os.path.join(FLAGS.profile_dir, "bert_tf")
        seconds = run_rung(config, best["precision"], best["xla"], best["accumulation_steps"], best["batch_size"],
                           profile_dir=where, tf32=best["tf32"], fuse=best["fuse"])
        sequences = TRACED_UPDATES * best["batch_size"] * best["accumulation_steps"]
        profiles["bert_tf"] = op_profile.report(best["rung"], where, seconds, sequences)
        if peer:
            where = os.path.join(FLAGS.profile_dir, "keras-hub")
            seconds = run_keras_hub(config, peer["precision"], peer["xla"], peer["batch_size"],
                                    peer["accumulation_steps"], profile_dir=where)
            sequences = TRACED_UPDATES * peer["batch_size"] * peer["accumulation_steps"]
            profiles["keras-hub"] = op_profile.report(peer["rung"], where, seconds, sequences)
        profiles["comparison"] = op_profile.print_comparison(profiles["bert_tf"], profiles.get("keras-hub"))
    busy_rungs = [r for r in rows if machine_load.busy(r.get("machine_load"))]
    busy_peaks = [s for ways in peak_loads.values() for seen in ways.values() for s in seen if machine_load.busy(s)]
    if busy_rungs or busy_peaks:
        loads = [r["machine_load"] for r in busy_rungs] + busy_peaks
        print(f"timed beside other work: {len(busy_rungs)} rungs ({', '.join(r['rung'] for r in busy_rungs)}) and "
              f"{len(busy_peaks)} peak measurements, with up to {max(s['other_cores'] for s in loads):.2f} cores of "
              f"other processes and {max(s['steal_cores'] for s in loads):.2f} of steal: those figures measure the "
              "neighbours too")
    else:
        print(f"the machine was quiet during every timed measurement (other processes and steal below "
              f"{machine_load.BUSY_WARNING_CORES} cores)")
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    if best:
        print(f"best bert_tf: {best['rung']} at {best['sequences_per_second']:.2f} seq/s, MFU {best['mfu']:.1%} "
              f"of the hardware peak")
    if best and peer:
        print(f"keras-hub best: {peer['rung']} at {peer['sequences_per_second']:.2f} seq/s; bert_tf / keras-hub = "
              f"{best['sequences_per_second'] / peer['sequences_per_second']:.2f}x")
    print(f"peak host memory {peak_rss_gb:.2f} GB")
    headroom = None
    if FLAGS.input_files:
        from bert_tf.tools import input_headroom
        headroom = input_headroom.measure(FLAGS.input_files, FLAGS.vocab_file, FLAGS.batch_size, FLAGS.max_seq_length,
                                          FLAGS.max_predictions_per_seq, FLAGS.input_seconds)
        consumed = best["sequences_per_second"] if best else float("nan")
        for kind, rate in headroom.items():
            print(f"input pipeline alone, {kind} masking: {rate:.0f} seq/s per rank = {rate / consumed:.1f}x the "
                  f"fastest rung's {consumed:.2f} seq/s ({'ok' if rate >= 10 * consumed else 'below'} the 10x goal)")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    report = {"model_preset": FLAGS.model_preset, "seq_length": FLAGS.max_seq_length, "batch_size": FLAGS.batch_size,
              "flops_per_sequence": flops_per_seq, "device": device, "matmul_peak_flops": peaks, "matmul_peak_samples": peak_samples,
              "matmul_peak_machine_load": peak_loads,
              "hardware_peak_flops": hw_peak, "hardware_peak_from": [hw_dtype, hw_way], "rungs": rows,
              "ratio_to_keras_hub": best["sequences_per_second"] / peer["sequences_per_second"]
              if best and peer else None,
              "input_pipeline_sequences_per_second": headroom, "peak_host_memory_gb": peak_rss_gb, "cpu_count": os.cpu_count(),
              "tune_batch_sizes": batch_sizes, "profiles": profiles,
              "command": "python run/benchmark.py " + " ".join(
                  f"--{k}={v if not isinstance(v, list) else ','.join(v)}" for k, v in (
                      *((k, FLAGS[k].value) for k in ("model_preset", "max_seq_length", "batch_size",
                                                      "accumulation_steps", "updates")),
                      ("rungs", rungs), ("tune_batch_sizes", FLAGS.tune_batch_sizes)))}
    with open(os.path.join(FLAGS.output_dir, "ladder.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot(report, os.path.join(FLAGS.output_dir, "ladder.png"))
    print(f"wrote {FLAGS.output_dir}/ladder.json and ladder.png")
    if FLAGS.write_flagfile:
        write_flagfile(FLAGS.write_flagfile, best, report)
        print(f"wrote {FLAGS.write_flagfile}: --precision={best['precision']} --xla={best['xla']} "
              f"({best['sequences_per_second']:.2f} seq/s)")
    if FLAGS.device_figures:
        planner.record_device_figures(FLAGS.device_figures, FLAGS.model_preset, FLAGS.max_seq_length,
                                      best["sequences_per_second"], device=report["device"].get("gpus", [
                                          report["device"].get("cpu")])[0], **{
                                          f"rung_{FLAGS.max_seq_length}": best["rung"],
                                          f"command_{FLAGS.max_seq_length}": report["command"]})
        print(f"wrote {FLAGS.device_figures}: {best['sequences_per_second']:.2f} seq/s at {FLAGS.max_seq_length} "
              f"({best['rung']}); python run/plan.py --model_preset={FLAGS.model_preset} "
              f"--device_figures={FLAGS.device_figures} takes it")


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = report["rungs"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.1), 4.5))
    bars = ax.bar([r["rung"].replace(" ", "\n") for r in rows], [r["sequences_per_second"] for r in rows],
                  color=["tab:orange" if r["peer"] else "tab:gray" if r["diagnostic"] else "tab:blue" for r in rows])
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['model_tflops']:.2f} TFLOP/s\nMFU {r['mfu']:.0%}", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("sequences / s")
    dev = report["device"]
    where = ", ".join(dev["gpus"]) if "gpus" in dev else f"{dev['cpu_count']} cores {dev['cpu']} " \
        f"[{' '.join(dev['cpu_features'])}]"
    ax.set_title(f"BERT-{report['model_preset']} seq {report['seq_length']} micro-batch {report['batch_size']}; "
                 f"orange: keras-hub, gray: diagnostic\n{where}; MFU vs hardware peak {report['hardware_peak_flops'] / 1e12:.2f} "
                 "TFLOP/s", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    cli.run(main)
