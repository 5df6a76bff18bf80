"""Does pre-training help? Fine-tunes the same BERT twice, from a pre-trained checkpoint and from random
weights, on tasks made from a bundled corpus's documents (bert_tf/tasks/corpus_tasks.py: sentence pairs from one
document or two; a sentence and the next one with its word order kept or disturbed; SQuAD-layout questions
whose answers are words of a corpus sentence: the word a question leaves out, or the vocabulary word put in
its place), over several seeds.

    python run/finetune_proof.py --init_checkpoint=runs/demo --vocab_file=data/demo/vocab.txt \
        --seeds=1,2,3 --output_json=runs/finetune_proof.json       # after scripts/demo.sh

Prints, per task and start, the dev metric as mean ± standard deviation over the seeds (pair tasks: accuracy;
span tasks: SQuAD v1.1 F1 and exact match, as the official script computes them).
"""
import json

from absl import flags

from bert_tf import ConfigError, cli
from bert_tf.tasks import proof

flags.DEFINE_string("init_checkpoint", None, "The pre-trained model (a run's folder, an export, ...).")
flags.DEFINE_string("vocab_file", None, "Its vocab.txt.")
flags.DEFINE_list("corpus", ["data/corpus/lee_background.cor@documents"], "Documents to make the tasks from.")
flags.DEFINE_list("tasks", list(proof.TASKS), "Tasks (bert_tf/tasks/corpus_tasks.py).")
flags.DEFINE_list("seeds", ["1", "2", "3"], "Seeds (the tasks' examples, the heads, the order, dropout).")
flags.DEFINE_integer("train_examples", 1600, "Examples per task to train on.")
flags.DEFINE_integer("dev_examples", 200, "Examples per task to score (from documents not trained on).")
flags.DEFINE_float("learning_rate", 1e-3, "AdamW peak learning rate (a tiny model needs more than BERT-base's 2e-5; "
                   "1e-4 moved neither start off chance here).")
flags.DEFINE_integer("global_batch_size", 32, "Examples per update, all ranks.")
cli.define_renamed("batch_size", "global_batch_size")
flags.DEFINE_float("epochs", 5.0, "Passes over the training examples.")
flags.DEFINE_integer("max_seq_length", 128, "Tokens per example or window.")
flags.DEFINE_string("output_json", "", "Every run's figures.")
flags.mark_flags_as_required(["init_checkpoint", "vocab_file"])
flags.register_validator("tasks", lambda v: bool(v) and set(v) <= set(proof.TASKS),
                         f"--tasks takes a comma-separated subset of {', '.join(proof.TASKS)}")
FLAGS = flags.FLAGS


def main(argv):
    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.data import corpus, tokenization
    from bert_tf.parallel import distributed
    from bert_tf.tasks import corpus_tasks
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    distributed.init()
    tokenizer = tokenization.Tokenizer.from_file(FLAGS.vocab_file)
    init = checkpoint_formats.read(FLAGS.init_checkpoint)
    if init.config is None:
        raise ConfigError(f"{init.path}: no bert_config.json beside it")
    checkpoint_formats.check_fits(init, init.config, len(tokenizer), FLAGS.vocab_file, FLAGS.max_seq_length)
    documents = list(corpus.read_documents(FLAGS.corpus))
    recipe = proof.ProofRecipe(FLAGS.train_examples, FLAGS.dev_examples, FLAGS.learning_rate,
                               FLAGS.global_batch_size, FLAGS.epochs, FLAGS.max_seq_length)
    runs = []
    for seed in map(int, FLAGS.seeds):
        train_docs, dev_docs = corpus_tasks.split_documents(documents, 0.2, seed)
        for task in FLAGS.tasks:
            for start, checkpoint in (("pre-trained", init), ("random", None)):
                figures = proof.run_task(task, train_docs, dev_docs, seed, checkpoint, tokenizer, init.config, recipe)
                runs.append({"task": task, "start": start, "seed": seed, **figures})
                print(json.dumps(runs[-1]), flush=True)
    print(f"\n{len(FLAGS.seeds)} seeds; {FLAGS.train_examples} training and {FLAGS.dev_examples} dev examples per task; "
          f"pre-trained: {init.path}")
    print(proof.table(runs, FLAGS.tasks))
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump({"init": init.path, "flags": {k: FLAGS[k].value for k in (
                "tasks", "corpus", "seeds", "train_examples", "dev_examples", "learning_rate", "global_batch_size",
                "epochs")}, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
