"""Functional collectives: out-of-place versions of the collectives, as in
``torch.distributed._functional_collectives`` (``import c10d._functional_collectives as funcol``).

Each function leaves its input unchanged and returns a new tensor of the input's kind, as
torch's AsyncCollectiveTensor: for numpy input an ``AsyncCollectiveTensor`` (a numpy array
with torch's ``wait()``, ``trigger_wait()`` and ``numpy()``), for torch input a torch.Tensor
subclass with the same methods. Computing with either gives plain arrays or tensors. c10d runs
the collectives eagerly, so a result is complete when it is returned; ``wait_tensor`` and
``wait()`` give the plain array or tensor.

On torch tensors that require grad (outside ``torch.no_grad()``) the collectives are
differentiable, as torch's are: the backward of all_gather is a summing reduce_scatter and the
other way round, all_to_all_single sends the gradients back with the splits swapped, and
all_reduce all-reduces them. Backward supports "sum" only and says so when it runs; broadcast
passes the gradient through unchanged with a warning, as torch does. The ``*_autograd`` names
are the same functions; the ``*_tensor`` spellings warn that torch 2.13 deprecates them in
favour of ``all_gather_single`` and ``reduce_scatter_single``.

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
from ._binding_additions import _wait_registered_work
from ._C import ProcessGroup, ReduceOp
from .device_mesh import DeviceMesh

RANK_TYPES = Union[
    List[int], List[List[int]], ProcessGroup, DeviceMesh, Tuple[DeviceMesh, int], str
]

__all__ = [
    "AsyncCollectiveTensor",
    "wait_tensor",
    "broadcast",
    "all_reduce",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_single",
    "all_gather_single_autograd",
    "reduce_scatter_single",
    "reduce_scatter_single_autograd",
    "all_gather_single_coalesced",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "permute_tensor",
    "all_gather_tensor_inplace",
    "reduce_scatter_tensor_inplace",
    "all_reduce_inplace",
    "all_to_all_inplace",
    "all_gather_inplace",
    "REDUCE_OP_TO_STR",
]

REDUCE_OP_TO_STR = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
}

# --------------------------------------------------------------------------------------------
# Groups, reduce ops and tensors of the caller's kind


def _group_of_ranks(ranks: Sequence[int], tag: str = "") -> ProcessGroup:
    """The group of exactly `ranks` (any order) this rank is a member of: the one with `tag`,
    else the first made of the ones it has, else a new one its members make among themselves."""
    wanted = sorted(int(r) for r in ranks)
    me = _c10d.get_rank()
    if me not in wanted:
        raise _c10d._ArgumentError(f"rank {me} is not one of the group's ranks {list(ranks)}")
    tagged = _c10d._find_pg_by_ranks_and_tag(tag, wanted) if tag else None
    if tagged is not None:
        return tagged
    if wanted == list(range(_c10d.get_world_size())):
        return _c10d._get_default_group()
    for pg, members in _c10d._world.pg_group_ranks.items():
        if sorted(members) == wanted and pg in _c10d._world.pg_map:
            return pg
    return _c10d.new_group(wanted, use_local_synchronization=True)


def _warn_rank_lists() -> None:
    warnings.warn(
        "groups given as lists of ranks (and a tag) are deprecated, as in torch: pass a "
        "ProcessGroup, a DeviceMesh or a group name",
        FutureWarning,
        stacklevel=4,
    )


def _resolve_group(group: RANK_TYPES, tag: str = "") -> ProcessGroup:
    if isinstance(group, ProcessGroup):
        return group
    if isinstance(group, DeviceMesh):  # SPMD over a 1-D mesh
        if group.ndim != 1:
            raise _c10d._ArgumentError(
                f"a DeviceMesh of {group.ndim} dimensions needs one: pass (mesh, dim)"
            )
        return group.get_group(0)
    if (
        isinstance(group, tuple)
        and len(group) == 2
        and isinstance(group[0], DeviceMesh)
        and isinstance(group[1], (int, str))
    ):  # one dimension of the mesh
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
            return _group_of_ranks(mine[0], tag)
        if all(isinstance(r, int) for r in group):
            _warn_rank_lists()
            return _group_of_ranks(group, tag)
    raise _c10d._DistValueError(f"Unsupported group type: {type(group).__name__}, {group!r}")


def _expand_group(group: RANK_TYPES, tag: str = "") -> Tuple[str, List[int], int]:
    """(tag, global ranks, group size) of `group` in any of the forms the collectives take;
    for a list of rank lists, the ranks of all of them."""
    if isinstance(group, list) and group and isinstance(group[0], list):
        sizes = {len(ranks) for ranks in group}
        if len(sizes) != 1:
            raise _c10d._DistValueError(f"group sizes must be identical, got {sorted(sizes)}")
        return tag, [r for ranks in group for r in ranks], sizes.pop()
    if isinstance(group, list):
        return tag, list(group), len(group)
    if isinstance(group, (ProcessGroup, DeviceMesh, tuple)):
        pg = _resolve_group(group, tag)
        ranks = _c10d.get_process_group_ranks(pg)
        return tag or _c10d._get_group_tag(pg), ranks, len(ranks)
    raise _c10d._DistValueError(
        "Invalid type for group, must be one of List, Processgroup, "
        f"DeviceMesh or (DeviceMesh, int), got {type(group).__name__}"
    )


def _resolve_group_name(group: RANK_TYPES, tag: str = "") -> str:
    """The registered name of `group` (given in any of the forms the collectives take)."""
    if isinstance(group, str):
        return group
    if isinstance(group, list):
        _warn_rank_lists()
        if group and isinstance(group[0], list):
            me = _c10d.get_rank()
            group = next((ranks for ranks in group if me in ranks), group[0])
        return _c10d._resolve_group_name_by_ranks_and_tag(list(group), tag)
    return _resolve_group(group, tag).group_name


def _reduce_op(name) -> ReduceOp:
    if isinstance(name, ReduceOp) or isinstance(name, type(ReduceOp.SUM)):
        return name
    op = getattr(ReduceOp, str(name).upper(), None)
    if op is None or str(name).upper() in ("UNUSED", "PREMUL_SUM"):
        raise _c10d._DistValueError(
            f"unknown reduce op {name!r}: expected one of {', '.join(REDUCE_OP_TO_STR.values())}"
        )
    return op


def _op_name(name) -> str:
    """The lower-case name of a reduce op given as a name or a ReduceOp (checked)."""
    op = _reduce_op(name)
    return REDUCE_OP_TO_STR.get(op) or str(name).lower()


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


def _flat(t):
    """t as one dimension; for torch tensors a differentiable reshape."""
    if _is_torch(t):
        return t.reshape(-1)
    return np.ascontiguousarray(t).reshape(-1)


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
# The collectives along dimension 0, on plain arrays or detached tensors


def _raw_broadcast(x, src: int, pg: ProcessGroup):
    out = _clone(x)
    _c10d.broadcast(out, group=pg, group_src=src)
    return out


def _raw_all_reduce(x, op: str, pg: ProcessGroup):
    out = _clone(x)
    _c10d.all_reduce(out, op=_reduce_op(op), group=pg)
    return out


def _raw_all_gather(x, pg: ProcessGroup):
    shape = _shape(x) or [1]
    out = _empty(x, [shape[0] * pg.size()] + shape[1:])
    _c10d.all_gather_into_tensor(out, _contiguous(x).reshape(shape), group=pg)
    return out


def _raw_reduce_scatter(x, op: str, pg: ProcessGroup):
    flat = _contiguous(x)
    shape = _shape(flat)
    out = _empty(x, [shape[0] // pg.size()] + shape[1:])
    _c10d.reduce_scatter_tensor(out, flat, op=_reduce_op(op), group=pg)
    return out


def _raw_all_to_all(
    x, output_split_sizes: List[int], input_split_sizes: List[int], pg: ProcessGroup
):
    shape = _shape(x) or [1]
    out = _empty(x, [sum(output_split_sizes)] + shape[1:])
    _c10d.all_to_all_single(
        out,
        _contiguous(x).reshape(shape),
        list(output_split_sizes),
        list(input_split_sizes),
        group=pg,
    )
    return out


# --------------------------------------------------------------------------------------------
# Autograd: on torch tensors that require grad, each collective is a torch.autograd.Function
# whose backward runs the collective that transposes it, as torch's functional collectives do.


def _tracks_grad(t) -> bool:
    if not _is_torch(t) or not getattr(t, "requires_grad", False):
        return False
    import torch

    return torch.is_grad_enabled()


def _sum_only(name: str, op: str) -> None:
    # Checked at backward time, as torch does: a forward with another op is fine on its own.
    if op != "sum":
        raise RuntimeError(f"{name} backward only supports 'sum' reduction, got '{op}'")


_grad_fns = None


def _differentiable():
    """The autograd Functions of the collectives, made on first use: c10d imports torch only for
    callers that pass torch tensors."""
    global _grad_fns
    if _grad_fns is not None:
        return _grad_fns
    import torch

    class Broadcast(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, src, pg):
            return _raw_broadcast(x, src, pg)

        @staticmethod
        def backward(ctx, grad):
            # torch defines no backward for broadcast: its autograd fallback warns and passes
            # the gradient through unchanged on every rank.
            warnings.warn(
                "broadcast has no backward: the gradient passes through unchanged on "
                "every rank (not summed onto the source), as in torch",
                UserWarning,
            )
            return grad, None, None

    class AllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, op, pg):
            ctx.op, ctx.pg = op, pg
            return _raw_all_reduce(x, op, pg)

        @staticmethod
        def backward(ctx, grad):
            _sum_only("all_reduce", ctx.op)
            return _raw_all_reduce(grad.contiguous(), "sum", ctx.pg), None, None

    class AllGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, pg):
            ctx.shape, ctx.pg = x.shape, pg
            return _raw_all_gather(x, pg)

        @staticmethod
        def backward(ctx, grad):
            out = _raw_reduce_scatter(grad.contiguous(), "sum", ctx.pg)
            return out.reshape(ctx.shape), None

    class ReduceScatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, op, pg):
            ctx.shape, ctx.op, ctx.pg = x.shape, op, pg
            return _raw_reduce_scatter(x, op, pg)

        @staticmethod
        def backward(ctx, grad):
            _sum_only("reduce_scatter_tensor", ctx.op)
            return _raw_all_gather(grad.contiguous(), ctx.pg).reshape(ctx.shape), None, None

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, output_split_sizes, input_split_sizes, pg):
            ctx.shape, ctx.pg = x.shape, pg
            ctx.splits = (list(output_split_sizes), list(input_split_sizes))
            return _raw_all_to_all(x, output_split_sizes, input_split_sizes, pg)

        @staticmethod
        def backward(ctx, grad):
            # What this rank received goes back to where it came from: the splits swap.
            received, sent = ctx.splits
            out = _raw_all_to_all(grad.contiguous(), sent, received, ctx.pg)
            return out.reshape(ctx.shape), None, None, None

    _grad_fns = {
        "broadcast": (Broadcast, _raw_broadcast),
        "all_reduce": (AllReduce, _raw_all_reduce),
        "all_gather": (AllGather, _raw_all_gather),
        "reduce_scatter": (ReduceScatter, _raw_reduce_scatter),
        "all_to_all": (AllToAll, _raw_all_to_all),
    }
    return _grad_fns


_RAW = {
    "broadcast": _raw_broadcast,
    "all_reduce": _raw_all_reduce,
    "all_gather": _raw_all_gather,
    "reduce_scatter": _raw_reduce_scatter,
    "all_to_all": _raw_all_to_all,
}


def _run(name: str, x, *args):
    """Collective `name` on x: recorded by autograd when x requires grad."""
    if _tracks_grad(x):
        return _differentiable()[name][0].apply(x, *args)
    return _RAW[name](x, *args)


# --------------------------------------------------------------------------------------------
# Collectives


def wait_tensor(tensor):
    """The plain tensor of a functional collective's result (complete already in c10d), once
    the Work registered for it with ``_register_work`` (if any) has finished."""
    _wait_registered_work(tensor)
    if isinstance(tensor, AsyncCollectiveTensor) or (
        _torch_result_class is not None and isinstance(tensor, _torch_result_class)
    ):
        return tensor.wait()
    return tensor


def broadcast(self, src: int, group: RANK_TYPES, tag: str = ""):
    """A copy of rank `src`'s tensor (`src` is a rank of the group) on every rank."""
    return _maybe_wrap_tensor(_run("broadcast", self, src, _resolve_group(group, tag)))


