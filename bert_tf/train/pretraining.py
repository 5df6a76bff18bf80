"""Pre-training: `run(config)`, from flags' values to a trained checkpoint.

Every rank runs the same code. Rank 0 alone writes checkpoints, metrics and progress;
every rank reads checkpoints (elastic mode: rank 0 alone, the others take its state in the first
sync). Order of events:

    PretrainConfig checks its values (before any work) -> resolved() applies --fit_micro_batch
    -> Horovod knobs -> hvd.init
    -> build: check the records, model + optimizer variables, restore (resume) or
       --init_checkpoint, broadcast from rank 0, input at the restored position -> a Job
    -> train: the one loop (accumulate micro-batches, allreduce once, update; log / eval / save /
       stop), with a mode object (modes.Mode) for what differs: modes.Static (fixed ranks,
       SIGTERM/SIGINT save and stop) or elastic.Elastic (--elastic: commits, re-forming, weights
       digests; bert_tf/train/elastic.py)

--elastic: build leaves the agreement to the elastic state's first sync (no collective before it, so
a rank that joins later runs the same code).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from bert_tf.artifacts import checkpointing, metrics
from bert_tf.parallel import distributed, exchange_state, watchdog
from bert_tf.train import budget, elastic
from bert_tf.train.figures import IntervalMetrics
from bert_tf.train.modes import Mode, Static, StopSignal
from bert_tf.train.pretrain_config import PretrainConfig
from bert_tf.train.startup import Job, build


def run(cfg: PretrainConfig, log=print):
    """Pre-trains; returns (trainer, final metrics dict). `cfg` is what was asked; the run uses
    cfg.resolved(), and its run record holds both."""
    asked, cfg = cfg, cfg.resolved()
    if cfg.elastic:
        elastic.check_launch()  # before hvd.init: without an elastic launch it would wait forever
    knobs = distributed.configure(
        cfg.comm, cfg.horovod_timeline or None, cfg.horovod_autotune, cfg.elastic
    )
    hvd = distributed.init(cfg.intra_op_threads, cfg.inter_op_threads)
    say = log if distributed.rank() == 0 else metrics.silent
    say(distributed.describe(hvd))
    # elastic mode: Horovod re-forms without the lost rank
    if not cfg.elastic and distributed.size() > 1:
        watchdog.install(
            cfg.comm.collective_timeout_minutes,
            distributed.rank(),
            distributed.size(),
            None if "://" in cfg.checkpoint_dir else os.path.join(cfg.checkpoint_dir, ".watchdog"),
        )
    job = build(cfg, say, asked)
    if not cfg.elastic and distributed.size() > 1 and distributed.rank() == 0:
        _warn_on_save_time(cfg, job, say)
    say("horovod: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in knobs.items()))
    try:
        if cfg.elastic:
            return job.trainer, elastic.Elastic(cfg, job, log).run(
                lambda mode: train(cfg, job, mode)
            )
        with StopSignal() as stop:
            return job.trainer, train(
                cfg, job, Static(stop, job, say, cfg.stop_check_interval, solo_minutes(cfg))
            )
    finally:
        job.writer.close()


def solo_minutes(cfg: PretrainConfig) -> float:
    """The limit on the other ranks' wait for rank 0's solo work (a save, a restore):
    watchdog.solo_minutes."""
    return watchdog.solo_minutes(cfg.comm.collective_timeout_minutes, cfg.comm.save_timeout_minutes)


def _warn_on_save_time(cfg: PretrainConfig, job: Job, say):
    """Rank 0, at start-up: a warning when the latest checkpoint's JSON says a save took longer than
    the other ranks may wait for it (watchdog.timeout_warning); its figure carries on into the next
    checkpoint's JSON."""
    latest = job.ckpts.manager.latest_checkpoint if job.ckpts.manager is not None else None
    seconds = checkpointing.read_extra(latest).get("save_seconds") if latest else None
    if seconds:
        job.checkpoint_extra.setdefault("save_seconds", seconds)
    warning = watchdog.timeout_warning(
        cfg.comm.collective_timeout_minutes, cfg.comm.save_timeout_minutes, seconds
    )
    if warning:
        say(warning)


