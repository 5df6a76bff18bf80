"""Pre-training: `run(config)`, from flags' values to a trained checkpoint.

Every rank runs the same code. Rank 0 alone writes checkpoints, metrics and progress;
every rank reads checkpoints (elastic mode: rank 0 alone, the others take its state in the first sync). Order of events:

    PretrainConfig checks its values (before any work) -> resolved() applies --fit_micro_batch
    -> Horovod knobs -> hvd.init
    -> build: check the records, model + optimizer variables, restore (resume) or
       --init_checkpoint, broadcast from rank 0, input at the restored position -> a Job
    -> train: the one loop (accumulate micro-batches, allreduce once, update; log / eval / save /
       stop), with a mode object for what differs: `Static` (fixed ranks, SIGTERM/SIGINT save and
       stop) or elastic.Elastic (--elastic: commits, re-forming, weights digests; bert_tf/elastic.py)

--elastic: build leaves the agreement to the elastic state's first sync (no collective before it, so a
rank that joins later runs the same code).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from bert_tf import (ConfigError, budget, checkpoint_formats, checkpointing, distributed, divergence, elastic,
                     flops, input_pipeline, metrics, modeling, planner, tokenization, training)


@dataclasses.dataclass
class PretrainConfig(training.TrainConfig):
    """Everything a run needs: training.TrainConfig's update settings (precision, xla,
    accumulation_steps, optimizer, learning_rate, warmup_steps, total_steps, decay_power,
    weight_decay, clip_norm, seed, comm) plus model, data, Horovod and output settings.
    Constructing one validates it (training.TrainConfig.validate, extended here)."""

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
    fit_micro_batch: int = 0          # re-split batch_size x accumulation_steps into micro-batches of this size
    recompute: str = "none"           # "layer": recompute each transformer layer in the backward pass (memory)
    # Horovod (the communication knobs are training.TrainConfig.comm)
    horovod_timeline: str = ""
    horovod_autotune: bool = False
    network_interface: str = ""       # log bytes this node sent on it per update (e.g. eth0)
    intra_op_threads: int = 0         # CPU thread pools per rank; 0: distributed.cpu_threads' default
    inter_op_threads: int = 0
    # outputs
    checkpoint_dir: str = ""
    init_checkpoint: str = ""
    save_interval: int = 1000
    keep_last: int = 3
    log_interval: int = 100
    wandb_project: str = ""           # also log to Weights & Biases (rank 0), besides TensorBoard
    wandb_mode: str = "online"        # or "offline": a run folder in checkpoint_dir/wandb, for `wandb sync`
    stop_check_interval: int = 10     # ranks agree on a stop signal every N updates (and at logs, saves)
    ladder_sequences_per_second: float = 0.0  # run/benchmark.py's figure for this configuration (its flagfile)
    eval_interval: int = 0
    eval_batches: int = 0
    # elastic mode (bert_tf/elastic.py)
    elastic: bool = False
    global_batch: int = 0             # elastic: sequences per update, whatever the rank count
    elastic_commit_interval: int = 10
    # the divergence guard (bert_tf/divergence.py)
    divergence_factor: float = 1.5    # roll back when the logged loss stays above this x its running median
    divergence_intervals: int = 3     # ... for this many logged intervals in a row
    max_skipped_updates: int = 25     # ... or when this many updates in a row were skipped (non-finite)
    max_rollbacks: int = 3
    rollback_lr_scale: float = 1.0
    # wall-clock (bert_tf/budget.py)
    time_budget_hours: float = 0.0    # the schedule follows the clock; stop, save and evaluate when spent
    target_mlm_accuracy: float = 0.0  # stop at the first evaluation that reaches it; log the time to train

    def guard_config(self) -> divergence.GuardConfig:
        return divergence.GuardConfig(self.divergence_factor, self.divergence_intervals, self.max_skipped_updates,
                                      self.max_rollbacks, self.rollback_lr_scale)

    def validate(self):
        metrics.check_wandb(self.wandb_project, self.wandb_mode)
        self.guard_config().validate()
        if self.recompute not in modeling.RECOMPUTE:
            raise ConfigError(f"--recompute={self.recompute}: valid are {', '.join(modeling.RECOMPUTE)}")
        if self.time_budget_hours < 0:
            raise ConfigError(f"--time_budget_hours must be >= 0, got {self.time_budget_hours}")
        if self.time_budget_hours and self.elastic:
            raise ConfigError("--time_budget_hours with --elastic: not supported (ranks come and go, and the "
                              "schedule's prediction is broadcast from a fixed rank 0)")
        if not 0 <= self.target_mlm_accuracy < 1:
            raise ConfigError(f"--target_mlm_accuracy must be in [0, 1), got {self.target_mlm_accuracy}")
        if self.target_mlm_accuracy and not (self.eval_files and self.eval_interval):
            raise ConfigError("--target_mlm_accuracy needs --eval_files and --eval_interval (how often to look)")
        super().validate()
        if not self.checkpoint_dir:
            raise ConfigError("--checkpoint_dir is required")
        if not self.vocab_file:
            raise ConfigError("--vocab_file is required")
        if self.bert_config_file and self.model_preset not in ("", "base"):
            raise ConfigError("give --bert_config_file or --model_preset, not both")
        for name in ("batch_size", "max_seq_length", "max_predictions_per_seq", "save_interval", "log_interval",
                     "keep_last", "stop_check_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.fit_micro_batch < 0:
            raise ConfigError(f"--fit_micro_batch must be >= 0, got {self.fit_micro_batch}")
        if self.fit_micro_batch and not self.elastic:   # the per-rank batch stays the recipe's
            per_rank = self.batch_size * self.accumulation_steps
            if per_rank % self.fit_micro_batch:
                raise ConfigError(
                    f"--fit_micro_batch={self.fit_micro_batch}: the per-rank batch --batch_size x "
                    f"--accumulation_steps = {self.batch_size} x {self.accumulation_steps} = {per_rank} is not a "
                    f"positive multiple of it; tune with run/benchmark.py --tune_batch_sizes=<divisors of "
                    f"{per_rank}> or drop the line")
        if self.ladder_sequences_per_second < 0:
            raise ConfigError(f"--ladder_sequences_per_second must be >= 0, got {self.ladder_sequences_per_second}")
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ConfigError("--eval_interval and --eval_batches must be >= 0")
        if self.eval_interval and not self.eval_files:
            raise ConfigError("--eval_interval needs --eval_files")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ConfigError(f"--max_predictions_per_seq={self.max_predictions_per_seq} exceeds "
                              f"--max_seq_length={self.max_seq_length}")
        if self.init_checkpoint:
            try:
                checkpoint_formats.locate(self.init_checkpoint)  # exists and is a format we read
            except ConfigError as e:
                raise ConfigError(f"--init_checkpoint={self.init_checkpoint}: {e}") from None
        if self.elastic:
            if not self.global_batch:
                raise ConfigError("--elastic needs --global_batch (sequences per update, kept whatever the rank "
                                  "count; --accumulation_steps is then derived from it at every resize)")
            elastic.micro_batches_per_update(self.global_batch, self.fit_micro_batch or self.batch_size)
            if self.accumulation_steps != 1:
                raise ConfigError(f"--accumulation_steps={self.accumulation_steps} with --elastic: each rank's "
                                  f"micro-batches per update follow from --global_batch and the rank count; leave "
                                  f"it at 1")
            if self.elastic_commit_interval < 1:
                raise ConfigError(f"--elastic_commit_interval must be >= 1, got {self.elastic_commit_interval}")
        elif self.global_batch:
            raise ConfigError("--global_batch is for --elastic; otherwise the global batch is --batch_size x "
                              "--accumulation_steps x ranks")
        distributed.cpu_threads(1, self.intra_op_threads, self.inter_op_threads)   # its errors, at start-up
        if self.network_interface and not os.path.exists(metrics.tx_counter(self.network_interface)):
            raise ConfigError(f"--network_interface={self.network_interface}: no such interface here "
                              f"({metrics.tx_counter(self.network_interface)} not found)")


    def resolved(self) -> "PretrainConfig":
        """A new config with --fit_micro_batch applied (this one, what was asked, is unchanged): the
        micro-batch becomes it, and --accumulation_steps re-splits the per-rank batch (elastic mode:
        --global_batch fixes the update, so only the micro-batch changes)."""
        if not self.fit_micro_batch:
            return self
        if self.elastic:
            return dataclasses.replace(self, batch_size=self.fit_micro_batch, fit_micro_batch=0)
        per_rank = self.batch_size * self.accumulation_steps
        return dataclasses.replace(self, batch_size=self.fit_micro_batch, fit_micro_batch=0,
                                   accumulation_steps=per_rank // self.fit_micro_batch)


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
    """Remembers SIGTERM/SIGINT so the loop can save and leave at the next step boundary; as a
    context manager, puts the handlers that were there before back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def handle(self, signum, frame):
        self.received = signal.Signals(signum).name


