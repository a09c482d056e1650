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
import time

import numpy as np
import torch
import torch.utils.dlpack

from . import _C
from . import distributed_c10d as _dist
from .algorithms.join import Join, JoinHook, Joinable

# Start-up broadcast of the module's state: bytes per flat buffer (as torch's DDP uses).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


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


class DistributedDataParallel(torch.nn.Module, Joinable):
    """Wraps ``module`` for data-parallel training over ``process_group`` (default: WORLD).

    Arguments follow ``torch.nn.parallel.DistributedDataParallel``; ``device_ids`` and
    ``output_device`` must be None (CPU only). ``with model.join():`` trains ranks with
    uneven numbers of inputs (see :meth:`join`).
    """

    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=True,
        process_group=None,
        bucket_cap_mb=25,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=False,
        static_graph=False,
    ):
        super().__init__()
        Joinable.__init__(self)
        if device_ids or output_device is not None:
            raise ValueError(
                "DistributedDataParallel: c10d runs on CPU; device_ids and "
                "output_device must be None"
            )
        self.module = module
        self.process_group = _dist._resolve_group(process_group)
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._rank = _dist.get_rank(self.process_group)
        self._divide_by_initial_world_size = True
        self._still_training = None  # the join notification's Work, in join mode
        self._unfinished_reduction = None  # why the last backward's reduction did not finish
        # Names from _set_params_and_buffers_to_ignore_for_model: neither synced nor reduced.
        self._ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._static_graph = bool(static_graph)
        self._forwards = 0  # forward passes that prepared a reduction
        self._forward_ns = collections.deque(maxlen=100)  # the last forward passes' times
        seen = set()
        self._params = []  # dense gradients: in the reducer's buckets
        self._sparse_params = []  # sparse gradients: _reduce_sparse_grads
        for prefix, m in module.named_modules():
            sparse = getattr(m, "sparse", False) is True
            for name, p in m.named_parameters(recurse=False):
                if (
                    p.requires_grad
                    and id(p) not in seen
                    and f"{prefix}.{name}".lstrip(".") not in self._ignored
                ):
                    seen.add(id(p))
                    (self._sparse_params if sparse else self._params).append(p)
        if not self._params and not self._sparse_params:
            raise RuntimeError(
                "DistributedDataParallel: the module has no parameter that requires a gradient"
            )
        _C._verify_params_across_processes(
            self.process_group, [p.detach() for p in self._params + self._sparse_params]
        )
        detached = [p.detach() for p in self._params]
        self._sync_state(self._module_state())
        self._bucket_cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        limits = [_C._DEFAULT_FIRST_BUCKET_BYTES, self._bucket_cap_bytes]
        buckets, sizes = (
            _C._compute_bucket_assignment_by_size(detached, limits) if detached else ([], [])
        )
        # Gradients are ready last parameter first: bucket 0 (reduced first) holds the last.
        self.reducer = _C.Reducer(
            self._params,
            list(reversed(buckets)),
            list(reversed(sizes)),
            self.process_group,
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        if gradient_as_bucket_view:
            # Autograd accumulates straight into the buckets: no copy in or out (as long as
            # .grad stays this view: zero_grad(set_to_none=True) drops it, and the next
            # gradients are copied again).
            for index, p in enumerate(self._params):
                p.grad = _as_torch(self.reducer._bucket_view(index))
        if static_graph:
            self._set_static_graph()
        self._finalize_queued = False
        self._in_backward = False
        # Autograd calls these after accumulating a parameter's gradient into .grad. The
        # accumulator nodes must stay alive for their hooks to stay registered.
        self._grad_accumulators = []
        for index, p in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_grad_hook(index))
            self._grad_accumulators.append(accumulator)
        for p in self._sparse_params:
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_grad_hook(None))
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

    def _point_grads_at_buckets(self):
        """gradient_as_bucket_view: .grad follows the reducer's (new) buckets."""
        for index, p in enumerate(self._params):
            if p.grad is not None:
                p.grad = _as_torch(self.reducer._bucket_view(index))

    def _rebuild_buckets(self):
        """As torch's DDP before its second iteration: once, regroup the buckets in the order
        the first backward pass produced the gradients (rank 0's order for all ranks)."""
        if self.reducer._rebuild_buckets() and self.gradient_as_bucket_view:
            self._point_grads_at_buckets()  # the reducer copied the buckets over

    def _buffers_to_sync(self):
        return [b.detach() for name, b in self.module.named_buffers() if name not in self._ignored]

    def _module_state(self):
        """Every parameter (frozen ones too, as torch syncs the whole module state) and
        buffer, but those to ignore."""
        return [
            p.detach() for name, p in self.module.named_parameters() if name not in self._ignored
        ] + self._buffers_to_sync()

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """Parameters and buffers (by fully qualified name) that a DistributedDataParallel
        built on `module` afterwards neither syncs from rank 0 nor reduces, as torch's."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore

    def _set_static_graph(self):
        """As static_graph=True at construction (call it before the first iteration)."""
        self._static_graph = True
        self.reducer._set_static_graph()

    def _forward_buffers(self):
        """The buffers the forward pass broadcasts: none unless broadcast_buffers and
        require_forward_param_sync."""
        if not (self.require_forward_param_sync and self.broadcast_buffers):
            return []
        return self._buffers_to_sync()

    def will_sync_module_buffers(self):
        return len(self._forward_buffers()) > 0

    def _get_ddp_logging_data(self):
        """The fields of torch's DDP logging data that apply here (construction settings,
        buckets, parameters, the environment; the forward time in ns)."""

        def env(name):
            return os.environ.get(name, "N/A")

        params = self._params + self._sparse_params
        buckets = [int(b.buffer().nbytes) for b in self.reducer._get_zeros_like_grad_buckets()]
        data = {
            "module_name": type(self.module).__name__,
            "device_ids": "",
            "output_device": -1,
            "broadcast_buffers": int(self.broadcast_buffers),
            "backend_name": str(_dist.get_backend(self.process_group)),
            "world_size": _dist.get_world_size(self.process_group),
            "rank": self._rank,
            "bucket_cap_bytes": self._bucket_cap_bytes,
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "has_sync_bn": 0,
            "is_multi_device_module": 0,
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": ", ".join(sorted({_TYPE_NAMES.get(p.dtype, str(p.dtype)) for p in params})),
            "bucket_sizes": ", ".join(map(str, buckets)),
            "has_rebuilt_buckets": int(self.reducer._has_rebuilt_buckets()),
            "iteration": max(self._forwards - 1, 0),
            "master_addr": env("MASTER_ADDR"),
            "master_port": env("MASTER_PORT"),
            "torch_distributed_debug": env("TORCH_DISTRIBUTED_DEBUG"),
        }
        if self._static_graph:  # as torch: only once set
            data["static_graph"] = 1
        if self.reducer._has_rebuilt_buckets():
            data["rebuilt_bucket_sizes"] = data["bucket_sizes"]
        if self.find_unused_parameters and self._forwards:
            used = self.reducer._get_local_used_map()
            data["unused_parameter_size"] = sum(
                p.numel() * p.element_size() for p, u in zip(self._params, used) if not u
            )
        if self._forward_ns:
            data["forward_compute_time"] = self._forward_ns[-1]
            data["avg_forward_compute_time"] = sum(self._forward_ns) // len(self._forward_ns)
        return data

    def _sync_state(self, tensors, src=0):
        if tensors:
            _C._broadcast_coalesced(self.process_group, tensors, _BROADCAST_BUCKET_BYTES, src)

    def _sync_buffers(self, joined=False):
        """The forward pass's buffer broadcast: from rank 0, or in join mode from the highest
        rank still training (a joined rank's buffers are stale)."""
        buffers = self._forward_buffers()
        if not buffers:
            return
        src = self._find_common_rank(not joined) if self._join_config.enable else 0
        self._sync_state(buffers, src)

    def _find_common_rank(self, candidate):
        """The highest rank of the group for which `candidate` holds (every rank calls)."""
        rank = np.array([self._rank if candidate else -1], np.int64)
        _dist.all_reduce(rank, op=_dist.ReduceOp.MAX, group=self.process_group)
        if rank[0] < 0:
            raise RuntimeError(
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
            if self.find_unused_parameters or "not marked ready" not in str(e):
                raise
            # As torch: the backward pass itself succeeds; the next forward reports that the
            # reduction never finished (the pass was abandoned, its buckets partly reduced).
            self._unfinished_reduction = str(e)
            return
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
        output = self.module(*inputs, **kwargs)
        self._forward_ns.append(time.perf_counter_ns() - start)
        # A forward pass without backward (validation with grad enabled) leaves a pass with no
        # gradient marked, which the next prepare_for_backward drops.
        self._in_backward = torch.is_grad_enabled() and self.require_backward_grad_sync
        if join:
            self._sync_backward(self._in_backward)
        if self._in_backward:
            self._forwards += 1
            self.reducer.prepare_for_backward()
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

        _C._register_comm_hook(self.reducer, state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type):
        _C._register_builtin_comm_hook(self.reducer, comm_hook_type)


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
        src = ddp._find_common_rank(is_last_joiner)
        ddp._sync_state(ddp._module_state(), src)
