"""Fine-tunes and scores a BERT on GLUE: every task's dev metrics as GLUE defines them, the GLUE score,
and the server's submission files for the test sets.

    python run/glue.py --tasks=all --data_dir=glue_data --init_checkpoint=runs/base_phase2 \
        --vocab_file=vocab.txt --output_dir=runs/glue            # the recipe: 2e-5, batch 32, 3 epochs
    python run/glue.py --tasks=rte,mrpc,stsb,cola ... --learning_rates=5e-5,3e-5,2e-5 --seeds=1,2,3,4,5
    mpirun -np 2 python run/glue.py ...                          # data-parallel, like pre-training

--data_dir is the folder the standard GLUE download writes (CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/,
QNLI/, RTE/, WNLI/); train and dev files are required, test files optional (copies of GLUE often lack
them). Writes glue.json and glue.md (per task and setting: dev metrics as mean ± std and median over the
seeds; which setting is selected, on dev; which tasks had no test file), and submission/<Task>.tsv from
the selected run of each task that has its test file.
"""
import dataclasses
import json
import os

from absl import flags

from bert_tf import ConfigError, cli

flags.DEFINE_string("tasks", "all", "Comma-separated GLUE tasks (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, "
                    "wnli) or all.")
flags.DEFINE_string("data_dir", None, "The GLUE download's folder.")
cli.define_finetune_start()
flags.DEFINE_list("learning_rates", ["2e-5"], "AdamW peak learning rates to sweep.")
flags.DEFINE_list("global_batch_sizes", ["32"], "Sequences per optimizer update over all ranks, to sweep.")
cli.define_renamed("batch_sizes", "global_batch_sizes")
flags.DEFINE_list("epochs", ["3"], "Epochs to sweep.")
flags.DEFINE_list("seeds", ["0"], "Seeds per setting (initialisation of the head, order, dropout).")
flags.DEFINE_integer("max_seq_length", 128, "Longer pairs are truncated, the longer text first (and counted).")
flags.DEFINE_float("warmup_fraction", 0.1, "Linear warmup over this fraction of the updates, then linear decay.")
flags.DEFINE_float("weight_decay", 0.01, "AdamW's decoupled weight decay.")
flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16", "mixed_float16"], "Compute precision.")
flags.DEFINE_bool("xla", False, "Compile the forward/backward pass and the update with XLA.")
flags.DEFINE_string("output_dir", None, "glue.json, glue.md and submission/ go here.")
flags.DEFINE_bool("export_models", False, "Also write each task's selected model to <output_dir>/models/<task>/: "
                  "google-research/bert's names and a transformers BertForSequenceClassification directory.")
flags.mark_flags_as_required(["data_dir", "vocab_file", "output_dir"])
FLAGS = flags.FLAGS


def numbers(name, kind):
    try:
        return [kind(v) for v in FLAGS[name].value]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(FLAGS[name].value)}: not a list of numbers") from None


def main(argv):
    from bert_tf.parallel import distributed
    from bert_tf.tasks import finetuning, glue
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    tasks = glue.parse_tasks(FLAGS.tasks)
    settings = glue.sweep(numbers("learning_rates", float), numbers("global_batch_sizes", int),
                          numbers("epochs", float))
    seeds = numbers("seeds", int)
    recipe = finetuning.Recipe(max_seq_length=FLAGS.max_seq_length, warmup_fraction=FLAGS.warmup_fraction,
                               weight_decay=FLAGS.weight_decay, precision=FLAGS.precision, xla=FLAGS.xla)
    no_test = glue.check_files(tasks, FLAGS.data_dir)   # every file read before any training; tests may be missing
    tokenizer, init, config = cli.finetune_start(FLAGS.max_seq_length)
    hvd = distributed.init()
    for s in settings:
        finetuning.Recipe(batch_size=s.batch_size).per_rank_batch(hvd.size())   # divisible: checked up front
    rank = hvd.rank()
    log = print if rank == 0 else (lambda *a, **k: None)
    for name, paths in no_test.items():
        log(f"{name}: no test file ({', '.join(paths)}): scored on dev, no submission file")
    dist = (rank, hvd.size(), distributed.make_gradient_allreduce(False, name="glue"), distributed.broadcast_variables)
    results = {}
    for name in tasks:
        task = glue.TASKS[name]
        results[name] = glue.run_task(task, FLAGS.data_dir, tokenizer, config, init, settings, seeds, recipe,
                                      dist, log, keep_model=FLAGS.export_models)
        model = results[name].pop("model", None)
        if rank == 0 and model is not None:
            finetuning.export(model, FLAGS.vocab_file, os.path.join(FLAGS.output_dir, "models", name),
                              labels=list(task.labels) or None, do_lower_case=FLAGS.do_lower_case)
        if rank == 0:
            glue.write_submissions(task, FLAGS.data_dir, results[name], os.path.join(FLAGS.output_dir, "submission"))
    if rank == 0:
        os.makedirs(FLAGS.output_dir, exist_ok=True)
        with open(os.path.join(FLAGS.output_dir, "glue.json"), "w") as f:
            json.dump({"init": init.path if init is not None else "random",
                       "recipe": dataclasses.asdict(recipe) | {"seeds": seeds}, "no_test_file": no_test,
                       "results": {k: {kk: vv for kk, vv in v.items() if kk != "test_predictions"}
                                   for k, v in results.items()}}, f, indent=1)
        table = glue.markdown(results, recipe, seeds)
        with open(os.path.join(FLAGS.output_dir, "glue.md"), "w") as f:
            f.write(table)
        print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
