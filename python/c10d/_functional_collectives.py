"""Functional collectives: out-of-place versions of the collectives, as in
``torch.distributed._functional_collectives`` (``import c10d._functional_collectives as funcol``).

Each function leaves its input unchanged and returns a new tensor of the input's kind, as
torch's AsyncCollectiveTensor: for numpy input an ``AsyncCollectiveTensor`` (a numpy array
with torch's ``wait()``, ``trigger_wait()`` and ``numpy()``), for torch input a torch.Tensor
subclass with the same methods. Computing with either gives plain arrays or tensors. c10d runs
the collectives eagerly, so a result is complete when it is returned; ``wait_tensor`` and
``wait()`` give the plain array or tensor.

``group`` may be a ProcessGroup, a group name, a DeviceMesh (1-D) or (mesh, dim), a list of
global ranks, or a list of lists of ranks (every rank then uses the list it belongs to). Ranks
name the group of exactly those ranks that this rank already has (the default group for all of
them); when there is none, its members create it on first use, among themselves
(``new_group(..., use_local_synchronization=True)``), so ranks outside it need not take part.
Lists of ranks are deprecated in torch and warn (FutureWarning).
"""

import warnings
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from . import distributed_c10d as _c10d
from ._C import ProcessGroup, ReduceOp
from .device_mesh import DeviceMesh

RANK_TYPES = Union[List[int], List[List[int]], ProcessGroup, DeviceMesh, Tuple[DeviceMesh, int],
                   str]

__all__ = [
    "AsyncCollectiveTensor", "wait_tensor", "broadcast", "all_reduce", "all_gather_tensor",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor", "reduce_scatter_tensor_autograd", "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "all_to_all_single",
    "all_to_all_single_autograd", "permute_tensor", "all_gather_tensor_inplace",
    "reduce_scatter_tensor_inplace", "all_reduce_inplace", "all_to_all_inplace",
    "all_gather_inplace", "REDUCE_OP_TO_STR",
]

REDUCE_OP_TO_STR = {
    ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.PRODUCT: "product", ReduceOp.MIN: "min",
    ReduceOp.MAX: "max", ReduceOp.BAND: "band", ReduceOp.BOR: "bor", ReduceOp.BXOR: "bxor",
}

# --------------------------------------------------------------------------------------------
# Groups, reduce ops and tensors of the caller's kind


def _group_of_ranks(ranks: Sequence[int]) -> ProcessGroup:
    """The group of exactly `ranks` (any order) this rank is a member of: the first made of the
    ones it has, or a new one its members make among themselves."""
    wanted = sorted(int(r) for r in ranks)
    me = _c10d.get_rank()
    if me not in wanted:
        raise _c10d._ArgumentError(f"rank {me} is not one of the group's ranks {list(ranks)}")
    if wanted == list(range(_c10d.get_world_size())):
        return _c10d._get_default_group()
    for pg, members in _c10d._world.pg_group_ranks.items():
        if sorted(members) == wanted and pg in _c10d._world.pg_map:
            return pg
    return _c10d.new_group(wanted, use_local_synchronization=True)


def _warn_rank_lists() -> None:
    warnings.warn("groups given as lists of ranks (and a tag) are deprecated, as in torch: pass a "
                  "ProcessGroup, a DeviceMesh or a group name", FutureWarning, stacklevel=4)


def _resolve_group(group: RANK_TYPES, tag: str = "") -> ProcessGroup:
    if isinstance(group, ProcessGroup):
        return group
    if isinstance(group, DeviceMesh):  # SPMD over a 1-D mesh
        if group.ndim != 1:
            raise _c10d._ArgumentError(
                f"a DeviceMesh of {group.ndim} dimensions needs one: pass (mesh, dim)")
        return group.get_group(0)
    if (isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh)
            and isinstance(group[1], (int, str))):  # one dimension of the mesh
        return group[0].get_group(group[1])
    if isinstance(group, str):
        return _c10d._resolve_process_group(group)
    if isinstance(group, (list, tuple)) and group:
        if all(isinstance(g, (list, tuple)) for g in group):
            _warn_rank_lists()
            sizes = {len(g) for g in group}
            if len(sizes) != 1:
                raise _c10d._ArgumentError(f"group sizes must be identical, got {sorted(sizes)}")
            me = _c10d.get_rank()
            mine = [ranks for ranks in group if me in ranks]
            if not mine:
                raise _c10d._ArgumentError(f"rank {me} is in none of the groups {group}")
            return _group_of_ranks(mine[0])
        if all(isinstance(r, int) for r in group):
            _warn_rank_lists()
            return _group_of_ranks(group)
    raise _c10d._DistValueError(f"Unsupported group type: {type(group).__name__}, {group!r}")


