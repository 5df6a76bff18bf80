"""Which gradient exchange reaches a quality fastest: the updates each needs for float16's held-out
accuracy (measured in the communication race), --exchange=auto's candidates, and the ranking by time
to that accuracy. Arithmetic only: the planner (tools/planner.py) and auto_exchange.py both use
it."""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_tf.parallel.comm import CommConfig

# Updates each gradient exchange needs to reach the held-out MLM accuracy float16 allreduce reaches
# in 1: the communication race on 2 and 4 emulated nodes (docs/results.md, "The communication race
# on emulated slow links"; the update at the first evaluation at or above float16's final accuracy
# over float16's updates, the worst of the seeds and node counts; a method given 2x the updates that
# never got there counts 2.0, a lower bound). None: it never reached that accuracy there: never
# chosen.
MEASURED_UPDATE_FACTORS: dict[str, Any] = {
    "none": 1.0,
    "fp16": 1.0,
    "powersgd": {4: 2.0, 8: 1.4},
    "onebit": None,
}


def update_factor(comm: CommConfig, factors=None):
    """(factor, note) for comm's exchange from `factors` (default MEASURED_UPDATE_FACTORS); a
    PowerSGD rank not measured takes the nearest measured rank's factor, and the note says so."""
    factor = (factors or MEASURED_UPDATE_FACTORS)[comm.method]
    if not isinstance(factor, dict):
        return factor, ""
    rank = min(factor, key=lambda r: (abs(r - comm.powersgd_rank), r))
    return factor[rank], "" if rank == comm.powersgd_rank else f" (rank {rank}'s)"


def exchange_choices(comm: CommConfig) -> dict:
    """--exchange=auto's candidates: label -> comm with that exchange, the other settings kept;
    PowerSGD at comm's --powersgd_rank and at every rank the race measured. With
    --allreduce_every_micro_batch only the allreduces: the compressed exchanges' error feedback
    needs one exchange per update."""
    base = dataclasses.replace(comm, fp16_allreduce=False)
    out = {m: dataclasses.replace(base, exchange=m) for m in ("none", "fp16")}
    if comm.allreduce_every_micro_batch:
        return out
    for rank in sorted({comm.powersgd_rank, *MEASURED_UPDATE_FACTORS["powersgd"]}):
        out[f"powersgd rank {rank}"] = dataclasses.replace(
            base, exchange="powersgd", powersgd_rank=rank
        )
    out["onebit"] = dataclasses.replace(base, exchange="onebit")
    return out


def rank_exchanges(seconds: dict, comms: dict, factors=None) -> list:
    """seconds: method -> the run's time at full speed with that exchange, same updates; returns
    rows {"method", "seconds", "factor", "to_quality", "note"} fastest to the same quality first
    (to_quality = seconds x update factor), the methods without a measured factor last with
    to_quality None."""
    rows = []
    for method, t in seconds.items():
        factor, note = update_factor(comms[method], factors)
        rows.append(
            {
                "method": method,
                "seconds": t,
                "factor": factor,
                "note": note,
                "to_quality": None if factor is None else t * factor,
            }
        )
    return sorted(rows, key=lambda r: (r["to_quality"] is None, r["to_quality"] or 0.0))


def describe_ranking(rows, unit="days") -> str:
    """One line: each exchange's time to the same quality, fastest first."""

    def one(r):
        if r["to_quality"] is None:
            return (
                f"{r['method']}: {r['seconds']:.3g} {unit}, never reached float16's accuracy in "
                "the race"
            )
        return (
            f"{r['method']}: {r['to_quality']:.3g} {unit} (x{r['factor']:.2f} updates{r['note']})"
        )

    return "; ".join(one(r) for r in rows)
