"""Two fine-tuning tasks made from a corpus's own documents, for proving on a machine without GLUE
or SQuAD that pre-training helped (run/finetune_proof.py):

- same_document: two sentences from the same document (not adjacent) or from two different
  documents, labels "same" / "different", half each; a sentence-pair classification task.
- word_order: a sentence and the next one, the second as written or with two pairs of neighbouring
  words swapped, labels "kept" / "swapped"; a sentence-pair fluency task.
- spans: SQuAD-layout questions whose answers are spans of the corpus text: the context is a few
  consecutive sentences of a document, the question one of them with a word replaced by "what",
  the answer that word where it stands in the context.
- odd_word: SQuAD-layout questions asking which word of a sentence does not belong: one of its words
  was replaced by a whole word of the model's WordPiece vocabulary, drawn uniformly; the answer is
  that word where it stands. Masked-LM pre-training replaces 1 in 10 of its masked tokens by a
  random vocabulary token and trains the model to see through it, so this span task asks for what
  pre-training teaches.

Deterministic in the seed; documents are split between train and dev, so no dev sentence is seen in
training.
"""

from __future__ import annotations

import random

from bert_tf.tasks import classification


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
    """n sentence pairs (a sentence, the one after it): "kept" when the second is as written,
    "swapped" when `swaps` pairs of neighbouring words in it trade places; half each. A fluency
    judgement (as CoLA asks) that a masked LM's knowledge of word order helps with, and that the
    first sentence gives context to."""
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
            if words == doc[i + 1].split():  # swaps that undid each other, or of equal words
                continue
        labels.append(label)
        a.append(doc[i])
        b.append(" ".join(words))
    return classification.Examples(labels, a, b)


def _pick_word(documents, rng, sentences, min_word_length):
    """(a few consecutive sentences of one document as word lists, which sentence, which word in it)
    or None when the chosen sentence has no alphabetic word of min_word_length letters."""
    doc = rng.choice(documents)
    start = rng.randrange(max(1, len(doc) - sentences + 1))
    chosen = [s.split() for s in doc[start : start + sentences]]
    target = rng.randrange(len(chosen))
    candidates = [
        i for i, w in enumerate(chosen[target]) if len(w) >= min_word_length and w.isalpha()
    ]
    return (chosen, target, rng.choice(candidates)) if candidates else None


def _question(made, chosen, target, k, question):
    """One SQuAD "data" entry: the context is the sentences joined by spaces, the answer
    chosen[target][k]."""
    context = " ".join(" ".join(words) for words in chosen)
    offset = sum(len(" ".join(words)) + 1 for words in chosen[:target]) + sum(
        len(w) + 1 for w in chosen[target][:k]
    )
    answer = chosen[target][k]
    assert context[offset : offset + len(answer)] == answer
    return {
        "title": f"q{made}",
        "paragraphs": [
            {
                "context": context,
                "qas": [
                    {
                        "id": f"q{made}",
                        "question": question,
                        "answers": [{"text": answer, "answer_start": offset}],
                    }
                ],
            }
        ],
    }


def spans(documents, n, seed, sentences=3, min_word_length=5) -> list:
    """n questions in SQuAD's JSON layout (its "data" list): one paragraph per question."""
    rng = random.Random(seed)
    data = []
    while len(data) < n:
        picked = _pick_word(documents, rng, sentences, min_word_length)
        if picked:
            chosen, target, k = picked
            question = " ".join(chosen[target][:k] + ["what"] + chosen[target][k + 1 :])
            data.append(_question(len(data), chosen, target, k, question))
    return data


ODD_WORD_QUESTION = "which word does not belong here?"


def vocabulary_words(vocab, min_length=3):
    """The whole alphabetic words of a WordPiece vocabulary (no ##pieces, specials or
    punctuation)."""
    return [w for w in vocab if w.isalpha() and len(w) >= min_length]


def odd_word(documents, n, seed, words, sentences=1, min_word_length=5) -> list:
    """n questions in SQuAD's JSON layout: in `sentences` consecutive sentences of a document, one
    word of min_word_length letters replaced by one of `words` (vocabulary_words of the model's
    vocabulary: one token each) drawn uniformly and in none of the sentences; the question is
    ODD_WORD_QUESTION, the answer the inserted word."""
    rng = random.Random(seed)
    data = []
    while len(data) < n:
        picked = _pick_word(documents, rng, sentences, min_word_length)
        if not picked:
            continue
        chosen, target, k = picked
        inserted = rng.choice(words)
        if inserted in {w.lower() for sentence in chosen for w in sentence}:
            continue
        chosen[target][k] = inserted
        data.append(_question(len(data), chosen, target, k, ODD_WORD_QUESTION))
    return data
