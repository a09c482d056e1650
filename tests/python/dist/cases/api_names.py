"""Multi-rank cases of test_api_names: c10d's functional collectives against torch's own, run
side by side in one process (torch.distributed on a FileStore, c10d on the launcher's store)."""

import os
import warnings


def _autograd_cases(rank: int, world: int):
    """(name, function of (funcol, group, x)) pairs; x is this rank's input, requiring grad."""
    sizes_out = [r + 1 for r in range(world)]  # rank r sends r + 1 rows to each rank
    return [
        (
            "all_gather_tensor_autograd dim 0",
            lambda fc, g, x: fc.all_gather_tensor_autograd(x, 0, g),
        ),
        (
            "all_gather_tensor_autograd dim 1",
            lambda fc, g, x: fc.all_gather_tensor_autograd(x, 1, g),
        ),
        ("all_gather_tensor dim 0", lambda fc, g, x: fc.all_gather_tensor(x, 0, g)),
        (
            "reduce_scatter_tensor_autograd dim 0",
            lambda fc, g, x: fc.reduce_scatter_tensor_autograd(x, "sum", 0, g),
        ),
        (
            "reduce_scatter_tensor_autograd dim 1",
            lambda fc, g, x: fc.reduce_scatter_tensor_autograd(x, "sum", 1, g),
        ),
        ("reduce_scatter_tensor avg", lambda fc, g, x: fc.reduce_scatter_tensor(x, "avg", 0, g)),
        (
            "all_to_all_single_autograd even",
            lambda fc, g, x: fc.all_to_all_single_autograd(x, None, None, g),
        ),
        (
            "all_to_all_single_autograd uneven",
            lambda fc, g, x: fc.all_to_all_single_autograd(
                x[: world * (rank + 1)], sizes_out, [rank + 1] * world, g
            ),
        ),
        ("all_reduce sum", lambda fc, g, x: fc.all_reduce(x, "sum", g)),
        ("all_reduce max", lambda fc, g, x: fc.all_reduce(x, "max", g)),
        ("broadcast", lambda fc, g, x: fc.broadcast(x, world - 1, g)),
        (
            "permute_tensor",
            lambda fc, g, x: fc.permute_tensor(
                x.reshape(-1), [(i + 1) % world for i in range(world)], g
            ),
        ),
        ("all_reduce_coalesced", lambda fc, g, x: fc.all_reduce_coalesced([x, x * 2], "sum", g)[1]),
        ("wait_tensor", lambda fc, g, x: fc.wait_tensor(fc.all_reduce(x, "sum", g))),
    ]


def _outcome(torch, fc, group, fn, rank):
    """Forward values, gradient of a rank-dependent weighted sum, and error type, of fn."""
    x = (torch.arange(32, dtype=torch.float64).reshape(8, 4) + 100 * rank).requires_grad_(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = fn(fc, group, x)
            forward = y.detach().clone()
            weight = torch.arange(1, y.numel() + 1, dtype=y.dtype).reshape(y.shape) * (rank + 1)
            (y * weight).sum().backward()
        return forward, x.grad, None
    except Exception as e:  # noqa: BLE001 (compared with torch's by type)
        return None, None, e


def functional_autograd_matches_torch(dist, backend):
    import torch
    import torch.distributed as tdist
    import torch.distributed._functional_collectives as tfc

    import c10d._functional_collectives as cfc

    rank, world = dist.get_rank(), dist.get_world_size()
    store = tdist.FileStore(os.environ["C10D_TEST_TORCH_STORE"], world)
    tdist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        for name, fn in _autograd_cases(rank, world):
            want = _outcome(torch, tfc, tdist.group.WORLD, fn, rank)
            got = _outcome(torch, cfc, dist.group.WORLD, fn, rank)
            # c10d's errors may derive from several of torch's types: torch's must be one.
            assert (want[2] is None) == (got[2] is None) and (
                want[2] is None or isinstance(got[2], type(want[2]))
            ), f"{name}: torch raised {want[2]!r}, c10d {got[2]!r}"
            if want[2] is None:
                assert torch.equal(want[0], got[0]), f"{name} forward: {want[0]} != {got[0]}"
                assert torch.equal(want[1], got[1]), f"{name} grad: {want[1]} != {got[1]}"
    finally:
        tdist.destroy_process_group()


def coalescing_fuses_all_reduces(dist, backend):
    """Inside _coalescing_manager the all_reduces become one flattened all_reduce."""
    import numpy as np

    import c10d.distributed_c10d as dc

    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    seen = []
    pg._register_on_completion_hook(lambda info: seen.append(info.op_type))
    ts = [np.full(3, float(rank)), np.full(5, float(rank + 1))]
    with dc._coalescing_manager():
        for t in ts:
            assert dist.all_reduce(t) is None
        assert (ts[0] == rank).all(), "all_reduce ran before the block ended"
    total = world * (world - 1) / 2
    assert (ts[0] == total).all() and (ts[1] == total + world).all(), ts
    with dc._coalescing_manager(async_ops=True) as cm:
        outs = [np.zeros(2 * world), np.zeros(world)]
        for out, t in zip(outs, [np.full(2, float(rank)), np.full(1, float(rank))]):
            dist.all_gather_into_tensor(out, t, async_op=True)
    cm.wait()
    assert outs[1].tolist() == [float(r) for r in range(world)], outs
    dist.barrier()
    import time

    deadline = time.monotonic() + 10
    while dist.OpType.ALLREDUCE_COALESCED not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dist.OpType.ALLREDUCE_COALESCED in seen, seen
    assert dist.OpType.ALLREDUCE not in seen, seen
