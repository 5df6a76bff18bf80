"""SQuAD's answers from the span head's logits, as google-research/bert's run_squad.py makes them:
the n best (start, end) pairs of each window (at most max_answer_length tokens, starting in the
window that is the start token's best), best over a question's windows, each mapped back to the
context's own characters (`final_text`). v2.0: the no-answer score is the smallest [CLS] start + end
logit over the windows, and a question is answered "" when that score exceeds the best span's by
more than null_score_diff_threshold. `write_predictions` writes the files the official scripts
read.
"""

from __future__ import annotations

import collections
import json
import math
import os

import numpy as np

from bert_tf.data import tokenization


def final_text(predicted: str, original: str, lower_case: bool) -> str:
    """The original words' text of a predicted span: `predicted` is the detokenised WordPiece text
    (lower-cased, punctuation split off), `original` the words it came from; the characters of
    `original` that line up with `predicted` once spaces are ignored, else `original` whole."""
    tokenized = " ".join(tokenization.basic_tokenize(original, lower_case))
    at = tokenized.find(predicted)
    if at < 0:
        return original

    def without_spaces(text):
        chars, positions = [], []
        for i, ch in enumerate(text):
            if ch != " ":
                chars.append(ch)
                positions.append(i)
        return "".join(chars), positions

    original_chars, original_at = without_spaces(original)
    tokenized_chars, tokenized_at = without_spaces(tokenized)
    # tokenisation changed characters (accents): keep it whole
    if len(original_chars) != len(tokenized_chars):
        return original
    index = {position: i for i, position in enumerate(tokenized_at)}
    first, last = index.get(at), index.get(at + len(predicted) - 1)
    if first is None or last is None:
        return original
    return original[original_at[first] : original_at[last] + 1]


def predict_answers(
    examples,
    windows,
    logits,
    tokenizer,
    version="1.1",
    n_best_size=20,
    max_answer_length=30,
    null_score_diff_threshold=0.0,
):
    """(predictions {qid: text}, null_odds {qid: score difference} (v2.0), n-best {qid: [entries]}).
    logits: [windows, 2, S], the start and end logits of every window."""
    by_example = collections.defaultdict(list)
    for w, window in enumerate(windows):
        by_example[window.example].append(w)
    predictions, null_odds, nbest_all = {}, {}, {}
    for e, example in enumerate(examples):
        candidates, null = _candidates(
            windows, by_example[e], logits, version, n_best_size, max_answer_length
        )
        nbest = _nbest(example, windows, candidates, tokenizer, n_best_size)
        if version == "2.0":  # "no answer" is always among them
            nbest.append({"text": "", "start_logit": float(null[1]), "end_logit": float(null[2])})
            nbest.sort(key=lambda x: -(x["start_logit"] + x["end_logit"]))
        if not nbest:
            nbest = [{"text": "", "start_logit": 0.0, "end_logit": 0.0}]
        _add_probabilities(nbest)
        if version == "2.0":
            null_odds[example.qid], predictions[example.qid] = _null_odds_and_answer(
                nbest, null[0], null_score_diff_threshold
            )
        else:
            predictions[example.qid] = nbest[0]["text"]
        nbest_all[example.qid] = nbest
    return predictions, null_odds, nbest_all


def _candidates(windows, window_ids, logits, version, n_best_size, max_answer_length):
    """(spans (score, start logit, end logit, window, start, end) of a question's windows, the
    v2.0 no-answer (score, start logit, end logit): the smallest over the windows, else None)."""
    candidates, null = [], None
    for w in window_ids:
        window, (start_logits, end_logits) = windows[w], logits[w]
        if version == "2.0":
            score = start_logits[0] + end_logits[0]
            if null is None or score < null[0]:
                null = (score, start_logits[0], end_logits[0])
        starts = np.argsort(-start_logits)[:n_best_size]
        ends = np.argsort(-end_logits)[:n_best_size]
        for s in starts:
            for t in ends:
                if (
                    s not in window.token_to_word
                    or t not in window.token_to_word
                    or not window.best_window[s]
                ):
                    continue
                if t < s or t - s + 1 > max_answer_length:
                    continue
                candidates.append(
                    (start_logits[s] + end_logits[t], start_logits[s], end_logits[t], w, s, t)
                )
    return candidates, null


def _nbest(example, windows, candidates, tokenizer, n_best_size) -> list:
    """The best `n_best_size` candidates with distinct texts, as {"text", "start_logit",
    "end_logit"}; each text the context's own (final_text)."""
    candidates = sorted(candidates, key=lambda c: -c[0])
    nbest, seen = [], set()
    for _, start_logit, end_logit, w, s, t in candidates:
        if len(nbest) == n_best_size:
            break
        window = windows[w]
        pieces = " ".join(tokenizer.vocab[i] for i in window.input_ids[s : t + 1])
        predicted = " ".join(pieces.replace(" ##", "").replace("##", "").split())
        words = " ".join(example.words[window.token_to_word[s] : window.token_to_word[t] + 1])
        text = final_text(predicted, words, tokenizer.lower_case)
        if text in seen:
            continue
        seen.add(text)
        nbest.append(
            {"text": text, "start_logit": float(start_logit), "end_logit": float(end_logit)}
        )
    return nbest


def _add_probabilities(nbest: list) -> None:
    """Each entry's "probability": the softmax of start + end logit over the entries."""
    scores = np.array([x["start_logit"] + x["end_logit"] for x in nbest])
    probabilities = np.exp(scores - scores.max())
    for entry, p in zip(nbest, probabilities / probabilities.sum()):
        entry["probability"] = float(p)


def _null_odds_and_answer(nbest: list, null_score, threshold: float) -> tuple[float, str]:
    """v2.0: (the no-answer score's lead over the best answered entry's, 1e9 when none is; the
    answer: "" when the lead exceeds `threshold`)."""
    answered = [x for x in nbest if x["text"]]
    best = answered[0] if answered else None
    difference = float(null_score) - (
        best["start_logit"] + best["end_logit"] if best else -math.inf
    )
    odds = difference if math.isfinite(difference) else 1e9
    return odds, "" if best is None or difference > threshold else best["text"]


def write_predictions(out_dir, predictions, null_odds, nbest, version):
    """predictions.json (and null_odds.json for v2.0) as the official evaluation scripts read them,
    nbest_predictions.json beside them."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"predictions": predictions, "nbest_predictions": nbest}
    if version == "2.0":
        paths["null_odds"] = null_odds
    for name, value in paths.items():
        with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, ensure_ascii=False)
