"""--exchange=auto: the gradient exchange the planner predicts fastest to the same held-out
accuracy.

Time to a quality = updates x update factor x seconds per update. Seconds per update come from the
planner (bert_tf/tools/planner.py): compute at the run's measured per-rank speed
(--ladder_sequences_per_second), the exchange's bytes over the link, the compressed exchanges' own
computation. The link and that computation are measured at start-up inside the job (`resolve`): a
run picks for the network it actually has. Update factors are not assumed: they are what the
communication race measured (MEASURED_UPDATE_FACTORS). run/plan.py ranks the same choices for a
cluster it has not got (planner.exchange_ranking).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from bert_tf.parallel.exchange_ranking import (  # noqa: F401  (auto_exchange.update_factor: where it was)
    MEASURED_UPDATE_FACTORS,
    describe_ranking,
    exchange_choices,
    rank_exchanges,
    update_factor,
)


def compression_seconds(shapes, method, powersgd_rank=4, repeats=5) -> float:
    """The computation a compressed exchange adds to an update on this device, alone (no
    collective): seconds per exchange of random gradients of `shapes`, compiled as the trainer runs
    it (tf.function), the first call (tracing) dropped, the median of `repeats`."""
    import tensorflow as tf

    from bert_tf.parallel import compression

    variables = [
        tf.Variable(tf.random.stateless_normal(s, seed=[0, i])) for i, s in enumerate(shapes)
    ]
    exchange = compression.CompressedExchange(
        method, variables, powersgd_rank, seed=0, name=f"cost_{method}", alone=True
    )
    run = tf.function(exchange, jit_compile=False)
    grads = [tf.convert_to_tensor(v) for v in variables]
    run(grads)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run(grads)
        float(tf.reduce_sum(out[0]))  # wait for the result
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_link(elements=2**21, repeats=3) -> dict:
    """Every rank together, after hvd.init: the link as this job's allreduce sees it. Bandwidth from
    a float32 allreduce of `elements` (2(N-1)/N x bytes / seconds), per-message cost from a
    one-float allreduce; means over `repeats` rounds after a first (set-up) round. Rank 0's figures,
    on every rank (the choice must agree)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tensors = {"message": tf.ones([1]), "big": tf.ones([elements])}
    times = {key: [] for key in tensors}
    for _ in range(repeats + 1):
        for key, x in tensors.items():
            start = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum, name=f"auto_exchange_{key}").numpy()
            times[key].append(time.perf_counter() - start)
    n = hvd.size()
    seconds = statistics.mean(times["big"][1:])
    link = {
        "message_seconds": statistics.mean(times["message"][1:]),
        "effective_gbit": 2 * (n - 1) / n * elements * 4 * 8 / seconds / 1e9,
    }
    return hvd.broadcast_object(link, root_rank=0, name="auto_exchange_link")


def choose(
    comm, shapes, ranks, link, overheads, device_seq_s, micro_batch, accumulation, seq_length
):
    """(the chosen CommConfig, ranking rows) for `ranks` ranks on `link` (measure_link), each rank a
    node of a flat ring at the link's measured bandwidth and per-message cost (as the communication
    study models its emulated nodes); rows in seconds per sequence."""
    from bert_tf.tools import planner

    cluster = planner.probed_cluster(ranks, link)
    batch = micro_batch * accumulation * ranks
    phase = planner.Phase("run", seq_length, batch, batch, device_seq_s)
    comms = exchange_choices(comm)
    seconds_per_sequence = {
        m: 1
        / planner.plan_phase(shapes, phase, cluster, c, accumulation, overheads.get(m, 0.0))[
            "sequences_per_second"
        ]
        for m, c in comms.items()
    }
    rows = rank_exchanges(seconds_per_sequence, comms)
    return comms[rows[0]["method"]], rows


def resolve(comm, model_config, nsp, micro_batch, accumulation, seq_length, device_seq_s, say):
    """--exchange=auto in a running job (after hvd.init; every rank calls it and gets the same
    answer): measures the link and, on rank 0, each candidate's computation on the model's gradient
    shapes; says the ranking; returns the comm with the chosen exchange."""
    from bert_tf.parallel import distributed

    if distributed.size() == 1:
        say("gradients: --exchange=auto on one rank: nothing crosses a link, none")
        return dataclasses.replace(comm, exchange="none")
    from bert_tf.tools import model_shapes
    import horovod.tensorflow as hvd

    shapes = model_shapes.gradient_tensor_shapes(model_config, nsp=nsp)
    link = measure_link()
    overheads = {}
    if distributed.rank() == 0:
        overheads = {
            label: compression_seconds(shapes, c.method, c.powersgd_rank)
            for label, c in exchange_choices(comm).items()
            if c.compressed and update_factor(c)[0] is not None
        }
    overheads = hvd.broadcast_object(overheads, root_rank=0, name="auto_exchange_overheads")
    chosen, rows = choose(
        comm,
        shapes,
        distributed.size(),
        link,
        overheads,
        device_seq_s,
        micro_batch,
        accumulation,
        seq_length,
    )
    say(
        f"gradients: --exchange=auto chose {rows[0]['method']}: link {link['effective_gbit']:.3g} "
        f"Gbit/s, {link['message_seconds'] * 1e3:.2g} ms per message (measured now), "
        + ", ".join(f"{m} computation {s:.3g} s" for m, s in overheads.items())
        + f"; seconds per sequence to the same held-out accuracy: {describe_ranking(rows, 's')}"
    )
    return chosen
