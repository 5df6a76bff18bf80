"""The single-device optimisation ladder: how fast one BERT update runs with each lever, next to
the library a Keras user would pick instead, and the configuration to run on this machine.

    python run/benchmark.py --model_preset=base --max_seq_length=128 --micro_batch_size=8 \
        --output_dir=runs/bench_base
    python run/benchmark.py --model_preset=base --write_flagfile=node.flags   # once per node type

Rungs, each measured after warm-up (compile) steps, in one process:
    fp32, bf16, fp16    tf.function in float32, mixed_bfloat16, mixed_float16 (dynamic loss scaling)
    ...+xla             the same with jit_compile (the whole step under XLA)
    ...+fuse            TensorFlow's matmul kernels, the element-wise ops between them fused by XLA
                        auto-clustering (run/pretrain.py --fuse); needs training.FUSION_ENV at
                        launch, and then keras-hub's steps without XLA are auto-clustered too
                        (+autojit)
    best+accum          the fastest of the above, + gradient accumulation (--accumulation_steps)
    best-dropout        diagnostic: the fastest without dropout, what the stateless random numbers
                        cost (never chosen as the fastest; pre-training keeps dropout)
    (the optimizer update is XLA-compiled in every bert_tf rung: it has no matmul)
    keras-hub           the peer: keras_hub.models.BertMaskedLM (Keras 3 on TensorFlow), same
                        shapes, micro-batch and sparse masked positions; its best of fp32/bf16 x
                        XLA on/off, then that best with Keras's gradient accumulation (+accum) and
                        at each --tune_micro_batch_sizes micro-batch, so both sides are timed at
                        the same shapes
For each: sequences/s, tokens/s, model TFLOP/s (bert_tf/tools/flops.py), MFU against the hardware
peak (the best dense-matmul FLOP/s over every dtype, TensorFlow kernels and XLA, measured in this
run) and against the same dtype's peak, compile time, and what else the machine ran meanwhile (other
processes' cores and hypervisor steal, bert_tf/studies/machine_load.py: a figure timed beside other
work is flagged; on 2 cores one busy neighbour halves the matmul peak). Prints the CPU features (or
GPU) it saw and bert_tf's speed as a ratio to keras-hub's; writes ladder.json and ladder.png to
--output_dir.

--write_flagfile: also writes the fastest bert_tf precision/XLA as flags `run/pretrain.py
--flagfile` takes after the recipe's flagfile, with the measured sequences/s (pretrain logs its
own figure next to it). keras-hub is a benchmark-only dependency (requirements-dev.txt).

The ladder itself is bert_tf/studies/ladder.py (one rung: bert_tf/studies/rung.py; the rungs and
the flags, BenchmarkConfig: bert_tf/studies/ladder_config.py); the peer stays here, since the
library never imports Keras. Renamed in this release, the old names working for one release with a
warning: --input_files (TFRecords here, corpus text elsewhere) is --train_files, --records is
--rung_train_files.
"""

import dataclasses

from absl import flags

from bert_tf import ConfigError, cli
from bert_tf.studies import ladder, ladder_config, rung
from bert_tf.studies.ladder_config import BenchmarkConfig, default_rungs

cli.define_config_flags(BenchmarkConfig)
cli.define_renamed("batch_size", "micro_batch_size")
cli.define_renamed("tune_batch_sizes", "tune_micro_batch_sizes")
# TFRecords: --input_files is corpus text elsewhere
cli.define_renamed("input_files", "train_files")
cli.define_renamed("records", "rung_train_files")
FLAGS = flags.FLAGS


def check_rungs(rungs, gpu=False, fusion=False):
    """ladder_config.check_rungs, and the peer importable when its rung is asked for."""
    ladder_config.check_rungs(rungs, gpu, fusion)
    if "keras-hub" in rungs:
        try:
            import keras_hub  # noqa: F401  (the peer; benchmark-only dependency)
        except ImportError as e:
            raise ConfigError(
                f"--rungs=keras-hub needs keras-hub ({e}): pip install -r requirements-dev.txt, or "
                "leave the rung out"
            ) from None


def run_keras_hub(
    config, timing: rung.Timing, precision, xla, batch_size, accumulation=1, profile_dir=""
):
    """One update of keras_hub.models.BertMaskedLM (the peer) on the same shapes: same encoder
    size, dropout and masked positions; masked-LM loss only (no next-sentence head), AdamW. With
    accumulation > 1, Keras's own gradient accumulation: an update is that many train_on_batch
    calls."""
    import keras
    import keras_hub

    keras.mixed_precision.set_global_policy(precision)
    try:
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=config.vocab_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            hidden_dim=config.hidden_size,
            intermediate_dim=config.intermediate_size,
            dropout=config.hidden_dropout_prob,
            max_sequence_length=config.max_position_embeddings,
            num_segments=config.type_vocab_size,
        )
        model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        model.compile(
            optimizer=keras.optimizers.AdamW(
                1e-4, gradient_accumulation_steps=accumulation if accumulation > 1 else None
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[],
            jit_compile=xla,
        )
        b = rung.random_batch(
            batch_size, timing.max_seq_length, timing.max_predictions_per_seq, config.vocab_size, 0
        )
        x = {
            "token_ids": b["input_ids"],
            "segment_ids": b["segment_ids"],
            "padding_mask": b["input_mask"] > 0,
            "mask_positions": b["masked_lm_positions"],
        }
        step = lambda: [
            float(model.train_on_batch(x, b["masked_lm_ids"], sample_weight=b["masked_lm_weights"]))
            for _ in range(accumulation)
        ]
        if profile_dir:
            return rung.traced_updates(step, profile_dir, timing)
        result = rung.timed_updates(step, timing)
        # what Keras itself did: weight updates it applied per timed update (its `iterations` counts
        # applied updates, not calls, when it accumulates) and the accumulation it was given
        result["peer_applied_per_update"] = int(model.optimizer.iterations) / (
            timing.warmup_updates + timing.updates
        )
        result["peer_gradient_accumulation_steps"] = (
            model.optimizer.gradient_accumulation_steps or 1
        )
        return result
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main(_):
    cfg = cli.config_from_flags(BenchmarkConfig)
    if cfg.train_files and not cfg.vocab_file:  # named as given: --input_files until this release
        raise ConfigError(
            f"--{'input_files' if FLAGS['input_files'].present else 'train_files'} needs "
            "--vocab_file"
        )
    import tensorflow as tf

    from bert_tf.train import training

    gpu = bool(tf.config.list_physical_devices("GPU"))
    fusion = training.fusion_enabled()
    rungs = cfg.rungs if cfg.rungs is not None else default_rungs(gpu, fusion)
    if cfg.rungs is None and not fusion and not gpu:
        print(
            f"not timed: the +fuse rungs (start the benchmark with {training.FUSION_ENV} to time "
            "them)"
        )
    check_rungs(rungs, gpu, fusion)
    ladder.run(dataclasses.replace(cfg, rungs=rungs), run_keras_hub, fusion)


if __name__ == "__main__":
    cli.run(main)