def _silent(*args, **kwargs):
    pass


def run(cfg: PretrainConfig, log=print):
    """Pre-trains; returns (trainer, final metrics dict). `cfg` is what was asked; the run uses
    cfg.resolved(), and its run record holds both."""
    asked, cfg = cfg, cfg.resolved()
    if cfg.elastic:
        elastic.check_launch()            # before hvd.init: without an elastic launch it would wait forever
    knobs = distributed.configure(cfg.comm, cfg.horovod_timeline or None, cfg.horovod_autotune)
    hvd = distributed.init(cfg.intra_op_threads, cfg.inter_op_threads)
    say = log if distributed.rank() == 0 else _silent
    say(distributed.describe(hvd))
    job = build(cfg, say, asked)
    say("horovod: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in knobs.items()))
    try:
        if cfg.elastic:
            return job.trainer, elastic.Elastic(cfg, job, log).run(lambda mode: train(cfg, job, mode))
        with StopSignal() as stop:
            return job.trainer, train(cfg, job, Static(stop, job.samples_seen, say, cfg.stop_check_interval))
    finally:
        job.writer.close()


@dataclasses.dataclass
class Inputs:
    """What a run reads, checked (`check_inputs`)."""
    tokenizer: tokenization.Tokenizer
    init: object                         # the read --init_checkpoint (checkpoint_formats.read), or None
    model_config: modeling.BertConfig
    train_files: list
    eval_files: list
    pack: int = 0                        # instances per row of the training records (0: google's layout)
    eval_pack: int = 0                   # the same for the evaluation records


def check_inputs(cfg: PretrainConfig, rank: int, size: int) -> Inputs:
    """What a run reads, checked before anything is built or written: the vocabulary,
    --init_checkpoint (read, unless resuming, and checked against the model config), the records of
    this rank's training files and every evaluation file."""
    tokenizer = tokenization.Tokenizer.from_file(cfg.vocab_file, cfg.do_lower_case)
    init = checkpoint_formats.read(cfg.init_checkpoint) \
        if cfg.init_checkpoint and not checkpointing.latest_intact(cfg.checkpoint_dir, log=lambda *_: None) else None
    model_config = build_model_config(cfg, len(tokenizer), init)
    train_files = input_pipeline.list_files(cfg.train_files) if cfg.train_files else []
    if not train_files:
        raise ConfigError("--train_files matched no files")
    pack = input_pipeline.check_files(input_pipeline.shard_files(train_files, rank, size)[0], cfg.max_seq_length,
                                      cfg.max_predictions_per_seq, cfg.dynamic_masking)
    packed = input_pipeline.full_sentence_folders(train_files)
    if packed and not cfg.mlm_only:
        raise ConfigError(f"{packed[0]}: its records are FULL-SENTENCES instances (summary.json: "
                          f"full_sentences), which have no sentence pairs to train next-sentence prediction on: "
                          f"pre-train them with --mlm_only")
    eval_files = input_pipeline.list_files(cfg.eval_files) if cfg.eval_files else []
    eval_pack = input_pipeline.check_files(eval_files, cfg.max_seq_length, cfg.max_predictions_per_seq,
                                           cfg.dynamic_masking) if eval_files else 0
    return Inputs(tokenizer=tokenizer, init=init, model_config=model_config, train_files=train_files,
                  eval_files=eval_files, pack=pack, eval_pack=eval_pack)


def dry_run(cfg: PretrainConfig, log=print):
    """--dry_run: check_inputs as a single rank that reads every file, and whether --checkpoint_dir
    can be written; then one line saying what the run would be. No Horovod, no model, nothing
    written: for checking a flagfile on a login node before the job waits in a queue."""
    cfg = cfg.resolved()
    inputs = check_inputs(cfg, rank=0, size=1)
    target = os.path.abspath(cfg.checkpoint_dir)
    while "://" not in cfg.checkpoint_dir and not os.path.exists(target):
        target = os.path.dirname(target)
    if "://" not in cfg.checkpoint_dir and not (os.path.isdir(target) and os.access(target, os.W_OK | os.X_OK)):
        raise ConfigError(f"--checkpoint_dir={cfg.checkpoint_dir} cannot be created: {target} is not a writable folder")
    latest = checkpointing.latest_intact(cfg.checkpoint_dir, log)
    config = inputs.model_config
    start = (f"resumes from {latest}" if latest else f"starts from {inputs.init.path} ({inputs.init.format} format)"
             if inputs.init else "starts from random weights")
    log(f"dry run: flags and inputs check out: model {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}; {len(inputs.train_files)} training and {len(inputs.eval_files)} evaluation "
        f"files of {cfg.max_seq_length}-token records; {cfg.batch_size} x {cfg.accumulation_steps} sequences per rank "
        f"per update (x ranks = global batch); {start}; checkpoints in {cfg.checkpoint_dir}")
    warning = precision_warning(cfg.precision, flops.device_description(), cfg.ladder_sequences_per_second)
    if warning:
        log(warning)


@dataclasses.dataclass
class Job:
    """Everything the loop needs, on every rank (`build`)."""
    trainer: training.Trainer
    input: object            # next_update() / capture(position, n) / resume(position, rank, size):
                             # input_pipeline.PerRankInput, or elastic.SharedStream with --elastic
    position: input_pipeline.InputPosition
    ckpts: checkpointing.Checkpoints
    writer: metrics.MetricsWriter
    evaluate: Callable[[int], dict]
    samples_seen: int        # sequences all ranks consumed before this run (restored)
    global_batch: int        # sequences per update
    parameters: int
    eval_files: list
    started_from_init: bool  # from --init_checkpoint, not resumed
    checkpoint_extra: dict   # the JSON beside each checkpoint
    run_record: dict         # metrics.jsonl's first record: what was asked and what it resolved to
    guard: divergence.Guard  # spikes and runs of skipped updates -> rollbacks
    clock: budget.RunClock   # training seconds over restarts (a checkpoint item)


def describe(cfg: PretrainConfig, size: int, global_batch: int) -> str:
    """The run's first log line: ranks, batch split, precision."""
    return (("elastic  " if cfg.elastic else f"ranks {size}  ")
            + f"micro-batch {cfg.batch_size}/rank  "
            + ("" if cfg.elastic else f"accumulation {cfg.accumulation_steps}  ")
            + f"global batch {global_batch} sequences  seq {cfg.max_seq_length}  precision {cfg.precision}  "
            f"xla {cfg.xla}{'  fuse' if cfg.fuse else ''}  fp16 allreduce {cfg.comm.fp16_allreduce}"
            + ("  allreduce every micro-batch" if cfg.comm.allreduce_every_micro_batch else "")
            + (f"  (ladder: {cfg.ladder_sequences_per_second:.2f} seq/s per rank)"
               if cfg.ladder_sequences_per_second else ""))


def make_input(cfg: PretrainConfig, files, masker, rank, size, seed, pack=0):
    """The training input: every rank's own shard, or elastic mode's shared stream (the same seed on
    every rank, newcomers included); pack: the records' instances per row."""
    if cfg.elastic:
        stream = elastic.make_shared_stream(files, cfg.batch_size, seed=cfg.seed)
        return elastic.SharedStream(stream, cfg.max_seq_length, cfg.max_predictions_per_seq, masker, pack=pack)
    dataset = input_pipeline.make_dataset(files, cfg.batch_size, cfg.max_seq_length, cfg.max_predictions_per_seq,
                                          rank, size, seed=seed, masker=masker, pack=pack)
    return input_pipeline.PerRankInput(dataset, cfg.accumulation_steps, distributed.gather_bytes)


def build(cfg: PretrainConfig, say, asked: PretrainConfig | None = None) -> Job:
    """Everything the loop needs, on every rank: checked inputs, the trainer restored (or
    initialised) and equal on all ranks, the input at the restored position, the outputs.
    `cfg` is resolved; `asked` what the user gave (the run record keeps both)."""
    rank, size = distributed.rank(), distributed.size()
    # --init_checkpoint and the records are read and checked before anything is written to --checkpoint_dir.
    inputs = check_inputs(cfg, rank, size)
    tokenizer, init, model_config = inputs.tokenizer, inputs.init, inputs.model_config
    global_batch = cfg.global_batch if cfg.elastic else cfg.batch_size * cfg.accumulation_steps * size
    say(describe(cfg, size, global_batch))
    warning = precision_warning(cfg.precision, flops.device_description(), cfg.ladder_sequences_per_second)
    if warning:
        say(warning)

    tf.random.set_seed(cfg.seed)
    model = modeling.BertPretrainer(model_config, use_nsp=not cfg.mlm_only, recompute=cfg.recompute)
    trainer = training.Trainer(model, cfg, allreduce=distributed.make_gradient_allreduce(cfg.comm.fp16_allreduce),
                               seed_offset=rank)
    parameters = sum(int(tf.size(v)) for v in trainer.variables)
    say(f"model: {model_config.num_hidden_layers} layers, hidden {model_config.hidden_size}, "
        f"vocab {model_config.vocab_size}, {parameters / 1e6:.2f}M parameters")

    position = input_pipeline.InputPosition()
    clock = budget.RunClock()
    ckpts = checkpointing.Checkpoints(cfg.checkpoint_dir, {**trainer.checkpoint_items(), "input_position": position,
                                                           "clock": clock}, cfg.keep_last, is_writer=rank == 0)
    # elastic: rank 0 alone reads the checkpoint; the others (and later newcomers) get the state by broadcast
    samples_seen = restore(cfg, trainer, ckpts, global_batch, init, say) if rank == 0 or not cfg.elastic else 0
    if rank == 0:
        model_config.to_json_file(os.path.join(cfg.checkpoint_dir, "bert_config.json"))
    if not cfg.elastic:
        distributed.broadcast_variables(trainer.state_variables(), root_rank=0)
    if cfg.time_budget_hours:
        say(budget_plan(cfg, size, global_batch, model_config, float(clock.seconds.numpy())))

    masker = None
    if cfg.dynamic_masking:
        masker = input_pipeline.dynamic_masker(
            len(tokenizer), [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id],
            cfg.max_predictions_per_seq, cfg.masked_lm_prob, tokenizer.mask_id)
    # Resume position: the saved iterator states (a seek, whatever the step); when they do not apply
    # (another rank count, the other mode), a fresh pass, reshuffled by the step (static runs) so it
    # does not replay the first pass's order.
    step = int(trainer.step.numpy())
    train_input = make_input(cfg, inputs.train_files, masker, rank, size, seed=cfg.seed, pack=inputs.pack)
    if samples_seen and not train_input.resume(position, rank, size):
        if not cfg.elastic:
            train_input = make_input(cfg, inputs.train_files, masker, rank, size, seed=cfg.seed + step,
                                     pack=inputs.pack)
        say(f"input: the checkpoint's position was saved by {position.saved_by()}, this run "
            f"{'is elastic' if cfg.elastic else f'has {size}'}: a fresh pass over the training files starts at "
            f"step {step} (records read since the last pass began may be read again)")
    run_record = {"kind": "run", "global_batch": global_batch, "parameters": parameters,
                  "config": dataclasses.asdict(asked or cfg), "resolved": dataclasses.asdict(cfg),
                  "command": "python " + shlex.join(sys.argv)}  # for the export's model card
    return Job(trainer=trainer, input=train_input, position=position, ckpts=ckpts,
               writer=metrics.MetricsWriter(cfg.checkpoint_dir, rank == 0, cfg.wandb_project, cfg.wandb_mode),
               evaluate=make_evaluator(trainer, cfg, inputs.eval_files, len(tokenizer), masker, inputs.eval_pack),
               samples_seen=samples_seen, global_batch=global_batch, parameters=parameters,
               eval_files=inputs.eval_files, started_from_init=init is not None,
               checkpoint_extra={"global_batch": global_batch, "model_config": model_config.to_dict(),
                                 "vocab_size": len(tokenizer)},
               run_record=run_record, guard=divergence.Guard(cfg.guard_config()), clock=clock)


# CPU flags that give a precision its own arithmetic (oneDNN); without them it is emulated.
NATIVE_CPU_FLAGS = {"mixed_bfloat16": ("avx512_bf16", "amx_bf16"), "mixed_float16": ("avx512_fp16", "amx_fp16")}


def precision_warning(precision, device: dict, ladder_sequences_per_second=0.0) -> str:
    """A warning when --precision has no hardware arithmetic on this CPU (allowed, but slow),
    with the ladder's measured figure when there is one; "" otherwise (or on GPUs)."""
    if "gpus" in device or precision not in NATIVE_CPU_FLAGS:
        return ""
    if any(flag in device.get("cpu_features", []) for flag in NATIVE_CPU_FLAGS[precision]):
        return ""
    measured = (f"run/benchmark.py measured {ladder_sequences_per_second:.2f} seq/s for it"
                if ladder_sequences_per_second else "run/benchmark.py measures what it costs")
    return (f"warning: --precision={precision} on a CPU without {' or '.join(NATIVE_CPU_FLAGS[precision])} "
            f"({device.get('cpu', 'unknown CPU')}): emulated and usually slower than float32; {measured}")


def restore(cfg: PretrainConfig, trainer, ckpts, global_batch, init, say) -> int:
    """Resumes from --checkpoint_dir's latest checkpoint, else starts the model from
    --init_checkpoint (`init`, already read and checked), else leaves it fresh; returns the
    samples already consumed."""
    latest = ckpts.latest(log=say)
    if latest:
        extra = ckpts.restore(latest)
        step = int(trainer.step.numpy())
        say(f"resumed from {latest} at step {step}"
            + (" (--init_checkpoint ignored: resuming wins)" if cfg.init_checkpoint else ""))
        samples_seen = int(ckpts.items["input_position"].samples_seen.numpy())
        # checkpoints written before the position moved into them kept it in the JSON file only
        return samples_seen or int(extra.get("samples_seen", step * global_batch))
    if init is not None:
        fresh = checkpoint_formats.assign(trainer.model, init, log=say)  # says which head (if any) starts at random
        say(f"initialised encoder{'' if fresh else ' and heads'} from {init.path} ({init.format} format)")
    return 0


class IntervalMetrics:
    """Sums one log interval's per-update outputs on the device (no fetch per update) and the
    timed updates' splits on this rank; `record` fetches the sums once, turns them into a
    "train" record (losses and accuracies over all ranks) and starts the next interval."""

    SUMMED = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_weight", "nsp_correct", "nsp_count", "sequences",
              "useful_tokens", "instances")

    def __init__(self, global_batch, seq_length, network_interface="", loss_weight=1.0):
        self.global_batch, self.seq_length, self.interface = global_batch, seq_length, network_interface
        # elastic mode with uneven shares: this rank's losses weighted like its gradients, so the
        # ranks' average is the mean over the whole global batch
        self.loss_weight = loss_weight
        self.tx_start = metrics.read_tx_bytes(network_interface) if network_interface else 0
        self._reset()

    def _reset(self):
        self.start, self.updates, self.sums, self.timing, self.timed = time.time(), 0, {}, {}, 0

    def add(self, out, timing):
        """out: one update's outputs (tensors stay on the device); timing: its split, or {}."""
        self.updates += 1
        for key in self.SUMMED:
            if key in out:
                value = tf.cast(out[key], tf.float64) * (self.loss_weight if training.is_mean(key) else 1.0)
                self.sums[key] = self.sums[key] + value if key in self.sums else value
        if timing:
            self.timed += 1
            for key, seconds in timing.items():
                self.timing[key] = self.timing.get(key, 0.0) + seconds

    def record(self, step, out) -> dict:
        """A collective: every rank calls it at the same step. `out`: the last update's outputs."""
        size = distributed.size()
        total = distributed.sum_across_ranks(self.sums)
        seconds = time.time() - self.start
        n = self.updates
        record = {"kind": "train", "step": step,
                  **{key: value / (n * size) for key, value in total.items() if training.is_mean(key)},
                  **metrics.accuracies(total),
                  "learning_rate": float(out["learning_rate"]), "grad_norm": float(out["grad_norm"]),
                  "sequences_per_second": n * self.global_batch / seconds,
                  "tokens_per_second": n * self.global_batch * self.seq_length / seconds,
                  **({"sequences": int(total["sequences"])} if "sequences" in total else {}),  # trained, all ranks
                  # non-padding tokens (and with packed rows, instances) over all ranks
                  **{f"{key}_per_second": float(total[key]) / seconds for key in ("useful_tokens", "instances")
                     if key in total},
                  **{key: value / self.timed for key, value in self.timing.items()}}  # this rank's split
        if self.interface:
            tx_now = metrics.read_tx_bytes(self.interface)
            record["tx_bytes_per_update"] = (tx_now - self.tx_start) / n
            self.tx_start = tx_now
        if "loss_scale" in out:
            record["loss_scale"] = float(out["loss_scale"])
        self._reset()
        return record


