"""Hooks of c10d's DistributedDataParallel beyond the default allreduce: users' comm hooks,
and the features c10d builds on hooks of its own (delay_all_reduce_named_params,
skip_all_reduce_unused_params, mixed_precision)."""

import torch

from . import _C
from . import distributed_c10d as _dist
from ._ddp_buckets import _as_torch


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


class _DDPFeatures:
    """DistributedDataParallel's comm hooks, delayed all-reduce and mixed precision (a base of
    that class)."""

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
            if self._marked.isdisjoint(self._bucket_members[bucket.index()]):
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

    def _cast_buffers(self, dtype):
        """mixed_precision's buffer_dtype: floating-point buffers take it for good (those of
        _set_params_and_buffers_to_ignore_for_model excepted, as in torch)."""
        if dtype is None:
            return
        for buf in self.module.buffers():
            if not getattr(buf, "_ddp_ignored", False) and buf.is_floating_point():
                buf.data = buf.to(dtype=dtype)

    # --- users' comm hooks ---

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
