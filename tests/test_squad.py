"""SQuAD: words and windows as run_squad.py makes them, answers mapped back to the context's text, the
no-answer rule of v2.0, and run/squad.py end to end on files in the official layout."""
import json
import subprocess
import sys

import numpy as np
import pytest

from bert_tf import ConfigError
from bert_tf.data import tokenization
from bert_tf.tasks import squad, squad_answers
from conftest import REPO, mpirun

WORDS = ["the", "denver", "broncos", "won", "super", "bowl", "50", "in", "2016", "smith", "steve", "'", "s",
         "game", "who", "what", "when", "did", "team", "year", "."]
VOCAB = tokenization.google_reserved_tokens() + WORDS + ["##s", ","]


def squad_json(version, impossible=False):
    context = "The Denver Broncos won Super Bowl 50 in 2016. Steve Smith's team won."
    qas = [{"id": "q1", "question": "Who won Super Bowl 50?",
            "answers": [{"text": "Denver Broncos", "answer_start": 4}, {"text": "The Denver Broncos", "answer_start": 0}]},
           {"id": "q2", "question": "When did the Broncos win?", "answers": [{"text": "2016", "answer_start": 40}]}]
    if impossible:
        qas.append({"id": "q3", "question": "What year did Smith win?", "answers": [], "is_impossible": True})
    return {"version": version, "data": [{"title": "SB50", "paragraphs": [{"context": context, "qas": qas}]}]}


