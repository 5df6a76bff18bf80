"""Preemptible (spot) capacity: the days and price of the planner's phases (planner.plan) on
on-demand nodes, on spot nodes restarted from the last checkpoint after each preemption, and on
spot nodes in elastic mode (bert_tf/train/elastic.py). Per phase of T hours on n nodes of N
devices:

    preemptions     Lambda = n / MTBP per hour     (MTBP: mean time between preemptions of ONE node;
                                                     nodes are preempted independently)
    on demand       T_od = T;  cost = T x N x price_on_demand
    spot + checkpoint restart: every preemption stops the job; it restarts from the last checkpoint
                    once the node is replaced, losing
        L_r = restart + replacement + save_interval / 2 x u     (u: update seconds of the phase)
        T_r = T / (1 - Lambda L_r)
              (the lost time recurs at the same rate; no end if Lambda L_r >= 1)
    spot + elastic: the job goes on without the node, then takes its replacement in, losing
        L_e = elastic + join + commit_interval / 2 x u + replacement / n
              (elastic: detection + restore + first update; join: the ranks wait for the newcomer's
               start-up; the missing node's share of the work while it is being replaced)
        and committing costs c = 12 x parameters bytes (fp32 weights + two optimizer slots) / host
        copy bandwidth every commit_interval updates:
        T_e = T (1 + c / (commit_interval x u)) / (1 - Lambda L_e)
    spot cost       T_x x N x price_spot x (1 - Lambda x replacement / n)
                    (a preempted node is not billed until replaced)
Assumes events far enough apart not to overlap (Lambda x L << 1) and a replacement always available.
"""

from __future__ import annotations

import dataclasses

from bert_tf import ConfigError
from bert_tf.tools.planner import Cluster

# run/elastic_recovery.py on this project's 2-core machine (docs/results.md, "Elastic training"):
# tiny BERT, 3 emulated nodes. Restart: kill -> first update of the relaunched job 50.6 s; elastic:
# kill -> first update on the survivors 35.4 s (30 s of it Gloo's timeout); a replacement joining
# stalls the ranks 18.0 s. run/plan.py's defaults for Preemption's restart_minutes, elastic_minutes
# and join_minutes.
MEASURED_RESTART_MINUTES = 50.6 / 60
MEASURED_ELASTIC_MINUTES = 35.4 / 60
MEASURED_JOIN_MINUTES = 18.0 / 60


@dataclasses.dataclass
class Preemption:
    """Preemptible capacity and what a preemption costs (module docstring: the equations)."""

    price_on_demand: float  # per device-hour
    price_spot: float  # per device-hour
    mtbp_hours: float  # mean time between preemptions of one node
    restart_minutes: float  # kill-and-restart from a checkpoint, without the lost updates
    elastic_minutes: float  # an elastic event: detection + restore + first update
    join_minutes: float  # the ranks wait for a joining node's start-up
    replacement_minutes: float  # until a preempted node is replaced
    save_interval: int  # updates between checkpoints
    elastic_commit_interval: int  # updates between elastic commits
    host_copy_gbytes_per_s: float = 10.0  # device -> host copy of one commit

    def __post_init__(self):
        for name in ("mtbp_hours", "host_copy_gbytes_per_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "price_on_demand",
            "price_spot",
            "restart_minutes",
            "elastic_minutes",
            "join_minutes",
            "replacement_minutes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        for name in ("save_interval", "elastic_commit_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")


def preemptible(phase_rows, cluster: Cluster, pre: Preemption, parameters: int) -> dict:
    """{"on-demand" | "spot + checkpoint restart" | "spot + elastic": {"days", "cost"}} for the
    phases of `planner.plan()` (module docstring: the equations). days is inf when preemptions
    outpace progress."""
    n, N = cluster.nodes, cluster.devices
    rate = n / pre.mtbp_hours
    replacement = pre.replacement_minutes / 60
    commit_hours = 12 * parameters / (pre.host_copy_gbytes_per_s * 1e9) / 3600
    hours = {"on-demand": 0.0, "spot + checkpoint restart": 0.0, "spot + elastic": 0.0}
    for row in phase_rows:
        T, u = row["days"] * 24, row["update_seconds"] / 3600
        lost_restart = pre.restart_minutes / 60 + replacement + pre.save_interval / 2 * u
        commits = pre.elastic_commit_interval
        lost_elastic = (
            (pre.elastic_minutes + pre.join_minutes) / 60 + commits / 2 * u + replacement / n
        )
        hours["on-demand"] += T
        hours["spot + checkpoint restart"] += _stretched(T, rate * lost_restart)
        hours["spot + elastic"] += _stretched(
            T * (1 + commit_hours / (commits * u)), rate * lost_elastic
        )
    billed = 1 - rate * replacement / n
    prices = {
        "on-demand": pre.price_on_demand,
        "spot + checkpoint restart": pre.price_spot * billed,
        "spot + elastic": pre.price_spot * billed,
    }
    return {k: {"days": h / 24, "cost": h * N * prices[k]} for k, h in hours.items()}


def cheapest(options: dict, within=0.01):
    """(the cheapest option's name, the others costing at most `within` more), for preemptible()'s
    result."""
    ranked = sorted(options, key=lambda k: options[k]["cost"])
    return ranked[0], [
        k for k in ranked[1:] if options[k]["cost"] <= (1 + within) * options[ranked[0]]["cost"]
    ]


def _stretched(hours, lost_fraction):
    return hours / (1 - lost_fraction) if lost_fraction < 1 else float("inf")
