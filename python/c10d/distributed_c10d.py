"""The torch.distributed API on c10d: process-group state, groups and collectives.

Tensors are numpy arrays or anything with the buffer protocol or ``__dlpack__`` (PyTorch CPU
tensors included); they are used in place, never copied on the way in.

One module of about 2,000 lines, as torch's ``torch.distributed.distributed_c10d``: programs
import its private names from it (``_get_default_group``, ``_world``, ``_pg_map``, ...) and
patch its module-level state, which only works while that state lives in one module.
"""

import atexit
import collections
import contextlib
import hashlib
import io
import os
import pickle
import sys
import time
import uuid
import warnings
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _C, _mpi_loader
from . import rendezvous as _rdzv
from ._binding_additions import _DistributedBackendOptions
from ._C import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroup,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
    Work,
)

default_pg_timeout = _C._DEFAULT_PG_TIMEOUT


# Bad arguments raise these: a ValueError (TypeError) that is also a RuntimeError, since
# torch.distributed raises RuntimeError for the checks its C++ layer makes (and older releases
# for most Python ones) and ValueError/TypeError for others.
_DistValueError = _C.DistValueError
_DistTypeError = _C.DistTypeError


class _ArgumentError(_DistValueError, AssertionError):
    """A bad argument. Also an AssertionError where torch uses assert."""


class _ShortListError(_DistValueError, IndexError):
    """A list with fewer entries than needed (or none). Also an IndexError, which torch raises
    there."""


# --------------------------------------------------------------------------------------------
# Backend names and configuration


class Backend(str):
    """A backend name: ``Backend("GLOO") == "gloo"``. Unknown names pass through lower-cased
    (they may name a backend registered with :meth:`register_backend`)."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    SHM = "shm"
    FAKE = "fake"
    # shm within each host, Gloo between hosts; "auto" (also what no backend means): shm when
    # every rank runs on one host, else hier.
    HIER = "hier"
    AUTO = "auto"

    _BackendPlugin = collections.namedtuple("_BackendPlugin", ["creator_fn", "extended_api"])
    _plugins: Dict[str, "_BackendPlugin"] = {}

    backend_list = [UNDEFINED, GLOO, NCCL, UCC, MPI, XCCL, SHM, HIER, AUTO]
    default_device_backend_map = {"cpu": GLOO}
    backend_capability: Dict[str, List[str]] = {
        GLOO: ["cpu"],
        SHM: ["cpu"],
        MPI: ["cpu"],
        FAKE: ["cpu"],
        HIER: ["cpu"],
        AUTO: ["cpu"],
    }
    backend_type_map: Dict[str, int] = {
        UNDEFINED: 0,
        GLOO: 1,
        NCCL: 2,
        UCC: 3,
        MPI: 4,
        XCCL: 5,
        FAKE: 6,
        SHM: 7,
        HIER: 8,
        AUTO: 9,
    }

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise _DistValueError(f"Backend name must be a string, got {type(name).__name__}")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        if value == Backend.UNDEFINED:
            value = name.lower()
        return str.__new__(cls, value)

    @classmethod
    def register_backend(cls, name: str, func: Callable, extended_api: bool = False, devices=None):
        """Registers a backend written outside c10d. ``func(store, rank, world_size, timeout)``
        (or ``func(backend_options, pg_options)`` with ``extended_api``) returns a
        ProcessGroup (for example a Python subclass) or a backend object. Registering a name
        again replaces its creator, as in torch (c10d's own backends are still built in)."""
        if not isinstance(name, str):
            raise _DistValueError(f"Backend name must be a string, got {type(name).__name__}")
        if not hasattr(Backend, name.upper()):
            setattr(Backend, name.upper(), name.lower())
        if name.lower() not in Backend.backend_list:
            Backend.backend_list.append(name.lower())
        if devices is None:
            devices = ["cpu"]
        elif isinstance(devices, str):
            devices = [devices]
        Backend.backend_capability[name.lower()] = list(devices)
        for device in devices:
            Backend.default_device_backend_map.setdefault(device, name.lower())
        Backend.backend_type_map.setdefault(name.lower(), len(Backend.backend_type_map) + 100)
        Backend._plugins[name.upper()] = Backend._BackendPlugin(func, extended_api)


class BackendConfig:
    """Which backend serves each device type, parsed from "gloo" or "cpu:gloo,cuda:nccl"."""

    def __init__(self, backend):
        self.device_backend_map: Dict[str, str] = {}
        backend = str(backend)
        if backend == Backend.UNDEFINED:
            self.device_backend_map = {
                "cpu": Backend.AUTO if is_backend_available(Backend.AUTO) else Backend.GLOO
            }
        elif (
            backend.lower() in Backend.backend_list
            or backend.upper() in Backend._plugins
            or backend.lower() in (Backend.FAKE,)
        ):
            name = Backend(backend)
            devices = Backend.backend_capability.get(name, ["cpu"])
            self.device_backend_map = {device: name for device in devices}
        elif ":" in backend:
            for pair in backend.lower().split(","):
                if ":" not in pair:
                    raise _DistValueError(
                        f"Invalid backend string {backend!r}: expected entries "
                        f"'<device>:<backend>' separated by commas"
                    )
                device, name = (part.strip() for part in pair.split(":", 1))
                self.device_backend_map[device] = Backend(name)
        else:
            raise _DistValueError(
                f"Invalid backend: {backend!r}. Use one of "
                f"{sorted(set(Backend.backend_list) - {'undefined'})}, a backend "
                f"registered with Backend.register_backend, or a string like "
                f"'cpu:gloo'."
            )

    def __repr__(self):
        return ",".join(f"{device}:{name}" for device, name in self.device_backend_map.items())

    def get_device_backend_map(self) -> Dict[str, str]:
        return self.device_backend_map


def get_default_backend_for_device(device) -> str:
    """The backend a group uses for `device` ("cpu", or a torch.device) when none is named."""
    device = str(device).split(":")[0]
    if device not in Backend.default_device_backend_map:
        raise _DistValueError(f"Default backend not registered for device: {device}")
    return Backend.default_device_backend_map[device]


def supports_complex(reduceOp) -> bool:
    """Whether `reduceOp` is defined on complex tensors."""
    return reduceOp not in (
        ReduceOp.MAX,
        ReduceOp.MIN,
        ReduceOp.PRODUCT,
        ReduceOp.BAND,
        ReduceOp.BOR,
        ReduceOp.BXOR,
    )


class _ReduceOpAlias:
    """Deprecated ``reduce_op`` namespace: forwards to ReduceOp with a warning."""

    def __getattribute__(self, name):
        warnings.warn(
            "c10d.reduce_op is deprecated; use c10d.ReduceOp instead", FutureWarning, stacklevel=2
        )
        return getattr(ReduceOp, name)


reduce_op = _ReduceOpAlias()
_reduce_op = _ReduceOpAlias  # torch's name of the class


# --------------------------------------------------------------------------------------------
# Global state


# Each group's inline entry points (ProcessGroup._inline_ops), by operation: group -> function,
# the default group's also under None. Synchronous collectives and point-to-point calls try
# them first; they return False (nothing done) when the inline path does not apply. Rooted
# ones and point to point use them for the default group only, where global and group ranks
# agree. One table per operation, so a call
# costs one dict lookup (a namespace per group cost ~22 ns more of a ~0.5 us all_reduce).
_INLINE: Dict[str, Dict[Any, Any]] = {
    name: {}
    for name in (
        "allreduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "gather",
        "scatter",
        "barrier",
        "send",
        "recv",
        "isend",
        "irecv",
    )
}
_inline_allreduce = _INLINE["allreduce"]
_inline_broadcast = _INLINE["broadcast"]
_inline_reduce = _INLINE["reduce"]
_inline_all_gather = _INLINE["all_gather"]
_inline_all_gather_into_tensor = _INLINE["all_gather_into_tensor"]
_inline_reduce_scatter = _INLINE["reduce_scatter"]
_inline_reduce_scatter_tensor = _INLINE["reduce_scatter_tensor"]
_inline_all_to_all_single = _INLINE["all_to_all_single"]
_inline_gather = _INLINE["gather"]
_inline_scatter = _INLINE["scatter"]
_inline_barrier = _INLINE["barrier"]
_inline_send = _INLINE["send"]
_inline_recv = _INLINE["recv"]
_inline_isend = _INLINE["isend"]
_inline_irecv = _INLINE["irecv"]


class _WorldMeta(type):
    @property
    def WORLD(cls) -> Optional[ProcessGroup]:
        return _world.default_pg

    @WORLD.setter
    def WORLD(cls, pg):
        _world.set_default(pg)


class GroupMember(metaclass=_WorldMeta):
    """``GroupMember.WORLD`` is the default group; ``NON_GROUP_MEMBER`` is what new_group
    returns on ranks outside the new group."""

    NON_GROUP_MEMBER = -100


class group(metaclass=_WorldMeta):
    """``group.WORLD`` is the default process group."""


class _World:
    def __init__(self):
        self.default_pg: Optional[ProcessGroup] = None
        self.pg_map: Dict[ProcessGroup, Tuple[str, Store]] = {}
        self.pg_names: Dict[ProcessGroup, str] = {}
        self.pg_group_ranks: Dict[ProcessGroup, Dict[int, int]] = {}
        self.pg_backend_config: Dict[ProcessGroup, str] = {}
        self.group_count = 0
        self.pg_default_device: Dict[ProcessGroup, str] = {}
        # Tags name groups for the functional collectives: "ptd:<group name>" by default,
        # "user:<tag>" for groups made with one; "" lists every group made without a tag.
        self.tags_to_pg: Dict[str, List[ProcessGroup]] = {}
        self.pg_to_tag: Dict[ProcessGroup, str] = {}
        # The collectives a _coalescing_manager block deferred, per group.
        self.pg_coalesce_state: Dict[ProcessGroup, List["_CollOp"]] = {}
        for table in _INLINE.values():
            table.clear()

    def reset(self):
        self.__init__()

    def add_group(self, pg) -> None:
        # Not for Python subclasses: they may override allreduce.
        if type(pg) is ProcessGroup:
            for name, fn in pg._inline_ops().items():
                _INLINE[name][pg] = fn

    def set_default(self, pg) -> None:
        self.default_pg = pg
        for table in _INLINE.values():
            table.pop(None, None)
            if pg in table:
                table[None] = table[pg]

    def drop_group(self, pg) -> None:
        for table in (
            self.pg_map,
            self.pg_names,
            self.pg_group_ranks,
            self.pg_backend_config,
            self.pg_to_tag,
            self.pg_coalesce_state,
            *_INLINE.values(),
        ):
            table.pop(pg, None)
        for groups in self.tags_to_pg.values():  # emptied tags stay, as in torch
            if pg in groups:
                groups.remove(pg)

    def add_tag(self, pg, tag: Optional[str], group_name: str) -> None:
        if tag:
            tag = tag if tag.startswith(("user:", "ptd:")) else f"user:{tag}"
        else:
            self.tags_to_pg.setdefault("", []).append(pg)
            tag = f"ptd:{group_name}"
        self.tags_to_pg.setdefault(tag, []).append(pg)
        self.pg_to_tag[pg] = tag


_world = _World()

# The module-level names of the group registry that scripts written for torch read
# (``distributed_c10d._pg_map`` ...): the current tables of _world, looked up at each access
# since destroy_process_group() starts new ones.
_WORLD_ATTRIBUTES = {
    "_pg_map": "pg_map",
    "_pg_names": "pg_names",
    "_pg_group_ranks": "pg_group_ranks",
    "_pg_backend_config": "pg_backend_config",
    "_group_count": "group_count",
    "_default_pg": "default_pg",
    "_tags_to_pg": "tags_to_pg",
    "_pg_to_tag": "pg_to_tag",
}


def __getattr__(name: str):
    if name == "_MPI_AVAILABLE":  # torch's constant, computed when read: it loads c10d._mpi
        return is_mpi_available()
    attribute = _WORLD_ATTRIBUTES.get(name)
    if attribute is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_world, attribute)


