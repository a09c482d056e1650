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
import time
import warnings
import weakref

import numpy as np
import torch

from . import _C
from . import distributed_c10d as _dist
from ._binding_additions import Reducer
from ._ddp_buckets import _DDPBuckets, _as_torch
from ._ddp_compat import _DDPTorchCompat
from ._ddp_features import _DDPFeatures, _dispatch_comm_hook
from ._ddp_join import _DDPJoin
from ._ddp_state import _BROADCAST_BUCKET_BYTES, _DDPState
from .algorithms.join import Join, Joinable

# Importable from here, as before the class's parts moved to their own modules.
from ._ddp_buckets import _DEFAULT_BUCKET_CAP_MB, _MB  # noqa: F401
from ._ddp_compat import _TYPE_NAMES  # noqa: F401
from ._ddp_features import _TorchBucket  # noqa: F401
from ._ddp_join import _DDPJoinHook  # noqa: F401


# The class's parts are bases, each in its own module: bucket sizing and regrouping
# (_ddp_buckets), comm hooks and the features built on hooks (_ddp_features), parameter and
# buffer syncing (_ddp_state), uneven inputs (_ddp_join), torch's private API (_ddp_compat).
class DistributedDataParallel(
    _DDPBuckets, _DDPFeatures, _DDPState, _DDPJoin, _DDPTorchCompat, torch.nn.Module, Joinable
):
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
        self.reducer = Reducer(
            self._params,
            list(reversed(buckets)),
            list(reversed(sizes)),
            self.process_group,
            bucket_bytes_cap=self._rebuild_caps[1],
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
            first_bucket_bytes_cap=self._rebuild_caps[0],
        )
        self._note_buckets()
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

    def _hook_accumulator(self, p, index):
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        self._autograd_hook_handles.append(accumulator.register_hook(self._make_grad_hook(index)))
        self._grad_accumulators.append(accumulator)

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
            self._marked.clear()
            self._buckets_skipped = 0
            self._reducing = True
            self.reducer.prepare_for_backward()
        self._clear_grad_buffer()
        return output

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
