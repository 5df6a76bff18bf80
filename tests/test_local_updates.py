"""--local_updates beyond plain DiLoCo (bert_tf/parallel/local_sgd.py, local_plan.py, outer_quant.py): periodic
averaging as the momentum-0 control, synchronous updates first (--local_updates_after), streamed fragments
(--local_fragments) with an overlapped exchange (--fragment_delay, --fragment_update_alpha), 8- and 4-bit deltas
with error feedback (--outer_delta_bits), the bytes a run sends, and the flags' bad values. The unit tests run in
one process; the cluster tests on 2 ranks (tests/workers/local_updates_checks.py, one launch) and through
run/pretrain.py."""
import json
import re
import shutil

import numpy as np
import pytest

from bert_tf import ConfigError
from bert_tf.parallel import local_plan
from bert_tf.parallel.comm import CommConfig
from bert_tf.train.pretrain_config import PretrainConfig
from conftest import REPO, WORKERS, mpirun, read_rank_results

PRETRAIN = REPO / "run" / "pretrain.py"


def np_round_trip(x, bits, block=local_plan.BLOCK):
    """NumPy reference of outer_quant: absmax blocks, round half to even, decoded."""
    levels = 2 ** (bits - 1) - 1
    n = x.size
    count = -(-n // block)
    b = np.pad(x.astype(np.float32), (0, count * block - n)).reshape(count, block)
    scale = (np.abs(b).max(1) / np.float32(levels)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    q = np.clip(np.round(b / safe[:, None]), -levels, levels).astype(np.float32)
    return (q * scale[:, None]).reshape(-1)[:n]


# -- the schedule and the fragments (plain Python) --------------------------------------------------------------
def test_the_schedule_starts_fragments_in_turn_after_the_synchronous_updates_and_completes_them_tau_later():
    s = local_plan.Schedule(every=4, after=8, fragments=2, delay=1)
    assert [s.synchronous(i) for i in (0, 7, 8)] == [True, True, False]
    assert {t: s.start_at(t) for t in range(1, 20) if s.start_at(t) is not None} == {10: 0, 12: 1, 14: 0, 16: 1,
                                                                                      18: 0}
    assert {t: s.complete_at(t) for t in range(1, 20) if s.complete_at(t) is not None} == {11: 0, 13: 1, 15: 0,
                                                                                         17: 1, 19: 0}
    assert [t for t in range(20) if s.cycle_end(t)] == [8, 12, 16]
    plain = local_plan.Schedule(every=3)           # DiLoCo: every H updates, whole
    assert [t for t in range(1, 10) if plain.start_at(t) is not None] == [3, 6, 9] == [
        t for t in range(1, 10) if plain.complete_at(t) is not None]


def test_fragments_stride_the_layers_and_spread_the_other_tensors_by_size():
    # 4 layers of 2 tensors (size 10 each), embeddings (50), a head (30), a bias (5)
    layer_of = [None, 0, 0, 1, 1, 2, 2, 3, 3, None, None]
    sizes = [50, 10, 10, 10, 10, 10, 10, 10, 10, 30, 5]
    assert local_plan.assign_fragments(layer_of, sizes, 2) == [[0, 1, 2, 5, 6], [3, 4, 7, 8, 9, 10]]
    three = local_plan.assign_fragments(layer_of, sizes, 3)
    assert sorted(i for f in three for i in f) == list(range(11))
    assert [sorted({layer_of[i] for i in f} - {None}) for f in three] == [[0, 3], [1], [2]]
    with pytest.raises(ConfigError, match="--local_fragments=4: the model has too few tensors"):
        local_plan.assign_fragments([0, 1], [3, 3], 4)


def test_fragments_of_the_model_follow_its_encoder_layers():
    import tensorflow as tf

    from bert_tf.model import modeling
    from bert_tf.parallel import local_sgd
    tf.random.set_seed(0)
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100, num_hidden_layers=4))
    variables = model.trainable_variables
    fragments = local_sgd.fragments_of(model, variables, 2)
    refs = {v.ref(): i for i, v in enumerate(variables)}
    for layer_index, layer in enumerate(model.encoder.layers):
        assert {refs[v.ref()] for v in layer.trainable_variables} <= set(fragments[layer_index % 2])
    assert sorted(i for f in fragments for i in f) == list(range(len(variables)))


