"""Fine-tunes a BERT on SQuAD v1.1 or v2.0, writes predictions.json (and null_odds.json for v2.0) as
the official evaluation scripts read them, and scores them the way those scripts do.

    python run/squad.py --version=1.1 --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
        --init_checkpoint=runs/base_phase2 --vocab_file=vocab.txt --output_dir=runs/squad11
    python run/squad.py --version=2.0 --train_file=train-v2.0.json --predict_file=dev-v2.0.json ...
    mpirun -np 2 python run/squad.py ...                      # data-parallel, like pre-training

Defaults: Devlin et al. (2019), section 4.2: 3 epochs, learning rate 5e-5, batch 32, windows of 384
tokens every 128, questions of at most 64. Writes eval.json (exact match and F1 in %, v2.0 with
HasAns/NoAns and the best no-answer thresholds) beside the predictions.
"""

import dataclasses
import json
import os

from bert_tf import ConfigError, cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class SquadConfig:
    """run/squad.py's flags: the files, where it starts from, the windows, the recipe and the
    answers."""

    version: str = knob(
        "1.1", "SQuAD version (2.0: unanswerable questions).", choices=["1.1", "2.0"]
    )
    train_file: str = knob(
        "",
        "SQuAD JSON to fine-tune on (empty: predict with an untrained span head, the floor a "
        "fine-tuned one must beat).",
    )
    predict_file: str | None = knob(None, "SQuAD JSON to predict and score.", required=True)
    start: knobs.FinetuneStart = knobs.FinetuneStart()
    max_seq_length: int = knob(384, "Tokens per window: [CLS] question [SEP] context [SEP].")
    doc_stride: int = knob(128, "A long context's next window starts this many tokens later.")
    max_query_length: int = knob(64, "Longer questions are cut to this many tokens (and counted).")
    learning_rate: float = knob(5e-5, "AdamW peak learning rate.")
    global_batch_size: int = knob(32, "Windows per optimizer update over all ranks.")
    epochs: float = knobs.epochs(3.0)
    warmup_fraction: float = knob(
        0.1, "Linear warmup over this fraction of the updates, then linear decay."
    )
    seed: int = knob(0, "Seed for the head's initialisation, order and dropout.")
    precision: str = knob(
        "float32", "Compute precision.", choices=["float32", "mixed_bfloat16", "mixed_float16"]
    )
    xla: bool = knob(False, "Compile the forward/backward pass and the update with XLA.")
    n_best_size: int = knob(20, "Spans considered per window and kept per question.")
    max_answer_length: int = knob(30, "Longest answer, in tokens.")
    null_score_diff_threshold: float = knob(
        0.0,
        'v2.0: answer "" when the no-answer score exceeds the best span\'s '
        "by more than this (eval.json's best_f1_thresh tunes it on dev).",
    )
    output_dir: str | None = knobs.output_dir(
        "predictions.json, null_odds.json, nbest_predictions.json, eval.json", required=True
    )
    export_model: bool = knob(
        False,
        "Also write the fine-tuned model to <output_dir>/model/: google-research/bert's names "
        "(cls/squad/...) and a transformers BertForQuestionAnswering directory.",
    )


cli.define_config_flags(SquadConfig)
cli.define_renamed("batch_size", "global_batch_size")


def main(argv):
    from bert_tf.parallel import distributed
    from bert_tf.tasks import finetuning

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    cfg = cli.config_from_flags(SquadConfig)
    tokenizer, init, config = cli.finetune_start(cfg.start, cfg.max_seq_length)
    recipe = _recipe(cfg)
    hvd = distributed.init()
    rank, size = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *a, **k: None)
    task = _task(cfg, log)
    outcome = finetuning.run(
        task,
        tokenizer,
        config,
        init,
        recipe,
        finetuning.Distributed(
            rank,
            size,
            distributed.make_gradient_allreduce(False, name="squad"),
            distributed.broadcast_variables,
        ),
    )
    if rank != 0:
        return
    _write_outputs(cfg, init, task, outcome)


def _recipe(cfg):
    """The fine-tuning settings (finetuning.Recipe) the flags give."""
    from bert_tf.tasks import finetuning

    return finetuning.Recipe(
        learning_rate=cfg.learning_rate,
        global_batch=cfg.global_batch_size,
        epochs=cfg.epochs,
        warmup_fraction=cfg.warmup_fraction,
        max_seq_length=cfg.max_seq_length,
        seed=cfg.seed,
        precision=cfg.precision,
        xla=cfg.xla,
    )


def _task(cfg, log):
    """The squad.SquadTask of the flags' files, every input read before any training."""
    from bert_tf.tasks import squad

    predict_examples = squad.read_examples(cfg.predict_file, cfg.version, training=False, log=log)
    train_examples = (
        squad.read_examples(cfg.train_file, cfg.version, training=True, log=log)
        if cfg.train_file
        else None
    )
    with open(cfg.predict_file, encoding="utf-8") as f:
        dataset = json.load(f)["data"]  # what the official scripts score the answers against
    return squad.SquadTask(
        predict_examples,
        train_examples,
        squad.Windowing(cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length),
        cfg.version,
        cfg.n_best_size,
        cfg.max_answer_length,
        cfg.null_score_diff_threshold,
        dataset,
        log,
    )


def _write_outputs(cfg, init, task, outcome) -> None:
    """Rank 0: the predictions' files, the model (--export_model) and eval.json; the scores
    printed."""
    from bert_tf.tasks import finetuning, squad_answers

    answers, scores = outcome.predictions, outcome.metrics
    squad_answers.write_predictions(
        cfg.output_dir, answers.text, answers.null_odds, answers.nbest, cfg.version
    )
    if cfg.export_model:
        finetuning.export(
            outcome.model,
            cfg.start.vocab_file,
            os.path.join(cfg.output_dir, "model"),
            do_lower_case=cfg.start.do_lower_case,
        )
    report = {
        "version": cfg.version,
        "scores": scores,
        **task.report(outcome),
        "init": init.path if init is not None else "random",
    }
    with open(os.path.join(cfg.output_dir, "eval.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(
        "SQuAD "
        + cfg.version
        + ": "
        + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in scores.items()
        ),
        flush=True,
    )


if __name__ == "__main__":
    cli.run(main)
