"""What else ran on the machine while this process measured a speed.

Between two readings of /proc/stat (every core's busy and stolen time) and /proc/self/stat (this
process's own CPU time, all its threads): the cores other processes kept busy, and the cores the
hypervisor gave to other guests (steal). On the 2-core benchmark machine one other busy process
halves the oneDNN matmul peak (1.1 TFLOP/s alone, about 0.5 beside it), so a figure measured while
either is above a small fraction of a core measures the neighbours as much as the code.

    with machine_load.Meter() as load:
        ...                                   # the measurement
    load.result   # {"seconds": 12.0, "other_cores": 0.02, "steal_cores": 0.0}

Linux only: elsewhere (no /proc) result is None and the figures go unqualified.
"""

from __future__ import annotations

import dataclasses
import os
import time

BUSY_WARNING_CORES = 0.2  # above this, a speed figure is flagged as measured beside other work


@dataclasses.dataclass(frozen=True)
class Reading:
    wall: float  # seconds (monotonic)
    busy_ticks: int  # all cores: user + nice + system + irq + softirq (guest time is inside user)
    steal_ticks: (
        int  # all cores: time the hypervisor ran someone else while this guest wanted to run
    )
    own_ticks: int  # this process: utime + stime over all its threads


def read(stat="/proc/stat", self_stat="/proc/self/stat") -> Reading | None:
    try:
        with open(stat) as f:
            cpu = f.readline().split()
        with open(self_stat) as f:
            own = f.read()
    except OSError:
        return None
    if cpu[0] != "cpu" or len(cpu) < 9:
        raise ValueError(
            f"{stat}: first line is not the all-cores 'cpu' line: {' '.join(cpu[:4])}..."
        )
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in cpu[1:9])
    # the command name in field 2 may hold spaces and parentheses: count the fields after its last
    # ')'
    rest = own.rsplit(")", 1)[1].split()  # rest[0] is field 3 (state); utime, stime = fields 14, 15
    return Reading(
        time.monotonic(), user + nice + system + irq + softirq, steal, int(rest[11]) + int(rest[12])
    )


def between(a: Reading, b: Reading, ticks_per_second: float | None = None) -> dict:
    """{"seconds", "other_cores", "steal_cores"} from reading a to reading b."""
    tick = ticks_per_second or os.sysconf("SC_CLK_TCK")
    seconds = max(b.wall - a.wall, 1e-9)
    other = (b.busy_ticks - a.busy_ticks) - (b.own_ticks - a.own_ticks)
    return {
        "seconds": seconds,
        "other_cores": max(other, 0) / tick / seconds,
        "steal_cores": (b.steal_ticks - a.steal_ticks) / tick / seconds,
    }


def busy(load: dict | None) -> bool:
    return (
        load is not None
        and bool(load)
        and load["other_cores"] + load["steal_cores"] > BUSY_WARNING_CORES
    )


def describe(load: dict | None) -> str:
    if not load:
        return "machine load not measured (no /proc)"
    return f"other processes {load['other_cores']:.2f} cores, steal {load['steal_cores']:.2f} cores"


class Meter:
    """Context manager: `result` holds between(enter, exit), or None without /proc."""

    def __init__(self, stat="/proc/stat", self_stat="/proc/self/stat"):
        self.paths, self.result = (stat, self_stat), None

    def __enter__(self):
        self.start = read(*self.paths)
        return self

    def __exit__(self, *exc):
        end = read(*self.paths)
        if self.start and end:
            self.result = between(self.start, end)
        return False
