"""What a run reads, checked before anything is built or written, on every rank: the network
interface, the vocabulary, --init_checkpoint and the model config it must fit, the training and
evaluation records (`check_inputs` -> `Inputs`). `dry_run` is --dry_run: these checks on one
process, plus whether --checkpoint_dir can be written. The config's own checks
(PretrainConfig.validate) look at values only; everything on disk or the network is looked at here.
"""

from __future__ import annotations

import dataclasses
import os

from bert_tf import ConfigError
from bert_tf.artifacts import checkpoint_formats, checkpointing, metrics
from bert_tf.data import input_pipeline, tokenization
from bert_tf.model import modeling
from bert_tf.parallel import device
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
    if cfg.global_rope_theta:
        if not config.modern:
            raise ConfigError(
                f"--global_rope_theta={cfg.global_rope_theta:g}: the model is a classic BERT "
                "(absolute positions); RoPE is the modern architecture's"
            )
        config = dataclasses.replace(config, global_rope_theta=cfg.global_rope_theta)
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
    records of this rank's training files and every evaluation file."""
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
    train_files, pack = check_train_files(cfg, rank, size)
    eval_files, eval_pack, eval_masked = check_eval_files(cfg)
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


def check_train_files(cfg: PretrainConfig, rank: int, size: int) -> tuple[list, int]:
    """--train_files: every file, and the records of this rank's shard, checked against the run;
    returns (the files, instances per row)."""
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
    return train_files, pack


def check_eval_files(cfg: PretrainConfig) -> tuple[list, int, bool]:
    """--eval_files, every record checked; returns (the files, instances per row, whether they are
    read with their own masks)."""
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
    return eval_files, eval_pack, eval_masked


def precision_warning(cfg: PretrainConfig) -> str:
    """device.precision_warning for this run on this process's device ("" when none applies)."""
    return device.precision_warning(
        cfg.precision, device.device_description(), cfg.ladder_sequences_per_second
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
        f"{config.hidden_size}, vocab {config.vocab_size}; {len(inputs.train_files)} training and "
        f"{len(inputs.eval_files)} evaluation files of {cfg.max_seq_length}-token records; "
        f"{cfg.micro_batch_size} x {cfg.accumulation_steps} sequences per rank per update (x ranks "
        f"= global batch); {start}; checkpoints in {cfg.checkpoint_dir}"
    )
    warning = precision_warning(cfg)
    if warning:
        log(warning)
