"""c10d: torch.distributed's communication layer for CPU programs, without PyTorch.

Stores, process groups, backends and collectives work on numpy arrays and on any object that
exposes the buffer protocol or ``__dlpack__`` (PyTorch CPU tensors included), so that
``import c10d as dist`` can stand in for ``import torch.distributed as dist``.
"""

from . import _C
from ._C import _dump_trace_json, _dump_trace_to_file  # noqa: F401  (flight recorder)
from ._C import _make_nccl_premul_sum  # noqa: F401  (as torch.distributed has it)
from ._C import (  # noqa: F401  (data-parallel gradient reduction, as torch.distributed has it)
    _DEFAULT_FIRST_BUCKET_BYTES,
    BuiltinCommHookType,
    GradBucket,
    _broadcast_coalesced,
    _compute_bucket_assignment_by_size,
    _register_builtin_comm_hook,
    _register_comm_hook,
    _verify_params_across_processes,
)
from ._C import (  # noqa: F401  (re-exported API)
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    DebugLevel,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistQueueEmptyError,
    DistStoreError,
    DistStoreTimeoutError,
    DistTimeoutError,
    DistTypeError,
    DistValueError,
    FakeProcessGroup,
    FileStore,
    Future,
    GatherOptions,
    HashStore,
    OpType,
    PrefixStore,
    ProcessGroup,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
    StoreCollectives,
    TCPStore,
    Work,
    WorkInfo,
    get_debug_level,
    set_debug_level,
    set_debug_level_from_env,
)

QueueEmptyError = DistQueueEmptyError  # torch.distributed's name for it
from ._binding_additions import (  # noqa: F401,E402  (bindings torch has and _C lacks)
    _DEFAULT_NO_TIMEOUT,
    _DEFAULT_PG_NCCL_TIMEOUT,
    DDPLoggingData,
    Logger,
    Reducer,
    _DistributedBackendOptions,
    _hash_tensors,
    _register_work,
    _set_global_rank,
    _set_thread_isolation_mode,
    _SymmetricMemory,
    _test_python_store,
)
from .distributed_c10d import *  # noqa: F401,F403
from .distributed_c10d import (  # noqa: F401  (private names tests and tools use)
    _all_gather_base,
    _coalescing_manager,
    _CoalescingManager,
    _get_default_group,
    _get_default_store,
    _get_process_group_store,
    _reduce_scatter_base,
    _rank_not_in_group,
    _world,
    is_available,
    is_shm_available,
)
from .rendezvous import register_rendezvous_handler, rendezvous  # noqa: F401
from . import control  # noqa: F401,E402  (registers the dump_traceback handler)
from .shm import shm_empty  # noqa: F401
from . import futures  # noqa: F401,E402  (collect_all, wait_all)

_Work = Work  # torch.distributed's name for the base of custom backends' Work classes
from .device_mesh import DeviceMesh, init_device_mesh  # noqa: F401,E402

if hasattr(_C, "ProcessGroupGloo"):
    from ._C import ProcessGroupGloo  # noqa: F401
if hasattr(_C, "ProcessGroupShm"):
    from ._C import ProcessGroupShm  # noqa: F401
from ._C import _Backend  # noqa: F401,E402  (torch.distributed's name for the backend base)

__version__ = _C.__version__


def _load_torch_bridge():
    from . import torch_backend

    return torch_backend


# distributed_c10d loads torch's view of its groups this way when the program uses torch: it
# cannot import torch_backend itself (torch_backend imports it).
from . import distributed_c10d as _distributed_c10d  # noqa: E402

_distributed_c10d._load_torch_bridge = _load_torch_bridge

from . import _profiling  # noqa: E402

_profiling.watch_for_torch()  # torch's profiler records c10d's operations once torch loads


def __getattr__(name):
    # DistributedDataParallel wraps torch modules: torch is imported on first use only.
    if name == "DistributedDataParallel":
        from .parallel import DistributedDataParallel

        return DistributedDataParallel
    if name == "ProcessGroupMPI":  # its module links the MPI library: loaded on first use
        from . import _mpi_loader

        if _mpi_loader.module() is not None:
            return _mpi_loader.module().ProcessGroupMPI
    from ._binding_additions import gpu_only_error

    raise gpu_only_error(name) or AttributeError(f"module 'c10d' has no attribute '{name}'")


def env_variables():
    """Every environment variable c10d reads, as (name, default, documentation) tuples."""
    return list(_C._env_registry())


# The public API (what `from c10d import *` binds and the API reference lists): every public
# name above but the submodules. DistributedDataParallel and ProcessGroupMPI are left out:
# they load torch and the MPI library on first use, which a star import must not do.
__all__ = sorted(
    name
    for name, value in list(globals().items())
    if not name.startswith("_") and type(value) is not type(_C)  # type(): reduce_op warns
)
