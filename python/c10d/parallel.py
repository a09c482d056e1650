"""DistributedDataParallel for PyTorch modules, on c10d's process groups.

Importing this module imports torch (c10d itself never does): ``c10d.DistributedDataParallel``
loads it on first use. The wrapper works as torch's does on CPU: at construction every rank
takes rank 0's parameters and buffers; in a training step each parameter's gradient is handed
to a :class:`c10d.Reducer` as soon as autograd has accumulated it, buckets of gradients are
averaged across the group while the backward pass goes on, and when ``backward()`` returns
every ``.grad`` holds the average over the ranks.

Parameters of modules built with ``sparse=True`` (``nn.Embedding``, ``nn.EmbeddingBag``) get
sparse gradients: as in torch's DDP on Gloo, they stay out of the buckets and each is averaged
with a sparse all_reduce once the backward pass is done (comm hooks do not see them).
"""

import collections
import contextlib
import os
import sys
import time
import warnings
import weakref

import numpy as np
import torch
import torch.utils.dlpack

from . import _C
from . import distributed_c10d as _dist
from .algorithms.join import Join, JoinHook, Joinable

# Start-up broadcast of the module's state: bytes per flat buffer (as torch's DDP uses).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
# Gradient buckets: torch's default limit, and its unit.
_DEFAULT_BUCKET_CAP_MB = 25
_MB = 1024 * 1024


# torch's logging data names dtypes as C++ types.
_TYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
}


def _as_torch(view):
    """A torch tensor sharing the memory of what c10d returned (a numpy array, or a DLPack
    capsule for dtypes numpy lacks)."""
    if isinstance(view, np.ndarray):
        return torch.from_numpy(view)
    return torch.utils.dlpack.from_dlpack(view)


class _TorchBucket:
    """A c10d.GradBucket as torch's DDP hands it to comm hooks: its tensors are torch tensors
    sharing the bucket's memory."""

    def __init__(self, bucket):
        self._bucket = bucket

    def index(self):
        return self._bucket.index()

    def is_last(self):
        return self._bucket.is_last()

    def buffer(self):
        return _as_torch(self._bucket.buffer())

    def gradients(self):
        return [_as_torch(g) for g in self._bucket.gradients()]

    def parameters(self):
        return [_as_torch(p) for p in self._bucket.parameters()]

    def set_buffer(self, buffer):
        self._bucket.set_buffer(buffer)


def _dispatch_comm_hook(ddp_ref, bucket):
    """The comm hook c10d registers itself (a weak reference to the model as its state)."""
    ddp = ddp_ref()
    if ddp is None:
        raise RuntimeError("DistributedDataParallel: the model of this reducer was deleted")
    return ddp._run_bucket_hook(bucket)


