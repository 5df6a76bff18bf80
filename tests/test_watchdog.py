"""bert_tf/parallel/watchdog.py with a stand-in clock and exit: it fires only inside a collective and only past
its limit, says which rank, which collective and where, names the ranks that did not arrive from their
heartbeats, and goes on when the wait ends within the grace. The real hang (a rank stopped by SIGSTOP) and a
slow save: tests/test_distributed.py."""
import json

from bert_tf.parallel import watchdog


class Clock:
    """A stand-in clock for a watchdog without its thread: `run` advances it one poll at a time, ticking."""

    def __init__(self, dog_args, **kwargs):
        self.now, self.exits = 0.0, []
        self.dog = watchdog.Watchdog(*dog_args, exit=self.exits.append, clock=lambda: self.now, poll_seconds=1.0,
                                     sleep=self.sleep, thread=False, wall=lambda: 1e9 + self.now, **kwargs)
        self.during_grace = None          # called inside the grace sleep (a wait that ends meanwhile)

    def sleep(self, seconds):
        self.exits.append(f"grace {seconds:g} s")
        self.now += seconds
        if self.during_grace:
            self.during_grace()

    def run(self, seconds):
        for _ in range(int(seconds)):
            self.now += 1.0
            self.dog.tick()


def test_fires_inside_a_collective_past_the_limit_only():
    c = Clock((0.5, 1))
    c.run(1000)                                       # long outside any collective: nothing
    assert not c.exits
    c.dog.place = "update 7"
    with c.dog.watching("the gradient allreduce"):
        c.run(29)
        assert not c.exits
        c.run(2)
        assert c.exits == ["grace 5 s", watchdog.EXIT_CODE]   # the other waiting ranks get to say so too
    assert c.dog.fired.startswith("error: rank 1 has waited 0.5 min in the gradient allreduce (update 7), longer "
                                  "than --collective_timeout_minutes=0.5")


def test_a_collective_that_returns_in_time_resets_the_clock():
    c = Clock((1, 0))
    for _ in range(3):
        with c.dog.watching("the stop-flag allreduce"):
            c.run(50)
        c.run(50)
    assert not c.exits and c.dog.check() is None


def test_time_this_process_spent_frozen_is_not_waiting():
    """A rank stopped by SIGSTOP inside a collective and woken later (mpirun sends SIGCONT before SIGTERM)
    sees one very late poll: that gap is its own, so it must not claim the others kept it waiting."""
    c = Clock((0.5, 1))
    with c.dog.watching("the allgather of the input positions"):
        c.run(10)
        c.now += 120.0                                # frozen for two minutes between two polls
        c.dog.tick()
        assert not c.exits and c.dog.check() is None
        c.run(18)                                     # 10 + 1 + 18 s of real waiting: not yet
        assert not c.exits
        c.run(2)                                      # past the 30-s limit
        assert c.exits and "has waited 0.5 min" in c.dog.fired
    late = Clock((0.5, 1))
    with late.dog.watching("the gradient allreduce"):
        late.run(20)
        late.now += 4.0                               # a poll 4 s late (a busy machine) still counts as waiting
        late.dog.tick()
        late.run(6)
        assert late.exits


