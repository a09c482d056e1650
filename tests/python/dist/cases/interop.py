"""Cases of torch tensors through c10d's collectives, and of c10d._functional_collectives."""

import warnings

import numpy as np

from .common import _raises


def torch_interop(dist, backend):
    try:
        import torch
    except ImportError:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world * (world + 1) / 2), t
    bf = torch.full((8,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(bf)
    assert torch.all(bf.float() == world * (world + 1) / 2), bf
    out = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, torch.full((2,), rank, dtype=torch.int64))
    assert [int(o[0]) for o in out] == list(range(world))
    # Complex tensors and real views of them gather into each other, as in torch.
    if world > 1:
        c = torch.full((2,), complex(rank, -rank), dtype=torch.complex64)
        mixed = [torch.zeros(2, dtype=torch.complex64) for _ in range(world)]
        mixed[-1] = torch.view_as_real(mixed[-1])
        dist.all_gather(mixed, torch.view_as_real(c) if rank % 2 else c)
        assert torch.equal(mixed[0], torch.zeros(2, dtype=torch.complex64)), mixed
        assert torch.equal(mixed[-1], torch.tensor([[world - 1.0, 1.0 - world]] * 2)), mixed
    tt = torch.full((4, 2), float(rank + 1)).t()  # non-contiguous: staged and written back
    dist.all_reduce(tt)
    assert torch.all(tt == world * (world + 1) / 2) and not tt.is_contiguous(), tt
    _raises(
        ValueError,
        lambda: dist.send(tt, (rank + 1) % world) if world > 1 else dist.send(tt, 1),
        "non-contiguous torch send",
    )
    # Every synchronous form takes torch tensors (the inline path where there is one).
    x = torch.full((world, 3), float(rank), dtype=torch.float64)
    y = torch.zeros(world, 3, dtype=torch.float64)
    dist.all_to_all_single(y, x)
    assert torch.equal(
        y, torch.arange(world, dtype=torch.float64).repeat_interleave(3).reshape(world, 3)
    ), y
    g = [torch.zeros(2, dtype=torch.int32) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), rank, dtype=torch.int32), g, dst=0)
    if rank == 0:
        assert [int(v[1]) for v in g] == list(range(world)), g
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=world - 1)
    assert torch.all(b == world - 1), b
    # Functional collectives on torch tensors return torch's AsyncCollectiveTensor: a tensor
    # with wait() and numpy(); computing with it gives plain tensors.
    import c10d._functional_collectives as funcol

    act = funcol.all_reduce(torch.full((2, 2), float(rank)), "sum", dist.group.WORLD)
    assert isinstance(act, torch.Tensor) and type(act).__name__ == "AsyncCollectiveTensor"
    assert type(act.wait()) is torch.Tensor and type(act * 2) is torch.Tensor
    assert type(funcol.wait_tensor(act)) is torch.Tensor
    assert torch.equal(act.wait(), torch.full((2, 2), world * (world - 1) / 2))
    assert act.numpy().tolist() == [[world * (world - 1) / 2] * 2] * 2
    assert repr(act).startswith("AsyncCollectiveTensor(tensor(")
    # Tensors that require grad, such as Parameters, take part as in torch.distributed (not
    # recorded by autograd), in place.
    p = torch.nn.Parameter(torch.full((3,), float(rank)))
    dist.broadcast(p, src=0)
    assert p.requires_grad and torch.all(p.detach() == 0), p
    dist.all_reduce(p)
    assert torch.all(p.detach() == 0), p
    q = torch.full((3,), 1.0, requires_grad=True)
    dist.all_reduce(q, op=dist.ReduceOp.SUM)
    assert torch.all(q.detach() == world), q
    # Asynchronous results are the caller's own tensors, as torch's Work.result() and
    # get_future().wait() return them.
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.result()[0] is t and w.get_future().wait()[0] is t
    w = dist.broadcast(p, src=0, async_op=True)
    w.wait()
    assert w.result()[0] is p
    a = np.ones(6, np.float32)
    w = dist.all_reduce(a, async_op=True)
    w.wait()
    assert w.result()[0] is a and w.get_future().value()[0] is a
    # torch 1.13 cannot export bool through DLPack: its numpy view of the same memory is used.
    flags = torch.tensor([rank == 0, False, True])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.tolist() == [True, False, True], flags
    w = dist.broadcast(flags, src=world - 1, async_op=True)
    w.wait()
    assert w.result()[0] is flags
    # Sparse COO tensors: all_reduce sums them as torch's Gloo does (coalesced, in place, SUM
    # only, hybrid ones too); other collectives refuse them in words.
    sp = torch.sparse_coo_tensor(
        torch.tensor([[0, rank % 3, 2], [1, 0, rank % 3]]),
        torch.tensor([1.0, 2.0 + rank, 3.0]),
        (3, 3),
    )
    want = sum(
        torch.sparse_coo_tensor(
            torch.tensor([[0, r % 3, 2], [1, 0, r % 3]]), torch.tensor([1.0, 2.0 + r, 3.0]), (3, 3)
        ).to_dense()
        for r in range(world)
    )
    w = dist.all_reduce(sp, async_op=True)
    w.wait()
    assert sp.is_sparse and sp.is_coalesced() and torch.equal(sp.to_dense(), want), sp
    assert w.result()[0] is sp
    hybrid = torch.sparse_coo_tensor(
        torch.tensor([[rank % 2]]), torch.ones(1, 3) * (rank + 1), (2, 3)
    )
    dist.all_reduce(hybrid)
    dense = hybrid.to_dense()
    assert dense.sum() == 3 * world * (world + 1) / 2 and hybrid.dense_dim() == 1, dense
    _raises(
        ValueError,
        lambda: dist.all_reduce(sp, op=dist.ReduceOp.MAX),
        "sparse MAX",
        "only ReduceOp.SUM",
    )
    _raises(
        TypeError,
        lambda: dist.broadcast(sp, src=0),
        "sparse broadcast",
        "layout torch.sparse_coo are not supported",
    )


