# Generated from c10d._C by scripts/gen_stubs.py (`make stubs`): do not edit by hand.
"""
c10d: distributed communication for CPU programs (compiled core).
"""

from __future__ import annotations
from c10d import DistBackendError
from c10d import DistError
from c10d import DistNetworkError
from c10d import DistQueueEmptyError
from c10d import DistStoreError
from c10d import DistStoreTimeoutError
from c10d import DistTimeoutError
from c10d import DistTypeError
from c10d import DistValueError
import collections.abc
import datetime
import enum
import typing
import typing_extensions

__all__: list[str] = [
    "AllToAllOptions",
    "AllgatherOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "BarrierOptions",
    "BroadcastOptions",
    "BuiltinCommHookType",
    "DebugLevel",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistQueueEmptyError",
    "DistStoreError",
    "DistStoreTimeoutError",
    "DistTimeoutError",
    "DistTypeError",
    "DistValueError",
    "FakeProcessGroup",
    "FileStore",
    "Future",
    "GatherOptions",
    "GradBucket",
    "HashStore",
    "OpType",
    "PrefixStore",
    "ProcessGroup",
    "ProcessGroupGloo",
    "ProcessGroupHier",
    "ProcessGroupShm",
    "ReduceOp",
    "ReduceOptions",
    "ReduceScatterOptions",
    "Reducer",
    "ScatterOptions",
    "Store",
    "StoreCollectives",
    "TCPStore",
    "Work",
    "WorkInfo",
    "get_debug_level",
    "set_debug_level",
    "set_debug_level_from_env",
]

class DebugLevel:
    """
    How much c10d logs and checks.

    Members:

      OFF

      INFO

      DETAIL
    """

    DETAIL: typing.ClassVar[DebugLevel]
    INFO: typing.ClassVar[DebugLevel]
    OFF: typing.ClassVar[DebugLevel]
    __members__: typing.ClassVar[dict[str, DebugLevel]]
    @typing.overload
    def __eq__(self, other: DebugLevel) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: DebugLevel) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Future:
    """
    The eventual result of an asynchronous operation.
    """
    @staticmethod
    def __class_getitem__(arg0: typing.Any) -> typing.Any: ...
    def __init__(self, devices: typing.Any = None) -> None: ...
    def add_done_callback(self, callback: collections.abc.Callable) -> None: ...
    def done(self) -> bool:
        """
        True once the future has a result or an error.
        """
    def set_exception(self, result: typing.Any) -> None: ...
    def set_result(self, result: typing.Any) -> None: ...
    def then(self, callback: collections.abc.Callable) -> Future:
        """
        A new future completed with callback(this future)'s return value; the callback runs also when this future failed, and an exception in it becomes the new future's error (a RuntimeError naming it).
        """
    def value(self) -> typing.Any:
        """
        The value of a completed future (raises its error, or if not done).
        """
    def wait(self) -> typing.Any:
        """
        Blocks until done, then returns the value or raises the error.
        """

class Work:
    """
    An operation in flight.
    """
    @staticmethod
    def unbox(arg0: typing.Any) -> typing.Any: ...
    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    def _get_duration(self) -> float: ...
    def _get_op_type(self) -> int: ...
    def _source_rank(self) -> int: ...
    def abort(self) -> None: ...
    def boxed(self) -> typing.Any: ...
    def exception(self) -> typing.Any: ...
    def get_future(self) -> Future:
        """
        A Future completed when this operation is (with its output tensors). A send or receive advances only in wait(): until it completed, this raises.
        """
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    def result(self) -> typing.Any: ...
    def source_rank(self) -> int: ...
    def synchronize(self) -> None: ...
    def wait(self, timeout: datetime.timedelta = ...) -> bool:
        """
        Blocks until the operation finishes and raises its error. With a timeout, raises DistTimeoutError if it has not finished by then; the operation then goes on and may still write into its outputs.
        """
    @property
    def op_type(self) -> str: ...

class ReduceOp:
    """
    How a reducing collective combines the ranks' values.

    The values are ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``,
    ``BXOR``, ``PREMUL_SUM`` and ``UNUSED``, each a ``ReduceOp.RedOpType`` accepted wherever a
    ``ReduceOp`` is. ``_make_nccl_premul_sum(factor)`` builds a PREMUL_SUM with its factor.
    """
    class RedOpType:
        """
        Members:

          SUM

          AVG

          PRODUCT

          MIN

          MAX

          BAND

          BOR

          BXOR

          PREMUL_SUM

          UNUSED
        """

        AVG: typing.ClassVar[ReduceOp.RedOpType]
        BAND: typing.ClassVar[ReduceOp.RedOpType]
        BOR: typing.ClassVar[ReduceOp.RedOpType]
        BXOR: typing.ClassVar[ReduceOp.RedOpType]
        MAX: typing.ClassVar[ReduceOp.RedOpType]
        MIN: typing.ClassVar[ReduceOp.RedOpType]
        PREMUL_SUM: typing.ClassVar[ReduceOp.RedOpType]
        PRODUCT: typing.ClassVar[ReduceOp.RedOpType]
        SUM: typing.ClassVar[ReduceOp.RedOpType]
        UNUSED: typing.ClassVar[ReduceOp.RedOpType]
        __members__: typing.ClassVar[dict[str, ReduceOp.RedOpType]]
        def __eq__(self, arg0: typing.Any) -> typing.Any: ...
        def __getstate__(self) -> int: ...
        def __hash__(self) -> int: ...
        def __index__(self) -> int: ...
        def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __int__(self) -> int: ...
        def __ne__(self, arg0: typing.Any) -> typing.Any: ...
        def __repr__(self) -> str: ...
        def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __str__(self) -> str: ...
        @property
        def name(self) -> str: ...
        @property
        def value(self) -> int: ...

    AVG: typing.ClassVar[ReduceOp.RedOpType]
    BAND: typing.ClassVar[ReduceOp.RedOpType]
    BOR: typing.ClassVar[ReduceOp.RedOpType]
    BXOR: typing.ClassVar[ReduceOp.RedOpType]
    MAX: typing.ClassVar[ReduceOp.RedOpType]
    MIN: typing.ClassVar[ReduceOp.RedOpType]
    PREMUL_SUM: typing.ClassVar[ReduceOp.RedOpType]
    PRODUCT: typing.ClassVar[ReduceOp.RedOpType]
    SUM: typing.ClassVar[ReduceOp.RedOpType]
    UNUSED: typing.ClassVar[ReduceOp.RedOpType]
    __members__: typing.ClassVar[dict[str, ReduceOp.RedOpType]]
    def __copy__(self) -> ReduceOp: ...
    def __deepcopy__(self, memo: dict) -> ReduceOp: ...
    def __eq__(self, arg0: typing.Any) -> typing.Any: ...
    def __getstate__(self) -> tuple[int, typing.Any]: ...
    def __hash__(self) -> int: ...
    @typing.overload
    def __init__(self) -> None:
        """
        ReduceOp.SUM.
        """
    @typing.overload
    def __init__(self, op: ReduceOp.RedOpType) -> None: ...
    def __ne__(self, arg0: typing.Any) -> typing.Any: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, arg0: tuple) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def op(self) -> ReduceOp.RedOpType:
        """
        The RedOpType of this op.
        """
    @property
    def premul_factor(self) -> float:
        """
        The factor of a PREMUL_SUM (1.0 for other ops).
        """

