"""Names of torch's c10d bindings that c10d's extension module does not define, added in Python:
OpType, DDP's Logger and DDPLoggingData, the sequence numbers and Gloo options of backends
(found through the group that owns them), the Reducer's recording setters, pending Works, and
the GPU-only classes torch exposes even in CPU builds (which raise, naming what is missing).
What needs no Python state (ProcessGroup's Options constructor and options, ids, boxing,
BarrierOptions.device, the backends' coalescing refusals) is bound in C++ (pg_bindings.cc).

Per-object state the pybind classes have no slot for lives in weak-keyed tables, so it goes
away with the object.
"""

import enum
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


# --------------------------------------------------------------------------------------------
# OpType


class OpType(enum.Enum):
    """The kind of operation a Work did (``Work._get_op_type()`` gives its number,
    ``WorkInfo.op_type`` the member), numbered as torch numbers them."""

    BROADCAST = 0
    ALLREDUCE = 1
    ALLREDUCE_COALESCED = 2
    REDUCE = 3
    ALLGATHER = 4
    _ALLGATHER_BASE = 5
    ALLGATHER_COALESCED = 6
    GATHER = 7
    SCATTER = 8
    REDUCE_SCATTER = 9
    ALLTOALL_BASE = 10
    ALLTOALL = 11
    SEND = 12
    RECV = 13
    RECVANYSOURCE = 14
    BARRIER = 15
    _REDUCE_SCATTER_BASE = 16
    COALESCED = 17
    _ALLREDUCE_SPARSE = 18
    REDUCE_SCATTER_TENSOR_COALESCED = 19
    UNKNOWN = 100

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


_work_info_op_name = _C.WorkInfo.op_type


def _work_info_op_type(info) -> OpType:
    name = _work_info_op_name.__get__(info)
    return OpType.__members__.get(name, OpType.UNKNOWN)


_C.WorkInfo.op_type = property(_work_info_op_type, doc="The OpType of the finished operation.")


# --------------------------------------------------------------------------------------------
# Backends


# A backend's Python object lives only while referenced, so its options are kept with the
# group it serves (by device), or with the object itself when it serves none.
_backend_options: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _owner(backend):
    """(the registered group `backend` serves, its device type), or (None, None)."""
    from . import distributed_c10d as dc

    for pg in list(dc._world.pg_map):
        try:
            for device in pg._device_types():
                device = device.split(":")[0]
                if pg._get_backend(device) is backend:
                    return pg, device
        except Exception:  # a Python ProcessGroup subclass without backends
            continue
    return None, None


def _owning_group(backend):
    return _owner(backend)[0]


def _backend_sequence_number(self) -> int:
    pg = _owning_group(self)
    return pg._get_sequence_number_for_group() if pg is not None else 0


def _backend_set_sequence_number(self) -> None:
    pg = _owning_group(self)
    if pg is not None:
        pg._set_sequence_number_for_group()


def _gloo_options(self):
    pg, device = _owner(self)
    table = _backend_options.setdefault(pg, {}) if pg is not None else None
    options = table.get(device) if table is not None else _backend_options.get(self)
    if options is None:
        options = _C.ProcessGroupGloo._Options()
        options._timeout = self.options_timeout
        if table is not None:
            table[device] = options
        else:
            _backend_options[self] = options
    return options


def _gloo_set_default_timeout(self, timeout: timedelta) -> None:
    # The running backend's, and what .options reports, as torch's Gloo does.
    _C._Backend._set_default_timeout(self, timeout)
    _gloo_options(self)._timeout = timeout


_C._Backend._get_sequence_number_for_group = _backend_sequence_number
_C._Backend._set_sequence_number_for_group = _backend_set_sequence_number
if hasattr(_C, "ProcessGroupGloo"):
    _C.ProcessGroupGloo.options = property(_gloo_options, doc="The backend's _Options.")
    _C.ProcessGroupGloo._set_default_timeout = _gloo_set_default_timeout


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


# What the setters record, per Reducer.
_reducer_state: "weakref.WeakKeyDictionary[Any, Dict[str, Any]]" = weakref.WeakKeyDictionary()


def _recorder(name: str, *fields: str):
    def record(self, *args):
        state = _reducer_state.setdefault(self, {})
        state[name] = args[0] if len(fields) == 1 else (args if fields else True)

    record.__name__ = name
    record.__doc__ = "Recorded for the DDP wrapper; the C++ Reducer does not read it."
    return record


def _reducer_prepare_for_forward(self) -> None:
    # As torch's: counts the iteration for the runtime statistics the logger samples.
    state = _reducer_state.setdefault(self, {})
    state["forwards"] = state.get("forwards", 0) + 1
    logger = state.get("set_logger")
    rate = state.get("_set_ddp_runtime_logging_sample_rate", 0)
    if logger is not None and rate and state["forwards"] % rate == 0:
        logger.set_runtime_stats_and_log()


_C.Reducer.prepare_for_forward = _reducer_prepare_for_forward
for _name, _fields in [
    ("set_logger", ("logger",)),
    ("_set_sparse_metadata", ("global_unique_ids",)),
    ("_set_mixed_precision_param_dtype", ("param_dtype",)),
    ("_delay_all_reduce", ()),
    ("_set_optimizer_in_backward", ()),
    ("_set_ddp_runtime_logging_sample_rate", ("sample_rate",)),
    ("_install_post_backward_futures", ("futures",)),
    ("_set_forward_pass_work_handle", ("work", "use_static_world_size")),
    ("_remove_autograd_hooks", ()),
]:
    if not hasattr(_C.Reducer, _name):
        setattr(_C.Reducer, _name, _recorder(_name, *_fields))


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


# --------------------------------------------------------------------------------------------
# Pending Works: ProcessGroup._wait_for_pending_works waits for the asynchronous operations
# the collectives handed out and that have not finished.


# Weakly: a Work keeps its tensors alive, and a finished one nobody holds must not keep them.
_pending_works: "weakref.WeakSet" = weakref.WeakSet()


def _track_pending(work) -> None:
    """Remembers an asynchronous collective's Work while someone holds it."""
    if work is not None:
        _pending_works.add(work)


def _wait_for_pending_works(self) -> None:
    # Every unfinished Work is waited for: one of another group is waited for too, which only
    # delays the return until it finishes on its own.
    works = list(_pending_works)
    _pending_works.clear()
    for work in works:
        if not work.is_completed():
            work.wait()


_C.ProcessGroup._wait_for_pending_works = _wait_for_pending_works


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