def _get_default_group() -> ProcessGroup:
    if _world.default_pg is None:
        raise _DistValueError(
            "Default process group has not been initialized, please make sure "
            "to call init_process_group."
        )
    return _world.default_pg


def _update_default_pg(pg) -> None:
    """Makes `pg` the default group (None: no default group)."""
    _world.set_default(pg)


def _get_default_store():
    """The store the default group was created on."""
    return _world.pg_map[_get_default_group()][1]


def _get_process_group_store(pg: ProcessGroup):
    """The store `pg` runs on (its own prefix of the default store)."""
    return _world.pg_map[pg][1]


# c10d.torch_backend, torch's view of c10d's groups, once loaded (it sets this on import). It
# imports this module, so this one reaches it only through _torch_bridge and
# _load_torch_bridge, which the package sets (c10d/__init__.py).
_torch_bridge: Any = None
_load_torch_bridge: Optional[Callable[[], Any]] = None


def _c10d_group(group):
    """`group`, or the c10d group that a torch group stands for (torch's view of a c10d group,
    made by c10d.torch_backend), so torch's groups can be handed to c10d as c10d's to torch."""
    bridge = _torch_bridge
    if bridge is not None and isinstance(group, bridge.ProcessGroupC10d):
        return group._pg
    return group


def _resolve_group(group) -> ProcessGroup:
    return _get_default_group() if group is None else _c10d_group(group)


def _rank_not_in_group(group) -> bool:
    if group is None:
        return False
    return group is GroupMember.NON_GROUP_MEMBER or (
        isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER
    )


def _warn_not_in_group(op_name: str) -> None:
    warnings.warn(
        f"Running {op_name} on global rank {get_rank()} which does not belong to the given group.",
        stacklevel=3,
    )


def is_initialized() -> bool:
    """Whether init_process_group has made the default group (and it was not destroyed)."""
    return _world.default_pg is not None


def is_available() -> bool:
    """Whether the distributed package works here: always, for c10d."""
    return True


def is_gloo_available() -> bool:
    """Whether this build of c10d has the Gloo backend."""
    return hasattr(_C, "ProcessGroupGloo")


def is_mpi_available() -> bool:
    """Whether the MPI backend can run: this build has it and the host's MPI library loads."""
    # Loads c10d._mpi (and with it the MPI library) the first time.
    return _mpi_loader.module() is not None


def is_shm_available() -> bool:
    """Whether this build of c10d has the shared-memory backend."""
    return hasattr(_C, "ProcessGroupShm")


def is_nccl_available() -> bool:
    """False: NCCL needs CUDA GPUs, and c10d runs on CPUs."""
    return False


def is_ucc_available() -> bool:
    """False: c10d has no UCC backend."""
    return False


def is_xccl_available() -> bool:
    """False: XCCL needs Intel GPUs, and c10d runs on CPUs."""
    return False


# Which backends this build has, as module constants (torch's names; read once at import).
_GLOO_AVAILABLE = is_gloo_available()
_NCCL_AVAILABLE = _UCC_AVAILABLE = _XCCL_AVAILABLE = False
PG_WRAPPER_STORE_PREFIX = "pg_wrapper"
_backend: Optional[str] = None  # torch's deprecated global, never set
_default_pg_init_method: Optional[str] = None


def _check_single_backend_availability(backend_name: str) -> bool:
    """Whether one backend (a name, no device map) is available."""
    return is_backend_available(backend_name)


def is_backend_available(backend: str) -> bool:
    """Whether `backend` (a built-in name or one registered with Backend.register_backend)
    can be used here."""
    name = str(backend).lower()
    checks = {
        "gloo": is_gloo_available,
        "mpi": is_mpi_available,
        "shm": is_shm_available,
        "nccl": is_nccl_available,
        "ucc": is_ucc_available,
        "xccl": is_xccl_available,
        "fake": lambda: True,
        "hier": lambda: hasattr(_C, "ProcessGroupHier"),
        "auto": lambda: hasattr(_C, "ProcessGroupHier"),
    }
    if name in checks:
        return checks[name]()
    return name.upper() in Backend._plugins


def is_torchelastic_launched() -> bool:
    """Whether a torchelastic-style launcher (c10drun, torchrun) started this process."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank among those of its node (LOCAL_RANK from the launcher), else
    `fallback_rank`; raises RuntimeError when there is neither."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank "
        "to allow `get_node_local_rank` to work, assuming you are not running "
        "in a multi-device context and want the code to run locally instead."
    )


def get_pg_count() -> int:
    """How many process groups were created (the default group included)."""
    return _world.group_count


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This process's rank in `group` (default: the world), or -1 if it is not a member."""
    if _rank_not_in_group(group):
        return -1
    default = _get_default_group()
    if group is None or group is GroupMember.WORLD:
        return default.rank()
    return get_group_rank(group, default.rank())


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """The number of ranks in `group` (default: the world), or -1 if this process is not in it."""
    if _rank_not_in_group(group):
        return -1
    return _resolve_group(group).size()


def get_backend(group: Optional[ProcessGroup] = None) -> Backend:
    """The name of the backend `group` (default: the world) was created with."""
    pg = _resolve_group(group)
    if _rank_not_in_group(pg):
        raise _DistValueError("Invalid process group specified")
    entry = _world.pg_map.get(pg)
    if entry is None:
        raise _DistValueError("Invalid process group specified")
    return Backend(entry[0])


def get_backend_config(group: Optional[ProcessGroup] = None) -> str:
    """`group`'s backend per device, as torch writes it ("cpu:gloo")."""
    pg = _resolve_group(group)
    if _rank_not_in_group(pg):
        raise _DistValueError("Invalid process group specified")
    return str(_world.pg_backend_config[pg])


def _group_ranks(group: ProcessGroup) -> Dict[int, int]:
    group = _c10d_group(group)
    if group is None or group is GroupMember.WORLD:
        group = _get_default_group()
    if group not in _world.pg_group_ranks:
        raise _DistValueError(
            f"Group {group} is not registered, please create group with c10d.new_group API"
        )
    return _world.pg_group_ranks[group]


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """The rank in `group` of the process with global rank `global_rank` (itself for the
    default group, unchecked, as in torch)."""
    if group is not None and group is GroupMember.WORLD:
        return global_rank
    ranks = _group_ranks(group)
    if global_rank not in ranks:
        raise _DistValueError(f"Global rank {global_rank} is not part of group {group}")
    return ranks[global_rank]


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The global rank of the process with rank `group_rank` in `group` (itself for the
    default group)."""
    if group is not None and group is GroupMember.WORLD:
        return group_rank
    for global_rank, rank in _group_ranks(group).items():
        if rank == group_rank:
            return global_rank
    raise _DistValueError(f"Group rank {group_rank} is not part of group {group}")


def get_process_group_ranks(group: Optional[ProcessGroup]) -> List[int]:
    """The global ranks of `group`'s members, ordered by group rank."""
    ranks = _group_ranks(group)
    return [g for g, _ in sorted(ranks.items(), key=lambda item: item[1])]


def _canonical_rank(group, group_rank, global_rank, name, required=True) -> Optional[int]:
    """Resolves the pair (group_X, X) of arguments into a rank of `group`."""
    if group_rank is not None:
        if global_rank is not None:
            raise _DistValueError(f"Can't specify both group_{name} and {name}")
        return group_rank
    if global_rank is None:
        if required:
            raise _DistValueError(f"Must specify either group_{name} or {name}")
        return None
    if group is None or group is GroupMember.WORLD:
        return global_rank
    return get_group_rank(group, global_rank)


# torch's name for it (GroupMember.WORLD is the default group itself).
_group_or_default_group = _resolve_group


def _get_group_size(group) -> int:
    """The size of `group` (the default group for None or WORLD)."""
    return _group_or_default_group(group).size()


def _get_process_group_name(pg: ProcessGroup) -> str:
    """The name `pg` was registered under ("None" for an unknown group, as in torch)."""
    return _world.pg_names.get(pg, "None")


def _resolve_process_group(group_name: str) -> ProcessGroup:
    """The live group registered as `group_name`."""
    for pg, name in _world.pg_names.items():
        if name == group_name:
            return pg
    raise _DistValueError(
        f"Could not resolve the process group registered under the name {group_name}"
    )


def _get_group_size_by_name(group_name: str) -> int:
    return _resolve_process_group(group_name).size()


def _get_global_rank(group, rank) -> int:
    """Deprecated spelling of get_global_rank."""
    warnings.warn(
        "`c10d.distributed_c10d._get_global_rank` is deprecated, please use "
        "`c10d.distributed_c10d.get_global_rank` instead",
        FutureWarning,
        stacklevel=2,
    )
    return get_global_rank(group, rank)


def _canonicalize_group_rank(
    group: ProcessGroup,
    global_rank: Optional[int] = None,
    group_rank: Optional[int] = None,
    return_global: bool = False,
) -> int:
    """Either rank of a process in `group` from the one given: its group rank, or its global
    rank with return_global."""
    if group_rank is not None:
        if global_rank is not None:
            raise _DistValueError("Can't specify both group_rank and global_rank")
        return get_global_rank(group, group_rank) if return_global else group_rank
    if global_rank is None:
        raise _DistValueError("Must specify global_rank or group_rank")
    return global_rank if return_global else get_group_rank(group, global_rank)


def _check_not_self_rank(group: ProcessGroup, rank: int, rank_type: str) -> None:
    if group.rank() == rank:
        raise _DistValueError(
            f"Invalid {rank_type} rank: {rank_type} rank should not be the "
            f"same as the rank of the current process."
        )


