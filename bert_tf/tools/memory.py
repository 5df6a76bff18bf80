"""Memory per device, estimated: the training state, the activations and the gradient exchange's own
state per rank (run/plan.py; docs/results.md "Exchange state per rank at 16 and 64 ranks"). Plain
Python, no TensorFlow."""

from __future__ import annotations

import math

from bert_tf import ConfigError
from bert_tf.parallel.exchange_ranking import exchange_choices
from bert_tf.parallel import local_plan
from bert_tf.parallel.comm import CommConfig, onebit_chunk, powersgd_plan
from bert_tf.tools.model_shapes import parameter_count


def memory_bytes(
    config,
    seq_length,
    micro_batch,
    precision="float32",
    recompute="none",
    accumulation=1,
    nsp=True,
    exchange=0,
) -> dict:
    """What one device holds while training, estimated: the state (fp32 weights, gradients, the two
    optimizer slots of LAMB/AdamW, and the accumulators when accumulating: 16-20 bytes per
    parameter) and the activations kept for the backward pass. Per transformer layer that is
    s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", their equation 1, no parallelism);
    float32 doubles it. recompute="layer" keeps each layer's input (s*b*h values) and one layer's
    activations at a time. The attention term 5*a*s^2*b grows with the square of the sequence: it is
    what sequence 512 costs. exchange: the gradient exchange's state on the device
    (exchange_state_bytes' "steady"), in the total. Workspace, the framework's own buffers and the
    MLM head's logits ([b, P, V]) are left out."""
    P = parameter_count(config, nsp)
    width = 2 if precision.startswith("mixed") else 4
    s, b, h, a = seq_length, micro_batch, config.hidden_size, config.num_attention_heads
    layer = s * b * h * (34 + 5 * a * s / h) * width / 2
    L = config.num_hidden_layers
    activations = L * s * b * h * width + layer if recompute == "layer" else L * layer
    state = P * (16 + (4 if accumulation > 1 else 0))
    return {
        "state": state,
        "activations": activations,
        "exchange": exchange,
        "total": state + activations + exchange,
    }


def _rounding_residual_bytes(comm: CommConfig, elements: int, ranks: int) -> int:
    """--outer_delta_bits 8 or 4: what rounding dropped, carried to the next exchange, of every
    chunk a rank sends and of the mean of the chunk it averages, for each fragment."""
    if comm.outer_delta_bits not in (8, 4):
        return 0
    chunk = local_plan.chunk_elements(-(-elements // comm.local_fragments), ranks)
    return 4 * comm.local_fragments * (ranks + 1) * chunk


def exchange_state_bytes(shapes, comm: CommConfig, ranks: int) -> dict:
    """Bytes of the gradient exchange's state on ONE of `ranks` ranks, float32 as the code allocates
    it (bert_tf/parallel/compression.py, exchange_state.py, local_sgd.py), for these shapes
    (gradient_tensor_shapes):
      own            this rank's error-feedback buffers, different on every rank (powersgd: an
                     n x m error per compressed matrix, comm.powersgd_plan; onebit: an error of
                     every element of each tensor padded to a multiple of ranks x lcm(ranks, 8)
                     and the averaging side's error of this rank's chunk of each,
                     comm.onebit_chunk, which shrinks as ranks grow)
      shared         state the same on every rank (powersgd: Q, m x r per compressed matrix;
                     DiLoCo: the anchor and the velocity, 2 x the weights, and with 8- or 4-bit
                     deltas each rank's rounding residuals, about 1 + 1/ranks x the weights, in
                     `own`, which a resume restarts at zero: never in a file); none and fp16
                     keep nothing
      steady         own + shared: on the device for the whole run
      save_host      at a save, the host copy of its own buffers each rank writes to its own
                     file; file: its size
      resume_host    at a resume, its own file read back into the host
      resume_device  and copied into the variables one buffer at a time: at most the largest on
                     the device at once
      checkpoint     the shared part, which rank 0 alone writes (Q in its own file, DiLoCo's in
                     the main checkpoint) and which a resume reads (Q: rank 0, then a broadcast;
                     DiLoCo's: every rank)
    and, for the record, the gather design the per-rank files replace (`capture`, `after_restore`):
      old_save_rank0  every rank's own buffers gathered into rank 0's device (ranks x own, kept
                      there as `saved`), then copied to its host for the checkpoint
      old_resume      that gathered copy on every rank after a resume, kept on its device
                      (ranks x own)
    The file's header and the counters are left out, and so are the tensors an exchange computes in
    an update."""
    if comm.exchange == "auto":
        raise ConfigError("--exchange=auto: resolve it first (planner.exchange_ranking)")
    buffers, shared, unsaved = [], 0, 0
    elements = sum(math.prod(s) for s in shapes)
    if comm.local_updates:
        shared = 2 * 4 * elements
        unsaved = _rounding_residual_bytes(comm, elements, ranks)
    elif comm.method == "powersgd":
        chosen = powersgd_plan(shapes, comm.powersgd_rank, comm.powersgd_min_compression_rate)
        buffers = [4 * math.prod(shapes[i]) for i in chosen]
        shared = 4 * sum(shapes[i][1] * comm.powersgd_rank for i in chosen)
    elif comm.method == "onebit":
        chunks = [onebit_chunk(math.prod(s), ranks) for s in shapes]  # per tensor, padded
        buffers = [4 * ranks * sum(chunks), 4 * sum(chunks)]
    own = sum(buffers)
    return {
        "ranks": ranks,
        "own": own + unsaved,
        "shared": shared,
        "steady": own + unsaved + shared,
        "save_host": own,
        "file": own,
        "resume_host": own,
        "resume_device": max(buffers, default=0),
        "checkpoint": shared,
        "old_save_rank0": ranks * own,
        "old_resume": ranks * own,
    }


def exchange_state_table(shapes, ranks_list, comm: CommConfig | None = None) -> list:
    """exchange_state_bytes of every exchange (auto's candidates and DiLoCo) at each rank count:
    rows with "method" added, for run/plan.py --exchange_memory and docs/results.md."""
    choices = exchange_choices(comm or CommConfig())
    choices["DiLoCo"] = CommConfig(local_updates=1)  # its state is the same at any --local_updates
    return [
        {"method": label, **exchange_state_bytes(shapes, c, ranks)}
        for ranks in ranks_list
        for label, c in choices.items()
    ]


def memory_warning(phase: str, memory: dict, device_memory_gb) -> str:
    """One line when `memory` (memory_bytes of `phase`, the exchange state in it) exceeds
    --device_memory_gb (GiB; 0: unknown, no check); empty when it fits."""
    if device_memory_gb <= 0 or memory["total"] <= device_memory_gb * 2**30:
        return ""
    return (
        f"warning: {phase} needs {memory['total'] / 2**30:.1f} GiB per device (the gradient "
        f"exchange's state {memory['exchange'] / 2**30:.1f} GiB of it), more than "
        f"--device_memory_gb={device_memory_gb:g}: a smaller --{phase}_micro_batch_size, "
        f"--recompute=layer, or another --exchange"
    )