def test_no_timeout_means_no_thread_and_no_horovod_settings():
    assert watchdog.Watchdog(0, rank=0).check() is None
    assert watchdog.horovod_settings(0) == {}
    assert watchdog.horovod_settings(30) == {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60"}
    assert watchdog.horovod_settings(0.25) == {"HOROVOD_STALL_CHECK_TIME_SECONDS": "7"}


def test_a_wait_can_have_its_own_limit():
    """The others' wait for rank 0's save runs under --save_timeout_minutes, not the collective timeout; 0: none."""
    c = Clock((0.5, 1))
    with c.dog.watching("rank 0's save of checkpoint 20", 2):
        c.run(100)                                    # past the 30-s timeout, within the save's 2 min
        assert not c.exits
        c.run(21)
        assert c.exits and "longer than its limit of 2 min" in c.dog.fired
    forever = Clock((0.5, 1))
    with forever.dog.watching("rank 0's save of checkpoint 20", 0):
        forever.run(10000)
    with watchdog.watching("the installed watchdog, minutes given by position", 1):   # the module's API too
        pass
    assert not forever.exits
    assert watchdog.solo_minutes(30, 60) == 60 and watchdog.solo_minutes(30, 5) == 30
    assert watchdog.solo_minutes(0, 60) == 0 and watchdog.solo_minutes(30, 0) == 0


def test_a_wait_that_ends_within_the_grace_goes_on(capsys):
    c = Clock((0.5, 1))
    wait = c.dog.watching("the gradient allreduce")
    wait.__enter__()
    c.during_grace = lambda: wait.__exit__(None, None, None)   # the last rank arrives during the grace
    c.run(31)
    assert c.exits == ["grace 5 s"] and c.dog.fired is None   # no exit
    assert ("rank 1: the wait in the gradient allreduce ended after 35 s, within the grace period: the job goes on"
            in capsys.readouterr().err)
    c.during_grace = None
    with c.dog.watching("the metrics' allreduce"):            # and it still fires later
        c.run(31)
    assert c.exits == ["grace 5 s", "grace 5 s", watchdog.EXIT_CODE]


def write_beat(folder, rank, seq, place, when, inside=None, last="the gradient allreduce", started=1e9):
    beat = {"rank": rank, "seq": seq, "in": inside, "last": last, "place": place, "time": when, "started": started}
    (folder / f"rank-{rank}.json").write_text(json.dumps(beat))


def test_heartbeats_name_the_ranks_that_did_not_arrive(tmp_path):
    """Rank 0 waits in its 3rd collective: rank 1 is there too, rank 2 is still busy at its 2nd, rank 3 has
    written nothing for 40 s (frozen), rank 4 never wrote (or only an earlier job did)."""
    c = Clock((0.5, 0), size=5, heartbeat_dir=str(tmp_path))
    assert json.loads((tmp_path / "rank-0.json").read_text())["seq"] == 0     # written from the start
    for _ in range(2):
        with c.dog.watching("the gradient allreduce"):
            c.run(1)
    c.dog.place = "update 13"
    with c.dog.watching("the metrics' allreduce"):
        c.run(29)
        assert not c.exits
        now = 1e9 + c.now
        write_beat(tmp_path, 1, 3, "update 13", now, inside="the metrics' allreduce")
        write_beat(tmp_path, 2, 2, "update 13", now)
        write_beat(tmp_path, 3, 3, "update 13", now - 40, inside="the metrics' allreduce")
        write_beat(tmp_path, 4, 3, "update 13", now, started=1e9 - 3600)      # an earlier job's file
        c.run(1)
    assert c.exits == ["grace 5 s", watchdog.EXIT_CODE]
    assert json.loads((tmp_path / "rank-0.json").read_text())["in"] == "the metrics' allreduce"
    message = c.dog.fired
    assert message.startswith("error: rank 0 has waited 0.5 min in the metrics' allreduce (update 13), longer than "
                              "--collective_timeout_minutes=0.5: rank 2 did not arrive (alive, busy since it left "
                              "the gradient allreduce, at update 13); rank 3 did not arrive (no sign of life for "
                              "41 s: frozen, dead or cut off)"), message
    assert "rank 4 did not arrive (no heartbeat" in message and "rank 1 " not in message
    assert "print no such line" not in message


def test_without_the_others_heartbeats_the_message_says_it_the_old_way(tmp_path):
    """A node-local folder: no file from the other ranks; and no folder at all."""
    for folder in (str(tmp_path), None):
        c = Clock((0.5, 1), size=2, heartbeat_dir=folder)
        with c.dog.watching("the stop-flag allreduce"):
            c.run(31)
        assert "another rank stopped taking part" in c.dog.fired
        assert "the ranks that print no such line within 5 s are the ones" in c.dog.fired


def test_a_save_longer_than_the_ranks_may_wait_is_warned_of():
    assert watchdog.timeout_warning(30, 60, 120) == ""            # shorter than either
    assert watchdog.timeout_warning(1, 60, 120) == ""             # the save's limit covers it
    assert watchdog.timeout_warning(1, 0, 120) == ""              # saves waited for for ever
    assert watchdog.timeout_warning(0, 1, 120) == ""              # no watchdog
    assert watchdog.timeout_warning(1, 1, None) == ""             # nothing measured
    warning = watchdog.timeout_warning(1, 1.5, 120)
    assert warning.startswith("WARNING: the last checkpoint save took 120 s, longer than "
                              "--collective_timeout_minutes=1 and --save_timeout_minutes=1.5"), warning


def test_the_longer_limit_of_a_wait_for_rank_0_holds_while_rank_0_shows_signs_of_life(tmp_path):
    """Rank 1 waits for rank 0's save under 2 min: past the 30-s collective timeout it goes on waiting while
    rank 0's heartbeat is fresh (busy saving), and ends the job once rank 0 falls silent (frozen mid-save)."""
    c = Clock((0.5, 1), size=2, heartbeat_dir=str(tmp_path))
    c.dog.place = "update 20"
    with c.dog.watching("rank 0's save of checkpoint 20", 2):
        for _ in range(60):                           # rank 0 alive, its wait count behind: busy
            write_beat(tmp_path, 0, 0, "update 20", 1e9 + c.now, last="the allgather of the input positions")
            c.run(1)
        assert not c.exits
        c.run(6)                                      # no heartbeat for 6 s: silent
    assert c.exits == ["grace 5 s", watchdog.EXIT_CODE]
    assert c.dog.fired.startswith("error: rank 1 has waited 1.1 min in rank 0's save of checkpoint 20 (update 20), "
                                  "longer than --collective_timeout_minutes=0.5: rank 0 did not arrive (no sign of "
                                  "life for 6 s: frozen, dead or cut off)"), c.dog.fired
