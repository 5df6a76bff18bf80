"""The pre-training loop: one function, `run(config)`, from flags' values to a trained checkpoint.

Every rank runs the same code. Rank 0 alone writes checkpoints, metrics and progress;
every rank reads checkpoints. Order of events:

    Horovod knobs -> hvd.init -> validate everything (fail before any work)
    -> model + optimizer variables -> restore (resume) or --init_checkpoint
    -> broadcast from rank 0 -> input at the restored position
    -> loop: accumulate micro-batches, allreduce once, update; log / eval / save / stop
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import tensorflow as tf

from bert_tf import (checkpoint_formats, checkpointing, distributed, input_pipeline, metrics, modeling,
                     tokenization, training)


@dataclasses.dataclass
class PretrainConfig(training.TrainConfig):
    """Everything a run needs: training.TrainConfig's update settings (precision, xla,
    accumulation_steps, optimizer, learning_rate, warmup_steps, total_steps, decay_power,
    weight_decay, clip_norm, seed) plus model, data, communication and output settings."""

    seed: int = 12345
    # model and data
    model_preset: str = "base"
    bert_config_file: str = ""
    vocab_file: str = ""
    do_lower_case: bool = True
    train_files: str = ""
    eval_files: str = ""
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    dynamic_masking: bool = False
    masked_lm_prob: float = 0.15
    mlm_only: bool = False
    batch_size: int = 32
    # communication
    fp16_allreduce: bool = False
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    horovod_timeline: str = ""
    horovod_autotune: bool = False
    network_interface: str = ""       # log bytes this node sent on it per update (e.g. eth0)
    # outputs
    checkpoint_dir: str = ""
    init_checkpoint: str = ""
    save_interval: int = 1000
    keep_last: int = 3
    log_interval: int = 100
    eval_interval: int = 0
    eval_batches: int = 0

    def validate(self):
        if not self.checkpoint_dir:
            raise ValueError("--checkpoint_dir is required")
        if not self.vocab_file:
            raise ValueError("--vocab_file is required")
        if self.bert_config_file and self.model_preset not in ("", "base"):
            raise ValueError("give --bert_config_file or --model_preset, not both")
        for name in ("batch_size", "accumulation_steps", "total_steps", "max_seq_length",
                     "max_predictions_per_seq", "save_interval", "log_interval", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ValueError("--eval_interval and --eval_batches must be >= 0")
        if self.eval_interval and not self.eval_files:
            raise ValueError("--eval_interval needs --eval_files")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ValueError(f"--max_predictions_per_seq={self.max_predictions_per_seq} exceeds "
                             f"--max_seq_length={self.max_seq_length}")
        if self.init_checkpoint:
            try:
                checkpoint_formats.locate(self.init_checkpoint)  # exists and is a format we read
            except (ValueError, FileNotFoundError) as e:
                raise type(e)(f"--init_checkpoint={self.init_checkpoint}: {e}") from None
        training.compute_dtype(self.precision)
        if self.fusion_threshold_mb is not None and self.fusion_threshold_mb < 0:
            raise ValueError(f"--fusion_threshold_mb must be >= 0, got {self.fusion_threshold_mb}")
        if self.cycle_time_ms is not None and self.cycle_time_ms <= 0:
            raise ValueError(f"--cycle_time_ms must be > 0, got {self.cycle_time_ms}")
        if self.network_interface and not os.path.exists(metrics.tx_counter(self.network_interface)):
            raise ValueError(f"--network_interface={self.network_interface}: no such interface here "
                             f"({metrics.tx_counter(self.network_interface)} not found)")


def build_model_config(cfg: PretrainConfig, vocab_size: int, init=None) -> modeling.BertConfig:
    """--bert_config_file, else the --init_checkpoint's own config (unless another --model_preset is
    asked for), else the preset; `init` is the read init checkpoint, checked against the result."""
    if cfg.bert_config_file:
        config = modeling.BertConfig.from_json_file(cfg.bert_config_file)
    elif init is not None and init.config is not None and cfg.model_preset in ("", "base"):
        config = init.config
    else:
        config = modeling.BertConfig.preset(cfg.model_preset, vocab_size=vocab_size)
    if init is not None:  # first: its errors name the checkpoint file
        checkpoint_formats.check_fits(init, config, vocab_size, cfg.vocab_file, cfg.max_seq_length)
    modeling.check_features_fit(config, cfg.max_seq_length, vocab_size)
    return config


class StopSignal:
    """Remembers SIGTERM/SIGINT so the loop can save and leave at the next step boundary."""

    def __init__(self):
        self.received = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name


def run(cfg: PretrainConfig, log=print):
    """Pre-trains; returns (trainer, final metrics dict)."""
    knobs = distributed.configure(cfg.fusion_threshold_mb, cfg.cycle_time_ms,
                                  cfg.horovod_timeline or None, cfg.horovod_autotune)
    hvd = distributed.init()
    rank, size = hvd.rank(), hvd.size()
    chief = rank == 0
    say = log if chief else (lambda *a, **k: None)

    cfg.validate()
    tokenizer = tokenization.Tokenizer.from_file(cfg.vocab_file, cfg.do_lower_case)
    # --init_checkpoint is read and checked before anything is written to --checkpoint_dir.
    init = checkpoint_formats.read(cfg.init_checkpoint) \
        if cfg.init_checkpoint and not tf.train.latest_checkpoint(cfg.checkpoint_dir) else None
    model_config = build_model_config(cfg, len(tokenizer), init)
    train_files = input_pipeline.list_files(cfg.train_files) if cfg.train_files else []
    if not train_files:
        raise ValueError("--train_files matched no files")
    input_pipeline.check_files(input_pipeline.shard_files(train_files, rank, size)[0], cfg.max_seq_length,
                               cfg.max_predictions_per_seq, cfg.dynamic_masking)
    eval_files = input_pipeline.list_files(cfg.eval_files) if cfg.eval_files else []
    if eval_files:
        input_pipeline.check_files(eval_files, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dynamic_masking)

    global_batch = cfg.batch_size * cfg.accumulation_steps * size
    say(f"ranks {size}  micro-batch {cfg.batch_size}/rank  accumulation {cfg.accumulation_steps}  "
        f"global batch {global_batch} sequences  seq {cfg.max_seq_length}  precision {cfg.precision}  "
        f"xla {cfg.xla}  fp16 allreduce {cfg.fp16_allreduce}"
        + ("  allreduce every micro-batch" if cfg.allreduce_every_micro_batch else ""))
    say("horovod: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in knobs.items()))

    tf.random.set_seed(cfg.seed)
    model = modeling.BertPretrainer(model_config, use_nsp=not cfg.mlm_only)
    trainer = training.Trainer(
        model,
        cfg,
        allreduce=distributed.make_gradient_allreduce(cfg.fp16_allreduce), seed_offset=rank)
    n_params = sum(int(tf.size(v)) for v in trainer.variables)
    say(f"model: {model_config.num_hidden_layers} layers, hidden {model_config.hidden_size}, "
        f"vocab {model_config.vocab_size}, {n_params / 1e6:.2f}M parameters")

    ckpts = checkpointing.Checkpoints(cfg.checkpoint_dir, trainer.checkpoint_items(), cfg.keep_last, is_writer=chief)
    samples_seen = 0
    latest = ckpts.latest()
    if latest:
        extra = ckpts.restore(latest)
        samples_seen = int(extra.get("samples_seen", int(trainer.step.numpy()) * global_batch))
        say(f"resumed from {latest} at step {int(trainer.step.numpy())}"
            + (" (--init_checkpoint ignored: resuming wins)" if cfg.init_checkpoint else ""))
    elif init is not None:
        fresh = checkpoint_formats.assign(model, init, log=say)   # says which head (if any) starts at random
        say(f"initialised encoder{'' if fresh else ' and heads'} from {init.path} ({init.format} format)")
    if chief:
        model_config.to_json_file(os.path.join(cfg.checkpoint_dir, "bert_config.json"))
    distributed.broadcast_variables(
        trainer.variables + list(trainer.optimizer.variables) + [trainer.step, trainer.skipped_steps]
        + (list(trainer.loss_scale.variables) if trainer.loss_scale else []), root_rank=0)

    masker = None
    if cfg.dynamic_masking:
        masker = input_pipeline.dynamic_masker(
            len(tokenizer), [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id],
            cfg.max_predictions_per_seq, cfg.masked_lm_prob, tokenizer.mask_id)
    # Resume position: each rank skips its share of the samples already consumed.
    skip = samples_seen // size // cfg.batch_size
    dataset = input_pipeline.make_dataset(train_files, cfg.batch_size, cfg.max_seq_length,
                                          cfg.max_predictions_per_seq, rank, size, seed=cfg.seed,
                                          masker=masker, skip_batches=skip)
    batches = iter(dataset)
    writer = metrics.MetricsWriter(cfg.checkpoint_dir, active=chief)
    evaluate = make_evaluator(trainer, cfg, eval_files, rank, size, masker)
    if init is not None and eval_files:  # where continued pre-training starts: the loaded model on your held-out data
        start_eval = evaluate(int(trainer.step.numpy()))
        writer.write(start_eval)
        say(f"held-out before training: MLM accuracy {start_eval.get('eval_mlm_accuracy', float('nan')):.4f}, "
            f"MLM loss {start_eval['eval_mlm_loss']:.4f}")

    stop = StopSignal()
    start_step = step = int(trainer.step.numpy())
    interval_start, interval_steps, sums, timing = time.time(), 0, {}, {}
    tx_start = metrics.read_tx_bytes(cfg.network_interface) if cfg.network_interface else 0
    last = {}
    writer.write({"kind": "run", "step": step, "ranks": size, "global_batch": global_batch,
                  "parameters": n_params, "config": dataclasses.asdict(cfg)})
    while step < cfg.total_steps:
        micro = [next(batches) for _ in range(cfg.accumulation_steps)]
        out = trainer.train_step(micro)
        step += 1
        samples_seen += global_batch
        interval_steps += 1
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_weight", "nsp_correct", "nsp_count"):
            if key in out:
                sums[key] = sums.get(key, 0.0) + float(out[key])
        for key, seconds in trainer.timing.items():
            timing[key] = timing.get(key, 0.0) + seconds
        stopping = _any_rank(stop.received is not None)
        if step % cfg.log_interval == 0 or step == cfg.total_steps or stopping:
            total = distributed.sum_across_ranks(sums)
            seconds = time.time() - interval_start
            record = {"kind": "train", "step": step,
                      "loss": total["loss"] / (interval_steps * size),
                      "mlm_loss": total["mlm_loss"] / (interval_steps * size),
                      **({"nsp_loss": total["nsp_loss"] / (interval_steps * size)} if "nsp_loss" in total else {}),
                      **metrics.accuracies(total),
                      "learning_rate": float(out["learning_rate"]), "grad_norm": float(out["grad_norm"]),
                      "skipped_steps": int(trainer.skipped_steps.numpy()),
                      "sequences_per_second": interval_steps * global_batch / seconds,
                      "tokens_per_second": interval_steps * global_batch * cfg.max_seq_length / seconds,
                      "samples_seen": samples_seen,
                      **{key: value / interval_steps for key, value in timing.items()}}  # rank 0's split
            if cfg.network_interface:
                tx_now = metrics.read_tx_bytes(cfg.network_interface)
                record["tx_bytes_per_update"] = (tx_now - tx_start) / interval_steps
                tx_start = tx_now
            if "loss_scale" in out:
                record["loss_scale"] = float(out["loss_scale"])
            writer.write(record)
            writer.progress(step, cfg.total_steps, record, start_step)
            last = record
            interval_start, interval_steps, sums, timing = time.time(), 0, {}, {}
        if cfg.eval_interval and step % cfg.eval_interval == 0 and step != cfg.total_steps:
            writer.write(evaluate(step))
        if step % cfg.save_interval == 0 or step == cfg.total_steps or stopping:
            path = ckpts.save(step, {"step": step, "samples_seen": samples_seen, "ranks": size,
                                     "global_batch": global_batch, "model_config": model_config.to_dict(),
                                     "vocab_size": len(tokenizer)})
            if path:
                say(f"saved {path}")
        if stopping:
            say(f"stopping at step {step} on {stop.received or 'a signal to another rank'}")
            break
    if eval_files and step == cfg.total_steps:
        final_eval = evaluate(step)
        writer.write(final_eval)
        last.update({k: v for k, v in final_eval.items() if k.startswith("eval_")})
    last["stopped_early"] = step < cfg.total_steps
    return trainer, last


def _any_rank(flag: bool) -> bool:
    import horovod.tensorflow as hvd
    if hvd.size() == 1:
        return flag
    return bool(hvd.allreduce(tf.constant(int(flag)), op=hvd.Max, name="stop_flag").numpy())


def make_evaluator(trainer, cfg, eval_files, rank, size, masker):
    """Returns evaluate(step) -> record with held-out MLM loss/accuracy, NSP accuracy, and the
    accuracy of always predicting the most frequent masked token (a data-only baseline)."""
    if not eval_files:
        return lambda step: {}
    forward = tf.function(lambda f: trainer.model(f, dtype=trainer.dtype, training=False), jit_compile=False)

    def evaluate(step):
        dataset = input_pipeline.make_dataset(eval_files, cfg.batch_size, cfg.max_seq_length,
                                              cfg.max_predictions_per_seq, rank, size, training=False,
                                              masker=masker)
        if cfg.eval_batches:
            dataset = dataset.take(cfg.eval_batches)
        sums, label_counts = {}, {}
        for features in dataset:
            out = forward(features)
            n = float(tf.shape(features["input_ids"])[0])
            for key in ("mlm_loss", "nsp_loss"):
                if key in out:
                    sums[key] = sums.get(key, 0.0) + float(out[key]) * n
            for key in ("mlm_correct", "mlm_weight", "nsp_correct", "nsp_count"):
                if key in out:
                    sums[key] = sums.get(key, 0.0) + float(out[key])
            sums["sequences"] = sums.get("sequences", 0.0) + n
            ids = tf.boolean_mask(features["masked_lm_ids"], features["masked_lm_weights"] > 0).numpy()
            for token in ids.tolist():
                label_counts[token] = label_counts.get(token, 0) + 1
        total = distributed.sum_across_ranks(sums)
        # most frequent masked token over all ranks' eval labels
        top = _global_label_counts(label_counts)
        record = {"kind": "eval", "step": step,
                  "eval_mlm_loss": total.get("mlm_loss", 0.0) / max(total.get("sequences", 0.0), 1.0),
                  "eval_sequences": total.get("sequences", 0.0)}
        acc = metrics.accuracies(total)
        record.update({f"eval_{k}": v for k, v in acc.items()})
        if "nsp_loss" in total:
            record["eval_nsp_loss"] = total["nsp_loss"] / max(total["sequences"], 1.0)
        if top:
            record["eval_most_frequent_token"] = top[0]
            record["eval_most_frequent_token_accuracy"] = top[1] / max(total.get("mlm_weight", 0.0), 1.0)
        return record

    return evaluate


def _global_label_counts(counts):
    """(token, count) of the most frequent label across ranks."""
    import numpy as np

    import horovod.tensorflow as hvd
    vocab = max(list(counts) + [0]) + 1
    local = np.zeros([vocab], np.float64)
    for token, n in counts.items():
        local[token] = n
    if hvd.size() > 1:
        size = int(hvd.allreduce(tf.constant(vocab), op=hvd.Max, name="eval_vocab").numpy())
        local = np.pad(local, (0, size - vocab))
        local = hvd.allreduce(tf.constant(local), op=hvd.Sum, name="eval_label_counts").numpy()
    if not local.any():
        return None
    return int(local.argmax()), float(local.max())