def all_reduce(self, reduceOp: str, group: RANK_TYPES, tag: str = ""):
    """The reduction (``"sum"``, ``"avg"``, ``"max"``, ...) of every rank's tensor."""
    pg = _resolve_group(group, tag)
    return _maybe_wrap_tensor(_run("all_reduce", self, _op_name(reduceOp), pg))


def all_gather_single(self, gather_dim: int, group: RANK_TYPES, tag: str = ""):
    """Every rank's tensor, concatenated along `gather_dim` in rank order."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    out = _run("all_gather", self, pg)
    if gather_dim == 0:
        return _maybe_wrap_tensor(out)
    # As torch: a plain result, unless the chunks concatenate as a view (one row per rank and
    # nothing between dimension 0 and gather_dim).
    shape = _shape(out)
    as_view = shape[0] == n and int(np.prod(shape[1:gather_dim], dtype=np.int64)) == 1
    if n > 1:
        out = _move_dim_chunks(out, n, 0, gather_dim)
    return _maybe_wrap_tensor(out) if as_view else out


def _check_scatter_dim(what: str, tensor, scatter_dim: int, n: int) -> None:
    shape = _shape(tensor)
    if not shape or shape[scatter_dim] % n != 0:
        raise _c10d._ArgumentError(
            f"{what}: dimension {scatter_dim} of the input (shape {shape}) must be a multiple "
            f"of the group size {n}"
        )


def reduce_scatter_single(self, reduceOp: str, scatter_dim: int, group: RANK_TYPES, tag: str = ""):
    """This rank's chunk (along `scatter_dim`, in rank order) of the reduction of every rank's
    tensor."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    _check_scatter_dim("reduce_scatter_tensor", self, scatter_dim, n)
    # Chunk j along scatter_dim goes to rank j: with the chunks stacked along dimension 0,
    # rank j's block of the flat input is that chunk, already in the output's shape.
    flat = self if scatter_dim == 0 else _move_dim_chunks(self, n, scatter_dim, 0)
    return _maybe_wrap_tensor(_run("reduce_scatter", flat, _op_name(reduceOp), pg))