def train(cfg: PretrainConfig, job: Job, mode: Mode) -> dict:
    """The loop, from the restored step to --total_steps or a stop; returns the last record.
    `mode` (modes.Static or elastic.Elastic) supplies the rank's view (say, size, samples_seen,
    loss_weight) and the hooks where the modes differ; elastic mode runs it again after every
    re-forming."""
    trainer = job.trainer
    start_step = step = int(trainer.step.numpy())
    _begin(job, mode, step)
    say, samples_seen = mode.say, mode.samples_seen
    interval = _interval_metrics(cfg, job, mode)
    last: metrics.TrainRecord | None = None
    plan = _budget(cfg, job)
    end_step = cfg.total_steps if plan is None else sys.maxsize  # a budget ends on the clock
    why, spent = "", False  # a stop of our own: the budget or the target
    job.clock.start()
    while step < end_step:
        # Host synchronisation only at log, save and stop-check steps and elastic commits (GPU
        # kernels run ahead).
        logging = (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.total_steps
        saving = (step + 1) % cfg.save_interval == 0
        batch = mode.update_batch(step, samples_seen)
        interval.loss_weight = mode.loss_weight  # a batch warmup's shares change it (elastic mode)
        watchdog.at(f"update {step + 1}")
        out = trainer.train_step(job.input.next_update(), timed=logging)
        step += 1
        samples_seen += batch
        interval.add(out, trainer.timing)
        stopping = mode.stop_requested(step, logging or saving)
        if _budget_spent(cfg, job, plan, step, logging or saving):
            stopping, spent, why = True, True, f"the time budget ({cfg.time_budget_hours:g} h)"
        if logging or stopping:
            last = _log_interval(job, mode, interval, out, step, samples_seen, plan, start_step)
            reason = job.guard.observe(last.loss, int(trainer.consecutive_skips.numpy()))
            if reason and not stopping:
                step = rollback(cfg, job, mode, reason, step)
                interval = _interval_metrics(cfg, job, mode)
                if plan is not None:  # the rate from here (the step went back)
                    plan.mark = (step, job.clock.elapsed())
                continue
        mode.after_update(step)
        due = cfg.eval_interval and step % cfg.eval_interval == 0 and step != cfg.total_steps
        if due and not spent and _evaluate(cfg, job, step, say):
            stopping, why = True, "the target MLM accuracy"
        # while the guard suspects a spike, periodic saves and commits wait: the newest stays good
        periodic = step % cfg.save_interval == 0 and not job.guard.suspect
        if periodic or step == cfg.total_steps or stopping:
            _save(cfg, job, mode, step, samples_seen)
        if stopping:
            say(f"stopping at step {step} on {why or mode.stop_reason()}")
            break
        if not job.guard.suspect:
            mode.commit(step, samples_seen)
    stopped_early = step < cfg.total_steps and not why if plan is None else not spent
    return _finish(cfg, job, mode, step, last, stopped_early, step == cfg.total_steps or spent)


def _interval_metrics(cfg: PretrainConfig, job: Job, mode: Mode) -> IntervalMetrics:
    """A log interval's sums, from now (the start, and after a rollback)."""
    return IntervalMetrics(
        job.global_batch, cfg.max_seq_length, cfg.network_interface, mode.loss_weight
    )


def _budget(cfg: PretrainConfig, job: Job) -> budget.Budget | None:
    """--time_budget_hours: the plan that predicts the run's updates from its rate; else None."""
    if not cfg.time_budget_hours:
        return None
    return budget.Budget(
        cfg.time_budget_hours, cfg.warmup_steps, cfg.total_steps, warmup=job.warmup
    )


def _budget_spent(cfg: PretrainConfig, job: Job, plan, step, boundary) -> bool:
    """A collective on check steps (log, save, every --stop_check_interval updates): True on every
    rank when any rank's clock says the time budget is spent."""
    return (
        plan is not None
        and (boundary or step % cfg.stop_check_interval == 0)
        and distributed.any_rank(plan.spent(job.clock))
    )


def _evaluate(cfg: PretrainConfig, job: Job, step, say) -> bool:
    """An eval step: the held-out figures written; True when they reach the target."""
    if job.outer is not None:  # DiLoCo's fragments (or α > 0): every rank's weights made alike
        job.outer.agree(step, job.trainer.variables)
    evaluation = job.evaluate(step)
    job.writer.write(evaluation)
    return target_reached(cfg, job, evaluation, step, say)


def _save(cfg: PretrainConfig, job: Job, mode: Mode, step, samples_seen):
    """A checkpoint (rank 0 writes it; the collectives before it run on every rank)."""
    # a stop between synchronisations (or fragments out of step): every rank's weights made alike
    if job.outer is not None:
        job.outer.agree(step, job.trainer.variables)
    job.input.capture(job.position, samples_seen)  # static: a collective
    # every rank's own error buffers to its own file (no collective), before rank 0 names the
    # checkpoint
    exchange_state.save_own(
        job.trainer, cfg.checkpoint_dir, step, distributed.rank(), mode.size, cfg.keep_last
    )
    job.clock.stamp()
    start = time.monotonic()
    path = job.ckpts.save(
        step,
        {
            "step": step,
            "samples_seen": samples_seen,
            "ranks": mode.size,
            "exchange": exchange_state.record(job.trainer.config.comm),
            **job.checkpoint_extra,
        },
    )
    if path:
        seconds = time.monotonic() - start
        # in the next one's JSON, for a resumed run
        job.checkpoint_extra["save_seconds"] = round(seconds, 3)
        mode.say(f"saved {path} in {seconds:.1f} s")
    # the others wait for it here, labelled, under the solo work's limit
    if not cfg.elastic and mode.size > 1:
        distributed.barrier(f"rank 0's save of checkpoint {step}", solo_minutes(cfg))


def _begin(job: Job, mode: Mode, step):
    """A (re)start: the mode's view, the run record, and the loaded model's held-out figures when
    continued pre-training starts from --init_checkpoint."""
    mode.begin(step)
    job.writer.write({**job.run_record, "step": step, "ranks": mode.size})
    mode.started(step)
    if job.started_from_init and job.eval_files and step == 0:
        first = job.evaluate(step)
        job.writer.write(first)
        accuracy = float("nan") if first.eval_mlm_accuracy is None else first.eval_mlm_accuracy
        mode.say(
            f"held-out before training: MLM accuracy {accuracy:.4f}, MLM loss "
            f"{first.eval_mlm_loss:.4f}"
        )


def _log_interval(
    job: Job, mode: Mode, interval: IntervalMetrics, out, step, samples_seen, plan, start_step
) -> metrics.TrainRecord:
    """A log step (a collective): the interval's record (`out`: its last update's outputs)
    completed, the budget's schedule re-predicted (rank 0's prediction, on every rank), written and
    shown."""
    trainer = job.trainer
    last = dataclasses.replace(
        interval.record(step, out),
        skipped_steps=int(trainer.skipped_steps.numpy()),
        samples_seen=samples_seen,
        ranks=mode.size,
    )
    if plan is not None:
        trainer.schedule.assign(plan.schedule(plan.predict(step, start_step, job.clock)))
        distributed.broadcast_variables([trainer.schedule], root_rank=0)
        last = dataclasses.replace(last, budget_predicted_steps=float(trainer.schedule[1].numpy()))
    if job.masking_rate is not None:
        rate = job.masking_rate.follow(step, int(trainer.schedule[1].numpy()))
        last = dataclasses.replace(last, masked_lm_prob=round(rate, 6))
    job.writer.write(last)
    job.writer.progress(step, int(trainer.schedule[1].numpy()), last, start_step)
    return last


def _finish(
    cfg: PretrainConfig,
    job: Job,
    mode: Mode,
    step,
    last: metrics.TrainRecord | None,
    stopped_early,
    evaluate,
) -> dict:
    """After the loop: the mode's end, the final held-out evaluation, the ladder comparison. Returns
    the last train record as a dict (as metrics.jsonl holds it) with the final eval_ figures and
    stopped_early."""
    say = mode.say
    mode.end(step)
    summary = metrics.as_dict(last) if last is not None else {}
    if job.eval_files and evaluate:
        final_eval = job.evaluate(step)
        job.writer.write(final_eval)
        target_reached(cfg, job, final_eval, step, say)
        summary.update(
            {k: v for k, v in metrics.as_dict(final_eval).items() if k.startswith("eval_")}
        )
    summary["stopped_early"] = stopped_early
    # how the run ended (a race spanning sessions runs again only one cut short)
    job.writer.write({"kind": "end", "step": step, "stopped_early": bool(stopped_early)})
    if cfg.ladder_sequences_per_second and "sequences_per_second" in summary:
        say(
            f"measured {summary['sequences_per_second'] / mode.size:.2f} seq/s per rank (last "
            f"interval) vs the ladder's {cfg.ladder_sequences_per_second:.2f} for this "
            "configuration"
        )
    return summary


def target_reached(cfg, job, evaluation, step, say) -> bool:
    """--target_mlm_accuracy: True (and the time to train logged) when this evaluation reaches
    it."""
    accuracy = evaluation.eval_mlm_accuracy or 0.0
    if not cfg.target_mlm_accuracy or accuracy < cfg.target_mlm_accuracy:
        return False
    seconds = job.clock.elapsed()
    job.writer.write(
        {
            "kind": "target",
            "step": step,
            "target_mlm_accuracy": cfg.target_mlm_accuracy,
            "eval_mlm_accuracy": accuracy,
            "time_to_train_seconds": seconds,
        }
    )
    say(
        f"target reached: held-out MLM accuracy {accuracy:.4f} >= {cfg.target_mlm_accuracy:g} at "
        f"step {step}; time to train {metrics.hms(seconds)} ({seconds:.1f} s from the first "
        "update, evaluations included)"
    )
    return True


def rollback(cfg, job, mode, reason, step) -> int:
    """The divergence guard fired at `step`: back to the last good state (mode.rollback), the input
    left where it is (the window since then is skipped), the learning rate scaled; returns the step
    now."""
    bound = job.guard.older_than(step)
    job.guard.rolled_back(reason)  # raises Diverged after --max_rollbacks
    start = time.time()
    target = mode.rollback(bound)
    trainer = job.trainer
    trainer.lr_scale.assign(trainer.lr_scale * cfg.rollback_lr_scale)
    trainer.consecutive_skips.assign(0)
    back = int(trainer.step.numpy())
    job.guard.landed(step, back)
    seconds = time.time() - start
    scale = float(trainer.lr_scale.numpy())
    mode.say(
        f"divergence guard: {reason} at step {step}: rolled back to {target} (step {back}) in "
        f"{seconds:.1f} s; {step - back} updates undone, the data they read skipped; learning rate "
        f"x{scale:g} (rollback {job.guard.rollbacks} of at most {cfg.max_rollbacks})"
    )
    job.writer.write(
        {
            "kind": "rollback",
            "step": back,
            "from_step": step,
            "reason": reason,
            "target": target,
            "seconds": seconds,
            "lr_scale": scale,
            "rollbacks": job.guard.rollbacks,
        }
    )
    return back
