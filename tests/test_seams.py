"""The typed seams: every exchange, encoder and fine-tuning task satisfies its Protocol, and the code that
uses them relies on nothing else (a stand-in that keeps only the contract trains)."""
import numpy as np
import pytest

from bert_tf.parallel import compression, exchange, local_sgd


def _variables():
    import tensorflow as tf
    return [tf.Variable(tf.ones([64, 32])), tf.Variable(tf.ones([32]))]


def test_every_gradient_exchange_keeps_the_contract():
    variables = _variables()
    made = [exchange.Local(), exchange.Allreduce(), exchange.Allreduce(fp16=True), exchange.Function(lambda g: g),
            compression.CompressedExchange("powersgd", variables, rank=2),
            compression.CompressedExchange("onebit", variables),
            local_sgd.OuterStep(variables, every=4), local_sgd.OuterStep(variables, inner=exchange.Allreduce())]
    for e in made:
        assert isinstance(e, exchange.GradientExchange), type(e).__name__
    assert [e.method for e in made] == ["none", "none", "fp16", "none", "powersgd", "onebit", "diloco", "diloco"]
    # state: error feedback is each rank's own; DiLoCo's anchor and momentum every rank's alike
    assert [len(e.own()) for e in made] == [0, 0, 0, 0, 1, 2, 0, 0]
    assert len(made[6].shared()) == 2 * len(variables) + 2 and made[4].shared() and not made[5].shared()


def test_a_plain_function_is_taken_as_an_exchange_and_anything_else_is_refused():
    assert isinstance(exchange.as_exchange(lambda grads: grads), exchange.Function)
    with pytest.raises(TypeError, match="neither a GradientExchange nor a function"):
        exchange.as_exchange(3)


