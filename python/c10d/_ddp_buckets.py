"""Gradient buckets of c10d's DistributedDataParallel: torch's bucket size limits, the
regrouping after the first backward pass, and torch views of the buckets' memory."""

import sys

import numpy as np
import torch
import torch.utils.dlpack

from . import _C

# Gradient buckets: torch's default limit, and its unit.
_DEFAULT_BUCKET_CAP_MB = 25
_MB = 1024 * 1024


def _as_torch(view):
    """A torch tensor sharing the memory of what c10d returned (a numpy array, or a DLPack
    capsule for dtypes numpy lacks)."""
    if isinstance(view, np.ndarray):
        return torch.from_numpy(view)
    return torch.utils.dlpack.from_dlpack(view)


class _DDPBuckets:
    """DistributedDataParallel's bucket sizing and regrouping (a base of that class)."""

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

    def _point_grads_at_buckets(self):
        """gradient_as_bucket_view: .grad follows the reducer's (new) buckets."""
        for index, p in enumerate(self._params):
            if p.grad is not None:
                p.grad = _as_torch(self.reducer._bucket_view(index))

    def _rebuild_buckets(self):
        """As torch's DDP before its second iteration: once, regroup the buckets in the order
        the first backward pass produced the gradients (rank 0's order for all ranks)."""
        if self.reducer._rebuild_buckets():
            self._note_buckets()
            if self.gradient_as_bucket_view:
                self._point_grads_at_buckets()  # the reducer copied the buckets over

    def _note_buckets(self):
        """Which parameters each bucket holds, read once per bucket layout (the reducer's
        bucket_indices builds a new list on every read; the skip hook asks per bucket)."""
        self._bucket_members = [frozenset(b) for b in self.reducer.bucket_indices]

    def _bucket_sizes(self):
        """The bytes of each bucket, in the reducer's order (its parameters' bytes)."""
        return [
            sum(self._params[i].numel() * self._params[i].element_size() for i in members)
            for members in self._bucket_members
        ]