# -- the codes and error feedback ------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [8, 4])
def test_codes_round_trip_within_half_a_step_of_their_block_and_as_the_reference(bits):
    import tensorflow as tf

    from bert_tf.parallel import outer_quant
    r = np.random.RandomState(bits)
    x = (r.randn(1000) * np.repeat([1e-3, 1.0, 30.0, 0.0], 250)).astype(np.float32)   # blocks of other scales
    payload = outer_quant.encode(tf.constant(x)[None], bits)
    assert payload.dtype == tf.uint8 and payload.shape == (1, local_plan.payload_bytes(1000, bits))
    back = outer_quant.decode(payload, 1000, bits)[0].numpy()
    rows = outer_quant.encode(tf.constant(x[:768].reshape(3, 256)), bits)      # a row each: the same blocks
    np.testing.assert_array_equal(outer_quant.decode(rows, 256, bits).numpy().reshape(-1), back[:768])
    blocks = np.pad(x, (0, 24)).reshape(-1, 256)
    step = np.repeat(np.abs(blocks).max(1) / (2 ** (bits - 1) - 1), 256)[:1000]
    assert np.all(np.abs(back - x) <= step / 2 * (1 + 1e-6))
    np.testing.assert_array_equal(back, np_round_trip(x, bits))
    assert np.all(back[750:] == 0)


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_makes_what_was_sent_follow_the_true_changes(bits):
    """A small steady change beside a large one, below half a step: sent as is it is lost every round; with the
    residual carried over, the sum of what was sent stays within one step of the sum of the true changes."""
    import tensorflow as tf

    from bert_tf.parallel import outer_quant
    delta = np.zeros(256, np.float32)
    delta[0], delta[1:] = 1.0, 1e-3 * np.linspace(0.5, 1.0, 255, dtype=np.float32)
    step = 1.0 / (2 ** (bits - 1) - 1)
    residual = tf.Variable(tf.zeros([1, 256]))
    sent_with, sent_without = np.zeros(256), np.zeros(256)
    for rounds in range(1, 201):
        payload = outer_quant.encode_with_feedback(tf.constant(delta)[None], residual, bits)
        sent_with += outer_quant.decode(payload, 256, bits)[0].numpy()
        sent_without += np_round_trip(delta, bits)
    true = rounds * delta.astype(np.float64)
    assert np.all(np.abs(sent_with - true) <= step)                 # the residual, at most a step
    np.testing.assert_allclose(sent_with - true, -residual.numpy()[0], atol=1e-4)
    assert np.all(sent_without[1:] == 0) and np.abs(sent_without - true).max() > 0.1


# -- the outer step in one process -----------------------------------------------------------------------------
def test_the_first_k_updates_go_through_the_allreduce_then_each_rank_alone():
    import tensorflow as tf

    from bert_tf.parallel import exchange, local_sgd
    variables = [tf.Variable(tf.ones([3]))]
    outer = local_sgd.OuterStep(variables, every=2, after=4)
    with pytest.raises(ValueError, match="count_on"):
        outer([tf.ones([3])])
    step = tf.Variable(0, dtype=tf.int64)
    outer.count_on(step)
    outer._host.synchronous = exchange.Function(lambda grads: [2.0 * g for g in grads])   # a stand-in allreduce
    call = tf.function(outer)
    seen = []
    for s in range(7):
        step.assign(s)
        seen.append(float(call([tf.ones([3])])[0][0]))
    assert seen == [2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0]
    assert [outer.due(s) for s in range(1, 9)] == [True, True, True, True, False, True, False, True]


