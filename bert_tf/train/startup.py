"""What happens before the first update, on every rank: the inputs checked (`check_inputs`), the
model built and restored (or initialised) and equal on all ranks, the input at the restored
position; all of it handed to the loop as a `Job` (`build`). `dry_run` checks without building.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import Callable

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.artifacts import checkpoint_formats, checkpointing, metrics
from bert_tf.data import input_pipeline, tokenization
from bert_tf.parallel import auto_exchange, device, distributed, exchange_state, local_sgd
from bert_tf.model import modeling
from bert_tf.train import batch_warmup, budget, divergence, elastic, training
from bert_tf.train.evaluation import make_evaluator
from bert_tf.train.pretrain_config import PretrainConfig


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


@dataclasses.dataclass
class Inputs:
    """What a run reads, checked (`check_inputs`)."""

    tokenizer: tokenization.Tokenizer
    init: checkpoint_formats.Checkpoint | None  # the read --init_checkpoint, or None
    model_config: modeling.BertConfig
    train_files: list
    eval_files: list
    pack: int = 0  # instances per row of the training records (0: google's layout)
    eval_pack: int = 0  # the same for the evaluation records
    eval_masked: bool = False  # masked evaluation records under --dynamic_masking: read as they are


def check_inputs(cfg: PretrainConfig, rank: int, size: int) -> Inputs:
    """What a run reads, checked before anything is built or written: --network_interface, the
    vocabulary, --init_checkpoint (read, unless resuming, and checked against the model config), the
    records of this rank's training files and every evaluation file. The config's own checks
    (PretrainConfig.validate) look at values only; everything on disk or the network is looked at
    here."""
    if cfg.network_interface and not os.path.exists(metrics.tx_counter(cfg.network_interface)):
        raise ConfigError(
            f"--network_interface={cfg.network_interface}: no such interface here "
            f"({metrics.tx_counter(cfg.network_interface)} not found)"
        )
    if cfg.init_checkpoint:
        try:
            checkpoint_formats.locate(cfg.init_checkpoint)  # exists and is a format we read
        except ConfigError as e:
            raise ConfigError(f"--init_checkpoint={cfg.init_checkpoint}: {e}") from None
    tokenizer = tokenization.Tokenizer.from_file(cfg.vocab_file, cfg.do_lower_case)
    init = (
        checkpoint_formats.read(cfg.init_checkpoint)
        if cfg.init_checkpoint
        and not checkpointing.latest_intact(cfg.checkpoint_dir, log=lambda *_: None)
        else None
    )
    model_config = build_model_config(cfg, len(tokenizer), init)
    train_files = input_pipeline.list_files(cfg.train_files) if cfg.train_files else []
    if not train_files:
        raise ConfigError("--train_files matched no files")
    pack = input_pipeline.check_files(
        input_pipeline.shard_files(train_files, rank, size)[0],
        cfg.max_seq_length,
        cfg.max_predictions_per_seq,
        cfg.dynamic_masking,
    )
    packed = input_pipeline.full_sentence_folders(train_files)
    if packed and not cfg.mlm_only:
        raise ConfigError(
            f"{packed[0]}: its records are FULL-SENTENCES instances (summary.json: "
            f"full_sentences), which have no sentence pairs to train next-sentence prediction on: "
            f"pre-train them with --mlm_only"
        )
    eval_files = input_pipeline.list_files(cfg.eval_files) if cfg.eval_files else []
    # masked held-out records keep their masks under --dynamic_masking: recipes that mask at other
    # rates are compared on the same masked tokens (the budget recipe trains at 30%, evaluates at
    # 15%)
    eval_masked = (
        bool(eval_files) and cfg.dynamic_masking and input_pipeline.records_masked(eval_files[0])
    )
    eval_pack = (
        input_pipeline.check_files(
            eval_files,
            cfg.max_seq_length,
            cfg.eval_predictions(),
            cfg.dynamic_masking and not eval_masked,
        )
        if eval_files
        else 0
    )
    return Inputs(
        tokenizer=tokenizer,
        init=init,
        model_config=model_config,
        train_files=train_files,
        eval_files=eval_files,
        pack=pack,
        eval_pack=eval_pack,
        eval_masked=eval_masked,
    )


def dry_run(cfg: PretrainConfig, log=print):
    """--dry_run: check_inputs as a single rank that reads every file, and whether --checkpoint_dir
    can be written; then one line saying what the run would be. No Horovod, no model, nothing
    written: for checking a flagfile on a login node before the job waits in a queue."""
    cfg = cfg.resolved()
    inputs = check_inputs(cfg, rank=0, size=1)
    target = os.path.abspath(cfg.checkpoint_dir)
    while "://" not in cfg.checkpoint_dir and not os.path.exists(target):
        target = os.path.dirname(target)
    if "://" not in cfg.checkpoint_dir and not (
        os.path.isdir(target) and os.access(target, os.W_OK | os.X_OK)
    ):
        raise ConfigError(
            f"--checkpoint_dir={cfg.checkpoint_dir} cannot be created: {target} is not a writable "
            "folder"
        )
    latest = checkpointing.latest_intact(cfg.checkpoint_dir, log)
    config = inputs.model_config
    start = (
        f"resumes from {latest}"
        if latest
        else f"starts from {inputs.init.path} ({inputs.init.format} format)"
        if inputs.init
        else "starts from random weights"
    )
    log(
        f"dry run: flags and inputs check out: model {config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}, "
        f"vocab {config.vocab_size}; {len(inputs.train_files)} training and "
        f"{len(inputs.eval_files)} evaluation "
        f"files of {cfg.max_seq_length}-token records; {cfg.micro_batch_size} x "
        f"{cfg.accumulation_steps} sequences per rank "
        f"per update (x ranks = global batch); {start}; checkpoints in {cfg.checkpoint_dir}"
    )
    warning = device.precision_warning(
        cfg.precision, device.device_description(), cfg.ladder_sequences_per_second
    )
    if warning:
        log(warning)


@dataclasses.dataclass
class Job:
    """Everything the loop needs, on every rank (`build`)."""

    trainer: training.Trainer
    input: input_pipeline.TrainingInput  # PerRankInput, or elastic.SharedStream with --elastic
    position: input_pipeline.InputPosition
    ckpts: checkpointing.Checkpoints
    writer: metrics.MetricsWriter
    evaluate: Callable[[int], metrics.EvalRecord]
    samples_seen: int  # sequences all ranks consumed before this run (restored)
    global_batch: int  # sequences per update
    parameters: int
    eval_files: list
    started_from_init: bool  # from --init_checkpoint, not resumed
    exchange_record: (
        dict | None
    )  # elastic mode, rank 0: the exchange the restored checkpoint recorded
    checkpoint_extra: dict  # the JSON beside each checkpoint
    run_record: dict  # metrics.jsonl's first record: what was asked and what it resolved to
    guard: divergence.Guard  # spikes and runs of skipped updates -> rollbacks
    clock: budget.RunClock  # training seconds over restarts (a checkpoint item)
    warmup: batch_warmup.BatchWarmup | None = None  # --batch_warmup_sequences
    outer: local_sgd.OuterStep | None = None  # --local_updates (DiLoCo)


def make_batch_warmup(cfg: PretrainConfig, size: int, say) -> batch_warmup.BatchWarmup | None:
    """--batch_warmup_sequences on `size` ranks, checked against the run's length."""
    if not cfg.batch_warmup_sequences:
        return None
    if (
        cfg.elastic
    ):  # the global batch's micro-batches, whatever the ranks (elastic.Elastic.update_batch)
        warmup = batch_warmup.BatchWarmup(
            cfg.batch_warmup_sequences,
            cfg.global_batch_size // cfg.micro_batch_size,
            cfg.micro_batch_size,
            1,
        )
    else:
        warmup = batch_warmup.BatchWarmup(
            cfg.batch_warmup_sequences, cfg.accumulation_steps, cfg.micro_batch_size, size
        )
    if len(warmup.steps) >= cfg.total_steps:
        raise ConfigError(
            f"--batch_warmup_sequences={cfg.batch_warmup_sequences} takes {len(warmup.steps)} "
            "updates on "
            f"{size} rank(s), not fewer than --total_steps={cfg.total_steps}: a batch warmup "
            "longer than "
            f"the run"
        )
    rate = (
        cfg.ladder_sequences_per_second * size
    )  # the ladder's seq/s: how long the warmup's sequences take
    if (
        cfg.time_budget_hours
        and rate
        and cfg.batch_warmup_sequences / rate >= cfg.time_budget_hours * 3600
    ):
        raise ConfigError(
            f"--time_budget_hours={cfg.time_budget_hours:g} is too short for "
            f"--batch_warmup_sequences={cfg.batch_warmup_sequences}: at the ladder's "
            f"{cfg.ladder_sequences_per_second:g} seq/s per rank on {size} rank(s) the warmup "
            "alone takes "
            f"{cfg.batch_warmup_sequences / rate / 3600:.2f} h"
        )
    say(warmup.describe())
    return warmup


