"""--masked_lm_prob_end: the dynamic masking rate moves linearly from --masked_lm_prob to it over the run
(input_pipeline.MaskingRate), read by the tf.data masker at each batch, set at each log step and from the
restored step on a resume; unmasked held-out rows are masked at the end rate."""
import json

import numpy as np
import pytest

from bert_tf import ConfigError
from bert_tf.data import input_pipeline
from bert_tf.train import pretrain_config, pretraining, startup
from conftest import news_vocab


@pytest.fixture(scope="module")
def unmasked(tmp_path_factory, corpus_dir):
    """Unmasked rows (one shard) of the bundled news corpus at 64 tokens, and their tokenizer."""
    from bert_tf.data import instances as ins, pretraining_data as pd
    root = tmp_path_factory.mktemp("unmasked_schedule")
    inputs, tok, vocab_file = news_vocab(root, corpus_dir)
    pd.create_pretraining_data(inputs, "auto", tok, str(root / "train"),
                               ins.InstanceConfig(max_seq_length=64, mask=False, dupe_factor=1), num_shards=1)
    return {"root": root, "tok": tok, "vocab_file": vocab_file, "files": sorted(map(str, (root / "train").glob("train-*")))}


def test_the_rate_moves_linearly_from_start_to_end_and_stays_there():
    rate = input_pipeline.MaskingRate(0.3, 0.1)
    assert [rate.at(s, 10) for s in (0, 5, 10, 20)] == pytest.approx([0.3, 0.2, 0.1, 0.1])
    assert rate.follow(4, 8) == pytest.approx(0.2) and float(rate.variable.numpy()) == pytest.approx(0.2)
    assert input_pipeline.MaskingRate(0.15, 0.3).at(3, 6) == pytest.approx(0.225)      # it may rise too


def test_a_schedule_without_dynamic_masking_or_out_of_range_fails_at_start():
    base = dict(checkpoint_dir="x", vocab_file="v")
    with pytest.raises(ConfigError, match="--masked_lm_prob_end needs --dynamic_masking"):
        pretrain_config.PretrainConfig(**base, masked_lm_prob_end=0.15).validate()
    with pytest.raises(ConfigError, match=r"--masked_lm_prob_end must be in \(0, 1\), got 1.5"):
        pretrain_config.PretrainConfig(**base, dynamic_masking=True, masked_lm_prob_end=1.5).validate()


def test_the_masker_reads_the_rate_at_each_batch(unmasked):
    """The same rows masked after the rate moved: ceil(rate x selectable) positions per row (tensorflow-text's
    RandomItemSelector, in float32), at most max_predictions_per_seq; the dataset is not rebuilt."""
    tok, rate = unmasked["tok"], input_pipeline.MaskingRate(0.3, 0.1)
    masker = input_pipeline.dynamic_masker(len(tok), [tok.cls_id, tok.sep_id, tok.pad_id], 24, rate.variable,
                                           tok.mask_id)
    batches = iter(input_pipeline.make_dataset(unmasked["files"], 16, 64, 24, training=True, masker=masker,
                                               shuffle_buffer=1))
    counts = {}
    for value in (0.3, 0.1, 0.3):
        rate.variable.assign(value)
        for _ in range(8):   # past what the pipeline prefetched at the old rate
            batch = next(batches)
        real = batch["input_mask"].numpy().sum(1)
        chosen = batch["masked_lm_weights"].numpy().sum(1).astype(int)
        expected = np.minimum(24, np.ceil(np.float32(real - 3) * np.float32(value)))
        counts.setdefault(value, []).append(int(chosen.sum()))
        np.testing.assert_array_equal(chosen, expected)
    assert min(counts[0.3]) > 2 * max(counts[0.1]), counts


@pytest.mark.slow
def test_a_run_follows_the_schedule_at_its_log_steps_and_a_resume_starts_from_its_step(unmasked, tmp_path):
    settings = dict(model_preset="tiny", vocab_file=unmasked["vocab_file"],
                    train_files=str(unmasked["root"] / "train" / "train-*"), eval_files="",
                    max_seq_length=64, max_predictions_per_seq=24, dynamic_masking=True, masked_lm_prob=0.3,
                    masked_lm_prob_end=0.1, mlm_only=True, micro_batch_size=4, log_interval=1, eval_interval=0,
                    checkpoint_dir=str(tmp_path))
    pretraining.run(pretrain_config.PretrainConfig(**settings, total_steps=4), log=lambda *a, **k: None)
    rates = [(r["step"], r["masked_lm_prob"]) for r in map(json.loads, open(tmp_path / "metrics.jsonl"))
             if r["kind"] == "train"]
    assert rates == [(1, 0.25), (2, 0.2), (3, 0.15), (4, 0.1)], rates
    # continued to 8 updates: update 4 of 8, set before the first batch is masked
    job = startup.build(pretrain_config.PretrainConfig(**settings, total_steps=8), lambda *a, **k: None)
    assert int(job.trainer.step.numpy()) == 4
    assert float(job.masking_rate.variable.numpy()) == pytest.approx(0.2)
    # the restored iterator first replays the batches the first run had already masked (its prefetch
    # buffer, at the rates of then); past them, the resumed job's masker reads the rate it was given
    for _ in range(8):
        batch = job.input.next_update()[-1]
    real = batch["input_mask"].numpy().sum(1)
    chosen = batch["masked_lm_weights"].numpy().sum(1)
    np.testing.assert_array_equal(chosen, np.minimum(24, np.ceil(np.float32(real - 3) * np.float32(0.2))))