def _device_capability(group: Optional[ProcessGroup] = None) -> List[str]:
    """The device types `group`'s backends serve ("cpu", ...)."""
    return [d.split(":")[0] for d in _group_or_default_group(group)._device_types()]


def _get_object_coll_device(group: Optional[ProcessGroup] = None) -> str:
    """The device type object collectives and barriers of `group` run on: "cpu" whenever a
    backend of the group serves it (objects are pickled into host memory)."""
    types_ = _device_capability(group)
    return "cpu" if not types_ or "cpu" in types_ else types_[0]


def _get_pg_default_device(group: Optional[ProcessGroup] = None) -> str:
    """Deprecated: the device type of `group` (see _get_object_coll_device)."""
    warnings.warn(
        "`_get_pg_default_device` will be deprecated: use `_get_object_coll_device` "
        "for object collectives and `_device_capability` for a group's device types",
        stacklevel=2,
    )
    if not _device_capability(group):
        raise RuntimeError(
            "Default device not found, because no backend has been registered "
            "with this ProcessGroup."
        )
    return _get_object_coll_device(group)


def _get_pg_config(group: Optional[ProcessGroup] = None) -> Dict[str, Any]:
    """Name, description, backend configuration, size and global ranks of `group`."""
    pg = _group_or_default_group(group)
    return {
        "pg_name": _get_process_group_name(pg),
        "pg_desc": pg.group_desc,
        "backend_config": get_backend_config(pg),
        "pg_size": pg.size(),
        "ranks": get_process_group_ranks(pg),
    }


def _get_all_pg_configs() -> List[Dict[str, Any]]:
    return [_get_pg_config(pg) for pg in _world.pg_map]


STORE_BASED_BARRIER_PREFIX = "store_based_barrier_key"


def _is_barrier_after_init() -> int:
    """Whether groups run a barrier once created (TORCH_DIST_INIT_BARRIER, off by default)."""
    return int(os.getenv("TORCH_DIST_INIT_BARRIER", "0"))


def _store_based_barrier(
    rank, store, group_name, rendezvous_count, timeout, logging_interval=timedelta(seconds=10)
) -> None:
    """Waits until `rendezvous_count` processes called this with the same `group_name` on
    `store`, or raises DistStoreError after `timeout` naming how many arrived.
    (`logging_interval`, torch's progress logging, is accepted and unused.)"""
    key = f"{STORE_BASED_BARRIER_PREFIX}:{group_name}"
    last_worker = f"{key}:last_worker"
    if store.add(key, 1) == rendezvous_count:
        store.set(last_worker, "1")
    try:
        store.wait([last_worker], timeout)
    except _C.DistTimeoutError as e:  # other errors (a store gone) are the caller's
        joined = store.add(key, 0)
        raise _C.DistStoreError(
            f"Timed out initializing process group in store based barrier on rank {rank}, "
            f"for key: {key} (world_size={rendezvous_count}, num_workers_joined={joined}, "
            f"timeout={timeout} error={e})"
        ) from None


def _get_process_group_uid(pg: ProcessGroup) -> int:
    """NCCL's communicator id in torch; no c10d backend has one."""
    return -1


# --------------------------------------------------------------------------------------------
# Creating and destroying groups


def _check_valid_timeout(timeout: Any) -> None:
    if not isinstance(timeout, timedelta):
        raise _DistTypeError(
            f"Expected timeout argument to be of type datetime.timedelta, got {timeout!r}"
        )


def _get_default_timeout(backend) -> timedelta:
    """The timeout groups of `backend` get when none is given (the same for every backend)."""
    return default_pg_timeout


def _timeout_or_default(timeout) -> timedelta:
    if timeout is None:
        return default_pg_timeout
    _check_valid_timeout(timeout)
    return timeout


def _create_backend(
    name: str,
    store,
    rank: int,
    size: int,
    timeout: timedelta,
    pg_options,
    global_ranks=(),
    group_name: str = "",
):
    if name == Backend.GLOO:
        if not is_gloo_available():
            raise RuntimeError("Backend gloo is not available in this build of c10d")
        return _C.ProcessGroupGloo(store, rank, size, timeout)
    if name == Backend.FAKE:
        return _C.FakeProcessGroup(rank, size)
    if name == Backend.SHM and is_shm_available():
        return _C.ProcessGroupShm(store, rank, size, timeout)
    if name == Backend.HIER and is_backend_available(Backend.HIER):
        return _C.ProcessGroupHier(store, rank, size, timeout)
    if name == Backend.AUTO and is_backend_available(Backend.AUTO):
        return _C._create_auto_backend(store, rank, size, timeout)
    if name == Backend.MPI:
        mpi = _mpi_loader.process_group_class()  # raises, saying what is missing
        _finalize_mpi_at_exit()
        created = mpi.create(list(global_ranks), timeout)
        if created is None or (created.rank(), created.size()) != (rank, size):
            mpi_rank, mpi_size = mpi._world()
            raise _DistValueError(
                f"MPI assigns this process rank {mpi_rank} of {mpi_size}, but the group expects "
                f"rank {rank} of {size} (global ranks {list(global_ranks) or 'all'}): with the "
                f"mpi backend, rank and world_size come from the MPI launcher"
            )
        return created
    plugin = Backend._plugins.get(name.upper())
    if plugin is not None:
        if plugin.extended_api:
            options = _DistributedBackendOptions()
            options.store, options.group_rank, options.group_size = store, rank, size
            options.timeout = timeout
            options.group_id = group_name
            options.global_ranks_in_group = list(global_ranks) or list(range(size))
            return plugin.creator_fn(options, pg_options)
        return plugin.creator_fn(store, rank, size, timeout)
    if name in _GPU_BACKENDS:
        raise RuntimeError(
            f"Backend {name} needs CUDA GPUs, which c10d does not support: it "
            f"runs on CPUs only (use gloo, shm or mpi, or 'cpu:gloo' in a "
            f"backend string such as 'cpu:gloo,cuda:{name}')"
        )
    raise RuntimeError(
        f"Backend {name} is not available in this build of c10d (available: "
        f"{', '.join(b for b in ['gloo', 'shm', 'mpi'] if is_backend_available(b))})"
    )


_mpi_finalizer_registered = False
_GPU_BACKENDS = (Backend.NCCL, Backend.UCC, Backend.XCCL)


def _finalize_mpi_at_exit():
    """MPI must be finalised before the interpreter goes (mpirun reports a rank that exits
    without it), while Python callbacks of operations still in flight can run."""
    global _mpi_finalizer_registered
    if not _mpi_finalizer_registered:
        _mpi_finalizer_registered = True
        atexit.register(_mpi_loader.process_group_class()._finalize)


def _mpi_store(timeout):
    """A TCPStore for a world that MPI started: rank 0 serves it on a free port and tells the
    others where through MPI. Torch's MPI groups have no store; c10d's get one, so that
    everything built on the default store (other backends' groups, store barriers) works."""
    import socket

    mpi = _mpi_loader.process_group_class()
    _finalize_mpi_at_exit()
    rank, world_size = mpi._world()
    host = socket.gethostname()
    server = None
    if rank == 0:
        # The server listens on every interface; its own client goes through loopback.
        server = _C.TCPStore("127.0.0.1", 0, world_size, True, timeout, wait_for_workers=False)
    # (hostname, port) of the server, broadcast from rank 0 in a fixed-size buffer.
    payload = np.zeros(512, np.uint8)
    if rank == 0:
        text = pickle.dumps((host, server.port))
        payload[0] = len(text)
        payload[1 : 1 + len(text)] = np.frombuffer(text, np.uint8)
    world = mpi.create([], timeout)
    world.broadcast([payload], _opts(BroadcastOptions, True)).wait()
    del world
    if rank == 0:
        return server, rank, world_size
    server_host, port = pickle.loads(payload[1 : 1 + int(payload[0])].tobytes())
    address = "127.0.0.1" if server_host == host else server_host
    return _C.TCPStore(address, port, world_size, False, timeout), rank, world_size


def _new_process_group_helper(
    group_size,
    group_rank,
    global_ranks,
    backend,
    store,
    group_name,
    pg_options=None,
    timeout=None,
    pg_tag=None,
):
    if pg_tag:
        # The same tag and ranks again give the group made the first time, as in torch.
        existing = _find_pg_by_ranks_and_tag(pg_tag, list(global_ranks))
        if existing is not None:
            return existing
    config = BackendConfig(backend)
    timeout = _timeout_or_default(timeout)
    prefix_store = _C.PrefixStore(f"{group_name}/", store)
    pg = None
    backends = {}
    for device, name in config.get_device_backend_map().items():
        if device != "cpu" and name in _GPU_BACKENDS and not is_backend_available(name):
            # "cpu:gloo,cuda:nccl" serves CPU tensors; the GPU backend is what c10d lacks.
            continue
        created = _create_backend(
            name,
            prefix_store,
            group_rank,
            group_size,
            timeout,
            pg_options,
            global_ranks,
            group_name,
        )
        if isinstance(created, ProcessGroup):
            # A complete process group (e.g. a Python subclass of ProcessGroup): use it as is.
            pg = created
            break
        if name == Backend.AUTO:
            name = Backend(created.name())  # what "auto" picked: shm or hier
            if len(config.get_device_backend_map()) == 1:
                backend = name
        backends[device] = (name, created)
    if pg is None:
        pg = ProcessGroup(
            prefix_store,
            group_rank,
            group_size,
            str(Backend(backend)) if backend else Backend.GLOO,
            timeout,
        )
        detail = _C.get_debug_level() == _C.DebugLevel.DETAIL and is_gloo_available()
        for device, (name, created) in backends.items():
            if detail and isinstance(created, _C._Backend):
                # Every collective is first checked across ranks over a side Gloo group.
                checker = _C.ProcessGroupGloo(
                    _C.PrefixStore(f"{device}/wrapper", prefix_store),
                    group_rank,
                    group_size,
                    timeout,
                )
                created = _C._ProcessGroupWrapper(created, checker)
            pg._register_backend(device, name, created)
        if group_size > 1:
            # Nobody leaves until every rank has built its backends. After this the group no
            # longer needs the store, so a rank that finishes early cannot take the store
            # server (hosted by rank 0) away from a rank that is still connecting. The barrier
            # runs on the backends directly: it is not one of the user's collectives.
            opts = _opts(BarrierOptions, False)
            for _, created in backends.values():
                if isinstance(created, _C._Backend):
                    created.barrier(opts)
    try:
        pg._set_group_name(group_name)
        pg._set_global_ranks(list(global_ranks) if global_ranks else list(range(group_size)))
    except Exception:  # a Python ProcessGroup subclass may not support it
        pass
    _C._register_process_group(group_name, pg)
    # The group's own prefix of the store, as torch keeps it (new groups nest in it).
    _world.pg_map[pg] = (str(Backend(backend) if backend else Backend.GLOO), prefix_store)
    _world.pg_names[pg] = group_name
    _world.pg_backend_config[pg] = str(config)
    _world.add_group(pg)
    if global_ranks:
        _world.pg_group_ranks[pg] = {g: i for i, g in enumerate(global_ranks)}
    else:
        _world.pg_group_ranks[pg] = {i: i for i in range(group_size)}
    _world.add_tag(pg, pg_tag, group_name)
    return pg


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Optional[timedelta] = None,
    world_size: int = -1,
    rank: int = -1,
    store: Optional[Store] = None,
    group_name: str = "",
    pg_options: Optional[Any] = None,
    device_id: Optional[Any] = None,
) -> None:
    """Initialises the default process group. Rendezvous happens through `store` if given,
    else through `init_method` (default ``env://``: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE). Every rank must call it."""
    if _world.default_pg is not None:
        raise _DistValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise _ArgumentError("Cannot specify both init_method and store.")
    store_given = store
    timeout = _timeout_or_default(timeout)
    if backend is None:
        backend = Backend.UNDEFINED
    BackendConfig(backend)  # validate the name before any rendezvous
    if str(backend).lower() == Backend.MPI and store is None and init_method is None:
        # MPI's launcher assigns the ranks; the group needs no rendezvous.
        _mpi_loader.process_group_class()  # raises, saying what is missing
        if (world_size is not None and world_size != -1) or (rank is not None and rank != -1):
            warnings.warn(
                f"For MPI backend, world_size ({world_size}) and rank ({rank}) are "
                f"ignored since they are assigned by the MPI runtime."
            )
        store, rank, world_size = _mpi_store(timeout)
        store = _incarnation_store(store, world_size)
    elif store is not None:
        if world_size is None or world_size <= 0:
            raise _ArgumentError("world_size must be positive if using store")
        if rank is None or rank < 0:
            raise _ArgumentError("rank must be non-negative if using store")
        if rank >= world_size:
            raise _ArgumentError(f"rank {rank} must be less than world_size {world_size}")
        store = _incarnation_store(store, world_size)
    else:
        store, rank, world_size = _rendezvous_default(
            init_method, rank, world_size, timeout, group_name
        )
    if store_given is None:
        # A store c10d made may be shared with other users of its server (torch's RPC, a
        # launcher): the groups keep to a prefix of their own, as torch's do.
        store = _C.PrefixStore("default_pg", store)
    if backend == Backend.UNDEFINED:
        backend = Backend.AUTO if is_backend_available(Backend.AUTO) else Backend.GLOO
    name = group_name or str(_world.group_count)
    _world.group_count += 1
    job = _announce_job(store, rank)
    pg = _new_process_group_helper(world_size, rank, [], backend, store, name, pg_options, timeout)
    _C._set_trace_job(job if job is not None else _announced_job(store))
    pg._set_group_desc("default_pg")
    _world.set_default(pg)
    _C._set_global_rank(rank)  # c10d's log lines name the rank from here on
    _mirror_into_torch(pg, store, rank, world_size, timeout)


