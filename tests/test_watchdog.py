"""bert_tf/dist/watchdog.py with a stand-in clock and exit: it fires only inside a collective and only past
the limit, and says which rank, which collective and where. The real hang (a rank stopped by SIGSTOP):
tests/test_distributed.py."""
import time

from bert_tf.dist import watchdog


def wait_for(condition, seconds=5.0):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.01)
    return condition()


def test_fires_inside_a_collective_past_the_limit_only():
    now, exits = [0.0], []
    dog = watchdog.Watchdog(0.5, rank=1, exit=exits.append, clock=lambda: now[0], poll_seconds=0.005,
                            sleep=lambda s: exits.append(f"grace {s:g} s"))
    now[0] = 1000.0                                   # long outside any collective: nothing
    assert not wait_for(lambda: exits, 0.1)
    dog.place = "update 7"
    with dog.watching("the gradient allreduce"):
        now[0] += 29.0
        assert not wait_for(lambda: exits, 0.1)
        now[0] += 2.0
        assert wait_for(lambda: len(exits) == 2)
    assert exits == ["grace 5 s", watchdog.EXIT_CODE]         # the other waiting ranks get to say so too
    assert dog.fired.startswith("error: rank 1 has waited 0.5 min in the gradient allreduce (update 7), longer "
                                "than --collective_timeout_minutes=0.5")


def test_a_collective_that_returns_in_time_resets_the_clock():
    now, exits = [0.0], []
    dog = watchdog.Watchdog(1, rank=0, exit=exits.append, clock=lambda: now[0], poll_seconds=0.005,
                            sleep=exits.append)
    for _ in range(3):
        with dog.watching("the stop-flag allreduce"):
            now[0] += 50.0
        now[0] += 50.0
    assert not wait_for(lambda: exits, 0.1) and dog.check() is None


def test_no_timeout_means_no_thread_and_no_horovod_settings():
    assert watchdog.Watchdog(0, rank=0).check() is None
    assert watchdog.horovod_settings(0) == {}
    assert watchdog.horovod_settings(30) == {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60"}
    assert watchdog.horovod_settings(0.25) == {"HOROVOD_STALL_CHECK_TIME_SECONDS": "7"}