def test_the_overlapped_merge_is_the_reference_and_the_checkpoint_holds_no_host_state():
    """One rank, H=4 in 2 fragments, tau=1, alpha=0.25, float32: the anchor takes the Nesterov step of the change
    at the start, the weights become 3/4 of it and 1/4 their own (with the update made in flight); the fragment
    not due is left alone; `agree` then synchronises both. The residuals (8 bits) are no checkpoint state."""
    import tensorflow as tf

    from bert_tf.parallel import local_sgd
    r = np.random.RandomState(0)
    start = [r.randn(4, 3).astype(np.float32), r.randn(5).astype(np.float32)]
    variables = [tf.Variable(v) for v in start]
    outer = local_sgd.OuterStep(variables, 0.7, 0.9, every=4, fragments=[[0], [1]], delay=1, alpha=0.25, bits=32)
    outer.anchor_to(variables)
    outer.after_update(1, variables)
    variables[0].assign_sub(0.1 * tf.ones([4, 3]))
    outer.after_update(2, variables)                           # fragment 0 starts
    assert outer._host.pending is not None and outer._host.pending[0] == 0
    variables[0].assign_sub(0.05 * tf.ones([4, 3]))            # the update made while it is in flight
    variables[1].assign_sub(0.05 * tf.ones([5]))
    local, other = variables[0].numpy(), variables[1].numpy()
    outer.after_update(3, variables)                           # fragment 0 completes
    d = np.float32(0.1) * np.ones((4, 3), np.float32)
    anchor = start[0] - np.float32(0.7) * (d + np.float32(0.9) * d)
    np.testing.assert_allclose(outer.anchor[0].numpy(), anchor, rtol=1e-6)
    np.testing.assert_allclose(variables[0].numpy(), 0.75 * anchor + 0.25 * local, rtol=1e-6)
    np.testing.assert_array_equal(variables[1].numpy(), other)
    assert outer._host.pending is None and int(outer.rounds.numpy()) == 1 and not outer.due(3)
    outer.agree(3, variables)                                  # alpha kept fragment 0 apart too
    assert int(outer.rounds.numpy()) == 3
    for v, a in zip(variables, outer.anchor):
        np.testing.assert_array_equal(v.numpy(), a.numpy())
    quantised = local_sgd.OuterStep(variables, bits=8)
    assert len(quantised.variables) == 2 * len(variables) + 2 and len(quantised._host.residuals) == 1


def test_an_evaluation_first_makes_every_rank_s_weights_agree():
    from types import SimpleNamespace

    from bert_tf.train import pretraining
    calls = []
    job = SimpleNamespace(outer=SimpleNamespace(agree=lambda step, variables: calls.append(("agree", step))),
                          trainer=SimpleNamespace(variables=[]), writer=SimpleNamespace(write=lambda record: None),
                          evaluate=lambda step: calls.append(("evaluate", step)) or SimpleNamespace(
                              eval_mlm_accuracy=0.5))
    assert not pretraining._evaluate(SimpleNamespace(target_mlm_accuracy=0.0), job, 12, print)
    assert calls == [("agree", 12), ("evaluate", 12)]


# -- flags --------------------------------------------------------------------------------------------------------
BAD_COMM = [
    (dict(local_updates=4, local_updates_after=-1), "--local_updates_after must be >= 0, got -1"),
    (dict(local_updates=4, outer_delta_bits=2), "--outer_delta_bits=2: valid are 32, 16, 8, 4"),
    (dict(local_updates=4, local_fragments=0), "--local_fragments must be >= 1"),
    (dict(local_updates=3, local_fragments=2), "--local_updates=3 must be a multiple of --local_fragments=2"),
    (dict(local_updates=1, local_fragments=2), "--local_updates=1 must be a multiple of --local_fragments=2"),
    (dict(local_updates=4, local_fragments=2, fragment_delay=2),
     "--fragment_delay=2 must be smaller than --local_updates / --local_fragments = 2"),
    (dict(local_updates=4, fragment_delay=-1), "--fragment_delay >= 0"),
    (dict(local_updates=4, fragment_update_alpha=1.5), "--fragment_update_alpha in \\[0, 1\\]"),
    (dict(local_fragments=2), "are for --local_updates \\(DiLoCo\\): give it"),
    (dict(outer_delta_bits=8), "are for --local_updates \\(DiLoCo\\): give it"),
]


@pytest.mark.parametrize("values,error", BAD_COMM)
def test_bad_local_update_flags_are_config_errors_naming_them(values, error):
    with pytest.raises(ConfigError, match=error):
        CommConfig(**values)


BAD_RUN = [
    (dict(total_steps=8, comm=dict(local_updates=4, local_updates_after=8)),
     "--local_updates_after=8 must be below --total_steps=8"),
    (dict(comm=dict(local_updates=4, local_updates_after=6)),
     "--local_updates_after=6 must be a multiple of --local_updates=4"),
    (dict(elastic=True, global_batch_size=64, micro_batch_size=4, elastic_commit_interval=4,
          comm=dict(local_updates=4, local_fragments=2)), "--local_fragments > 1, .*with --elastic: not supported"),
    (dict(elastic=True, global_batch_size=64, micro_batch_size=4, elastic_commit_interval=4,
          comm=dict(local_updates=4, local_updates_after=4)), "--local_updates_after, .*with --elastic"),
]


