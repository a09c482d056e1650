"""The standard comm hooks, written against the public API.

A hook is called as ``hook(state, bucket)`` with a :class:`c10d.GradBucket` and returns a
:class:`c10d.Future` whose value is the reduced bucket buffer. Register one with
``c10d._register_comm_hook(reducer, state, hook)``; here ``state`` is the process group
(None for the default group).
"""

import numpy as np

from ... import distributed_c10d as _dist


def _group_size(process_group) -> int:
    return _dist.get_world_size(process_group)


def allreduce_hook(process_group, bucket):
    """Averages the bucket: divides it by the group size, then all-reduces it in place."""
    buffer = bucket.buffer()
    buffer /= _group_size(process_group)
    return _dist.all_reduce(buffer, group=process_group, async_op=True).get_future()


def fp16_compress_hook(process_group, bucket):
    """Averages the bucket in float16 (half the bytes on the wire) and writes the result back
    in the bucket's dtype."""
    buffer = bucket.buffer()
    compressed = (buffer / _group_size(process_group)).astype(np.float16)
    work = _dist.all_reduce(compressed, group=process_group, async_op=True)

    def decompress(fut):
        fut.value()  # raises the allreduce's error, if any
        np.copyto(buffer, compressed, casting="unsafe")
        return buffer

    return work.get_future().then(decompress)