_JOB_KEY = "c10d/job"


def _announce_job(store, rank) -> Optional[str]:
    """The job's name in flight-recorder dumps, so that jobs sharing a dump directory keep
    apart: the launcher's run id (TORCHELASTIC_RUN_ID), else a name rank 0 makes up and
    publishes before the default group exists. None on the other ranks, which read it once
    the group exists (its creation meets rank 0 after the publication)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id
    if rank != 0:
        return None
    job = uuid.uuid4().hex[:12]
    try:
        store.set(_JOB_KEY, job)
    except Exception:  # a store that refuses it: the dumps go without a shared name
        return ""
    return job


def _announced_job(store) -> str:
    try:
        return store.get(_JOB_KEY).decode() if store.check([_JOB_KEY]) else ""
    except Exception:
        return ""


def _mirror_into_torch(pg, store, rank, world_size, timeout) -> None:
    """When the program has loaded torch, torch.distributed's default group becomes this same
    group (c10d.torch_backend), so torch utilities asking torch for the world (DistributedSampler,
    ZeroRedundancyOptimizer) work unchanged. torch is never imported here."""

    if "torch" not in sys.modules or (_torch_bridge is None and _load_torch_bridge is None):
        return
    try:
        bridge = _torch_bridge or _load_torch_bridge()
        bridge._mirror_default_group(pg, store, rank, world_size, _world.pg_map[pg][0], timeout)
    except Exception as e:  # c10d's group stands without torch's view of it
        warnings.warn(
            f"c10d: torch.distributed's default group could not be made c10d's default group: {e!r}"
        )


def _unmirror_from_torch() -> None:
    """Destroys torch.distributed's default group if it is c10d's (see _mirror_into_torch)."""

    if _torch_bridge is not None:
        _torch_bridge._unmirror()


def _rendezvous_default(init_method, rank, world_size, timeout, group_name):
    """The default group's store, rank and world size from `init_method`, once every rank
    joined. A rank that is not the store's host may reach the previous incarnation's server
    (its host is still in destroy_process_group() when this rank is already back in init):
    when the server goes away before everyone joined, this rank joins again if a server takes
    its place within a few seconds, and otherwise reports the loss."""
    deadline = time.monotonic() + timeout.total_seconds()
    lost = None  # the first loss of the store, reported if no new server comes
    while True:
        joined_as = rank if rank is not None and rank >= 0 else None
        left = max(0.001, deadline - time.monotonic())
        try:
            store, joined_as, size = next(
                _rdzv.rendezvous(
                    init_method or "env://",
                    -1 if rank is None else rank,
                    -1 if world_size is None else world_size,
                    timeout=timedelta(seconds=left if lost is None else min(left, _REJOIN_S)),
                )
            )
            store.set_timeout(timeout)
            store = _incarnation_store(store, size)
            _rdzv.store_based_barrier(
                store, joined_as, size, timeout, key=f"c10d/init/{group_name or _world.group_count}"
            )
            return store, joined_as, size
        except (_C.DistNetworkError, _C.DistStoreError) as e:
            if lost is not None:
                raise lost from e
            if isinstance(e, _C.DistTimeoutError):
                raise
            if joined_as is None:
                joined_as = int(os.environ.get("RANK", "0") or 0)
            # Rank 0 hosts the store: for it a lost store is the end.
            if joined_as == 0 or time.monotonic() >= deadline:
                raise
            lost = e
            _rdzv._log.info(
                "rank %d: the rendezvous store went away (%s); joining again", joined_as, e
            )


# How long a rank whose rendezvous store went away looks for a server in its place.
_REJOIN_S = 5.0


def _incarnation_store(store, world_size):
    """`store` for this incarnation of the default group. A store can outlive the group (a
    launcher's, a FileStore's file), and after destroy_process_group() a new group reuses the
    names of the old one ("0", ...), so the keys of the old rendezvous would answer the new
    one (barriers passing early, connections to ports already closed). Each incarnation works
    under its own prefix: every rank draws one ticket, so incarnation n holds tickets
    n * world_size + 1 ... (n + 1) * world_size. The first keeps the store as it is."""
    n = (store.add("c10d/incarnation", 1) - 1) // world_size
    return _C.PrefixStore(f"c10d/incarnation/{n}/", store) if n else store


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Destroys `group`, or every group when None. Operations already submitted finish first
    (within the group's timeout), as in torch; nothing else waits on peers."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if group is None or group is GroupMember.WORLD:
        if _world.default_pg is None:  # torch asserts here
            raise _ArgumentError(
                "Default process group has not been initialized, please "
                "make sure to call init_process_group."
            )
        _unmirror_from_torch()
        for pg in list(_world.pg_map):
            _shutdown(pg)
        for name in _world.pg_names.values():
            _C._unregister_process_group(name)
        _world.reset()
        return
    if group not in _world.pg_map:
        raise _DistValueError("Invalid process group specified")
    if _torch_bridge is not None:
        _torch_bridge._forget_torch_view(group)
    _shutdown(group)
    _C._unregister_process_group(_world.pg_names.get(group, ""))
    _world.drop_group(group)


def _shutdown(pg):
    shutdown = getattr(pg, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception as e:  # a failing peer must not stop the teardown
            warnings.warn(f"shutting down {pg} raised {e!r}")


def _abort_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Tears `group` down (every group for None), as destroy_process_group does; c10d's groups
    have no abort that skips their submitted operations."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    pg = _world.default_pg if group is None or group is GroupMember.WORLD else group
    if pg is None or pg not in _world.pg_map:
        raise _DistValueError("Invalid process group specified or has been destroyed.")
    destroy_process_group(group)


def _set_pg_timeout(timeout: timedelta, group: Optional[ProcessGroup] = None) -> None:
    """Sets the default timeout of `group`'s Gloo backend (the default group's for None)."""
    pg = _get_default_group() if group is None else group
    if _rank_not_in_group(pg):
        raise _DistValueError("Invalid process group specified")
    _check_valid_timeout(timeout)
    for device in pg._device_types():
        backend = pg._get_backend(device.split(":")[0])
        if hasattr(backend, "_set_default_timeout"):
            backend._set_default_timeout(timeout)


def new_group(
    ranks: Optional[List[int]] = None,
    timeout: Optional[timedelta] = None,
    backend: Optional[str] = None,
    pg_options: Optional[Any] = None,
    use_local_synchronization: bool = False,
    group_desc: Optional[str] = None,
    device_id=None,
):
    """Creates a group of the given global ranks (all ranks if None). Every rank of the world
    must call it, in the same order; ranks outside get ``GroupMember.NON_GROUP_MEMBER``. With
    `use_local_synchronization` only the members need to call it (in the same order among
    themselves): the group is named after its ranks instead of by the world's count."""
    return _new_group_with_tag(
        ranks, timeout, backend, pg_options, None, use_local_synchronization, group_desc, device_id
    )


def _new_group_with_tag(
    ranks=None,
    timeout=None,
    backend=None,
    backend_options=None,
    pg_tag=None,
    use_local_synchronization=False,
    group_desc=None,
    device_id=None,
    sort_ranks: bool = True,
):
    """new_group whose group also carries the tag `pg_tag` (see _find_pg_by_ranks_and_tag):
    with a tag, the same ranks and tag again give the group made the first time."""
    pg_options = backend_options
    default = _get_default_group()
    world_size = default.size()
    global_rank = default.rank()
    if ranks is None or len(ranks) == 0:
        ranks = list(range(world_size))
    ranks = sorted(int(r) for r in ranks) if sort_ranks else [int(r) for r in ranks]
    if len(set(ranks)) != len(ranks):
        raise _DistValueError(f"new_group: ranks contain duplicates: {ranks}")
    for r in ranks:
        if r < 0 or r >= world_size:
            # torch's words, its doubled "the" included: its users match on them.
            raise _DistValueError(
                f"The new group's rank should be within the the world_size "
                f"set by init_process_group: rank {r} is not in [0, "
                f"{world_size})"
            )
    if backend is None:
        backend = _world.pg_map[default][0]
    if use_local_synchronization:
        name = _name_of_ranks(ranks)
    else:
        # Every rank advances the counter, members or not, so names stay in step.
        name = str(_world.group_count)
        _world.group_count += 1
    store = _world.pg_map[default][1]
    if not use_local_synchronization and world_size > 1:
        _check_same_ranks(store, name, ranks, global_rank, world_size, timeout)
    if global_rank not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    # Without a timeout a group gets the default one (default_pg_timeout), as in torch, not
    # the default group's.
    pg = _new_process_group_helper(
        len(ranks),
        ranks.index(global_rank),
        ranks,
        backend,
        store,
        name,
        pg_options,
        _timeout_or_default(timeout),
        pg_tag,
    )
    pg._set_group_desc("undefined" if group_desc is None else group_desc)  # torch's default
    return pg


