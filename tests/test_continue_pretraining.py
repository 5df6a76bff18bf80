"""Continued pre-training end to end: pre-train -> export as Hugging Face -> run/pretrain.py
--init_checkpoint=<that directory> on other text starts where the exported model was."""
import pytest
import glob
import json
import math
import subprocess
import sys

from conftest import REPO, mpi_env


def run(args, timeout=600):
    proc = subprocess.run([sys.executable, *map(str, args)], env=mpi_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def records(run_dir, kind):
    return [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if r["kind"] == kind]


@pytest.mark.slow
def test_pretrain_export_huggingface_continue_from_it(tiny_data, tmp_path):
    vocab_size = sum(1 for _ in open(tiny_data["vocab_file"]))
    shard0, shard1 = sorted(glob.glob(tiny_data["train"]))               # pre-train on one, continue on the other
    first, export, second = tmp_path / "first", tmp_path / "hf", tmp_path / "second"
    run([REPO / "run" / "pretrain.py", *tiny_data["flags"], f"--train_files={shard0}", "--total_steps=40",
         "--warmup_steps=4", "--learning_rate=2e-2", f"--checkpoint_dir={first}", "--log_interval=10"])
    trained = records(first, "eval")[-1]
    assert trained["step"] == 40
    random_loss = records(first, "train")[0]["mlm_loss"]                # step 1: as good as random
    assert abs(random_loss - math.log(vocab_size)) < 0.5
    assert trained["eval_mlm_loss"] < random_loss - 0.5                  # it learnt: a start unlike a random model

    run([REPO / "run" / "export.py", f"--checkpoint={first}", f"--vocab_file={tiny_data['vocab_file']}",
         f"--output_dir={export}", "--format=huggingface"])
    assert sorted(p.name for p in export.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                        "special_tokens_map.json", "tokenizer.json",
                                                        "tokenizer_config.json", "vocab.txt"]
    card = (export / "README.md").read_text()          # the model card says what the run recorded
    for fact in ["| 2 | 128 | 2 | 512 | gelu_new |", "- updates: 40 (160 sequences; global batch 4 on 1 rank)",
                 f"- held-out masked-LM accuracy {trained['eval_mlm_accuracy']:.4f} at update 40",
                 f"- command (each rank): `python {REPO / 'run' / 'pretrain.py'} ", f"--train_files={shard0}",
                 "masked LM and next-sentence prediction", "pipeline_tag: fill-mask"]:
        assert fact in card, (fact, card)

    # the model's size comes from the directory's config.json (no --model_preset)
    flags = [f for f in tiny_data["flags"] if not f.startswith("--model_preset")]
    proc = run([REPO / "run" / "pretrain.py", *flags, f"--train_files={shard1}", "--total_steps=2",
                f"--init_checkpoint={export}", f"--checkpoint_dir={second}"])
    log = proc.stdout + proc.stderr
    assert f"initialised encoder and heads from {export} (huggingface format)" in log
    assert "initialised at random" not in log                            # both heads came with it
    start = records(second, "eval")[0]
    print(f"exported model: held-out MLM accuracy {trained['eval_mlm_accuracy']:.6f} "
          f"loss {trained['eval_mlm_loss']:.6f}"
          f"; continued run at step 0: {start['eval_mlm_accuracy']:.6f} loss {start['eval_mlm_loss']:.6f}; "
          f"random (step 1 train) loss {random_loss:.4f}")
    assert start["step"] == 0
    assert start["eval_mlm_accuracy"] == trained["eval_mlm_accuracy"]
    assert abs(start["eval_mlm_loss"] - trained["eval_mlm_loss"]) < 1e-5
    assert abs(start["eval_nsp_accuracy"] - trained["eval_nsp_accuracy"]) < 1e-9
    assert records(second, "train")[-1]["step"] == 2


@pytest.mark.slow
def test_a_modern_model_pretrains_exports_as_modernbert_and_continues_from_the_export(tiny_data, tmp_path):
    """The modern architecture end to end: pre-train (MLM only), export (default formats: no google layout
    for it), continue pre-training from the ModernBERT directory at the exported model's held-out figures."""
    from bert_tf.model import modeling
    vocab_size = sum(1 for _ in open(tiny_data["vocab_file"]))
    config_file = tmp_path / "modern.json"     # a 32-token window: modern-tiny's 128 would span these 64-token rows
    modeling.BertConfig.preset("modern-tiny", vocab_size=vocab_size, local_attention=32).to_json_file(str(config_file))
    first, export, second = tmp_path / "first", tmp_path / "hf", tmp_path / "second"
    flags = [f for f in tiny_data["flags"] if not f.startswith("--model_preset")]
    run([REPO / "run" / "pretrain.py", *flags, f"--bert_config_file={config_file}", "--mlm_only",
         "--total_steps=40", "--warmup_steps=4", "--learning_rate=2e-2", f"--checkpoint_dir={first}",
         "--log_interval=10"])
    trained = records(first, "eval")[-1]
    assert trained["eval_mlm_loss"] < records(first, "train")[0]["mlm_loss"] - 0.3   # it learnt: unlike a random start
    run([REPO / "run" / "export.py", f"--checkpoint={first}", f"--vocab_file={tiny_data['vocab_file']}",
         f"--output_dir={export}"])
    assert sorted(p.name for p in export.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                        "saved_model", "special_tokens_map.json", "tokenizer.json",
                                                        "tokenizer_config.json", "vocab.txt"]
    assert json.load(open(export / "config.json"))["architectures"] == ["ModernBertForMaskedLM"]
    card = (export / "README.md").read_text()
    assert "# ModernBERT (2 layers, hidden 128)" in card and "masked LM only" in card
    proc = run([REPO / "run" / "pretrain.py", *flags, "--mlm_only", "--total_steps=2", f"--init_checkpoint={export}",
                f"--checkpoint_dir={second}"])
    log = proc.stdout + proc.stderr
    assert f"initialised encoder and heads from {export} (huggingface format)" in log and "model: modern" in log
    start = records(second, "eval")[0]
    assert start["step"] == 0 and start["eval_mlm_accuracy"] == trained["eval_mlm_accuracy"]
    assert abs(start["eval_mlm_loss"] - trained["eval_mlm_loss"]) < 1e-5
