"""Elastic pre-training: the launch checks, the exact global batch at any rank count, the shared input
stream's guarantee (replayed, never skipped), the discovery script, and one elastic job on the
emulated cluster that loses a node, takes it back and loses its link."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_tf import ConfigError
from bert_tf.parallel.exchange import Local
from bert_tf.train import elastic, shares
from bert_tf.artifacts.metrics import read_metrics, wait_for_record
from bert_tf.studies import emulated_cluster as ec
from bert_tf.train import startup
from bert_tf.train import pretrain_config
from conftest import REPO, mpi_env

PRETRAIN = REPO / "run" / "pretrain.py"
DISCOVER = REPO / "scripts" / "discover_hosts.sh"
PROBLEM = ec.preflight()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=f"emulated cluster unavailable: {PROBLEM}")


def test_elastic_needs_an_elastic_gloo_launch():
    launched = {"HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "gloo"}
    elastic.check_launch(launched, gloo_built=True)
    with pytest.raises(ConfigError, match="--elastic needs Horovod built with Gloo"):
        elastic.check_launch(launched, gloo_built=False)
    with pytest.raises(ConfigError, match="--elastic needs an elastic launch: horovodrun .*--host-discovery-script"):
        elastic.check_launch({}, gloo_built=True)
    with pytest.raises(ConfigError, match="Gloo controller .*HOROVOD_CONTROLLER=mpi"):
        elastic.check_launch({"HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "mpi"}, gloo_built=True)


def test_rank_shares_make_the_exact_mean_of_the_global_batch_at_any_size():
    rng = np.random.RandomState(0)
    for micro in range(1, 13):
        grads = rng.randn(micro, 5)                  # one gradient per micro-batch of the update
        for size in range(1, micro + 1):
            # rank r averages its micro-batches r, r + size, ...; the allreduce averages the weighted ranks
            ranks = []
            for r in range(size):
                mine, weight = shares.rank_share(micro, r, size)
                assert mine == len(range(r, micro, size))
                ranks.append(weight * grads[r::size].mean(axis=0))
            np.testing.assert_allclose(np.mean(ranks, axis=0), grads.mean(axis=0), rtol=1e-12)
        with pytest.raises(ConfigError, match=f"{micro + 1} ranks but an update has only {micro} micro-batches"):
            shares.rank_share(micro, 0, micro + 1)
    assert shares.describe_share(6, 4, 3) == "3 ranks: global batch 24 = 6 micro-batches of 4, 2 micro-batches per rank"
    assert shares.describe_share(6, 4, 4) == ("4 ranks: global batch 24 = 6 micro-batches of 4, 2 micro-batches on "
                                               "ranks 0-1, 1 on the others (their gradients weighted to an exact mean)")


def test_an_updates_dropout_masks_do_not_depend_on_the_rank_count():
    """Elastic mode keys dropout by the micro-batch's index in the update, so an update replayed on fewer
    ranks after a failure draws the masks the lost one drew (the emulated-cluster test checks its loss)."""
    from bert_tf.model import modeling
    from bert_tf.train import training
    model = modeling.BertPretrainer(modeling.BertConfig.preset("tiny", vocab_size=100))
    micro = 6
    # one trainer per rank slot, started like pretraining's (seed stream = rank), resized through the sizes
    trainers = [training.Trainer(model, training.TrainConfig(seed=5), seed_offset=r) for r in range(micro)]
    seeds_by_size = {}
    for size in (1, 2, 3, 4, 6, 5):   # 3 -> 4: rank 0 keeps 2 micro-batches (no retrace), now 0 and 4
        seeds = {}
        for rank in range(size):
            trainer = trainers[rank]
            trainer.set_share(shares.rank_indices(micro, rank, size), micro, Local())
            assert trainer.rank_micro_batches == shares.rank_share(micro, rank, size)[0]
            assert trainer.indices == list(shares.rank_indices(micro, rank, size))
            trainer.step.assign(7)
            for index in trainer.indices:                 # the seeds train_step draws its masks from
                seeds[index] = tuple(trainer.micro_batch_seed(index).numpy())
        seeds_by_size[size] = seeds
    assert all(seeds == seeds_by_size[1] for seeds in seeds_by_size.values()), seeds_by_size
    assert len(set(seeds_by_size[1].values())) == micro                     # one mask per micro-batch
    assert seeds_by_size[1][5] == ((5 * 7919) % (2 ** 31 - 1), 7 * micro + 5)  # and per update


def test_elastic_flags_are_checked_at_start_up(tmp_path):
    base = dict(vocab_file="v", checkpoint_dir=str(tmp_path), micro_batch_size=4)
    with pytest.raises(ConfigError, match="--elastic needs --global_batch_size"):
        pretrain_config.PretrainConfig(elastic=True, **base)
    with pytest.raises(ConfigError, match="--global_batch_size=30 must be a positive multiple of --micro_batch_size=4"):
        pretrain_config.PretrainConfig(elastic=True, global_batch_size=30, **base)
    with pytest.raises(ConfigError, match="--elastic_commit_interval must be >= 1"):
        pretrain_config.PretrainConfig(elastic=True, global_batch_size=32, elastic_commit_interval=0, **base)
    with pytest.raises(ConfigError, match="--accumulation_steps=4 with --elastic"):
        pretrain_config.PretrainConfig(elastic=True, global_batch_size=32, accumulation_steps=4, **base)
    with pytest.raises(ConfigError, match="--global_batch_size is for --elastic"):
        pretrain_config.PretrainConfig(global_batch_size=32, **base)


@pytest.mark.slow
def test_pretrain_with_elastic_but_not_launched_elastically_fails_at_once(tmp_path, tiny_data):
    proc = subprocess.run([sys.executable, str(PRETRAIN), *tiny_data["flags"], "--elastic", "--global_batch_size=8",
                           f"--checkpoint_dir={tmp_path}"], env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "error: --elastic needs an elastic launch" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not os.listdir(tmp_path)       # nothing written


def _write_records(folder, files=3, per_file=40, seq=16, preds=3):
    """TFRecords whose input_ids[0] numbers the record (0, 1, ...)."""
    import tensorflow as tf
    from conftest import random_features
    paths, n = [], 0
    for f in range(files):
        path = str(folder / f"train-{f}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(per_file):
                feats = {k: v[0] for k, v in random_features(1, seq, preds, seed=n).items()}
                feats["input_ids"][0] = n
                n += 1
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    k: tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist())) if v.dtype == np.float32
                    else tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist()))
                    for k, v in feats.items()})).SerializeToString())
        paths.append(path)
    return paths


def test_shared_stream_after_a_resize_replays_what_was_not_committed_and_skips_nothing(tmp_path):
    """The guarantee of elastic.SharedStream, exactly: the micro-batches behind the weights are the
    stream's, in order, whatever the sizes; a failure replays the lost updates' micro-batches."""
    import tensorflow as tf
    from bert_tf.data import input_pipeline as ip
    files = _write_records(tmp_path)
    batch, micro = 4, 6                               # global batch 24

    def stream():
        return elastic.SharedStream(elastic.make_shared_stream(files, batch, seed=7, shuffle_buffer=50), 16, 3,
                                    per_update=micro)

    def ids(features):
        return [int(i) for i in features["input_ids"][:, 0].numpy()]

    # the stream's order, read from its dataset directly (not through the SharedStream under test)
    spec = {"input_ids": tf.io.FixedLenFeature([16], tf.int64)}
    order = [[int(i) for i in tf.io.parse_example(serialized, spec)["input_ids"][:, 0].numpy()]
             for serialized in elastic.make_shared_stream(files, batch, seed=7, shuffle_buffer=50).take(12 * micro)]
    # 12 updates x 24 = 120 records: one pass, blended with the next at the boundary by the 50-record
    # shuffle buffer (how much depends on the global seed, i.e. on the tests run before this one)
    assert len({i for mb in order for i in mb}) >= 120 - 50

    trained = []                                       # micro-batches in the order the weights saw them

    def update(streams, size):
        for r, s in enumerate(streams):
            s.set_share(r, size)
        shares = [s.next_update() for s in streams]
        got = [None] * micro
        for r, share in enumerate(shares):
            assert len(share) == len(range(r, micro, size))
            for k, mb in enumerate(share):
                got[r + k * size] = ids(mb)              # rank r holds micro-batches r, r + size, ...
        return got

    ranks = [stream() for _ in range(3)]
    for _ in range(2):
        trained += update(ranks, 3)
    committed = ranks[0].state()
    # every rank is at the same place (the bytes differ with what each has prefetched, not the position)
    peeks = []
    for r in ranks:
        twin = stream()
        twin.restore(r.state())
        peeks.append(update([twin], 1))
    assert peeks[0] == peeks[1] == peeks[2]
    lost = update(ranks, 3)                            # an update a failure loses before the next commit
    survivors = ranks[:2]
    for r in survivors:
        r.restore(committed)
    replayed = update(survivors, 2)
    assert replayed == lost                            # the lost update's micro-batches, again, none skipped
    trained += replayed
    newcomer = stream()                                # a host joins: it gets the committed state
    trained += update(survivors, 2)
    grown = survivors + [newcomer]
    state = survivors[0].state()
    for r in grown:
        r.restore(state)
    for _ in range(3):
        trained += update(grown, 3)
    assert trained == order[:len(trained)]             # in order, none twice, none skipped
    # the position survives a disk checkpoint and puts a fresh stream (any rank count) at the same place
    position = ip.InputPosition()
    position.store(0, [], shared=False)              # whatever was there before is replaced
    grown[0].capture(position, 24 * 7)
    path = tf.train.Checkpoint(input_position=position).write(str(tmp_path / "ckpt"))
    loaded = ip.InputPosition()
    tf.train.Checkpoint(input_position=loaded).read(path).assert_consumed()
    resumed = stream()
    assert resumed.resume(loaded) and int(loaded.samples_seen.numpy()) == 24 * 7
    assert update([resumed], 1) == order[len(trained):len(trained) + micro]
    # a run without --elastic cannot use it: a fresh pass instead (pretraining says so)
    static = ip.PerRankInput(tf.data.Dataset.range(3), 1, gather=lambda b: [b])
    assert not static.resume(loaded) and loaded.saved_by() == "elastic mode's shared stream"
    # nor the other way round
    static.capture(position, 5)
    assert not resumed.resume(position) and position.saved_by() == "1 ranks"


def test_an_elastic_checkpoint_from_before_the_shared_flag_still_resumes_the_stream(tmp_path):
    """Elastic checkpoints written before InputPosition.shared marked the shared stream with ranks = -1:
    restoring one takes the variables it has and reads it as the shared stream's position."""
    import tensorflow as tf
    from bert_tf.artifacts import checkpointing
    from bert_tf.data import input_pipeline as ip
    files = _write_records(tmp_path, files=1)
    stream = elastic.SharedStream(elastic.make_shared_stream(files, 4, seed=7, shuffle_buffer=8), 16, 3)
    stream.next_update()
    state, expected = stream.state(), stream.next_update()[0]["input_ids"].numpy()

    class Before(tf.Module):                      # what InputPosition held then
        def __init__(self):
            super().__init__(name="input_position")
            self.samples_seen = tf.Variable(4, dtype=tf.int64)
            self.ranks = tf.Variable(-1, dtype=tf.int64)
            self.iterator_states = tf.Variable([state], shape=tf.TensorShape([None]))

    tf.train.CheckpointManager(tf.train.Checkpoint(input_position=Before()), str(tmp_path / "old"), 1).save(1)
    position = ip.InputPosition()
    old = checkpointing.Checkpoints(str(tmp_path / "old"), {"input_position": position})
    old.restore(old.latest())
    resumed = elastic.SharedStream(elastic.make_shared_stream(files, 4, seed=7, shuffle_buffer=8), 16, 3)
    assert position.is_shared() and int(position.samples_seen.numpy()) == 4 and resumed.resume(position)
    np.testing.assert_array_equal(resumed.next_update()[0]["input_ids"].numpy(), expected)


