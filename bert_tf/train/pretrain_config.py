"""The pre-training run's settings: `PretrainConfig`, one field per flag of run/pretrain.py.

Each field's comment is its flag's help text (bert_tf/cli.py generates the flags from them), so a
knob has one name, one default and one description. Constructing a config checks its values and
nothing else: no file, folder or interface is looked at here (train/startup.py's check_inputs does
that, before anything is built).
"""
from __future__ import annotations

import dataclasses

from bert_tf import ConfigError
from bert_tf.artifacts import metrics
from bert_tf.dist import distributed
from bert_tf.model import modeling
from bert_tf.train import divergence, elastic, training


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
    # elastic mode (bert_tf/train/elastic.py)
    elastic: bool = False
    global_batch: int = 0             # elastic: sequences per update, whatever the rank count
    elastic_commit_interval: int = 10
    # the divergence guard (bert_tf/train/divergence.py)
    divergence_factor: float = 1.5    # roll back when the logged loss stays above this x its running median
    divergence_intervals: int = 3     # ... for this many logged intervals in a row
    max_skipped_updates: int = 25     # ... or when this many updates in a row were skipped (non-finite)
    max_rollbacks: int = 3
    rollback_lr_scale: float = 1.0
    # wall-clock (bert_tf/train/budget.py)
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
        distributed.cpu_threads(1, self.intra_op_threads, self.inter_op_threads, cores=1)   # its value checks


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