class DistributedDataParallel(torch.nn.Module, Joinable):
    """Wraps ``module`` for data-parallel training over ``process_group`` (default: WORLD).

    The constructor takes torch's arguments, in torch's order and with its defaults, and gives
    them torch's meaning on CPU: ``device_ids`` and ``output_device`` must be None (as torch
    requires for CPU modules); ``init_sync=False`` skips the start-up check and broadcast;
    ``device_mesh`` (a 1-D :class:`c10d.DeviceMesh`) gives the group; parameters in
    ``delay_all_reduce_named_params`` stay out of the buckets and are averaged once
    ``param_to_hook_all_reduce``'s gradient is computed; ``skip_all_reduce_unused_params``
    leaves out buckets of parameters this pass did not use (with find_unused_parameters);
    ``mixed_precision`` takes torch's ``_MixedPrecision`` with ``reduce_dtype`` and
    ``buffer_dtype`` (``param_dtype`` raises NotImplementedError: torch's own needs device
    streams and events and fails on CPU); ``bucket_cap_mb_list`` takes at most two different
    limits (the first bucket's and the others'); ``batched_grad_copy`` is accepted (CPU copies
    are already one memcpy per gradient). ``with model.join():`` trains ranks with uneven
    numbers of inputs (see :meth:`join`).
    """

    # The instance whose forward is running (torch's TorchDynamo integration reads it).
    _active_ddp_module = None

    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=None,
        init_sync=True,
        process_group=None,
        bucket_cap_mb=None,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=False,
        static_graph=False,
        delay_all_reduce_named_params=None,
        param_to_hook_all_reduce=None,
        mixed_precision=None,
        device_mesh=None,
        skip_all_reduce_unused_params=False,
        bucket_cap_mb_list=None,
        batched_grad_copy=False,
        forward_sync_buffers=None,
    ):
        super().__init__()
        Joinable.__init__(self)
        # Arguments are checked before any collective, in torch's order, so that every rank
        # raises alike.
        if (delay_all_reduce_named_params is not None) != (param_to_hook_all_reduce is not None):
            raise ValueError(
                "delay_all_reduce_named_params and param_to_hook_all_reduce "
                "need to be set at the same time."
            )
        if process_group and device_mesh is not None:
            raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
        if device_mesh is not None:
            if device_mesh.ndim != 1:
                raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
            self.device_mesh = device_mesh
            process_group = device_mesh.get_group(mesh_dim=0)
        self.process_group = _dist._resolve_group(process_group)

        # Names (fully qualified) that are neither synced nor reduced: those of
        # _set_params_and_buffers_to_ignore_for_model, and the delayed parameters.
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._delay_all_reduce_params = []
        for name, param in delay_all_reduce_named_params or ():
            self.parameters_to_ignore.add(name)
            self._delay_all_reduce_params.append(param)
        self._ignored = self.parameters_to_ignore
        self._module_parameters = [
            p for n, p in module.named_parameters() if n not in self.parameters_to_ignore
        ]
        if not any(p.requires_grad for p in self._module_parameters):
            if not self._delay_all_reduce_params:
                raise RuntimeError(
                    "DistributedDataParallel is not needed when a module "
                    "doesn't have any parameter that requires a gradient."
                )
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        device_types = {p.device.type for p in self._module_parameters}
        if len(device_types) != 1:  # as torch: also when every parameter is ignored
            raise ValueError(
                "DistributedDataParallel's input module must be on "
                "the same type of devices, but input module parameters locate in "
                f"{device_types}."
            )
        if device_ids or output_device:
            devices = {p.device for p in self._module_parameters}
            raise ValueError(
                "DistributedDataParallel device_ids and output_device arguments "
                "only work with single-device/multiple-device GPU modules or CPU modules, "
                f"but got device_ids {device_ids}, output_device {output_device}, "
                f"and module parameters {devices}. (c10d runs on CPU: pass neither.)"
            )
        self.device_ids = None
        self.output_device = None
        self.is_multi_device_module = False
        self.device_type = "cpu"
        self.device = torch.device("cpu")
        self.static_graph = False
        self.dim = dim
        self.module = module

        # broadcast_buffers (deprecated in torch 2.13) and forward_sync_buffers, as torch.
        if broadcast_buffers is not None:
            if forward_sync_buffers is not None:
                warnings.warn(
                    "Both `broadcast_buffers` and `forward_sync_buffers` were "
                    "specified. `broadcast_buffers` is deprecated and its value "
                    "is ignored when `forward_sync_buffers` is provided.",
                    FutureWarning,
                    stacklevel=2,
                )
            else:
                warnings.warn(
                    "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` "
                    "instead. IMPORTANT: unlike `broadcast_buffers=False`, "
                    "`forward_sync_buffers=False` still syncs buffers at "
                    "init. If you rely on buffers NOT being synced at "
                    "init (e.g. rank-local buffers), keep using "
                    "`broadcast_buffers=False` until `init_sync_buffers` "
                    "is available.",
                    FutureWarning,
                    stacklevel=2,
                )
        if forward_sync_buffers is not None:
            self.forward_sync_buffers = bool(forward_sync_buffers)
            init_sync_buffers = True
        else:
            self.forward_sync_buffers = broadcast_buffers is None or bool(broadcast_buffers)
            init_sync_buffers = self.forward_sync_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.batched_grad_copy = batched_grad_copy  # no effect on CPU: see the class doc
        self.mixed_precision = mixed_precision
        if check_reduction:
            warnings.warn(
                "The `check_reduction` argument in `DistributedDataParallel` "
                "module is deprecated. Please avoid using it.",
                FutureWarning,
                stacklevel=2,
            )
        for p in self._module_parameters:
            if isinstance(p, torch.nn.parameter.UninitializedParameter):
                raise RuntimeError(
                    "Modules with uninitialized parameters can't be used with "
                    "`DistributedDataParallel`. Run a dummy forward pass to correctly "
                    "initialize the modules"
                )
        if mixed_precision is not None and mixed_precision.param_dtype is not None:
            raise NotImplementedError(
                "DistributedDataParallel: mixed_precision with a param_dtype (forward and "
                "backward passes on low-precision copies of the parameters) is not "
                "implemented in c10d; reduce_dtype and buffer_dtype are. (torch's own needs "
                "device streams and events, and fails on CPU.)"
            )
        self.broadcast_bucket_size = _BROADCAST_BUCKET_BYTES
        self._set_bucket_caps(bucket_cap_mb, bucket_cap_mb_list)

        self._rank = _dist.get_rank(self.process_group)
        self._divide_by_initial_world_size = True
        self._still_training = None  # the join notification's Work, in join mode
        self._unfinished_reduction = None  # why the last backward's reduction did not finish
        self._static_graph = False
        self._has_rebuilt_buckets = False
        self._ddp_sink_clone = True
        self._forwards = 0  # forward passes that prepared a reduction
        self._forward_ns = collections.deque(maxlen=100)  # the last forward passes' times
        self._finalize_queued = False
        self._in_backward = False
        self._grad_accumulators = []
        self._autograd_hook_handles = []
        self.reducer = None
        self._params = []  # dense gradients: in the reducer's buckets
        self._sparse_params = []  # sparse gradients: _reduce_sparse_grads
        self._assign_modules_buffers()

        self._delay_grad_buffer = None
        self._delay_grad_views = []
        self._delay_all_reduce_all_params = False
        if self._delay_all_reduce_params:
            self._register_delay_all_reduce_hook(param_to_hook_all_reduce)
            if self._delay_all_reduce_all_params:
                return  # as torch: no reducer, no start-up sync of the rest of the module

        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        seen = set()
        for prefix, m in module.named_modules():
            sparse = getattr(m, "sparse", False) is True
            for name, p in m.named_parameters(recurse=False):
                if (
                    p.requires_grad
                    and id(p) not in seen
                    and f"{prefix}.{name}".lstrip(".") not in self.parameters_to_ignore
                ):
                    seen.add(id(p))
                    (self._sparse_params if sparse else self._params).append(p)
        if init_sync:
            _C._verify_params_across_processes(
                self.process_group, [p.detach() for p in self._params + self._sparse_params]
            )
            self._sync_state(self._module_state(buffers=init_sync_buffers))
        detached = [p.detach() for p in self._params]
        limits = self._initial_bucket_limits(static_graph)
        buckets, sizes = (
            _C._compute_bucket_assignment_by_size(detached, limits) if detached else ([], [])
        )
        # Gradients are ready last parameter first: bucket 0 (reduced first) holds the last.
        self.reducer = _C.Reducer(
            self._params,
            list(reversed(buckets)),
            list(reversed(sizes)),
            self.process_group,
            bucket_bytes_cap=self._rebuild_caps[1],
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
            first_bucket_bytes_cap=self._rebuild_caps[0],
        )
        self._construction_bucket_sizes = ", ".join(map(str, self._bucket_sizes()))
        # Comm hooks: the reducer calls _dispatch_comm_hook when c10d itself has work to do
        # per bucket (skipping, reducing in reduce_dtype); it calls the user's hook, if any.
        self._user_comm_hook = None
        self._marked = set()  # parameters whose gradients this pass produced (skip only)
        self._reducing = False  # a pass is open, its buckets launched by the reducer
        self._buckets_skipped = 0
        if skip_all_reduce_unused_params or mixed_precision is not None:
            _C._register_comm_hook(self.reducer, weakref.ref(self), _dispatch_comm_hook)
        if mixed_precision is not None:
            self._cast_buffers(mixed_precision.buffer_dtype)
        if gradient_as_bucket_view:
            # Autograd accumulates straight into the buckets: no copy in or out (as long as
            # .grad stays this view: zero_grad(set_to_none=True) drops it, and the next
            # gradients are copied again).
            for index, p in enumerate(self._params):
                p.grad = _as_torch(self.reducer._bucket_view(index))
        if static_graph:
            self._set_static_graph()
        # Autograd calls these after accumulating a parameter's gradient into .grad. The
        # accumulator nodes must stay alive for their hooks to stay registered.
        for index, p in enumerate(self._params):
            self._hook_accumulator(p, index)
        for p in self._sparse_params:
            self._hook_accumulator(p, None)

    # --- construction helpers ---

    def _set_bucket_caps(self, bucket_cap_mb, bucket_cap_mb_list):
        """torch's bucket sizes: bucket_cap_mb (None: 25 MiB, with a first bucket of 1 MiB),
        or one limit per bucket from bucket_cap_mb_list (the last for the rest)."""
        default = bucket_cap_mb is None
        cap_mb = _DEFAULT_BUCKET_CAP_MB if default else bucket_cap_mb
        per_bucket = []
        if bucket_cap_mb_list:
            per_bucket = [int(mb * _MB) for mb in bucket_cap_mb_list]
            cap_mb = max(bucket_cap_mb_list)
            default = False
            if len(set(per_bucket[1:])) > 1:
                # c10d's reducer regroups its buckets (after the first iteration) with a limit
                # for the first bucket and one for all others.
                raise NotImplementedError(
                    "DistributedDataParallel: bucket_cap_mb_list with different limits after "
                    f"the second bucket ({list(bucket_cap_mb_list)}) is not implemented in "
                    "c10d; give at most two values, or repeat the second"
                )
        self.bucket_bytes_cap = int(cap_mb * _MB)
        first = _C._DEFAULT_FIRST_BUCKET_BYTES if default else self.bucket_bytes_cap
        self.bucket_bytes_cap_list = per_bucket
        self.bucket_bytes_cap_default = first < self.bucket_bytes_cap
        self._first_bucket_bytes_cap = first
        self._bucket_cap_bytes = self.bucket_bytes_cap
        # The limits the reducer regroups its buckets with: (first bucket, the others).
        if per_bucket:
            self._rebuild_caps = (per_bucket[0], per_bucket[min(1, len(per_bucket) - 1)])
        else:
            self._rebuild_caps = (first, self.bucket_bytes_cap)

    def _initial_bucket_limits(self, static_graph):
        """As torch: the per-bucket limits if given; otherwise, unless unused parameters are
        searched for, one bucket for the first iteration (the registration order need not be
        the order in which gradients come; the buckets are regrouped after it)."""
        if self.bucket_bytes_cap_list:
            return list(self.bucket_bytes_cap_list)
        if static_graph or not self.find_unused_parameters:
            return [sys.maxsize]
        if self._first_bucket_bytes_cap < self.bucket_bytes_cap:
            return [self._first_bucket_bytes_cap, self.bucket_bytes_cap]
        return [self.bucket_bytes_cap]

    def _hook_accumulator(self, p, index):
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        self._autograd_hook_handles.append(accumulator.register_hook(self._make_grad_hook(index)))
        self._grad_accumulators.append(accumulator)

    def _cast_buffers(self, dtype):
        """mixed_precision's buffer_dtype: floating-point buffers take it for good (those of
        _set_params_and_buffers_to_ignore_for_model excepted, as in torch)."""
        if dtype is None:
            return
        for buf in self.module.buffers():
            if not getattr(buf, "_ddp_ignored", False) and buf.is_floating_point():
                buf.data = buf.to(dtype=dtype)

    # --- delayed all-reduce (delay_all_reduce_named_params) ---

    def _register_delay_all_reduce_hook(self, param_to_hook_all_reduce):
        """The delayed parameters' gradients live in one flat buffer (their .grad are views
        of it), averaged by one all_reduce once param_to_hook_all_reduce's gradient is
        computed. They take rank 0's values now, whatever init_sync (as torch)."""
        dtypes = {p.dtype for p in self._delay_all_reduce_params}
        if len(dtypes) != 1:
            raise TypeError(
                "delay_all_reduce_named_params: the parameters must share one dtype, not "
                f"{sorted(map(str, dtypes))}"
            )
        self._delay_grad_buffer = torch.zeros(
            sum(p.numel() for p in self._delay_all_reduce_params), dtype=dtypes.pop()
        )
        self._sync_state([p.detach() for p in self._delay_all_reduce_params])
        self._delay_hook_handle = param_to_hook_all_reduce.register_hook(
            self._delayed_all_reduce_hook
        )
        offset = 0
        for param in self._delay_all_reduce_params:
            view = self._delay_grad_buffer[offset : offset + param.numel()].view(param.shape)
            self._delay_grad_views.append(view)
            offset += param.numel()
        self._delay_all_reduce_all_params = not any(
            p.requires_grad
            for name, p in self.module.named_parameters()
            if name not in self.parameters_to_ignore
        )

    def _delayed_all_reduce_hook(self, grad):
        """A tensor hook on param_to_hook_all_reduce, as torch's: runs in every backward pass
        that computes its gradient (no_sync included) and averages the delayed gradients.
        The all_reduce is waited for when the backward pass ends."""
        self._delay_grad_buffer.div_(_dist.get_world_size(self.process_group))
        work = _dist.all_reduce(self._delay_grad_buffer, group=self.process_group, async_op=True)
        torch.autograd.Variable._execution_engine.queue_callback(work.wait)
        return grad

    def _clear_grad_buffer(self):
        """After each forward pass, as torch: a delayed parameter without .grad gets its view
        of the buffer back, zeroed (the whole buffer at once when none had one)."""
        if self._delay_grad_buffer is None:
            return
        all_none = all(p.grad is None for p in self._delay_all_reduce_params)
        for index, param in enumerate(self._delay_all_reduce_params):
            if param.grad is None:
                param.grad = self._delay_grad_views[index]
                if not all_none:
                    param.grad.zero_()
        if all_none:
            self._delay_grad_buffer.zero_()

    # --- comm hooks run by c10d itself ---

    def _run_bucket_hook(self, bucket):
        """What reduces a bucket: skipped when no parameter of it was used in this pass
        (skip_all_reduce_unused_params: every rank must agree, as torch requires), averaged
        in mixed_precision's reduce_dtype, or the user's hook, or the default allreduce."""
        if self.skip_all_reduce_unused_params and self._reducing:
            members = self.reducer.bucket_indices[bucket.index()]
            if not any(i in self._marked for i in members):
                self._buckets_skipped += 1
                done = _C.Future()
                done.set_result(bucket.buffer())
                return done
        if self.mixed_precision is not None:
            return self._reduce_in_dtype(bucket, self.mixed_precision.reduce_dtype)
        if self._user_comm_hook is not None:
            state, hook = self._user_comm_hook
            return hook(state, bucket)
        return self.reducer._run_allreduce_hook(bucket)

    def _reduce_in_dtype(self, bucket, dtype):
        """As torch's mixed-precision hook: the bucket summed in `dtype` (None: its own),
        divided by the group size, and written back in the bucket's dtype."""
        buffer = _as_torch(bucket.buffer())
        wire = buffer if dtype is None or dtype == buffer.dtype else buffer.to(dtype)
        work = _dist.all_reduce(wire, group=self.process_group, async_op=True)
        world = _dist.get_world_size(self.process_group)

        def written_back(fut):
            fut.value()  # raises the all_reduce's error, if any
            wire.div_(world)
            if wire is not buffer:
                buffer.copy_(wire)
            return bucket.buffer()

        return work.get_future().then(written_back)

    def _update_process_group(self, new_process_group):
        """Trains over `new_process_group` from now on (as torch's DDP, e.g. after replacing a
        group that lost a rank): a pass in progress is dropped, and the buckets are rebuilt
        again after the next full backward pass."""
        self.reducer._reset_state()
        self._in_backward = False
        self._finalize_queued = False
        self.process_group = _dist._resolve_group(new_process_group)
        self._rank = _dist.get_rank(self.process_group)
        self.reducer._update_process_group(self.process_group)
        if self.gradient_as_bucket_view:
            self._point_grads_at_buckets()

    def _point_grads_at_buckets(self):
        """gradient_as_bucket_view: .grad follows the reducer's (new) buckets."""
        for index, p in enumerate(self._params):
            if p.grad is not None:
                p.grad = _as_torch(self.reducer._bucket_view(index))

    def _rebuild_buckets(self):
        """As torch's DDP before its second iteration: once, regroup the buckets in the order
        the first backward pass produced the gradients (rank 0's order for all ranks)."""
        if self.reducer._rebuild_buckets():
            self._has_rebuilt_buckets = True
            if self.gradient_as_bucket_view:
                self._point_grads_at_buckets()  # the reducer copied the buckets over

    def _assign_modules_buffers(self):
        """As torch: modules_buffers and named_module_buffers are the buffers to sync (read
        again before each sync, since modules may replace their buffers)."""
        named = [(n, b) for n, b in self.module.named_buffers() if n not in self._ignored]
        self.modules_buffers = [b for _, b in named]
        self.named_module_buffers = dict(named)

    def _buffers_to_sync(self):
        self._assign_modules_buffers()
        return [b.detach() for b in self.modules_buffers]

    def _module_state(self, buffers=True):
        """Every parameter (frozen ones too, as torch syncs the whole module state) and, with
        `buffers`, buffer, but those to ignore."""
        params = [
            p.detach() for name, p in self.module.named_parameters() if name not in self._ignored
        ]
        return params + (self._buffers_to_sync() if buffers else [])

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """Parameters and buffers (by fully qualified name) that a DistributedDataParallel
        built on `module` afterwards neither syncs from rank 0 nor reduces, as torch's (which
        also marks them ``_ddp_ignored``)."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore
        for name, param in module.named_parameters():
            if name in params_and_buffers_to_ignore:
                param._ddp_ignored = True
        for name, buffer in module.named_buffers():
            if name in params_and_buffers_to_ignore:
                buffer._ddp_ignored = True

    @staticmethod
    def _get_data_parallel_params(module, named_params=False):
        """The parameters (or (name, parameter) pairs) of `module` not marked _ddp_ignored."""
        for param in module.parameters() if not named_params else module.named_parameters():
            if not hasattr(param, "_ddp_ignored"):
                yield param

    def _set_static_graph(self):
        """As static_graph=True at construction (call it before the first iteration)."""
        if self.static_graph:
            warnings.warn(
                "You've set static_graph to be True, no need to set it again.", stacklevel=2
            )
            return
        self.static_graph = True
        self._static_graph = True
        self.reducer._set_static_graph()

    def _forward_buffers(self):
        """The buffers the forward pass broadcasts: none unless forward_sync_buffers and
        require_forward_param_sync."""
        if not (self.require_forward_param_sync and self.forward_sync_buffers):
            return []
        return self._buffers_to_sync()

    @property
    def broadcast_buffers(self):
        """torch 2.13's deprecated name of forward_sync_buffers."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value):
        self.forward_sync_buffers = value

    def will_sync_module_buffers(self):
        return len(self._forward_buffers()) > 0

    def _check_sync_bufs_pre_fwd(self):
        return self.will_sync_module_buffers()  # no buffer comm hook in c10d

    def _check_sync_bufs_post_fwd(self):
        return False

    @property
    def _distributed_rank(self):
        return _dist.get_rank(self.process_group)

    def _get_ddp_logging_data(self):
        """The fields of torch's DDP logging data that apply here (construction settings,
        buckets, parameters, the environment; the forward time in ns)."""

        def env(name):
            return os.environ.get(name, "N/A")

        params = self._params + self._sparse_params
        buckets = self._bucket_sizes()
        data = {
            "module_name": type(self.module).__name__,
            "device_ids": "",
            "output_device": -1,
            "broadcast_buffers": int(self.forward_sync_buffers),
            "backend_name": str(_dist.get_backend(self.process_group)),
            "world_size": _dist.get_world_size(self.process_group),
            "rank": self._rank,
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "has_sync_bn": 0,
            "is_multi_device_module": 0,
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": ", ".join(sorted({_TYPE_NAMES.get(p.dtype, str(p.dtype)) for p in params})),
            "bucket_sizes": self._construction_bucket_sizes,  # as torch: not updated
            "has_rebuilt_buckets": int(self.reducer._has_rebuilt_buckets()),
            "iteration": max(self._forwards - 1, 0),
            "master_addr": env("MASTER_ADDR"),
            "master_port": env("MASTER_PORT"),
            "torch_distributed_debug": env("TORCH_DISTRIBUTED_DEBUG"),
        }
        if self._static_graph:  # as torch: only once set
            data["static_graph"] = 1
        if self.reducer._has_rebuilt_buckets():
            data["rebuilt_bucket_sizes"] = ", ".join(map(str, buckets))
        if self._forwards:
            # Buckets whose reduction ran in the last pass (skip_all_reduce_unused_params
            # leaves some out).
            data["num_buckets_reduced"] = len(buckets) - self._buckets_skipped
        if self.find_unused_parameters and self._forwards:
            used = self.reducer._get_local_used_map()
            data["unused_parameter_size"] = sum(
                p.numel() * p.element_size() for p, u in zip(self._params, used) if not u
            )
        if self._forward_ns:
            data["forward_compute_time"] = self._forward_ns[-1]
            data["avg_forward_compute_time"] = sum(self._forward_ns) // len(self._forward_ns)
        return data

    def _bucket_sizes(self):
        """The bytes of each bucket, in the reducer's order."""
        return [int(b.buffer().nbytes) for b in self.reducer._get_zeros_like_grad_buckets()]

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate):
        if sample_rate < 1:
            raise ValueError("DDP runtime logging sample rate should be equal or greater than 1")
        self.reducer._set_ddp_runtime_logging_sample_rate(sample_rate)

    def _check_reducer_finalized(self):
        """Raises if the last backward pass left its reduction unfinished (as torch's)."""
        self.reducer._check_reducer_finalized()

    def _remove_autograd_hooks(self):
        """Removes the hooks that hand gradients to the reducer (gradients stay local)."""
        for handle in self._autograd_hook_handles:
            handle.remove()
        self._autograd_hook_handles = []
        self._grad_accumulators = []

    def _set_sparse_metadata(self, global_unique_ids):
        self.reducer._set_sparse_metadata(global_unique_ids)

    def _set_ddp_sink_clone(self, val: bool):
        self._ddp_sink_clone = val  # c10d has no DDPSink: recorded only

    def _log_and_throw(self, err_type, err_msg):
        raise err_type(err_msg)

    def _check_default_group(self):
        if self.process_group is not _dist._get_default_group():
            raise RuntimeError(
                "DDP Pickling/Unpickling are only supported "
                "when using DDP with the default process "
                "group. That is, when you have called "
                "init_process_group and have not passed "
                "process_group argument to DDP constructor"
            )

    def _get_parameters(self, m, recurse=True):
        for mod in m.modules() if recurse else [m]:
            yield from mod.parameters(recurse=False)

    @classmethod
    def _get_active_ddp_module(cls):
        return cls._active_ddp_module

    @contextlib.contextmanager
    def _inside_ddp_forward(self):
        previous = DistributedDataParallel._active_ddp_module
        DistributedDataParallel._active_ddp_module = self
        try:
            yield
        finally:
            DistributedDataParallel._active_ddp_module = previous

    def scatter(self, inputs, kwargs, device_ids):
        from torch.nn.parallel.scatter_gather import scatter_kwargs

        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def gather(self, outputs, output_device):
        from torch.nn.parallel.scatter_gather import gather

        return gather(outputs, output_device, dim=self.dim)

    def to_kwargs(self, inputs, kwargs, device_id):
        from torch.distributed.utils import _to_kwargs

        return _to_kwargs(inputs, kwargs, torch.device(self.device_type, device_id), False)

    def _sync_state(self, tensors, src=0):
        if tensors:
            _C._broadcast_coalesced(self.process_group, tensors, _BROADCAST_BUCKET_BYTES, src)

    def _distributed_broadcast_coalesced(self, tensors, buffer_size, authoritative_rank=0):
        _C._broadcast_coalesced(self.process_group, tensors, buffer_size, authoritative_rank)

    def _default_broadcast_coalesced(self, bufs=None, bucket_size=None, authoritative_rank=0):
        """Broadcasts `bufs` (default: the buffers to sync) from authoritative_rank."""
        if bufs is None:
            bufs = self._buffers_to_sync()
        if bucket_size is None:
            bucket_size = self.broadcast_bucket_size
        self._distributed_broadcast_coalesced(bufs, bucket_size, authoritative_rank)

    def _sync_module_buffers(self, authoritative_rank):
        self._default_broadcast_coalesced(authoritative_rank=authoritative_rank)

    def _sync_buffers(self, joined=False):
        """The forward pass's buffer broadcast: from rank 0, or in join mode from the highest
        rank still training (a joined rank's buffers are stale)."""
        buffers = self._forward_buffers()
        if not buffers:
            return
        src = self._find_common_rank(self._rank, not joined) if self._join_config.enable else 0
        self._sync_state(buffers, src)

    def _sync_final_model(self, is_last_joiner):
        """After join: every rank takes the model of the last rank to join (buffers too with
        forward_sync_buffers, as torch)."""
        src = self._find_common_rank(self._rank, is_last_joiner)
        self._sync_state(self._module_state(buffers=self.forward_sync_buffers), src)

    def _find_common_rank(self, input_rank, rank_cond):
        """The highest `input_rank` of the ranks for which `rank_cond` holds (every rank
        calls)."""
        rank = np.array([input_rank if rank_cond else -1], np.int64)
        _dist.all_reduce(rank, op=_dist.ReduceOp.MAX, group=self.process_group)
        if rank[0] < 0:
            raise ValueError(
                "DistributedDataParallel: no rank qualifies as the source of the model state"
            )
        return int(rank[0])

    def _sync_backward(self, wants):
        """Join mode: whether any rank reduces gradients in the coming backward pass."""
        flag = np.array([1 if wants else 0], np.int32)
        _dist.all_reduce(flag, group=self.process_group)
        return bool(flag[0])

    def _make_grad_hook(self, index):
        def hook(*_):
            if not self._in_backward:  # no_sync, or a backward pass without forward
                return
            if not self._finalize_queued:
                # Runs once the whole backward pass is done: reduces the buckets of unused
                # parameters (find_unused_parameters) and raises for missing ones otherwise.
                self._finalize_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            if index is not None:  # None: a sparse gradient (reduced in _finalize)
                if self.skip_all_reduce_unused_params:
                    self._marked.add(index)
                self.reducer._autograd_hook(index)

        return hook

    def _reduce_sparse_grads(self, joined=False):
        """Sums every sparse gradient over the group (a joined rank, or one that produced
        none, gives an empty one) and divides by the world size: the same parameters in the
        same order on every rank. Returns the gradients reduced."""
        world = _dist.get_world_size(self.process_group)
        reduced = []
        for p in self._sparse_params:
            grad = None if joined else p.grad
            sparse_dim = 1 if p.dim() > 0 else 0
            if grad is None:
                wire = torch.sparse_coo_tensor(
                    torch.empty((sparse_dim, 0), dtype=torch.int64),
                    torch.empty((0,) + tuple(p.shape[sparse_dim:]), dtype=p.dtype),
                    p.shape,
                )
            elif grad.is_sparse:
                wire = grad
            else:  # the weight was also used densely: autograd made the sum dense
                wire = grad.to_sparse(sparse_dim)
            _dist.all_reduce(wire, group=self.process_group)
            wire.div_(world)
            if joined:
                continue
            if grad is None:
                if wire._nnz() > 0:
                    p.grad = wire
            elif wire is not grad:
                grad.copy_(wire.to_dense())
            reduced.append(p.grad)
        return reduced

    def _finalize(self):
        self._finalize_queued = False
        self._in_backward = False
        try:
            self.reducer.finalize_backward()
        except RuntimeError as e:
            self._reducing = False
            if self.find_unused_parameters or "not marked ready" not in str(e):
                raise
            # As torch: the backward pass itself succeeds; the next forward reports that the
            # reduction never finished (the pass was abandoned, its buckets partly reduced).
            self._unfinished_reduction = str(e)
            return
        self._reducing = False
        sparse_grads = self._reduce_sparse_grads()
        if self._still_training is not None and not self._divide_by_initial_world_size:
            # The averages divided by the world size; joined ranks gave zeros.
            self._still_training.wait()
            training = float(self._still_training.result()[0][0])
            scale = _dist.get_world_size(self.process_group) / training
            used = (
                self.reducer._get_global_used_map()
                if self.find_unused_parameters
                else np.ones(len(self._params), np.int32)
            )
            for p, u in zip(self._params, used):
                if u and p.grad is not None:
                    p.grad.mul_(scale)
            for grad in sparse_grads:
                if grad is not None:
                    grad.mul_(scale)

    def forward(self, *inputs, **kwargs):
        if self._delay_all_reduce_all_params:
            # As torch: every parameter is delayed; the module runs as it is.
            output = self.module(*inputs, **kwargs)
            self._clear_grad_buffer()
            return output
        if (
            self._unfinished_reduction is not None
            and torch.is_grad_enabled()
            and self.require_backward_grad_sync
        ):
            # As torch: on every forward that would start a reduction.
            detail = self._unfinished_reduction
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a "
                "new one. This error indicates that your module has parameters that were not "
                "used in producing loss. You can enable unused parameter detection by passing "
                "the keyword argument `find_unused_parameters=True` to DistributedDataParallel, "
                f"or make sure every output takes part in the loss. ({detail})"
            )
        join = self._join_config.enable
        if join:
            self._still_training = Join.notify_join_context(self)
        if torch.is_grad_enabled():
            self._rebuild_buckets()
        self._sync_buffers()
        start = time.perf_counter_ns()
        with self._inside_ddp_forward():
            output = self.module(*inputs, **kwargs)
        self._forward_ns.append(time.perf_counter_ns() - start)
        # A forward pass without backward (validation with grad enabled) leaves a pass with no
        # gradient marked, which the next prepare_for_backward drops.
        self._in_backward = torch.is_grad_enabled() and self.require_backward_grad_sync
        # As torch: a forward pass that prepares no reduction (no_grad, no_sync) leaves the
        # buffers of the next one unsynced.
        self.require_forward_param_sync = self._in_backward
        if join:
            self._sync_backward(self._in_backward)
        if self._in_backward:
            self._forwards += 1
            self._marked = set()
            self._buckets_skipped = 0
            self._reducing = True
            self.reducer.prepare_for_backward()
        self._clear_grad_buffer()
        return output

    # --- uneven inputs (torch.distributed.algorithms.Join) ---

    def join(
        self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False
    ):
        """A context manager for training loops whose ranks have different numbers of
        inputs: a rank that runs out keeps meeting the others' collectives (with zero
        gradients) until every rank is done, and then every rank takes the model of the last
        rank to finish. Gradients are averaged over the whole group, or over the ranks still
        training with ``divide_by_initial_world_size=False``."""
        return Join(
            [self],
            enable,
            throw_on_early_termination,
            divide_by_initial_world_size=divide_by_initial_world_size,
        )

    def join_hook(self, **kwargs):
        self._divide_by_initial_world_size = kwargs.get("divide_by_initial_world_size", True)
        return _DDPJoinHook(self)

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return self.process_group

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context gradients accumulate locally; the first backward pass after
        it averages the accumulated gradients."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state, hook):
        """Reduces buckets with ``hook(state, bucket) -> c10d.Future`` instead of the
        default allreduce. As in torch, ``bucket.buffer()``, ``gradients()`` and
        ``parameters()`` are torch tensors (views of the bucket's memory); the future must be
        a c10d one (e.g. from ``c10d.all_reduce(..., async_op=True).get_future()``), so
        torch.distributed's own hooks do not apply. c10d's (c10d.algorithms.ddp_comm_hooks)
        get the bucket as it is."""
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        module = getattr(hook, "__module__", "") or ""
        if module.startswith("torch."):
            # They call torch.distributed on torch tensors: they would fail inside backward().
            raise ValueError(
                f"register_comm_hook: {module}.{getattr(hook, '__name__', 'hook')} "
                "is a torch.distributed hook; use the c10d ones "
                "(c10d.algorithms.ddp_comm_hooks.default_hooks) or write one on c10d"
            )
        if not module.startswith("c10d."):
            user_hook = hook

            def hook(hook_state, bucket):
                return user_hook(hook_state, _TorchBucket(bucket))

        if self._dispatching_comm_hooks():
            self._set_user_comm_hook(state, hook)
        else:
            _C._register_comm_hook(self.reducer, state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type):
        if not self._dispatching_comm_hooks():
            _C._register_builtin_comm_hook(self.reducer, comm_hook_type)
        elif comm_hook_type == _C.BuiltinCommHookType.FP16_COMPRESS:
            from .algorithms.ddp_comm_hooks import default_hooks

            self._set_user_comm_hook(self.process_group, default_hooks.fp16_compress_hook)
        else:
            self._set_user_comm_hook(
                None, lambda _, bucket: self.reducer._run_allreduce_hook(bucket)
            )

    def _dispatching_comm_hooks(self):
        """Whether c10d's own hook (_run_bucket_hook) is registered with the reducer."""
        return self.skip_all_reduce_unused_params or self.mixed_precision is not None

    def _set_user_comm_hook(self, state, hook):
        if self.mixed_precision is not None or self._user_comm_hook is not None:
            # As torch: its mixed precision is a comm hook of its own.
            raise RuntimeError(
                "register_comm_hook or register_builtin_comm_hook can only be called once"
                + (
                    " (mixed_precision reduces through a comm hook of its own)."
                    if self.mixed_precision is not None
                    else "."
                )
            )
        self._user_comm_hook = (state, hook)


class _DDPJoinHook(JoinHook):
    """A joined rank's part in the others' training steps: the buffer broadcast, the
    backward-sync vote, zeros through the comm hook for every bucket (in the reducer's order)
    and zeros for the used-parameter map; at the end, the last joiner's model for all."""

    def __init__(self, ddp):
        self._ddp = ddp

    def main_hook(self):
        ddp = self._ddp
        ddp._rebuild_buckets()
        ddp._sync_buffers(joined=True)
        if not ddp._sync_backward(False):
            return
        futures = [
            ddp.reducer._run_comm_hook(bucket)
            for bucket in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        for future in futures:
            future.wait()
        if ddp.find_unused_parameters:
            _dist.all_reduce(np.zeros(len(ddp._params), np.int32), group=ddp.process_group)
        ddp._reduce_sparse_grads(joined=True)

    def post_hook(self, is_last_joiner):
        ddp = self._ddp
        ddp._sync_final_model(is_last_joiner)
