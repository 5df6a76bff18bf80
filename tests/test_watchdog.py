"""bert_tf/dist/watchdog.py with a stand-in clock and exit: it fires only inside a collective and only past
the limit, and says which rank, which collective and where. The real hang (a rank stopped by SIGSTOP):
tests/test_distributed.py."""
from bert_tf.dist import watchdog


class Clock:
    """A stand-in clock for a watchdog without its thread: `run` advances it one poll at a time, ticking."""

    def __init__(self, dog_args, **kwargs):
        self.now, self.exits = 0.0, []
        self.dog = watchdog.Watchdog(*dog_args, exit=self.exits.append, clock=lambda: self.now, poll_seconds=1.0,
                                     sleep=lambda s: self.exits.append(f"grace {s:g} s"), thread=False, **kwargs)

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
