"""c10d's backends inside PyTorch: ``init_process_group("c10d_shm")`` for torch's own DDP.

Importing this module registers three backends with ``torch.distributed``:

* ``"c10d_shm"``: c10d's shared-memory backend (every rank of a group on one host);
* ``"c10d_gloo"``: c10d's Gloo backend;
* ``"c10d"``: shm when every rank of the group is on one host, else c10d's hierarchical
  backend (shm within hosts, Gloo between them; Gloo where c10d was built without it).

A group of these backends is a Python subclass of ``torch.distributed.ProcessGroup`` that
hands each collective and point-to-point operation to a c10d process group on the tensors'
own memory (nothing is copied), and returns ``torch.distributed`` Works whose futures complete
when c10d's do. Errors of c10d reach torch as ``torch.distributed.DistBackendError`` (or
``DistNetworkError`` / ``DistStoreError``), which are also c10d's exception classes; through a
Work's future (and so DDP's backward) they arrive as RuntimeError naming that class, as torch's
futures carry errors.

An existing torch program switches with two lines::

    import c10d.torch_backend  # noqa: F401
    torch.distributed.init_process_group("c10d_shm")

Importing this module imports torch; importing ``c10d`` alone never does. It is one module of
about 850 lines because importing it must register the backends and mirror the default group
at once, and most of it is ProcessGroupC10d's one method per torch collective.
"""

import functools
import socket
import sys
import threading
import warnings
from datetime import timedelta
from typing import Any, Dict, List

import torch
import torch.distributed as tdist
from torch._C import _distributed_c10d as _tc10d

from . import _C
from . import distributed_c10d as _dc

__all__ = ["BACKENDS", "ProcessGroupC10d", "register", "is_mirrored"]

# The torch releases this module is tested with (pyproject.toml's "torch" extra).
TESTED_TORCH = ((2, 11), (2, 14))


def _check_torch_version(version: str) -> None:
    """Warns when `version` (torch.__version__) lies outside TESTED_TORCH."""
    try:
        found = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        found = None
    low, high = TESTED_TORCH
    if found is None or not low <= found <= high:
        warnings.warn(
            f"c10d.torch_backend is tested with torch {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
            f"torch {version} may work but is untested",
            RuntimeWarning,
            stacklevel=3,
        )


_check_torch_version(torch.__version__)

BACKENDS = ("c10d_shm", "c10d_gloo", "c10d")

# torch's "no timeout given" option value (-1 ms): the group's own timeout applies.
_UNSET_TIMEOUT = tdist.AllreduceOptions().timeout
# Backend names torch's C++ knows, and treats a group of as its own backend's.
_TORCH_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
_NO_WAIT_TIMEOUT = timedelta(0)


# --------------------------------------------------------------------------------------------
# Errors: c10d's exceptions re-raised as torch's (and still c10d's) classes

_ERROR_CLASSES: Dict[type, type] = {}


def _torch_error_class(cls: type) -> type:
    """A class that is both torch's DistError kind for `cls` and `cls` itself, so that both
    ``except torch.distributed.DistBackendError`` and ``except c10d.DistTimeoutError`` work."""
    made = _ERROR_CLASSES.get(cls)
    if made is None:
        if issubclass(cls, _C.DistNetworkError):
            base = tdist.DistNetworkError
        elif issubclass(cls, _C.DistStoreError):
            base = tdist.DistStoreError
        else:  # backend failures and timeouts, as torch's Gloo raises them
            base = tdist.DistBackendError
        made = type(cls.__name__, (base, cls), {"__module__": __name__})
        # Importable under its name, so that these errors pickle (torch pickles values).
        globals().setdefault(cls.__name__, made)
        _ERROR_CLASSES[cls] = made
    return made


for _cls in (
    _C.DistBackendError,
    _C.DistTimeoutError,
    _C.DistNetworkError,
    _C.DistStoreError,
    _C.DistStoreTimeoutError,
    _C.DistQueueEmptyError,
    _C.DistError,
):
    _torch_error_class(_cls)


