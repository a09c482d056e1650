"""Names of torch's c10d bindings that c10d's extension module does not define, added in Python:
DDP's Logger and DDPLoggingData, a Reducer subclass with the setters torch's DDP wrapper
calls, the backend creators' options, module-level helpers, and the GPU-only
classes torch exposes even in CPU builds (which raise, naming what is missing). Everything
else torch's bindings have is bound in C++ (src/c10d/python/).

Per-object state the pybind classes have no slot for lives in weak-keyed tables, so it goes
away with the object.
"""

import hashlib
import weakref
from datetime import timedelta
from typing import Any, Dict, List, Optional

import numpy as np

from . import _C

_DEFAULT_NO_TIMEOUT = timedelta(0)
_DEFAULT_PG_NCCL_TIMEOUT = timedelta(minutes=10)  # torch's NCCL default, for code that reads it


def _no_gpu(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what} needs CUDA GPUs (NCCL/symmetric memory), which c10d does not "
        f"support: it runs on CPUs only (backends gloo, shm, mpi)"
    )


class _DistributedBackendOptions:
    """What a backend creator registered with ``extended_api=True`` receives."""

    __slots__ = (
        "store",
        "group_rank",
        "group_size",
        "timeout",
        "group_id",
        "global_ranks_in_group",
    )

    def __init__(self):
        self.store = None
        self.group_rank = 0
        self.group_size = 0
        self.timeout = timedelta(0)
        self.group_id = ""
        self.global_ranks_in_group: List[int] = []


# --------------------------------------------------------------------------------------------
# DDP logging and the Reducer's setters


class DDPLoggingData:
    """DDP's logging data: string fields in strs_map, integer fields in ints_map."""

    __slots__ = ("strs_map", "ints_map")

    def __init__(self):
        self.strs_map: Dict[str, str] = {}
        self.ints_map: Dict[str, int] = {}


class Logger:
    """Collects DDP's logging data for a Reducer (what ``_get_ddp_logging_data`` returns)."""

    def __init__(self, reducer):
        self._reducer = weakref.ref(reducer)
        self._data = DDPLoggingData()
        self._iterations = 0

    def _set(self, name: str, value) -> None:
        if isinstance(value, bool) or isinstance(value, int):
            self._data.ints_map[name] = int(value)
        else:
            self._data.strs_map[name] = str(value)

    def set_construction_data_and_log(
        self,
        module_name: str,
        device_ids: List[int],
        output_device: int,
        broadcast_buffers: bool,
        has_sync_bn: bool,
        static_graph: bool,
    ) -> None:
        self._set("module_name", module_name)
        self._set("device_ids", ", ".join(map(str, device_ids)))
        self._set("output_device", output_device)
        self._set("broadcast_buffers", broadcast_buffers)
        self._set("has_sync_bn", has_sync_bn)
        self._set("static_graph", static_graph)
        reducer = self._reducer()
        if reducer is not None:
            self._set("bucket_sizes", ", ".join(str(len(b)) for b in reducer.bucket_indices))

    def set_runtime_stats_and_log(self) -> None:
        self._iterations += 1
        self._set("iteration", self._iterations)

    def set_error_and_log(self, error: str) -> None:
        self._set("has_error", 1)
        self._set("error", error)

    def _get_ddp_logging_data(self) -> Dict[str, Any]:
        return {**self._data.strs_map, **self._data.ints_map}

    def _set_comm_hook_name(self, comm_hook: str) -> None:
        self._set("comm_hook", comm_hook)

    def _set_uneven_input_join(self) -> None:
        self._set("join_uneven_inputs", 1)

    def _set_static_graph(self) -> None:
        self._set("static_graph", 1)


class Reducer(_C.Reducer):
    """The C++ Reducer (see ``c10d._C.Reducer``) with what torch's DDP wrapper also calls on
    it: the setters, whose arguments are recorded (the C++ Reducer does not read them), and
    prepare_for_forward, which counts iterations for the logger's runtime statistics."""

    def _recorded(self) -> Dict[str, Any]:
        return self.__dict__.setdefault("_recorded_calls", {})

    def prepare_for_forward(self) -> None:
        recorded = self._recorded()
        recorded["forwards"] = recorded.get("forwards", 0) + 1
        logger = recorded.get("logger")
        rate = recorded.get("sample_rate", 0)
        if logger is not None and rate and recorded["forwards"] % rate == 0:
            logger.set_runtime_stats_and_log()

    def set_logger(self, logger) -> None:
        self._recorded()["logger"] = logger

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        self._recorded()["sample_rate"] = sample_rate

    def _set_sparse_metadata(self, global_unique_ids) -> None:
        self._recorded()["sparse_metadata"] = global_unique_ids

    def _set_mixed_precision_param_dtype(self, param_dtype) -> None:
        self._recorded()["param_dtype"] = param_dtype

    def _delay_all_reduce(self) -> None:
        self._recorded()["delay_all_reduce"] = True

    def _set_optimizer_in_backward(self) -> None:
        self._recorded()["optimizer_in_backward"] = True

    def _install_post_backward_futures(self, futures) -> None:
        self._recorded()["post_backward_futures"] = futures

    def _set_forward_pass_work_handle(self, work, use_static_world_size) -> None:
        self._recorded()["forward_pass_work"] = (work, use_static_world_size)

    def _remove_autograd_hooks(self) -> None:
        self._recorded()["autograd_hooks_removed"] = True


