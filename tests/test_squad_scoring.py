"""SQuAD scoring against hand-worked values and against transformers' port of the official v2.0 script."""
import random

import pytest
from transformers.data.metrics import squad_metrics as official   # the oracle (requirements-dev.txt)

from bert_tf.tasks import squad_scoring as sq


def test_normalisation_and_token_f1_by_hand():
    assert sq.normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert sq.normalize_answer("an apple A DAY") == "apple day"
    # gold "cat sat on mat" (4 tokens), prediction "cat on mat" (3): P = 1, R = 3/4, F1 = 6/7
    assert sq.f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # counts are clipped: gold "b b" ("a" is an article), prediction "b b b": P = 2/3, R = 1, F1 = 0.8
    assert sq.f1("a b b", "b b b") == pytest.approx(0.8)
    assert sq.exact_match("Denver Broncos.", "denver broncos") == 1 and sq.exact_match("Broncos", "Denver") == 0
    assert sq.f1("", "") == 1.0 and sq.f1("", "something") == 0.0          # v2.0: no answer vs no answer
    assert sq.f1("the", "", version="1.1") == 0.0                           # v1.1 has no such rule


def _dataset(questions):
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": questions}]}]


def test_v1_takes_the_best_gold_answer_and_refuses_a_missing_prediction():
    data = _dataset([{"id": "q1", "answers": [{"text": "Denver Broncos", "answer_start": 0},
                                              {"text": "the Broncos", "answer_start": 7}]},
                     {"id": "q2", "answers": [{"text": "1990", "answer_start": 3}]}])
    # q1: "Broncos" is an exact match for "the Broncos"; q2: "in 1990" has F1 2/3, no exact match
    out = sq.evaluate(data, {"q1": "Broncos", "q2": "in 1990"}, version="1.1")
    assert out == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(100 * (1 + 2 / 3) / 2)}
    with pytest.raises(ValueError, match="1 of 2 questions have no prediction \\(first: 'q2'\\)"):
        sq.evaluate(data, {"q1": "Broncos"}, version="1.1")


def test_v2_unanswerable_questions_thresholds_and_best_thresholds_by_hand():
    data = _dataset([{"id": "q1", "answers": [{"text": "Denver Broncos", "answer_start": 0}]},
                     {"id": "q2", "answers": [], "is_impossible": True},
                     {"id": "q3", "answers": [{"text": "1990", "answer_start": 3}]}])
    predictions = {"q1": "Denver Broncos", "q2": "something", "q3": "in 1990"}
    na_probs = {"q1": 0.2, "q2": 0.9, "q3": 0.5}
    out = sq.evaluate(data, predictions, na_probs)          # threshold 1.0: every prediction stands
    assert out["exact"] == pytest.approx(100 / 3) and out["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert (out["HasAns_exact"], out["HasAns_total"], out["NoAns_exact"], out["NoAns_total"]) == \
        (pytest.approx(50.0), 2, 0.0, 1)
    # starting from "no answer" everywhere (1 of 3 right), taking predictions in order of no-answer score:
    # exact: q1 +1 -> 2 (threshold 0.2), q3 +0, q2 -1; F1: q1 +1, q3 +2/3 -> 8/3 (threshold 0.5), q2 -1
    assert (out["best_exact"], out["best_exact_thresh"]) == (pytest.approx(200 / 3), 0.2)
    assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(800 / 9), 0.5)
    at = sq.evaluate(data, predictions, na_probs, threshold=0.6)   # q2 becomes "no answer": right
    assert at["exact"] == pytest.approx(200 / 3) and at["NoAns_exact"] == 100.0


def test_agrees_with_the_official_v2_script_on_many_random_cases():
    rng = random.Random(0)
    words = ["the", "a", "cat", "Cat,", "sat", "on", "mat", "1990", "an", "dog", "Dog!", ""]
    golds, preds, na = {}, {}, {}
    for i in range(400):
        qid = f"q{i}"
        golds[qid] = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 3))]
        preds[qid] = " ".join(rng.choice(words) for _ in range(rng.randint(0, 4)))
        na[qid] = rng.random()
    data = _dataset([{"id": q, "answers": [{"text": t, "answer_start": 0} for t in g]} for q, g in golds.items()])
    for qid, gold in golds.items():
        answers = [t for t in gold if official.normalize_answer(t)] or [""]
        assert max(sq.exact_match(a, preds[qid]) for a in answers) == max(official.compute_exact(a, preds[qid])
                                                                           for a in answers)
        assert max(sq.f1(a, preds[qid]) for a in answers) == pytest.approx(
            max(official.compute_f1(a, preds[qid]) for a in answers))
    has_answer = {q: bool([t for t in g if official.normalize_answer(t)]) for q, g in golds.items()}
    exact, f1s = sq.raw_scores(sq.questions(data), preds)
    for ours, scores in ((sq.best_threshold(preds, exact, na, has_answer), exact),
                         (sq.best_threshold(preds, f1s, na, has_answer), f1s)):
        assert ours == pytest.approx(official.find_best_thresh(preds, scores, na, has_answer))