# Differentiable on torch tensors like the plain ones; the names say so, as torch's do.
all_gather_single_autograd = all_gather_single
reduce_scatter_single_autograd = reduce_scatter_single


def _deprecated(old: str, new):
    """`new` under its old name, warning as torch 2.13 does for the *_tensor spellings."""

    def call(*args, **kwargs):
        warnings.warn(
            f"c10d._functional_collectives.{old} is deprecated, as in torch: use "
            f"{new.__name__} instead",
            FutureWarning,
            stacklevel=2,
        )
        return new(*args, **kwargs)

    call.__name__ = call.__qualname__ = old
    call.__doc__ = f"Deprecated name of :func:`{new.__name__}`."
    return call


all_gather_tensor = _deprecated("all_gather_tensor", all_gather_single)
all_gather_tensor_autograd = _deprecated("all_gather_tensor_autograd", all_gather_single_autograd)
reduce_scatter_tensor = _deprecated("reduce_scatter_tensor", reduce_scatter_single)
reduce_scatter_tensor_autograd = _deprecated(
    "reduce_scatter_tensor_autograd", reduce_scatter_single_autograd
)


def all_reduce_coalesced(self: List, reduceOp: str, group: RANK_TYPES, tag: str = ""):
    """all_reduce of each tensor of the list."""
    return [all_reduce(t, reduceOp, group, tag) for t in self]


