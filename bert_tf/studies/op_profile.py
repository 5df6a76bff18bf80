"""Where a step's time goes: op time by op type, and by kind, from a TensorFlow profiler trace.

The trace is what tf.profiler.experimental writes (plugins/profile/<run>/<host>.xplane.pb). Counted
are the events of TensorFlow's worker threads (lines named tf_*): the executor's ops ("name:OpType")
on the tf_Compute threads, and the thunks of XLA-compiled functions (HLO names such as "dot.12" or
"multiply_add_fusion.3") on the intra-op pool's threads; the Python thread's waits are not. Each
event counts its self time (its duration less the events nested in it), so the wrappers around ops
(ExecutorState::Process, ThunkExecutor::Execute, conditionals) count only their own overhead, as
"(executor)", and nothing is counted twice; the thread pool's markers inside a kernel (ParallelFor)
count as that kernel's, and an op's wait for a compiled cluster (BlockUntilReady) is not counted
(the cluster's work is, on the threads that ran it). Ops that run side by side on different threads
each count their own time, so op time can exceed wall time; `per_sequence` spreads the measured wall
time over the kinds by their share of op time.

Kinds, the first whose pattern matches the op type or HLO name (XLA's prefixed "xla:") wins:
    cast              dtype conversions (Cast; XLA's convert)
    matmul            MatMul, Einsum, Conv, dot (oneDNN's _Mkl* and fused variants included)
    random numbers    the (stateless) random generators behind dropout
    variables         reads, assignments and the optimizer's fused apply kernels
    data movement     gathers, scatters, transposes, copies, slicing, concatenation, reshapes
    executor          the executors' own time between ops
    element-wise      everything else: arithmetic, activations, softmax, LayerNorm, reductions,
                      their gradients, and XLA's fusions of them (the optimizer update)
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

from bert_tf import knob

EXECUTOR = "(executor)"
KINDS = (
    ("cast", r"^(_Mkl)?Cast$|^xla:convert"),
    ("matmul", r"MatMul|Einsum|Conv|^xla:(dot|convolution)"),
    ("random numbers", r"Random|^xla:(rng|philox|threefry)"),
    ("variables", r"VariableOp$|^ResourceApply|^ResourceSparseApply"),
    (
        "data movement",
        r"Gather|Scatter|Transpose|Concat|Slice|^Pad|^Tile|^Pack$|^Unpack$|Split|BroadcastTo|"
        r"Reshape|^Identity|UnsortedSegment|^Squeeze$|^ExpandDims$|"
        r"^xla:(copy|transpose|gather|scatter|concatenate|slice|dynamic-slice|dynamic-update-slice|pad)",
    ),
    ("executor", re.escape(EXECUTOR)),
    ("element-wise", r""),
)
# wrappers: ExecutorState::Process around each op, ThunkExecutor::Execute around XLA's thunks
WRAPPERS = re.compile(
    r"^(ExecutorState::Process|ThunkExecutor::Execute)$|^(cond|while|conditional|call)(\.\d+)?$"
)
# waits: an op waiting for a compiled cluster whose work is counted on the pool's threads; not op
# time
WAITS = {"BlockUntilReady"}


def kind(op: str) -> str:
    return next(name for name, pattern in KINDS if re.search(pattern, op))


def trace_file(profile_dir: str) -> str:
    files = sorted(glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.xplane.pb")))
    if not files:
        raise FileNotFoundError(f"{profile_dir}: no profiler trace (plugins/profile/*/*.xplane.pb)")
    return files[-1]


def op_name(event_name: str) -> str:
    """'layer_0/dense/MatMul:_MklMatMul' -> '_MklMatMul'; 'multiply_add_fusion.28' ->
    'xla:multiply_add_fusion'; a wrapper -> EXECUTOR."""
    if WRAPPERS.match(event_name):
        return EXECUTOR
    if ":" in event_name and "::" not in event_name:
        return event_name.rsplit(":", 1)[1]
    return "xla:" + re.sub(r"\.\d+$", "", event_name)


# Markers the thread pool records inside an op's own work (a kernel's parallel loop): their time is
# the op's.
INSIDE_OPS = {"ParallelFor", "ThreadpoolListener::Record"}


def self_times(events):
    """[(name, self seconds)] from [(name, start ps, duration ps)] of one thread: nested events are
    those inside another's interval, and an INSIDE_OPS marker nested in an event is part of it."""
    out, stack = [], []  # stack: [name, end, self ps]
    for name, start, duration in sorted(events, key=lambda e: (e[1], -e[2])):
        while stack and start >= stack[-1][1]:
            done = stack.pop()
            out.append((done[0], done[2] * 1e-12))
        if stack and name in INSIDE_OPS:
            continue
        if stack:
            stack[-1][2] -= min(duration, stack[-1][1] - start)
        stack.append([name, start + duration, duration])
    out.extend((name, ps * 1e-12) for name, _, ps in reversed(stack))
    return out


