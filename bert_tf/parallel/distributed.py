"""Horovod glue: start-up, thread and device pinning, broadcast, gradient allreduce, cross-rank
metrics.

The rest of bert_tf talks to Horovod only through this module. Collectives run in plain
tf.functions (never XLA-compiled): on a CPU build Horovod's ops have no XLA kernels.
"""

from __future__ import annotations

import os
import queue

import tensorflow as tf

from bert_tf import ConfigError
from bert_tf.parallel import watchdog
from bert_tf.parallel.comm import CommConfig, warmup_updates

# CommConfig field (and flag) -> Horovod environment variable. Values set by horovodrun (or the
# user's environment) win over flags; `configure` reports which value is in force.
_KNOBS = {
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda mb: str(int(mb * 1024 * 1024))),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", lambda ms: str(ms)),
}


def configure(comm: CommConfig, timeline=None, autotune=False, elastic=False):
    """Set Horovod's environment before `hvd.init()`; returns {variable: (value, source)}. elastic:
    Horovod's response cache off (HOROVOD_CACHE_CAPACITY=0) unless the environment sets it: with it,
    a rank that joins a running elastic job aborted in a Gloo op of another size than its peers'
    ("op.preamble.length <= op.nbytes"), every time with a 10 ms cycle time
    (tests/test_elastic.py::test_the_spot_cluster_run_whole, measured with Horovod 0.28.1); without
    it every update negotiates its tensors afresh."""
    effective = {}
    if elastic:
        os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
    for flag, (var, to_env) in _KNOBS.items():
        value = getattr(comm, flag)
        if var in os.environ:
            effective[var] = (os.environ[var], "environment")
        elif value is not None:
            os.environ[var] = to_env(value)
            effective[var] = (os.environ[var], f"--{flag}")
        else:
            effective[var] = ("horovod default", "default")
    for var, value in watchdog.horovod_settings(comm.collective_timeout_minutes).items():
        os.environ.setdefault(
            var, value
        )  # Horovod's stall warning within half --collective_timeout_minutes
    if comm.local_group == "node":
        os.environ.setdefault(
            "HOROVOD_DYNAMIC_PROCESS_SETS", "1"
        )  # node_process_set adds them after init
    if timeline:
        os.environ.setdefault("HOROVOD_TIMELINE", timeline)
    if autotune:
        os.environ.setdefault("HOROVOD_AUTOTUNE", "1")
    return effective