def all_gather_single_coalesced(self: List, group: RANK_TYPES, tag: str = ""):
    """all_gather_single (along dimension 0) of each tensor of the list."""
    return [all_gather_single(t, 0, group, tag) for t in self]


def reduce_scatter_single_coalesced(
    inputs: List, reduceOp: str, scatter_dim: List[int], group: RANK_TYPES, tag: str = ""
):
    """reduce_scatter_single of each tensor of the list, along its entry of `scatter_dim`."""
    if len(scatter_dim) != len(inputs):
        raise _c10d._ArgumentError(
            f"reduce_scatter_tensor_coalesced: scatter_dim has {len(scatter_dim)} entries for "
            f"{len(inputs)} inputs: it needs one per input"
        )
    n = _resolve_group(group, tag).size()
    for i, (t, d) in enumerate(zip(inputs, scatter_dim)):  # all checked before any runs
        _check_scatter_dim(f"reduce_scatter_tensor_coalesced: input {i}", t, d, n)
    return [reduce_scatter_single(t, reduceOp, d, group, tag) for t, d in zip(inputs, scatter_dim)]


all_gather_into_tensor_coalesced = _deprecated(
    "all_gather_into_tensor_coalesced", all_gather_single_coalesced
)
reduce_scatter_tensor_coalesced = _deprecated(
    "reduce_scatter_tensor_coalesced", reduce_scatter_single_coalesced
)


