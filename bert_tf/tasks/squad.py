"""SQuAD v1.1 and v2.0: the official JSON in, windows of tokens, a start/end span head, n-best
answers mapped back to the context's own text, predictions.json and null_odds.json out. Behaviour
follows google-research/bert's run_squad.py (Devlin et al. 2019):

- The context is split on whitespace into words; each word is WordPiece-tokenised, remembering which
  word every token came from, so a span of tokens maps back to a span of words and then to the
  original characters (squad_answers.final_text, which also drops what tokenisation added or
  removed).
- A question longer than --max_query_length is cut to it (and counted). A context longer than a
  window becomes several windows of --max_seq_length tokens ([CLS] question [SEP] context [SEP]),
  each starting --doc_stride tokens after the previous one; a token's best window is the one where
  it has the most context on both sides, and only there can an answer start.
- Training: a window that does not contain the whole answer, and every window of an unanswerable
  v2.0 question, is trained to point at [CLS] (position 0): "no answer here".
- Prediction (squad_answers): the n best (start, end) pairs of each window (--n_best_size, at most
  --max_answer_length tokens, starting in its best window), best over the windows. v2.0: the
  no-answer score is the smallest [CLS] start + end logit over the windows, and a question is
  answered "" when that score exceeds the best span's by more than --null_score_diff_threshold;
  null_odds.json holds the difference, for squad_scoring's best thresholds.

`SquadTask` is the finetuning.FinetuningTask: finetuning.run fine-tunes it and returns its
`Answers`, scored as the official scripts score them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import numpy as np
import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.model import modeling
from bert_tf.tasks import finetuning, squad_answers, squad_scoring


@dataclasses.dataclass
class Example:
    qid: str
    question: str
    words: list  # the context split on whitespace
    start_word: int = -1  # training: the first answer's words; -1 when there is none
    end_word: int = -1
    answer: str = ""
    impossible: bool = False


def _is_whitespace(ch) -> bool:
    return ch in " \t\r\n" or ord(ch) == 0x202F


def split_words(context: str):
    """(words, word index of every character) of a context, split on whitespace."""
    words, char_to_word, previous_space = [], [], True
    for ch in context:
        if _is_whitespace(ch):
            previous_space = True
        else:
            if previous_space:
                words.append(ch)
            else:
                words[-1] += ch
            previous_space = False
        char_to_word.append(len(words) - 1)
    return words, char_to_word


def read_examples(path: str, version: str, training: bool, log=print) -> list:
    """The official JSON's questions. Training takes each question's first answer; one whose
    `answer_start` does not point at its text is skipped, counted and named."""
    if version not in ("1.1", "2.0"):
        raise ConfigError(f"--version={version}: 1.1 or 2.0")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)["data"]
    except FileNotFoundError:
        raise ConfigError(f"{path} not found") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f'{path} is not SQuAD\'s JSON (a top-level "data" list): {e}') from None
    return examples_of(data, version, training, path, log)


def examples_of(data: list, version: str, training: bool, path="(in memory)", log=print) -> list:
    """The questions of the official JSON's "data" list (read_examples); `path` names it in
    messages."""
    examples, mismatched = [], []
    for article in data:
        for paragraph in article["paragraphs"]:
            words, char_to_word = split_words(paragraph["context"])
            for qa in paragraph["qas"]:
                example = Example(
                    qa["id"],
                    qa["question"],
                    words,
                    impossible=version == "2.0" and bool(qa.get("is_impossible", False)),
                )
                if training and not example.impossible:
                    if not qa.get("answers"):
                        hint = "" if version == "2.0" else ": a v2.0 file? give --version=2.0"
                        raise ConfigError(
                            f"{path}: question {qa['id']!r} has no answer (and is not marked "
                            f"is_impossible{hint})"
                        )
                    answer = qa["answers"][0]
                    start, text = answer["answer_start"], answer["text"]
                    if (
                        not text
                        or start < 0
                        or start + len(text) > len(char_to_word)
                        or paragraph["context"][start : start + len(text)] != text
                    ):
                        mismatched.append(qa["id"])
                        continue
                    example.start_word, example.end_word = (
                        char_to_word[start],
                        char_to_word[start + len(text) - 1],
                    )
                    example.answer = text
                examples.append(example)
    if mismatched:
        log(
            f"warning: {path}: {len(mismatched)} answers whose answer_start does not point at "
            f"their text were skipped (first: question {mismatched[0]!r})"
        )
    if not examples:
        raise ConfigError(f"{path}: no questions")
    return examples


@dataclasses.dataclass
class Window:
    example: int  # index into the examples
    input_ids: list
    segment_ids: list
    token_to_word: dict  # position -> word index, for the context's tokens
    best_window: dict  # position -> whether this is the token's best window
    start: int = 0  # training: the answer's positions; 0 ([CLS]) for "not in this window"
    end: int = 0


@dataclasses.dataclass
class Counts:
    questions_cut: int = 0  # longer than --max_query_length
    split_contexts: int = 0  # contexts longer than one window
    windows: int = 0


def make_windows(
    examples, tokenizer, max_seq_length=384, doc_stride=128, max_query_length=64, training=False
):
    """(windows, Counts) of the examples, as module docstring says."""
    if max_query_length + 4 > max_seq_length or doc_stride < 1:
        raise ConfigError(
            f"--max_query_length={max_query_length} leaves no room for the context in "
            f"--max_seq_length={max_seq_length}"
            if doc_stride >= 1
            else "--doc_stride must be >= 1"
        )
    windows, counts = [], Counts()
    for index, example in enumerate(examples):
        query = tokenizer.ids(example.question)
        if len(query) > max_query_length:
            counts.questions_cut += 1
            query = query[:max_query_length]
        tokens, token_word, word_first_token = [], [], []
        for w, word in enumerate(example.words):
            word_first_token.append(len(tokens))
            pieces = tokenizer.ids(word)
            tokens += pieces
            token_word += [w] * len(pieces)
        start = end = None
        if training and not example.impossible:
            start = word_first_token[example.start_word]
            end = (
                word_first_token[example.end_word + 1] - 1
                if example.end_word + 1 < len(example.words)
                else len(tokens) - 1
            )
            start, end = _tighten(tokens, start, end, tokenizer.ids(example.answer))
        room = max_seq_length - len(query) - 3
        spans, offset = [], 0
        while True:
            length = min(len(tokens) - offset, room)
            spans.append((offset, length))
            if offset + length >= len(tokens):
                break
            offset += min(length, doc_stride)
        counts.split_contexts += len(spans) > 1
        for s, (offset, length) in enumerate(spans):
            ids = [tokenizer.cls_id] + query + [tokenizer.sep_id]
            first = len(ids)
            ids += tokens[offset : offset + length] + [tokenizer.sep_id]
            window = Window(
                index,
                ids,
                [0] * first + [1] * (length + 1),
                {first + i: token_word[offset + i] for i in range(length)},
                {first + i: _best_window(spans, s, offset + i) for i in range(length)},
            )
            if start is not None and offset <= start and end < offset + length:
                window.start, window.end = first + start - offset, first + end - offset
            windows.append(window)
    counts.windows = len(windows)
    return windows, counts


def _tighten(tokens, start, end, answer):
    """The answer's word span in tokens can be wider than the answer ("(1895-1943)." for "1895"):
    the narrowest sub-span whose tokens are the answer's own, else the word span."""
    for a in range(start, end + 1):
        for b in range(end, a - 1, -1):
            if tokens[a : b + 1] == answer:
                return a, b
    return start, end


