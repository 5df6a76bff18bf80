"""Windowed attention in blocks (model/local_attention.py) against the dense path it replaces
(layers.attend on modern.window_bias + layers.mask_bias_for): the same outputs and gradients at every
non-padding query, eager and under XLA, with padding and with packed rows; the window's exact edge; and a
whole ModernEncoder with the blocked path against the same encoder with it off.

Only non-padding queries are compared: a padding query with nothing but padding in its window has every key
masked, and the dense softmax then spreads it evenly over all S keys, the blocked one over its 3c (nothing
reads padding outputs; local_attention.py's docstring)."""
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.model import layers, local_attention, modeling, modern

WINDOW = 8          # local_attention: keys at most c = 4 tokens away, blocks of 4
HEADS, SIZE = 2, 8
# Three layers: 0 global, 1 and 2 local; 23 tokens > 3c = 12, so the local ones take blocks.
CONFIG = modeling.BertConfig.preset("modern-tiny", vocab_size=50, hidden_size=32, num_attention_heads=2,
                                    num_hidden_layers=3, intermediate_size=48, local_attention=WINDOW)


def qkv(seq, batch=3, seed=0, dtype=tf.float32):
    r = np.random.RandomState(seed)
    return [tf.constant(r.randn(batch, seq, HEADS, SIZE).astype(np.float32), dtype) for _ in range(3)]


def rows(seq, case):
    """input_mask [3, seq], instance_ids [3, seq] or None, and which queries to compare (bool [3, seq])."""
    mask = np.ones((3, seq), np.int32)
    if case == "plain":
        return mask, None, mask.astype(bool)
    if case == "padded":                       # padding from 13 and from 6 (not on a block edge)
        mask[1, 13:] = 0
        mask[2, 6:] = 0
        return mask, None, mask.astype(bool)
    # packed: two or three instances a row, boundaries off the blocks of 4, padding at the end of two rows
    ids = np.zeros((3, seq), np.int32)
    for row, ends in enumerate([(7, seq), (3, 10, seq - 2), (5, 14, seq - 1)]):
        start = 0
        for n, end in enumerate(ends, 1):
            ids[row, start:end] = n
            start = end
    mask = (ids > 0).astype(np.int32)
    return mask, ids, ids > 0


def dense(q, k, v, mask, ids, window=WINDOW):
    bias = layers.mask_bias_for(tf.constant(mask), None if ids is None else tf.constant(ids))
    return layers.attend(q, k, v, bias + modern.window_bias(q.shape[1], window), 0.0, None, False)


def blocked(q, k, v, mask, ids, window=WINDOW):
    wm = local_attention.window_mask(tf.constant(mask), None if ids is None else tf.constant(ids), window)
    return local_attention.attend(q, k, v, wm, 0.0, None, False)


def at(valid, x):
    """x [B, S, ...] at the compared queries only."""
    return np.asarray(x)[valid]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize("case", ["plain", "padded", "packed"])
