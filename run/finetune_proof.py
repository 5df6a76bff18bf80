"""Does pre-training help? Fine-tunes the same BERT twice, from a pre-trained checkpoint and from
random weights, on tasks made from a bundled corpus's documents (bert_tf/tasks/corpus_tasks.py:
sentence pairs from one document or two; a sentence and the next one with its word order kept or
disturbed; SQuAD-layout questions whose answers are words of a corpus sentence: the word a question
leaves out, or the vocabulary word put in its place), over several seeds.

    python run/finetune_proof.py --init_checkpoint=runs/demo --vocab_file=data/demo/vocab.txt \
        --seeds=1,2,3 --output_json=runs/finetune_proof.json       # after scripts/demo.sh

Prints, per task and start, the dev metric as mean ± standard deviation over the seeds (pair tasks:
accuracy; span tasks: SQuAD v1.1 F1 and exact match, as the official script computes them).
"""

import dataclasses
import json

from bert_tf import ConfigError, cli, knob, knobs
from bert_tf.tasks import proof


@dataclasses.dataclass(frozen=True)
class ProofConfig:
    """run/finetune_proof.py's flags: the pre-trained model, the corpus and tasks, the seeds and the
    recipe."""

    init_checkpoint: str | None = knobs.init_checkpoint(
        "the pre-trained model's (any format run/glue.py takes).", default=None, required=True
    )
    vocab_file: str | None = knobs.vocab_file(required=True)
    input_files: list[str] = knobs.input_files(
        ["data/corpus/lee_background.cor@documents"], "The documents the tasks are made from."
    )
    tasks: list[str] = knob(
        list(proof.TASKS), "Tasks (bert_tf/tasks/corpus_tasks.py).", choices=proof.TASKS
    )
    seeds: list[int] = knob(
        [1, 2, 3], "Seeds (the tasks' examples, the heads, the order, dropout)."
    )
    train_examples: int = knob(1600, "Examples per task to train on.")
    dev_examples: int = knob(200, "Examples per task to score (from documents not trained on).")
    learning_rate: float = knob(
        1e-3,
        "AdamW peak learning rate (a tiny model needs more than BERT-base's 2e-5; 1e-4 moved "
        "neither start off chance here).",
    )
    global_batch_size: int = knob(32, "Examples per update, all ranks.")
    epochs: float = knobs.epochs(5.0)
    max_seq_length: int = knob(128, "Tokens per example or window.")
    output_json: str = knobs.output_json("every run's figures")

    def __post_init__(self):
        if not self.tasks:
            raise ConfigError(f"--tasks takes a comma-separated subset of {', '.join(proof.TASKS)}")


cli.define_config_flags(ProofConfig)
cli.define_renamed("batch_size", "global_batch_size")
cli.define_renamed("corpus", "input_files")


def main(argv):
    from bert_tf.artifacts import checkpoint_formats
    from bert_tf.data import corpus, tokenization
    from bert_tf.parallel import distributed
    from bert_tf.tasks import corpus_tasks

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}")
    cfg = cli.config_from_flags(ProofConfig)
    distributed.init()
    tokenizer = tokenization.Tokenizer.from_file(cfg.vocab_file)
    init = checkpoint_formats.read(cfg.init_checkpoint)
    if init.config is None:
        raise ConfigError(f"{init.path}: no bert_config.json beside it")
    checkpoint_formats.check_fits(
        init, init.config, len(tokenizer), cfg.vocab_file, cfg.max_seq_length
    )
    documents = list(corpus.read_documents(cfg.input_files))
    recipe = proof.ProofRecipe(
        cfg.train_examples,
        cfg.dev_examples,
        cfg.learning_rate,
        cfg.global_batch_size,
        cfg.epochs,
        cfg.max_seq_length,
    )
    runs = []
    for seed in cfg.seeds:
        train_docs, dev_docs = corpus_tasks.split_documents(documents, 0.2, seed)
        for task in cfg.tasks:
            for start, checkpoint in (("pre-trained", init), ("random", None)):
                figures = proof.run_task(
                    task, train_docs, dev_docs, seed, checkpoint, tokenizer, init.config, recipe
                )
                runs.append({"task": task, "start": start, "seed": seed, **figures})
                print(json.dumps(runs[-1]), flush=True)
    print(
        f"\n{len(cfg.seeds)} seeds; {cfg.train_examples} training and {cfg.dev_examples} dev "
        f"examples per task; pre-trained: {init.path}"
    )
    print(proof.table(runs, cfg.tasks))
    if cfg.output_json:
        _write_json(cfg, init.path, runs)


def _write_json(cfg: ProofConfig, init_path: str, runs: list) -> None:
    """--output_json: the checkpoint, the flags that shape the runs, and every run's figures."""
    flags = (
        "tasks",
        "input_files",
        "seeds",
        "train_examples",
        "dev_examples",
        "learning_rate",
        "global_batch_size",
        "epochs",
    )
    with open(cfg.output_json, "w") as f:
        json.dump(
            {"init": init_path, "flags": {k: getattr(cfg, k) for k in flags}, "runs": runs},
            f,
            indent=1,
        )


if __name__ == "__main__":
    cli.run(main)