def test_discovery_script_reports_live_hosts_and_names_bad_lines(tmp_path):
    live = tmp_path / "live"
    live.write_text("198.18.0.1:1\n# spare\n\nnode-2 slots=4\n  node-3  \n")
    out = subprocess.run(["bash", str(DISCOVER), str(live)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "198.18.0.1:1\nnode-2:4\nnode-3:1\n"
    live.write_text("node-1:2\nnode 2 3\n")
    out = subprocess.run(["bash", str(DISCOVER), str(live)], capture_output=True, text=True)
    assert out.returncode != 0 and f"{live} line 2 is not 'host:slots'" in out.stderr
    out = subprocess.run(["bash", str(DISCOVER), str(tmp_path / "missing")], capture_output=True, text=True)
    assert out.returncode != 0 and "cannot read the live-hosts file" in out.stderr


def _records(path):
    return read_metrics(path, growing=True)


def _wait(metrics, condition, proc, what, timeout=240):
    try:
        return wait_for_record(metrics, condition, proc, what, timeout)
    except RuntimeError as e:
        proc.kill()
        raise AssertionError(f"{e}; the job's output: {proc.log}") from None


def _start(horovodrun, flags, tmp_path):
    """run/pretrain.py under an elastic horovodrun; output in tmp_path/job.log (the job's .log)."""
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        job = subprocess.Popen(horovodrun + [sys.executable, str(PRETRAIN), *flags], env=mpi_env(), cwd=str(REPO),
                               stdout=out, stderr=subprocess.STDOUT)
    job.log = log
    return job


def _train(ranks, after=0):
    return lambda r: r["kind"] == "train" and r["ranks"] == ranks and r["time"] > after


def _mid_interval(after_step, commit):
    """An update logged 2 past a commit, at least `after_step`: a failure now loses logged updates."""
    return lambda r: r["kind"] == "train" and r["step"] >= after_step and r["step"] % commit == 2


@pytest.mark.cluster
@pytest.mark.long
@needs_namespaces
def test_elastic_job_loses_a_node_takes_it_back_and_loses_a_link(tmp_path, tiny_data):
    """3 emulated nodes, one rank each. Node 2 killed (a preemption: Horovod blacklists it, and with
    --blacklist-cooldown-range takes the same node back when the cooldown ends); then node 1's link
    taken down and node 1 dropped from the list; the job ends on 2 ranks. With -m long (3 minutes):
    every run has the kill and the take-back in test_the_spot_cluster_run_whole; this replays them
    and adds a cut link and the replayed losses' equality."""
    ckpt = tmp_path / "run"
    metrics = ckpt / "metrics.jsonl"
    commit = 10
    # 5 micro-batches of 4: uneven shares on 3 ranks (2, 2, 1) and on 2 (3, 2)
    flags = tiny_data["flags"] + ["--elastic", "--global_batch_size=20", f"--elastic_commit_interval={commit}",
                                  "--save_interval=10", "--total_steps=220", f"--checkpoint_dir={ckpt}"]
    figures = {}
    with ec.EmulatedCluster(3, rate_gbit=1) as cluster:
        h = cluster.hosts
        cluster.set_live(h)
        # a failed host is shut out for exactly 10 s (Horovod: min(MAX, MIN x 2^failures + U(0, MIN)))
        cmd = cluster.horovodrun_elastic_prefix(3, 2, 3, ["--elastic-timeout", "120",
                                                          "--blacklist-cooldown-range", "5", "10"])
        job = _start(cmd, flags, tmp_path)
        log = job.log
        try:
            first = _wait(metrics, _train(3), job, "a first update on 3 ranks", timeout=300)
            _wait(metrics, _mid_interval(first["step"] + 12, commit), job, "12 more updates")
            # 1. every process of node 2 killed (a preemption); the node stays listed
            t_kill = time.time()
            cluster.kill_node(2)
            resumed = _wait(metrics, _train(2, t_kill), job, "an update on 2 ranks after the kill")
            figures["kill: detection + restore + first update (s)"] = resumed["time"] - t_kill
            # 2. the cooldown ends: Horovod starts a rank on the same node again and the job grows back to 3
            grown = _wait(metrics, _train(3, resumed["time"]), job, "an update on 3 ranks when node 2 came back")
            last_on_2 = max(r["time"] for r in _records(metrics) if _train(2, t_kill)(r) and r["time"] < grown["time"])
            figures["same node back: stall between the last update on 2 and the first on 3 (s)"] = \
                grown["time"] - last_on_2
            _wait(metrics, _mid_interval(grown["step"] + 12, commit), job, "12 more updates")
            # 3. node 1's link down (its processes live on, cut off) and the node dropped from the list,
            # as a cluster's listing drops a dead node (listed, it would be retried when its cooldown ends)
            t_link = time.time()
            cluster.set_link(1, False)
            cluster.set_live([h[0], h[2]])
            relinked = _wait(metrics, _train(2, t_link), job, "an update on 2 ranks after the link went down")
            figures["link down: detection + restore + first update (s)"] = relinked["time"] - t_link
            job.wait(timeout=600)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    out = log.read_text()
    print(json.dumps(figures, indent=1))
    assert job.returncode == 0, out[-6000:]
    records = _records(metrics)
    events = [r for r in records if r["kind"] == "elastic"]
    # every (re)start, every first update after it and the end: all ranks hold the same weights
    for r in events:
        assert len(r["weights_digests"]) == r["ranks"] and len(set(r["weights_digests"])) == 1, r
    sizes = [(r["event"], r["ranks"]) for r in events]
    assert sizes[0] == ("start", 3) and sizes[-1] == ("end", 2), sizes
    starts = [r for r in events if r["event"] == "start"]
    assert [r["ranks"] for r in starts] == [3, 2, 3, 2], sizes
    # each restart resumes at a commit with the samples of exactly its updates
    for r in starts[1:]:
        assert r["step"] % commit == 0 and r["samples_seen"] == 20 * r["step"], r
    # the returning node's weights equal the others' after its first update (3 digests, one value)
    firsts = [r for r in events if r["event"] == "first update" and r["ranks"] == 3]
    assert len(firsts) == 2 and all(len(set(r["weights_digests"])) == 1 for r in firsts)
    trains = [r for r in records if r["kind"] == "train"]
    assert all(r["samples_seen"] == 20 * r["step"] for r in trains)
    # the global batch never changed: every logged update (--log_interval=1) trained 20 sequences in all,
    # counted from the micro-batches the ranks actually trained on, whatever their number and shares
    assert all(r["sequences"] == 20 for r in trains), [(r["step"], r["ranks"], r["sequences"]) for r in trains]
    assert trains[-1]["step"] == 220
    # the loss curve goes on from the commit: after a failure the updates lost since it are replayed
    # with the same weights, data and dropout masks, now on 2 ranks instead of 3 (other shares, the
    # logged loss weighted like the gradients), so their losses are the logged ones to float32
    # rounding (measured: within 4e-8 relative). Other masks would move an update's loss by ~7e-4
    # relative (std over seeds, tiny model at its start, 6 micro-batches of 4).
    for r in (starts[1], starts[3]):
        before = {t["step"]: t["loss"] for t in trains if t["time"] < r["time"] and t["step"] > r["step"]}
        after = [t for t in trains if t["time"] > r["time"]]
        assert after[0]["step"] == r["step"] + 1 and r["step"] + 1 in before, (r, sorted(before))
        replayed = [t for t in after if t["step"] in before]
        np.testing.assert_allclose([t["loss"] for t in replayed], [before[t["step"]] for t in replayed], rtol=1e-5)
    # growing loses nothing: hosts are added at a commit, so the last update trained on 2 ranks before the
    # grow is the committed one the 3 ranks start from (none trained on 2 ranks is thrown away)
    on_2 = [t["step"] for t in trains if starts[1]["time"] < t["time"] < starts[2]["time"]]
    assert max(on_2) == starts[2]["step"], (starts[2], on_2[-5:])
    assert "waiting for Horovod to re-form the ranks" in out
    import tensorflow as tf
    assert tf.train.latest_checkpoint(str(ckpt)).endswith("ckpt-220")


@pytest.mark.cluster
@needs_namespaces
def test_too_few_hosts_for_min_np_fail_after_the_elastic_timeout():
    with ec.EmulatedCluster(2, rate_gbit=1) as cluster:
        cluster.set_live(cluster.hosts[:1])
        start = time.time()
        proc = subprocess.run(cluster.horovodrun_elastic_prefix(2, 2, 2, ["--elastic-timeout", "5"])
                              + [sys.executable, "-c", "print('never started')"],
                              env=mpi_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and time.time() - start < 60
        # Horovod 0.28.1's words (its "{activity}" is left unformatted)
        assert "enough resources to run at least 2 Horovod processes. Timeout after 5 seconds" in proc.stderr
        assert "never started" not in proc.stdout
        # a discovery script that prints garbage stops the launch at once, naming the line
        with open(cluster.live_hosts, "w") as f:
            f.write(f"{cluster.hosts[0]}:1\nnot a host\n")
        proc = subprocess.run(cluster.horovodrun_elastic_prefix(1, 1, 2, ["--elastic-timeout", "30"])
                              + [sys.executable, "-c", "print('never started')"],
                              env=mpi_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "line 2 is not 'host:slots'" in proc.stderr, proc.stderr[-3000:]
        assert "never started" not in proc.stdout


@pytest.mark.cluster
@needs_namespaces
def test_min_np_lost_mid_run_ends_the_job_after_the_elastic_timeout_with_the_checkpoint_intact(tmp_path, tiny_data):
    """2 nodes, --min-np 2; one node dies for good mid-run: the survivor says it waits, Horovod gives up
    after --elastic-timeout with its error, no process is left behind, and the last checkpoint loads."""
    import tensorflow as tf
    ckpt = tmp_path / "run"
    metrics = ckpt / "metrics.jsonl"
    flags = tiny_data["flags"] + ["--elastic", "--global_batch_size=8", "--elastic_commit_interval=5",
                                  "--save_interval=10", "--total_steps=100000", f"--checkpoint_dir={ckpt}"]
    with ec.EmulatedCluster(2, rate_gbit=1) as cluster:
        cluster.set_live(cluster.hosts)
        cmd = cluster.horovodrun_elastic_prefix(2, 2, 2, ["--elastic-timeout", "10"])
        job = _start(cmd, flags, tmp_path)
        log = job.log
        try:
            _wait(metrics, lambda r: r["kind"] == "train" and r["step"] >= 12, job, "12 updates", timeout=300)
            t_kill = time.time()
            cluster.kill_node(1)
            try:
                job.wait(timeout=240)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the job still runs 240 s after the kill; its output: {job.log}")
            ended = time.time() - t_kill
            time.sleep(2)
            left = cluster.node_pids(0)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    out = log.read_text()
    print(f"--min-np out of reach: the job ended {ended:.1f} s after the kill")
    assert job.returncode != 0, out[-4000:]
    assert "waiting for Horovod to re-form the ranks" in out, out[-4000:]         # visible, not silent
    assert "enough resources to run at least 2 Horovod processes. Timeout after 10 seconds" in out, out[-4000:]
    # Gloo's 30 s detection + the 10 s timeout + start-up of the attempt, not a hang
    assert ended < 120, ended
    assert not left, f"processes left on the surviving node: {left}"
    latest = tf.train.latest_checkpoint(str(ckpt))
    reader = tf.train.load_checkpoint(latest)                          # loads: every tensor readable
    values = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}
    step = int(next(v for k, v in values.items() if k.split("/")[0] == "step" and k.endswith("VARIABLE_VALUE")))
    saved = [r["step"] for r in _records(metrics) if r["kind"] == "train"]
    assert latest.endswith(f"ckpt-{step}") and step >= 10 and step % 10 == 0 and step <= max(saved)


class FakeWorld:
    """Horovod's elastic runtime for one process, to drive the loop without root or namespaces: this
    process is rank 0 of sizes[i] ranks in its i-th formation (the real collectives, of one process,
    carry only its own share). A lost rank is the allreduce failing inside the compiled update, as a
    Horovod op does (a TensorFlow error naming Horovod); a host added is check_host_updates raising at a
    commit, as Horovod does on every rank."""

    class Failure(Exception):
        pass

    class HostsUpdated(Exception):
        def __init__(self, skip_sync):
            super().__init__(f"hosts updated (skip_sync={skip_sync})")
            self.skip_sync = skip_sync

    def __init__(self, sizes, fail_at_allreduce, grow_at_step):
        self.sizes, self.formation = sizes, 0
        self.fail_at_allreduce, self.grow_at_step = fail_at_allreduce, grow_at_step
        self.allreduces, self.commits, self.trainer = 0, [], None

    def rank(self):
        return 0

    def size(self):
        return self.sizes[self.formation]

    def gradient_allreduce(self, fp16_compression, weight):
        import tensorflow as tf

        def count():
            self.allreduces += 1
            if self.allreduces == self.fail_at_allreduce:
                raise RuntimeError("horovod: a peer was lost (fake)")

        def allreduce(grads):
            tf.py_function(count, [], [])
            return [g * weight for g in grads]
        return allreduce

    def broadcast_variables(self, variables):
        pass

    def broadcast_object(self, value):
        return value

    def gather_bytes(self, data):
        return [data] * self.size()

    def listen(self):
        pass

    def check_host_updates(self):
        step = int(self.trainer.step.numpy())
        self.commits.append(step)
        if step == self.grow_at_step and self.formation == 1:
            raise self.HostsUpdated(False)

    def reset(self):
        self.formation += 1


@pytest.mark.slow
def test_one_process_drives_the_elastic_loop_through_a_lost_rank_and_an_added_host(tiny_data, tmp_path):
    """The elastic side of pretraining.train, without root: 2 ranks, one lost during update 7 (the
    commit at 5 comes back, the stream with it), 1 rank on, a host added at the commit of 15, 2 ranks
    to the end. The share follows each formation and the input resumes exactly at the commit: after
    20 updates the stream stands at micro-batch 80 of its own order."""
    import tensorflow as tf
    from bert_tf.parallel import distributed
    from bert_tf.train import pretraining
    cfg = pretrain_config.PretrainConfig(
        model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
        eval_files=tiny_data["eval"], max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4,
        elastic=True, global_batch_size=16, elastic_commit_interval=5, total_steps=20, log_interval=1,
        save_interval=10, eval_batches=1, ladder_sequences_per_second=1.0, checkpoint_dir=str(tmp_path))
    distributed.init()
    lines = []
    log = lambda *a, **k: lines.append(" ".join(map(str, a)))
    job = startup.build(cfg, log)
    world = FakeWorld(sizes=[2, 1, 2], fail_at_allreduce=7, grow_at_step=15)
    world.trainer = job.trainer
    last = elastic.Elastic(cfg, job, log, world=world).run(lambda mode: pretraining.train(cfg, job, mode))

    assert int(job.trainer.step.numpy()) == 20 and not last["stopped_early"] and "eval_mlm_accuracy" in last
    assert world.formation == 2 and world.commits == [5, 10, 15, 20], world.commits
    records = read_metrics(tmp_path / "metrics.jsonl")
    starts = [(r["step"], r["ranks"], r["samples_seen"]) for r in records if r.get("event") == "start"]
    assert starts == [(0, 2, 0), (5, 1, 80), (15, 2, 240)], starts
    # each update's logged count is the micro-batches this rank trained: its share at that size
    trained = [(r["step"], r["sequences"]) for r in records if r["kind"] == "train"]
    assert trained == [(s, 8) for s in range(1, 7)] + [(s, 16) for s in range(6, 16)] + \
        [(s, 8) for s in range(16, 21)], trained
    assert job.trainer.indices == [0, 2] and job.trainer.rank_micro_batches == 2
    # replayed, never skipped: the stream's next micro-batch is number 80 of its own order
    from bert_tf.data import input_pipeline
    reference = elastic.make_shared_stream(input_pipeline.list_files(tiny_data["train"]), 4, seed=cfg.seed)
    expected = next(iter(reference.skip(80)))
    job.input.set_share(0, 1, 1)
    got = job.input.next_update()[0]["input_ids"].numpy()
    spec = {"input_ids": tf.io.FixedLenFeature([64], tf.int64)}
    np.testing.assert_array_equal(got, tf.io.parse_example(expected, spec)["input_ids"].numpy())
    assert any("a collective failed" in line and "horovod: a peer was lost (fake)" in line for line in lines), lines
    assert any("hosts added" in line for line in lines) and any("vs the ladder's 1.00" in line for line in lines)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-20")


@pytest.mark.slow
def test_elastic_mode_rolls_a_run_of_skipped_updates_back_to_the_last_commit(tiny_data, tmp_path):
    """The divergence guard in elastic mode: updates 7-9 are poisoned (infinite masked-LM weights, so
    non-finite gradients and skipped updates); with --max_skipped_updates=3 the log of step 9 rolls the
    weights back to the commit of step 5 (no commit waited in between: they wait while the guard
    suspects), the stream goes on past the poisoned batches and the run ends at step 20."""
    from bert_tf.parallel import distributed
    from bert_tf.train import pretraining
    cfg = pretrain_config.PretrainConfig(
        model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
        max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4, elastic=True, global_batch_size=4,
        elastic_commit_interval=5, total_steps=20, log_interval=1, save_interval=50, max_skipped_updates=3,
        checkpoint_dir=str(tmp_path))
    distributed.init()
    lines = []
    job = startup.build(cfg, lambda *a, **k: lines.append(" ".join(map(str, a))))

    class Poisoned:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def next_update(self):
            self.calls += 1
            batches = self.inner.next_update()
            if 7 <= self.calls <= 9:
                batches = [dict(b, masked_lm_weights=b["masked_lm_weights"] * float("inf")) for b in batches]
            return batches

        def __getattr__(self, name):
            return getattr(self.inner, name)
    job.input = Poisoned(job.input)
    world = FakeWorld(sizes=[1], fail_at_allreduce=0, grow_at_step=0)
    world.trainer = job.trainer
    mode = elastic.Elastic(cfg, job, lines.append, world=world)
    restored = []
    real = mode.rollback

    def spy(before_step=None):
        target = real(before_step)
        restored.append(all(np.array_equal(v.numpy(), saved)
                            for v, saved in zip(mode.state.variables, mode.state._values)))
        return target
    mode.rollback = spy
    last = mode.run(lambda m: pretraining.train(cfg, job, m))
    rollbacks = [(r["from_step"], r["step"], r["target"]) for r in read_metrics(tmp_path / "metrics.jsonl")
                 if r["kind"] == "rollback"]
    assert rollbacks == [(9, 5, "the last elastic commit")] and restored == [True]
    assert world.commits == [5, 10, 15, 20] and int(job.trainer.step.numpy()) == 20 and not last["stopped_early"]
    assert job.input.calls == 24                       # 9 updates, then steps 6-20 on fresh batches

class ReformingWorld(FakeWorld):
    """FakeWorld whose formations change at given commits (hosts added or removed) and whose collective fails in
    the update that reads the input for the `fail_at_read`-th time (a lost peer: back to the last commit)."""

    def __init__(self, sizes, reform_at_commits):
        super().__init__(sizes, fail_at_allreduce=0, grow_at_step=0)
        self.reform_at = list(reform_at_commits)

    def check_host_updates(self):
        step = int(self.trainer.step.numpy())
        self.commits.append(step)
        if self.reform_at and step == self.reform_at[0]:
            self.reform_at.pop(0)
            raise self.HostsUpdated(False)


def _spot_config(tiny_data, tmp_path, **overrides):
    settings = dict(model_preset="tiny", vocab_file=tiny_data["vocab_file"], train_files=tiny_data["train"],
                    max_seq_length=64, max_predictions_per_seq=10, micro_batch_size=4, elastic=True,
                    global_batch_size=16, elastic_commit_interval=4, total_steps=20, log_interval=1, save_interval=8,
                    checkpoint_dir=str(tmp_path), mlm_only=False)
    settings.update(overrides)
    return pretrain_config.PretrainConfig(**settings)


@pytest.mark.slow
def test_the_budget_recipe_with_powersgd_on_elastic_ranks_through_a_failure_across_the_compression_warmup(
        tiny_data, tmp_path):
    """One process drives the elastic loop with PowerSGD after 6 float32 updates and a batch warmup: 2 ranks, a
    peer lost in update 7 (past the compression warmup; the commit of 4 comes back, before it), 1 rank on, a host
    added at the commit of 12, 2 ranks to the end. The warmup's clock is the optimizer's update count, restored
    with the commit: at the end it counts the 20 committed updates, not the 23 trained; each update's batch
    follows the batch warmup over the committed sequences, at least one micro-batch per rank."""
    from bert_tf.parallel import distributed
    from bert_tf.parallel.comm import CommConfig
    from bert_tf.train import batch_warmup, pretraining
    cfg = _spot_config(tiny_data, tmp_path, batch_warmup_sequences=96,
                       comm=CommConfig(exchange="powersgd", powersgd_rank=2, compression_warmup_steps=6))
    distributed.init()
    lines = []
    job = startup.build(cfg, lambda *a, **k: lines.append(" ".join(map(str, a))))
    world = ReformingWorld(sizes=[2, 1, 2], reform_at_commits=[12])
    world.trainer = job.trainer
    reads = {"n": 0}
    real_next = job.input.next_update

    def next_update():
        reads["n"] += 1
        if reads["n"] == 7:
            raise world.Failure("horovod: a peer was lost in update 7 (fake)")
        return real_next()
    job.input.next_update = next_update
    log = lambda *a, **k: lines.append(" ".join(map(str, a)))
    elastic.Elastic(cfg, job, log, world=world).run(lambda mode: pretraining.train(cfg, job, mode))
    trainer = job.trainer
    assert int(trainer.step.numpy()) == 20 and trainer.exchange.clock is trainer.optimizer.iterations
    assert int(trainer.optimizer.iterations.numpy()) == 20
    out = "\n".join(lines)
    assert out.count("error buffers restarted at zero and Q afresh") == 3, out     # every start, every rank alike
    records = read_metrics(tmp_path / "metrics.jsonl")
    starts = [(r["step"], r["ranks"]) for r in records if r.get("event") == "start"]
    assert starts == [(0, 2), (4, 1), (12, 2)], starts
    curve = batch_warmup.BatchWarmup(96, 4, 4, 1)
    grew = []
    for r in records:
        if r.get("event") == "start":
            seen, ranks = r["samples_seen"], r["ranks"]
        elif r["kind"] == "train":
            k = curve.micro_batches_at(seen, least=ranks)
            assert r["samples_seen"] == seen + 4 * k, (r["step"], r["samples_seen"], seen, k)
            assert r["sequences"] == 4 * len(range(0, k, ranks)), (r["step"], r["sequences"], k, ranks)
            seen = r["samples_seen"]
            grew.append(k)
    assert grew[0] == 2 and 3 in grew and grew[-1] == 4, grew        # the batch grew during the warmup


@pytest.mark.slow
def test_diloco_on_elastic_ranks_commits_at_its_synchronisations_and_agrees_after_each_start(tiny_data, tmp_path):
    """--local_updates=2 with --elastic: a host removed at the commit of 4 and added at 8; the outer step's anchor
    and momentum are committed state (every rank takes rank 0's at a start), the weights agree after the first
    synchronisation of every formation, and the run ends at 12 after 6 outer steps."""
    from bert_tf.parallel import distributed
    from bert_tf.parallel.comm import CommConfig
    from bert_tf.train import pretraining
    cfg = _spot_config(tiny_data, tmp_path, total_steps=12, save_interval=4, eval_interval=0,
                       comm=CommConfig(local_updates=2, outer_learning_rate=1.0, outer_momentum=0.0))
    distributed.init()
    lines = []
    job = startup.build(cfg, lambda *a, **k: lines.append(" ".join(map(str, a))))
    world = ReformingWorld(sizes=[2, 1, 2], reform_at_commits=[4, 8])
    world.trainer = job.trainer
    log = lambda *a, **k: lines.append(" ".join(map(str, a)))
    elastic.Elastic(cfg, job, log, world=world).run(lambda mode: pretraining.train(cfg, job, mode))
    assert int(job.trainer.step.numpy()) == 12 and int(job.outer.rounds.numpy()) == 6
    records = read_metrics(tmp_path / "metrics.jsonl")
    events = [(r["event"], r["step"], r["ranks"]) for r in records if r["kind"] == "elastic"]
    assert events == [("start", 0, 2), ("first synchronisation", 2, 2), ("start", 4, 1),
                      ("first synchronisation", 6, 1), ("start", 8, 2), ("first synchronisation", 10, 2),
                      ("end", 12, 2)], events
    assert world.commits == [4, 8, 12]


SPOT_EXCHANGES = {
    "powersgd": ["--exchange=powersgd", "--powersgd_rank=2", "--compression_warmup_steps=22"],
    "onebit": ["--exchange=onebit", "--compression_warmup_steps=22", "--optimizer=adamw"],
    "diloco": ["--local_updates=5", "--outer_learning_rate=1.0", "--outer_momentum=0.0"],
}


@pytest.mark.cluster
@needs_namespaces
@pytest.mark.parametrize("exchange", [
    # PowerSGD, the exchange that wins on slow links, in every run; the others with -m long (pytest.ini)
    name if name == "powersgd" else pytest.param(name, marks=pytest.mark.long) for name in SPOT_EXCHANGES])
def test_the_spot_cluster_run_whole(tmp_path, tiny_data, exchange):
    """4 emulated nodes, --elastic, a batch warmup and a compressed exchange (or DiLoCo): node 3 killed during the
    batch warmup (Horovod takes it back when its cooldown ends: a rejoin), node 2 killed past the compression
    warmup's boundary (22) but before the next commit (30), so the re-formed ranks go back to 20 and cross it
    again; then the whole job stopped and started again, resuming from its checkpoint (bert_tf/studies/spot_run.py).
    It finishes; every rank holds the same weights after every start, first update or synchronisation and at
    the end."""
    from bert_tf.studies import spot_run
    ckpt = tmp_path / "run"
    # a 10 ms cycle time: with Horovod's response cache on, a rejoining node aborted every time (configure)
    flags = tiny_data["flags"] + ["--elastic", "--elastic_verify_commits", "--global_batch_size=32",
                                  "--elastic_commit_interval=10",
                                  "--save_interval=10", "--total_steps=60", "--batch_warmup_sequences=320",
                                  "--cycle_time_ms=10", f"--checkpoint_dir={ckpt}", *SPOT_EXCHANGES[exchange]]
    with ec.EmulatedCluster(4, rate_gbit=1) as cluster:
        result = spot_run.run(cluster, flags, str(ckpt), str(tmp_path), spot_run.parse_events(
            ["kill:3@5", "kill:2@23", "stop@43"]), timeout=400)
    first, last = (open(log).read() for log in (result["logs"][0], result["logs"][-1]))
    assert not spot_run.check(result), (spot_run.check(result), last[-6000:])
    records = result["records"]
    starts = [(r["step"], r["ranks"], r["time"]) for r in records if r.get("event") == "start"]
    trains = [r for r in records if r["kind"] == "train"]
    (_, _, t_second), (_, _, t_stop) = result["events"][1:]
    # the second kill rolled back to the commit of 20, before the boundary, after an update past it
    assert any(s == 20 and when > t_second for s, _, when in starts), starts
    assert any(n == 4 for _, n, when in starts[1:] if when < t_second), starts   # node 3 came back (a rejoin)
    assert any(s >= 40 and when > t_stop for s, _, when in starts), starts       # the second job went on from 40
    ends = [r for r in records if r.get("event") == "end"]
    assert ends and ends[-1]["step"] == 60 and trains[-1]["step"] == 60
    # every rank's digest at every commit, compared by check(); a commit that finds the hosts changed re-forms
    # instead (node 3 back at 20), and the new formation's start compares them at that step
    commits = {r["step"] for r in records if r.get("event") == "commit"}
    restarts = {r["step"] for r in records if r.get("event") == "start"}
    assert commits and {10, 20, 30, 40, 50, 60} <= commits | restarts, (commits, restarts)
    if exchange != "diloco":
        assert "restarted at zero" in first, first[-4000:]
        assert "restored its own error buffers" in last or "start at zero" in last or "starts at zero" in last, \
            last[-4000:]
    assert all(np.isfinite(t["loss"]) for t in trains)
    print(json.dumps({"starts": [(s, n) for s, n, _ in starts]}))


@pytest.mark.slow
def test_auto_on_elastic_ranks_keeps_the_checkpoints_exchange_and_chooses_once_per_job(tiny_data, tmp_path):
    """--exchange=auto with --elastic: every rank builds with none (no collective before the first
    sync), then the formation agrees at its start: a resumed job keeps the exchange its checkpoint recorded
    (here PowerSGD rank 2: the trainer's exchange is switched, the optimizer's clock attached); a fresh one
    measures once (on one real rank: none) and every re-form keeps that choice, measuring nothing again."""
    from bert_tf.parallel import distributed
    from bert_tf.parallel.comm import CommConfig
    from bert_tf.train import pretraining
    auto = CommConfig(exchange="auto")
    cfg = _spot_config(tiny_data, tmp_path / "resumed", total_steps=8, comm=auto, ladder_sequences_per_second=10.0)
    distributed.init()
    lines = []
    log = lambda *a, **k: lines.append(" ".join(map(str, a)))
    job = startup.build(cfg, log)
    assert job.trainer.exchange.method == "none" and not job.trainer.exchange.own()   # built with none, agreed at the start
    job.exchange_record = {"gradient_compression": "powersgd", "powersgd_rank": 2}    # as rank 0 read it
    world = ReformingWorld(sizes=[2, 1], reform_at_commits=[4])
    world.trainer = job.trainer
    elastic.Elastic(cfg, job, log, world=world).run(lambda mode: pretraining.train(cfg, job, mode))
    exchange = job.trainer.exchange
    assert exchange.method == "powersgd" and exchange.rank == 2 and exchange.clock is job.trainer.optimizer.iterations
    assert sum("the resumed checkpoint's exchange, powersgd rank 2, is kept" in line for line in lines) == 1, lines
    saved = json.loads((tmp_path / "resumed" / "ckpt-8.json").read_text())
    assert saved["exchange"] == {"gradient_compression": "powersgd", "powersgd_rank": 2}

    cfg = _spot_config(tiny_data, tmp_path / "fresh", total_steps=8, comm=auto, ladder_sequences_per_second=10.0)
    lines.clear()
    job = startup.build(cfg, log)
    world = ReformingWorld(sizes=[2, 1], reform_at_commits=[4])
    world.trainer = job.trainer
    elastic.Elastic(cfg, job, log, world=world).run(lambda mode: pretraining.train(cfg, job, mode))
    assert sum("--exchange=auto on one rank" in line for line in lines) == 1, "\n".join(lines)
    assert json.loads((tmp_path / "fresh" / "ckpt-8.json").read_text())["exchange"]["gradient_compression"] == "none"


class SplitBrainWorld(ReformingWorld):
    """A formation whose second rank reports other weights from the commit at `split_at` on."""

    def __init__(self, split_at):
        super().__init__(sizes=[2], reform_at_commits=[])
        self.split_at = split_at

    def gather_bytes(self, data):
        if int(self.trainer.step.numpy()) >= self.split_at:
            return [data, b"0123456789abcdef"]
        return [data] * self.size()


@pytest.mark.slow
def test_elastic_verify_commits_compares_every_ranks_weights_at_each_commit(tiny_data, tmp_path):
    """--elastic_verify_commits: each commit writes an "elastic" record with every rank's digest; ranks that
    disagree stop the job at that commit, naming it."""
    from bert_tf.parallel import distributed
    from bert_tf.train import pretraining
    distributed.init()
    for verify, split_at, folder in ((True, 99, "agree"), (False, 99, "unchecked"), (True, 8, "split")):
        cfg = _spot_config(tiny_data, tmp_path / folder, total_steps=12, elastic_verify_commits=verify)
        job = startup.build(cfg, lambda *a, **k: None)
        world = SplitBrainWorld(split_at)
        world.trainer = job.trainer
        run = lambda: elastic.Elastic(cfg, job, lambda *a, **k: None, world=world).run(
            lambda mode: pretraining.train(cfg, job, mode))
        if folder == "split":
            with pytest.raises(RuntimeError, match="ranks disagree on the weights after commit at step 8"):
                run()
            continue
        run()
        commits = [r["step"] for r in read_metrics(tmp_path / folder / "metrics.jsonl") if r.get("event") == "commit"]
        assert commits == ([4, 8, 12] if verify else []), commits