def _best_window(spans, current, position) -> bool:
    """Whether `position` (a context token) has its most context, on its shorter side, in span
    `current`."""
    best, best_span = None, None
    for s, (offset, length) in enumerate(spans):
        if offset <= position < offset + length:
            score = min(position - offset, offset + length - 1 - position) + 0.01 * length
            if best is None or score > best:
                best, best_span = score, s
    return best_span == current


def features(windows, max_seq_length, training=False) -> dict:
    """Windows as the model's numpy features (and start/end positions when training)."""
    n = len(windows)
    ids = np.zeros([n, max_seq_length], np.int32)
    mask, segments = np.zeros_like(ids), np.zeros_like(ids)
    for i, w in enumerate(windows):
        (
            ids[i, : len(w.input_ids)],
            mask[i, : len(w.input_ids)],
            segments[i, : len(w.segment_ids)],
        ) = w.input_ids, 1, w.segment_ids
    out = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    if training:
        out["start_position"] = np.array([w.start for w in windows], np.int32)
        out["end_position"] = np.array([w.end for w in windows], np.int32)
    return out


class BertSpanExtractor(tf.Module):
    """Encoder -> sequence [B, S, H] -> dense [B, S, 2]: start and end logits; the loss is the mean
    of the start and end cross-entropies over the sequence (padding masked out)."""

    def __init__(self, config: modeling.BertConfig, name=None):
        super().__init__(name=name)
        self.config = config
        self.encoder = modeling.encoder(config)
        self.span = modeling.Dense(config.hidden_size, 2, config.initializer_range)

    def logits(self, features, dtype=tf.float32, seed=None, training=False):
        """(start [B, S], end [B, S]) float32, padding at -10000."""
        seed = tf.zeros([2], tf.int32) if seed is None else seed
        sequence, _ = self.encoder(
            features["input_ids"],
            features["input_mask"],
            features["segment_ids"],
            dtype=dtype,
            seed=seed,
            training=training,
        )
        logits = tf.cast(self.span(sequence), tf.float32)
        padding = (1.0 - tf.cast(features["input_mask"], tf.float32)) * -10000.0
        return logits[..., 0] + padding, logits[..., 1] + padding

    def predict(self, features):
        """[B, 2, S]: start and end logits (one array for finetuning.predict)."""
        return tf.stack(self.logits(features), axis=1)

    def __call__(
        self, features, *, dtype=tf.float32, seed=None, training=False
    ) -> finetuning.FinetuneOutput:
        start, end = self.logits(features, dtype, seed, training)
        loss = 0.5 * (
            tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(features["start_position"], start)
            )
            + tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(features["end_position"], end)
            )
        )
        return finetuning.FinetuneOutput(loss=loss, count=tf.cast(tf.shape(start)[0], tf.float32))


