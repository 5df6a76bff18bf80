"""Two fine-tuning tasks made from a corpus's own documents, for proving on a machine without GLUE or
SQuAD that pre-training helped (run/finetune_proof.py):

- same_document: two sentences from the same document (not adjacent) or from two different documents,
  labels "same" / "different", half each; a sentence-pair classification task.
- word_order: a sentence and the next one, the second as written or with two pairs of neighbouring words
  swapped, labels "kept" / "swapped"; a sentence-pair fluency task.
- spans: SQuAD-layout questions whose answers are spans of the corpus text: the context is a few
  consecutive sentences of a document, the question one of them with a word replaced by "what",
  the answer that word where it stands in the context.

Deterministic in the seed; documents are split between train and dev, so no dev sentence is seen in
training.
"""
from __future__ import annotations

import random

from bert_tf import classification


def split_documents(documents, dev_fraction, seed):
    docs = [d for d in documents if len(d) >= 4]
    random.Random(seed).shuffle(docs)
    n_dev = max(1, int(len(docs) * dev_fraction))
    return docs[n_dev:], docs[:n_dev]


def same_document(documents, n, seed) -> classification.Examples:
    """n sentence pairs: "same" (one document, at least two sentences apart) or "different"."""
    rng = random.Random(seed)
    labels, a, b = [], [], []
    for i in range(n):
        doc = rng.choice(documents)
        first = rng.randrange(len(doc))
        if i % 2 == 0:
            far = [j for j in range(len(doc)) if abs(j - first) >= 2]
            second, label = doc[rng.choice(far)], "same"
        else:
            other = rng.choice([d for d in documents if d is not doc])
            second, label = rng.choice(other), "different"
        labels.append(label)
        a.append(doc[first])
        b.append(second)
    return classification.Examples(labels, a, b)


def word_order(documents, n, seed, swaps=2) -> classification.Examples:
    """n sentence pairs (a sentence, the one after it): "kept" when the second is as written, "swapped" when
    `swaps` pairs of neighbouring words in it trade places; half each. A fluency judgement (as CoLA asks)
    that a masked LM's knowledge of word order helps with, and that the first sentence gives context to."""
    rng = random.Random(seed)
    labels, a, b = [], [], []
    while len(labels) < n:
        doc = rng.choice(documents)
        i = rng.randrange(len(doc) - 1)
        words = doc[i + 1].split()
        if len(words) < 2 * swaps + 2:
            continue
        label = "kept" if len(labels) % 2 == 0 else "swapped"
        if label == "swapped":
            for k in rng.sample(range(len(words) - 1), swaps):
                words[k], words[k + 1] = words[k + 1], words[k]
            if words == doc[i + 1].split():       # swaps that undid each other, or of equal words
                continue
        labels.append(label)
        a.append(doc[i])
        b.append(" ".join(words))
    return classification.Examples(labels, a, b)


def spans(documents, n, seed, sentences=3, min_word_length=5) -> list:
    """n questions in SQuAD's JSON layout (its "data" list): one paragraph per question."""
    rng = random.Random(seed)
    data, made = [], 0
    while made < n:
        doc = rng.choice(documents)
        start = rng.randrange(max(1, len(doc) - sentences + 1))
        chosen = [" ".join(s.split()) for s in doc[start:start + sentences]]
        target = rng.randrange(len(chosen))
        words = chosen[target].split()
        candidates = [i for i, w in enumerate(words) if len(w) >= min_word_length and w.isalpha()]
        if not candidates:
            continue
        k = rng.choice(candidates)
        context = " ".join(chosen)
        offset = sum(len(s) + 1 for s in chosen[:target]) + sum(len(w) + 1 for w in words[:k])
        question = " ".join(words[:k] + ["what"] + words[k + 1:])
        assert context[offset:offset + len(words[k])] == words[k]
        data.append({"title": f"q{made}", "paragraphs": [{"context": context, "qas": [
            {"id": f"q{made}", "question": question, "answers": [{"text": words[k], "answer_start": offset}]}]}]})
        made += 1
    return data
