"""GLUE: every task's files in the layout the standard download writes, the metrics by hand, the GLUE
score, the submission files, and the errors for files that do not have their task's layout."""
import os
import sys

import pytest

from bert_tf import ConfigError
from bert_tf.tasks import glue, glue_scoring, glue_sweep

# header row (None: the file has none) and rows of each split, in each task's columns as distributed
LAYOUT = {
    "CoLA": {"train": (None, [["gj04", "1", "", "Our friends won't buy this analysis."],
                              ["gj04", "0", "*", "One more pseudo generalization and I'm giving up."]]),
             "dev": (None, [["gj04", "1", "", "The sailors rode the breeze clear of the rocks."]]),
             "test": (["index", "sentence"], [["0", "Bill whistled past the house."]])},
    "SST-2": {"train": (["sentence", "label"], [["hide new secretions from the parental units ", "0"],
                                                ["the greatest musicians ", "1"]]),
              "dev": (["sentence", "label"], [["it 's a charming and often affecting journey . ", "1"]]),
              "test": (["index", "sentence"], [["0", "uneasy mishmash of styles and genres ."]])},
    "MRPC": {"train": (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                       [["1", "702876", "702977", "Amrozi accused his brother .", "Referring to him , Amrozi ."]]),
             "dev": (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                     [["0", "1", "2", "He said the foodservice pie business .", "The foodservice pie business ."]]),
             "test": (["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                      [["0", "1089874", "1089925", "PCCW 's chief operating officer", "Mr Sun"]])},
    "STS-B": {"train": (["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                         "sentence2", "score"],
                        [["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", "A plane is taking off.",
                          "An air plane is taking off.", "5.000"]]),
              "dev": (["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                       "sentence2", "score"],
                      [["0", "main-captions", "MSRvid", "2012test", "0000", "none", "none", "A man with a hard hat.",
                        "A man wearing a hard hat is dancing.", "3.800"]]),
              "test": (["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                        "sentence2"],
                       [["0", "main-captions", "MSRvid", "2012test", "0024", "none", "none", "A girl is styling.",
                         "A girl is brushing her hair."]])},
    "QQP": {"train": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                      [["133273", "213221", "213222", "How is the life of a math student?",
                        "Which level of prepration is enough?", "0"],
                       ["201841", "303951", "174077", "How do I control my horny emotions?"]]),   # a field missing
            "dev": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                    [["40066", "1", "2", "What is the best way to learn?", "How can I learn best?", "1"]]),
            "test": (["id", "question1", "question2"], [["0", "Why are Indian women so fair?", "Are they?"]])},
    "MNLI": {"train": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                        "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
                       [["0", "31193", "31193n", "government", "( ( Conceptually", "( Product", "(ROOT", "(ROOT",
                         "Conceptually cream skimming has two basic dimensions.",
                         "Product and geography are what make cream skimming work.", "neutral", "neutral"]]),
             "dev_matched": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                              "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"],
                             [["0", "63735", "63735n", "slate", "(", "(", "(ROOT", "(ROOT", "The new rights are nice.",
                               "Everyone really likes the newest benefits.", "neutral", "entailment", "neutral",
                               "neutral", "neutral", "neutral"]]),
             "dev_mismatched": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                                 "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                                 "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"],
                                [["0", "75290", "75290c", "letters", "(", "(", "(ROOT", "(ROOT",
                                  "Your contribution helped make it possible.", "Your contributions were of no help.",
                                  "contradiction", "contradiction", "contradiction", "contradiction",
                                  "contradiction", "contradiction"]]),
             "test_matched": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                               "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                               "sentence2"],
                              [["0", "31493", "31493", "travel", "(", "(", "(ROOT", "(ROOT", "Hierbas, ans seco.",
                                "Hierbas is a name worth looking out for."]]),
             "test_mismatched": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                                  "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                                  "sentence2"],
                                 [["0", "1", "1", "letters", "(", "(", "(ROOT", "(ROOT", "What have you decided?",
                                   "I am not sure."]])},
    "QNLI": {"train": (["index", "question", "sentence", "label"],
                       [["0", "When did the third Digimon series begin?", "Unlike the two seasons before it.",
                         "not_entailment"]]),
             "dev": (["index", "question", "sentence", "label"],
                     [["0", "What came into force after the new constitution?", "As of that day, the law.",
                       "entailment"]]),
             "test": (["index", "question", "sentence"], [["0", "What organization is devoted?", "The Church."]])},
    "RTE": {"train": (["index", "sentence1", "sentence2", "label"],
                      [["0", "No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons Found in Iraq.",
                        "not_entailment"]]),
            "dev": (["index", "sentence1", "sentence2", "label"],
                    [["0", "Dana Reeve died of lung cancer.", "Christopher Reeve had an accident.", "not_entailment"]]),
            "test": (["index", "sentence1", "sentence2"], [["0", "Mangla was built in 1967.", "Mangla was built."]])},
    "WNLI": {"train": (["index", "sentence1", "sentence2", "label"],
                       [["0", "I stuck a pin through a carrot.", "The carrot had a hole.", "1"]]),
             "dev": (["index", "sentence1", "sentence2", "label"],
                     [["0", "The drain is clogged with hair.", "The hair has to be cleaned out.", "0"]]),
             "test": (["index", "sentence1", "sentence2"], [["0", "Maude and Dora had seen the trains.", "x."]])},
}