def describe(cfg: PretrainConfig, size: int, global_batch: int) -> str:
    """The run's first log line: ranks, batch split, precision."""
    return (
        ("elastic  " if cfg.elastic else f"ranks {size}  ")
        + f"micro-batch {cfg.micro_batch_size}/rank  "
        + ("" if cfg.elastic else f"accumulation {cfg.accumulation_steps}  ")
        + f"global batch {global_batch} sequences  seq {cfg.max_seq_length}  precision "
        f"{cfg.precision}  "
        f"xla {cfg.xla}{'  fuse' if cfg.fuse else ''}  gradients {describe_exchange(cfg.comm)}"
        + ("  allreduce every micro-batch" if cfg.comm.allreduce_every_micro_batch else "")
        + (
            f"  (ladder: {cfg.ladder_sequences_per_second:.2f} seq/s per rank)"
            if cfg.ladder_sequences_per_second
            else ""
        )
    )


def describe_exchange(comm) -> str:
    """--exchange (or --local_updates) in a few words, for the run's first log line."""
    if comm.local_updates:
        return (
            f"DiLoCo{' (each node one worker)' if comm.local_group == 'node' else ''}: the "
            "weights' change in "
            f"float16 every {comm.local_updates} updates (outer learning rate "
            f"{comm.outer_learning_rate:g}, Nesterov momentum {comm.outer_momentum:g})"
        )
    return (
        {
            "none": "float32 allreduce",
            "fp16": "float16 allreduce",
            "powersgd": f"PowerSGD rank {comm.powersgd_rank}",
            "onebit": "1-bit",
        }[comm.method]
        + (
            f" after {comm.compression_warmup_steps} uncompressed updates"
            if comm.compressed and comm.compression_warmup_steps
            else ""
        )
        + (", the optimizer's variance frozen from then on" if comm.method == "onebit" else "")
    )


