"""Where a step's time goes (bert_tf/studies/op_profile.py) and what else the machine ran meanwhile
(bert_tf/studies/machine_load.py): hand-made traces and /proc files, and one real busy neighbour."""
import subprocess
import sys

import pytest

from bert_tf.studies import machine_load, op_profile


def test_self_time_takes_nested_events_out_of_their_wrappers():
    # A [0,100) holds B [10,30) and C [40,70), which holds D [45,50); E [200,210) stands alone
    events = [("A", 0, 100), ("B", 10, 20), ("C", 40, 30), ("D", 45, 5), ("E", 200, 10)]
    got = {name: round(s * 1e12) for name, s in op_profile.self_times(events)}
    assert got == {"A": 50, "B": 20, "C": 25, "D": 5, "E": 10}
    # a kernel's parallel-loop marker is the kernel's own time; alone on a line it counts as itself
    marked = [("Mul", 0, 100), ("ParallelFor", 10, 80), ("ThreadpoolListener::Record", 10, 1), ("ParallelFor", 300, 7)]
    assert {n: round(s * 1e12) for n, s in op_profile.self_times(marked)} == {"Mul": 100, "ParallelFor": 7}
    # an event sharing its wrapper's start is inside it, not beside it
    assert {n: round(s * 1e12) for n, s in op_profile.self_times([("W", 0, 10), ("op", 0, 4)])} == {"W": 6, "op": 4}


def test_a_thread_counts_op_self_times_by_name_and_leaves_waits_out():
    events = [("ExecutorState::Process", 0, 100), ("a/MatMul:_MklMatMul", 10, 60), ("BlockUntilReady", 100, 500),
              ("ExecutorState::Process", 600, 50), ("b/MatMul:_MklMatMul", 600, 20), ("multiply_add_fusion.3", 700, 5)]
    got = {n: round(s * 1e12) for n, s in op_profile.line_seconds(events).items()}
    assert got == {op_profile.EXECUTOR: 40 + 30, "_MklMatMul": 80, "xla:multiply_add_fusion": 5}


@pytest.mark.parametrize("event, name, kind", [
    ("bert/layer_0/attention/query/MatMul:_MklMatMul", "_MklMatMul", "matmul"),
    ("gradient_tape/einsum_1/Einsum:_MklEinsum", "_MklEinsum", "matmul"),
    ("dense/MatMul:_MklNativeFusedMatMul", "_MklNativeFusedMatMul", "matmul"),
    ("Cast_3:Cast", "Cast", "cast"),
    ("dropout/stateless_random_uniform:StatelessRandomUniformFullIntV2", "StatelessRandomUniformFullIntV2",
     "random numbers"),
    ("AssignAddVariableOp_12:AssignAddVariableOp", "AssignAddVariableOp", "variables"),
    ("GatherV2:GatherV2", "GatherV2", "data movement"),
    ("gradients/Softmax_grad/mul:Mul", "Mul", "element-wise"),
    ("ExecutorState::Process", op_profile.EXECUTOR, "executor"),
    ("ThunkExecutor::Execute", op_profile.EXECUTOR, "executor"),
    ("cond.143", op_profile.EXECUTOR, "executor"),
    ("multiply_add_fusion.28", "xla:multiply_add_fusion", "element-wise"),
    ("convert_fusion.2", "xla:convert_fusion", "cast"),
    ("dot.12", "xla:dot", "matmul"),
    ("MatMul.108", "xla:MatMul", "matmul"),
    ("copy.186", "xla:copy", "data movement"),
])
def test_each_event_is_named_and_classified(event, name, kind):
    assert op_profile.op_name(event) == name and op_profile.kind(name) == kind


def test_per_sequence_spreads_the_wall_time_by_share_and_the_comparison_says_what_1_3x_needs():
    kinds = {"matmul": 3.0, "element-wise": 1.0}           # op seconds: 75% / 25%
    ours = op_profile.per_sequence(kinds, wall_seconds=2.0, sequences=10)  # 200 ms per sequence
    assert ours == {"matmul": 150.0, "element-wise": 50.0}
    peer = {"matmul": 150.0, "element-wise": 90.0}         # 240 ms: ours is 1.2x
    c = op_profile.comparison(ours, peer, goal=1.3)
    assert c["ratio"] == pytest.approx(1.2)
    assert c["rest_needed_ms"] == pytest.approx(240 / 1.3 - 150)        # 34.6 ms of the 50 outside the matmuls
    assert c["rest_cut_needed"] == pytest.approx(1 - (240 / 1.3 - 150) / 50)
    assert c["matmul_only_ratio"] == pytest.approx(240 / 150)


def write_proc(tmp_path, busy, steal, utime, stime, comm="python (x) y"):
    stat, own = tmp_path / "stat", tmp_path / "self_stat"
    stat.write_text(f"cpu  {busy - 30} 10 20 5000 7 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 20      # fields 3.. of /proc/<pid>/stat
    own.write_text(f"4242 ({comm}) {' '.join(fields)}\n")
    return str(stat), str(own)


def test_the_load_is_the_machines_busy_time_less_this_processs_own(tmp_path):
    a = machine_load.read(*write_proc(tmp_path, busy=1000, steal=50, utime=300, stime=20))
    assert (a.busy_ticks, a.steal_ticks, a.own_ticks) == (1000, 50, 320)
    b = machine_load.read(*write_proc(tmp_path, busy=1500, steal=70, utime=500, stime=40))
    b = machine_load.Reading(a.wall + 2.0, b.busy_ticks, b.steal_ticks, b.own_ticks)
    got = machine_load.between(a, b, ticks_per_second=100)
    # 500 busy ticks, 220 of them this process's: 280 ticks = 2.8 s over 2 s; steal 20 ticks = 0.2 s
    assert got == {"seconds": 2.0, "other_cores": pytest.approx(1.4), "steal_cores": pytest.approx(0.1)}
    assert machine_load.busy(got) and not machine_load.busy({"other_cores": 0.1, "steal_cores": 0.05})
    assert "other processes 1.40 cores, steal 0.10 cores" == machine_load.describe(got)
    assert machine_load.read(str(tmp_path / "none"), str(tmp_path / "none")) is None
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    with pytest.raises(ValueError, match="stat: first line is not the all-cores 'cpu' line"):
        machine_load.read(str(tmp_path / "stat"), str(tmp_path / "self_stat"))


@pytest.mark.slow
def test_a_busy_neighbour_is_seen_and_this_processs_own_work_is_not():
    def spin(seconds):
        import time
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    with machine_load.Meter() as own:
        spin(1.5)
    with machine_load.Meter() as neighbour:
        subprocess.run([sys.executable, "-c", "import time\nend = time.monotonic() + 1.5\n"
                        "while time.monotonic() < end: pass"], check=True)
    assert own.result["other_cores"] < 0.5, own.result          # its own spinning is not "other"
    assert 0.7 < neighbour.result["other_cores"] < 1.3, neighbour.result
