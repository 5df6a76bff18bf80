"""A hang is an error (--collective_timeout_minutes), a busy rank is not: a rank waiting in a
collective longer than its limit says which rank did not arrive, in which collective, and ends the
job.

A collective waits for every rank. When one stops taking part (a node that froze or lost its
network, a wedged MPI or NCCL, a process stopped by SIGSTOP) the others wait for ever, and Horovod
says nothing: its stall check runs in the coordinator's negotiation, which a silent rank blocks too
(measured: with a rank stopped, no stall warning in 30 s at HOROVOD_STALL_CHECK_TIME_SECONDS=7).
Here every rank runs a thread that watches the collectives the loop enters (`watching`), each under
the installed limit or its own (`watching(what, minutes)`): the other ranks wait for rank 0's solo
work (a checkpoint's save and hashing, a rollback's restore) in a labelled barrier under
--save_timeout_minutes (`solo_minutes`), so a short collective timeout does not take a long save for
a hang. That longer limit holds while the ranks awaited show signs of life: one that falls silent
(frozen mid-save) still ends the wait at the collective timeout.

Who did not arrive: every rank counts the watched waits it has entered (all ranks enter the same
ones in the same order) and its thread writes a heartbeat file every poll
(<checkpoint_dir>/.watchdog/rank-R.json: that count, the wait it is in or last left, the update, the
wall time). Past the limit the waiting rank reads them all and names the ranks behind in the count
(alive, still busy: what they last did) or silent (no heartbeat for 3 polls or none at all: frozen,
dead or cut off). When it finds no other rank's file (a node-local folder) it says it the old way:
the ranks that print no such line within the grace are the ones. It waits a grace period so that the
other waiting ranks print theirs, then exits with EXIT_CODE, so mpirun/horovodrun end the job and
the scheduler frees the nodes; unless its wait ended meanwhile: then it says so and watches on. The
last complete checkpoint stays readable (TensorFlow writes a checkpoint's files before it names it
in `checkpoint`).

Horovod's stall check still reports within half the timeout (`horovod_settings`) the case it can
see: ranks alive and negotiating, one of them never submitting a tensor the others did.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

EXIT_CODE = 75  # EX_TEMPFAIL: a node failed, the job may be restarted from its last checkpoint
SAME_JOB_SECONDS = (
    60.0  # ranks install their watchdogs together (after hvd.init): a file started apart is older
)


def horovod_settings(minutes: float) -> dict:
    """Horovod's stall check for a timeout: its report within half of it (at most every 60 s,
    Horovod's default). Its own shutdown stays off: the watchdog ends the job, with its message."""
    if not minutes:
        return {}
    return {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(1, int(min(60, minutes * 30))))}


def solo_minutes(collective_minutes: float, save_minutes: float) -> float:
    """The limit on a wait for rank 0's solo work (a save, a restore): the longer of the two; 0 (for
    ever) when either is 0 (no watchdog, or no limit on saves)."""
    if not collective_minutes or not save_minutes:
        return 0.0
    return max(collective_minutes, save_minutes)


def timeout_warning(collective_minutes: float, save_timeout_minutes: float, save_seconds) -> str:
    """A warning when a measured checkpoint save takes longer than the other ranks may wait for it,
    else ""."""
    limit = solo_minutes(collective_minutes, save_timeout_minutes)
    if not save_seconds or not limit or save_seconds <= limit * 60:
        return ""
    return (
        f"WARNING: the last checkpoint save took {save_seconds:.0f} s, longer than "
        f"--collective_timeout_minutes={collective_minutes:g} and "
        f"--save_timeout_minutes={save_timeout_minutes:g}: the other ranks, waiting for it, would "
        f"end the job. Raise --save_timeout_minutes (0: wait for ever)"
    )


