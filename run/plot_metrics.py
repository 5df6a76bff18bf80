"""Loss, accuracy and throughput curves from a run's metrics.jsonl, as one PNG.

    python run/plot_metrics.py --metrics=runs/demo/metrics.jsonl \
        --output_png=runs/demo/metrics.png
"""

import dataclasses

from bert_tf import ConfigError, cli, knob


@dataclasses.dataclass(frozen=True)
class PlotConfig:
    """run/plot_metrics.py's flags: the metrics to read and the PNG to write."""

    metrics: str | None = knob(None, "metrics.jsonl written by run/pretrain.py.", required=True)
    # required, but checked here rather than by the flag parser: the old name --output may give it
    output_png: str = knob("", "PNG file to write the curves to.")

    def __post_init__(self):
        if not self.output_png:
            raise ConfigError("--output_png is required (the PNG to write)")


cli.define_config_flags(PlotConfig)
cli.define_renamed("output", "output_png")


def plot(records, output, source):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    probes = [r for r in records if r.get("kind") == "probe"]
    if not train:
        raise ConfigError(f"no training records in {source}")
    panels = 4 if probes else 3
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    steps = [r["step"] for r in train]
    ax = axes[0]
    ax.plot(steps, [r["loss"] for r in train], label="train loss")
    ax.plot(steps, [r["mlm_loss"] for r in train], label="train MLM loss")
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["eval_mlm_loss"] for r in evals],
            "o-",
            label="held-out MLM loss",
        )
    ax.set_xlabel("step"), ax.set_title("loss"), ax.legend()
    ax = axes[1]
    ax.plot(steps, [r.get("mlm_accuracy", float("nan")) for r in train], label="train MLM")
    if any("nsp_accuracy" in r for r in train):
        ax.plot(steps, [r.get("nsp_accuracy", float("nan")) for r in train], label="train NSP")
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r.get("eval_mlm_accuracy") for r in evals],
            "o-",
            label="held-out MLM",
        )
        ax.axhline(
            evals[-1].get("eval_most_frequent_token_accuracy", float("nan")),
            color="gray",
            ls="--",
            label="most frequent token",
        )
    ax.set_xlabel("step"), ax.set_title("accuracy"), ax.legend()
    ax = axes[2]
    ax.plot(steps, [r["sequences_per_second"] for r in train])
    ax.set_xlabel("step"), ax.set_title("global sequences / s")
    if probes:
        ax = axes[3]
        ax.errorbar(
            [r["step"] for r in probes],
            [r["probe_accuracy"] for r in probes],
            yerr=[r.get("probe_accuracy_std", 0) for r in probes],
            fmt="o-",
        )
        ax.set_xlabel("step"), ax.set_title("fine-tuning probe accuracy")
    fig.tight_layout()
    fig.savefig(output, dpi=100)


def main(_):
    from bert_tf.artifacts import metrics

    cfg = cli.config_from_flags(PlotConfig)
    plot(metrics.read_metrics(cfg.metrics), cfg.output_png, cfg.metrics)
    print(f"wrote {cfg.output_png}")


if __name__ == "__main__":
    cli.run(main)