def cpu_threads(local_size, intra_op_threads=0, inter_op_threads=0, cores=None):
    """(intra-op, inter-op) thread-pool sizes for one of `local_size` ranks on a CPU node; 0 picks
    the default: the node's cores shared out between its ranks, and 2 inter-op threads (measured on
    2 cores, docs/results.md "Threads per rank")."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for name, value in (
        ("intra_op_threads", intra_op_threads),
        ("inter_op_threads", inter_op_threads),
    ):
        if value < 0:
            raise ConfigError(f"--{name} must be >= 0 (0: the default), got {value}")
    return intra_op_threads or max(1, cores // local_size), inter_op_threads or 2


def init(intra_op_threads=0, inter_op_threads=0):
    """hvd.init(), then one GPU per local rank, or CPU thread pools per rank (cpu_threads)."""
    import horovod.tensorflow as hvd

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[
            assign_gpu(
                hvd.local_rank(),
                hvd.local_size(),
                len(gpus),
                os.environ.get("CUDA_VISIBLE_DEVICES"),
            )
        ]
        tf.config.experimental.set_memory_growth(
            gpu, True
        )  # TensorFlow would take all memory at start
        tf.config.set_visible_devices(gpu, "GPU")
    else:
        intra, inter = cpu_threads(hvd.local_size(), intra_op_threads, inter_op_threads)
        try:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
            tf.config.threading.set_inter_op_parallelism_threads(inter)
        except RuntimeError:
            pass  # TensorFlow already ran ops in this process (library use): keep its thread pools
    problem = gpu_install_problem(len(gpus), bool(hvd.nccl_built()), nvidia_gpus_present())
    if problem and hvd.rank() == 0:
        print(f"WARNING: {problem}", flush=True)
    return hvd


def assign_gpu(local_rank, local_size, n_gpus, cuda_visible_devices=None) -> int:
    """The GPU (index among those this process sees) for a rank: its own when the node has one per
    rank; the only one when the launcher gave each rank its own (CUDA_VISIBLE_DEVICES, as Slurm's
    --gpus-per-task does). Two ranks on one GPU would halve its memory and serialise their kernels:
    an error, not a slowdown found later."""
    if n_gpus >= local_size:
        return local_rank
    if n_gpus == 1 and cuda_visible_devices:
        return 0
    from bert_tf import ConfigError

    raise ConfigError(
        f"{local_size} ranks on this node but {n_gpus} GPU(s) visible to each "
        f"(CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}): ranks would share a GPU. Start one rank "
        f"per GPU (horovodrun -np <GPUs> -H host:<GPUs per node>), or give each rank its own GPU "
        f"(CUDA_VISIBLE_DEVICES, Slurm --gpus-per-task=1)"
    )


def nvidia_gpus_present() -> bool:
    """An NVIDIA driver with at least one GPU on this node, whatever TensorFlow can use."""
    gpus = "/proc/driver/nvidia/gpus"
    return os.path.exists("/dev/nvidia0") or (os.path.isdir(gpus) and bool(os.listdir(gpus)))


def gpu_install_problem(tf_gpus, nccl_built, node_has_gpus) -> str:
    """What is wrong with this node's install for its hardware, or "" (a CPU node, or a GPU node
    with TensorFlow's CUDA wheels and Horovod with NCCL)."""
    if node_has_gpus and not tf_gpus:
        return (
            "this node has NVIDIA GPUs but TensorFlow sees none, so training runs on the CPU: the "
            "install lacks TensorFlow's CUDA wheels, or the driver is older than CUDA 12.5 needs. "
            "Run BERT_TF_GPU=1 bash scripts/setup.sh (it checks the driver and installs the GPU "
            "build)"
        )
    if tf_gpus and not nccl_built:
        return (
            "TensorFlow sees GPUs but Horovod was built without NCCL, so gradients cross ranks "
            "through host memory: run BERT_TF_GPU=1 bash scripts/setup.sh for the NCCL build"
        )
    return ""


def describe(hvd) -> str:
    """One line on what this process runs with: Horovod's controllers and operations, TensorFlow's
    CUDA build, and the devices it sees."""
    backends = [
        name
        for name, built in (
            ("MPI", hvd.mpi_built()),
            ("Gloo", hvd.gloo_built()),
            ("NCCL", hvd.nccl_built()),
        )
        if built
    ]
    info = tf.sysconfig.get_build_info()
    cuda = f"CUDA {info['cuda_version']}" if info.get("is_cuda_build") else "no CUDA"
    import horovod

    gpus = tf.config.get_visible_devices("GPU")
    threads = (
        f" ({tf.config.threading.get_intra_op_parallelism_threads()} intra-op, "
        f"{tf.config.threading.get_inter_op_parallelism_threads()} inter-op threads)"
    )
    return (
        f"Horovod {horovod.__version__} ({', '.join(backends)}), TensorFlow {tf.__version__} "
        f"({cuda}); device: {'GPU ' + gpus[0].name if gpus else 'CPU' + threads}"
    )


def rank():
    import horovod.tensorflow as hvd

    return hvd.rank()


def gloo_built() -> bool:
    import horovod.tensorflow as hvd

    return hvd.gloo_built()


def size():
    import horovod.tensorflow as hvd

    return hvd.size()


def local_size():
    """Ranks on this node."""
    import horovod.tensorflow as hvd

    return hvd.local_size()


def broadcast_variables(variables, root_rank=0):
    """Make every rank's variables equal root_rank's (call once all variables exist)."""
    import horovod.tensorflow as hvd

    if hvd.size() > 1:
        with watchdog.watching("the broadcast of the variables"):
            hvd.broadcast_variables(variables, root_rank=root_rank)


def node_process_set():
    """This rank's node as a Horovod process set, None with one rank per node (--local_group=node;
    every rank calls it once, after init with HOROVOD_DYNAMIC_PROCESS_SETS). A node is what
    Horovod's local communicator holds: its ranks share a cross rank (the node's index among the
    nodes, for every local rank alike)."""
    import horovod.tensorflow as hvd

    if not hvd.is_homogeneous():
        raise ConfigError("--local_group=node needs the same number of ranks on every node")
    node_of = hvd.allgather_object(hvd.cross_rank(), name="node_of_rank")
    groups = {}
    for r, node in enumerate(node_of):
        groups.setdefault(node, []).append(r)
    if len(groups) == 1:
        return hvd.global_process_set
    if len(groups) == hvd.size():
        return None  # one rank per node: each rank is its own worker
    sets = {
        node: hvd.add_process_set(ranks) for node, ranks in sorted(groups.items())
    }  # the same order everywhere
    return sets[node_of[hvd.rank()]]


