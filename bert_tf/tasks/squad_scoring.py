"""SQuAD exact match and F1, computed the way the official v1.1 and v2.0 evaluation scripts do.

An answer and a prediction are compared after normalisation: lower case, punctuation removed,
the English articles a/an/the removed, whitespace collapsed. Exact match is 1 when the normalised
strings are equal; F1 is over their whitespace tokens (bag of words, counts clipped). A question
scores the maximum over its gold answers.

v2.0 adds unanswerable questions (no gold answer, or only answers that normalise to ""): their one
gold answer is "", so a prediction scores 1 only when it is empty too. With `na_probs` (the model's
no-answer score per question, `null_odds.json`) a threshold turns predictions into "no answer";
`evaluate` reports the scores at the threshold given and the best thresholds for exact match and
F1, over all questions and split into HasAns / NoAns, as the official script does.
"""

from __future__ import annotations

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1(gold: str, prediction: str, version: str = "2.0") -> float:
    gold_tokens, predicted = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if version == "2.0" and (
        not gold_tokens or not predicted
    ):  # "no answer" matches only "no answer"
        return float(gold_tokens == predicted)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(predicted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(question: dict, version: str = "2.0") -> list:
    """The gold texts of one question of the official JSON. v2.0: answers that normalise to "" are
    dropped, and an unanswerable question has the one gold answer ""; v1.1 takes every text."""
    texts = [a["text"] for a in question.get("answers", [])]
    if version == "1.1":
        return texts
    return [t for t in texts if normalize_answer(t)] or [""]


def questions(dataset: list, version: str = "2.0") -> dict:
    """{question id: gold texts} of the official JSON's "data" list."""
    return {
        qa["id"]: gold_answers(qa, version)
        for article in dataset
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


def raw_scores(golds: dict, predictions: dict, version: str = "2.0") -> tuple[dict, dict]:
    """Per question: (exact, f1), the maximum over its gold answers. A question without a prediction
    is an error (a score over a subset would look better than it is)."""
    missing = [qid for qid in golds if qid not in predictions]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(golds)} questions have no prediction (first: {missing[0]!r})"
        )
    exact = {
        qid: max(exact_match(g, predictions[qid]) for g in gold) for qid, gold in golds.items()
    }
    f1s = {qid: max(f1(g, predictions[qid], version) for g in gold) for qid, gold in golds.items()}
    return exact, f1s


def apply_threshold(scores: dict, na_probs: dict, has_answer: dict, threshold: float) -> dict:
    """A question whose no-answer score exceeds the threshold is predicted unanswerable: 1 if it
    is."""
    return {
        qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score
        for qid, score in scores.items()
    }


def best_threshold(
    predictions: dict, scores: dict, na_probs: dict, has_answer: dict
) -> tuple[float, float]:
    """(best score in %, its threshold): every question starts as "no answer" (1 for the
    unanswerable ones); walking the no-answer scores upwards, each question in turn keeps its
    prediction."""
    score = best = sum(1 for qid in scores if not has_answer[qid])
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, threshold = score, na_probs[qid]
    return 100.0 * best / len(scores), threshold


def evaluate(
    dataset: list,
    predictions: dict,
    na_probs: dict | None = None,
    threshold: float = 1.0,
    version: str = "2.0",
) -> dict:
    """The official script's output, in %. v1.1: exact_match and f1. v2.0: exact, f1, total,
    HasAns_* / NoAns_* (each where such questions exist) and, with na_probs, best_exact / best_f1
    with their thresholds."""
    if version not in ("1.1", "2.0"):
        raise ValueError(f"SQuAD version {version!r}: 1.1 or 2.0")
    golds = questions(dataset, version)
    if version == "1.1":
        exact, f1s = raw_scores(golds, predictions, version)
        return {
            "exact_match": 100.0 * sum(exact.values()) / len(golds),
            "f1": 100.0 * sum(f1s.values()) / len(golds),
        }
    has_answer = {qid: gold != [""] for qid, gold in golds.items()}
    exact, f1s = raw_scores(golds, predictions)
    if na_probs is not None:
        missing = [qid for qid in golds if qid not in na_probs]
        if missing:
            raise ValueError(
                f"{len(missing)} questions have no no-answer score (first: {missing[0]!r})"
            )
        exact_at, f1_at = (
            apply_threshold(s, na_probs, has_answer, threshold) for s in (exact, f1s)
        )
    else:
        exact_at, f1_at = exact, f1s

    def summary(qids, prefix=""):
        n = len(qids)
        return {
            f"{prefix}exact": 100.0 * sum(exact_at[q] for q in qids) / n,
            f"{prefix}f1": 100.0 * sum(f1_at[q] for q in qids) / n,
            f"{prefix}total": n,
        }

    out = summary(list(golds))
    for prefix, want in (("HasAns_", True), ("NoAns_", False)):
        qids = [q for q in golds if has_answer[q] == want]
        if qids:
            out.update(summary(qids, prefix))
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(
            predictions, exact, na_probs, has_answer
        )
        out["best_f1"], out["best_f1_thresh"] = best_threshold(
            predictions, f1s, na_probs, has_answer
        )
    return out