def _reduce_op(name) -> ReduceOp:
    if isinstance(name, ReduceOp) or isinstance(name, type(ReduceOp.SUM)):
        return name
    op = getattr(ReduceOp, str(name).upper(), None)
    if op is None or str(name).upper() in ("UNUSED", "PREMUL_SUM"):
        raise _c10d._DistValueError(f"unknown reduce op {name!r}: expected one of "
                                    f"{', '.join(REDUCE_OP_TO_STR.values())}")
    return op


def _is_torch(t) -> bool:
    return type(t).__module__.startswith("torch")


def _empty(like, shape):
    if _is_torch(like):
        return like.new_empty(tuple(shape))
    return np.empty(tuple(shape), dtype=np.asarray(like).dtype)


def _contiguous(t):
    """`t` itself when C-contiguous, else a C-contiguous copy (for inputs only read)."""
    if _is_torch(t):
        return t.detach().contiguous()
    return np.ascontiguousarray(t)


def _clone(t):
    """A C-contiguous copy of `t`, of its kind (for results computed in place)."""
    if _is_torch(t):
        c = t.detach().contiguous()
        return c.clone() if c.data_ptr() == t.data_ptr() else c
    return np.array(t, copy=True, order="C")


def _move_dim_chunks(t, parts: int, src_dim: int, dst_dim: int):
    """Splits `t` into `parts` equal chunks along src_dim and concatenates them along dst_dim."""
    if _is_torch(t):
        import torch
        return torch.cat(torch.chunk(t, parts, dim=src_dim), dim=dst_dim).contiguous()
    return np.ascontiguousarray(np.concatenate(np.split(t, parts, axis=src_dim), axis=dst_dim))


def _shape(t) -> List[int]:
    return list(t.shape)


# --------------------------------------------------------------------------------------------
# Results


def _plain(x):
    """x with every AsyncCollectiveTensor in it (also inside lists, tuples and dicts) replaced
    by the plain array it holds."""
    if isinstance(x, AsyncCollectiveTensor):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


