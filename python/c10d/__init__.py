"""c10d: torch.distributed's communication layer for CPU programs, without PyTorch.

Stores, process groups, backends and collectives work on numpy arrays and on any object that
exposes the buffer protocol or ``__dlpack__`` (PyTorch CPU tensors included), so that
``import c10d as dist`` can stand in for ``import torch.distributed as dist``.
"""

from . import _C
from ._C import (  # noqa: F401  (re-exported API)
    DebugLevel,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistQueueEmptyError,
    DistStoreError,
    DistStoreTimeoutError,
    DistTimeoutError,
    FileStore,
    Future,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
    Work,
    get_debug_level,
    set_debug_level,
    set_debug_level_from_env,
)

__version__ = _C.__version__


def is_available() -> bool:
    """c10d is always available once its extension module imports."""
    return True


def env_variables():
    """Every environment variable c10d reads, as (name, default, documentation) tuples."""
    return list(_C._env_registry())


def __getattr__(name):
    # Names added by components that register later (e.g. ReduceOp) resolve from _C.
    try:
        return getattr(_C, name)
    except AttributeError:
        raise AttributeError(f"module 'c10d' has no attribute '{name}'") from None
