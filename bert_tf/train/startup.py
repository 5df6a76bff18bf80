"""What happens before the first update, on every rank: the inputs checked (preflight.check_inputs),
the model built and restored (or initialised) and equal on all ranks, the input at the restored
position; all of it handed to the loop as a `Job` (`build`)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import Callable

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.artifacts import checkpoint_formats, checkpointing, metrics
from bert_tf.data import input_pipeline
from bert_tf.parallel import auto_exchange, distributed, exchange_state, local_plan, local_sgd
from bert_tf.parallel.comm import warmup_updates
from bert_tf.parallel.device import device_description
from bert_tf.model import modeling
from bert_tf.train import batch_warmup, budget, divergence, elastic, masking, preflight, training
from bert_tf.train.evaluation import make_evaluator
from bert_tf.train.pretrain_config import PretrainConfig


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
    # elastic mode, rank 0: the exchange the restored checkpoint recorded
    exchange_record: dict | None
    checkpoint_extra: dict  # the JSON beside each checkpoint
    run_record: dict  # metrics.jsonl's first record: what was asked and what it resolved to
    guard: divergence.Guard  # spikes and runs of skipped updates -> rollbacks
    clock: budget.RunClock  # training seconds over restarts (a checkpoint item)
    warmup: batch_warmup.BatchWarmup | None = None  # --batch_warmup_sequences
    outer: local_sgd.OuterStep | None = None  # --local_updates (DiLoCo)
    masking_rate: input_pipeline.MaskingRate | None = None  # --masked_lm_prob_end


def make_batch_warmup(cfg: PretrainConfig, size: int, say) -> batch_warmup.BatchWarmup | None:
    """--batch_warmup_sequences on `size` ranks, checked against the run's length."""
    if not cfg.batch_warmup_sequences:
        return None
    if cfg.elastic:  # the global batch's micro-batches, whatever the ranks (Elastic.update_batch)
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
            f"updates on {size} rank(s), not fewer than --total_steps={cfg.total_steps}: a batch "
            "warmup longer than the run"
        )
    rate = cfg.ladder_sequences_per_second * size  # the ladder's: how long the warmup takes
    if (
        cfg.time_budget_hours
        and rate
        and cfg.batch_warmup_sequences / rate >= cfg.time_budget_hours * 3600
    ):
        raise ConfigError(
            f"--time_budget_hours={cfg.time_budget_hours:g} is too short for "
            f"--batch_warmup_sequences={cfg.batch_warmup_sequences}: at the ladder's "
            f"{cfg.ladder_sequences_per_second:g} seq/s per rank on {size} rank(s) the warmup "
            f"alone takes {cfg.batch_warmup_sequences / rate / 3600:.2f} h"
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
        f"{cfg.precision}  xla {cfg.xla}{'  fuse' if cfg.fuse else ''}  gradients "
        f"{describe_exchange(cfg.comm, cfg.total_steps)}"
        + ("  allreduce every micro-batch" if cfg.comm.allreduce_every_micro_batch else "")
        + (
            f"  (ladder: {cfg.ladder_sequences_per_second:.2f} seq/s per rank)"
            if cfg.ladder_sequences_per_second
            else ""
        )
    )


