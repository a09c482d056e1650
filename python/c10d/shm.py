"""Arrays in the shared memory of an ``"shm"`` process group.

Collectives on such arrays let the shm backend read the peers' copies directly (each rank
writes only its own) instead of staging the data through its own buffers (the CPU counterpart
of CUDA symmetric memory). Allocation is local: every rank allocates its own array, no rank
waits for another.
"""

from typing import Optional, Sequence, Union

from . import _C


def _dtype_name(dtype) -> str:
    text = str(dtype)
    if text.startswith("torch."):  # torch.float32 -> float32
        return text[len("torch.") :]
    try:
        import numpy as np

        return np.dtype(dtype).name
    except TypeError:
        return text


def shm_empty(shape: Union[int, Sequence[int]], dtype="float32", group: Optional[object] = None):
    """An uninitialised C-contiguous array of `shape` and `dtype` in this rank's shared heap of
    `group` (default: the world group), which must use the shm backend. Returns a numpy array
    (a DLPack capsule for dtypes numpy lacks, e.g. bfloat16). The memory stays valid after the
    group is destroyed; its size is bounded by C10D_SHM_HEAP_BYTES per rank and group."""
    from .distributed_c10d import _resolve_group

    pg = _resolve_group(group)
    backend = pg._get_backend("cpu")
    if not hasattr(_C, "ProcessGroupShm") or not isinstance(backend, _C.ProcessGroupShm):
        raise ValueError(
            f"shm_empty needs a process group with the shm backend, got {type(backend).__name__}"
        )
    dims = [int(shape)] if isinstance(shape, int) else [int(s) for s in shape]
    return backend._empty(dims, _dtype_name(dtype))
