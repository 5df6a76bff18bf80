"""Shared helpers: launching workers under mpirun/horovodrun, small fixed features."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"
CORPUS = REPO / "data" / "corpus"
CACHE = pathlib.Path(os.environ.get("BERT_TF_CACHE", pathlib.Path.home() / ".cache" / "bert_tf"))
_durations = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """Every test's seconds (setup + call + teardown) of the last whole run, slowest first, in
    $BERT_TF_CACHE/test_durations.json: where CI's minutes go, kept when its console is not."""
    whole = session.config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if not _durations or not whole or session.config.option.keyword:
        return
    ranked = sorted(_durations.items(), key=lambda kv: -kv[1])
    record = {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "exit": int(exitstatus),
              "markers": session.config.option.markexpr, "seconds": round(sum(_durations.values()), 1),
              "tests": {k: round(v, 2) for k, v in ranked}}
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "test_durations.json").write_text(json.dumps(record, indent=1) + "\n")


def mpi_env(extra=None):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra or {})
    return env


def mpirun(np_, args, env=None, timeout=600, check=True, python=sys.executable):
    """`mpirun -np N python args...` on this machine; returns the CompletedProcess."""
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [python, *map(str, args)]
    return _run(cmd, env, timeout, check)


def horovodrun(np_, args, env=None, timeout=600, check=True, gloo=False):
    """`horovodrun -np N -H localhost:N [--gloo] python args...`."""
    hvdrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    cmd = [hvdrun, "-np", str(np_), "-H", f"localhost:{np_}", *(["--gloo"] if gloo else []),
           sys.executable, *map(str, args)]
    return _run(cmd, env, timeout, check)


def _run(cmd, env, timeout, check):
    proc = subprocess.run(cmd, env=mpi_env(env), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def resume_from(straight, resumed, step):
    """A checkpoint directory holding only `straight`'s checkpoint at `step` (its files, its exchange state, the
    model's config), pointed to as the latest: where a resumed run starts."""
    resumed.mkdir(exist_ok=True)
    for path in straight.iterdir():
        if path.name.startswith(f"ckpt-{step}.") or path.name == "bert_config.json":
            shutil.copy(path, resumed / path.name)
    if (straight / "exchange" / f"ckpt-{step}").exists():
        shutil.copytree(straight / "exchange" / f"ckpt-{step}", resumed / "exchange" / f"ckpt-{step}")
    (resumed / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n')
    return resumed


def read_rank_results(out_dir, n):
    return [json.loads((pathlib.Path(out_dir) / f"rank{r}.json").read_text()) for r in range(n)]


def random_features(batch=4, seq=16, preds=3, vocab=100, seed=0):
    """google-format pre-training features with random content (numpy)."""
    r = np.random.RandomState(seed)
    positions = np.stack([np.sort(r.choice(np.arange(1, seq), preds, replace=False)) for _ in range(batch)])
    return {
        "input_ids": r.randint(5, vocab, (batch, seq)).astype(np.int32),
        "input_mask": np.ones((batch, seq), np.int32),
        "segment_ids": np.concatenate([np.zeros((batch, seq // 2)), np.ones((batch, seq - seq // 2))], 1).astype(np.int32),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": r.randint(5, vocab, (batch, preds)).astype(np.int32),
        "masked_lm_weights": np.ones((batch, preds), np.float32),
        "next_sentence_labels": r.randint(0, 2, (batch, 1)).astype(np.int32),
    }


@pytest.fixture(scope="session")
def corpus_dir():
    if not (CORPUS / "lee_background.cor").exists():
        pytest.fail(f"bundled corpus missing in {CORPUS}: run scripts/setup.sh")
    return CORPUS


def news_vocab(root, corpus_dir):
    """The bundled news corpus as an input, a 2,000-word vocabulary learnt from it (root/vocab.txt) and its
    tokenizer: (inputs, tokenizer, vocab_file)."""
    from bert_tf.data import corpus, tokenization
    inputs = [str(corpus_dir / "lee_background.cor") + "@documents"]
    docs = list(corpus.read_documents(inputs))
    vocab = tokenization.learn_vocab([s for d in docs for s in d], vocab_size=2000)
    vocab_file = str(root / "vocab.txt")
    tokenization.write_vocab(vocab, vocab_file)
    return inputs, tokenization.Tokenizer(vocab), vocab_file


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory, corpus_dir):
    """A small vocab and seq-64 TFRecords (2 train shards, 1 eval) from the bundled news corpus."""
    from bert_tf.data import instances as ins, pretraining_data as pd

    root = tmp_path_factory.mktemp("tiny_data")
    inputs, tokenizer, vocab_file = news_vocab(root, corpus_dir)
    config = ins.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, random_seed=3)
    pd.create_pretraining_data(inputs, "auto", tokenizer, str(root), config, num_shards=2, heldout_fraction=0.1)
    return {"vocab_file": vocab_file, "train": str(root / "train-*"), "eval": str(root / "eval-*"),
            "flags": [f"--vocab_file={vocab_file}", f"--train_files={root / 'train-*'}",
                      f"--eval_files={root / 'eval-*'}", "--model_preset=tiny", "--max_seq_length=64",
                      "--max_predictions_per_seq=10", "--micro_batch_size=4", "--learning_rate=1e-3",
                      "--warmup_steps=2", "--log_interval=1", "--eval_batches=4"]}