@pytest.mark.parametrize("seq", [24, 23])     # a multiple of the block and not
def test_blocked_equals_dense_at_every_non_padding_query(seq, case, jit):
    mask, ids, valid = rows(seq, case)
    q, k, v = qkv(seq)
    run = lambda q, k, v: blocked(q, k, v, mask, ids)
    expected, got = dense(q, k, v, mask, ids), (tf.function(run, jit_compile=True) if jit else run)(q, k, v)
    assert got.shape == expected.shape and got.dtype == tf.float32
    np.testing.assert_allclose(at(valid, got), at(valid, expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize("case", ["padded", "packed"])
def test_gradients_equal_the_dense_ones(case, jit):
    seq = 23
    mask, ids, valid = rows(seq, case)
    q, k, v = qkv(seq, seed=1)
    weights = tf.constant(np.random.RandomState(2).randn(3, seq, HEADS, SIZE).astype(np.float32) * valid[..., None, None])

    def grads(attend):
        def f(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_sum(attend(q, k, v, mask, ids) * weights)   # only the compared queries count
            return tape.gradient(loss, [q, k, v])
        return (tf.function(f, jit_compile=True) if jit else f)(q, k, v)

    for got, expected in zip(grads(blocked), grads(dense)):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("window, seq", [(8, 24), (8, 22), (10, 23), (9, 17)])   # c = 4, 4, 5, 4
def test_the_window_reaches_exactly_c_tokens_each_way(window, seq):
    """Equal scores (q = k = 0) and values one-hot in the key's position: a query's output is its row of
    attention weights, 1 / (visible keys) on |i - j| <= c and exactly 0 beyond; off by one either way fails."""
    c = window // 2
    zeros = tf.zeros([1, seq, 1, seq])
    values = tf.eye(seq)[tf.newaxis, :, tf.newaxis, :]            # [1, S, 1, S]: key j's value is e_j
    weights = blocked(zeros, zeros, values, np.ones((1, seq), np.int32), None, window).numpy()[0, :, 0]
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    near = np.abs(i - j) <= c
    np.testing.assert_allclose(weights, near / near.sum(1, keepdims=True), atol=1e-6, rtol=0)
    middle = seq // 2
    assert weights[middle, middle + c] > 0 and weights[middle, middle - c] > 0
    assert weights[middle, middle + c + 1] == 0 and weights[middle, middle - c - 1] == 0


def test_bfloat16_activations_keep_their_dtype_and_match_dense():
    mask, ids, valid = rows(23, "packed")
    q, k, v = qkv(23, dtype=tf.bfloat16)
    got = tf.function(lambda q, k, v: blocked(q, k, v, mask, ids), jit_compile=True)(q, k, v)
    assert got.dtype == tf.bfloat16
    expected = dense(q, k, v, mask, ids)
    np.testing.assert_allclose(at(valid, tf.cast(got, tf.float32)), at(valid, tf.cast(expected, tf.float32)),
                               atol=3e-2, rtol=0)
    # and a whole encoder in bfloat16 under XLA, in training mode (no dropout in this config)
    input_ids = tf.constant(np.random.RandomState(3).randint(1, 50, (3, 23)).astype(np.int32))
    encoder = modern.ModernEncoder(CONFIG)
    run = tf.function(lambda: encoder(input_ids, tf.constant(mask), tf.zeros_like(input_ids), dtype=tf.bfloat16,
                                      seed=tf.constant([1, 2]), training=True, instance_ids=tf.constant(ids))[0],
                      jit_compile=True)
    got = run()
    encoder.blocked_local = False
    expected = run.python_function()
    assert got.dtype == tf.bfloat16
    np.testing.assert_allclose(at(valid, tf.cast(got, tf.float32)), at(valid, tf.cast(expected, tf.float32)),
                               atol=3e-2, rtol=0)


def test_dropout_is_on_the_probabilities_and_follows_the_seed():
    mask, ids, _ = rows(24, "packed")
    q, k, v = qkv(24)
    wm = local_attention.window_mask(tf.constant(mask), tf.constant(ids), WINDOW)
    run = lambda rate, seed, training: local_attention.attend(q, k, v, wm, rate, tf.constant(seed), training).numpy()
    plain = run(0.0, [0, 0], False)
    np.testing.assert_array_equal(run(0.3, [1, 2], False), plain)         # not training: no dropout
    first, again, other = run(0.3, [1, 2], True), run(0.3, [1, 2], True), run(0.3, [3, 4], True)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, plain) and not np.allclose(first, other)


def test_blocks_only_where_they_save_work():
    assert not local_attention.saves_work(128, 128)      # S = 3c + 64 would; 128 <= 3 * 64
    assert not local_attention.saves_work(192, 128)
    assert local_attention.saves_work(193, 128)
    assert not local_attention.saves_work(None, 128)     # a sequence length known only at run time: dense
    assert not local_attention.saves_work(100, 1)        # c = 0: no blocks



@pytest.mark.parametrize("case", ["padded", "packed"])
def test_the_encoder_with_blocks_equals_the_encoder_without(case, monkeypatch):
    seq = 23
    mask, ids, valid = rows(seq, case)
    input_ids = tf.constant(np.random.RandomState(3).randint(1, 50, (3, seq)).astype(np.int32))
    extra = {}
    if ids is not None:                         # each instance's tokens at positions 0, 1, ...
        positions = np.zeros_like(ids)
        for row, n in {(row, n) for row in range(3) for n in ids[row]}:
            positions[row, ids[row] == n] = np.arange(np.sum(ids[row] == n))
        extra = dict(position_ids=tf.constant(positions), instance_ids=tf.constant(ids))
    calls = []
    real = local_attention.attend
    monkeypatch.setattr(local_attention, "attend", lambda *a: calls.append(1) or real(*a))
    encoder = modern.ModernEncoder(CONFIG)      # layer 0 global, layers 1 and 2 local
    run = lambda: encoder(input_ids, tf.constant(mask), tf.zeros_like(input_ids), **extra)
    blocked_out = run()
    assert len(calls) == 2                      # both local layers took the blocked path
    encoder.blocked_local = False
    dense_out = run()
    assert len(calls) == 2                      # and then neither did
    np.testing.assert_allclose(at(valid, blocked_out[0]), at(valid, dense_out[0]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(blocked_out[1].numpy(), dense_out[1].numpy(), atol=1e-5, rtol=0)