@pytest.mark.parametrize("values,error", BAD_RUN)
def test_bad_local_update_runs_are_config_errors_naming_the_flags(values, error):
    values = {"checkpoint_dir": "ckpt", "vocab_file": "vocab.txt", "save_interval": 8, "total_steps": 100,
              **values}
    values["comm"] = CommConfig(**values["comm"])
    with pytest.raises(ConfigError, match=error):
        PretrainConfig(**values)


def test_a_good_local_update_run_is_described_in_its_first_line():
    comm = CommConfig(local_updates=4, local_updates_after=8, local_fragments=2, fragment_delay=1,
                      outer_delta_bits=4)
    PretrainConfig(checkpoint_dir="c", vocab_file="v", save_interval=8, total_steps=100, comm=comm)
    assert local_plan.describe(comm) == (
        "DiLoCo: the weights' change in 4-bit codes (error feedback) every 4 updates (outer learning rate 0.7, "
        "Nesterov momentum 0.9), after 8 synchronous updates, in 2 fragments, each exchange overlapping 1 updates "
        "(alpha 0)")


# -- bytes --------------------------------------------------------------------------------------------------------
def test_bytes_per_update_average_the_synchronous_updates_and_the_outer_exchanges():
    shapes, n = [(1000, 512), (512,)], 1000 * 512 + 512
    plain = CommConfig(local_updates=10)
    assert local_plan.wire_bytes_per_update(shapes, plain, 4, 100) == pytest.approx(2 * 3 / 4 * 2 * n / 10)
    after = CommConfig(local_updates=10, local_updates_after=50)
    assert local_plan.wire_bytes_per_update(shapes, after, 4, 100) == pytest.approx(
        (50 * 2 * 3 / 4 * 4 * n + 5 * 2 * 3 / 4 * 2 * n) / 100)
    # 8 bits: codes + a float32 scale per 256 values, each rank's chunk (whole blocks) by alltoall, the means'
    # by allgather: 2 (N-1) chunk payloads per exchange
    chunk_blocks = -(-(-(-n // 4)) // 256)
    eight = CommConfig(local_updates=10, outer_delta_bits=8)
    assert local_plan.wire_bytes_per_update(shapes, eight, 4, 100) == pytest.approx(2 * 3 * chunk_blocks * 260 / 10)
    # fragments split the same bytes over F exchanges (padding aside); forced syncs add (F-1)/F of the model each
    four = CommConfig(local_updates=10, local_fragments=2, outer_delta_bits=4)
    per = 2 * 3 * -(-(-(-(-(-n // 2)) // 4)) // 256) * 132
    assert local_plan.wire_bytes_per_update(shapes, four, 4, 100) == pytest.approx(10 * 2 * per / 100)
    assert local_plan.wire_bytes_per_update(shapes, four, 4, 100, forced_syncs=5) == pytest.approx(
        (10 * 2 + 5) * per / 100)
    assert local_plan.wire_bytes_per_update(shapes, plain, 1, 100) == 0.0
    for ranks in (2, 4, 16, 64):                    # 8 bits: about half of 16 bits' allreduce, whatever the ranks
        ratio = local_plan.exchange_wire_bytes(n, 8, ranks) / local_plan.exchange_wire_bytes(n, 16, ranks)
        assert 260 / 512 <= ratio < 260 / 512 * 1.03, ranks          # padding to whole blocks: at most 3% here


# -- 2 ranks ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("local_updates_checks")
    mpirun(2, [WORKERS / "local_updates_checks.py", out])
    return read_rank_results(out, 2), [np.load(out / f"rank{r}.npz") for r in range(2)]


@pytest.mark.cluster
def test_momentum_zero_and_learning_rate_one_make_every_rank_the_ranks_mean(checks):
    _, arrays = checks
    for bits, atol in ((32, 1e-6), (16, 2e-5)):
        anchor = arrays[0][f"average_anchor_{bits}"]
        before = [a[f"average_before_{bits}"] for a in arrays]
        assert not np.array_equal(*before)
        np.testing.assert_array_equal(arrays[0][f"average_after_{bits}"], arrays[1][f"average_after_{bits}"])
        np.testing.assert_allclose(arrays[0][f"average_after_{bits}"], (before[0] + before[1]) / 2, atol=atol, rtol=0)
    anchor = arrays[0]["average_anchor_32"]
    deltas = [anchor - a["average_before_32"] for a in arrays]
    np.testing.assert_array_equal(arrays[0]["average_after_32"], anchor - (deltas[0] + deltas[1]) / np.float32(2))


@pytest.mark.cluster
def test_synchronous_updates_keep_the_ranks_alike_until_k_then_they_agree_at_each_sync_and_resume_in_either(checks):
    """--local_updates_after=2, H=2, each rank its own gradients: alike after updates 1 and 2 (allreduced),
    the anchor taken at 2, apart at 3 and 5, alike at the syncs 4 and 6; resumed from update 1 (synchronous) and
    from update 4 (local), the run ends with the straight run's weights."""
    results, _ = checks
    for r in results:
        assert {int(k): v["alike"] for k, v in r["phases"].items()} == {1: True, 2: True, 3: False, 4: True,
                                                                        5: False, 6: True}
        assert [int(k) for k, v in r["phases"].items() if v["anchor_is_weights"]] == [2, 4, 6]
        assert r["phases_rounds"] == 2 and r["phases_resumed"] == {"1": True, "4": True}


@pytest.mark.cluster
def test_each_fragment_sync_touches_its_fragment_only_and_agree_makes_every_weight_alike(checks):
    results, _ = checks
    for r in results:
        events = {int(k): v for k, v in r["fragments"].items()}
        assert {s: e["changed"] for s, e in events.items() if e["changed"]} == {2: [0, 1], 4: [2, 3], 6: [0, 1],
                                                                                8: [2, 3]}
        assert {s: e["alike"] for s, e in events.items() if any(e["alike"])} == {2: [True, False], 4: [False, True],
                                                                                 6: [True, False], 8: [False, True]}
        assert r["fragments_alike_after_agree"] and r["fragments_rounds"] == 5


@pytest.mark.cluster
def test_the_overlapped_exchange_equals_the_blocking_one_and_merges_as_the_reference(checks):
    results, arrays = checks
    assert all(r["overlap_same_as_blocking"] for r in results)
    n0 = 40 * 30 + 30                                    # fragment 0: the first two tensors
    anchor = arrays[0]["merge_anchor"]
    mean = ((anchor - arrays[0]["merge_started"]) + (anchor - arrays[1]["merge_started"])) / np.float32(2)
    new_anchor = anchor - np.float32(0.7) * (mean + np.float32(0.9) * mean)
    for a in arrays:
        np.testing.assert_allclose(a["merge_new_anchor"][:n0], new_anchor[:n0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(a["merge_after"][:n0], 0.75 * new_anchor[:n0] + 0.25 * a["merge_local"][:n0],
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(a["merge_after"][n0:], a["merge_local"][n0:])
    assert not np.array_equal(arrays[0]["merge_after"][:n0], arrays[1]["merge_after"][:n0])   # alpha keeps own


@pytest.mark.cluster
@pytest.mark.parametrize("bits", [8, 4])
def test_quantised_deltas_give_every_rank_the_mean_of_the_decoded_codes(checks, bits):
    """Each rank's change coded (its chunks alike: whole blocks), chunk k averaged on rank k and coded again: every
    rank ends on anchor - code(mean of the ranks' codes); each keeps what its codes dropped, rank k what the mean's
    code of its chunk dropped."""
    results, arrays = checks
    anchor = arrays[0][f"bits{bits}_anchor"]
    n = anchor.size
    sent = [np_round_trip(anchor - a[f"bits{bits}_before"], bits) for a in arrays]
    mean = (sent[0] + sent[1]) / np.float32(2)
    expected = anchor - np_round_trip(mean, bits)
    chunk = -(-(-(-n // 2)) // 256) * 256
    for r, (res, a) in enumerate(zip(results, arrays)):
        assert res[f"bits{bits}_alike"]
        np.testing.assert_allclose(a[f"bits{bits}_after"], expected, rtol=1e-6, atol=1e-7)
        change = anchor - a[f"bits{bits}_before"]
        np.testing.assert_allclose(a[f"bits{bits}_residual"][:n], change - np_round_trip(change, bits), atol=1e-7)
        mine = np.pad(mean, (0, 2 * chunk - n))[r * chunk:(r + 1) * chunk]
        np.testing.assert_allclose(a[f"bits{bits}_mean_residual"], mine - np_round_trip(mine, bits), atol=1e-7)


@pytest.mark.cluster
def test_an_overlapped_exchange_does_not_stop_the_loop(checks):
    """A 64 MB fragment's float32 allreduce: blocking, the loop waits for it; started 3 updates earlier (updates
    that keep the host thread idle, as waiting for a GPU does) it has arrived by the time it is needed."""
    results, _ = checks
    for r in results:
        blocking, overlapped = r["timing"]["0"]["waited"], r["timing"]["3"]["waited"]
        assert blocking > 0.01 and overlapped < 0.3 * blocking, r["timing"]


# -- run/pretrain.py ----------------------------------------------------------------------------------------------
STREAMED = ["--local_updates=4", "--local_updates_after=8", "--local_fragments=2", "--fragment_delay=1",
            "--outer_delta_bits=8", "--save_interval=4", "--eval_interval=4", "--optimizer=adamw",
            "--cycle_time_ms=10", "--total_steps=12", "--keep_last=5"]


def _tensors(path):
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(path))
    names = reader.get_variable_to_shape_map()
    return {name: reader.get_tensor(name) for name in names if "optimizer" not in name}


@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory, tiny_data):
    ckpt = tmp_path_factory.mktemp("streamed") / "run"
    proc = mpirun(2, [PRETRAIN, *tiny_data["flags"], *STREAMED, f"--checkpoint_dir={ckpt}"])
    return ckpt, proc


@pytest.mark.cluster
def test_a_streamed_quantised_run_saves_and_evaluates_on_agreed_weights(streamed_run):
    """8 synchronous updates, then H=4 in 2 fragments, each exchange overlapping one update, 8-bit deltas: saves at
    4 (synchronous), 8 (the anchor) and 12 (every fragment synchronised first: the model is the anchor)."""
    ckpt, proc = streamed_run
    assert ("DiLoCo: the weights' change in 8-bit codes (error feedback) every 4 updates" in proc.stdout
            and "after 8 synchronous updates, in 2 fragments" in proc.stdout), proc.stdout[-2000:]
    rounds = {}
    for step in (4, 8, 12):
        tensors = _tensors(ckpt / f"ckpt-{step}")
        rounds[step] = int(tensors["outer_step/rounds/.ATTRIBUTES/VARIABLE_VALUE"])
        anchors = {k: v for k, v in tensors.items() if k.startswith("outer_step/anchor/")}
        model = {k: v for k, v in tensors.items() if k.startswith("model/")}
        if step >= 8:       # every weight is its anchor (same order, same shapes)
            assert len(anchors) == len(model) > 0
            assert sorted(v.tobytes() for v in anchors.values()) == sorted(v.tobytes() for v in model.values())
    # fragment 0 at 10-11; at the last save fragment 1 (started at 12) completes and 0 is synchronised
    assert rounds == {4: 0, 8: 0, 12: 3}
    evaluations = [json.loads(line)["step"] for line in open(ckpt / "metrics.jsonl") if '"eval"' in line]
    assert evaluations == [4, 8, 12]


@pytest.mark.cluster
@pytest.mark.long
def test_a_streamed_run_resumed_in_its_synchronous_updates_ends_where_the_straight_run_does(streamed_run, tmp_path,
                                                                                            tiny_data):
    ckpt, _ = streamed_run
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt, resumed, ignore=shutil.ignore_patterns("ckpt-8*", "ckpt-12*"))
    (resumed / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n')
    again = mpirun(2, [PRETRAIN, *tiny_data["flags"], *STREAMED, f"--checkpoint_dir={resumed}"])
    assert re.search(r"resumed from \S*ckpt-4 at step 4\b", again.stdout + again.stderr), again.stdout[-2000:]
    a, b = _tensors(ckpt / "ckpt-12"), _tensors(resumed / "ckpt-12")
    assert a.keys() == b.keys()
    for k in a:
        if k.startswith(("model/", "outer_step/")):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
