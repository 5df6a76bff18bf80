"""A hang is an error (--collective_timeout_minutes): a rank waiting in a collective longer than the timeout
says which rank, which collective and how long, and ends the job.

A collective waits for every rank. When one stops taking part (a node that froze or lost its network, a
wedged MPI or NCCL, a process stopped by SIGSTOP) the others wait for ever, and Horovod says nothing: its
stall check runs in the coordinator's negotiation, which a silent rank blocks too (measured: with a rank
stopped, no stall warning in 30 s at HOROVOD_STALL_CHECK_TIME_SECONDS=7). Here every rank runs a thread that
watches the collectives the loop enters (`watching`); past the timeout it prints which rank waited, in
which collective, at which update, waits a grace period so that the other waiting ranks print theirs (the
ranks without a line are the ones that stopped), and exits with EXIT_CODE, so mpirun/horovodrun end the job
and the scheduler frees the nodes. The last complete checkpoint stays readable (TensorFlow writes a
checkpoint's files before it names it in `checkpoint`).

Horovod's stall check still reports within half the timeout (`horovod_settings`) the case it can see: ranks
alive and negotiating, one of them never submitting a tensor the others did.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

EXIT_CODE = 75      # EX_TEMPFAIL: a node failed, the job may be restarted from its last checkpoint


def horovod_settings(minutes: float) -> dict:
    """Horovod's stall check for a timeout: its report within half of it (at most every 60 s, Horovod's
    default). Its own shutdown stays off: the watchdog ends the job, with its message."""
    if not minutes:
        return {}
    return {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(1, int(min(60, minutes * 30))))}


class Watchdog:
    """Watches one collective at a time on this rank; `exit`, `clock` and `sleep` are for tests, and so is
    `thread=False` (the test calls `tick` itself)."""

    def __init__(self, minutes: float, rank: int, exit=os._exit, clock=time.monotonic, poll_seconds=None,
                 sleep=time.sleep, thread=True):
        self.limit, self.rank, self._exit, self._clock, self._sleep = minutes * 60, rank, exit, clock, sleep
        self.place = ""                       # where the loop is (e.g. "update 13"), for the message
        self._current = None                  # (what, since) while in a collective
        self._lock = threading.Lock()
        self.fired = None
        self.grace = min(60.0, max(5.0, self.limit / 10))   # for the other waiting ranks to say so too
        self.poll = poll_seconds or min(10.0, self.limit / 10)
        # A poll that comes this late means this process itself was frozen (SIGSTOP, a paused VM), not kept
        # waiting: measured, a stopped rank woken by mpirun's SIGCONT would otherwise blame the others.
        self.frozen_after = max(5.0, 3 * self.poll)
        self._last_tick = clock()
        if self.limit and thread:
            threading.Thread(target=self._run, name="collective-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watching(self, what: str):
        with self._lock:
            self._current = (what, self._clock())
        try:
            yield
        finally:
            with self._lock:
                self._current = None

    def check(self) -> str | None:
        """The message when the current collective has waited past the limit, else None."""
        with self._lock:
            current = self._current
        if not self.limit or current is None:
            return None
        what, since = current
        waited = self._clock() - since
        if waited < self.limit:
            return None
        place = f" ({self.place})" if self.place else ""
        return (f"error: rank {self.rank} has waited {waited / 60:.1f} min in {what}{place}, longer than "
                f"--collective_timeout_minutes={self.limit / 60:g}: another rank stopped taking part (a frozen or "
                f"unreachable node, a wedged MPI/NCCL, a stopped process): the ranks that print no such line within "
                f"{self.grace:g} s are the ones. Ending the job (exit code {EXIT_CODE}); restart it to resume from the "
                f"last checkpoint")

    def tick(self):
        """One poll: discount time this process spent frozen, then fire if the collective waited too long."""
        now = self._clock()
        late = now - self._last_tick - self.poll
        self._last_tick = now
        if late > self.frozen_after:
            with self._lock:
                if self._current is not None:
                    what, since = self._current
                    self._current = (what, since + late)
        message = self.check()
        if message and self.fired is None:
            self.fired = message
            print(message, file=sys.stderr, flush=True)
            self._sleep(self.grace)
            self._exit(EXIT_CODE)

    def _run(self):
        while self.fired is None:
            time.sleep(self.poll)
            self.tick()


_ACTIVE = Watchdog(0, 0)


def install(minutes: float, rank: int) -> Watchdog:
    """This process's watchdog (one per process; 0 minutes: none)."""
    global _ACTIVE
    _ACTIVE = Watchdog(minutes, rank)
    return _ACTIVE


def watching(what: str):
    """Context manager: the installed watchdog watches `what` (a collective) while inside."""
    return _ACTIVE.watching(what)


def at(place: str):
    """Where the loop is, for the message (cheap: no clock read)."""
    _ACTIVE.place = place