@dataclasses.dataclass(frozen=True)
class Windowing:
    """make_windows' settings: tokens per window, the stride between a context's windows, the
    longest question."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64


@dataclasses.dataclass
class Answers:
    """A SquadTask's predictions: every question's answer ("": none, v2.0), the no-answer score's
    lead over the best span's (v2.0; null_odds.json) and the n best answers
    (nbest_predictions.json)."""

    text: dict[str, str]
    null_odds: dict[str, float]
    nbest: dict[str, list]


@dataclasses.dataclass
class SquadTask:
    """finetuning.FinetuningTask: SQuAD v1.1 or v2.0 questions cut into windows, a
    BertSpanExtractor, answers from the windows' logits, and the official scripts' scores of
    `dataset` (the official JSON's "data" the questions come from; no metrics without it). train:
    questions to fine-tune on (None: predict with the untrained head). `counts` holds the windows
    made of each ("train", "predict")."""

    questions: list
    train: list | None = None
    windowing: Windowing = Windowing()
    version: str = "1.1"
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    dataset: list | None = None
    log: Callable = print
    name: str = "squad"
    counts: dict = dataclasses.field(default_factory=dict)

    def build_model(self, config: modeling.BertConfig) -> BertSpanExtractor:
        return BertSpanExtractor(config)

    def train_features(self, tokenizer) -> dict | None:
        if self.train is None:
            return None
        windows, counts = make_windows(
            self.train, tokenizer, training=True, **dataclasses.asdict(self.windowing)
        )
        self.counts["train"] = counts
        self.log(
            f"training: {len(self.train)} questions, {counts.windows} windows "
            f"({counts.split_contexts} contexts longer than one window, {counts.questions_cut} "
            f"questions cut to --max_query_length={self.windowing.max_query_length})"
        )
        return features(windows, self.windowing.max_seq_length, training=True)

    def predict(self, model, tokenizer) -> Answers:
        windows, self.counts["predict"] = make_windows(
            self.questions, tokenizer, **dataclasses.asdict(self.windowing)
        )
        logits = finetuning.predict(model.predict, features(windows, self.windowing.max_seq_length))
        return Answers(
            *squad_answers.predict_answers(
                self.questions,
                windows,
                logits,
                tokenizer,
                self.version,
                self.n_best_size,
                self.max_answer_length,
                self.null_score_diff_threshold,
            )
        )

    def metrics(self, answers: Answers) -> dict[str, float]:
        if self.dataset is None:
            return {}
        null_odds = answers.null_odds if self.version == "2.0" else None
        return squad_scoring.evaluate(self.dataset, answers.text, null_odds, version=self.version)

    def report(self, outcome: finetuning.Outcome) -> dict:
        """The windows made (eval.json's "predict" and "train") and, when it trained, the updates
        and last loss."""
        out: dict = {
            name: dataclasses.asdict(self.counts[name])
            for name in ("predict", "train")
            if name in self.counts
        }
        if outcome.train_steps:
            out.update(train_steps=outcome.train_steps, final_train_loss=outcome.final_train_loss)
        return out