class Watchdog:
    """Watches one collective at a time on this rank; `exit`, `clock`, `wall` and `sleep` are for
    tests, and so is `thread=False` (the test calls `tick` itself). heartbeat_dir: where the ranks'
    heartbeats meet (None: none)."""

    def __init__(
        self,
        minutes: float,
        rank: int,
        size=1,
        heartbeat_dir=None,
        exit=os._exit,
        clock=time.monotonic,
        poll_seconds=None,
        sleep=time.sleep,
        thread=True,
        wall=time.time,
    ):
        self.limit, self.rank, self.size = minutes * 60, rank, size
        self._exit, self._clock, self._sleep, self._wall = exit, clock, sleep, wall
        self.place = ""  # where the loop is (e.g. "update 13"), for the message
        self.seq, self.last = (
            0,
            "",
        )  # watched waits entered (the same on every rank); the last one left
        self._current: tuple | None = None  # (what, since, limit, seq) while in a collective
        self._ended: tuple | None = None  # (seq, when) of the last wait left
        self._lock = threading.Lock()
        self.fired = None
        self.grace = min(
            60.0, max(5.0, self.limit / 10)
        )  # for the other waiting ranks to say so too
        self.poll = poll_seconds or min(10.0, self.limit / 10)
        # A poll that comes this late means this process itself was frozen (SIGSTOP, a paused VM),
        # not kept waiting: measured, a stopped rank woken by mpirun's SIGCONT would otherwise blame
        # the others. A heartbeat this old means the same of another rank.
        self.frozen_after = max(5.0, 3 * self.poll)
        self._last_tick = clock()
        self.heartbeats, self.started = (heartbeat_dir if self.limit else None), wall()
        if self.heartbeats:
            try:
                os.makedirs(self.heartbeats, exist_ok=True)
            except OSError:
                self.heartbeats = None
        self.beat()
        if self.limit and thread:
            threading.Thread(target=self._run, name="collective-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watching(self, what: str, minutes: float | None = None):
        """Watches `what` while inside, under `minutes` (0: no limit) or the installed limit."""
        limit = self.limit if minutes is None else minutes * 60
        with self._lock:
            self.seq += 1
            self._current = (what, self._clock(), limit, self.seq)
        try:
            yield
        finally:
            with self._lock:
                self._current, self.last, self._ended = None, what, (self.seq, self._clock())

    def _overdue(self):
        """(what, waited seconds, limit passed, seq) when the current collective has waited past its
        limit, else None. A limit longer than the installed one (rank 0's solo work) holds only
        while the ranks not yet arrived show signs of life: a silent one ends the wait at the
        installed limit."""
        with self._lock:
            current = self._current
        if not self.limit or current is None:
            return None
        what, since, limit, seq = current
        waited = self._clock() - since
        if limit and waited >= limit:
            return what, waited, limit, seq
        if waited >= self.limit and (not limit or limit > self.limit):  # reads the heartbeats: rare
            late = self._late(seq)
            if late and any(silent for _, silent, _ in late):
                return what, waited, self.limit, seq
        return None

    def check(self) -> str | None:
        """The message when the current collective has waited past its limit, else None."""
        overdue = self._overdue()
        return None if overdue is None else self._message(*overdue)

    def _message(self, what, waited, limit, seq) -> str:
        place = f" ({self.place})" if self.place else ""
        bound = (
            f"--collective_timeout_minutes={limit / 60:g}"
            if limit == self.limit
            else f"its limit of {limit / 60:g} min"
        )
        absent = self.absent(seq)
        if absent is None:
            absent = (
                "another rank stopped taking part (a frozen or unreachable node, a wedged "
                f"MPI/NCCL, a stopped process): the ranks that print no such line within "
                f"{self.grace:g} s are the ones"
            )
        return (
            f"error: rank {self.rank} has waited {waited / 60:.1f} min in {what}{place}, longer "
            f"than {bound}: {absent}. Ending the job (exit code {EXIT_CODE}) unless the wait ends "
            f"within {self.grace:g} s; restart it to resume from the last checkpoint"
        )

    def absent(self, seq) -> str | None:
        """Who did not arrive at this rank's wait number `seq` and why, from the heartbeats; None
        when they cannot tell (no other rank's file: a node-local folder, or no folder)."""
        late = self._late(seq)
        if late is None:
            return None
        if not late:
            return (
                "every rank's heartbeat is fresh and has reached this wait: Horovod itself is "
                "stuck (collectives that differ between ranks, or a wedged MPI/NCCL)"
            )
        return "; ".join(f"rank {r} did not arrive ({why})" for r, _, why in late)

    def _late(self, seq):
        """[(rank, silent, why)] for the ranks not at wait `seq` yet: silent (frozen, dead, cut off)
        or behind (alive, still busy); None when no other rank's heartbeat is there to tell."""
        beats = self._others()
        if not any(beats.values()):
            return None
        now, late = self._wall(), []
        for r, beat in sorted(beats.items()):
            if beat is None:
                late.append(
                    (
                        r,
                        True,
                        f"no heartbeat from it in {self.heartbeats}: dead early, or its node does "
                        f"not see that folder",
                    )
                )
            elif now - beat["time"] > self.frozen_after + beat.get("grace", 0):
                late.append(
                    (
                        r,
                        True,
                        f"no sign of life for {now - beat['time']:.0f} s: frozen, dead or cut off",
                    )
                )
            elif beat["seq"] < seq:
                doing = (
                    f"waiting in {beat['in']}"
                    if beat.get("in")
                    else f"busy since it left {beat.get('last') or 'none'}"
                )
                late.append((r, False, f"alive, {doing}, at {beat.get('place') or 'start-up'}"))
        return late

    def _others(self) -> dict:
        """Every other rank's heartbeat, None where there is none (or only an earlier job's)."""
        found = {}
        for r in range(self.size) if self.heartbeats else ():
            if r == self.rank:
                continue
            try:
                with open(self._heartbeat_path(r)) as f:
                    beat = json.load(f)
            except (OSError, ValueError):
                beat = None
            ours = (
                isinstance(beat, dict)
                and {"time", "seq", "started"} <= beat.keys()
                and abs(beat["started"] - self.started) < SAME_JOB_SECONDS
            )
            found[r] = beat if ours else None
        return found

    def _heartbeat_path(self, rank) -> str:
        assert self.heartbeats is not None, "called only while heartbeats are written"
        return os.path.join(self.heartbeats, f"rank-{rank}.json")

    def beat(self, grace=0.0):
        """This rank's heartbeat file, written aside then renamed (a reader never sees half of one);
        a write that fails is skipped. grace: seconds of silence to come (the grace sleep), not a
        freeze."""
        if not self.heartbeats:
            return
        with self._lock:
            current, seq, last = self._current, self.seq, self.last
        beat = {
            "rank": self.rank,
            "seq": seq,
            "in": current[0] if current else None,
            "last": last,
            "place": self.place,
            "time": self._wall(),
            "started": self.started,
            "grace": grace,
        }
        path = self._heartbeat_path(self.rank)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(beat, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def tick(self):
        """One poll: discount time this process spent frozen, write the heartbeat, then fire if the
        collective waited too long."""
        now = self._clock()
        late = now - self._last_tick - self.poll
        self._last_tick = now
        if late > self.frozen_after:
            with self._lock:
                if self._current is not None:
                    what, since, limit, seq = self._current
                    self._current = (what, since + late, limit, seq)
        self.beat()
        overdue = self._overdue() if self.fired is None else None
        if overdue is not None:
            self._fire(overdue)

    def _fire(self, overdue):
        """Says it, gives the other waiting ranks the grace period, then ends the job, unless this
        wait ended."""
        what, waited, _, seq = overdue
        since = self._clock() - waited
        self.fired = self._message(*overdue)
        print(self.fired, file=sys.stderr, flush=True)
        self.beat(grace=self.grace)
        self._sleep(self.grace)
        with self._lock:
            current, ended = self._current, self._ended
        if current is not None and current[3] == seq:
            self._exit(EXIT_CODE)
            return
        after = f" after {ended[1] - since:.0f} s" if ended and ended[0] == seq else ""
        print(
            f"rank {self.rank}: the wait in {what} ended{after}, within the grace period: the job "
            "goes on",
            file=sys.stderr,
            flush=True,
        )
        self.fired, self._last_tick = None, self._clock()  # watching on; the grace was no freeze

    def _run(self):
        while self.fired is None:
            time.sleep(self.poll)
            self.tick()


_ACTIVE = Watchdog(0, 0)


def install(minutes: float, rank: int, size: int = 1, heartbeat_dir=None) -> Watchdog:
    """This process's watchdog (one per process; 0 minutes: none); heartbeat_dir: where the ranks'
    heartbeats meet (a folder every rank can read, e.g. <checkpoint_dir>/.watchdog), None: none."""
    global _ACTIVE
    _ACTIVE = Watchdog(minutes, rank, size, heartbeat_dir)
    return _ACTIVE


def watching(what: str, minutes: float | None = None):
    """Context manager: the installed watchdog watches `what` (a collective) while inside, under
    `minutes` (0: no limit) or the installed limit."""
    return _ACTIVE.watching(what, minutes)


def at(place: str):
    """Where the loop is, for the message (cheap: no clock read)."""
    _ACTIVE.place = place
