"""The rest of torch DDP's API that torch-based tools call on c10d's DistributedDataParallel:
logging data, static graph, and small private methods (most of them as torch has them)."""

import os
import warnings

import torch

from . import distributed_c10d as _dist

# torch's logging data names dtypes as C++ types.
_TYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
}


class _DDPTorchCompat:
    """DistributedDataParallel's torch-compatible private API (a base of that class)."""

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

    def scatter(self, inputs, kwargs, device_ids):
        from torch.nn.parallel.scatter_gather import scatter_kwargs

        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def gather(self, outputs, output_device):
        from torch.nn.parallel.scatter_gather import gather

        return gather(outputs, output_device, dim=self.dim)

    def to_kwargs(self, inputs, kwargs, device_id):
        from torch.distributed.utils import _to_kwargs

        return _to_kwargs(inputs, kwargs, torch.device(self.device_type, device_id), False)