def make_input(cfg: PretrainConfig, files, masker, rank, size, seed, pack=0):
    """The training input: every rank's own shard, or elastic mode's shared stream (the same seed on
    every rank, newcomers included); pack: the records' instances per row."""
    if cfg.elastic:
        stream = elastic.make_shared_stream(files, cfg.micro_batch_size, seed=cfg.seed)
        return elastic.SharedStream(
            stream, cfg.max_seq_length, cfg.max_predictions_per_seq, masker, pack=pack
        )
    dataset = input_pipeline.make_dataset(
        files,
        cfg.micro_batch_size,
        cfg.max_seq_length,
        cfg.max_predictions_per_seq,
        rank,
        size,
        seed=seed,
        masker=masker,
        pack=pack,
    )
    return input_pipeline.PerRankInput(
        dataset, cfg.accumulation_steps, distributed.gather_bytes, rank, size
    )


def build(cfg: PretrainConfig, say, asked: PretrainConfig | None = None) -> Job:
    """Everything the loop needs, on every rank: checked inputs, the trainer restored (or
    initialised) and equal on all ranks, the input at the restored position, the outputs.
    `cfg` is resolved; `asked` what the user gave (the run record keeps both)."""
    rank, size = distributed.rank(), distributed.size()
    # --init_checkpoint and the records are read and checked before anything is written to
    # --checkpoint_dir.
    inputs = check_inputs(cfg, rank, size)
    tokenizer, init, model_config = inputs.tokenizer, inputs.init, inputs.model_config
    warmup = make_batch_warmup(cfg, size, say)
    cfg = dataclasses.replace(cfg, comm=settle_exchange(cfg, model_config, rank, say))
    global_batch = (
        cfg.global_batch_size
        if cfg.elastic
        else cfg.micro_batch_size * cfg.accumulation_steps * size
    )
    say(describe(cfg, size, global_batch))
    warning = device.precision_warning(
        cfg.precision, device.device_description(), cfg.ladder_sequences_per_second
    )
    if warning:
        say(warning)

    tf.random.set_seed(cfg.seed)
    model = modeling.BertPretrainer(model_config, use_nsp=not cfg.mlm_only, recompute=cfg.recompute)
    trainer, outer = make_trainer(cfg, model, rank)
    parameters = sum(int(tf.size(v)) for v in trainer.variables)
    say(
        f"model: {model_config.architecture}, {model_config.num_hidden_layers} layers, hidden "
        f"{model_config.hidden_size}, "
        f"vocab {model_config.vocab_size}, {parameters / 1e6:.2f}M parameters"
    )

    position = input_pipeline.InputPosition()
    clock = budget.RunClock()
    items = {**trainer.checkpoint_items(), "input_position": position, "clock": clock}
    if outer is not None:
        items["outer_step"] = outer
    ckpts = checkpointing.Checkpoints(cfg.checkpoint_dir, items, cfg.keep_last, is_writer=rank == 0)
    # elastic: rank 0 alone reads the checkpoint; the others (and later newcomers) get the state by
    # broadcast
    samples_seen = (
        restore(cfg, trainer, ckpts, global_batch, init, say) if rank == 0 or not cfg.elastic else 0
    )
    if rank == 0:
        model_config.to_json_file(os.path.join(cfg.checkpoint_dir, "bert_config.json"))
    if not cfg.elastic:
        settle(cfg, trainer, outer, samples_seen, say)
    if cfg.time_budget_hours:
        say(
            budget.budget_plan(
                cfg,
                size,
                distributed.local_size(),
                global_batch,
                model_config,
                float(clock.seconds.numpy()),
            )
        )

    masker = None
    if cfg.dynamic_masking:
        masker = input_pipeline.dynamic_masker(
            len(tokenizer),
            [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id],
            cfg.max_predictions_per_seq,
            cfg.masked_lm_prob,
            tokenizer.mask_id,
        )
    train_input = resume_input(
        cfg, inputs, masker, position, samples_seen, int(trainer.step.numpy()), say
    )
    run_record = {
        "kind": "run",
        "global_batch": global_batch,
        "parameters": parameters,
        "config": as_record(asked or cfg),
        "resolved": as_record(cfg),
        "command": "python " + shlex.join(sys.argv),
    }  # for the export's model card
    return Job(
        trainer=trainer,
        input=train_input,
        position=position,
        ckpts=ckpts,
        writer=metrics.MetricsWriter(
            cfg.checkpoint_dir, rank == 0, cfg.wandb_project, cfg.wandb_mode
        ),
        evaluate=make_evaluator(
            trainer,
            cfg,
            inputs.eval_files,
            len(tokenizer),
            None if inputs.eval_masked else masker,
            inputs.eval_pack,
        ),
        samples_seen=samples_seen,
        global_batch=global_batch,
        parameters=parameters,
        eval_files=inputs.eval_files,
        started_from_init=init is not None,
        exchange_record=recorded_exchange(cfg) if cfg.elastic and rank == 0 else None,
        checkpoint_extra={
            "global_batch": global_batch,
            "model_config": model_config.to_dict(),
            "vocab_size": len(tokenizer),
        },
        run_record=run_record,
        guard=divergence.Guard(cfg),
        clock=clock,
        warmup=warmup,
        outer=outer,
    )


