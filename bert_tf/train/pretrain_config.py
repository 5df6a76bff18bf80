"""The pre-training run's settings: `PretrainConfig`, one field per flag of run/pretrain.py.

Each field is a `knob` holding its flag's default, help text and choices (bert_tf/cli.py generates
the flags from them), so a knob has one name, one default and one description. Constructing a config
checks its values and nothing else: no file, folder or interface is looked at here
(train/preflight.py's check_inputs does that, before anything is built).
"""

from __future__ import annotations

import dataclasses

from bert_tf import ConfigError, knob, knobs
from bert_tf.artifacts import metrics
from bert_tf.model import config as model_config
from bert_tf.train import divergence, shares
from bert_tf.train.train_config import TrainConfig


@dataclasses.dataclass
class PretrainConfig(TrainConfig, divergence.GuardConfig):
    """Everything a run needs: train_config.TrainConfig's update settings (precision, xla,
    accumulation_steps, optimizer, learning_rate, warmup_steps, total_steps, decay_power,
    weight_decay, clip_norm, seed, comm) plus model, data, Horovod and output settings.
    Constructing one validates it (train_config.TrainConfig.validate, extended here)."""

    seed: int = knob(12345, "Seed for initialisation, data order and dropout.")
    # model and data
    model_preset: str = knob(
        "base",
        "Standard model size (google-research/bert and Turc et al. 2019).",
        choices=model_config.PRESET_NAMES,
    )
    bert_config_file: str = knob("", "google-format bert_config.json (instead of a preset).")
    global_rope_theta: float = knob(
        0.0,
        "Modern models: RoPE theta of the global-attention layers (0: the preset's, ModernBERT's "
        "released 160,000, or the --init_checkpoint's). ModernBERT pre-trained at 10,000 and "
        "raised it to 160,000 only for its long-context phase (Warner et al. 2024, context "
        "extension).",
    )
    vocab_file: str = knobs.vocab_file(
        "", detail="its size sets the model's vocab_size for presets."
    )
    do_lower_case: bool = knob(True, "Tokeniser lower-cases (must match the data).")
    train_files: str = knobs.train_files()
    eval_files: str = knobs.eval_files()
    max_seq_length: int = knob(128, "Tokens per sequence, with [CLS] and [SEP]s.")
    max_predictions_per_seq: int = knob(20, "Masked positions per sequence.")
    dynamic_masking: bool = knob(False, "Records are unmasked; mask in tf.data each epoch.")
    masked_lm_prob: float = knob(0.15, "Masking rate for --dynamic_masking (at the start).")
    masked_lm_prob_end: float | None = knob(
        None,
        "With --dynamic_masking: the masking rate at the schedule's last update, reached linearly "
        "from --masked_lm_prob (e.g. 0.3 -> 0.15); moved at each log step. Unset: constant. "
        "Unmasked --eval_files are masked at this rate.",
    )
    mlm_only: bool = knob(False, "Train the masked-LM objective only (no next-sentence head).")
    eval_max_predictions_per_seq: int = knob(
        0,
        "Masked positions per sequence of --eval_files (0: --max_predictions_per_seq). Masked "
        "evaluation records keep their masks under --dynamic_masking: a recipe training at 30% is "
        "evaluated on the same 15% masks as one at 15%.",
    )
    batch_warmup_sequences: int = knob(
        0,
        "Grow the global batch from one micro-batch per rank to --accumulation_steps over the "
        "first N sequences, the learning rate x sqrt(batch / full batch) (train/batch_warmup.py). "
        "Elastic runs: from one micro-batch per rank to --global_batch_size, counted over the "
        "committed sequences.",
    )
    # batches: a micro-batch is one rank's forward/backward; the global batch is one update over all
    # ranks
    micro_batch_size: int = knob(
        32,
        "Sequences per rank per forward/backward pass (one micro-batch). The global batch is "
        "--micro_batch_size x --accumulation_steps x ranks.",
    )
    fit_micro_batch: int = knob(
        0,
        "Re-split the per-rank batch (--micro_batch_size x --accumulation_steps) into "
        "micro-batches of this size, keeping the global batch (run/benchmark.py "
        "--tune_micro_batch_sizes writes it); 0: off.",
    )
    recompute: str = knob(
        "none",
        "layer: keep only each transformer layer's input for the backward pass and run the layer "
        "again there (less activation memory, about one more forward pass; the same gradients): "
        "phase 2 at sequence 512 on small devices.",
        choices=model_config.RECOMPUTE,
    )
    # Horovod (the communication knobs are train_config.TrainConfig.comm)
    horovod_timeline: str = knob("", "Write Horovod's timeline JSON here.")
    horovod_autotune: bool = knob(False, "Let Horovod tune fusion threshold and cycle time.")
    network_interface: str = knob(
        "", "Log the bytes this node sent on this interface per update (e.g. eth0)."
    )
    intra_op_threads: int = knob(
        0, "CPU threads per rank for one op (0: the node's cores / its ranks)."
    )
    inter_op_threads: int = knob(0, "CPU threads per rank running ops side by side (0: 2).")
    # outputs
    checkpoint_dir: str = knobs.checkpoint_dir(
        "checkpoints, metrics.jsonl, TensorBoard; resumes from here."
    )
    init_checkpoint: str = knobs.init_checkpoint(
        "the model's, from this checkpoint (phase 2); fresh optimizer and schedule. Ignored when "
        "--checkpoint_dir has a checkpoint."
    )
    save_interval: int = knob(1000, "Save every N updates (and at the end and on SIGTERM/SIGINT).")
    keep_last: int = knob(3, "Checkpoints to keep.")
    log_interval: int = knob(100, "Progress line every N updates.")
    wandb_project: str = knob(
        "",
        "Also log what TensorBoard gets to this Weights & Biases project (rank 0; needs `pip "
        "install wandb`); TensorBoard stays.",
    )
    wandb_mode: str = knob(
        "online",
        "offline: no network; the run goes to <checkpoint_dir>/wandb/offline-run-*, for `wandb "
        "sync` later.",
        choices=("online", "offline"),
    )
    stop_check_interval: int = knob(
        10,
        "Ranks agree on a SIGTERM/SIGINT every N updates (and at log and save steps): the only "
        "host synchronisation between log intervals.",
    )
    ladder_sequences_per_second: float = knob(
        0.0,
        "run/benchmark.py's sequences/s for this configuration (its --write_flagfile sets it): "
        "logged next to the measured figure.",
    )
    eval_interval: int = knob(0, "Held-out evaluation every N updates (0: only at the end).")
    eval_batches: int = knob(0, "Limit evaluation to N batches per rank (0: all).")
    # elastic mode (bert_tf/train/elastic.py)
    elastic: bool = knob(
        False,
        "Elastic mode: ranks may leave and join (horovodrun --host-discovery-script ... --gloo; "
        "bert_tf/train/elastic.py). Needs --global_batch_size.",
    )
    global_batch_size: int = knob(
        0,
        "Elastic mode: sequences per optimizer update over all ranks, kept whatever the rank count "
        "(each rank's micro-batches per update follow from it).",
    )
    elastic_commit_interval: int = knob(
        10,
        "Elastic mode: commit the state to memory every N updates (a lost rank costs the updates "
        "since the last commit).",
    )
    elastic_verify_commits: bool = knob(
        False,
        "Elastic mode: after every commit, gather every rank's weights digest "
        'and stop if they differ (an "elastic" record "commit" in '
        "metrics.jsonl); costs a hash of the weights per commit, about 1 s per GB.",
    )
    # wall-clock (bert_tf/train/budget.py)
    time_budget_hours: float = knob(
        0.0,
        "End the run on the clock: the learning-rate schedule (the recipe's shape) is stretched "
        "over the updates this many hours hold, predicted from the measured rate; a restart spends "
        "what is left (0: end at --total_steps).",
    )
    target_mlm_accuracy: float = knob(
        0.0,
        "Stop at the first evaluation (--eval_interval) whose held-out MLM accuracy reaches this, "
        "and log the time to train (0: off).",
    )

    def _check_ladder_and_auto_exchange(self):
        if self.ladder_sequences_per_second < 0:
            raise ConfigError(
                "--ladder_sequences_per_second must be >= 0, got "
                f"{self.ladder_sequences_per_second}"
            )
        if self.comm.exchange != "auto":
            return
        if not self.ladder_sequences_per_second:
            raise ConfigError(
                "--exchange=auto needs --ladder_sequences_per_second (run/benchmark.py's "
                "sequences/s per rank: the compute the link is weighed against)"
            )

    def validate(self):
        self._check_run_knobs()
        super().validate()
        self._check_required_and_counts()
        self._check_fit_micro_batch()
        self._check_ladder_and_auto_exchange()
        self._check_evaluation()
        self._check_elastic()
        self._check_recipe()
        self._check_local_updates()

    def _check_run_knobs(self):
        """Logging, the divergence guard, recomputation, the clock and the target accuracy."""
        metrics.check_wandb(self.wandb_project, self.wandb_mode)
        divergence.GuardConfig.validate(self)
        if self.recompute not in model_config.RECOMPUTE:
            raise ConfigError(
                f"--recompute={self.recompute}: valid are {', '.join(model_config.RECOMPUTE)}"
            )
        if self.time_budget_hours < 0:
            raise ConfigError(f"--time_budget_hours must be >= 0, got {self.time_budget_hours}")
        if self.time_budget_hours and self.elastic:
            raise ConfigError(
                "--time_budget_hours with --elastic: not supported (ranks come and go, and the "
                "schedule's prediction is broadcast from a fixed rank 0)"
            )
        if not 0 <= self.target_mlm_accuracy < 1:
            raise ConfigError(
                f"--target_mlm_accuracy must be in [0, 1), got {self.target_mlm_accuracy}"
            )
        if self.target_mlm_accuracy and not (self.eval_files and self.eval_interval):
            raise ConfigError(
                "--target_mlm_accuracy needs --eval_files and --eval_interval (how often to look)"
            )

    def _check_required_and_counts(self):
        """The flags a run cannot do without, and the counts' ranges."""
        if not self.checkpoint_dir:
            raise ConfigError("--checkpoint_dir is required")
        if not self.vocab_file:
            raise ConfigError("--vocab_file is required")
        if self.bert_config_file and self.model_preset not in ("", "base"):
            raise ConfigError("give --bert_config_file or --model_preset, not both")
        for name in (
            "micro_batch_size",
            "max_seq_length",
            "max_predictions_per_seq",
            "save_interval",
            "log_interval",
            "keep_last",
            "stop_check_interval",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name, zero in (
            ("fit_micro_batch", "off"),
            ("intra_op_threads", "the default"),
            ("inter_op_threads", "the default"),
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0 (0: {zero}), got {getattr(self, name)}")

    def _check_fit_micro_batch(self):
        """--fit_micro_batch re-splits a static run's per-rank batch: it must divide it."""
        if self.fit_micro_batch and not self.elastic:  # the per-rank batch stays the recipe's
            per_rank = self.micro_batch_size * self.accumulation_steps
            if per_rank % self.fit_micro_batch:
                raise ConfigError(
                    f"--fit_micro_batch={self.fit_micro_batch}: the per-rank batch "
                    f"--micro_batch_size x --accumulation_steps = {self.micro_batch_size} x "
                    f"{self.accumulation_steps} = {per_rank} is not a positive multiple of it; "
                    f"tune with run/benchmark.py --tune_micro_batch_sizes=<divisors of {per_rank}> "
                    f"or drop the line"
                )

    def _check_evaluation(self):
        """The held-out evaluation's intervals and the masked positions' count."""
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ConfigError("--eval_interval and --eval_batches must be >= 0")
        if self.eval_interval and not self.eval_files:
            raise ConfigError("--eval_interval needs --eval_files")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ConfigError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} exceeds "
                f"--max_seq_length={self.max_seq_length}"
            )

    def _check_elastic(self):
        """--elastic's global batch and commits; --global_batch_size only with it."""
        if self.elastic:
            if not self.global_batch_size:
                raise ConfigError(
                    "--elastic needs --global_batch_size (sequences per update, kept whatever the "
                    "rank count; --accumulation_steps is then derived from it at every resize)"
                )
            shares.micro_batches_per_update(
                self.global_batch_size, self.fit_micro_batch or self.micro_batch_size
            )
            if self.accumulation_steps != 1:
                raise ConfigError(
                    f"--accumulation_steps={self.accumulation_steps} with --elastic: each rank's "
                    "micro-batches per update follow from --global_batch_size and the rank count; "
                    "leave it at 1"
                )
            if self.elastic_commit_interval < 1:
                raise ConfigError(
                    f"--elastic_commit_interval must be >= 1, got {self.elastic_commit_interval}"
                )
        elif self.global_batch_size:
            raise ConfigError(
                "--global_batch_size is for --elastic; otherwise the global batch is "
                "--micro_batch_size x --accumulation_steps x ranks"
            )

    def eval_predictions(self) -> int:
        return self.eval_max_predictions_per_seq or self.max_predictions_per_seq

    def _check_recipe(self):
        """The budget recipe's knobs (configs/budget_*.flags)."""
        if self.global_rope_theta < 0:
            raise ConfigError(f"--global_rope_theta must be > 0, got {self.global_rope_theta}")
        if self.batch_warmup_sequences < 0 or self.eval_max_predictions_per_seq < 0:
            raise ConfigError(
                "--batch_warmup_sequences and --eval_max_predictions_per_seq must be >= 0"
            )
        micro = self.fit_micro_batch or self.micro_batch_size
        if self.batch_warmup_sequences and self.elastic and self.global_batch_size < 2 * micro:
            raise ConfigError(
                f"--batch_warmup_sequences={self.batch_warmup_sequences} with --elastic needs "
                f"--global_batch_size of at least 2 micro-batches (--micro_batch_size={micro}): "
                "the batch grows by micro-batches"
            )
        static_warmup = self.batch_warmup_sequences and not self.elastic
        if static_warmup and self.accumulation_steps < 2 and not self.fit_micro_batch:
            raise ConfigError(
                f"--batch_warmup_sequences={self.batch_warmup_sequences} needs "
                "--accumulation_steps > 1: the batch grows by micro-batches, from one per rank to "
                "--accumulation_steps"
            )
        if self.dynamic_masking and not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"--masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.masked_lm_prob_end is not None:
            if not self.dynamic_masking:
                raise ConfigError(
                    "--masked_lm_prob_end needs --dynamic_masking: records written masked keep "
                    "their masks"
                )
            if not 0 < self.masked_lm_prob_end < 1:
                raise ConfigError(
                    f"--masked_lm_prob_end must be in (0, 1), got {self.masked_lm_prob_end}"
                )

    def _check_local_updates(self):
        """--local_updates (DiLoCo) against the run: its synchronous start, the saves and
        evaluations (only where the ranks' weights agree), elastic mode."""
        comm, every = self.comm, self.comm.local_updates
        after = comm.local_updates_after
        if not every:
            return
        if after >= self.total_steps:
            raise ConfigError(
                f"--local_updates_after={after} must be below --total_steps={self.total_steps}: "
                "the local updates would never start"
            )
        streamed = comm.local_fragments > 1 or comm.fragment_delay or comm.outer_delta_bits < 16
        if self.elastic and (after or streamed):
            raise ConfigError(
                "--local_updates_after, --local_fragments > 1, --fragment_delay and "
                "--outer_delta_bits=8|4 with --elastic: not supported (a commit needs the weights "
                "every rank agrees on at each commit, no exchange in flight and no residuals)"
            )
        if self.elastic and self.elastic_commit_interval % every:
            raise ConfigError(
                f"--elastic_commit_interval={self.elastic_commit_interval} must be a multiple of "
                f"--local_updates={every} with --elastic: a commit holds the weights every rank "
                "agrees on, right after a synchronisation"
            )
        if self.elastic and comm.local_group == "node":
            raise ConfigError(
                "--local_group=node with --elastic: not supported. With a process set per node, "
                "Horovod 0.28.1 aborts every surviving rank when a node is lost (std::terminate on "
                "a Gloo error, exit 134) before any re-form can run: "
                "scripts/probe_elastic_process_sets.py, horovod/horovod#3501 and #4021. Use "
                "--local_group=rank"
            )
        if self.save_interval % every or self.eval_interval % every:
            raise ConfigError(
                f"--save_interval={self.save_interval} and --eval_interval={self.eval_interval} "
                f"must be multiples of --local_updates={every}: the ranks' weights agree only "
                "right after a synchronisation"
            )
        if after % every:
            raise ConfigError(
                f"--local_updates_after={after} must be a multiple of --local_updates={every}: "
                "the ranks synchronise after updates K + j x H, and saves and evaluations (every "
                "--save_interval and --eval_interval updates) fall there"
            )

    def resolved(self) -> "PretrainConfig":
        """A new config with --fit_micro_batch applied (this one, what was asked, is unchanged): the
        micro-batch becomes it, and --accumulation_steps re-splits the per-rank batch (elastic mode:
        --global_batch_size fixes the update, so only the micro-batch changes)."""
        if not self.fit_micro_batch:
            return self
        if self.elastic:
            return dataclasses.replace(
                self, micro_batch_size=self.fit_micro_batch, fit_micro_batch=0
            )
        per_rank = self.micro_batch_size * self.accumulation_steps
        return dataclasses.replace(
            self,
            micro_batch_size=self.fit_micro_batch,
            fit_micro_batch=0,
            accumulation_steps=per_rank // self.fit_micro_batch,
        )
