"""The proof tasks made from a corpus: deterministic, balanced, answers where they stand in the context,
dev documents never trained on."""
import collections

from bert_tf.data import corpus
from bert_tf.tasks import corpus_tasks, squad


def test_pairs_and_spans_from_the_bundled_news(corpus_dir):
    documents = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    train, dev = corpus_tasks.split_documents(documents, 0.2, seed=1)
    assert len(dev) >= 40 and not {id(d) for d in train} & {id(d) for d in dev}
    assert corpus_tasks.split_documents(documents, 0.2, seed=1) == (train, dev)
    pairs = corpus_tasks.same_document(train, 100, seed=2)
    assert collections.Counter(pairs.labels) == {"same": 50, "different": 50}
    where = {s: i for i, d in enumerate(train) for s in d}
    for label, a, b in zip(pairs.labels, pairs.texts_a, pairs.texts_b):
        assert (where[a] == where[b]) == (label == "same")          # sentences are distinct across documents here
    assert corpus_tasks.same_document(train, 100, seed=2) == pairs
    data = corpus_tasks.spans(dev, 50, seed=3)
    examples = squad.examples_of(data, "1.1", training=True)
    assert len(examples) == 50                                        # every answer_start points at its text
    dev_text = {" ".join(s.split()) for d in dev for s in d}
    for article, example in zip(data, examples):
        paragraph = article["paragraphs"][0]
        answer = paragraph["qas"][0]["answers"][0]["text"]
        assert " ".join(example.words[example.start_word:example.end_word + 1]).strip(".,;:!?\"'()") == answer
        assert "what" in paragraph["qas"][0]["question"].split()
        assert paragraph["context"].startswith(tuple(dev_text))      # made of dev documents' sentences


def test_word_order_pairs_are_the_next_sentence_kept_or_with_two_neighbour_swaps(corpus_dir):
    documents = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    follows = collections.defaultdict(set)                               # a sentence may occur more than once
    for d in documents:
        for a, b in zip(d, d[1:]):
            follows[a].add(b)
    task = corpus_tasks.word_order(documents, 200, seed=4)
    assert collections.Counter(task.labels) == {"kept": 100, "swapped": 100}
    assert corpus_tasks.word_order(documents, 200, seed=4) == task
    for label, a, b in zip(task.labels, task.texts_a, task.texts_b):
        candidates = [o.split() for o in follows[a] if sorted(o.split()) == sorted(b.split())]
        assert candidates                                                 # the next sentence's words
        original = candidates[0]
        moved = [i for i, (x, y) in enumerate(zip(b.split(), original)) if x != y]
        assert (label == "kept") == (not moved)
        assert label == "kept" or 2 <= len(moved) <= 4                   # two swaps of neighbours (they may touch)


def test_odd_word_questions_answer_the_one_replaced_word(corpus_dir):
    documents = list(corpus.read_documents([str(corpus_dir / "lee_background.cor") + "@documents"]))
    _, dev = corpus_tasks.split_documents(documents, 0.2, seed=1)
    words = corpus_tasks.vocabulary_words(["[PAD]", "[CLS]", "##ing", "of", "2001", "harbour", "cricket", "rain",
                                           "minister", "jury", "ocean", "a.m", "café", "lamb", "said", "violin"])
    assert words == ["harbour", "cricket", "rain", "minister", "jury", "ocean", "café", "lamb", "said", "violin"]
    data = corpus_tasks.odd_word(dev, 60, seed=5, words=words)
    assert data == corpus_tasks.odd_word(dev, 60, seed=5, words=words)
    assert len(squad.examples_of(data, "1.1", training=True)) == 60    # every answer_start points at its text
    sentences = [s.split() for d in dev for s in d]
    inserted = collections.Counter()
    for article in data:
        paragraph = article["paragraphs"][0]
        qa = paragraph["qas"][0]
        assert qa["question"] == corpus_tasks.ODD_WORD_QUESTION
        answer, start = qa["answers"][0]["text"], qa["answers"][0]["answer_start"]
        context, j = paragraph["context"].split(), len(paragraph["context"][:start].split())
        # never a word the sentence has already
        assert context[j] == answer and answer in words and answer not in [w.lower() for w in context[:j] + context[j + 1:]]
        # a dev sentence with exactly the answer's word replaced, and that word of 5 letters or more
        originals = [s[j] for s in sentences if len(s) == len(context) and s[:j] == context[:j] and s[j + 1:] == context[j + 1:]]
        assert originals and all(o != answer and len(o) >= 5 and o.isalpha() for o in originals), paragraph
        inserted[answer] += 1
    assert len(inserted) == len(words)                                 # drawn over every word
    for article in corpus_tasks.odd_word(dev, 20, seed=6, words=["the", "violin"]):   # "the" is in most sentences
        paragraph = article["paragraphs"][0]
        answer = paragraph["qas"][0]["answers"][0]["text"]
        assert [w.lower() for w in paragraph["context"].split()].count(answer) == 1, paragraph