def as_record(cfg: PretrainConfig) -> dict:
    """The config as the run record holds it: dataclasses.asdict, the comm's as CommConfig.as_record
    writes it."""
    return {**dataclasses.asdict(cfg), "comm": cfg.comm.as_record()}


def recorded_exchange(cfg: PretrainConfig):
    """The exchange the latest intact checkpoint in --checkpoint_dir was trained with (its JSON;
    None: a fresh run, or a checkpoint from before it was recorded)."""
    latest = checkpointing.latest_intact(cfg.checkpoint_dir, log=lambda *_: None)
    return checkpointing.read_extra(latest).get("exchange") if latest else None


def settle_exchange(cfg: PretrainConfig, model_config, rank, say):
    """The CommConfig this run trains with: a resume keeps the exchange its checkpoint recorded
    under `auto` (exchange_state.settle_choice); `auto` with nothing recorded measures the link
    here, in the job. Static runs agree on rank 0's view now; elastic mode (no collective before the
    first sync) builds with the named method, or none under `auto`, and agrees at every start
    (elastic.Elastic.begin)."""
    if cfg.elastic:
        return (
            cfg.comm
            if cfg.comm.exchange != "auto"
            else dataclasses.replace(cfg.comm, exchange="none")
        )
    recorded = distributed.broadcast_object(recorded_exchange(cfg) if rank == 0 else None)
    comm, note = exchange_state.settle_choice(
        cfg.comm, recorded, lambda: resolve_exchange(cfg, model_config, say)
    )
    if note:
        say(note)
    return comm