def make_gradient_allreduce(fp16_compression=False, name="grad", weight=1.0, process_set=None):
    """The gradients averaged over ranks by Horovod, sent as float16 when asked
    (exchange.Allreduce). weight: this rank's gradients are multiplied by it first (elastic mode's
    uneven shares). process_set: average over these ranks only (node_process_set), not all."""
    from bert_tf.parallel.exchange import Allreduce

    return Allreduce(fp16_compression, name=name, weight=weight, process_set=process_set)


def make_gradient_exchange(comm: CommConfig, variables, seed=0, name="grad", total_steps=0):
    """The update's gradient exchange (exchange.GradientExchange) for --exchange (comm.method): a
    Horovod allreduce (none, fp16: exchange.Allreduce) or a compressed exchange with error feedback
    (powersgd, onebit: compression.CompressedExchange). variables: the trainer's, in its order;
    total_steps: the run's, for a warmup left unset (comm.warmup_updates; onebit's is the trainer's
    optimizer's, set when the trainer attaches it)."""
    if comm.method == "auto":
        raise ConfigError(
            "--exchange=auto is chosen by run/pretrain.py at start-up "
            "(bert_tf/parallel/auto_exchange.py); here, give the method"
        )
    if not comm.compressed:
        return make_gradient_allreduce(comm.method == "fp16", name=name)
    from bert_tf.parallel import compression

    if comm.exchange == "onebit":
        import horovod.tensorflow as hvd

        if hvd.size() > 1 and not (hvd.mpi_enabled() or hvd.gloo_enabled()):
            raise ConfigError(
                "--exchange=onebit needs Horovod's alltoall over MPI or Gloo, and this job runs "
                "neither"
            )
    return compression.CompressedExchange(
        comm.exchange,
        variables,
        comm.powersgd_rank,
        warmup_updates(comm, total_steps),
        seed,
        size(),
        name,
        min_rate=comm.powersgd_min_compression_rate,
        onebit_signs=comm.onebit_signs,
        onebit_live=comm.onebit_live,
        onebit_variance_kappa=comm.onebit_variance_kappa,
    )


def sum_across_ranks(values: dict) -> dict:
    """Sums a dict of float scalars over ranks (exact counts for accuracies; callers divide)."""
    import horovod.tensorflow as hvd

    keys = sorted(values)
    stacked = tf.stack([tf.cast(values[k], tf.float64) for k in keys])
    if hvd.size() > 1:
        with watchdog.watching("the metrics' allreduce"):
            stacked = hvd.allreduce(stacked, op=hvd.Sum, name="metrics_sum")
    return dict(zip(keys, stacked.numpy().tolist()))


def allreduce_sum(tensors, name):
    """Each tensor summed over ranks, one allreduce each (named name_i: every rank must use the
    same names in the same order); eager or inside a tf.function."""
    import horovod.tensorflow as hvd

    return [hvd.allreduce(t, op=hvd.Sum, name=f"{name}_{i}") for i, t in enumerate(tensors)]


def sum_array_across_ranks(array, name):
    """Element-wise sum of a numpy array of the same shape on every rank."""
    if size() == 1:
        return array
    return allreduce_sum([tf.constant(array)], name)[0].numpy()


def gather_bytes(data: bytes) -> list:
    """Every rank's `data`, in rank order, on every rank (input positions for the checkpoint)."""
    import horovod.tensorflow as hvd

    if hvd.size() == 1:
        return [data]
    with watchdog.watching("the allgather of the input positions"):
        return hvd.allgather_object(data, name="gather_bytes")


def broadcast_object(value, root_rank=0):
    """rank 0's `value` (any picklable object) on every rank."""
    import horovod.tensorflow as hvd

    if hvd.size() == 1:
        return value
    with watchdog.watching("the broadcast of an object"):
        return hvd.broadcast_object(value, root_rank=root_rank)


