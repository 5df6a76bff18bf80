"""Fine-tunes and scores a BERT on GLUE: every task's dev metrics as GLUE defines them, the GLUE
score, and the server's submission files for the test sets.

    python run/glue.py --tasks=all --data_dir=glue_data --init_checkpoint=runs/base_phase2 \
        --vocab_file=vocab.txt --output_dir=runs/glue     # the recipe: 2e-5, batch 32, 3 epochs
    python run/glue.py --tasks=rte,mrpc,stsb,cola ... --learning_rates=5e-5,3e-5,2e-5 \
        --seeds=1,2,3,4,5 --epoch_counts=2,3              # sweeps: every combination, each seed
    mpirun -np 2 python run/glue.py ...                   # data-parallel, like pre-training

--data_dir is the folder the standard GLUE download writes (CoLA/, SST-2/, MRPC/, STS-B/, QQP/,
MNLI/, QNLI/, RTE/, WNLI/); train and dev files are required, test files optional (copies of GLUE
often lack them). Writes glue.json and glue.md (per task and setting: dev metrics as mean ± std and
median over the seeds; which setting is selected, on dev; which tasks had no test file), and
submission/<Task>.tsv from the selected run of each task that has its test file.
"""

import dataclasses
import json
import os

from bert_tf import ConfigError, cli, knob, knobs


@dataclasses.dataclass(frozen=True)
class GlueConfig:
    """run/glue.py's flags: the tasks, where they start from, the sweep and the recipe's other
    settings."""

    tasks: list[str] = knob(
        ["all"],
        "Comma-separated GLUE tasks (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) or all.",
    )
    data_dir: str | None = knob(None, "The GLUE download's folder.", required=True)
    start: knobs.FinetuneStart = knobs.FinetuneStart()
    learning_rates: list[float] = knob([2e-5], "AdamW peak learning rates to sweep.")
    global_batch_sizes: list[int] = knob(
        [32], "Sequences per optimizer update over all ranks, to sweep."
    )
    epoch_counts: list[float] = knob(
        [3.0], "Epoch counts to sweep: passes over the training examples, fractions allowed."
    )
    seeds: list[int] = knob([0], "Seeds per setting (initialisation of the head, order, dropout).")
    max_seq_length: int = knob(
        128, "Longer pairs are truncated, the longer text first (and counted)."
    )
    warmup_fraction: float = knob(
        0.1, "Linear warmup over this fraction of the updates, then linear decay."
    )
    weight_decay: float = knob(0.01, "AdamW's decoupled weight decay.")
    precision: str = knob(
        "float32", "Compute precision.", choices=["float32", "mixed_bfloat16", "mixed_float16"]
    )
    xla: bool = knob(False, "Compile the forward/backward pass and the update with XLA.")
    output_dir: str | None = knobs.output_dir("glue.json, glue.md and submission/", required=True)
    export_models: bool = knob(
        False,
        "Also write each task's selected model to <output_dir>/models/<task>/: "
        "google-research/bert's names and a transformers BertForSequenceClassification directory.",
    )


cli.define_config_flags(GlueConfig)
cli.define_renamed("batch_sizes", "global_batch_sizes")
# --epochs is a float elsewhere; here it was the sweep's list
cli.define_renamed("epochs", "epoch_counts")


def main(argv):
    from bert_tf.parallel import distributed
    from bert_tf.tasks import finetuning, glue, glue_sweep

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    cfg = cli.config_from_flags(GlueConfig)
    tasks = glue.parse_tasks(",".join(cfg.tasks))
    settings = glue_sweep.sweep(cfg.learning_rates, cfg.global_batch_sizes, cfg.epoch_counts)
    recipe = _recipe(cfg)
    # every file read before any training; tests may be missing
    no_test = glue.check_files(tasks, cfg.data_dir)
    tokenizer, init, config = cli.finetune_start(cfg.start, cfg.max_seq_length)
    hvd = distributed.init()
    for s in settings:  # divisible: checked up front
        finetuning.Recipe(global_batch=s.global_batch).per_rank_batch(hvd.size())
    rank = hvd.rank()
    log = print if rank == 0 else (lambda *a, **k: None)
    for name, paths in no_test.items():
        log(f"{name}: no test file ({', '.join(paths)}): scored on dev, no submission file")
    dist = finetuning.Distributed(
        rank,
        hvd.size(),
        distributed.make_gradient_allreduce(False, name="glue"),
        distributed.broadcast_variables,
    )
    results = {}
    for name in tasks:
        task = glue.TASKS[name]
        results[name] = glue_sweep.run_task(
            task,
            cfg.data_dir,
            tokenizer,
            config,
            init,
            settings,
            cfg.seeds,
            recipe,
            dist,
            log,
            keep_model=cfg.export_models,
        )
        model = results[name].pop("model", None)
        if rank == 0:
            _write_task_outputs(cfg, task, results[name], model)
    if rank == 0:
        _write_reports(cfg, init, recipe, no_test, results)


def _recipe(cfg):
    """The fine-tuning settings every run of the sweep shares (finetuning.Recipe)."""
    from bert_tf.tasks import finetuning

    return finetuning.Recipe(
        max_seq_length=cfg.max_seq_length,
        warmup_fraction=cfg.warmup_fraction,
        weight_decay=cfg.weight_decay,
        precision=cfg.precision,
        xla=cfg.xla,
    )


def _write_task_outputs(cfg, task, result: dict, model) -> None:
    """Rank 0, after a task: its selected model (--export_models) and its submission files."""
    from bert_tf.tasks import finetuning, glue

    if model is not None:
        finetuning.export(
            model,
            cfg.start.vocab_file,
            os.path.join(cfg.output_dir, "models", task.name),
            labels=list(task.labels) or None,
            do_lower_case=cfg.start.do_lower_case,
        )
    glue.write_submissions(task, cfg.data_dir, result, os.path.join(cfg.output_dir, "submission"))


def _write_reports(cfg, init, recipe, no_test: dict, results: dict) -> None:
    """glue.json (every result but the test predictions) and glue.md, whose tables are printed."""
    from bert_tf.tasks import glue_sweep

    os.makedirs(cfg.output_dir, exist_ok=True)
    with open(os.path.join(cfg.output_dir, "glue.json"), "w") as f:
        json.dump(
            {
                "init": init.path if init is not None else "random",
                "recipe": dataclasses.asdict(recipe) | {"seeds": cfg.seeds},
                "no_test_file": no_test,
                "results": {
                    k: {kk: vv for kk, vv in v.items() if kk != "test_predictions"}
                    for k, v in results.items()
                },
            },
            f,
            indent=1,
        )
    table = glue_sweep.markdown(results, recipe, cfg.seeds)
    with open(os.path.join(cfg.output_dir, "glue.md"), "w") as f:
        f.write(table)
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