def resolve_exchange(cfg: PretrainConfig, model_config, say):
    """--exchange=auto: the comm with the exchange chosen for this job (auto_exchange.resolve)."""
    return auto_exchange.resolve(
        cfg.comm,
        model_config,
        not cfg.mlm_only,
        cfg.micro_batch_size,
        cfg.accumulation_steps,
        cfg.max_seq_length,
        cfg.ladder_sequences_per_second,
        say,
    )


def make_trainer(cfg: PretrainConfig, model, rank):
    """The trainer with its gradient exchange (--exchange), or DiLoCo's outer step when
    --local_updates (the inner updates then exchange nothing, or only inside a node:
    --local_group=node). Returns (trainer, the outer step or None)."""
    if cfg.comm.local_updates:
        node = distributed.node_process_set() if cfg.comm.local_group == "node" else None
        # the node's ranks: one worker, its gradients averaged inside the node
        inner = (
            distributed.make_gradient_allreduce(name="node_grad", process_set=node)
            if node is not None
            else None
        )
        outer = local_sgd.OuterStep(
            model.trainable_variables,
            cfg.comm.outer_learning_rate,
            cfg.comm.outer_momentum,
            cfg.comm.local_updates,
            inner,
        )
        return training.Trainer(model, cfg, exchange=outer, seed_offset=rank), outer
    exchange = distributed.make_gradient_exchange(
        cfg.comm, model.trainable_variables, seed=cfg.seed
    )
    return training.Trainer(model, cfg, exchange=exchange, seed_offset=rank), None


def settle(cfg, trainer, outer, samples_seen, say):
    """A static run after restore (or init): every rank takes rank 0's state, then its own error
    buffers from its own file beside the checkpoint (--exchange); DiLoCo's first round starts from
    the shared weights."""
    distributed.broadcast_variables(
        trainer.state_variables() + (list(outer.variables) if outer else []), root_rank=0
    )
    if trainer.exchange.own() and samples_seen:
        say(
            exchange_state.restore(
                trainer,
                cfg.checkpoint_dir,
                int(trainer.step.numpy()),
                distributed.rank(),
                distributed.size(),
                distributed.gather_bytes,
                distributed.broadcast_variables,
            )
        )
    if outer is not None and not bool(outer.anchored.numpy()):
        outer.anchor_to(trainer.variables)


def resume_input(cfg: PretrainConfig, inputs: Inputs, masker, position, samples_seen, step, say):
    """The training input at the restored position: the saved iterator states (a seek, whatever the
    step); when they do not apply (another rank count, the other mode), a fresh pass, reshuffled by
    the step (static runs) so it does not replay the first pass's order."""
    rank, size = distributed.rank(), distributed.size()
    train_input = make_input(
        cfg, inputs.train_files, masker, rank, size, seed=cfg.seed, pack=inputs.pack
    )
    if samples_seen and not train_input.resume(position):
        if not cfg.elastic:
            train_input = make_input(
                cfg, inputs.train_files, masker, rank, size, seed=cfg.seed + step, pack=inputs.pack
            )
        say(
            f"input: the checkpoint's position was saved by {position.saved_by()}, this run "
            f"{'is elastic' if cfg.elastic else f'has {size}'}: a fresh pass over the training "
            "files starts at "
            f"step {step} (records read since the last pass began may be read again)"
        )
    return train_input


def restore(cfg: PretrainConfig, trainer, ckpts, global_batch, init, say) -> int:
    """Resumes from --checkpoint_dir's latest checkpoint, else starts the model from
    --init_checkpoint (`init`, already read and checked), else leaves it fresh; returns the
    samples already consumed."""
    latest = ckpts.latest(log=say)
    if latest:
        extra = ckpts.restore(latest)
        step = int(trainer.step.numpy())
        say(
            f"resumed from {latest} at step {step}"
            + (" (--init_checkpoint ignored: resuming wins)" if cfg.init_checkpoint else "")
        )
        samples_seen = int(ckpts.items["input_position"].samples_seen.numpy())
        # checkpoints written before the position moved into them kept it in the JSON file only
        return samples_seen or int(extra.get("samples_seen", step * global_batch))
    if init is not None:
        fresh = checkpoint_formats.assign(
            trainer.model, init, log=say
        )  # says which head (if any) starts at random
        heads_fresh = [
            part for part in fresh if part.endswith("head")
        ]  # a modern export's pooler is not a head
        say(
            f"initialised encoder{'' if heads_fresh else ' and heads'} from {init.path} "
            f"({init.format} format)"
        )
    return 0