def any_rank(flag: bool) -> bool:
    """True on every rank when it is True on one (a signal that reached one rank stops all)."""
    import horovod.tensorflow as hvd

    if hvd.size() == 1:
        return flag
    with watchdog.watching("the stop-flag allreduce"):
        return bool(hvd.allreduce(tf.constant(int(flag)), op=hvd.Max, name="stop_flag").numpy())


def barrier(what: str, minutes: float | None = None):
    """Every rank waits here until all have reached it (a one-int allreduce), watched as `what`
    under `minutes` (0: no limit; None: --collective_timeout_minutes): the other ranks' wait for
    rank 0's solo work (a save, a restore) has its own limit and says what it waits for."""
    import horovod.tensorflow as hvd

    if hvd.size() == 1:
        return
    with watchdog.watching(what, minutes):
        hvd.allreduce(tf.constant(0), op=hvd.Sum, name="barrier").numpy()


class ElasticWorld:
    """What elastic mode (bert_tf/train/elastic.py) needs of Horovod's elastic runtime, in one
    place, so the loop can be driven by a stand-in in one process (tests/test_elastic.py). `Failure`
    is what a collective with a lost peer raises (Horovod's words; TensorFlow op errors naming
    Horovod or Gloo count too: elastic.is_collective_failure); `HostsUpdated` is raised by
    `check_host_updates` on every rank at the same commit when horovodrun's discovery added or
    removed a host (its `skip_sync`: removed only, nobody new to sync)."""

    def __init__(self):
        import horovod.tensorflow as hvd
        from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
        from horovod.common.elastic import notification_manager
        from horovod.runner.elastic.worker import HostUpdateResult

        self._hvd, self._notifications, self._results = hvd, notification_manager, HostUpdateResult
        self.Failure, self.HostsUpdated = HorovodInternalError, HostsUpdatedInterrupt
        self._messages, self._last_timestamp = queue.Queue(), 0

    rank = staticmethod(rank)
    size = staticmethod(size)

    def gradient_allreduce(self, fp16_compression, weight):
        return make_gradient_allreduce(fp16_compression, weight=weight)

    def broadcast_variables(self, variables):
        broadcast_variables(variables, root_rank=0)

    def broadcast_object(self, value):
        return self._hvd.broadcast_object(value, root_rank=0)

    def gather_bytes(self, data: bytes) -> list:
        return gather_bytes(data)

    def listen(self):
        """Start taking horovodrun's host notifications (once, before the first sync)."""
        self._notifications.init()
        self._notifications.register_listener(self)

    def on_hosts_updated(self, timestamp, update):  # called by Horovod's notification thread
        self._messages.put((timestamp, update))

    def check_host_updates(self):
        """A collective: raises HostsUpdated on every rank when a notification newer than the last
        one reached rank 0 (its view is broadcast, so all ranks raise at the same commit)."""
        newest, update = self._last_timestamp, self._results.no_update
        while not self._messages.empty():
            timestamp, result = self._messages.get()
            if timestamp > newest:
                newest, update = timestamp, update | result
        previous, self._last_timestamp, update = self.broadcast_object(
            (self._last_timestamp, newest, update)
        )
        if self._last_timestamp > previous:
            raise self.HostsUpdated(update == self._results.removed)

    def reset(self):
        """Re-form the ranks after a failure or a host change (blocks until horovodrun has them)."""
        self._hvd.shutdown()
        self._hvd.init()
        self._messages = queue.Queue()


def timeline_allreduce_dtypes(path) -> dict:
    """{tensor name: sorted dtypes} for every allreduce in a Horovod timeline file.

    The timeline is what the collective itself saw: Horovod writes the dtype of each
    allreduced tensor when its ALLREDUCE activity ends. The file stays open (no closing
    bracket) while the job runs, so it is parsed leniently.
    """
    import json

    with open(path) as f:
        text = f.read().strip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    events = json.loads(text)
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})
    }
    allreduce_rows = {
        e["pid"] for e in events if e.get("ph") == "B" and e.get("name") == "ALLREDUCE"
    }
    found = {}
    for e in events:
        dtype = e.get("args", {}).get("dtype") if e.get("ph") == "E" else None
        if dtype and e["pid"] in allreduce_rows:
            found.setdefault(names.get(e["pid"], str(e["pid"])), set()).add(dtype)
    return {k: sorted(v) for k, v in found.items()}