def _check_same_ranks(store, name, ranks, global_rank, world_size, timeout) -> None:
    """Every rank of the world publishes the ranks it asked for and reads everyone's (one
    exchange through the store, as torch's barrier at group creation): ranks that disagree
    would otherwise wire together members of different groups, and all of them raise now."""
    mine = ",".join(map(str, ranks))
    prefix = f"c10d/group_ranks/{name}/"
    store.set(prefix + str(global_rank), mine)
    keys = [prefix + str(r) for r in range(world_size)]
    store.wait(keys, _timeout_or_default(timeout))
    for r, theirs in enumerate(store.multi_get(keys)):
        theirs = theirs.decode() if isinstance(theirs, bytes) else str(theirs)
        if theirs != mine:
            raise _DistValueError(
                f"new_group: rank {global_rank} asked for a group of ranks [{mine}], but rank "
                f"{r} asked for ranks [{theirs}]: every rank must pass the same ranks (group "
                f"{name})"
            )


def _get_group_tag(pg: ProcessGroup) -> str:
    """The tag `pg` was made with ("ptd:<group name>" when none was given)."""
    tag = _world.pg_to_tag[pg]
    return tag[len("user:") :] if tag.startswith("user:") else tag


def _find_pg_by_ranks_and_tag(tag: str, ranks: List[int]) -> Optional[ProcessGroup]:
    """A live group with `tag` whose members are exactly `ranks` (global ranks, any order), or
    None. A tag without the "ptd:"/"user:" prefix is a user's tag."""
    if tag and not tag.startswith(("ptd:", "user:")):
        tag = f"user:{tag}"
    wanted = set(ranks)
    for pg in _world.tags_to_pg.get(tag, []):
        if pg.size() == len(ranks) and wanted <= set(get_process_group_ranks(pg)):
            return pg
    return None


def _find_or_create_pg_by_ranks_and_tag(tag: str, ranks: List[int], stride: int) -> ProcessGroup:
    """The group of `tag` made of this rank's block of `stride` consecutive entries of `ranks`;
    made (with that tag) when there is none."""
    if len(ranks) % stride != 0:
        raise _DistValueError(f"Ranks length ({len(ranks)}) must be divisible by stride ({stride})")
    me = get_rank()
    mine = next(
        (
            ranks[i : i + stride]
            for i in range(0, len(ranks), stride)
            if me in ranks[i : i + stride]
        ),
        None,
    )
    if mine is None:
        raise _ArgumentError(f"rank {me} is in none of the rank sets of {ranks} (stride {stride})")
    mine = sorted(mine)
    pg = _find_pg_by_ranks_and_tag(tag, mine)
    if pg is not None:
        return pg
    if tag == "":
        raise _DistValueError("Cannot automatically create PG with empty tag")
    return _new_group_with_tag(mine, pg_tag=tag)


def _resolve_group_name_by_ranks_and_tag(ranks: List[int], tag: str) -> str:
    """The name of the group _find_pg_by_ranks_and_tag finds; ValueError when there is none."""
    pg = _find_pg_by_ranks_and_tag(tag, ranks)
    if pg is None:
        raise _DistValueError(f"no process group with tag {tag!r} and ranks {list(ranks)}")
    return pg.group_name


def _name_of_ranks(ranks):
    """A group name from its ranks alone; the same ranks again get a new name (derived from
    the last one), so members that create groups in the same order agree."""
    name = hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()
    while name in _world.pg_names.values():
        name = hashlib.sha1(f"{name}_".encode()).hexdigest()
    return name


def _check_disjoint(rank_lists, size=None):
    """Each rank in at most one of the lists (and in [0, size) when size is given)."""
    seen = set()
    for ranks in rank_lists:
        for r in ranks:
            if size is not None and not 0 <= r < size:
                raise _DistValueError(f"Rank {r} is not a rank of the group (size {size})")
            if r in seen:
                raise _DistValueError(
                    f"Rank {r} has appeared in both subgroup "
                    f"{next(s for s in rank_lists if r in s)} and {ranks}"
                )
            seen.add(r)


def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None):
    """Splits `parent_pg` (default: the default group) into disjoint groups, each a list of
    ranks of the parent. Every rank of the parent calls it with the same `split_ranks`; each
    gets the group it is in, or None when it is in none."""
    parent = parent_pg if parent_pg is not None else _get_default_group()
    if not split_ranks:
        raise _DistValueError("split_ranks cannot be None or empty")
    _check_disjoint(split_ranks, get_world_size(parent))
    me = get_rank(parent)
    mine = next((split for split in split_ranks if me in split), None)
    if mine is None:
        return None
    global_ranks = [get_global_rank(parent, r) for r in mine]
    return new_group(
        global_ranks,
        timeout=timeout if timeout is not None else parent._timeout,
        backend=_world.pg_map[parent][0],
        pg_options=pg_options,
        use_local_synchronization=True,
        group_desc=group_desc,
    )


def shrink_group(ranks_to_exclude, group=None, shrink_flags=0, pg_options=None):
    """A new group of the ranks of `group` (default: the default group) that are not in
    `ranks_to_exclude` (ranks of `group`), e.g. to go on without failed ranks. Only the
    remaining ranks call it."""
    parent = group if group is not None else _get_default_group()
    size = get_world_size(parent)
    excluded = set(ranks_to_exclude)
    if not excluded:
        raise _DistValueError("ranks_to_exclude cannot be empty")
    if any(not 0 <= r < size for r in excluded):
        raise _DistValueError(
            f"ranks_to_exclude {sorted(excluded)} must be ranks of the group (size {size})"
        )
    if get_rank(parent) in excluded:
        raise _DistValueError(
            f"rank {get_rank(parent)} is excluded from the shrunk group and "
            f"must not call shrink_group"
        )
    if len(excluded) == size:
        raise _DistValueError("ranks_to_exclude cannot exclude every rank of the group")
    kept = [get_global_rank(parent, r) for r in range(size) if r not in excluded]
    return new_group(
        kept,
        timeout=parent._timeout,
        backend=_world.pg_map[parent][0],
        pg_options=pg_options,
        use_local_synchronization=True,
    )


def new_subgroups(
    group_size: Optional[int] = None,
    group=None,
    timeout=None,
    backend=None,
    pg_options=None,
    group_desc=None,
):
    """Splits the world into consecutive groups of `group_size` ranks (default: the ranks of
    one node, LOCAL_WORLD_SIZE). Returns (this rank's subgroup, all subgroups)."""
    world_size = get_world_size()
    if group_size is None:
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if group_size <= 0:
        raise _DistValueError(f"The arg 'group_size' ({group_size}) must be positive")
    if group_size > world_size:
        raise _DistValueError(
            f"The arg 'group_size' ({group_size}) must not exceed the world size ({world_size})"
        )
    if world_size % group_size != 0:
        raise _DistValueError("The world size must be divisible by 'group_size'")
    enumeration = [
        list(range(start, start + group_size)) for start in range(0, world_size, group_size)
    ]
    return new_subgroups_by_enumeration(enumeration, timeout, backend, pg_options, group_desc)


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list, timeout=None, backend=None, pg_options=None, group_desc=None
):
    """Creates one group per list of ranks. Returns (this rank's subgroup or None, all)."""
    if not ranks_per_subgroup_list:
        raise _DistValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    _check_disjoint(ranks_per_subgroup_list)
    me = get_rank()
    current = None
    subgroups = []
    for ranks in ranks_per_subgroup_list:
        sub = new_group(
            ranks, timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc
        )
        subgroups.append(sub)
        if me in ranks:
            current = sub
    return current, subgroups


# --------------------------------------------------------------------------------------------
# Collectives


def _opts(cls, async_op: bool):
    """An options object with asyncOp set: a sync call may run on the calling thread."""
    opts = cls()
    opts.asyncOp = async_op
    return opts


def _finish(work, async_op: bool):
    if async_op:  # a C++ group remembers it for _wait_for_pending_works
        return work
    if work is not None:  # C++ groups already waited; a Python ProcessGroup returns a Work
        work.wait()
    return None


_allreduce_opts_cache: Dict[Any, AllreduceOptions] = {}