# --------------------------------------------------------------------------------------------
# Module-level functions of the bindings


_thread_isolation = False


def _set_thread_isolation_mode(enable: bool) -> None:
    """Recorded only: c10d's groups are not tied to the thread that made them."""
    global _thread_isolation
    _thread_isolation = bool(enable)


_registered_works: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _register_work(tensor, work) -> None:
    """Ties `work` to `tensor`: functional collectives' wait_tensor(tensor) waits for it."""
    try:
        _registered_works[tensor] = work
    except TypeError:  # numpy arrays take no weak references: nothing to wait on later
        work.wait()


def _wait_registered_work(tensor) -> None:
    work = _registered_works.pop(tensor, None) if _registered_works else None
    if work is not None:
        work.wait()


def _hash_tensors(tensors) -> int:
    """A hash of the tensors' bytes (equal contents, equal hashes), for checking that ranks
    hold the same data."""
    digest = hashlib.blake2b(digest_size=8)
    for t in tensors:
        digest.update(np.ascontiguousarray(_C._as_numpy(t)).tobytes())
    return int.from_bytes(digest.digest(), "little", signed=True)


_set_global_rank = _C._set_global_rank


# --------------------------------------------------------------------------------------------
# GPU-only names torch exposes in CPU builds too


class _SymmetricMemory:
    """torch's CUDA symmetric memory: present as in torch's CPU builds; using it raises."""

    @staticmethod
    def has_multicast_support(device_type=None, device_idx: int = 0) -> bool:
        return False

    @staticmethod
    def _unavailable(*args, **kwargs):
        raise _no_gpu("symmetric memory")

    set_group_info = empty_strided_p2p = rendezvous = get_symmetric_memory = _unavailable
    set_backend = get_backend = stream_write_value32 = memset32 = _unavailable
    get_buffer = barrier = put_signal = wait_signal = _unavailable
    rank = world_size = buffer_ptrs_dev = signal_pad_ptrs_dev = buffer_size = signal_pad_size = (
        property(_unavailable)
    )

    def __init__(self, *args, **kwargs):
        raise _no_gpu("symmetric memory")


# Names torch exposes only in CUDA builds: getattr on c10d says what is missing (an
# AttributeError still, so hasattr() checks for NCCL keep answering False).
GPU_ONLY_NAMES = {
    "ProcessGroupNCCL": "the NCCL backend",
    "ProcessGroupUCC": "the UCC backend",
    "ProcessGroupXCCL": "the XCCL backend",
    "_IntraNodeComm": "intra-node communication",
    "_dump_nccl_trace": "NCCL's flight recorder",
    "_dump_nccl_trace_json": "NCCL's flight recorder",
    "_get_intra_node_comm_usage_counter": "intra-node communication",
}


def gpu_only_error(name: str) -> Optional[AttributeError]:
    what = GPU_ONLY_NAMES.get(name)
    if what is None:
        return None
    return AttributeError(
        f"c10d has no {name}: {what} needs CUDA GPUs, and c10d runs on CPUs "
        f"only (use the gloo, shm or mpi backend)"
    )


def _test_python_store(store) -> None:
    """Runs torch's fixed sequence of set, get and add on `store` through the C++ Store
    interface (a PrefixStore in front calls into it), so a Python subclass that implements
    only those three methods passes; raises RuntimeError on a wrong value."""
    via = _C.PrefixStore("_test_python_store", store)
    for key, value in [("key", 1), ("key", 2), ("key", 3)]:
        via.add(key, value)
    for i in range(3):
        via.set(f"key{i}", f"value{i}")
        via.add("key3", i + 1)
    for value in (4, 3, 2):
        via.add("key3", value)
    expected = {"key": "6", "key0": "value0", "key1": "value1", "key2": "value2", "key3": "15"}
    for key, want in expected.items():
        got = bytes(via.get(key)).decode()
        if got != want:
            raise RuntimeError(f"_test_python_store: {key} read back {got!r}, expected {want!r}")