def _to_torch_error(e: BaseException) -> BaseException:
    if isinstance(e, _C.DistError) and not isinstance(e, tdist.DistError):
        translated = _torch_error_class(type(e))(*e.args)
        translated.__cause__ = e
        return translated
    return e


# --------------------------------------------------------------------------------------------
# Stores: each side's store seen through the other's interface


class _Forwarding:
    """The store operations both directions forward as they are (`_store` is the other
    side's store)."""

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def add(self, key, amount):
        return self._store.add(key, amount)

    def compare_set(self, key, expected, desired):
        return self._store.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        if timeout is None:
            self._store.wait(keys)
        else:
            self._store.wait(keys, timeout)

    def check(self, keys):
        return self._store.check(keys)

    def delete_key(self, key):
        return self._store.delete_key(key)

    def num_keys(self):
        return self._store.num_keys()

    def append(self, key, value):
        self._store.append(key, value)

    def multi_get(self, keys):
        return self._store.multi_get(keys)

    def multi_set(self, keys, values):
        self._store.multi_set(keys, values)


class _StoreOverTorch(_Forwarding, _C.Store):
    """A c10d store that forwards to a torch.distributed store (the one torch gives a backend
    creator), so c10d's backends rendezvous on torch's store."""

    def __init__(self, store):
        _C.Store.__init__(self)
        self._store = store
        try:
            self.set_timeout(store.timeout)
        except Exception:  # a Python torch store may not carry one
            pass


class _TorchStoreOverC10d(_Forwarding, tdist.Store):
    """A torch.distributed store that forwards to a c10d store: torch's default group, made
    from c10d's, rendezvous (for its later new_group calls) on c10d's store."""

    def __init__(self, store):
        tdist.Store.__init__(self)
        self._store = store

    # torch's trampoline calls the C++ names for these two
    def deleteKey(self, key):
        return self._store.delete_key(key)

    def getNumKeys(self):
        return self._store.num_keys()


# --------------------------------------------------------------------------------------------
# Tensors and options


def _view(t):
    """`t` as c10d takes it fastest: a numpy view of the same memory when torch can give one
    (c10d reads a numpy array in ~1 us, a tensor through DLPack in ~4 us), else the tensor."""
    if t.requires_grad:
        t = t.detach()  # same storage; DLPack and numpy refuse tensors that require grad
    try:
        return t.numpy()
    except (TypeError, RuntimeError):  # bfloat16, conj/neg views, sparse: DLPack handles them
        return t


def _views(tensors):
    return [_view(t) for t in tensors]


_REDUCE_OPS: Dict[Any, Any] = {}  # by RedOpType
_REDUCE_OPS_BY_HASH: Dict[int, Any] = {}  # by a ReduceOp's hash (see _reduce_op)
_TorchReduceOp = tdist.ReduceOp


def _reduce_op(op):
    """c10d's ReduceOp for torch's `op` (a ReduceOp or RedOpType)."""
    if type(op) is _TorchReduceOp:
        # torch's ReduceOp hashes as its kind's value, which is cheaper to read than `op.op`
        # (~0.2 us against ~0.5; comparing two ReduceOps costs ~1.5). Hashing a PREMUL_SUM
        # raises: it carries its factor and is never cached.
        try:
            found = _REDUCE_OPS_BY_HASH.get(hash(op))
        except RuntimeError:
            found = None
        if found is not None:
            return found
        kind = op.op
    else:
        kind = op
    found = _REDUCE_OPS.get(kind)
    if found is None:
        if kind == _TorchReduceOp.PREMUL_SUM:
            factor = getattr(op, "factor", None)
            if factor is None:
                raise _dc._DistValueError("PREMUL_SUM needs a scalar factor")
            return _C._make_nccl_premul_sum(float(factor))
        found = _REDUCE_OPS[kind] = getattr(_C.ReduceOp, kind.name)
    if type(op) is _TorchReduceOp and hash(op) == int(kind):
        _REDUCE_OPS_BY_HASH[int(kind)] = found
    return found