def _allreduce_opts(op, async_op: bool) -> AllreduceOptions:
    # Options are read-only once built, so the common (op, async_op) pairs are built once.
    key = (op, async_op)
    opts = _allreduce_opts_cache.get(key) if type(op) is ReduceOp.RedOpType else None
    if opts is None:
        opts = AllreduceOptions()
        opts.reduceOp = op
        opts.asyncOp = async_op
        if type(op) is ReduceOp.RedOpType:
            _allreduce_opts_cache[key] = opts
    return opts


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduces `tensor` across all ranks of `group`, in place on every rank."""
    if not async_op:
        fast = _inline_allreduce.get(group)
        if fast is not None and fast(tensor, op):
            return None
    if getattr(tensor, "is_sparse", False) is True:  # a torch sparse COO tensor (never inline)
        return _all_reduce_sparse(tensor, op, group, async_op)
    if group is None:
        group = _world.default_pg or _get_default_group()
    elif _rank_not_in_group(group):
        _warn_not_in_group("all_reduce")
        return None
    if _world.pg_coalesce_state and group in _world.pg_coalesce_state:
        return _defer_to_coalescing(group, _CollOp(all_reduce, tensor, None, op), async_op)
    work = group.allreduce([tensor], _allreduce_opts(op, async_op))
    if async_op:
        return work
    if work is not None:
        work.wait()
    return None


def _all_reduce_sparse(tensor, op, group, async_op):
    """all_reduce of a torch sparse COO tensor, as torch's Gloo does it: every rank gathers
    every rank's indices and values, and the coalesced sum replaces `tensor`'s contents.
    SUM only. Synchronous: with async_op the returned Work is already complete."""
    if _rank_not_in_group(group):
        _warn_not_in_group("all_reduce")
        return None
    if op != ReduceOp.SUM:
        raise _DistValueError(f"all_reduce of sparse tensors supports only ReduceOp.SUM, got {op}")
    import torch

    local = tensor.coalesce()
    indices, values = local._indices().contiguous(), local._values().contiguous()
    world = get_world_size(group)
    nnz = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    all_gather(nnz, torch.tensor([indices.shape[1]], dtype=torch.int64), group=group)
    gathered_indices = [torch.empty((indices.shape[0], int(n)), dtype=indices.dtype) for n in nnz]
    gathered_values = [
        torch.empty((int(n),) + tuple(values.shape[1:]), dtype=values.dtype) for n in nnz
    ]
    all_gather(gathered_indices, indices, group=group)
    all_gather(gathered_values, values, group=group)
    total = torch.sparse_coo_tensor(
        torch.cat(gathered_indices, 1), torch.cat(gathered_values, 0), local.size()
    )
    tensor.copy_(total.coalesce())
    if not async_op:
        return None
    done = _C.Future()
    done.set_result([tensor])
    return _C._create_work_from_future(done)


class _CoalescedDeprecation(FutureWarning, UserWarning):
    """torch 1.13 warns with a UserWarning that the coalesced collectives will go away, torch
    2.x with a FutureWarning: this is both."""


def _warn_coalesced_deprecated(name):
    warnings.warn(
        f"torch.distributed.{name} is deprecated: call the collective once per tensor "
        f"(or flatten the tensors into one); {name} may be removed as in torch",
        _CoalescedDeprecation,
        stacklevel=3,
    )


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False):
    """all_reduce of several tensors (of any shapes, one dtype) as one operation."""
    _warn_coalesced_deprecated("all_reduce_coalesced")
    if _rank_not_in_group(group):
        _warn_not_in_group("all_reduce_coalesced")
        return None
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    opts = AllreduceCoalescedOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    work = _resolve_group(group).allreduce_coalesced(list(tensors), opts)
    # As torch's: asynchronously, the call returns the future (of the list of tensors).
    return work.get_future() if async_op else _finish(work, False)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copies `tensor` from rank `src` to every rank of `group`."""
    if group is None and not async_op and group_src is None and src is not None:
        fast = _inline_broadcast.get(None)
        if fast is not None and fast(tensor, src):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("broadcast")
        return None
    opts = BroadcastOptions()
    opts.rootRank = _canonical_rank(group, group_src, src, "src")
    opts.rootTensor = 0
    opts.asyncOp = async_op
    return _finish(_resolve_group(group).broadcast([tensor], opts), async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduces `tensor` across ranks into rank `dst`'s tensor."""
    if group is None and not async_op and group_dst is None and dst is not None:
        fast = _inline_reduce.get(None)
        if fast is not None and fast(tensor, dst, op):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("reduce")
        return None
    opts = ReduceOptions()
    opts.reduceOp = op
    opts.rootRank = _canonical_rank(group, group_dst, dst, "dst")
    opts.asyncOp = async_op
    return _finish(_resolve_group(group).reduce([tensor], opts), async_op)


def _is_tensor(value) -> bool:
    return (
        isinstance(value, np.ndarray)
        or hasattr(value, "__dlpack__")
        or hasattr(value, "__array_interface__")
    )


def _check_single_tensor(param, param_name: str) -> None:
    """TypeError unless `param` is one tensor (an array, or anything with __dlpack__)."""
    if not _is_tensor(param):
        raise _DistTypeError(
            f"Invalid function argument. Expected parameter `{param_name}` of "
            f"type tensor but got {type(param)} instead."
        )


def _check_tensor_list(param, param_name: str) -> None:
    """TypeError unless `param` is a list of tensors."""
    if not isinstance(param, list) or not all(_is_tensor(p) for p in param):
        raise _DistTypeError(
            f"Invalid function argument. Expected parameter `{param_name}` of "
            f"type List[tensor] but got {type(param)} instead."
        )


def _as_iterable(obj):
    return obj if isinstance(obj, list) else (obj,)


def _ensure_all_tensors_same_dtype(*tensors) -> None:
    """ValueError unless the tensors (or lists of them) share one dtype."""
    dtypes = {str(getattr(t, "dtype", None)) for arg in tensors for t in _as_iterable(arg)}
    if len(dtypes) > 1:
        raise _DistValueError(
            f"Invalid usage of tensors with different dtypes: found {sorted(dtypes)}"
        )


def _check_list(value, name):
    if not isinstance(value, (list, tuple)):
        raise _DistTypeError(
            f"Invalid function argument: {name} should be a list of tensors, got "
            f"{type(value).__name__}"
        )
    return list(value)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Gathers `tensor` from every rank into `tensor_list` (one entry per rank)."""
    if not async_op:
        fast = _inline_all_gather.get(group)
        if fast is not None and fast(tensor_list, tensor):
            return None
    tensor_list = _check_list(tensor_list, "tensor_list")
    if _rank_not_in_group(group):
        _warn_not_in_group("all_gather")
        return None
    return _finish(
        _resolve_group(group).allgather([tensor_list], [tensor], _opts(AllgatherOptions, async_op)),
        async_op,
    )


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Gathers `input_tensor` from every rank into `output_tensor`, concatenated (or stacked)
    in rank order."""
    if not async_op:
        fast = _inline_all_gather_into_tensor.get(group)
        if fast is not None and fast(output_tensor, input_tensor):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("all_gather_into_tensor")
        return None
    pg = _resolve_group(group)
    if _world.pg_coalesce_state and pg in _world.pg_coalesce_state:
        return _defer_to_coalescing(
            pg, _CollOp(all_gather_into_tensor, input_tensor, output_tensor), async_op
        )
    return _finish(
        pg._allgather_base(output_tensor, input_tensor, _opts(AllgatherOptions, async_op)), async_op
    )


# torch 2.13's names for the two single-tensor forms (its older names warn there; not here,
# where a warning would cost a small call more than the call itself).
all_gather_single = all_gather_into_tensor


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    warnings.warn("_all_gather_base is deprecated; use all_gather_into_tensor", FutureWarning)
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False):
    """all_gather of several tensors as one operation."""
    _warn_coalesced_deprecated("all_gather_coalesced")
    output_tensor_lists = _check_list(output_tensor_lists, "output_tensor_lists")
    input_tensor_list = _check_list(input_tensor_list, "input_tensor_list")
    if _rank_not_in_group(group):
        _warn_not_in_group("all_gather_coalesced")
        return None
    work = _resolve_group(group).allgather_coalesced(
        [list(x) for x in output_tensor_lists], input_tensor_list, _opts(AllgatherOptions, async_op)
    )
    if not async_op:
        return _finish(work, False)
    # As torch's: the future's value is the output lists (the caller's), one per rank.
    return work.get_future().then(lambda _: output_tensor_lists)