def describe_exchange(comm, total_steps=0) -> str:
    """--exchange (or --local_updates) in a few words, for the run's first log line (total_steps:
    the run's, for a compression warmup left to its default)."""
    if comm.local_updates:
        return local_plan.describe(comm)
    return (
        {
            "none": "float32 allreduce",
            "fp16": "float16 allreduce",
            "powersgd": f"PowerSGD rank {comm.powersgd_rank}",
            "onebit": "1-bit" if comm.onebit_signs else "1-bit's control (no signs)",
        }[comm.method]
        + (
            f" after {warmup_updates(comm, total_steps)} "
            + ("warmup" if comm.onebit_variance_kappa else "uncompressed")
            + " updates"
            if comm.compressed and warmup_updates(comm, total_steps)
            else ""
        )
        + (
            ", the optimizer's variance (LAMB: its trust ratios) frozen and the momentum sent from "
            f"then on{'' if comm.onebit_signs else ', averaged exactly in float32'}"
            if comm.method == "onebit"
            else ""
        )
        + (
            f"; 0/1 Adam's warmup: float32 only at the variance's updates (kappa "
            f"{comm.onebit_variance_kappa}), the gradient sent as signs between them"
            if comm.method == "onebit" and comm.onebit_variance_kappa
            else ""
        )
        + (
            f"; the variables matching {comm.onebit_live!r} averaged in float32 with a live "
            "variance throughout"
            if comm.method == "onebit" and comm.onebit_live
            else ""
        )
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
    inputs = preflight.check_inputs(cfg, rank, size)
    warmup = make_batch_warmup(cfg, size, say)
    cfg = dataclasses.replace(cfg, comm=settle_exchange(cfg, inputs.model_config, rank, say))
    global_batch = (
        cfg.global_batch_size
        if cfg.elastic
        else cfg.micro_batch_size * cfg.accumulation_steps * size
    )
    say(describe(cfg, size, global_batch))
    warning = preflight.precision_warning(cfg)
    if warning:
        say(warning)
    trainer, outer, parameters = make_model(cfg, inputs.model_config, rank, say)
    ckpts, position, clock = make_checkpoints(cfg, trainer, outer, rank)
    samples_seen = start_state(cfg, inputs, trainer, outer, ckpts, clock, global_batch, say)
    masking_rate = masking.scheduled_rate(cfg, trainer)
    masker = masking.make_masker(cfg, inputs.tokenizer, masking_rate)
    step = int(trainer.step.numpy())
    train_input = resume_input(cfg, inputs, masker, position, samples_seen, step, say)
    record = run_record(cfg, asked or cfg, global_batch, parameters)
    writer = metrics.MetricsWriter(cfg.checkpoint_dir, rank == 0, cfg.wandb_project, cfg.wandb_mode)
    vocab_size, eval_masker = len(inputs.tokenizer), None
    if not inputs.eval_masked:  # a scheduled rate: held-out rows at its end rate, fixed
        eval_masker = masking.make_masker(cfg, inputs.tokenizer, cfg.masked_lm_prob_end)
    evaluate = make_evaluator(
        trainer, cfg, inputs.eval_files, vocab_size, eval_masker, inputs.eval_pack
    )
    return Job(
        trainer=trainer,
        input=train_input,
        position=position,
        ckpts=ckpts,
        writer=writer,
        evaluate=evaluate,
        samples_seen=samples_seen,
        global_batch=global_batch,
        parameters=parameters,
        eval_files=inputs.eval_files,
        started_from_init=inputs.init is not None,
        exchange_record=recorded_exchange(cfg) if cfg.elastic and rank == 0 else None,
        checkpoint_extra={
            "global_batch": global_batch,
            "model_config": inputs.model_config.to_dict(),
            "vocab_size": vocab_size,
        },
        run_record=record,
        guard=divergence.Guard(cfg),
        clock=clock,
        warmup=warmup,
        outer=outer,
        masking_rate=masking_rate,
    )


def make_model(cfg: PretrainConfig, model_config: modeling.BertConfig, rank: int, say):
    """The model (seeded by --seed) in its trainer; returns (trainer, DiLoCo's outer step or None,
    the parameter count)."""
    tf.random.set_seed(cfg.seed)
    model = modeling.BertPretrainer(model_config, use_nsp=not cfg.mlm_only, recompute=cfg.recompute)
    trainer, outer = make_trainer(cfg, model, rank)
    parameters = sum(int(tf.size(v)) for v in trainer.variables)
    say(
        f"model: {model_config.architecture}, {model_config.num_hidden_layers} layers, hidden "
        f"{model_config.hidden_size}, vocab {model_config.vocab_size}, {parameters / 1e6:.2f}M "
        f"parameters"
    )
    return trainer, outer, parameters


def make_checkpoints(cfg: PretrainConfig, trainer, outer, rank: int):
    """--checkpoint_dir's checkpoints of the trainer, the input position, the run's clock and
    DiLoCo's outer step; returns (checkpoints, position, clock), the last two still fresh."""
    position = input_pipeline.InputPosition()
    clock = budget.RunClock()
    items = {**trainer.checkpoint_items(), "input_position": position, "clock": clock}
    if outer is not None:
        items["outer_step"] = outer
    ckpts = checkpointing.Checkpoints(cfg.checkpoint_dir, items, cfg.keep_last, is_writer=rank == 0)
    return ckpts, position, clock


def start_state(
    cfg: PretrainConfig,
    inputs: preflight.Inputs,
    trainer,
    outer,
    ckpts,
    clock,
    global_batch: int,
    say,
) -> int:
    """The state the run starts from: restored (or initialised), the model config written beside
    it, static runs' ranks made equal; the time budget's plan said. Returns the samples already
    consumed."""
    rank, size = distributed.rank(), distributed.size()
    # elastic: rank 0 alone reads the checkpoint; the others (and later newcomers) get the state by
    # broadcast
    samples_seen = (
        restore(cfg, trainer, ckpts, global_batch, inputs.init, say)
        if rank == 0 or not cfg.elastic
        else 0
    )
    if rank == 0:
        inputs.model_config.to_json_file(os.path.join(cfg.checkpoint_dir, "bert_config.json"))
    if not cfg.elastic:
        settle(cfg, trainer, outer, samples_seen, say)
    if cfg.time_budget_hours:
        seconds = float(clock.seconds.numpy())
        say(
            budget.budget_plan(
                cfg, size, distributed.local_size(), global_batch, inputs.model_config, seconds
            )
        )
    return samples_seen


def run_record(cfg: PretrainConfig, asked: PretrainConfig, global_batch: int, parameters) -> dict:
    """metrics.jsonl's first record (the export's model card reads it): what was asked, what it
    resolved to, the command line and the machine (a race spanning sessions checks it)."""
    return {
        "kind": "run",
        "global_batch": global_batch,
        "parameters": parameters,
        "config": as_record(asked),
        "resolved": as_record(cfg),
        "command": "python " + shlex.join(sys.argv),
        "device": device_description(),
    }


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
        outer = local_sgd.make(cfg.comm, model, inner)
        trainer = training.Trainer(model, cfg, exchange=outer, seed_offset=rank)
        outer.count_on(trainer.step)  # the first --local_updates_after updates are synchronous
        return trainer, outer
    exchange = distributed.make_gradient_exchange(
        cfg.comm, model.trainable_variables, seed=cfg.seed, total_steps=cfg.total_steps
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


def resume_input(
    cfg: PretrainConfig, inputs: preflight.Inputs, masker, position, samples_seen, step, say
):
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
            f"files starts at step {step} (records read since the last pass began may be read "
            "again)"
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
        # says which head (if any) starts at random; a modern export's pooler is not a head
        fresh = checkpoint_formats.assign(trainer.model, init, log=say)
        heads_fresh = [part for part in fresh if part.endswith("head")]
        say(
            f"initialised encoder{'' if heads_fresh else ' and heads'} from {init.path} "
            f"({init.format} format)"
        )
    return 0