def _options(cls, opts, **fields):
    """A c10d options object of class `cls` with torch's `opts` asyncOp and timeout."""
    out = cls()
    out.asyncOp = bool(getattr(opts, "asyncOp", True))
    timeout = getattr(opts, "timeout", _UNSET_TIMEOUT)
    if timeout != _UNSET_TIMEOUT and timeout >= timedelta(0):
        out.timeout = timeout
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def _flat(lists):
    return [t for inner in lists for t in inner]


# --------------------------------------------------------------------------------------------
# Works


class _Work(_tc10d.Work):
    """A torch Work over a c10d Work (None: already finished). `result` is what torch gets
    from result() and from the future: the tensors the operation wrote."""

    def __init__(self, work, result, op_name=""):
        super().__init__()
        self._work = work
        self._result = result
        self._future = None
        self._op_name = op_name

    def wait(self, timeout=_NO_WAIT_TIMEOUT):
        if self._work is not None:
            try:
                if timeout:
                    self._work.wait(timeout)
                else:
                    self._work.wait()
            except Exception as e:
                raise _to_torch_error(e) from None
        return True

    def is_completed(self):
        return self._work is None or self._work.is_completed()

    def is_success(self):
        return self._work is None or self._work.is_success()

    def exception(self):
        if self._work is None:
            return None
        e = self._work.exception()
        return None if e is None else _to_torch_error(e)

    def result(self):
        self.wait()
        return list(self._result)

    def source_rank(self):
        if self._work is None:
            raise RuntimeError("source_rank() is only defined for recv from any source")
        return self._work.source_rank()

    def _source_rank(self):
        return self.source_rank()

    def synchronize(self):
        pass  # CPU only: a finished operation's outputs are already in place

    def abort(self):
        if self._work is not None:
            self._work.abort()

    def _get_op_type(self):
        return self._op_name

    def get_future(self):
        if self._future is None:
            source = torch.futures.Future()
            result = self._result
            if self._work is None:
                source.set_result(result)
                self._future = source
            else:
                # torch's set_exception stores the error as the value, which its C++ (DDP's
                # reducer) takes for tensors: an error raised in then() is a real one.
                self._future = source.then(_value_or_raise)

                def done(c10d_future, source=source, result=result):
                    try:
                        c10d_future.wait()
                    except Exception as e:
                        source.set_result(_Failed(_to_torch_error(e)))
                        return
                    source.set_result(result)

                self._work.get_future().add_done_callback(done)
        return self._future


class _Failed:
    """The value of a future whose operation failed (see _Work.get_future)."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _value_or_raise(fut):
    value = fut.value()
    if type(value) is _Failed:
        raise value.error
    return value


# Returned by synchronous operations, which are complete when they return: torch only waits
# on it (c10d's result is in the tensors already).
_DONE = _Work(None, [], "")
_AllreduceOptions = tdist.AllreduceOptions


def _coerce_allreduce_options(opts):
    """torch's AllreduceOptions from None or a bare ReduceOp (older call forms)."""
    out = tdist.AllreduceOptions()
    if opts is not None:
        out.reduceOp = opts if isinstance(opts, tdist.ReduceOp) else tdist.ReduceOp(opts)
    return out


# --------------------------------------------------------------------------------------------
# The process group