def _root_and_list(group, group_root, root, name, tensor_list, list_name, role):
    """The root rank of a rooted collective (default 0) and its tensor-list argument as the
    C++ layer takes it: [list] on the root, [] elsewhere. The list is required on the root and
    refused on the other ranks."""
    if root is None and group_root is None:
        root = 0
    root = _canonical_rank(group, group_root, root, name)
    if get_rank(group) == root:
        if not tensor_list:
            raise _DistValueError(f"Argument ``{list_name}`` must be specified on {role} rank.")
        return root, [_check_list(tensor_list, list_name)]
    if tensor_list:
        raise _DistValueError(
            f"Argument ``{list_name}`` must NOT be specified on non-{role} ranks."
        )
    return root, []


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Gathers `tensor` from every rank into `gather_list` on rank `dst`."""
    if group is None and not async_op and group_dst is None:
        fast = _inline_gather.get(None)
        if fast is not None and fast(tensor, gather_list, 0 if dst is None else dst):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("gather")
        return None
    root, outputs = _root_and_list(
        group, group_dst, dst, "dst", gather_list, "gather_list", "destination"
    )
    opts = GatherOptions()
    opts.rootRank = root
    opts.asyncOp = async_op
    return _finish(_resolve_group(group).gather(outputs, [tensor], opts), async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Sends scatter_list[i] on rank `src` to rank i's `tensor`."""
    if group is None and not async_op and group_src is None:
        fast = _inline_scatter.get(None)
        if fast is not None and fast(tensor, scatter_list, 0 if src is None else src):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("scatter")
        return None
    root, inputs = _root_and_list(
        group, group_src, src, "src", scatter_list, "scatter_list", "source"
    )
    opts = ScatterOptions()
    opts.rootRank = root
    opts.asyncOp = async_op
    return _finish(_resolve_group(group).scatter([tensor], inputs, opts), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduces input_list[i] across ranks into rank i's `output`."""
    if not async_op:
        fast = _inline_reduce_scatter.get(group)
        if fast is not None and fast(output, input_list, op):
            return None
    input_list = _check_list(input_list, "input_list")
    if _rank_not_in_group(group):
        _warn_not_in_group("reduce_scatter")
        return None
    opts = ReduceScatterOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    return _finish(_resolve_group(group).reduce_scatter([output], [input_list], opts), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduces `input` (world_size chunks) across ranks; rank i gets chunk i in `output`."""
    if not async_op:
        fast = _inline_reduce_scatter_tensor.get(group)
        if fast is not None and fast(output, input, op):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("reduce_scatter_tensor")
        return None
    pg = _resolve_group(group)
    if _world.pg_coalesce_state and pg in _world.pg_coalesce_state:
        return _defer_to_coalescing(pg, _CollOp(reduce_scatter_tensor, input, output, op), async_op)
    opts = ReduceScatterOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    return _finish(pg._reduce_scatter_base(output, input, opts), async_op)


reduce_scatter_single = reduce_scatter_tensor


@contextlib.contextmanager
def record_comm(name: str):
    """Within it, torch's profiler names the event of every collective issued `name` instead
    of "<backend>:<op>" (as torch's record_comm does)."""
    from . import _profiling

    previous, _profiling.comm_name = _profiling.comm_name, str(name)
    try:
        yield
    finally:
        _profiling.comm_name = previous


def _reduce_scatter_base(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    warnings.warn("_reduce_scatter_base is deprecated; use reduce_scatter_tensor", FutureWarning)
    return reduce_scatter_tensor(output, input, op, group, async_op)


def all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
):
    """Splits `input` along dimension 0 (evenly, or by input_split_sizes), sends split i to
    rank i, and concatenates what arrives into `output`."""
    if not async_op and output_split_sizes is None and input_split_sizes is None:
        fast = _inline_all_to_all_single.get(group)
        if fast is not None and fast(output, input):
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("all_to_all_single")
        return None
    out_splits = [] if output_split_sizes is None else [int(s) for s in output_split_sizes]
    in_splits = [] if input_split_sizes is None else [int(s) for s in input_split_sizes]
    return _finish(
        _resolve_group(group).alltoall_base(
            output, input, out_splits, in_splits, _opts(AllToAllOptions, async_op)
        ),
        async_op,
    )


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Sends input_tensor_list[i] to rank i; output_tensor_list[i] receives from rank i."""
    output_tensor_list = _check_list(output_tensor_list, "output_tensor_list")
    input_tensor_list = _check_list(input_tensor_list, "input_tensor_list")
    if _rank_not_in_group(group):
        _warn_not_in_group("all_to_all")
        return None
    return _finish(
        _resolve_group(group).alltoall(
            output_tensor_list, input_tensor_list, _opts(AllToAllOptions, async_op)
        ),
        async_op,
    )


def barrier(group=None, async_op=False, device_ids=None):
    """Blocks until every rank of `group` has entered the barrier."""
    if device_ids is not None and (
        not isinstance(device_ids, (list, tuple)) or not all(isinstance(d, int) for d in device_ids)
    ):
        raise _DistTypeError(
            f"Invalid function argument: device_ids type should be List[int], got {device_ids!r}"
        )
    if not async_op:
        fast = _inline_barrier.get(group)
        if fast is not None and fast():
            return None
    if _rank_not_in_group(group):
        _warn_not_in_group("barrier")
        return None
    opts = BarrierOptions()
    opts.asyncOp = async_op
    if device_ids is not None:
        opts.device_ids = list(device_ids)
    return _finish(_resolve_group(group).barrier(opts), async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that, on timeout, names the ranks that did not arrive (all of them with
    wait_all_ranks, else the first)."""
    if _rank_not_in_group(group):
        _warn_not_in_group("monitored_barrier")
        return None
    pg = _resolve_group(group)
    if timeout is None:
        timeout = pg._timeout
    elif isinstance(timeout, float):
        # torch takes seconds here too, with this warning; its own tests pass 0.1.
        warnings.warn(
            f"monitored_barrier: timeout {timeout} taken as seconds; pass a datetime.timedelta",
            stacklevel=2,
        )
        timeout = timedelta(seconds=timeout)
    _check_valid_timeout(timeout)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _rank_pdb():
    """A pdb for a process whose stdin is not the terminal (a launcher's child): while stopped
    it reads the controlling terminal, or the standard streams when there is none."""
    import pdb

    class RankPdb(pdb.Pdb):
        def interaction(self, *args, **kwargs):
            saved = sys.stdin
            try:
                tty = open("/dev/tty")
            except OSError:
                tty = None
            try:
                if tty is not None:
                    sys.stdin = self.stdin = tty
                pdb.Pdb.interaction(self, *args, **kwargs)
            finally:
                sys.stdin = self.stdin = saved
                if tty is not None:
                    tty.close()

    return RankPdb()


_breakpoint_hits: Dict[Tuple[str, int], int] = collections.Counter()


def breakpoint(rank: int = 0, skip: int = 0):
    """Stops rank `rank` of the default group in the debugger while every other rank waits (in
    a barrier) until it continues. With `skip`, the first `skip` calls from this line of code
    pass without stopping."""

    if skip > 0:
        caller = sys._getframe(1)
        where = (caller.f_code.co_filename, caller.f_lineno)
        _breakpoint_hits[where] += 1
        if _breakpoint_hits[where] <= skip:
            return
    if get_rank() == rank:
        debugger = _rank_pdb()
        debugger.message(
            f"\nrank {rank} stopped in c10d.breakpoint(); the other ranks wait in a "
            "barrier. 'up' goes to the caller, 'c' continues.\n"
        )
        debugger.set_trace(sys._getframe(1))
    barrier()


# --------------------------------------------------------------------------------------------
# Point to point


def _peer(group, group_peer, peer, name):
    """The peer's rank in `group`; never this rank itself (checked here too, for process
    groups written in Python, which the C++ check does not reach)."""
    rank = _canonical_rank(group, group_peer, peer, name)
    _check_not_self_rank(_resolve_group(group), rank, "destination" if name == "dst" else "source")
    return rank


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Starts sending `tensor` to rank `dst`; returns a Work."""
    if group is None and group_dst is None:
        fast = _inline_isend.get(None)
        if fast is not None:
            work = fast(tensor, dst, tag)
            if work is not False:
                return work
    if _rank_not_in_group(group):
        _warn_not_in_group("isend")
        return None
    return _resolve_group(group).send([tensor], _peer(group, group_dst, dst, "dst"), tag)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Starts receiving into `tensor` from rank `src` (any rank if None); returns a Work."""
    if group is None and group_src is None and src is not None:
        fast = _inline_irecv.get(None)
        if fast is not None:
            work = fast(tensor, src, tag)
            if work is not False:
                return work
    if _rank_not_in_group(group):
        _warn_not_in_group("irecv")
        return None
    pg = _resolve_group(group)
    if src is None and group_src is None:
        return pg.recv_anysource([tensor], tag)
    return pg.recv([tensor], _peer(group, group_src, src, "src"), tag)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Sends `tensor` to rank `dst` and waits until it is sent."""
    if group is None and group_dst is None:
        fast = _inline_send.get(None)
        if fast is not None and fast(tensor, dst, tag):
            return
    if _rank_not_in_group(group):
        _warn_not_in_group("send")
        return
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receives into `tensor` from rank `src` (any rank if None); returns the sender's global
    rank (as torch does, also when the source was given as group_src)."""
    if group is None and group_src is None and src is not None:
        fast = _inline_recv.get(None)
        if fast is not None and fast(tensor, src, tag):
            return src
    if _rank_not_in_group(group):
        _warn_not_in_group("recv")
        return -1
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    if src is None and group_src is None:
        sender = work._source_rank()
    else:
        sender = _canonical_rank(group, group_src, src, "src")
    if group is None or group is GroupMember.WORLD:
        return sender
    return get_global_rank(group, sender)


class P2POp:
    """One point-to-point operation for batch_isend_irecv: op is c10d.isend or c10d.irecv."""

    def __init__(
        self,
        op: Callable,
        tensor,
        peer: Optional[int] = None,
        group=None,
        tag: int = 0,
        group_peer: Optional[int] = None,
    ):
        _check_op(op)
        if (peer is None) == (group_peer is None):
            raise _DistValueError("Specify exactly one of peer and group_peer")
        self.op = op
        self.tensor = tensor
        self.tag = tag
        # As torch fills them in: the group (the default one for None), the peer's global rank
        # and its rank in the group.
        self.group = _get_default_group() if group is None else group
        if _rank_not_in_group(self.group):
            self.peer, self.group_peer = peer, group_peer
        else:
            self.group_peer = _canonical_rank(self.group, group_peer, peer, "peer")
            self.peer = peer if peer is not None else get_global_rank(self.group, self.group_peer)

    def __repr__(self):
        return (
            f"P2POp({self.op.__name__}, peer={self.peer}, group_peer={self.group_peer}, "
            f"tag={self.tag})"
        )


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Starts every send/receive of the list; returns their Works."""
    _check_p2p_op_list(p2p_op_list)
    works: List[Optional[Work]] = [None] * len(p2p_op_list)
    # Receives are posted before sends, so two ranks exchanging in either order never wait
    # on each other. The Works come back in the order of the list, as torch's do.
    order = sorted(range(len(p2p_op_list)), key=lambda i: 0 if p2p_op_list[i].op is irecv else 1)
    for i in order:
        p = p2p_op_list[i]
        if p.group is _world.default_pg:  # global ranks are its own: the inline path applies
            works[i] = p.op(p.tensor, p.peer, None, p.tag)
            continue
        peer = {"group_dst" if p.op is isend else "group_src": p.group_peer}
        if _rank_not_in_group(p.group):  # warns and returns None, as a plain isend/irecv does
            peer = {"dst" if p.op is isend else "src": p.peer}
        works[i] = p.op(p.tensor, group=p.group, tag=p.tag, **peer)
    # A rank outside the group gets no Works (an empty list), as from torch.
    return [w for w in works if w is not None]


def _check_op(op) -> None:
    if op not in (isend, irecv):
        raise _DistValueError(
            "Invalid ``op``. Expected ``op`` to be of type ``c10d.isend`` or ``c10d.irecv``."
        )


def _check_p2p_op_list(p2p_op_list) -> None:
    """A non-empty list of P2POps, all on one group."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise _DistValueError(
            "Invalid ``p2p_op_list``. Each op is expected to be of type ``c10d.P2POp``."
        )
    if not p2p_op_list:
        raise _ShortListError("batch_isend_irecv needs at least one P2POp")
    if len({id(p.group) for p in p2p_op_list}) > 1:
        raise _DistValueError("All ops need to use the same group.")


class _CoalescingManager:
    """The Works of a _coalescing_manager block, when it was entered with async_ops=True."""

    def __init__(self):
        self.works: List[Work] = []

    def append(self, work: Optional[Work]) -> None:
        if work:
            self.works.append(work)

    def wait(self) -> None:
        for work in self.works:
            work.wait()


class _CollOp:
    """A collective deferred by a _coalescing_manager block: the function, its tensor, the
    output tensor when it is another one, the reduce op and the root."""

    def __init__(self, op: Callable, tensor, dst_tensor=None, redop=None, root=None):
        self.op = op
        self.tensor = tensor
        self.dst_tensor = dst_tensor
        self.redop = redop
        self.root = root


class _IllegalWork(Work):
    """What an async collective deferred by a coalescing block returns: its result comes with
    the block's Work, so waiting on this one is an error."""

    def __getattribute__(self, name):
        if name in (
            "is_success",
            "exception",
            "wait",
            "source_rank",
            "_source_rank",
            "result",
            "synchronize",
        ):
            raise _DistValueError(
                f"Illegal to call {name} on IllegalWork object: the "
                "collective runs when its _coalescing_manager block ends"
            )
        return super().__getattribute__(name)


def _defer_to_coalescing(group, coll: _CollOp, async_op: bool):
    _world.pg_coalesce_state[group].append(coll)
    return _IllegalWork() if async_op else None


def _issue_coalesced(pg, op_list: List[_CollOp]) -> None:
    """Runs the collectives a coalescing block deferred, fused as torch fuses them: all_reduces
    into one flattened all_reduce, all_gather_into_tensors and reduce_scatter_tensors into
    their coalesced forms. Collectives of several kinds or reduce ops, which torch refuses or
    reduces all with the first op, run one by one instead."""
    first = op_list[0]
    if any(c.op is not first.op or c.redop != first.redop for c in op_list):
        for c in op_list:
            if c.op is all_reduce:
                c.op(c.tensor, c.redop, pg, True)
            elif c.op is all_gather_into_tensor:
                c.op(c.dst_tensor, c.tensor, pg, True)
            else:
                c.op(c.dst_tensor, c.tensor, c.redop, pg, True)
        return
    inputs = [c.tensor for c in op_list]
    outputs = [c.dst_tensor for c in op_list]
    if first.op is all_reduce:
        opts = _opts(AllreduceCoalescedOptions, True)
        opts.reduceOp = first.redop
        pg.allreduce_coalesced(inputs, opts)
    elif first.op is all_gather_into_tensor:
        pg.allgather_into_tensor_coalesced(outputs, inputs, _opts(AllgatherOptions, True))
    else:
        opts = _opts(ReduceScatterOptions, True)
        opts.reduceOp = first.redop
        pg.reduce_scatter_tensor_coalesced(outputs, inputs, opts)


@contextlib.contextmanager
def _coalescing_manager(group=None, device=None, async_ops: bool = False):
    """Groups the collectives issued on `group` inside the block into one Work.

    all_reduce, all_gather_into_tensor and reduce_scatter_tensor calls are deferred and run
    fused when the block ends (one flattened all_reduce for all the all_reduces, as torch
    does, when they are of one kind with one reduce op; else one by one); other collectives
    run as they are issued. Leaving the block waits for all of them, or, with
    ``async_ops=True``, hands their combined Work to the manager it yielded (``cm.wait()``).
    On a rank outside `group` nothing runs and the manager stays empty.
    """
    cm = _CoalescingManager()
    if _rank_not_in_group(group):
        yield cm
        return
    pg = _resolve_group(group)
    if _world.pg_coalesce_state.get(pg):
        raise _DistValueError("ProcessGroup has non-empty op list at the start of coalescing")
    where = "cpu" if device is None else device
    # Inline paths would run the deferred collectives at once: off for the block.
    suspended = {}
    for name, table in _INLINE.items():
        fn = table.get(pg)
        if fn is not None:
            suspended[name] = {key: table.pop(key) for key in (pg, None) if table.get(key) is fn}
    _world.pg_coalesce_state[pg] = []
    pg._start_coalescing(where)
    try:
        try:
            yield cm
        finally:
            op_list = _world.pg_coalesce_state.pop(pg, [])
            for name, entries in suspended.items():
                _INLINE[name].update(entries)
        if op_list:  # issued inside the window: the block's Work covers them
            _issue_coalesced(pg, op_list)
    except BaseException:
        pg._end_coalescing(where)  # closes the window; the block's error is the one raised
        raise
    work = pg._end_coalescing(where)
    if async_ops:
        cm.append(work)
    else:
        work.wait()


# --------------------------------------------------------------------------------------------
# Object collectives (pickle)


# The classes the object collectives pickle and unpickle with. Module attributes, as in
# torch, so a program can set its own (a Pickler with a dispatch_table for a type pickle cannot
# handle, say).
_pickler = pickle.Pickler
_unpickler = pickle.Unpickler


def _to_bytes_tensor(obj) -> np.ndarray:
    buffer = io.BytesIO()
    _pickler(buffer).dump(obj)
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()


def _check_list_holds(objects, world, name):
    """An object list must have an entry per rank of the group (more are left alone)."""
    if len(objects) < world:
        raise _ShortListError(
            f"{name} has {len(objects)} entries but the group has {world} "
            f"ranks: it needs one entry per rank"
        )


def _from_bytes_tensor(array: np.ndarray, size: int):
    return _unpickler(io.BytesIO(array[:size].tobytes())).load()


def _object_to_tensor(obj, device=None, group=None):
    """(the pickled bytes of obj as a uint8 array, its length as an int64 array of one)."""
    data = _to_bytes_tensor(obj)
    return data, np.array([data.size], dtype=np.int64)


def _tensor_to_object(tensor, tensor_size, group=None):
    """The object _object_to_tensor pickled into `tensor` (of `tensor_size` bytes)."""
    array = np.asarray(tensor.numpy() if hasattr(tensor, "numpy") else tensor, dtype=np.uint8)
    return _from_bytes_tensor(array.reshape(-1), int(tensor_size))


def all_gather_object(object_list, obj, group=None):
    """Gathers a picklable object from every rank into object_list (one entry per rank)."""
    if _rank_not_in_group(group):
        _warn_not_in_group("all_gather_object")
        return
    world = get_world_size(group)
    data = _to_bytes_tensor(obj)
    sizes = np.zeros(world, dtype=np.int64)
    all_gather_into_tensor(sizes, np.array([data.size], dtype=np.int64), group)
    longest = int(sizes.max())
    padded = np.zeros(longest, dtype=np.uint8)
    padded[: data.size] = data
    gathered = np.zeros(longest * world, dtype=np.uint8)
    all_gather_into_tensor(gathered, padded, group)
    # Checked after the exchange, as torch fails there too: raising before it would leave the
    # peers waiting for this rank until their timeout.
    _check_list_holds(object_list, world, "object_list")
    for i in range(world):
        object_list[i] = _from_bytes_tensor(
            gathered[i * longest : (i + 1) * longest], int(sizes[i])
        )


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Gathers picklable objects from every rank into object_gather_list on rank `dst`."""
    if _rank_not_in_group(group):
        _warn_not_in_group("gather_object")
        return
    if dst is None and group_dst is None:
        dst = 0
    root = _canonical_rank(group, group_dst, dst, "dst")
    me = get_rank(group)
    world = get_world_size(group)
    if me == root:
        if not object_gather_list:  # torch names the argument gather_list here too
            raise _DistValueError(
                "Argument ``gather_list`` must be specified on destination "
                "rank (object_gather_list)."
            )
    elif object_gather_list:
        raise _DistValueError(
            "Argument ``gather_list`` must NOT be specified on "
            "non-destination ranks (object_gather_list)."
        )
    data = _to_bytes_tensor(obj)
    sizes = np.zeros(world, dtype=np.int64)
    all_gather_into_tensor(sizes, np.array([data.size], dtype=np.int64), group)
    longest = int(sizes.max())
    padded = np.zeros(longest, dtype=np.uint8)
    padded[: data.size] = data
    outputs = [np.zeros(longest, dtype=np.uint8) for _ in range(world)] if me == root else None
    gather(padded, outputs, group=group, group_dst=root)
    if me == root:
        _check_list_holds(object_gather_list, world, "object_gather_list")  # as all_gather_object
        for i in range(world):
            object_gather_list[i] = _from_bytes_tensor(outputs[i], int(sizes[i]))


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replaces object_list's entries on every rank with those of rank `src`."""
    if _rank_not_in_group(group):
        _warn_not_in_group("broadcast_object_list")
        return
    if src is None and group_src is None:
        src = 0
    root = _canonical_rank(group, group_src, src, "src")
    me = get_rank(group)
    if me == root:
        blobs = [_to_bytes_tensor(o) for o in object_list]
        sizes = np.array([b.size for b in blobs], dtype=np.int64)
    else:
        sizes = np.zeros(len(object_list), dtype=np.int64)
    broadcast(sizes, group=group, group_src=root)
    payload = (
        np.concatenate(blobs)
        if me == root and blobs
        else np.zeros(int(sizes.sum()), dtype=np.uint8)
    )
    if payload.size:
        broadcast(payload, group=group, group_src=root)
    if me != root:
        offset = 0
        for i, size in enumerate(sizes):
            object_list[i] = _from_bytes_tensor(payload[offset : offset + int(size)], int(size))
            offset += int(size)


def scatter_object_list(
    scatter_object_output_list, scatter_object_input_list=None, src=None, group=None, group_src=None
):
    """Rank i receives scatter_object_input_list[i] of rank `src` as
    scatter_object_output_list[0]."""
    if _rank_not_in_group(group):
        _warn_not_in_group("scatter_object_list")
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise _DistValueError(
            "Expected argument scatter_object_output_list to be a list of size at least 1."
        )
    if src is None and group_src is None:
        src = 0
    root = _canonical_rank(group, group_src, src, "src")
    me = get_rank(group)
    world = get_world_size(group)
    if me == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != world:
            raise _DistValueError(
                "Argument ``scatter_object_input_list`` must have one entry per "
                "rank on the source rank."
            )
        blobs = [_to_bytes_tensor(o) for o in scatter_object_input_list]
        longest = np.array([max(b.size for b in blobs)], dtype=np.int64)
    else:
        longest = np.zeros(1, dtype=np.int64)
    broadcast(longest, group=group, group_src=root)
    n = int(longest[0])
    size_out = np.zeros(1, dtype=np.int64)
    data_out = np.zeros(n, dtype=np.uint8)
    if me == root:
        padded = []
        for b in blobs:
            p = np.zeros(n, dtype=np.uint8)
            p[: b.size] = b
            padded.append(p)
        size_in = [np.array([b.size], dtype=np.int64) for b in blobs]
        scatter(size_out, size_in, group=group, group_src=root)
        scatter(data_out, padded, group=group, group_src=root)
    else:
        scatter(size_out, None, group=group, group_src=root)
        scatter(data_out, None, group=group, group_src=root)
    scatter_object_output_list[0] = _from_bytes_tensor(data_out, int(size_out[0]))


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None):
    """Sends picklable objects to rank `dst` (which calls recv_object_list)."""
    if _rank_not_in_group(group):
        _warn_not_in_group("send_object_list")
        return
    peer = _canonical_rank(group, group_dst, dst, "dst")
    blobs = [_to_bytes_tensor(o) for o in object_list]
    sizes = np.array([b.size for b in blobs], dtype=np.int64)
    send(sizes, group=group, group_dst=peer)
    payload = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint8)
    if payload.size:
        send(payload, group=group, group_dst=peer)


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Receives picklable objects sent by send_object_list into object_list; returns the
    sender's rank."""
    if _rank_not_in_group(group):
        _warn_not_in_group("recv_object_list")
        return -1
    sizes = np.zeros(len(object_list), dtype=np.int64)
    if src is None and group_src is None:
        sender = recv(sizes, group=group)
        peer = _canonical_rank(group, None, sender, "src")
    else:
        peer = _canonical_rank(group, group_src, src, "src")
        recv(sizes, group=group, group_src=peer)
        sender = peer if group is None else get_global_rank(group, peer)
    payload = np.zeros(int(sizes.sum()), dtype=np.uint8)
    if payload.size:
        recv(payload, group=group, group_src=peer)
    offset = 0
    for i, size in enumerate(sizes):
        object_list[i] = _from_bytes_tensor(payload[offset : offset + int(size)], int(size))
        offset += int(size)
    return sender


__all__ = [
    "Backend",
    "BackendConfig",
    "GroupMember",
    "P2POp",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "send_object_list",
    "recv_object_list",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend_config",
    "get_backend",
    "get_default_backend_for_device",
    "get_rank",
    "get_world_size",
    "get_pg_count",
    "group",
    "init_process_group",
    "irecv",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_backend_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "shrink_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "scatter_object_list",
    "send",
    "supports_complex",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "AllToAllOptions",
    "BarrierOptions",
    "BroadcastOptions",
    "GatherOptions",
    "PrefixStore",
    "ProcessGroup",
    "ReduceOp",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
    "Store",
    "DebugLevel",
    "get_debug_level",
    "Work",
    "default_pg_timeout",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "reduce_op",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "record_comm",
    "get_node_local_rank",
    "is_available",
    "breakpoint",
]

from ._C import DebugLevel, PrefixStore, get_debug_level  # noqa: E402,F401
