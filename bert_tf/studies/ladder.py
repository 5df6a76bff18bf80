"""The single-device speed ladder (run/benchmark.py): one BERT update timed with each lever, next to
the peer a Keras user would pick instead, and the fastest bert_tf configuration written as
run/pretrain.py flags. The rungs and the flags are bert_tf/studies/ladder_config.py, what each rung
reports is in run/benchmark.py's docstring; one rung is timed by bert_tf/studies/rung.py. The peer
is passed in as a function (run/benchmark.py's keras-hub model: the library never imports Keras)
called as peer(config, timing, precision, xla, micro_batch_size, accumulation=1, profile_dir="")
and returning what rung.timed_updates does (traced: the seconds).
"""

from __future__ import annotations

import dataclasses
import os
import resource

from bert_tf import ConfigError
from bert_tf.studies import machine_load
from bert_tf.studies.ladder_config import DTYPE_NAME, PRECISION, BenchmarkConfig, check_settings
from bert_tf.studies.rung import TRACED_UPDATES, run_rung


class Ladder:
    """The rows measured so far (ladder.json's "rungs"), each with its MFU against the measured
    peaks."""

    def __init__(self, config, s: BenchmarkConfig, peaks, flops_per_seq, peer, fusion):
        from bert_tf.studies import matmul_peaks

        self.config, self.s, self.timing = config, s, s.timing()
        self.peer, self.fusion = peer, fusion
        self.peaks, self.flops_per_seq = peaks, flops_per_seq
        self.hw_peak = matmul_peaks.hardware_peak(peaks)[0]
        self.rows = []

    def record(
        self,
        rung,
        precision,
        xla,
        accumulation,
        micro_batch,
        result,
        peer=False,
        diagnostic=False,
        tf32=False,
        fuse=False,
    ):
        seqs = micro_batch * accumulation / result["update_seconds"]
        achieved = seqs * self.flops_per_seq
        dtype_peak = max(self.peaks[DTYPE_NAME[precision]].values())
        seq = self.s.sequence.max_seq_length
        row = {
            "rung": rung,
            "precision": precision,
            "tf32": tf32,
            "xla": xla,
            "fuse": fuse,
            "accumulation_steps": accumulation,
            "batch_size": micro_batch,
            "peer": peer,
            "diagnostic": diagnostic,
            "sequences_per_second": seqs,
            "tokens_per_second": seqs * seq,
            "model_tflops": achieved / 1e12,
            "mfu": achieved / self.hw_peak,
            "mfu_same_dtype": achieved / dtype_peak,
            **result,
        }
        self.rows.append(row)
        print(
            f"{rung:<22} {seqs:8.2f} seq/s {seqs * seq:9.0f} tok/s {achieved / 1e12:7.3f} TFLOP/s  "
            f"MFU {achieved / self.hw_peak:6.1%} of hardware peak ({achieved / dtype_peak:6.1%} of "
            f"{DTYPE_NAME[precision]})  first update {result['first_update_seconds']:.1f} s"
            + (
                "  WARNING: timed beside other work "
                f"({machine_load.describe(result['machine_load'])})"
                if machine_load.busy(result.get("machine_load"))
                else ""
            ),
            flush=True,
        )
        return row

    def fastest(self, peer=False):
        return max(
            (r for r in self.rows if r["peer"] == peer and not r["diagnostic"]),
            key=lambda r: r["sequences_per_second"],
            default=None,
        )

    def climb(self, rungs):
        for rung in rungs:
            if rung == "keras-hub":
                self._peer_rungs()
            elif rung == "best-dropout":
                self._without_dropout()
            else:
                self._rung(rung)

    def _rung(self, rung):
        if rung == "best+accum":
            base = self.fastest()
            precision, xla, tf32, fuse = (
                (base["precision"], base["xla"], base["tf32"], base["fuse"])
                if base
                else ("float32", True, False, False)
            )
            accumulation = self.s.accumulation_steps
        else:
            short, _, opt = rung.partition("+")
            precision, xla, tf32, fuse, accumulation = (
                PRECISION[short],
                opt == "xla",
                short == "tf32",
                opt == "fuse",
                1,
            )
        micro = self.s.micro_batch_size
        self.record(
            rung,
            precision,
            xla,
            accumulation,
            micro,
            run_rung(
                self.config, self.timing, precision, xla, accumulation, micro, tf32=tf32, fuse=fuse
            ),
            tf32=tf32,
            fuse=fuse,
        )

    def _peer_rungs(self):
        micro = self.s.micro_batch_size
        for precision in ("float32", "mixed_bfloat16"):
            for xla in (False, True):
                name = f"keras-hub {precision.replace('mixed_', '')}{'+xla' if xla else ''}"
                if not xla and self.fusion:  # the peer with the same lever: auto-clustered too
                    name += "+autojit"
                self.record(
                    name,
                    precision,
                    xla,
                    1,
                    micro,
                    self.peer(self.config, self.timing, precision, xla, micro),
                    peer=True,
                )
        if self.s.accumulation_steps > 1:  # the peer's best with its own accumulation: best+accum
            base = self.fastest(peer=True)
            self.record(
                f"{base['rung']}+accum",
                base["precision"],
                base["xla"],
                self.s.accumulation_steps,
                micro,
                self.peer(
                    self.config,
                    self.timing,
                    base["precision"],
                    base["xla"],
                    micro,
                    self.s.accumulation_steps,
                ),
                peer=True,
            )

    def _without_dropout(self):
        base = self.fastest()
        quiet = dataclasses.replace(
            self.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        result = run_rung(
            quiet,
            self.timing,
            base["precision"],
            base["xla"],
            base["accumulation_steps"],
            base["batch_size"],
            tf32=base["tf32"],
            fuse=base["fuse"],
        )
        row = self.record(
            "best-dropout",
            base["precision"],
            base["xla"],
            base["accumulation_steps"],
            base["batch_size"],
            result,
            diagnostic=True,
            tf32=base["tf32"],
            fuse=base["fuse"],
        )
        print(
            f"dropout costs {1 - base['sequences_per_second'] / row['sequences_per_second']:.1%} "
            f"of the fastest rung's ({base['rung']}) time",
            flush=True,
        )

    def again(self, base, micro_batch, **kwargs):
        """The row `base`'s configuration timed again at `batch_size` (with run_rung's
        records/profile_dir)."""
        return run_rung(
            self.config,
            self.timing,
            base["precision"],
            base["xla"],
            base["accumulation_steps"],
            micro_batch,
            tf32=base["tf32"],
            fuse=base["fuse"],
            **kwargs,
        )

    def tune(self, micro_batches):
        """The fastest rung of each side again at each of the tuned micro-batches."""
        if not (micro_batches and self.fastest()):
            return
        base = self.fastest()
        for b in micro_batches:
            if b != base["batch_size"]:
                self.record(
                    f"{base['rung']} b{b}",
                    base["precision"],
                    base["xla"],
                    base["accumulation_steps"],
                    b,
                    self.again(base, b),
                    tf32=base["tf32"],
                    fuse=base["fuse"],
                )
        peer = self.fastest(peer=True)  # the peer's best at the same micro-batches
        for b in micro_batches if peer else ():
            if b != peer["batch_size"]:
                self.record(
                    f"{peer['rung']} b{b}",
                    peer["precision"],
                    peer["xla"],
                    peer["accumulation_steps"],
                    b,
                    self.peer(
                        self.config,
                        self.timing,
                        peer["precision"],
                        peer["xla"],
                        b,
                        peer["accumulation_steps"],
                    ),
                    peer=True,
                )

    def on_records(self, records, best):
        """The fastest rung on batches of real records: useful (non-padding) tokens/s next to
        rows/s."""
        for pattern, pack in records:
            if not best:
                break
            row = self.record(
                f"{best['rung']} on {'packed ' if pack else ''}records",
                best["precision"],
                best["xla"],
                best["accumulation_steps"],
                best["batch_size"],
                self.again(best, best["batch_size"], records=(pattern, pack)),
                diagnostic=True,
                tf32=best["tf32"],
                fuse=best["fuse"],
            )
            row.update(records=pattern, instances_per_row=pack)
            print(
                f"  {pattern}: {row['useful_tokens_per_second']:.0f} useful tokens/s "
                f"({1 - row['useful_tokens_per_second'] / row['tokens_per_second']:.1%} of the "
                f"rows' tokens are padding), {row['instances_per_second']:.2f} instances/s",
                flush=True,
            )

    def profile(self, profile_dir, best, peer):
        """Each side's fastest traced, the same number of updates, and where their time went."""
        from bert_tf.studies import op_profile

        profiles = {}
        if not (profile_dir and best):
            return profiles
        where = os.path.join(profile_dir, "bert_tf")
        seconds = self.again(best, best["batch_size"], profile_dir=where)
        sequences = TRACED_UPDATES * best["batch_size"] * best["accumulation_steps"]
        profiles["bert_tf"] = op_profile.report(best["rung"], where, seconds, sequences)
        if peer:
            where = os.path.join(profile_dir, "keras-hub")
            seconds = self.peer(
                self.config,
                self.timing,
                peer["precision"],
                peer["xla"],
                peer["batch_size"],
                peer["accumulation_steps"],
                profile_dir=where,
            )
            sequences = TRACED_UPDATES * peer["batch_size"] * peer["accumulation_steps"]
            profiles["keras-hub"] = op_profile.report(peer["rung"], where, seconds, sequences)
        profiles["comparison"] = op_profile.print_comparison(
            profiles["bert_tf"], profiles.get("keras-hub")
        )
        return profiles


def measure_peaks(s: BenchmarkConfig):
    """(peaks, every sample, what else ran during each): the matmul peaks MFU is taken against."""
    from bert_tf.studies import matmul_peaks

    if s.peak_repeats < 1:
        raise ConfigError(f"--peak_repeats must be >= 1, got {s.peak_repeats}")
    peak_samples, peak_loads = {}, {}
    peaks = matmul_peaks.matmul_peaks(
        n=s.peak_size,
        seconds=s.peak_seconds,
        log=lambda line: print(line, flush=True),
        repeats=s.peak_repeats,
        samples=peak_samples,
        loads=peak_loads,
    )
    hw_peak, hw_dtype, hw_way = matmul_peaks.hardware_peak(peaks)
    print(f"hardware peak: {hw_peak / 1e12:.3f} TFLOP/s ({hw_dtype}, {hw_way})", flush=True)
    return peaks, peak_samples, peak_loads


def print_machine_load(rows, peak_loads):
    """Which figures were timed beside other work (their neighbours' cores), or that none was."""
    busy_rungs = [r for r in rows if machine_load.busy(r.get("machine_load"))]
    busy_peaks = [
        s
        for ways in peak_loads.values()
        for seen in ways.values()
        for s in seen
        if machine_load.busy(s)
    ]
    if busy_rungs or busy_peaks:
        loads = [r["machine_load"] for r in busy_rungs] + busy_peaks
        print(
            f"timed beside other work: {len(busy_rungs)} rungs "
            f"({', '.join(r['rung'] for r in busy_rungs)}) and {len(busy_peaks)} peak "
            f"measurements, with up to {max(s['other_cores'] for s in loads):.2f} cores of other "
            f"processes and {max(s['steal_cores'] for s in loads):.2f} of steal: those figures "
            "measure the neighbours too"
        )
    else:
        print(
            "the machine was quiet during every timed measurement (other processes and steal "
            f"below {machine_load.BUSY_WARNING_CORES} cores)"
        )


def print_best(best, peer, peak_rss_gb):
    if best:
        print(
            f"best bert_tf: {best['rung']} at {best['sequences_per_second']:.2f} seq/s, MFU "
            f"{best['mfu']:.1%} of the hardware peak"
        )
    if best and peer:
        print(
            f"keras-hub best: {peer['rung']} at {peer['sequences_per_second']:.2f} seq/s; bert_tf "
            f"/ keras-hub = {best['sequences_per_second'] / peer['sequences_per_second']:.2f}x"
        )
    print(f"peak host memory {peak_rss_gb:.2f} GB")


def input_headroom(s: BenchmarkConfig, best):
    """With --train_files, what the input pipeline delivers alone next to the fastest rung's
    consumption."""
    if not s.train_files:
        return None
    from bert_tf.studies import input_headroom

    headroom = input_headroom.measure(
        s.train_files,
        s.vocab_file,
        s.micro_batch_size,
        s.sequence.max_seq_length,
        s.sequence.max_predictions_per_seq,
        s.input_seconds,
    )
    consumed = best["sequences_per_second"] if best else float("nan")
    for kind, rate in headroom.items():
        print(
            f"input pipeline alone, {kind} masking: {rate:.0f} seq/s per rank = "
            f"{rate / consumed:.1f}x the fastest rung's {consumed:.2f} seq/s "
            f"({'ok' if rate >= 10 * consumed else 'below'} the 10x goal)"
        )
    return headroom


def run(s: BenchmarkConfig, peer, fusion):
    """The whole ladder: every check first, then the peaks, the rungs, the tuned micro-batches, the
    records and the profiles; ladder.json, ladder.png and the flagfile and device figures asked
    for."""
    from bert_tf.parallel import device
    from bert_tf.model import modeling
    from bert_tf.tools import flops
    from bert_tf.studies import ladder_report

    micro_batches, records = check_settings(s)
    config = modeling.BertConfig.preset(s.model_preset, vocab_size=s.vocab_size)
    seq = s.sequence
    flops_per_seq = flops.training_flops_per_sequence(
        config, seq.max_seq_length, seq.max_predictions_per_seq
    )
    described = device.device_description()
    print(f"device: {described}")
    print(
        f"{s.model_preset}: {config.num_hidden_layers} layers, hidden {config.hidden_size}; seq "
        f"{seq.max_seq_length}, micro-batch {s.micro_batch_size}; {flops_per_seq / 1e9:.2f} GFLOP "
        f"per sequence (train)",
        flush=True,
    )
    peaks, peak_samples, peak_loads = measure_peaks(s)
    ladder = Ladder(config, s, peaks, flops_per_seq, peer, fusion)
    ladder.climb(s.rungs)
    ladder.tune(micro_batches)
    best, peer_best = ladder.fastest(), ladder.fastest(peer=True)
    ladder.on_records(records, best)
    profiles = ladder.profile(s.profile_dir, best, peer_best)
    print_machine_load(ladder.rows, peak_loads)
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print_best(best, peer_best, peak_rss_gb)
    headroom = input_headroom(s, best)
    report = ladder_report.report(
        s,
        ladder,
        peak_samples,
        peak_loads,
        described,
        micro_batches,
        headroom,
        profiles,
        peak_rss_gb,
    )
    ladder_report.save(report, s, best)
    return report