class AsyncCollectiveTensor(np.ndarray):
    """The result of a functional collective on numpy input, as torch's class of this name:
    ``wait()`` (and ``wait_tensor``) return the plain array, and computing with it gives plain
    arrays, while views of it (slices, reshapes) stay AsyncCollectiveTensors. c10d's
    collectives are complete when they return, so nothing is ever pending."""

    def __new__(cls, elem):
        return np.asarray(elem).view(cls)

    @property
    def elem(self) -> np.ndarray:
        return self.view(np.ndarray)

    @property
    def completed(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self.elem

    def trigger_wait(self) -> np.ndarray:
        return self.elem

    def numpy(self) -> np.ndarray:
        return self.elem

    def tolist(self):
        return self.elem.tolist()

    def _get_acs_underlying_tensor(self) -> np.ndarray:
        return self.elem

    def __repr__(self) -> str:
        return f"AsyncCollectiveTensor({self.elem!r})"

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = _plain(kwargs["out"])
        return getattr(ufunc, method)(*_plain(inputs), **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return func(*_plain(args), **_plain(kwargs))


_torch_result_class = None


def _torch_result(t):
    """t as torch's AsyncCollectiveTensor behaves: a tensor (sharing t's storage) with wait(),
    trigger_wait() and numpy(), whose operations give plain tensors. The class is made on
    first use, so that c10d imports torch only for callers that pass torch tensors."""
    global _torch_result_class
    if _torch_result_class is None:
        import torch

        class AsyncCollectiveTensor(torch.Tensor):  # noqa: F811 (torch's counterpart)
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                with torch._C.DisableTorchFunction():
                    return func(*args, **(kwargs or {}))

            @property
            def completed(self) -> bool:
                return True

            def wait(self):
                return self.as_subclass(torch.Tensor)

            def trigger_wait(self):
                return self.wait()

            def _get_acs_underlying_tensor(self):
                return self.wait()

            def numpy(self):
                return self.wait().numpy()

            def tolist(self):
                return self.wait().tolist()

            def __repr__(self):
                return f"AsyncCollectiveTensor({self.wait()!r})"

        _torch_result_class = AsyncCollectiveTensor
    return t.as_subclass(_torch_result_class)


def _maybe_wrap_tensor(t):
    """A collective's result as the caller gets it, wrapped as torch's AsyncCollectiveTensor:
    numpy arrays as AsyncCollectiveTensor, torch tensors as its torch counterpart."""
    if isinstance(t, np.ndarray):
        return t if isinstance(t, AsyncCollectiveTensor) else AsyncCollectiveTensor(t)
    if _is_torch(t) and type(t) is not _torch_result_class:
        return _torch_result(t)
    return t


# --------------------------------------------------------------------------------------------
# Collectives


def wait_tensor(tensor):
    """The plain tensor of a functional collective's result (complete already in c10d)."""
    if isinstance(tensor, AsyncCollectiveTensor) or (
            _torch_result_class is not None and isinstance(tensor, _torch_result_class)):
        return tensor.wait()
    return tensor


def broadcast(self, src: int, group: RANK_TYPES, tag: str = ""):
    """A copy of rank `src`'s tensor (`src` is a rank of the group) on every rank."""
    pg = _resolve_group(group, tag)
    out = _clone(self)
    _c10d.broadcast(out, group=pg, group_src=src)
    return _maybe_wrap_tensor(out)


def all_reduce(self, reduceOp: str, group: RANK_TYPES, tag: str = ""):
    """The reduction (``"sum"``, ``"avg"``, ``"max"``, ...) of every rank's tensor."""
    pg = _resolve_group(group, tag)
    out = _clone(self)
    _c10d.all_reduce(out, op=_reduce_op(reduceOp), group=pg)
    return _maybe_wrap_tensor(out)


def all_gather_tensor(self, gather_dim: int, group: RANK_TYPES, tag: str = ""):
    """Every rank's tensor, concatenated along `gather_dim` in rank order."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    shape = _shape(self) or [1]
    out = _empty(self, [shape[0] * n] + shape[1:])
    _c10d.all_gather_into_tensor(out, _contiguous(self).reshape(shape), group=pg)
    if gather_dim != 0 and n > 1:
        out = _move_dim_chunks(out, n, 0, gather_dim)
    return _maybe_wrap_tensor(out)


def _check_scatter_dim(what: str, tensor, scatter_dim: int, n: int) -> None:
    shape = _shape(tensor)
    if not shape or shape[scatter_dim] % n != 0:
        raise _c10d._ArgumentError(
            f"{what}: dimension {scatter_dim} of the input (shape {shape}) must be a multiple "
            f"of the group size {n}")


def reduce_scatter_tensor(self, reduceOp: str, scatter_dim: int, group: RANK_TYPES,
                          tag: str = ""):
    """This rank's chunk (along `scatter_dim`, in rank order) of the reduction of every rank's
    tensor."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    _check_scatter_dim("reduce_scatter_tensor", self, scatter_dim, n)
    # Chunk j along scatter_dim goes to rank j: with the chunks stacked along dimension 0,
    # rank j's block of the flat input is that chunk, already in the output's shape.
    flat = _contiguous(self) if scatter_dim == 0 else _move_dim_chunks(self, n, scatter_dim, 0)
    flat_shape = _shape(flat)
    out = _empty(self, [flat_shape[0] // n] + flat_shape[1:])
    _c10d.reduce_scatter_tensor(out, flat, op=_reduce_op(reduceOp), group=pg)
    return _maybe_wrap_tensor(out)


def all_reduce_coalesced(self: List, reduceOp: str, group: RANK_TYPES, tag: str = ""):
    """all_reduce of each tensor of the list."""
    return [all_reduce(t, reduceOp, group, tag) for t in self]


def all_gather_into_tensor_coalesced(self: List, group: RANK_TYPES, tag: str = ""):
    """all_gather_tensor (along dimension 0) of each tensor of the list."""
    return [all_gather_tensor(t, 0, group, tag) for t in self]


def reduce_scatter_tensor_coalesced(inputs: List, reduceOp: str, scatter_dim: List[int],
                                    group: RANK_TYPES, tag: str = ""):
    """reduce_scatter_tensor of each tensor of the list, along its entry of `scatter_dim`."""
    if len(scatter_dim) != len(inputs):
        raise _c10d._ArgumentError("reduce_scatter_tensor_coalesced: scatter_dim needs one "
                                   "entry per input")
    n = _resolve_group(group, tag).size()
    for i, (t, d) in enumerate(zip(inputs, scatter_dim)):  # all checked before any runs
        _check_scatter_dim(f"reduce_scatter_tensor_coalesced: input {i}", t, d, n)
    return [reduce_scatter_tensor(t, reduceOp, d, group, tag)
            for t, d in zip(inputs, scatter_dim)]


def all_to_all_single(self, output_split_sizes: Optional[List[int]],
                      input_split_sizes: Optional[List[int]], group: RANK_TYPES, tag: str = ""):
    """Rows ``input_split_sizes[j]`` of this rank's tensor go to rank j; the result holds the
    rows every rank sent here, in rank order (equal splits of dimension 0 when both are None)."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    shape = _shape(self) or [1]
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise _c10d._ArgumentError("output_split_sizes and input_split_sizes must either be "
                                   "specified together or both set to None")
    if output_split_sizes is None:
        output_split_sizes = [shape[0] // n] * n
        input_split_sizes = output_split_sizes
    out = _empty(self, [sum(output_split_sizes)] + shape[1:])
    _c10d.all_to_all_single(out, _contiguous(self).reshape(shape), list(output_split_sizes),
                            list(input_split_sizes), group=pg)
    return _maybe_wrap_tensor(out)


def permute_tensor(self, src_dst: List[int], group: RANK_TYPES, tag: str = ""):
    """Group rank m's tensor goes to group rank src_dst[m]; returns what this rank receives."""
    pg = _resolve_group(group, tag)
    n, me = pg.size(), pg.rank()
    numel = int(np.prod(_shape(self), dtype=np.int64))
    out_splits, in_splits = [0] * n, [0] * n
    for src, dst in enumerate(src_dst):
        if src == me:
            in_splits[dst] = numel
        if dst == me:
            out_splits[src] = numel
    flat = _contiguous(self).reshape(-1)
    got = all_to_all_single(flat, out_splits, in_splits, pg, tag)
    # One tensor received (src_dst a permutation): in the input's shape. Otherwise, as in
    # torch, whatever arrived, flat and in rank order.
    return _maybe_wrap_tensor(got.reshape(_shape(self)) if sum(out_splits) == numel else got)


# c10d has no autograd: the autograd variants are the plain ones.
all_gather_tensor_autograd = all_gather_tensor
reduce_scatter_tensor_autograd = reduce_scatter_tensor
all_to_all_single_autograd = all_to_all_single


# --------------------------------------------------------------------------------------------
# In-place forms with the signatures of the classic collectives (torch maps those onto the
# functional ones when tracing); synchronous only.


def _copy_into(dst, src):
    if _is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src)
    return dst


def _sync_only(async_op: bool, name: str) -> None:
    if async_op:
        raise _c10d._ArgumentError(f"{name}: the in-place functional form has no async "
                                   "version")


def all_gather_tensor_inplace(output_tensor, input_tensor, group=None, async_op: bool = False,
                              tag: str = "", gather_dim: int = 0):
    _sync_only(async_op, "all_gather_tensor_inplace")
    return _copy_into(output_tensor,
                      all_gather_tensor(input_tensor, gather_dim, _c10d._resolve_group(group), tag))


def reduce_scatter_tensor_inplace(output, input, op="sum", group=None, async_op: bool = False,
                                  scatter_dim: int = 0, tag: str = ""):
    _sync_only(async_op, "reduce_scatter_tensor_inplace")
    pg = _c10d._resolve_group(group)
    return _copy_into(output, reduce_scatter_tensor(input, op, scatter_dim, pg, tag))


def all_reduce_inplace(tensor, op="sum", group=None, async_op: bool = False, tag: str = ""):
    _sync_only(async_op, "all_reduce_inplace")
    return _copy_into(tensor, all_reduce(tensor, op, _c10d._resolve_group(group), tag))


def all_to_all_inplace(output, input, output_split_sizes=None, input_split_sizes=None,
                       group=None, async_op=False, tag: str = ""):
    _sync_only(async_op, "all_to_all_inplace")
    return _copy_into(output, all_to_all_single(input, output_split_sizes, input_split_sizes,
                                                _c10d._resolve_group(group), tag))


def all_gather_inplace(tensor_list, tensor, group=None, async_op=False, tag: str = ""):
    _sync_only(async_op, "all_gather_inplace")
    rows = _shape(tensor)[0] if _shape(tensor) else 1
    if any((_shape(t)[0] if _shape(t) else 1) != rows for t in tensor_list):
        raise _c10d._ArgumentError("all_gather_inplace: every output must have the input's "
                                   "first dimension")
    gathered = all_gather_tensor(tensor, 0, _c10d._resolve_group(group), tag)
    for i, dst in enumerate(tensor_list):
        _copy_into(dst, gathered[i * rows:(i + 1) * rows].reshape(_shape(dst)))
    return tensor_list
