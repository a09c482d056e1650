"""DistributedDataParallel for PyTorch modules, on c10d's process groups.

Importing this module imports torch (c10d itself never does): ``c10d.DistributedDataParallel``
loads it on first use. The wrapper works as torch's does on CPU: at construction every rank
takes rank 0's parameters and buffers; in a training step each parameter's gradient is handed
to a :class:`c10d.Reducer` as soon as autograd has accumulated it, buckets of gradients are
averaged across the group while the backward pass goes on, and when ``backward()`` returns
every ``.grad`` holds the average over the ranks.
"""

import contextlib

import numpy as np
import torch
import torch.utils.dlpack

from . import _C
from . import distributed_c10d as _dist

# Start-up broadcast of the module's state: bytes per flat buffer (as torch's DDP uses).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def _as_torch(view):
    """A torch tensor sharing the memory of what c10d returned (a numpy array, or a DLPack
    capsule for dtypes numpy lacks)."""
    if isinstance(view, np.ndarray):
        return torch.from_numpy(view)
    return torch.utils.dlpack.from_dlpack(view)


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` for data-parallel training over ``process_group`` (default: WORLD).

    Arguments follow ``torch.nn.parallel.DistributedDataParallel``; ``device_ids`` and
    ``output_device`` must be None (CPU only).
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__()
        if device_ids or output_device is not None:
            raise ValueError("DistributedDataParallel: c10d runs on CPU; device_ids and "
                             "output_device must be None")
        self.module = module
        self.process_group = _dist._resolve_group(process_group)
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        seen = set()
        self._params = []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params.append(p)
        if not self._params:
            raise RuntimeError("DistributedDataParallel: the module has no parameter that "
                               "requires a gradient")
        detached = [p.detach() for p in self._params]
        _C._verify_params_across_processes(self.process_group, detached)
        self._sync_state(detached + self._buffers_to_sync())
        limits = [_C._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_cap_mb * 1024 * 1024)]
        buckets, sizes = _C._compute_bucket_assignment_by_size(detached, limits)
        # Gradients are ready last parameter first: bucket 0 (reduced first) holds the last.
        self.reducer = _C.Reducer(self._params, list(reversed(buckets)), list(reversed(sizes)),
                                  self.process_group,
                                  find_unused_parameters=find_unused_parameters,
                                  gradient_as_bucket_view=gradient_as_bucket_view)
        if gradient_as_bucket_view:
            # Autograd accumulates straight into the buckets: no copy in or out (as long as
            # .grad stays this view: zero_grad(set_to_none=True) drops it, and the next
            # gradients are copied again).
            for index, p in enumerate(self._params):
                p.grad = _as_torch(self.reducer._bucket_view(index))
        if static_graph:
            self.reducer._set_static_graph()
        self._finalize_queued = False
        self._in_backward = False
        # Autograd calls these after accumulating a parameter's gradient into .grad. The
        # accumulator nodes must stay alive for their hooks to stay registered.
        self._grad_accumulators = []
        for index, p in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_grad_hook(index))
            self._grad_accumulators.append(accumulator)

    def _buffers_to_sync(self):
        return [b.detach() for b in self.module.buffers()]

    def _sync_state(self, tensors):
        if tensors:
            _C._broadcast_coalesced(self.process_group, tensors, _BROADCAST_BUCKET_BYTES, 0)

    def _make_grad_hook(self, index):
        def hook(*_):
            if not self._in_backward:  # no_sync, or a backward pass without forward
                return
            if not self._finalize_queued:
                # Runs once the whole backward pass is done: reduces the buckets of unused
                # parameters (find_unused_parameters) and raises for missing ones otherwise.
                self._finalize_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            self.reducer._autograd_hook(index)
        return hook

    def _finalize(self):
        self._finalize_queued = False
        self._in_backward = False
        self.reducer.finalize_backward()

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers:
            self._sync_state(self._buffers_to_sync())
        output = self.module(*inputs, **kwargs)
        # A forward pass without backward (validation with grad enabled) leaves a pass with no
        # gradient marked, which the next prepare_for_backward drops.
        self._in_backward = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self._in_backward:
            self.reducer.prepare_for_backward()
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

    def register_comm_hook(self, state, hook):
        """Reduces buckets with ``hook(state, bucket) -> c10d.Future`` instead of the
        default allreduce (see c10d.algorithms.ddp_comm_hooks). ``bucket.buffer()`` is a numpy
        array, and the future must be a c10d one (e.g. from ``c10d.all_reduce(...,
        async_op=True).get_future()``), so torch's own hooks do not apply unchanged."""
        _C._register_comm_hook(self.reducer, state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type):
        _C._register_builtin_comm_hook(self.reducer, comm_hook_type)
