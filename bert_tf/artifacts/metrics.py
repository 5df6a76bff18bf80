"""Run metrics: a JSON-lines file, TensorBoard summaries, optionally Weights & Biases, and progress
lines (rank 0 only).

Each record is one dict with a `kind` and a `step`: "run" (a run's settings, at every start),
"train" (at log steps), "eval", "elastic" (elastic mode's weights digests) and, from
run/finetune.py, "probe". The two the training loop writes over and over are typed (TrainRecord,
EvalRecord: their fields are the file's keys, in its order); the rest are dicts. Data-dependent
values arrive already summed over ranks (see distributed.sum_across_ranks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from bert_tf import ConfigError


def silent(*args, **kwargs):
    """The `say` of a rank that does not log."""


def accuracies(sums: dict) -> dict:
    """Turns summed counts into rates: mlm_accuracy, nsp_accuracy."""
    out = {}
    if sums.get("mlm_weight"):
        out["mlm_accuracy"] = sums["mlm_correct"] / sums["mlm_weight"]
    if sums.get("nsp_count"):
        out["nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_count"]
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainRecord:
    """A "train" record: one log interval of pre-training (figures.IntervalMetrics), over all
    ranks unless said. The fields are metrics.jsonl's keys in its order; None: not written (no such
    head, timing or setting)."""

    kind: str = dataclasses.field(default="train", init=False)
    step: int
    loss: float  # means over the interval's updates and the ranks
    mlm_loss: float | None = None
    nsp_loss: float | None = None
    mlm_accuracy: float | None = None  # exact: from counts summed over the interval
    nsp_accuracy: float | None = None
    learning_rate: float  # the interval's last update's
    grad_norm: float
    sequences_per_second: float
    tokens_per_second: float  # sequences x max_seq_length per second, padding included
    sequences: int | None = None  # sequences trained on in the interval
    useful_tokens_per_second: float | None = None  # non-padding tokens
    instances_per_second: float | None = None  # packed rows: their instances
    compute_seconds: float | None = None  # this rank's split of its timed updates (Trainer.timing)
    wait_seconds: float | None = None
    allreduce_seconds: float | None = None
    update_seconds: float | None = None
    tx_bytes_per_update: float | None = None  # --network_interface
    loss_scale: float | None = None  # mixed_float16
    skipped_steps: int | None = None  # these four: set at the log step (pretraining._log_interval)
    samples_seen: int | None = None
    ranks: int | None = None
    budget_predicted_steps: float | None = None  # --time_budget_hours: the run's predicted updates
    masked_lm_prob: float | None = None  # --masked_lm_prob_end: the rate from this log step on


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """An "eval" record: held-out masked-LM (and NSP) figures over every rank's share
    (train/evaluation.py); losses are means per sequence. The fields are metrics.jsonl's keys in its
    order; None: not written."""

    kind: str = dataclasses.field(default="eval", init=False)
    step: int
    eval_mlm_loss: float
    eval_sequences: float
    eval_mlm_accuracy: float | None = None
    eval_nsp_accuracy: float | None = None
    eval_nsp_loss: float | None = None
    eval_most_frequent_token: int | None = (
        None  # the data-only baseline: always predicting this token
    )
    eval_most_frequent_token_accuracy: float | None = None
    # how many masked tokens were scored, and the accuracy's binomial standard error over them
    # (sqrt(p (1 - p) / n)): one evaluation's noise, a floor since a row's masks are not independent
    eval_mlm_predictions: float | None = None
    eval_mlm_accuracy_se: float | None = None


def as_dict(record: TrainRecord | EvalRecord | dict) -> dict:
    """A record as metrics.jsonl holds it: a typed one's fields in order, None left out; a dict as
    it is."""
    if isinstance(record, dict):
        return record
    return {k: v for k, v in dataclasses.asdict(record).items() if v is not None}


# The low-level summary op with the "scalars" plugin tag: TensorBoard shows these as scalar
# curves, and the nodes need no tensorboard package (tf.summary.scalar would import it).
def _scalar_metadata() -> bytes:
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    ).SerializeToString()


WANDB_MODES = ("online", "offline")


def check_wandb(project, mode):
    """At start-up: --wandb_project needs the wandb package and a known mode."""
    if not project:
        return
    if mode not in WANDB_MODES:
        raise ConfigError(f"--wandb_mode={mode}: valid are {', '.join(WANDB_MODES)}")
    try:
        import wandb  # noqa: F401  (only whether it imports: --wandb_project needs it)
    except ImportError:
        raise ConfigError(
            f"--wandb_project={project} needs the wandb package: pip install wandb"
        ) from None


class MetricsWriter:
    """Writes only when `active` (rank 0); every rank may call it. With `wandb_project`, every
    numeric value TensorBoard gets goes to a Weights & Biases run too (`offline` mode: a run folder
    under `directory`/wandb for `wandb sync`), named after the folder so that a resumed job
    continues it."""

    def __init__(self, directory, active=True, wandb_project="", wandb_mode="online"):
        self.active = active
        self.path = os.path.join(directory, "metrics.jsonl")
        self.start = time.time()
        self.wandb_project, self.wandb_mode, self.wandb_run = wandb_project, wandb_mode, None
        if active:
            self._open()

    def _open(self):
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        # here, not at the top: reading metrics (read_metrics) needs no TensorFlow
        import tensorflow as tf

        self.summary = tf.summary.create_file_writer(os.path.join(directory, "tensorboard"))
        self._metadata = _scalar_metadata()
        if self.wandb_project and self.wandb_run is None:
            import hashlib

            import wandb

            run_id = hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:16]
            self.wandb_run = wandb.init(
                project=self.wandb_project,
                mode=self.wandb_mode,
                dir=directory,
                id=run_id,
                name=os.path.basename(os.path.abspath(directory)),
                resume="allow",
            )
            self.wandb_run.define_metric("*", step_metric="step")

    def set_active(self, active):
        """Elastic mode: after a resize another process may be rank 0."""
        if active and not self.active:
            self._open()
        self.active = active

    def write(self, record: TrainRecord | EvalRecord | dict):
        if not self.active:
            return
        record = {
            k: (float(v) if hasattr(v, "__float__") and not isinstance(v, (int, bool)) else v)
            for k, v in as_dict(record).items()
        }
        record.setdefault("time", time.time())
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        scalars = {
            f"{record.get('kind', 'train')}/{key}": value
            for key, value in record.items()
            if key not in ("step", "time", "kind")
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        }
        import tensorflow as tf

        with self.summary.as_default(step=int(record.get("step", 0))):
            for tag, value in scalars.items():
                tf.summary.write(tag, tf.constant(value, tf.float32), metadata=self._metadata)
        self.summary.flush()
        if self.wandb_run is not None:
            if record.get("kind") == "run":
                self.wandb_run.config.update(
                    {k: v for k, v in record.items() if k != "kind"}, allow_val_change=True
                )
            self.wandb_run.log({**scalars, "step": int(record.get("step", 0))})

    def close(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def progress(self, step, total_steps, record: TrainRecord, start_step=0):
        """One human line: step, loss, accuracies, lr, loss scale, throughput, elapsed, ETA."""
        if not self.active:
            return
        elapsed = time.time() - self.start
        done = max(step - start_step, 1)
        eta = elapsed / done * (total_steps - step)
        parts = [f"step {step}/{total_steps}", f"loss {record.loss:.4f}"]
        for value, label in ((record.mlm_accuracy, "mlm_acc"), (record.nsp_accuracy, "nsp_acc")):
            if value is not None:
                parts.append(f"{label} {value:.4f}")
        parts.append(f"lr {record.learning_rate:.3g}")
        if record.loss_scale is not None:
            parts.append(f"loss_scale {record.loss_scale:.0f}")
        parts += [
            f"{record.sequences_per_second:.1f} seq/s",
            f"{record.tokens_per_second:.0f} tok/s",
            f"elapsed {hms(elapsed)}",
            f"ETA {hms(eta)}",
        ]
        print("  ".join(parts), flush=True)


def hms(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def tx_counter(interface):
    return f"/sys/class/net/{interface}/statistics/tx_bytes"


def read_tx_bytes(interface):
    """Bytes this machine (network namespace) has sent on `interface`, from the kernel's counter."""
    with open(tx_counter(interface)) as f:
        return int(f.read())


def read_metrics(path, growing=False):
    """metrics.jsonl's records. growing: the file of a running job, which may not exist yet and
    whose last line may be half-written (left for the next look)."""
    if growing and not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if not growing:
                    raise
                break
    return records


def wait_for_record(path, condition, proc=None, what="a record", timeout=300.0, poll=0.2):
    """The first record of a running job's metrics.jsonl for which `condition(record)` holds, as
    soon as it is written. Raises RuntimeError when `proc` (a Popen) ends first or after `timeout`
    seconds."""
    deadline = time.time() + timeout
    while True:
        found = next((r for r in read_metrics(path, growing=True) if condition(r)), None)
        if found is not None:
            return found
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the job ended while waiting for {what} (exit {proc.returncode})")
        if time.time() > deadline:
            raise RuntimeError(f"no {what} within {timeout} s")
        time.sleep(poll)