def test_words_answers_and_bad_answer_starts(tmp_path):
    words, char_to_word = squad.split_words("a  b\tc\u202fd")
    assert words == ["a", "b", "c", "d"] and char_to_word == [0, 0, 0, 1, 1, 2, 2, 3]
    path = tmp_path / "train.json"
    data = squad_json("1.1")
    data["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 3     # points at "Denver"?
    path.write_text(json.dumps(data))
    said = []
    examples = squad.read_examples(str(path), "1.1", training=True, log=said.append)
    assert [e.qid for e in examples] == ["q1"] and examples[0].words[examples[0].start_word] == "Denver"
    assert said == [f"warning: {path}: 1 answers whose answer_start does not point at their text were skipped "
                    f"(first: question 'q2')"]
    path.write_text(json.dumps(squad_json("2.0", impossible=True)))
    with pytest.raises(ConfigError, match="question 'q3' has no answer .*give --version=2.0"):
        squad.read_examples(str(path), "1.1", training=True)
    assert squad.read_examples(str(path), "2.0", training=True)[2].impossible
    with pytest.raises(ConfigError, match="is not SQuAD's JSON"):
        (tmp_path / "bad.json").write_text("[]")
        squad.read_examples(str(tmp_path / "bad.json"), "1.1", training=False)


def test_windows_slide_by_the_stride_and_train_no_answer_outside_the_answer():
    tok = tokenization.Tokenizer(VOCAB)
    words = ["the", "denver", "broncos", "won", "super", "bowl", "50", "in", "2016", "."] * 3
    example = squad.Example("q", "who won super bowl 50 in the year 2016 , the team ?", words,
                            start_word=11, end_word=12, answer="denver broncos")   # the second "denver broncos"
    windows, counts = squad.make_windows([example], tok, max_seq_length=24, doc_stride=5, max_query_length=8,
                                         training=True)
    assert counts.questions_cut == 1 and counts.split_contexts == 1
    room = 24 - 8 - 3                                   # 13 context tokens per window, the next 5 later
    firsts = [min(w.token_to_word) for w in windows]
    assert all(min(w.token_to_word) == 1 + 8 + 1 for w in windows) and len(firsts) == counts.windows
    starts = [w.token_to_word[min(w.token_to_word)] for w in windows]
    assert starts == list(range(0, 30 - room + 5, 5))[:len(windows)] and starts[-1] + room >= 30
    for w in windows:
        assert len(w.input_ids) <= 24 and w.input_ids[0] == tok.cls_id and w.input_ids[9] == tok.sep_id
        if w.start:          # the answer in this window: its tokens are the answer's
            assert [tok.vocab[i] for i in w.input_ids[w.start:w.end + 1]] == ["denver", "broncos"]
            assert w.token_to_word[w.start] == 11
        else:
            assert w.end == 0                      # "no answer here": [CLS]
    assert sum(1 for w in windows if w.start) >= 1 and sum(1 for w in windows if not w.start) >= 1
    # an answer that starts in a window but ends past it is "no answer here" in that window: with a stride
    # of 3 the window at word 9 ends at word 21, the first of "denver broncos" at words 21-22
    cut = squad.Example("q", example.question, words, start_word=21, end_word=22, answer="denver broncos")
    spans, _ = squad.make_windows([cut], tok, max_seq_length=24, doc_stride=3, max_query_length=8, training=True)
    edge = [w for w in spans if max(w.token_to_word.values()) == 21]
    assert edge and all((w.start, w.end) == (0, 0) for w in edge)
    assert any(w.start for w in spans)
    # each context token's best window is the one with the most context around it: exactly one
    for word in range(30):
        best = [w for w in windows for p, v in w.token_to_word.items() if v == word and w.best_window[p]]
        assert len(best) == 1, word


def test_a_span_counts_only_in_the_window_where_its_start_has_the_most_context():
    """Word 12 sits at window 0's right edge (its best window starts at word 5): a high score for it there is
    not taken; word 6, in the middle of window 0, is."""
    tok = tokenization.Tokenizer(VOCAB)
    words = ["the", "denver", "broncos", "won", "super", "bowl", "50", "in", "2016", "."] * 3
    question = "who won super bowl 50 in the year 2016 , the team ?"
    windows, _ = squad.make_windows([squad.Example("q", question, words)], tok, max_seq_length=24, doc_stride=5,
                                    max_query_length=8)
    logits = np.full([len(windows), 2, 24], -5.0, np.float32)
    position = {word: p for p, word in windows[0].token_to_word.items()}
    logits[0, :, position[6]] = 4.0
    logits[0, :, position[12]] = 9.0
    assert not windows[0].best_window[position[12]] and windows[0].best_window[position[6]]
    # answers of at most 3 tokens: the span from word 6 to word 12 is not one
    predictions, _, _ = squad_answers.predict_answers([squad.Example("q", question, words)], windows, logits, tok, "1.1",
                                                      max_answer_length=3)
    assert predictions == {"q": "50"}


def test_final_text_keeps_the_contexts_own_characters():
    assert squad_answers.final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert squad_answers.final_text("2016", "2016.", True) == "2016"
    assert squad_answers.final_text("broncos", "(Broncos),", True) == "Broncos"
    assert squad_answers.final_text("nothing", "Steve Smith's", True) == "Steve Smith's"     # no match: the words whole


def test_answers_from_logits_v1_and_the_null_score_of_v2():
    tok = tokenization.Tokenizer(VOCAB)
    data = squad_json("2.0", impossible=True)
    path_examples = [squad.Example(qa["id"], qa["question"], squad.split_words(data["data"][0]["paragraphs"][0]
                                                                                ["context"])[0])
                     for qa in data["data"][0]["paragraphs"][0]["qas"]]
    windows, _ = squad.make_windows(path_examples, tok, max_seq_length=48, doc_stride=16, max_query_length=16)
    logits = np.full([len(windows), 2, 48], -5.0, np.float32)
    for w, window in enumerate(windows):
        position = {word: p for p, word in window.token_to_word.items()}
        target = {"q1": (1, 2), "q2": (8, 8), "q3": (9, 11)}[path_examples[window.example].qid]   # word spans
        logits[w, 0, min(p for p, word in window.token_to_word.items() if word == target[0])] = 5.0
        logits[w, 1, min(p for p, word in window.token_to_word.items() if word == target[1])] = 5.0
        assert position
    logits[2, :, 0] = 20.0                                 # q3: [CLS] far above its best span
    v1, _, _ = squad_answers.predict_answers(path_examples[:2], windows[:2], logits[:2], tok, "1.1")
    assert v1 == {"q1": "Denver Broncos", "q2": "2016"}     # the context's own characters, "." left out
    v2, null_odds, nbest = squad_answers.predict_answers(path_examples, windows, logits, tok, "2.0")
    assert v2 == {"q1": "Denver Broncos", "q2": "2016", "q3": ""}
    assert null_odds["q3"] == pytest.approx(40.0 - 10.0) and null_odds["q1"] == pytest.approx(-10.0 - 10.0)
    assert "" in [x["text"] for x in nbest["q1"]] and abs(sum(x["probability"] for x in nbest["q1"]) - 1) < 1e-6
    v2_strict, _, _ = squad_answers.predict_answers(path_examples, windows, logits, tok, "2.0", null_score_diff_threshold=-25.0)
    assert v2_strict["q1"] == ""                           # -20 > -25: the threshold turns it into "no answer"


@pytest.mark.cluster
def test_both_versions_train_predict_and_score_end_to_end(tiny_data, tmp_path):
    """run/squad.py on official-layout files with a tiny random-init BERT: v1.1 under mpirun on 2 ranks,
    v2.0 in one process; every question predicted, the official files written, the scores reported."""
    from bert_tf.model import modeling
    vocab_size = len(tokenization.Tokenizer.from_file(tiny_data["vocab_file"]))
    config = tmp_path / "bert_config.json"
    modeling.BertConfig.preset("tiny", vocab_size=vocab_size).to_json_file(str(config))
    common = [f"--vocab_file={tiny_data['vocab_file']}", "--random_init", f"--bert_config_file={config}",
              "--max_seq_length=48", "--doc_stride=16", "--max_query_length=16", "--global_batch_size=4", "--epochs=2",
              "--learning_rate=1e-3"]
    for version, launch in (("1.1", "mpirun"), ("2.0", "python")):
        data = squad_json(version, impossible=version == "2.0")
        data["data"] = data["data"] * 4                     # 8 or 12 questions to train on
        (tmp_path / f"{version}.json").write_text(json.dumps(data))
        out = tmp_path / f"out{version}"
        args = [REPO / "run" / "squad.py", f"--version={version}", f"--train_file={tmp_path / f'{version}.json'}",
                f"--predict_file={tmp_path / f'{version}.json'}", f"--output_dir={out}", *common]
        if launch == "mpirun":
            mpirun(2, args + ["--export_model"], timeout=600)
            assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
                ["BertForQuestionAnswering"]
        else:
            proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads((out / "eval.json").read_text())
        predictions = json.loads((out / "predictions.json").read_text())
        assert set(predictions) == {"q1", "q2"} | ({"q3"} if version == "2.0" else set())
        keys = {"exact_match", "f1"} if version == "1.1" else {"exact", "f1", "total", "HasAns_exact", "NoAns_exact",
                                                                "best_f1", "best_f1_thresh"}
        assert keys <= set(report["scores"]) and report["train_steps"] >= 1, report
        assert (out / "null_odds.json").exists() == (version == "2.0")