def all_to_all_single(
    self,
    output_split_sizes: Optional[List[int]],
    input_split_sizes: Optional[List[int]],
    group: RANK_TYPES,
    tag: str = "",
):
    """Rows ``input_split_sizes[j]`` of this rank's tensor go to rank j; the result holds the
    rows every rank sent here, in rank order (equal splits of dimension 0 when both are None)."""
    pg = _resolve_group(group, tag)
    n = pg.size()
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise _c10d._ArgumentError(
            "output_split_sizes and input_split_sizes must either be "
            "specified together or both set to None"
        )
    if output_split_sizes is None:
        output_split_sizes = [(_shape(self) or [1])[0] // n] * n
        input_split_sizes = output_split_sizes
    return _maybe_wrap_tensor(
        _run(
            "all_to_all",
            self,
            [int(s) for s in output_split_sizes],
            [int(s) for s in input_split_sizes],
            pg,
        )
    )


all_to_all_single_autograd = all_to_all_single


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
    got = _run("all_to_all", _flat(self), out_splits, in_splits, pg)
    # One tensor received (src_dst a permutation): in the input's shape. Otherwise, as in
    # torch, whatever arrived, flat and in rank order.
    return _maybe_wrap_tensor(got.reshape(_shape(self)) if sum(out_splits) == numel else got)


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
        raise _c10d._ArgumentError(f"{name}: the in-place functional form has no async version")


def all_gather_tensor_inplace(
    output_tensor,
    input_tensor,
    group=None,
    async_op: bool = False,
    tag: str = "",
    gather_dim: int = 0,
):
    _sync_only(async_op, "all_gather_tensor_inplace")
    return _copy_into(
        output_tensor, all_gather_single(input_tensor, gather_dim, _c10d._resolve_group(group), tag)
    )


def reduce_scatter_tensor_inplace(
    output, input, op="sum", group=None, async_op: bool = False, scatter_dim: int = 0, tag: str = ""
):
    _sync_only(async_op, "reduce_scatter_tensor_inplace")
    pg = _c10d._resolve_group(group)
    return _copy_into(output, reduce_scatter_single(input, op, scatter_dim, pg, tag))


def all_reduce_inplace(tensor, op="sum", group=None, async_op: bool = False, tag: str = ""):
    _sync_only(async_op, "all_reduce_inplace")
    return _copy_into(tensor, all_reduce(tensor, op, _c10d._resolve_group(group), tag))


def all_to_all_inplace(
    output,
    input,
    output_split_sizes=None,
    input_split_sizes=None,
    group=None,
    async_op=False,
    tag: str = "",
):
    _sync_only(async_op, "all_to_all_inplace")
    return _copy_into(
        output,
        all_to_all_single(
            input, output_split_sizes, input_split_sizes, _c10d._resolve_group(group), tag
        ),
    )


def all_gather_inplace(tensor_list, tensor, group=None, async_op=False, tag: str = ""):
    _sync_only(async_op, "all_gather_inplace")
    rows = _shape(tensor)[0] if _shape(tensor) else 1
    if any((_shape(t)[0] if _shape(t) else 1) != rows for t in tensor_list):
        raise _c10d._ArgumentError(
            "all_gather_inplace: every output must have the input's first dimension"
        )
    gathered = all_gather_single(tensor, 0, _c10d._resolve_group(group), tag)
    for i, dst in enumerate(tensor_list):
        _copy_into(dst, gathered[i * rows : (i + 1) * rows].reshape(_shape(dst)))
    return tensor_list