def functional_collectives(dist, backend):
    """c10d._functional_collectives: out-of-place results of the input's kind, the input left
    unchanged, groups given as ProcessGroup, name, rank list or list of rank lists."""
    import c10d._functional_collectives as funcol

    rank, world = dist.get_rank(), dist.get_world_size()
    W = dist.group.WORLD

    def base(r):
        return np.arange(6, dtype=np.float32).reshape(2, 3) + r

    x = base(rank)
    act = funcol.all_reduce(x, "sum", W)
    y = funcol.wait_tensor(act)
    np.testing.assert_array_equal(y, sum(base(r) for r in range(world)))
    # Results are AsyncCollectiveTensors, as in torch: wait()/trigger_wait()/numpy() give the
    # plain array, arithmetic gives plain arrays, views stay wrapped.
    assert isinstance(act, funcol.AsyncCollectiveTensor) and isinstance(act, np.ndarray)
    assert type(y) is np.ndarray and type(act.wait()) is np.ndarray
    np.testing.assert_array_equal(act.trigger_wait(), y)
    assert type(act + 1) is np.ndarray and type(np.concatenate([act, act])) is np.ndarray
    assert isinstance(act[0], funcol.AsyncCollectiveTensor)
    assert repr(act).startswith("AsyncCollectiveTensor(") and act.tolist() == y.tolist()
    np.testing.assert_array_equal(x, base(rank))  # input unchanged
    np.testing.assert_array_equal(funcol.all_reduce(x, "max", list(range(world))), base(world - 1))
    g0 = funcol.all_gather_tensor(x, 0, W)
    np.testing.assert_array_equal(g0, np.concatenate([base(r) for r in range(world)], axis=0))
    g1 = funcol.all_gather_tensor(x, 1, W)
    np.testing.assert_array_equal(g1, np.concatenate([base(r) for r in range(world)], axis=1))
    z = np.arange(2 * 4 * world).reshape(2, 4 * world)
    rs = funcol.reduce_scatter_tensor(z * (rank + 1), "sum", 1, W)
    total = world * (world + 1) // 2
    np.testing.assert_array_equal(rs, np.split(z * total, world, axis=1)[rank])
    rs0 = funcol.reduce_scatter_tensor(np.full((2 * world, 3), rank + 1), "sum", 0, W)
    assert rs0.shape == (2, 3) and (rs0 == total).all(), rs0
    b = funcol.broadcast(np.full(4, rank), world - 1, W)
    assert (b == world - 1).all(), b
    a2a = funcol.all_to_all_single(np.arange(2 * world) + 100 * rank, None, None, W)
    np.testing.assert_array_equal(
        a2a, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(world)])
    )
    # Uneven splits: rank r sends r + 1 rows to everyone.
    sent = np.full((world * (rank + 1), 2), rank)
    got = funcol.all_to_all_single(sent, [r + 1 for r in range(world)], [rank + 1] * world, W)
    np.testing.assert_array_equal(got[:, 0], np.repeat(np.arange(world), np.arange(1, world + 1)))
    shifted = funcol.permute_tensor(np.full(3, rank), [(i + 1) % world for i in range(world)], W)
    assert (shifted == (rank - 1) % world).all(), shifted
    to_0 = funcol.permute_tensor(np.full((1, 2), rank), [0] * world, W)  # not a permutation
    expect = np.repeat(np.arange(world), 2) if rank == 0 else np.zeros(0)
    np.testing.assert_array_equal(to_0.reshape(-1), expect)
    outs = funcol.all_reduce_coalesced([np.ones(2), np.full(3, rank)], "sum", W)
    assert (outs[0] == world).all() and (outs[1] == world * (world - 1) // 2).all(), outs
    # The in-place forms with the classic signatures.
    t = np.full(3, float(rank))
    funcol.all_reduce_inplace(t, "sum")
    assert (t == world * (world - 1) / 2).all(), t
    lst = [np.zeros(2) for _ in range(world)]
    funcol.all_gather_inplace(lst, np.full(2, float(rank)))
    assert [v[0] for v in lst] == list(range(world)), lst
    _raises(ValueError, lambda: funcol.all_reduce(x, "nope", W), "unknown reduce op")
    _raises(ValueError, lambda: funcol.all_reduce_inplace(t, async_op=True), "async in-place")
    # Pairs of ranks as a list of lists: each rank reduces within its own pair.
    if world % 2 == 0:
        pairs = [[i, i + 1] for i in range(0, world, 2)]
        s = funcol.all_reduce(np.full(1, rank), "sum", pairs)
        assert s[0] == 2 * (rank - rank % 2) + 1, s
        # Each pair names only its own ranks (MPMD): the groups are made by their members
        # alone, and a new_group of every rank afterwards still pairs the right ranks.
        mine = [rank - rank % 2, rank - rank % 2 + 1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s = funcol.all_reduce(np.full(1, 10**rank), "sum", mine)
        assert s[0] == 10 ** mine[0] + 10 ** mine[1], s
        assert any(issubclass(w.category, FutureWarning) for w in caught), caught
        odd = dist.new_group([r for r in range(world) if r % 2])
        if rank % 2:
            s = funcol.all_reduce(np.full(1, 10**rank), "sum", odd)
            assert s[0] == sum(10**r for r in range(1, world, 2)), s
        dist.barrier()  # rank 0 holds the store the odd ranks' group is built through
    _raises(
        AssertionError,
        lambda: (
            funcol.reduce_scatter_tensor(np.ones(world + 1), "sum", 0, W)
            if world > 1
            else funcol.reduce_scatter_tensor(np.ones(()), "sum", 0, W)
        ),
        "indivisible",
    )
    try:
        import torch
    except ImportError:
        return
    tt = torch.full((2, 2), float(rank))
    out = funcol.all_reduce(tt, "avg", W)
    assert isinstance(out, torch.Tensor), type(out)
    assert torch.allclose(out, torch.full((2, 2), (world - 1) / 2)), out
    assert torch.all(tt == rank)
    tg = funcol.all_gather_tensor(tt, 1, W)
    assert isinstance(tg, torch.Tensor) and tg.shape == (2, 2 * world), tg.shape