def write_glue(root, layout=LAYOUT):
    for folder, splits in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for split, (header, rows) in splits.items():
            lines = ([header] if header else []) + rows
            (root / folder / f"{split}.tsv").write_text("".join("\t".join(r) + "\n" for r in lines))
    return root


def test_every_task_reads_its_files_as_distributed(tmp_path):
    root = write_glue(tmp_path)
    assert glue.parse_tasks("all") == list(glue.TASKS) and glue.parse_tasks("CoLA, mnli") == ["cola", "mnli"]
    with pytest.raises(ConfigError, match="--tasks=cola,squad: unknown task squad; valid: cola, sst2"):
        glue.parse_tasks("cola,squad")
    for name, task in glue.TASKS.items():
        for split in ("train", *task.dev_splits, *task.test_splits):
            got = glue.read_split(task, str(root), split)
            rows = LAYOUT[task.folder][split][1]
            assert len(got.examples) == len(rows) - got.skipped, (name, split)
    cola = glue.read_split(glue.TASKS["cola"], str(root), "train")     # no header: both rows are examples
    assert [(e.text_a, e.label) for e in cola.examples] == [("Our friends won't buy this analysis.", 1),
                                                            ("One more pseudo generalization and I'm giving up.", 0)]
    mnli = glue.TASKS["mnli"]
    dev_mm = glue.read_split(mnli, str(root), "dev_mismatched").examples[0]
    assert (dev_mm.text_b, mnli.labels[dev_mm.label]) == ("Your contributions were of no help.", "contradiction")
    qqp = glue.read_split(glue.TASKS["qqp"], str(root), "train")
    assert qqp.skipped == 1 and len(qqp.examples) == 1                # the row with a missing field, counted
    sts = glue.read_split(glue.TASKS["stsb"], str(root), "dev").examples[0]
    assert sts.label == 3.8 and sts.text_b == "A man wearing a hard hat is dancing."
    test = glue.read_split(glue.TASKS["mrpc"], str(root), "test").examples[0]
    assert (test.guid, test.text_a, test.label) == ("0", "PCCW 's chief operating officer", None)