class Static:
    """The mode object of `train` for a fixed set of ranks (elastic.Elastic is the other): nothing to
    commit or re-form; a SIGTERM/SIGINT that reached any rank saves and stops every rank, agreed on
    every `check_interval` updates and at log and save steps (the only host synchronisation between
    log intervals)."""

    loss_weight = 1.0

    def __init__(self, stop: StopSignal, samples_seen, say, check_interval):
        self.stop, self.samples_seen, self.say, self.check_interval = stop, samples_seen, say, check_interval
        self.size = distributed.size()

    def begin(self, step):
        pass

    def started(self, step):
        pass

    def stop_requested(self, step, boundary) -> bool:
        """A collective on check steps: True on every rank when one received a signal."""
        return (boundary or step % self.check_interval == 0) and distributed.any_rank(self.stop.received is not None)

    def stop_reason(self) -> str:
        return self.stop.received or "a signal to another rank"

    def after_update(self, step):
        pass

    def commit(self, step, samples_seen):
        pass

    def end(self, step):
        pass

    def rollback(self, job, before_step=None) -> str:
        """The divergence guard: rank 0 restores the newest intact checkpoint (of a step before
        `before_step`), every rank takes its state."""
        rank0 = distributed.rank() == 0
        path = job.ckpts.latest(log=self.say, before_step=before_step) if rank0 else None
        if distributed.any_rank(rank0 and path is None):
            raise divergence.Diverged(f"the run diverged and {job.ckpts.directory} holds no intact checkpoint "
                                      + (f"before step {before_step}" if before_step is not None else "yet")
                                      + " to roll back to; lower --learning_rate, or save more often "
                                      "(--save_interval) and keep more (--keep_last)")
        if rank0:
            job.ckpts.restore(path)
        distributed.broadcast_variables(job.trainer.state_variables(), root_rank=0)
        return os.path.basename(path) if rank0 else "rank 0's checkpoint"