class Store:
    """
    Key-value store shared by the ranks of a job. Subclass it in Python to provide your own (implement set, get, add, compare_set, check, delete_key, num_keys and wait).
    """
    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    def add(self, key: str, amount: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        Adds amount to the integer counter under key (created at 0); returns the new value.
        """
    def append(self, key: str, value: typing.Any) -> None:
        """
        Appends value to the bytes under key.
        """
    def check(self, keys: collections.abc.Sequence[str]) -> bool:
        """
        True if every key exists (does not wait).
        """
    def clone(self) -> Store:
        """
        An independent handle on the same data (a new connection for network stores).
        """
    def compare_set(self, key: str, expected_value: typing.Any, desired_value: typing.Any) -> bytes:
        """
        Replaces the value only if it equals expected_value (creates the key when it is missing and expected_value is empty); returns the value now stored.
        """
    def delete_key(self, key: str) -> bool:
        """
        Removes key; True if it existed.
        """
    def get(self, key: str) -> bytes:
        """
        Waits up to the store timeout for key and returns its value.
        """
    def has_extended_api(self) -> bool: ...
    def list_keys(self) -> list[str]: ...
    def multi_get(self, keys: collections.abc.Sequence[str]) -> list:
        """
        Waits for and returns the values of every key.
        """
    def multi_set(
        self, keys: collections.abc.Sequence[str], values: collections.abc.Sequence
    ) -> None:
        """
        Stores every (key, value) pair.
        """
    def num_keys(self) -> int:
        """
        Number of keys in the store.
        """
    def queue_len(self, key: str) -> int: ...
    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """
        Removes and returns the oldest value of the queue (waiting up to the timeout when block is true, else raising DistQueueEmptyError when empty).
        """
    def queue_push(self, key: str, value: typing.Any) -> None:
        """
        Appends value to the queue under key.
        """
    def set(self, key: str, value: typing.Any) -> None:
        """
        Stores value under key, replacing any old value.
        """
    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """
        Sets the default timeout of get and wait.
        """
    @typing.overload
    def wait(self, keys: collections.abc.Sequence[str]) -> None:
        """
        Waits up to the store timeout until every key exists.
        """
    @typing.overload
    def wait(self, keys: collections.abc.Sequence[str], timeout: datetime.timedelta) -> None:
        """
        Waits up to timeout until every key exists.
        """
    @property
    def timeout(self) -> datetime.timedelta: ...

class HashStore(Store):
    """
    Store held in this process's memory, shared by its threads.
    """
    def __init__(self) -> None: ...

class FileStore(Store):
    """
    Store kept in a file that processes on one machine (or a shared file system) open together. The last of world_size users to close it removes the file.
    """
    def __init__(
        self, file_name: str, world_size: typing.SupportsInt | typing.SupportsIndex = -1
    ) -> None: ...
    @property
    def path(self) -> str: ...

class PrefixStore(Store):
    """
    A view of another store where every key is prefixed by 'prefix/'.
    """
    def __init__(self, prefix: str, store: Store) -> None: ...
    @property
    def _underlying_non_prefix_store(self) -> Store: ...
    @property
    def prefix(self) -> str: ...
    @property
    def underlying_store(self) -> Store: ...

class TCPStore(Store):
    """
    Store served over TCP, wire-compatible with torch.distributed.TCPStore. The master (is_master=True) runs the server in this process; everyone connects to host_name:port. Port 0 lets the master pick a free port (see .port).
    """
    def __init__(
        self,
        host_name: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        world_size: typing.SupportsInt | typing.SupportsIndex | None = None,
        is_master: bool = False,
        timeout: datetime.timedelta = ...,
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: typing.SupportsInt | typing.SupportsIndex | None = None,
        use_libuv: bool | None = None,
        secret: str | None = None,
    ) -> None:
        """
        Starts the server when is_master (unless TORCHELASTIC_USE_AGENT_STORE is set and MASTER_PORT is this port: a launcher's store already serves it), then connects (retrying until timeout). With is_master, world_size and wait_for_workers, blocks until world_size stores have joined, else raises DistStoreError (a DistTimeoutError too) naming how many did. `secret` (default: C10D_STORE_SECRET) is a shared secret the server requires and clients present.
        """
    def collect_client_counters(self) -> dict:
        """
        Per-operation client counters: c10d's TCPStore client keeps none, so none are listed.
        """
    @property
    def host(self) -> str:
        """
        The host name clients connect to.
        """
    @property
    def libuvBackend(self) -> bool:
        """
        The use_libuv option (default True). c10d's server always runs on libuv, so the option is only recorded.
        """
    @property
    def port(self) -> int:
        """
        The port the server listens on (resolved when 0 was asked for).
        """

class BroadcastOptions:
    """
    Options of ProcessGroup.broadcast: the root rank and which of its tensors is the source, the timeout (unset: the group's), whether the call is asynchronous.
    """

    asyncOp: bool
    timeout: datetime.timedelta
    def __init__(self) -> None: ...
    @property
    def rootRank(self) -> int: ...
    @rootRank.setter
    def rootRank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def rootTensor(self) -> int: ...
    @rootTensor.setter
    def rootTensor(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class AllreduceOptions:
    """
    Options of ProcessGroup.allreduce: the reduction (ReduceOp), the timeout (unset: the group's), whether the call is asynchronous.
    """

    asyncOp: bool
    reduceOp: ReduceOp
    timeout: datetime.timedelta
    def __init__(self) -> None: ...

class AllreduceCoalescedOptions(AllreduceOptions):
    """
    Options of ProcessGroup.allreduce_coalesced: as AllreduceOptions.
    """
    def __init__(self) -> None: ...

class ReduceOptions:
    """
    Options of ProcessGroup.reduce: the reduction, the root rank and tensor, the timeout, whether the call is asynchronous.
    """

    asyncOp: bool
    reduceOp: ReduceOp
    timeout: datetime.timedelta
    def __init__(self) -> None: ...
    @property
    def rootRank(self) -> int: ...
    @rootRank.setter
    def rootRank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def rootTensor(self) -> int: ...
    @rootTensor.setter
    def rootTensor(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class AllgatherOptions:
    """
    Options of the all_gather forms: the timeout (unset: the group's), whether the call is asynchronous.
    """

    asyncOp: bool
    timeout: datetime.timedelta
    def __init__(self) -> None: ...

class GatherOptions:
    """
    Options of ProcessGroup.gather: the root rank, the timeout, whether the call is asynchronous.
    """

    asyncOp: bool
    timeout: datetime.timedelta
    def __init__(self) -> None: ...
    @property
    def rootRank(self) -> int: ...
    @rootRank.setter
    def rootRank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class ScatterOptions:
    """
    Options of ProcessGroup.scatter: the root rank, the timeout, whether the call is asynchronous.
    """

    asyncOp: bool
    timeout: datetime.timedelta
    def __init__(self) -> None: ...
    @property
    def rootRank(self) -> int: ...
    @rootRank.setter
    def rootRank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class ReduceScatterOptions:
    """
    Options of the reduce_scatter forms: the reduction, the timeout, whether the call is asynchronous.
    """

    asyncOp: bool
    reduceOp: ReduceOp
    timeout: datetime.timedelta
    def __init__(self) -> None: ...

class AllToAllOptions:
    """
    Options of the all_to_all forms: the timeout (unset: the group's), whether the call is asynchronous.
    """

    asyncOp: bool
    timeout: datetime.timedelta
    def __init__(self) -> None: ...

class BarrierOptions:
    """
    Options of ProcessGroup.barrier: device ids (ignored on CPUs), the timeout, whether the call is asynchronous.
    """

    asyncOp: bool
    device: typing.Any
    timeout: datetime.timedelta
    def __init__(self) -> None: ...
    @property
    def device_ids(self) -> list[int]: ...
    @device_ids.setter
    def device_ids(
        self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]
    ) -> None: ...

class OpType(enum.Enum):
    """
    The kind of operation a Work did, numbered as torch numbers them.
    """

    ALLGATHER: typing.ClassVar[OpType]
    ALLGATHER_COALESCED: typing.ClassVar[OpType]
    ALLREDUCE: typing.ClassVar[OpType]
    ALLREDUCE_COALESCED: typing.ClassVar[OpType]
    ALLTOALL: typing.ClassVar[OpType]
    ALLTOALL_BASE: typing.ClassVar[OpType]
    BARRIER: typing.ClassVar[OpType]
    BROADCAST: typing.ClassVar[OpType]
    COALESCED: typing.ClassVar[OpType]
    GATHER: typing.ClassVar[OpType]
    RECV: typing.ClassVar[OpType]
    RECVANYSOURCE: typing.ClassVar[OpType]
    REDUCE: typing.ClassVar[OpType]
    REDUCE_SCATTER: typing.ClassVar[OpType]
    REDUCE_SCATTER_TENSOR_COALESCED: typing.ClassVar[OpType]
    SCATTER: typing.ClassVar[OpType]
    SEND: typing.ClassVar[OpType]
    UNKNOWN: typing.ClassVar[OpType]
    _ALLGATHER_BASE: typing.ClassVar[OpType]
    _ALLREDUCE_SPARSE: typing.ClassVar[OpType]
    _REDUCE_SCATTER_BASE: typing.ClassVar[OpType]
    @staticmethod
    def __index__(*args, **kwargs):
        """
        (self: object) -> detail::accessor<detail::accessor_policies::str_attr>
        """
    @staticmethod
    def __int__(*args, **kwargs):
        """
        (self: object) -> detail::accessor<detail::accessor_policies::str_attr>
        """
    @classmethod
    def __new__(cls, value): ...

class WorkInfo:
    """
    What a finished operation reports to the hooks of ProcessGroup._register_on_completion_hook: its kind, sequence number, start and end times and active duration.
    """
    @property
    def active_duration(self) -> datetime.timedelta: ...
    @property
    def op_type(self) -> OpType: ...
    @property
    def seq(self) -> int: ...
    @property
    def time_finished(self) -> datetime.timedelta: ...
    @property
    def time_started(self) -> datetime.timedelta: ...

class _Backend:
    """
    One implementation of the collectives, registered in a ProcessGroup.
    """
    def _allgather_base(
        self, output: typing.Any, input: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def _end_coalescing(self) -> None: ...
    def _get_backend_name(self) -> str: ...
    def _get_sequence_number_for_group(self) -> int:
        """
        The sequence number of the group this backend serves (0: none).
        """
    def _reduce_scatter_base(
        self, outputTensor: typing.Any, inputTensor: typing.Any, opts: ReduceScatterOptions = ...
    ) -> typing.Any: ...
    def _set_default_timeout(self, timeout: datetime.timedelta) -> None:
        """
        The timeout of the operations submitted from now on that set none.
        """
    def _set_sequence_number_for_group(self) -> None:
        """
        Nothing to do: the group numbers its operations itself.
        """
    def _start_coalescing(self) -> None: ...
    def allgather(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def allgather_coalesced(
        self, output_lists: typing.Any, input_list: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def allgather_into_tensor_coalesced(
        self, outputs: typing.Any, inputs: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def allreduce(self, tensors: typing.Any, opts: AllreduceOptions = ...) -> typing.Any: ...
    @typing.overload
    def allreduce(self, tensors: typing.Any, op: ReduceOp) -> typing.Any: ...
    def allreduce_coalesced(
        self, tensors: typing.Any, opts: AllreduceCoalescedOptions = ...
    ) -> typing.Any: ...
    def alltoall(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: AllToAllOptions = ...
    ) -> typing.Any: ...
    def alltoall_base(
        self,
        output: typing.Any,
        input: typing.Any,
        output_split_sizes: typing.Any,
        input_split_sizes: typing.Any,
        opts: AllToAllOptions = ...,
    ) -> typing.Any: ...
    def barrier(self, opts: BarrierOptions = ...) -> typing.Any: ...
    @typing.overload
    def broadcast(self, tensors: typing.Any, opts: BroadcastOptions = ...) -> typing.Any: ...
    @typing.overload
    def broadcast(
        self, tensor: typing.Any, root: typing.SupportsInt | typing.SupportsIndex
    ) -> typing.Any: ...
    def eager_connect_single_device(self, device: typing.Any = None) -> None:
        """
        Nothing to do: c10d's backends connect when they are made.
        """
    @typing.overload
    def gather(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: GatherOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def gather(
        self,
        output_tensors: typing.Any,
        input_tensor: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
    ) -> typing.Any: ...
    def monitored_barrier(
        self, timeout: datetime.timedelta = ..., wait_all_ranks: bool = False
    ) -> None: ...
    def name(self) -> str: ...
    def rank(self) -> int: ...
    def recv(
        self,
        tensors: typing.Any,
        srcRank: typing.SupportsInt | typing.SupportsIndex,
        tag: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> Work: ...
    def recv_anysource(
        self, tensors: typing.Any, tag: typing.SupportsInt | typing.SupportsIndex = 0
    ) -> Work: ...
    @typing.overload
    def reduce(self, tensors: typing.Any, opts: ReduceOptions = ...) -> typing.Any: ...
    @typing.overload
    def reduce(
        self,
        tensor: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
        op: ReduceOp = ...,
    ) -> typing.Any: ...
    @typing.overload
    def reduce_scatter(
        self,
        output_tensors: typing.Any,
        input_tensors: typing.Any,
        opts: ReduceScatterOptions = ...,
    ) -> typing.Any: ...
    @typing.overload
    def reduce_scatter(
        self, output: typing.Any, input: typing.Any, op: ReduceOp = ...
    ) -> typing.Any: ...
    def reduce_scatter_tensor_coalesced(
        self, outputs: typing.Any, inputs: typing.Any, opts: ReduceScatterOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def scatter(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: ScatterOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def scatter(
        self,
        output_tensor: typing.Any,
        input_tensors: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
    ) -> typing.Any: ...
    def send(
        self,
        tensors: typing.Any,
        dstRank: typing.SupportsInt | typing.SupportsIndex,
        tag: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> Work: ...
    def size(self) -> int: ...
    @property
    def options_timeout(self) -> datetime.timedelta: ...
    @property
    def supports_splitting(self) -> bool:
        """
        Whether torch's split_group can split this backend (Gloo's can).
        """

class FakeProcessGroup(_Backend):
    """
    A backend that completes every operation at once, for tests.
    """
    def __init__(
        self,
        rank: typing.SupportsInt | typing.SupportsIndex,
        world_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...

class _ProcessGroupWrapper(_Backend):
    """
    Checks before each collective that every rank calls the same one (debug level DETAIL).
    """
    def __init__(self, backend: _Backend, gloo_backend: _Backend) -> None: ...
    @property
    def wrapped_pg(self) -> _Backend: ...

class _ProcessGroupOptions:
    _timeout: datetime.timedelta
    backend: str
    @typing.overload
    def __init__(self) -> None: ...
    @typing.overload
    def __init__(self, backend: str, timeout: datetime.timedelta = ...) -> None: ...

class ProcessGroup:
    """
    A set of ranks running collectives together, with one backend per device.
    """
    class BackendType:
        """
        Members:

          UNDEFINED

          GLOO

          NCCL

          UCC

          MPI

          CUSTOM
        """

        CUSTOM: typing.ClassVar[ProcessGroup.BackendType]
        GLOO: typing.ClassVar[ProcessGroup.BackendType]
        MPI: typing.ClassVar[ProcessGroup.BackendType]
        NCCL: typing.ClassVar[ProcessGroup.BackendType]
        UCC: typing.ClassVar[ProcessGroup.BackendType]
        UNDEFINED: typing.ClassVar[ProcessGroup.BackendType]
        __members__: typing.ClassVar[dict[str, ProcessGroup.BackendType]]
        @typing.overload
        def __eq__(self, other: ProcessGroup.BackendType) -> bool: ...
        @typing.overload
        def __eq__(self, other: typing.Any) -> bool: ...
        def __getstate__(self) -> int: ...
        def __hash__(self) -> int: ...
        def __index__(self) -> int: ...
        def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __int__(self) -> int: ...
        @typing.overload
        def __ne__(self, other: ProcessGroup.BackendType) -> bool: ...
        @typing.overload
        def __ne__(self, other: typing.Any) -> bool: ...
        def __repr__(self) -> str: ...
        def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __str__(self) -> str: ...
        @property
        def name(self) -> str: ...
        @property
        def value(self) -> int: ...

    CUSTOM: typing.ClassVar[ProcessGroup.BackendType]
    GLOO: typing.ClassVar[ProcessGroup.BackendType]
    MPI: typing.ClassVar[ProcessGroup.BackendType]
    NCCL: typing.ClassVar[ProcessGroup.BackendType]
    UCC: typing.ClassVar[ProcessGroup.BackendType]
    UNDEFINED: typing.ClassVar[ProcessGroup.BackendType]
    Options = _ProcessGroupOptions
    @staticmethod
    def unbox(obj: typing.Any) -> typing.Any: ...
    @typing.overload
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        backend: str | None = None,
        timeout: datetime.timedelta | None = None,
    ) -> None: ...
    @typing.overload
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        options: _ProcessGroupOptions,
    ) -> None: ...
    @typing.overload
    def __init__(
        self,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def __repr__(self) -> str: ...
    def _allgather_base(
        self, output: typing.Any, input: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def _backend_id(self, backend_type: typing.Any) -> int:
        """
        The id() of this group's backend of `backend_type` (a ProcessGroup.BackendType).
        """
    def _device_types(self) -> list[str]: ...
    def _enable_collectives_timing(self) -> None: ...
    def _end_coalescing(self, device: typing.Any) -> Work: ...
    def _get_backend(self, device: typing.Any) -> _Backend: ...
    def _get_backend_name(self) -> str: ...
    def _get_sequence_number_for_group(self) -> int: ...
    def _has_hooks(self) -> bool: ...
    def _id(self) -> int: ...
    def _inline_ops(self) -> dict:
        """
        The group's inline entry points by name (allreduce, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, gather, scatter, barrier): synchronous collectives on C-contiguous buffers that return False, having done nothing, when the inline path does not apply.
        """
    def _reduce_scatter_base(
        self, outputTensor: typing.Any, inputTensor: typing.Any, opts: ReduceScatterOptions = ...
    ) -> typing.Any: ...
    def _register_backend(
        self, device: typing.Any, backend_type: typing.Any, backend: _Backend = None
    ) -> None: ...
    def _register_on_completion_hook(self, hook: collections.abc.Callable) -> None: ...
    def _set_global_ranks(
        self, ranks: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]
    ) -> None: ...
    def _set_group_desc(self, desc: str) -> None: ...
    def _set_group_name(self, name: str) -> None: ...
    def _set_sequence_number_for_group(self) -> None: ...
    def _shutdown(self) -> None: ...
    def _start_coalescing(self, device: typing.Any) -> None: ...
    def _wait_for_pending_works(self) -> None:
        """
        Waits for this group's asynchronous operations that have not completed.
        """
    def allgather(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def allgather_coalesced(
        self, output_lists: typing.Any, input_list: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    def allgather_into_tensor_coalesced(
        self, outputs: typing.Any, inputs: typing.Any, opts: AllgatherOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def allreduce(self, tensors: typing.Any, opts: AllreduceOptions = ...) -> typing.Any: ...
    @typing.overload
    def allreduce(self, tensors: typing.Any, op: ReduceOp) -> typing.Any: ...
    def allreduce_coalesced(
        self, tensors: typing.Any, opts: AllreduceCoalescedOptions = ...
    ) -> typing.Any: ...
    def alltoall(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: AllToAllOptions = ...
    ) -> typing.Any: ...
    def alltoall_base(
        self,
        output: typing.Any,
        input: typing.Any,
        output_split_sizes: typing.Any,
        input_split_sizes: typing.Any,
        opts: AllToAllOptions = ...,
    ) -> typing.Any: ...
    def barrier(self, opts: BarrierOptions = ...) -> typing.Any: ...
    def boxed(self) -> typing.Any:
        """
        Itself: without TorchScript there is no IValue to box into.
        """
    @typing.overload
    def broadcast(self, tensors: typing.Any, opts: BroadcastOptions = ...) -> typing.Any: ...
    @typing.overload
    def broadcast(
        self, tensor: typing.Any, root: typing.SupportsInt | typing.SupportsIndex
    ) -> typing.Any: ...
    @typing.overload
    def gather(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: GatherOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def gather(
        self,
        output_tensors: typing.Any,
        input_tensor: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
    ) -> typing.Any: ...
    def getBackendName(self) -> str: ...
    def monitored_barrier(
        self, timeout: datetime.timedelta = ..., wait_all_ranks: bool = False
    ) -> None: ...
    def name(self) -> typing.Any: ...
    def rank(self) -> int: ...
    def recv(
        self,
        tensors: typing.Any,
        srcRank: typing.SupportsInt | typing.SupportsIndex,
        tag: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> Work: ...
    def recv_anysource(
        self, tensors: typing.Any, tag: typing.SupportsInt | typing.SupportsIndex = 0
    ) -> Work: ...
    @typing.overload
    def reduce(self, tensors: typing.Any, opts: ReduceOptions = ...) -> typing.Any: ...
    @typing.overload
    def reduce(
        self,
        tensor: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
        op: ReduceOp = ...,
    ) -> typing.Any: ...
    @typing.overload
    def reduce_scatter(
        self,
        output_tensors: typing.Any,
        input_tensors: typing.Any,
        opts: ReduceScatterOptions = ...,
    ) -> typing.Any: ...
    @typing.overload
    def reduce_scatter(
        self, output: typing.Any, input: typing.Any, op: ReduceOp = ...
    ) -> typing.Any: ...
    def reduce_scatter_tensor_coalesced(
        self, outputs: typing.Any, inputs: typing.Any, opts: ReduceScatterOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def scatter(
        self, output_tensors: typing.Any, input_tensors: typing.Any, opts: ScatterOptions = ...
    ) -> typing.Any: ...
    @typing.overload
    def scatter(
        self,
        output_tensor: typing.Any,
        input_tensors: typing.Any,
        root: typing.SupportsInt | typing.SupportsIndex,
    ) -> typing.Any: ...
    def send(
        self,
        tensors: typing.Any,
        dstRank: typing.SupportsInt | typing.SupportsIndex,
        tag: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> Work: ...
    def size(self) -> int: ...
    @property
    def _global_ranks(self) -> list[int] | None: ...
    @property
    def _store(self) -> Store: ...
    @property
    def _timeout(self) -> datetime.timedelta: ...
    @property
    def bound_device_id(self) -> None: ...
    @property
    def group_desc(self) -> str: ...
    @property
    def group_name(self) -> str: ...
    @property
    def options(self) -> _ProcessGroupOptions:
        """
        The Options the group was made with (backend, timeout).
        """

class _ControlCollectives:
    """
    Collectives over small byte strings for coordination (not tensors). Every operation takes a key that all ranks pass and that is never reused, and a timeout; a timeout raises DistStoreTimeoutError naming the ranks that did not arrive.
    """
    def all_gather(self, key: str, data: typing.Any, timeout: datetime.timedelta = ...) -> list:
        """
        Every rank's data as a list in rank order, on every rank.
        """
    def all_sum(
        self,
        key: str,
        data: typing.SupportsInt | typing.SupportsIndex,
        timeout: datetime.timedelta = ...,
    ) -> int:
        """
        Sums an integer over every rank; every rank gets the total.
        """
    def barrier(self, key: str, timeout: datetime.timedelta = ..., block: bool = True) -> None:
        """
        Waits until every rank has called barrier with this key (block=False: only announces this rank).
        """
    def broadcast_recv(self, key: str, timeout: datetime.timedelta = ...) -> bytes:
        """
        Receives what one rank sent with broadcast_send.
        """
    def broadcast_send(self, key: str, data: typing.Any, timeout: datetime.timedelta = ...) -> None:
        """
        Sends data to every other rank (called by one rank).
        """
    def gather_recv(self, key: str, data: typing.Any, timeout: datetime.timedelta = ...) -> list:
        """
        Receives every rank's data (its own included) as a list in rank order (called by one rank).
        """
    def gather_send(self, key: str, data: typing.Any, timeout: datetime.timedelta = ...) -> None:
        """
        Sends data to the rank calling gather_recv.
        """
    def scatter_recv(self, key: str, timeout: datetime.timedelta = ...) -> bytes:
        """
        Receives this rank's entry of a scatter_send.
        """
    def scatter_send(
        self, key: str, data: collections.abc.Sequence, timeout: datetime.timedelta = ...
    ) -> bytes:
        """
        Sends data[r] to each rank r (one entry per rank) and returns this rank's entry.
        """

class StoreCollectives(_ControlCollectives):
    """
    Control collectives that communicate through a Store (keys '<key>/...').
    """
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        world_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...

class _Request:
    """
    The request a control-plane handler receives. Subclass it (implementing body and params) to call a handler from _get_handler directly.
    """
    def __init__(self) -> None: ...
    def body(self) -> bytes:
        """
        The request body as bytes.
        """
    def get_param(self, name: str) -> str:
        """
        The value of one query parameter, or '' when absent.
        """
    def params(self) -> dict[str, str]:
        """
        Query parameters as a dict.
        """

class _Response:
    """
    What a control-plane handler fills in (status 200 and empty text/plain by default).
    """
    def __init__(self) -> None: ...
    def set_content(self, content: typing.Any, content_type: str) -> None: ...
    def set_status(self, status: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class _WorkerServer:
    """
    HTTP server of the control plane: GET /handler/ lists the handlers, POST /handler/<name> runs one. port=-1 serves on the unix socket host_or_file (mode 0600); port=0 picks a free TCP port (see .port). With a secret (or C10D_CONTROL_SECRET), requests need 'Authorization: Bearer <secret>'.
    """
    def __enter__(self) -> typing.Any: ...
    def __exit__(self, *args) -> None: ...
    def __init__(
        self,
        host_or_file: str,
        port: typing.SupportsInt | typing.SupportsIndex = -1,
        store: Store = None,
        secret: str | None = None,
    ) -> None: ...
    def shutdown(self) -> None: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def requires_auth(self) -> bool: ...
    @property
    def socket_path(self) -> str: ...

class BuiltinCommHookType:
    """
    The comm hooks implemented in C++.

    Members:

      ALLREDUCE

      FP16_COMPRESS
    """

    ALLREDUCE: typing.ClassVar[BuiltinCommHookType]
    FP16_COMPRESS: typing.ClassVar[BuiltinCommHookType]
    __members__: typing.ClassVar[dict[str, BuiltinCommHookType]]
    @typing.overload
    def __eq__(self, other: BuiltinCommHookType) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: BuiltinCommHookType) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class GradBucket:
    """
    A bucket of gradients as a comm hook receives it: one flat buffer holding the gradients of its parameters one after another.
    """
    def buffer(self) -> typing.Any:
        """
        The flat buffer (reduce it in place, or return a new one from the hook's future).
        """
    def gradients(self) -> list:
        """
        Views of the buffer, one per parameter, shaped like the parameters.
        """
    def index(self) -> int:
        """
        The bucket's index (0 is reduced first).
        """
    def is_last(self) -> bool:
        """
        Whether this is the last bucket reduced in a backward pass.
        """
    def parameters(self) -> list:
        """
        The bucket's parameters.
        """
    def set_buffer(self, buffer: typing.Any) -> None:
        """
        Replaces the buffer (same dtype and number of elements).
        """

class Reducer:
    """
    Averages gradients across a process group during the backward pass, bucket by bucket, each bucket as soon as all of its gradients are ready. Call prepare_for_backward(), then _autograd_hook(i) as each parameter's gradient becomes final (a torch parameter's .grad is used; otherwise the parameter is its own gradient buffer, or pass grad=); the call that completes the last bucket waits for every reduction and writes the averages back. With find_unused_parameters, finish with finalize_backward().
    """
    def __init__(
        self,
        params: typing.Any,
        bucket_indices: collections.abc.Sequence[
            collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]
        ],
        per_bucket_size_limits: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        process_group: ProcessGroup,
        expect_sparse_gradients: collections.abc.Sequence[bool] = [],
        bucket_bytes_cap: typing.SupportsInt | typing.SupportsIndex = 26214400,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        param_to_name_mapping: typing.Any = {},
        first_bucket_bytes_cap: typing.SupportsInt | typing.SupportsIndex = 1048576,
    ) -> None: ...
    def _autograd_hook(
        self, index: typing.SupportsInt | typing.SupportsIndex, grad: typing.Any = None
    ) -> None:
        """
        Parameter `index`'s gradient is final for this backward pass.
        """
    def _bucket_view(self, index: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        """
        Where parameter `index`'s gradient sits in its bucket.
        """
    def _check_reducer_finalized(self) -> None: ...
    def _ddp_graph_static(self) -> bool: ...
    def _get_global_used_map(self) -> typing.Any:
        """
        Per parameter: whether any rank used it in the last finished pass.
        """
    def _get_local_used_map(self) -> typing.Any:
        """
        Per parameter, 1 if this rank marked it ready in the last pass (int32 array).
        """
    def _get_zeros_like_grad_buckets(self) -> list[GradBucket]: ...
    def _has_rebuilt_buckets(self) -> bool: ...
    def _push_all_rebuilt_params(self) -> None:
        """
        Takes the parameters in index order as the order for _rebuild_buckets.
        """
    def _rebuild_buckets(self) -> bool:
        """
        Regroups the buckets in the order the last full backward pass marked gradients ready (rank 0's grouping, broadcast); once per reducer. Returns whether it did. Bucket views taken before are no longer the buckets.
        """
    def _reset_state(self) -> None: ...
    def _run_allreduce_hook(self, bucket: GradBucket) -> Future: ...
    def _run_comm_hook(self, bucket: GradBucket) -> Future: ...
    def _set_static_graph(self) -> None: ...
    def _update_process_group(self, new_process_group: ProcessGroup) -> None:
        """
        Reduces over new_process_group from now on (not during a backward pass); the buckets may be rebuilt again after the next full pass.
        """
    def finalize_backward(self) -> None:
        """
        Reduces what is pending, waits, and writes the averages into the gradients.
        """
    def get_backward_stats(self) -> list[int]:
        """
        Nanoseconds from prepare_for_backward to each parameter's gradient being ready.
        """
    def prepare_for_backward(self, outputs: typing.Any = None) -> None:
        """
        Starts a backward pass (DistError if the previous one was not finished).
        """
    @property
    def bucket_indices(self) -> list[list[int]]: ...
    @property
    def num_iterations(self) -> int: ...
    @property
    def per_bucket_size_limits(self) -> list[int]: ...

class ProcessGroupGloo(_Backend):
    """
    Collectives over TCP with the Gloo library.
    """
    class Device:
        def __repr__(self) -> str: ...

    class _Options:
        _ring: bool | None
        _timeout: datetime.timedelta
        def __init__(self) -> None: ...
        @property
        def _devices(self) -> list[ProcessGroupGloo.Device]: ...
        @_devices.setter
        def _devices(self, arg0: collections.abc.Sequence[ProcessGroupGloo.Device]) -> None: ...
        @property
        def _threads(self) -> int: ...
        @_threads.setter
        def _threads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

    Options = ProcessGroupGloo._Options
    @staticmethod
    def create_default_device() -> ProcessGroupGloo.Device: ...
    @staticmethod
    def create_device(hostname: str = "", interface: str = "") -> ProcessGroupGloo.Device:
        """
        A TCP device bound to the address of `hostname`, or of network interface `interface`, or (neither) the default.
        """
    @typing.overload
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        timeout: datetime.timedelta = ...,
    ) -> None: ...
    @typing.overload
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        options: ProcessGroupGloo._Options,
    ) -> None: ...
    @property
    def options(self) -> ProcessGroupGloo._Options:
        """
        The backend's options: its devices and the timeout of the operations that set none.
        """

class ProcessGroupShm(_Backend):
    """
    Collectives between the processes of one host through shared memory.
    """
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        timeout: datetime.timedelta = ...,
    ) -> None: ...
    def _aliased(self, array: typing_extensions.Buffer) -> bool:
        """
        Whether part of the array's memory was moved into this rank's shared heap (after repeated all_reduces; C10D_SHM_ADOPT_BYTES).
        """
    def _empty(
        self, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], dtype: str
    ) -> typing.Any:
        """
        An uninitialised C-contiguous array in this rank's shared heap (numpy when the dtype exists there, else a DLPack capsule).
        """
    def _next_sequence(self) -> int: ...

class ProcessGroupHier(_Backend):
    """
    Collectives over shared memory within each host and Gloo between hosts.
    """
    def __init__(
        self,
        store: Store,
        rank: typing.SupportsInt | typing.SupportsIndex,
        size: typing.SupportsInt | typing.SupportsIndex,
        timeout: datetime.timedelta = ...,
    ) -> None: ...
    @property
    def hosts(self) -> list[list[int]]:
        """
        The ranks of each host (hosts in order of their lowest rank).
        """

def _as_numpy(tensor: typing.Any) -> typing.Any:
    """
    A zero-copy numpy (or DLPack) view of a tensor-like object.
    """

def _broadcast_coalesced(
    process_group: ProcessGroup,
    tensors: typing.Any,
    buffer_size: typing.SupportsInt | typing.SupportsIndex,
    src: typing.SupportsInt | typing.SupportsIndex = 0,
) -> None:
    """
    Overwrites `tensors` with their values on rank `src`, in flat buffers of buffer_size.
    """

def _check_reduce_op(op: ReduceOp, dtype: str) -> None:
    """
    Raises ValueError unless `op` can reduce elements of the dtype named `dtype`.
    """

def _compute_bucket_assignment_by_size(
    tensors: typing.Any,
    bucket_size_limits: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
    expect_sparse_gradient: collections.abc.Sequence[bool] = [],
    tensor_indices: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = [],
    logger: typing.Any = None,
) -> tuple[list[list[int]], list[int]]:
    """
    Groups tensors into buckets by dtype and size; returns (bucket indices, size limits).
    """

def _create_auto_backend(
    store: Store,
    rank: typing.SupportsInt | typing.SupportsIndex,
    size: typing.SupportsInt | typing.SupportsIndex,
    timeout: datetime.timedelta,
) -> _Backend:
    """
    The shm backend when every rank runs on this host, else the hierarchical one.
    """

def _create_work_from_future(future: Future) -> Work:
    """
    A Work that completes when the future does.
    """

def _dump_trace_json(include_completed: bool = True, only_active: bool = False) -> str:
    """
    This process's flight-recorder trace (the last C10D_TRACE_BUFFER_SIZE operations) as JSON.
    """

def _dump_trace_to_file(reason: str = "on demand") -> str:
    """
    Writes the trace to <C10D_TRACE_DUMP_DIR>/c10d_trace_<job>_rank<rank>.json; returns the path.
    """

def _empty(
    sizes: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
    dtype: str = "float32",
) -> typing.Any:
    """
    Uninitialised, 64-byte aligned storage allocated by c10d.
    """

def _env_registry() -> list:
    """
    Every environment variable c10d reads: (name, default, documentation).
    """

def _finalize_avg_buffer(
    data: typing_extensions.Buffer,
    world_size: typing.SupportsInt | typing.SupportsIndex,
    dtype: str,
) -> None:
    """
    data[i] /= world_size, as AVG's post-step does (integers truncate).
    """

def _get_handler(name: str) -> collections.abc.Callable:
    """
    The handler registered under name, callable as f(request, response).
    """

def _get_handler_names() -> list[str]:
    """
    The names of every registered handler.
    """

def _make_nccl_premul_sum(factor: typing.SupportsFloat | typing.SupportsIndex) -> ReduceOp:
    """
    A PREMUL_SUM ReduceOp: every input is multiplied by `factor` before summing.
    """

def _make_premul_sum(factor: typing.SupportsFloat | typing.SupportsIndex) -> ReduceOp:
    """
    A PREMUL_SUM ReduceOp: every input is multiplied by `factor` before summing.
    """

def _reduce_buffers(
    dst: typing_extensions.Buffer, src: typing_extensions.Buffer, op: ReduceOp, dtype: str
) -> None:
    """
    dst[i] = dst[i] (op) src[i] for two contiguous buffers of the named dtype.
    """

def _register_builtin_comm_hook(reducer: Reducer, comm_hook_type: BuiltinCommHookType) -> None: ...
def _register_comm_hook(
    reducer: Reducer, state: typing.Any, comm_hook: collections.abc.Callable
) -> None:
    """
    Registers comm_hook(state, bucket) -> Future, whose value is the reduced bucket buffer.
    """

def _register_handler(name: str, handler: collections.abc.Callable) -> None:
    """
    Registers handler(request, response) under name for every worker server of this process. It runs on a server thread (holding the GIL); an exception becomes a 500.
    """

def _register_process_group(group_name: str, group: ProcessGroup) -> None: ...
def _registered_process_groups() -> list[str]: ...
def _resolve_process_group(group_name: str) -> ProcessGroup: ...
def _scale_buffer(
    data: typing_extensions.Buffer, factor: typing.SupportsFloat | typing.SupportsIndex, dtype: str
) -> None:
    """
    data[i] *= factor, as PREMUL_SUM's pre-step does.
    """

def _set_global_rank(rank: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    The rank c10d's log lines name this process by ("[c10d rank 3 WARNING] ...").
    """

def _set_profiler_bridge(
    recording: typing.SupportsInt | typing.SupportsIndex, open: collections.abc.Callable
) -> None:
    """
    Makes every dispatched operation a torch profiler event while `recording` (the address of torch's C++ bool() 'this thread profiles') says so: open(name, shapes) opens one and returns what closes it.
    """

def _set_trace_job(job: str) -> None:
    """
    Names the job this process belongs to in its flight-recorder dumps (init_process_group sets it).
    """

def _shm_alias_count() -> int:
    """
    Number of arrays whose pages live in a shared heap of this process (for tests).
    """

def _tensor_info(tensor: typing.Any) -> dict:
    """
    Describes how c10d sees a tensor-like object (for tests).
    """

def _test_python_store(store: Store) -> None:
    """
    Runs a fixed sequence of operations on a store through its C++ interface.
    """

def _to_dlpack(tensor: typing.Any) -> typing_extensions.CapsuleType:
    """
    A zero-copy DLPack capsule of a tensor-like object.
    """

def _trace_job() -> str:
    """
    The job named in this process's flight-recorder dumps.
    """

def _unregister_all_process_groups() -> None: ...
def _unregister_process_group(group_name: str) -> None: ...
def _verify_params_across_processes(
    process_group: ProcessGroup, params: typing.Any, logger: typing.Any = None
) -> None:
    """
    Raises if this rank's parameters differ in count, dtype or shape from rank 0's.
    """

def get_debug_level() -> DebugLevel:
    """
    The current debug level.
    """

def set_debug_level(level: DebugLevel) -> None:
    """
    Sets the debug level.
    """

def set_debug_level_from_env() -> None:
    """
    Sets the debug level from TORCH_DISTRIBUTED_DEBUG (OFF, INFO or DETAIL).
    """

_DEFAULT_FIRST_BUCKET_BYTES: int = 1048576
_DEFAULT_PG_TIMEOUT: datetime.timedelta
__version__: str = "0.1.0"
_StoreCollectives = StoreCollectives