def test_files_without_their_tasks_layout_are_named_with_the_line(tmp_path):
    root = write_glue(tmp_path)
    rte = glue.TASKS["rte"]
    with pytest.raises(ConfigError, match=r"rte: .*RTE/dev.tsv not found"):
        glue.read_split(rte, str(tmp_path / "elsewhere"), "dev")
    (root / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n")
    with pytest.raises(ConfigError, match=r"RTE/train.tsv:3: 2 fields, a rte row has 4"):
        glue.read_split(rte, str(root), "train")
    (root / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tneutral\n")
    with pytest.raises(ConfigError, match=r"RTE/train.tsv:2: rte label 'neutral' is not one of entailment, "
                                          r"not_entailment"):
        glue.read_split(rte, str(root), "train")
    (root / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(ConfigError, match=r"RTE/dev.tsv: no examples"):
        glue.read_split(rte, str(root), "dev")
    (root / "STS-B" / "dev.tsv").write_text("h\n" + "\t".join(["0"] * 9 + ["high"]) + "\n")
    with pytest.raises(ConfigError, match=r"STS-B/dev.tsv:2: stsb score 'high' is not a number"):
        glue.read_split(glue.TASKS["stsb"], str(root), "dev")


def test_metrics_by_hand():
    labels, predictions = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    # tp 2, tn 2, fp 1, fn 1: MCC = (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3; F1 = 2*2 / (3 + 3)
    assert glue_scoring.matthews_corr(labels, predictions) == pytest.approx(1 / 3)
    assert glue_scoring.f1(labels, predictions) == pytest.approx(2 / 3) and glue_scoring.accuracy(labels, predictions) == 4 / 6
    assert glue_scoring.matthews_corr([1, 1, 0], [1, 1, 1]) == 0.0            # one predicted class: 0, as GLUE's
    assert glue_scoring.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / (2 * 114 / 9) ** 0.5)
    # ties share ranks: x -> 1, 2.5, 2.5, 4; r = 4.5 / sqrt(4.5 * 5)
    assert glue_scoring.ranks([1, 2, 2, 3]) == [1, 2.5, 2.5, 4]
    assert glue_scoring.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    with pytest.raises(ValueError, match="cola: 2 predictions for 3 labels"):
        glue_scoring.score(glue.TASKS["cola"], [1, 0, 1], [1, 0])


def test_task_and_glue_scores_average_as_papers_do():
    results = {"cola": {"dev": {"matthews_corr": 0.5}},
               "mrpc": {"dev": {"f1": 0.8, "accuracy": 0.7}},
               "stsb": {"dev": {"pearson": 0.9, "spearman": 0.8}},
               "mnli": {"dev_matched": {"accuracy": 0.8}, "dev_mismatched": {"accuracy": 0.7}},
               "wnli": {"dev": {"accuracy": 0.5}}}
    assert glue_scoring.task_score(glue.TASKS["mnli"], results["mnli"]) == pytest.approx(0.75)
    assert glue_scoring.glue_score(results) == pytest.approx((0.5 + 0.75 + 0.85 + 0.75 + 0.5) / 5)
    assert glue_scoring.glue_score(results, without=("wnli",)) == pytest.approx((0.5 + 0.75 + 0.85 + 0.75) / 4)


def test_submission_files_carry_the_index_and_the_label_names(tmp_path):
    root = write_glue(tmp_path / "glue")
    mnli = glue.TASKS["mnli"]
    examples = glue.read_split(mnli, str(root), "test_mismatched").examples
    path = glue.write_submission(mnli, "test_mismatched", examples, [1], tmp_path / "out")
    assert path.endswith("MNLI-mm.tsv") and open(path).read() == "index\tprediction\n0\tentailment\n"
    sts = glue.TASKS["stsb"]
    path = glue.write_submission(sts, "test", glue.read_split(sts, str(root), "test").examples, [5.7], tmp_path / "out")
    assert open(path).read() == "index\tprediction\n0\t5.000\n"
    with pytest.raises(ValueError):
        glue.write_submission(mnli, "test_matched", examples, [1, 2], tmp_path / "out")


def test_a_copy_without_test_files_is_checked_scored_on_dev_and_says_so(tmp_path):
    """Test files are optional (many copies of GLUE have none): the others are read and checked, the
    missing ones listed, submissions written for the splits predicted, and glue.md names the tasks
    without; a missing train or dev file still stops, naming it."""
    import types
    layout = {folder: dict(splits) for folder, splits in LAYOUT.items()}
    del layout["RTE"]["test"], layout["MNLI"]["test_mismatched"]
    root = write_glue(tmp_path / "glue", layout)
    rte, mnli = glue.TASKS["rte"], glue.TASKS["mnli"]
    assert glue.missing_tests(rte, str(root)) == ["test"] and glue.missing_tests(mnli, str(root)) == ["test_mismatched"]
    assert glue.check_files(list(glue.TASKS), str(root)) == {"mnli": [str(root / "MNLI" / "test_mismatched.tsv")],
                                                            "rte": [str(root / "RTE" / "test.tsv")]}
    paths = glue.write_submissions(mnli, str(root), {"test_predictions": {"test_matched": [2]}}, tmp_path / "out")
    assert paths == [str(tmp_path / "out" / "MNLI-m.tsv")] and os.listdir(tmp_path / "out") == ["MNLI-m.tsv"]
    summary = {"setting": {"learning_rate": 2e-5, "batch_size": 32, "epochs": 3.0},
               "metrics": {"dev/accuracy": {"mean": 0.6, "std": 0.0, "median": 0.6}}}
    results = {"rte": {"settings": [summary], "selected": {"setting": summary["setting"]},
                       "missing_test_files": [str(root / "RTE" / "test.tsv")]},
               "wnli": {"settings": [summary], "selected": {"setting": summary["setting"]}, "missing_test_files": []}}
    recipe = types.SimpleNamespace(max_seq_length=128, warmup_fraction=0.1, weight_decay=0.01, precision="float32")
    table = glue_sweep.markdown(results, recipe, [0])
    assert table.endswith(f"No test file, so no submission file: rte ({root / 'RTE' / 'test.tsv'})\n"), table
    assert "No test file" not in glue_sweep.markdown({"wnli": results["wnli"]}, recipe, [0])
    (root / "RTE" / "dev.tsv").unlink()
    with pytest.raises(ConfigError, match=r"rte: .*RTE/dev.tsv not found"):
        glue.check_files(["cola", "rte"], str(root))
    (root / "CoLA" / "train.tsv").unlink()
    with pytest.raises(ConfigError, match=r"cola: .*CoLA/train.tsv not found"):
        glue.check_files(["cola", "rte"], str(root))


def grown_layout(n):
    """LAYOUT with n rows in every train and dev split: the template rows repeated, their labels cycling
    through the task's (STS-B: scores 0-5) and a word added to their texts, so each task has something to fit."""
    out = {}
    for folder, splits in LAYOUT.items():
        task = next(t for t in glue.TASKS.values() if t.folder == folder)
        out[folder] = {}
        for split, (header, rows) in splits.items():
            if split.startswith("test"):
                out[folder][split] = (header, rows)
                continue
            template = max(rows, key=len)
            grown = []
            for i in range(n):
                row = list(template)
                label = f"{(i % 6) * 1.0:.3f}" if task.is_regression else task.labels[i % len(task.labels)]
                row[task.label_column] = label
                for column in task.text_columns:
                    if column is not None:
                        row[column] = f"{row[column]} {['good', 'bad', 'fine'][i % 3]} {label}"
                grown.append(row)
            out[folder][split] = (header, grown)
    return out


@pytest.mark.cluster
def test_every_task_trains_predicts_scores_and_writes_its_submission_under_mpirun(tiny_data, tmp_path):
    """run/glue.py on all nine tasks, 2 ranks, a tiny random-init BERT: dev tables, the GLUE score and
    the server's files (one per test split, every test row, the task's label names); RTE's test file and
    MNLI's mismatched one are missing: scored on dev all the same, no file for them, and said so."""
    import json
    import subprocess
    from conftest import REPO, mpirun
    from bert_tf.data import tokenization
    from bert_tf.model import modeling
    data = write_glue(tmp_path / "glue", grown_layout(16))
    no_test = {"mnli": [str(data / "MNLI" / "test_mismatched.tsv")], "rte": [str(data / "RTE" / "test.tsv")]}
    for paths in no_test.values():
        os.remove(paths[0])
    config = tmp_path / "bert_config.json"
    vocab = len(tokenization.Tokenizer.from_file(tiny_data["vocab_file"]))
    modeling.BertConfig.preset("tiny", vocab_size=vocab).to_json_file(str(config))
    out = tmp_path / "out"
    run = mpirun(2, [REPO / "run" / "glue.py", "--tasks=all", f"--data_dir={data}", "--random_init",
               f"--bert_config_file={config}", f"--vocab_file={tiny_data['vocab_file']}", "--max_seq_length=32",
               "--global_batch_sizes=8", "--epochs=1", "--learning_rates=1e-3", "--seeds=1", "--export_models",
               f"--output_dir={out}"],
           timeout=900)
    written = json.loads((out / "glue.json").read_text())
    result = written["results"]
    assert list(result) == list(glue.TASKS) and written["no_test_file"] == no_test
    assert {name: r["missing_test_files"] for name, r in result.items() if r["missing_test_files"]} == no_test
    assert all(f"{name}: no test file ({paths[0]}): scored on dev, no submission file" in run.stdout
               for name, paths in no_test.items()), run.stdout[-3000:]
    for name, r in result.items():
        task = glue.TASKS[name]
        assert len(r["runs"]) == 1 and r["selected"]["setting"]["learning_rate"] == 1e-3
        assert all(set(run["dev"]) == set(task.dev_splits) for run in r["runs"])
        assert all(set(run["dev"][s]) == set(task.metrics) for run in r["runs"] for s in task.dev_splits)
        for split, submission in zip(task.test_splits, task.submission):
            if glue.split_path(task, str(data), split) in no_test.get(name, []):
                assert not (out / "submission" / f"{submission}.tsv").exists()
                continue
            lines = (out / "submission" / f"{submission}.tsv").read_text().splitlines()
            assert lines[0] == "index\tprediction" and len(lines) == 1 + len(LAYOUT[task.folder][split][1])
            value = lines[1].split("\t")[1]
            assert (0.0 <= float(value) <= 5.0) if task.is_regression else value in task.labels, (name, value)
    assert result["qqp"]["train_rows_skipped"] == 0 and result["mnli"]["examples"]["dev_mismatched"] == 16
    exported = json.loads((out / "models" / "mnli" / "config.json").read_text())
    assert exported["architectures"] == ["BertForSequenceClassification"] and exported["label2id"] == {
        "contradiction": 0, "entailment": 1, "neutral": 2}
    assert json.loads((out / "models" / "stsb" / "config.json").read_text())["problem_type"] == "regression"
    table = (out / "glue.md").read_text()
    assert "GLUE score over these 9 task(s)" in table and "without WNLI" in table and "Selection on dev" in table
    assert f"No test file, so no submission file: mnli ({no_test['mnli'][0]}); rte ({no_test['rte'][0]})" in table
    # a folder without a task's files stops before any training, naming the file
    bad = subprocess.run(
        [sys.executable, str(REPO / "run" / "glue.py"), "--tasks=rte", f"--data_dir={tmp_path / 'none'}",
         "--random_init", f"--bert_config_file={config}", f"--vocab_file={tiny_data['vocab_file']}",
         f"--output_dir={out}"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "rte: " in bad.stderr and "RTE/train.tsv not found" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.slow
def test_a_sweep_with_seeds_summarises_each_setting_and_selects_on_dev(tiny_data, tmp_path):
    """2 batch sizes x 2 seeds on MRPC (two metrics): each setting's metrics summarised over
    its seeds, the setting with the best median dev score selected, its best seed's test predictions kept."""
    import statistics
    from bert_tf.data import tokenization
    from bert_tf.parallel import distributed
    from bert_tf.model import modeling
    from bert_tf.tasks import finetuning
    distributed.init()
    data = write_glue(tmp_path / "glue", grown_layout(16))
    tokenizer = tokenization.Tokenizer.from_file(tiny_data["vocab_file"])
    config = modeling.BertConfig.preset("tiny", vocab_size=len(tokenizer))
    assert len(glue_sweep.sweep([1e-3, 1e-5], [4, 8], [1, 2])) == 8
    settings = glue_sweep.sweep([1e-3], [4, 8], [1])
    assert [s.label() for s in settings] == ["lr 0.001, batch 4, 1 epochs", "lr 0.001, batch 8, 1 epochs"]
    result = glue_sweep.run_task(glue.TASKS["mrpc"], str(data), tokenizer, config, None, settings, [3, 4],
                                 finetuning.Recipe(max_seq_length=32), log=lambda *a, **k: None)
    assert len(result["runs"]) == 4 and len(result["settings"]) == 2
    for summary in result["settings"]:
        runs = [r for r in result["runs"] if r["setting"] == summary["setting"]]
        assert [r["seed"] for r in runs] == [3, 4]
        f1s = [r["dev"]["dev"]["f1"] for r in runs]
        assert summary["metrics"]["dev/f1"]["mean"] == pytest.approx(statistics.fmean(f1s))
        assert summary["metrics"]["dev/f1"]["std"] == pytest.approx(statistics.stdev(f1s))
        assert summary["score"]["median"] == pytest.approx(statistics.median(
            [(r["dev"]["dev"]["f1"] + r["dev"]["dev"]["accuracy"]) / 2 for r in runs]))
    best = max(result["settings"], key=lambda s: s["score"]["median"])
    assert result["selected"]["setting"] == best["setting"]
    chosen = max((r for r in result["runs"] if r["setting"] == best["setting"]), key=lambda r: r["score"])
    assert result["selected"]["seed"] == chosen["seed"] and len(result["test_predictions"]["test"]) == 1
    # the steps follow from the batch: 16 examples, 1 epoch
    assert sorted({(r["setting"]["batch_size"], r["train_steps"]) for r in result["runs"]}) == [(4, 4), (8, 2)]


def test_the_setting_selected_is_the_best_median_not_the_best_mean_or_seed():
    def summary(lr, median, mean, best):
        return {"setting": {"learning_rate": lr}, "score": {"median": median, "mean": mean, "max": best}}
    summaries = [summary(5e-5, 0.70, 0.72, 0.90), summary(3e-5, 0.74, 0.70, 0.75), summary(2e-5, 0.72, 0.73, 0.74)]
    assert glue_sweep.select(summaries)["setting"]["learning_rate"] == 3e-5
    assert glue_sweep.select([summary(1e-5, 0.5, 0.5, 0.5), summary(2e-5, 0.5, 0.6, 0.6)])["setting"]["learning_rate"] == 1e-5