class ProcessGroupC10d(tdist.ProcessGroup):
    """A torch.distributed ProcessGroup that runs everything on a c10d process group `pg`.

    `owned`: whether shutting this group down shuts `pg` down (not for torch's view of c10d's
    default group, which c10d owns)."""

    def __init__(self, pg, backend_name: str, owned: bool = True):
        super().__init__(pg.rank(), pg.size())
        self._pg = pg
        # torch's view of a c10d group is named as c10d names its backend (torch's DDP logs
        # the name), but never as one of torch's own backends: torch's DDP takes a group
        # named "gloo" for its ProcessGroupGloo and looks inside it.
        c10d_name = "" if owned else str(_dc._world.pg_map.get(pg, ("",))[0])
        self._backend_name = (
            c10d_name if c10d_name and c10d_name not in _TORCH_BACKENDS else backend_name
        )
        self._owned = owned
        self._group_name = "" if owned else str(getattr(pg, "group_name", ""))
        self._group_desc = "" if owned else str(getattr(pg, "group_desc", ""))
        # c10d's synchronous entry points (return False when they do not apply: hooks,
        # coalescing, ...), a few microseconds shorter than options and Works.
        inline = pg._inline_ops() if type(pg) is _C.ProcessGroup else {}
        self._fast_allreduce = inline.get("allreduce")
        self._fast_broadcast = inline.get("broadcast")  # root: a rank of this group

    # -- identity ------------------------------------------------------------------------

    def getBackendName(self):
        return self._backend_name

    def name(self):
        return self._backend_name

    # torch keeps a group's name and description on its C++ backends, which this group has
    # none of: they live here (functional collectives find groups by name).
    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name
        if self._owned:  # c10d's default group keeps its c10d name
            self._pg._set_group_name(name)

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc
        if self._owned:
            self._pg._set_group_desc(desc)

    @property
    def _device_types(self):
        return [torch.device("cpu")]

    @property
    def c10d_group(self):
        """The c10d process group this group runs on."""
        return self._pg

    def __repr__(self):
        return f"<ProcessGroupC10d {self._backend_name} rank {self.rank()} of {self.size()}>"

    # -- helpers -------------------------------------------------------------------------

    def _run(self, call, args, copts, result, op_name):
        """Runs c10d's `call(*args, copts)`: a synchronous call finishes here (its errors
        raised now), an asynchronous one returns a Work tracking c10d's."""
        try:
            work = call(*args, copts)
            if not copts.asyncOp and work is not None:
                work.wait()
                work = None
        except Exception as e:
            raise _to_torch_error(e) from None
        return _Work(work, result, op_name)

    # -- collectives ---------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if type(opts) is not _AllreduceOptions:
            opts = _coerce_allreduce_options(opts)
        op = _reduce_op(opts.reduceOp)
        if not opts.asyncOp and len(tensors) == 1:
            t = tensors[0]
            fast = self._fast_allreduce
            if fast is not None and not t.is_sparse and opts.timeout == _UNSET_TIMEOUT:
                try:
                    done = fast(_view(t), op)
                except Exception as e:
                    raise _to_torch_error(e) from None
                if done:
                    return _DONE
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._allreduce_sparse(tensors[0], opts)
        copts = _options(_C.AllreduceOptions, opts, reduceOp=op)
        return self._run(self._pg.allreduce, (_views(tensors),), copts, tensors, "allreduce")

    def _allreduce_sparse(self, tensor, opts):
        # c10d sums sparse COO tensors by gathering every rank's indices and values, as Gloo.
        try:
            _dc._all_reduce_sparse(tensor, _reduce_op(opts.reduceOp), self._pg, False)
        except Exception as e:
            raise _to_torch_error(e) from None
        return _Work(None, [tensor], "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else tdist.AllreduceCoalescedOptions()
        copts = _options(_C.AllreduceCoalescedOptions, opts, reduceOp=_reduce_op(opts.reduceOp))
        return self._run(
            self._pg.allreduce_coalesced, (_views(tensors),), copts, tensors, "allreduce_coalesced"
        )

    def broadcast(self, tensors, opts=None):
        if opts is None:
            opts = tdist.BroadcastOptions()
        elif isinstance(opts, int):
            root, opts = opts, tdist.BroadcastOptions()
            opts.rootRank = root
        if not opts.asyncOp and len(tensors) == 1:
            fast = self._fast_broadcast
            if fast is not None and opts.timeout == _UNSET_TIMEOUT:
                try:
                    done = fast(_view(tensors[0]), opts.rootRank)
                except Exception as e:
                    raise _to_torch_error(e) from None
                if done:
                    return _DONE
        copts = _options(
            _C.BroadcastOptions, opts, rootRank=opts.rootRank, rootTensor=opts.rootTensor
        )
        return self._run(self._pg.broadcast, (_views(tensors),), copts, tensors, "broadcast")

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else tdist.ReduceOptions()
        copts = _options(
            _C.ReduceOptions,
            opts,
            reduceOp=_reduce_op(opts.reduceOp),
            rootRank=opts.rootRank,
            rootTensor=opts.rootTensor,
        )
        return self._run(self._pg.reduce, (_views(tensors),), copts, tensors, "reduce")

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else tdist.AllgatherOptions()
        copts = _options(_C.AllgatherOptions, opts)
        outputs = [_views(inner) for inner in output_tensors]
        return self._run(
            self._pg.allgather,
            (outputs, _views(input_tensors)),
            copts,
            _flat(output_tensors),
            "allgather",
        )

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else tdist.AllgatherOptions()
        copts = _options(_C.AllgatherOptions, opts)
        return self._run(
            self._pg._allgather_base,
            (_view(output), _view(input)),
            copts,
            [output],
            "_allgather_base",
        )

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts if opts is not None else tdist.AllgatherOptions()
        copts = _options(_C.AllgatherOptions, opts)
        outputs = [_views(inner) for inner in output_lists]
        return self._run(
            self._pg.allgather_coalesced,
            (outputs, _views(input_list)),
            copts,
            _flat(output_lists),
            "allgather_coalesced",
        )

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else tdist.AllgatherOptions()
        copts = _options(_C.AllgatherOptions, opts)
        return self._run(
            self._pg.allgather_into_tensor_coalesced,
            (_views(outputs), _views(inputs)),
            copts,
            list(outputs),
            "allgather_into_tensor_coalesced",
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else tdist.GatherOptions()
        copts = _options(_C.GatherOptions, opts, rootRank=opts.rootRank)
        outputs = [_views(inner) for inner in output_tensors]
        return self._run(
            self._pg.gather,
            (outputs, _views(input_tensors)),
            copts,
            _flat(output_tensors),
            "gather",
        )

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else tdist.ScatterOptions()
        copts = _options(_C.ScatterOptions, opts, rootRank=opts.rootRank)
        inputs = [_views(inner) for inner in input_tensors]
        return self._run(
            self._pg.scatter,
            (_views(output_tensors), inputs),
            copts,
            list(output_tensors),
            "scatter",
        )

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else tdist.ReduceScatterOptions()
        copts = _options(_C.ReduceScatterOptions, opts, reduceOp=_reduce_op(opts.reduceOp))
        inputs = [_views(inner) for inner in input_tensors]
        return self._run(
            self._pg.reduce_scatter,
            (_views(output_tensors), inputs),
            copts,
            list(output_tensors),
            "reduce_scatter",
        )

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else tdist.ReduceScatterOptions()
        copts = _options(_C.ReduceScatterOptions, opts, reduceOp=_reduce_op(opts.reduceOp))
        return self._run(
            self._pg._reduce_scatter_base,
            (_view(output), _view(input)),
            copts,
            [output],
            "_reduce_scatter_base",
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else tdist.ReduceScatterOptions()
        copts = _options(_C.ReduceScatterOptions, opts, reduceOp=_reduce_op(opts.reduceOp))
        return self._run(
            self._pg.reduce_scatter_tensor_coalesced,
            (_views(outputs), _views(inputs)),
            copts,
            list(outputs),
            "reduce_scatter_tensor_coalesced",
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else tdist.AllToAllOptions()
        copts = _options(_C.AllToAllOptions, opts)
        return self._run(
            self._pg.alltoall_base,
            (_view(output), _view(input), list(output_split_sizes), list(input_split_sizes)),
            copts,
            [output],
            "alltoall_base",
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else tdist.AllToAllOptions()
        copts = _options(_C.AllToAllOptions, opts)
        return self._run(
            self._pg.alltoall,
            (_views(output_tensors), _views(input_tensors)),
            copts,
            list(output_tensors),
            "alltoall",
        )

    def barrier(self, opts=None):
        opts = opts if opts is not None else tdist.BarrierOptions()
        copts = _options(_C.BarrierOptions, opts)
        return self._run(self._pg.barrier, (), copts, [], "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        try:
            if timeout is None:
                self._pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                self._pg.monitored_barrier(timeout, wait_all_ranks)
        except Exception as e:
            raise _to_torch_error(e) from None

    # -- point to point ------------------------------------------------------------------

    def _p2p(self, call, args, tensors, op_name):
        try:
            work = call(*args)
        except Exception as e:
            raise _to_torch_error(e) from None
        return _Work(work, tensors, op_name)

    def send(self, tensors, dstRank, tag=0):
        return self._p2p(self._pg.send, (_views(tensors), dstRank, tag), tensors, "send")

    def recv(self, tensors, srcRank, tag=0):
        return self._p2p(self._pg.recv, (_views(tensors), srcRank, tag), tensors, "recv")

    def recv_anysource(self, tensors, tag=0):
        return self._p2p(self._pg.recv_anysource, (_views(tensors), tag), tensors, "recv_anysource")

    # -- coalescing and lifetime ---------------------------------------------------------

    def _start_coalescing(self, device):
        self._pg._start_coalescing("cpu")

    def _end_coalescing(self, device):
        try:
            work = self._pg._end_coalescing("cpu")
        except Exception as e:
            raise _to_torch_error(e) from None
        return _Work(work, [], "coalesced")

    def shutdown(self):
        if self._owned:
            _dc._shutdown(self._pg)

    def abort(self):
        self.shutdown()

    def _get_sequence_number_for_group(self):
        return self._pg._get_sequence_number_for_group()

    def _set_sequence_number_for_group(self):
        pass  # c10d numbers each group's collectives itself


# --------------------------------------------------------------------------------------------
# Creating groups for torch


def _same_host(store, rank: int, size: int) -> bool:
    """Whether every rank of the group runs on this host (they all agree: each reads all)."""
    me = socket.gethostname()
    store.set(f"c10d_torch_backend/host/{rank}", me)
    hosts = store.multi_get([f"c10d_torch_backend/host/{r}" for r in range(size)])
    return all(h.decode() == me for h in hosts)


def _make_backend(kind: str, store, rank: int, size: int, timeout: timedelta):
    """c10d's backend `kind`: "shm", "gloo", or "auto" (shm on one host, else c10d's
    hierarchical backend, or Gloo where this build of c10d has no hierarchical one)."""
    if kind == "auto":
        if hasattr(_C, "_create_auto_backend"):
            return _C._create_auto_backend(store, rank, size, timeout)
        kind = "shm" if _dc.is_shm_available() and _same_host(store, rank, size) else "gloo"
    if kind == "shm":
        if not _dc.is_shm_available():
            raise RuntimeError("c10d was built without its shm backend")
        return _C.ProcessGroupShm(store, rank, size, timeout)
    if not _dc.is_gloo_available():
        raise RuntimeError("c10d was built without its gloo backend")
    return _C.ProcessGroupGloo(store, rank, size, timeout)


def _make_c10d_group(
    kind: str,
    store,
    rank: int,
    size: int,
    timeout: timedelta,
    group_name: str = "",
    global_ranks=None,
):
    """A c10d ProcessGroup of backend `kind` (see _make_backend) on the c10d store `store`."""
    backend = _make_backend(kind, store, rank, size, timeout)
    pg = _C.ProcessGroup(store, rank, size, backend.name(), timeout)
    pg._register_backend("cpu", backend.name(), backend)
    if size > 1:
        # Every rank has its backend before any returns, so none can leave while a peer
        # still needs the store (its server may live in the first rank's process).
        backend.barrier(_dc._opts(_C.BarrierOptions, False))
    if group_name:
        pg._set_group_name(group_name)
    pg._set_global_ranks(list(global_ranks) if global_ranks else list(range(size)))
    return pg


# The c10d default group that the next torch group created becomes (see _mirror_default_group).
_pending_mirror: List[Any] = []
_lock = threading.Lock()


def _creator(name: str):
    def create(common_opts, backend_opts=None):
        if _pending_mirror:
            return ProcessGroupC10d(_pending_mirror[0], name, owned=False)
        torch_store = common_opts.store
        rank, size = common_opts.group_rank, common_opts.group_size
        timeout = common_opts.timeout
        store = _StoreOverTorch(torch_store)
        kind = {"c10d_shm": "shm", "c10d_gloo": "gloo"}.get(name, "auto")
        try:
            pg = _make_c10d_group(
                kind,
                store,
                rank,
                size,
                timeout,
                str(getattr(common_opts, "group_id", "") or ""),
                getattr(common_opts, "global_ranks_in_group", None),
            )
        except Exception as e:
            raise _to_torch_error(e) from None
        group = ProcessGroupC10d(pg, name)
        group._store = store  # the Python store object lives as long as the group
        return group

    return create


_registered = False


def register() -> None:
    """Registers "c10d_shm", "c10d_gloo" and "c10d" with torch.distributed (done on import;
    calling it again does nothing)."""
    global _registered
    with _lock:
        if _registered:
            return
        for name in BACKENDS:
            if name.upper() not in tdist.Backend._plugins:
                tdist.Backend.register_backend(
                    name, _creator(name), extended_api=True, devices=["cpu"]
                )
        _registered = True


register()
_dc._torch_bridge = sys.modules[__name__]  # c10d's groups now mirror into torch (see _dc)


# --------------------------------------------------------------------------------------------
# torch's default group as c10d's


_MIRROR_NAMES = {"shm": "c10d_shm", "gloo": "c10d_gloo"}
_mirror_store: List[Any] = []


def _mirror_default_group(
    pg, store, rank: int, world_size: int, backend: str, timeout: timedelta
) -> None:
    """Makes torch.distributed's default group c10d's default group `pg` (the same group, no
    new rendezvous), so torch utilities that ask torch for the world (DistributedSampler,
    ZeroRedundancyOptimizer, DDP) work in programs written against c10d. Nothing happens when
    torch already has a default group."""
    if not tdist.is_available() or tdist.is_initialized():
        return
    backend = str(backend).lower()
    if "," in backend or ":" in backend:  # "cpu:shm": the backend serving the CPU
        backend = dict(pair.split(":", 1) for pair in backend.split(",")).get("cpu", "")
    name = _MIRROR_NAMES.get(backend.strip(), "c10d")
    # torch's own groups made later (torch's new_group) rendezvous under their own prefix.
    torch_store = _TorchStoreOverC10d(_C.PrefixStore("torch/", store))
    # torch's C++ keeps only the C++ half of a Python store: the Python half must stay alive.
    _mirror_store[:] = [torch_store]
    with _lock:
        _pending_mirror.append(pg)
        try:
            tdist.init_process_group(
                name, store=torch_store, rank=rank, world_size=world_size, timeout=timeout
            )
        finally:
            _pending_mirror.clear()
    _let_ddp_take_c10d_groups()


def _torch_group(group):
    """The torch group that c10d group `group` stands for, while c10d's default group is
    torch's: torch's default group for c10d's, a view registered with torch for any other
    c10d group (made the first time); anything else as it is."""
    if type(group) is _C.ProcessGroup and is_mirrored():
        world = tdist.distributed_c10d._get_default_group()
        if world._pg is group:
            return world
        return _torch_view(group)
    return group


# torch's views of c10d's other groups, by c10d group (see _torch_view).
_group_views: Dict[Any, Any] = {}


def _torch_view(pg):
    """A torch ProcessGroup that runs on c10d group `pg` and that torch knows as a group of
    its world (ranks, name, backend), so that torch's APIs take it. No rendezvous: the c10d
    group exists on its members already. Dropped with the group (_forget_torch_view)."""
    view = _group_views.get(pg)
    if view is not None:
        return view
    ranks = _dc._world.pg_group_ranks.get(pg)
    if ranks is None:  # not a group of c10d's world (destroyed, or made by hand)
        return pg
    backend = str(_dc._world.pg_map[pg][0])
    view = ProcessGroupC10d(pg, _MIRROR_NAMES.get(backend, "c10d"), owned=False)
    # Named apart from torch's own groups, whose names are numbers too.
    view._group_name = name = f"c10d_{pg.group_name}"
    world = tdist.distributed_c10d._world
    world.pg_map[view] = (view._backend_name, _mirror_store[0] if _mirror_store else None)
    world.pg_names[view] = name
    world.pg_backend_config[view] = f"cpu:{view._backend_name}"
    world.pg_group_ranks[view] = dict(ranks)
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault(tag, []).append(view)
    world.pg_to_tag[view] = tag
    _tc10d._register_process_group(name, view)
    _group_views[pg] = view
    return view


def _forget_torch_view(pg) -> None:
    """Removes torch's view of c10d group `pg` (being destroyed) from torch's world."""
    view = _group_views.pop(pg, None)
    if view is None:
        return
    world = tdist.distributed_c10d._world
    name = world.pg_names.pop(view, None)
    for table in (world.pg_map, world.pg_backend_config, world.pg_group_ranks):
        table.pop(view, None)
    tag = world.pg_to_tag.pop(view, None)
    if tag in world.tags_to_pg:
        world.tags_to_pg[tag] = [g for g in world.tags_to_pg[tag] if g is not view]
    if name is not None:
        try:
            _tc10d._unregister_process_group(name)
        except Exception:  # torch's registry no longer has it (torch destroyed its world)
            pass


_ddp_takes_c10d_groups = False


def _let_ddp_take_c10d_groups() -> None:
    """torch's DistributedDataParallel and ZeroRedundancyOptimizer accept c10d's groups for
    process_group, as the torch groups they stand for (see _torch_group): programs written
    against c10d pass dist.group.WORLD or their new_group()s to them. Their C++ parts take
    torch's ProcessGroup class only, so the argument is swapped on the way in."""
    global _ddp_takes_c10d_groups
    if _ddp_takes_c10d_groups:
        return
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    for cls in (DistributedDataParallel, ZeroRedundancyOptimizer):
        construct = cls.__init__

        def make(construct):
            @functools.wraps(construct)
            def __init__(self, *args, process_group=None, **kwargs):
                construct(self, *args, process_group=_torch_group(process_group), **kwargs)

            return __init__

        cls.__init__ = make(construct)
    _ddp_takes_c10d_groups = True


def is_mirrored() -> bool:
    """Whether torch.distributed's default group is c10d's default group."""
    if not tdist.is_initialized():
        return False
    world = tdist.distributed_c10d._get_default_group()
    return isinstance(world, ProcessGroupC10d) and not world._owned


def _unmirror() -> None:
    """Destroys torch's default group (and torch's other groups) if it is c10d's."""
    for pg in list(_group_views):
        _forget_torch_view(pg)
    if is_mirrored():
        try:
            tdist.destroy_process_group()
        except Exception as e:  # c10d's own teardown goes on regardless
            warnings.warn(f"destroying torch.distributed's view of c10d's group raised {e!r}")


def _let_torch_init_replace_the_mirror() -> None:
    """A program that sets up torch.distributed itself after c10d's init_process_group gets
    its own group, as before this module existed, instead of "initialize twice" errors."""
    module = tdist.distributed_c10d
    original = module.init_process_group
    if getattr(original, "_c10d_replaces_mirror", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if is_mirrored():
            _unmirror()
        return original(*args, **kwargs)

    init_process_group._c10d_replaces_mirror = True
    module.init_process_group = init_process_group
    if tdist.init_process_group is original:
        tdist.init_process_group = init_process_group


_let_torch_init_replace_the_mirror()
