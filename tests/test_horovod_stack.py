"""The installed stack: Horovod + TensorFlow + MPI, under mpirun and horovodrun (one launch each)."""
import numpy as np
import pytest

from conftest import WORKERS, horovodrun, mpirun, read_rank_results

pytestmark = pytest.mark.cluster      # starts MPI/horovodrun jobs


LAUNCHERS = {
    "mpirun": mpirun,
    "horovodrun": horovodrun,
    "horovodrun_gloo": lambda *a, **k: horovodrun(*a, gloo=True, **k),
}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    timeline = out / "timeline.json"
    LAUNCHERS[request.param](2, [WORKERS / "horovod_basics.py", out], env={"HOROVOD_TIMELINE": str(timeline)})
    return read_rank_results(out, 2), timeline


def test_mpi4py_and_horovod_agree_on_rank_and_size(run, request):
    results, _ = run
    assert sorted(r["hvd_rank"] for r in results) == [0, 1]
    for r in results:
        assert r["hvd_size"] == 2
        if "gloo" in request.node.callspec.id:
            # under --gloo no MPI world exists: every process is an MPI singleton
            assert (r["mpi_rank"], r["mpi_size"]) == (0, 1)
        else:
            assert (r["hvd_rank"], r["hvd_size"]) == (r["mpi_rank"], r["mpi_size"])


def test_allreduce_average_is_exact(run):
    results, _ = run
    base = np.array(results[0]["base"], np.float32)
    expected = (base * 1 + base * 2) / np.float32(2)
    for r in results:
        np.testing.assert_allclose(r["avg"], expected, rtol=1e-6)


def test_fp16_compressed_allreduce_within_fp16_rounding_and_sent_as_float16(run):
    from bert_tf.parallel.distributed import timeline_allreduce_dtypes
    results, timeline = run
    base = np.array(results[0]["base"], np.float32)
    # each rank's tensor is rounded to fp16, summed/averaged in fp16, then cast back
    expected = (base * 1 + base * 2) / 2
    for r in results:
        np.testing.assert_allclose(r["avg_fp16"], expected, rtol=2e-3)
        assert r["avg_fp16"] != r["avg"], "fp16 compression left no trace of rounding"
        assert r["avg_fp16_dtype"] == "float32"  # decompressed back to the caller's dtype
    dtypes = timeline_allreduce_dtypes(timeline)
    # eager calls share one timeline row; it must have seen both float32 and float16 payloads
    assert dtypes.get("HorovodAllreduce") == ["float16", "float32"], dtypes


def test_broadcast_variables_copies_rank0(run):
    results, _ = run
    assert results[1]["broadcast"] == results[0]["broadcast"]
    assert results[0]["broadcast"][0] == [[10.0, 10.0]] * 3


def test_distributed_gradient_tape_equals_full_batch_gradient(run):
    results, _ = run
    for r in results:
        for dist, full in zip(r["grad_distributed"], r["grad_full_batch"]):
            np.testing.assert_allclose(dist, full, rtol=1e-5, atol=1e-7)