def train(cfg: PretrainConfig, job: Job, mode) -> dict:
    """The loop, from the restored step to --total_steps or a stop; returns the last record.
    `mode` (Static or elastic.Elastic) supplies the rank's view (say, size, samples_seen, loss_weight)
    and the hooks where the modes differ; elastic mode runs it again after every re-forming."""
    trainer, writer = job.trainer, job.writer
    start_step = step = int(trainer.step.numpy())
    mode.begin(step)
    say, samples_seen = mode.say, mode.samples_seen
    interval = IntervalMetrics(job.global_batch, cfg.max_seq_length, cfg.network_interface, mode.loss_weight)
    last = {}
    writer.write({**job.run_record, "step": step, "ranks": mode.size})
    mode.started(step)
    if job.started_from_init and job.eval_files and step == 0:  # continued pre-training: the loaded model
        first = job.evaluate(step)
        writer.write(first)
        say(f"held-out before training: MLM accuracy {first.get('eval_mlm_accuracy', float('nan')):.4f}, "
            f"MLM loss {first['eval_mlm_loss']:.4f}")
    plan = budget.Budget(cfg.time_budget_hours, cfg.warmup_steps, cfg.total_steps) if cfg.time_budget_hours else None
    end_step = cfg.total_steps if plan is None else sys.maxsize     # a budget ends on the clock
    why, spent = "", False                   # a stop of our own: the budget or the target
    job.clock.start()
    while step < end_step:
        # Host synchronisation only at log, save and stop-check steps and elastic commits (GPU kernels run ahead).
        logging = (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.total_steps
        saving = (step + 1) % cfg.save_interval == 0
        out = trainer.train_step(job.input.next_update(), timed=logging)
        step += 1
        samples_seen += job.global_batch
        interval.add(out, trainer.timing)
        stopping = mode.stop_requested(step, logging or saving)
        if plan is not None and (logging or saving or step % cfg.stop_check_interval == 0) \
                and distributed.any_rank(plan.spent(job.clock)):
            stopping, spent, why = True, True, f"the time budget ({cfg.time_budget_hours:g} h)"
        if logging or stopping:
            last = interval.record(step, out)
            last.update(skipped_steps=int(trainer.skipped_steps.numpy()), samples_seen=samples_seen, ranks=mode.size)
            if plan is not None:             # rank 0's prediction of the budget's updates, on every rank
                trainer.schedule.assign(plan.schedule(plan.predict(step, start_step, job.clock)))
                distributed.broadcast_variables([trainer.schedule], root_rank=0)
                last["budget_predicted_steps"] = float(trainer.schedule[1].numpy())
            writer.write(last)
            writer.progress(step, int(trainer.schedule[1].numpy()), last, start_step)
            reason = job.guard.observe(last["loss"], int(trainer.consecutive_skips.numpy()))
            if reason and not stopping:
                step = rollback(cfg, job, mode, reason, step)
                interval = IntervalMetrics(job.global_batch, cfg.max_seq_length, cfg.network_interface,
                                           mode.loss_weight)
                if plan is not None:
                    plan.mark = (step, job.clock.elapsed())     # the rate from here (the step went back)
                continue
        mode.after_update(step)
        if cfg.eval_interval and step % cfg.eval_interval == 0 and step != cfg.total_steps and not spent:
            evaluation = job.evaluate(step)
            writer.write(evaluation)
            if target_reached(cfg, job, evaluation, step, say):
                stopping, why = True, "the target MLM accuracy"
        # while the guard suspects a spike, periodic saves and commits wait: the newest stays a good one
        if step % cfg.save_interval == 0 and not job.guard.suspect or step == cfg.total_steps or stopping:
            job.input.capture(job.position, samples_seen)  # static: a collective
            job.clock.stamp()
            path = job.ckpts.save(step, {"step": step, "samples_seen": samples_seen, "ranks": mode.size,
                                         **job.checkpoint_extra})
            if path:
                say(f"saved {path}")
        if stopping:
            say(f"stopping at step {step} on {why or mode.stop_reason()}")
            break
        if not job.guard.suspect:
            mode.commit(step, samples_seen)
    mode.end(step)
    if job.eval_files and (step == cfg.total_steps or spent):
        final_eval = job.evaluate(step)
        writer.write(final_eval)
        target_reached(cfg, job, final_eval, step, say)
        last.update({k: v for k, v in final_eval.items() if k.startswith("eval_")})
    last["stopped_early"] = step < cfg.total_steps and not why if plan is None else not spent
    if cfg.ladder_sequences_per_second and "sequences_per_second" in last:
        say(f"measured {last['sequences_per_second'] / mode.size:.2f} seq/s per rank (last interval) vs "
            f"the ladder's {cfg.ladder_sequences_per_second:.2f} for this configuration")
    return last


def target_reached(cfg, job, evaluation, step, say) -> bool:
    """--target_mlm_accuracy: True (and the time to train logged) when this evaluation reaches it."""
    accuracy = evaluation.get("eval_mlm_accuracy", 0.0)
    if not cfg.target_mlm_accuracy or accuracy < cfg.target_mlm_accuracy:
        return False
    seconds = job.clock.elapsed()
    job.writer.write({"kind": "target", "step": step, "target_mlm_accuracy": cfg.target_mlm_accuracy,
                      "eval_mlm_accuracy": accuracy, "time_to_train_seconds": seconds})
    say(f"target reached: held-out MLM accuracy {accuracy:.4f} >= {cfg.target_mlm_accuracy:g} at step {step}; "
        f"time to train {metrics.hms(seconds)} ({seconds:.1f} s from the first update, evaluations included)")
    return True


def budget_plan(cfg, size, global_batch, model_config, spent_seconds) -> str:
    """The start-up line of a budgeted run: the planner's hours for --total_steps, and whether they fit."""
    hours = budget.planned_hours(cfg, size, distributed.local_size(), global_batch,
                                 planner.gradient_tensor_sizes(model_config, nsp=not cfg.mlm_only))
    text = (f"time budget {cfg.time_budget_hours:g} h ({metrics.hms(spent_seconds)} spent by earlier runs): the "
            f"learning-rate schedule follows the clock, stretched over the updates it holds")
    if hours is None:
        return text + ("; no --ladder_sequences_per_second (run/benchmark.py) to predict --total_steps from: the "
                       "first log interval measures the rate")
    text += (f"; the planner gives {hours:.2f} h for --total_steps={cfg.total_steps} at the ladder's "
             f"{cfg.ladder_sequences_per_second:.2f} seq/s per rank (10 Gbit/s between nodes assumed)")
    if hours > cfg.time_budget_hours:
        text += (f". WARNING: they will not fit: about {cfg.total_steps * cfg.time_budget_hours / hours:,.0f} "
                 f"updates will")
    return text


def rollback(cfg, job, mode, reason, step) -> int:
    """The divergence guard fired at `step`: back to the last good state (mode.rollback), the input left
    where it is (the window since then is skipped), the learning rate scaled; returns the step now."""
    bound = job.guard.older_than(step)
    job.guard.rolled_back(reason)             # raises Diverged after --max_rollbacks
    start = time.time()
    target = mode.rollback(job, bound)
    trainer = job.trainer
    trainer.lr_scale.assign(trainer.lr_scale * cfg.rollback_lr_scale)
    trainer.consecutive_skips.assign(0)
    back = int(trainer.step.numpy())
    job.guard.landed(step, back)
    seconds = time.time() - start
    scale = float(trainer.lr_scale.numpy())
    mode.say(f"divergence guard: {reason} at step {step}: rolled back to {target} (step {back}) in {seconds:.1f} s; "
             f"{step - back} updates undone, the data they read skipped; learning rate x{scale:g} "
             f"(rollback {job.guard.rollbacks} of at most {cfg.max_rollbacks})")
    job.writer.write({"kind": "rollback", "step": back, "from_step": step, "reason": reason, "target": target,
                      "seconds": seconds, "lr_scale": scale,
                      "rollbacks": job.guard.rollbacks})
    return back


def make_evaluator(trainer, cfg, eval_files, vocab_size, masker, pack=0):
    """Returns evaluate(step) -> record with held-out MLM loss/accuracy, NSP accuracy, and the
    accuracy of always predicting the most frequent masked token (a data-only baseline)."""
    if not eval_files:
        return lambda step: {}
    forward = tf.function(lambda f: trainer.model(f, dtype=trainer.dtype, training=False), jit_compile=False)

    def evaluate(step):
        dataset = input_pipeline.make_dataset(eval_files, cfg.batch_size, cfg.max_seq_length,
                                              cfg.max_predictions_per_seq, distributed.rank(), distributed.size(),
                                              training=False, masker=masker, pack=pack)
        if cfg.eval_batches:
            dataset = dataset.take(cfg.eval_batches)
        sums, label_counts = {}, np.zeros([vocab_size], np.float64)
        for features in dataset:
            out = forward(features)
            n = float(tf.shape(features["input_ids"])[0])
            for key, value in out.items():   # means weighted by the batch, counts as they are
                if key != "loss":
                    sums[key] = sums.get(key, 0.0) + float(value) * (n if training.is_mean(key) else 1.0)
            sums["sequences"] = sums.get("sequences", 0.0) + n
            ids = tf.boolean_mask(features["masked_lm_ids"], features["masked_lm_weights"] > 0).numpy()
            np.add.at(label_counts, ids, 1)
        total = distributed.sum_across_ranks(sums)
        # the most frequent masked token over all ranks' eval labels
        label_counts = distributed.sum_array_across_ranks(label_counts, name="eval_label_counts")
        record = {"kind": "eval", "step": step,
                  "eval_mlm_loss": total.get("mlm_loss", 0.0) / max(total.get("sequences", 0.0), 1.0),
                  "eval_sequences": total.get("sequences", 0.0)}
        acc = metrics.accuracies(total)
        record.update({f"eval_{k}": v for k, v in acc.items()})
        if "nsp_loss" in total:
            record["eval_nsp_loss"] = total["nsp_loss"] / max(total["sequences"], 1.0)
        if label_counts.any():
            record["eval_most_frequent_token"] = int(label_counts.argmax())
            record["eval_most_frequent_token_accuracy"] = label_counts.max() / max(total.get("mlm_weight", 0.0), 1.0)
        return record

    return evaluate
