"""Uneven inputs for c10d's DistributedDataParallel (torch.distributed.algorithms.Join): its
join, its join hook, and the collectives that pick the ranks whose state the others take."""

import numpy as np
import torch

from . import distributed_c10d as _dist
from .algorithms.join import Join, JoinHook


class _DDPJoin:
    """DistributedDataParallel's part in a Join (a base of that class, beside Joinable)."""

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