def op_seconds(profile_dir: str) -> collections.Counter:
    """Counter {op type, "xla:<HLO name>" or EXECUTOR: seconds of self time} of the newest trace in
    profile_dir."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(trace_file(profile_dir), "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_"):
                continue
            totals += line_seconds(
                [
                    (plane.event_metadata[e.metadata_id].name, e.offset_ps, e.duration_ps)
                    for e in line.events
                ]
            )
    return totals


def line_seconds(events) -> collections.Counter:
    """Counter {op name: self seconds} of one thread's [(event name, start ps, duration ps)], waits
    left out."""
    totals = collections.Counter()
    for name, seconds in self_times(events):
        if name not in WAITS:
            totals[op_name(name)] += seconds
    return totals


def by_kind(seconds: collections.Counter) -> dict:
    """{kind: seconds}, every kind of KINDS present (0 where none ran)."""
    out = {name: 0.0 for name, _ in KINDS}
    for op, s in seconds.items():
        out[kind(op)] += s
    return out


def shares(seconds: dict) -> dict:
    total = sum(seconds.values()) or 1.0
    return {k: v / total for k, v in seconds.items()}


def per_sequence(kinds: dict, wall_seconds: float, sequences: int) -> dict:
    """{kind: wall milliseconds per sequence}: the wall time of the traced updates shared out by op
    time."""
    return {k: share * wall_seconds / sequences * 1e3 for k, share in shares(kinds).items()}


def comparison(ours: dict, peer: dict, goal: float = 1.3) -> dict:
    """From two per_sequence tables (bert_tf's and the peer's): what bert_tf's time outside its
    matmuls would have to be for `goal` x the peer's speed, its matmuls unchanged."""
    ours_total, peer_total = sum(ours.values()), sum(peer.values())
    target_total = peer_total / goal
    rest = ours_total - ours["matmul"]
    rest_needed = target_total - ours["matmul"]
    return {
        "ours_ms": ours_total,
        "peer_ms": peer_total,
        "ratio": peer_total / ours_total,
        "goal": goal,
        "ours_matmul_ms": ours["matmul"],
        "ours_rest_ms": rest,
        "rest_needed_ms": rest_needed,
        "rest_cut_needed": 1 - rest_needed / rest if rest else float("nan"),
        "matmul_only_ratio": peer_total / ours["matmul"] if ours["matmul"] else float("nan"),
    }


def report(name, profile_dir, wall_seconds, sequences, log=print, top=15) -> dict:
    """Logs the trace's top op types and returns its figures: op seconds by type and kind, and each
    kind's wall milliseconds per sequence."""
    ops = op_seconds(profile_dir)
    kinds = by_kind(ops)
    total = sum(ops.values()) or 1.0
    log(
        f"profiler trace of {name} in {profile_dir} ({wall_seconds:.1f} s, {sequences} sequences); "
        "op time by type:"
    )
    for op, s in ops.most_common(top):
        log(f"  {s / total:6.1%}  {op}")
    return {
        "rung": name,
        "profile_dir": profile_dir,
        "wall_seconds": wall_seconds,
        "sequences": sequences,
        "op_seconds": dict(ops),
        "kind_seconds": kinds,
        "kind_ms_per_sequence": per_sequence(kinds, wall_seconds, sequences),
    }


def print_comparison(ours: dict, peer: dict | None, log=print, goal: float = 1.3) -> dict | None:
    """The kinds side by side in wall ms per sequence (two report() results), and what bert_tf's
    time outside its matmuls would have to be for `goal` x the peer."""
    log(
        f"where the time goes, wall ms per sequence (op time shares of the traced updates): "
        f"{ours['rung']} | {peer['rung'] if peer else '-'}"
    )
    for name, _ in KINDS:
        theirs = f"{peer['kind_ms_per_sequence'][name]:8.1f}" if peer else "       -"
        log(f"  {name:<16} {ours['kind_ms_per_sequence'][name]:8.1f} {theirs}")
    if not peer:
        return None
    c = comparison(ours["kind_ms_per_sequence"], peer["kind_ms_per_sequence"], goal)
    log(
        f"  {'total':<16} {c['ours_ms']:8.1f} {c['peer_ms']:8.1f}   bert_tf / keras-hub = "
        f"{c['ratio']:.2f}x traced"
    )
    log(
        f"for {goal}x keras-hub with its matmuls unchanged, bert_tf's other time must fall from "
        f"{c['ours_rest_ms']:.1f} to {c['rest_needed_ms']:.1f} ms per sequence "
        f"({c['rest_cut_needed']:.0%} less); with no time outside its matmuls at all it would be "
        f"{c['matmul_only_ratio']:.2f}x"
    )
    return c


@dataclasses.dataclass(frozen=True)
class ProfileReport:
    """run/profile_report.py's flags: the speed ladder whose traces to read again."""

    ladder: str | None = knob(
        None, "ladder.json of a run/benchmark.py run made with --profile_dir.", required=True
    )