def test_the_trainer_uses_only_the_contract():
    """A stand-in exchange with only the Protocol's members (negating the gradients, counting its calls) is what
    the trainer's update goes through: AdamW's first step, without weight decay, is then the plain one negated."""
    import tensorflow as tf

    from bert_tf.model import modeling
    from bert_tf.train import training
    from conftest import random_features

    class Negating(exchange.Stateless):
        calls = 0

        def __call__(self, grads, scale=None):
            Negating.calls += 1
            return [-g for g in grads]

        def wait_for_ranks(self):
            return None

    config = training.TrainConfig(optimizer="adamw", weight_decay=0.0, learning_rate=1e-3)
    batch = {k: tf.constant(v) for k, v in random_features().items()}
    moved = []
    for e in (None, Negating()):
        tf.random.set_seed(3)
        model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, hidden_dropout_prob=0.0,
                                                                   attention_probs_dropout_prob=0.0))
        trainer = training.Trainer(model, config, exchange=e)
        before = [v.numpy().copy() for v in trainer.variables]
        trainer.train_step([batch], timed=True)
        moved.append(np.concatenate([(v.numpy() - b).ravel() for b, v in zip(before, trainer.variables)]))
    assert Negating.calls == 1
    assert np.abs(moved[0]).max() > 1e-4
    np.testing.assert_allclose(moved[1], -moved[0], rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("architecture", ["bert", "modern"])
def test_both_encoders_keep_the_encoder_contract(architecture):
    """Built by modeling.encoder, each is an Encoder: the call gives [B, S, H] and [B, H], pool gives [B, K, H] at
    positions, and packed rows (position_ids, instance_ids) are taken."""
    import tensorflow as tf

    from bert_tf.model import modeling
    preset = "tiny" if architecture == "bert" else "modern-tiny"
    config = modeling.BertConfig.preset(preset, vocab_size=100)
    encoder = modeling.encoder(config)
    assert isinstance(encoder, modeling.Encoder) and encoder.config is config
    ids = tf.constant(np.arange(2 * 8).reshape(2, 8) % 90 + 5, tf.int32)
    ones, zeros = tf.ones([2, 8], tf.int32), tf.zeros([2, 8], tf.int32)
    sequence, pooled = encoder(ids, ones, zeros)
    assert sequence.shape == (2, 8, config.hidden_size) and pooled.shape == (2, config.hidden_size)
    assert encoder.pool(sequence, tf.constant([[0, 4]] * 2)).shape == (2, 2, config.hidden_size)
    positions = tf.constant([[0, 1, 2, 3, 0, 1, 2, 3]] * 2)
    instances = tf.constant([[1, 1, 1, 1, 2, 2, 2, 2]] * 2)
    packed, _ = encoder(ids, ones, zeros, position_ids=positions, instance_ids=instances)
    alone, _ = encoder(ids[:, 4:], ones[:, 4:], zeros[:, 4:])
    np.testing.assert_allclose(packed[:, 4:].numpy(), alone.numpy(), atol=1e-5)   # attention within an instance
    assert len(encoder.trainable_variables) > 4


def test_every_finetuning_task_and_the_heads_they_build_keep_the_contract():
    """GLUE, SQuAD, encoded text classification and the corpus tasks are finetuning.FinetuningTasks, and the heads
    they build are FinetuningModels (STS-B's a regressor); GLUE's metadata record is not a task."""
    from bert_tf.model import modeling
    from bert_tf.tasks import classification, finetuning, glue, glue_sweep, proof, squad

    encoded = classification.Labelled({"input_ids": np.zeros([2, 4], np.int32)}, np.zeros([2], np.int32))
    tasks = [glue_sweep.GlueTask(glue.TASKS["mnli"], {"train": glue.Split([])}, 32),
             glue_sweep.GlueTask(glue.TASKS["stsb"], {"train": glue.Split([])}, 32),
             squad.SquadTask([]), classification.Classification(["neg", "pos"], encoded, encoded),
             proof.CorpusPairTask("word_order", [], [], seed=1), proof.CorpusSpanTask("odd_word", [], [], seed=1)]
    for task in tasks:
        assert isinstance(task, finetuning.FinetuningTask), type(task).__name__
    assert [t.name for t in tasks] == ["mnli", "stsb", "squad", "classification", "word_order", "odd_word"]
    assert not isinstance(glue.TASKS["mnli"], finetuning.FinetuningTask)
    heads = [t.build_model(modeling.BertConfig.preset("tiny", vocab_size=100)) for t in tasks]
    for head in heads:
        assert isinstance(head, finetuning.FinetuningModel), type(head).__name__
    assert [type(h).__name__ for h in heads] == ["BertClassifier", "BertClassifier", "BertSpanExtractor",
                                                 "BertClassifier", "BertClassifier", "BertSpanExtractor"]
    assert [h.regression for h in heads if hasattr(h, "regression")] == [False, True, False, False]


def test_the_fine_tuning_loop_uses_only_the_task_contract():
    """A stand-in task and head with only the contracts' members (one number regressed from 12 rows of tokens) go
    through finetuning.run: the recipe's updates, each through the Distributed's exchange, rank 0's weights
    broadcast once, a finite loss, the task's own predictions and metrics back. The same seed without training
    features predicts with the same weights untrained; a batch the ranks cannot split stops before a model is built."""
    import math

    import tensorflow as tf

    from bert_tf import ConfigError
    from bert_tf.model import modeling
    from bert_tf.tasks import finetuning

    rng = np.random.RandomState(0)
    rows = {"input_ids": rng.randint(5, 100, [12, 8]).astype(np.int32), "input_mask": np.ones([12, 8], np.int32),
            "segment_ids": np.zeros([12, 8], np.int32)}
    target = (rows["input_ids"][:, 1] % 2).astype(np.float32)

    class Head(tf.Module):
        def __init__(self, config):
            super().__init__()
            self.config, self.encoder = config, modeling.encoder(config)
            self.out = modeling.Dense(config.hidden_size, 1, config.initializer_range)

        def predict(self, features, dtype=tf.float32, seed=None, training=False):
            _, pooled = self.encoder(features["input_ids"], features["input_mask"], features["segment_ids"],
                                     dtype=dtype, seed=tf.zeros([2], tf.int32) if seed is None else seed,
                                     training=training)
            return tf.cast(self.out(pooled), tf.float32)[:, 0]

        def __call__(self, features, *, dtype=tf.float32, seed=None, training=False):
            return finetuning.FinetuneOutput(
                loss=tf.reduce_mean(tf.square(self.predict(features, dtype, seed, training) - features["target"])))

    class Regression:
        name = "stand-in"

        def __init__(self, trains=True):
            self.trains, self.built, self.tokenizers = trains, 0, []

        def build_model(self, config):
            self.built += 1
            return Head(config)

        def train_features(self, tokenizer):
            self.tokenizers.append(tokenizer)
            return {**rows, "target": target} if self.trains else None

        def predict(self, model, tokenizer):
            return finetuning.predict(model.predict, rows, chunk=5)

        def metrics(self, predictions):
            return {"mean": float(np.mean(predictions)), "rows": len(predictions)}

    updates, broadcasts = tf.Variable(0), []       # the trainer runs the exchange in a tf.function: a TF counter

    def counting(grads):
        updates.assign_add(1)
        return grads
    config = modeling.BertConfig.preset("tiny", vocab_size=100)
    recipe = finetuning.Recipe(learning_rate=1e-3, global_batch=4, epochs=1.5, seed=3)   # 3 updates an epoch: 5
    tokenizer, task = object(), Regression()
    assert isinstance(task, finetuning.FinetuningTask) and isinstance(Head(config), finetuning.FinetuningModel)
    outcome = finetuning.run(task, tokenizer, config, None, recipe,
                             finetuning.Distributed(0, 1, exchange.Function(counting),
                                                    lambda variables: broadcasts.append(len(variables))))
    assert outcome.train_steps == 5 and int(updates.numpy()) == 5 and task.tokenizers == [tokenizer]
    assert broadcasts == [len(outcome.model.trainable_variables)] and math.isfinite(outcome.final_train_loss)
    assert outcome.predictions.shape == (12,)
    assert outcome.metrics == {"mean": pytest.approx(float(np.mean(outcome.predictions))), "rows": 12}
    untrained = finetuning.run(Regression(trains=False), tokenizer, config, None, recipe)
    assert untrained.train_steps == 0 and untrained.final_train_loss is None and int(updates.numpy()) == 5
    # run seeds TensorFlow with the recipe's seed: the same weights again, and they were the trained run's start
    np.testing.assert_array_equal(finetuning.run(Regression(trains=False), tokenizer, config, None, recipe).predictions,
                                  untrained.predictions)
    assert np.abs(outcome.predictions - untrained.predictions).max() > 1e-4
    again = Regression()
    with pytest.raises(ConfigError, match="not a positive multiple of the 3 ranks"):
        finetuning.run(again, tokenizer, config, None, recipe, finetuning.Distributed(0, 3))
    assert again.built == 0
