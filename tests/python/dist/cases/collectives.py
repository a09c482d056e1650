"""Cases of the collectives on arrays: all_reduce (also inline), broadcast and reduce, gathers,
reduce_scatters, all_to_alls, strided arrays, and writes beside the outputs."""

import threading
import time
import warnings

import numpy as np

from .common import SIZES, _inputs, _expected, _valid_ops, _close, DTYPES, _raises


def all_reduce(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:
        for n in SIZES:
            xs = _inputs(dtype, n, world)
            for op in _valid_ops(dist, dtype):
                t = xs[rank].copy()
                dist.all_reduce(t, op=op)
                _close(t, _expected(op, dist, xs, dtype), dtype, f"{dtype} n={n} {op}")
    # PREMUL_SUM: sum of inputs each scaled by the factor.
    xs = _inputs(np.float32, 10, world)
    t = xs[rank].copy()
    dist.all_reduce(t, op=dist._C._make_nccl_premul_sum(2.5))
    _close(t, 2.5 * np.stack(xs).sum(0), np.float32, "premul_sum")
    # Multi-dimensional tensors reduce elementwise.
    t = np.full((3, 4), rank + 1, dtype=np.float64)
    dist.all_reduce(t)
    assert (t == world * (world + 1) / 2).all()


def inline_all_reduce(dist, backend):
    """A synchronous all_reduce on a plain array takes the inline path where the backend has
    one; it must number, trace and order operations exactly like the general path."""
    import json

    import c10d

    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    before = pg._get_sequence_number_for_group()
    t = np.full((2, 3), rank + 1, np.float32)
    dist.all_reduce(t)
    assert (t == world * (world + 1) / 2).all()
    assert pg._get_sequence_number_for_group() == before + 1
    dump = json.loads(c10d._dump_trace_json())
    uid = [g["uid"] for g in dump["groups"] if g["name"] == pg.group_name][-1]
    last = [e for e in dump["entries"] if e["group_uid"] == uid][-1]
    assert (last["op"], last["state"]) == ("allreduce", "completed"), last
    assert last["input_sizes"] == [[2, 3]] and last["input_dtypes"] == ["float32"], last
    # An asynchronous operation issued first completes first, with its own result.
    a = np.full(5, rank + 1, np.int64)
    b = np.full(3, 10 * (rank + 1), np.int64)
    work = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    work.wait()
    assert (a == world * (world + 1) // 2).all() and (b == 10 * world).all()
    # The same group explicitly, and a 0-d array.
    z = np.array(rank + 1.0)
    dist.all_reduce(z, group=pg)
    assert z == world * (world + 1) / 2
    # Completion hooks see every operation (the inline path steps aside for them). Hooks may
    # run on the backend's thread after wait() returned, as in PyTorch: wait for it.
    seen = []
    pg._register_on_completion_hook(lambda info: seen.append(info.seq))
    dist.all_reduce(np.ones(2))
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [pg._get_sequence_number_for_group()], seen


def inline_numpy_arrays(dist, backend):
    """numpy arrays on the inline path (read from the array's own fields when numpy's headers
    were there at build time): every dtype, 0-d and empty arrays, and the arrays that must
    take the buffer protocol instead (subclasses, dtype objects that are not numpy's own,
    misaligned data) or fail as they would there."""
    import pickle

    rank, world = dist.get_rank(), dist.get_world_size()
    total = world * (world + 1) // 2
    for code in "bBhilqefdFD":
        t = np.full((2, 2), rank + 1, np.dtype(code))
        dist.all_reduce(t)
        assert t.dtype == np.dtype(code) and (t == total).all(), (code, t)
    flags = np.full(3, rank == 0, np.bool_)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.all()
    z, e = np.array(rank + 1.0), np.ones(0, np.float32)
    dist.all_reduce(z)
    dist.all_reduce(e)
    assert z == total and e.shape == (0,)
    # A dtype object of its own (unpickled), a subclass and misaligned data.
    own = np.full(4, rank + 1, pickle.loads(pickle.dumps(np.dtype(np.float32))))
    dist.all_reduce(own)
    assert (own == total).all()

    class Sub(np.ndarray):
        pass

    sub = np.full(4, rank + 1, np.float64).view(Sub)
    dist.all_reduce(sub)
    assert (sub == total).all()
    raw = bytearray(4 * 5 + 1)
    odd = np.frombuffer(raw, np.float32, count=5, offset=1)
    assert not odd.flags.aligned
    odd[...] = rank + 1
    dist.all_reduce(odd)
    assert (odd == total).all()
    # Lists of arrays (gather, scatter) and an output/input pair.
    gathered = [np.zeros(3, np.int32) for _ in range(world)] if rank == 0 else None
    dist.gather(np.full(3, rank, np.int32), gathered, 0)
    if rank == 0:
        assert all((g == r).all() for r, g in enumerate(gathered))
    out = np.zeros((world, 2), np.float64)
    dist.all_gather_into_tensor(out, np.full(2, rank, np.float64))
    assert (out == np.arange(world)[:, None]).all()
    # What the buffer path rejects is rejected the same way.
    _raises(TypeError, lambda: dist.all_reduce(np.ones(3, np.uint16)), "uint16")
    _raises(TypeError, lambda: dist.all_reduce(np.ones(3, ">f4")), "big-endian float32")
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    _raises(ValueError, lambda: dist.broadcast(ro, 0), "read-only broadcast")
    # A transposed array leaves the inline path for the general one, which stages it.
    t = np.asfortranarray(np.full((4, 2), rank + 1, np.float32))
    dist.all_reduce(t)
    assert (t == total).all() and t.flags.f_contiguous, t
    list_collectives(dist, rank, world)


def list_collectives(dist, rank, world):
    """all_gather and reduce_scatter on lists of arrays, with some ranks on the inline path
    and others on the general one (an output list holding the input, outputs that overlap, a
    read-only or strided entry), at sizes around the small-step limit: every rank gets
    every rank's data, exactly."""
    for n in (1, 7, 1000, 70000):
        for dtype in (np.float32, np.int64):
            for variant in ("plain", "holds_input", "overlap", "strided"):
                general = variant != "plain" and rank == world - 1  # the others inline
                mine = np.arange(n, dtype=dtype) + 1000 * rank
                outs = [np.full(n, -1, dtype) for _ in range(world)]
                if general and variant == "holds_input":
                    outs[rank][:] = mine
                    mine = outs[rank]
                elif general and variant == "overlap" and world > 1:
                    backing = np.full(n * world, -1, dtype)
                    outs = [backing[r * n : (r + 1) * n] for r in range(world)]
                    outs[1] = outs[0]  # two entries, one buffer: the later rank's data wins
                elif general and variant == "strided":
                    outs[0] = np.full(2 * n, -1, dtype)[::2]
                dist.all_gather(outs, mine)
                for r in range(world):
                    want = np.arange(n, dtype=dtype) + 1000 * r
                    if general and variant == "overlap" and world > 1 and r == 0:
                        want = np.arange(n, dtype=dtype) + 1000  # rank 1's, written last
                    np.testing.assert_array_equal(outs[r], want, err_msg=f"{variant} {n} {r}")
                ins = [np.arange(n, dtype=dtype) * (j + 1) + rank for j in range(world)]
                if general and variant == "strided":
                    ins[0] = np.repeat(ins[0], 2)[::2]
                out = np.full(n, -1, dtype)
                if general and variant == "holds_input":
                    out = ins[rank]
                dist.reduce_scatter(out, ins)
                want = np.arange(n, dtype=dtype) * (rank + 1) * world + sum(range(world))
                np.testing.assert_array_equal(out, want, err_msg=f"reduce_scatter {variant} {n}")
    # Lists the call cannot take fail as on the general path.
    _raises(ValueError, lambda: dist.all_gather([np.zeros(3)] * (world + 1), np.zeros(3)), "long")


def all_reduce_errors(dist, backend):
    rank = dist.get_rank()
    for bad in [None, 3, "x", [1, 2]]:
        try:
            dist.all_reduce(bad)
        except TypeError:
            pass
        else:
            raise AssertionError(f"all_reduce({bad!r}) did not raise TypeError")
    c = np.ones(4, dtype=np.complex64)
    for op in [dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]:
        _raises(ValueError, lambda: dist.all_reduce(c, op=op), "complex MAX")
    _raises(
        ValueError,
        lambda: dist.all_reduce(np.ones(4, np.float32), op=dist.ReduceOp.BAND),
        "BAND on float",
    )
    # In torch's words.
    complex_max = "all_reduce does not support MAX on complex tensors"
    _raises(ValueError, lambda: dist.all_reduce(c, op=dist.ReduceOp.MAX), "complex", complex_max)
    _raises(
        ValueError,
        lambda: dist.all_reduce_coalesced([np.ones(2, np.float32), c], op=dist.ReduceOp.MAX),
        "complex in a list",
        complex_max,
    )
    for name in ["BAND", "BOR", "BXOR"]:
        _raises(
            ValueError,
            lambda: dist.all_reduce(c, op=getattr(dist.ReduceOp, name)),
            "complex bitwise",
            f"all_reduce does not support {name} on complex tensors",
        )
    _raises(
        ValueError,
        lambda: dist.all_reduce(np.ones(4), op=dist.ReduceOp.BOR),
        "BOR",
        "Cannot use ReduceOp.BOR with non-integral dtype",
    )
    # PREMUL_SUM needs its factor, and a floating dtype (as torch's NCCL); a bare one used to
    # sum unscaled.
    _raises(
        ValueError,
        lambda: dist.all_reduce(np.ones(4), op=dist.ReduceOp.PREMUL_SUM),
        "PREMUL_SUM without a factor",
        "needs its factor",
    )
    _raises(
        ValueError,
        lambda: dist.all_reduce(np.ones(4, np.int32), op=dist._make_nccl_premul_sum(2.0)),
        "PREMUL_SUM on int32",
        "PREMUL_SUM is not supported for int32",
    )
    # A bad element of a list is named by its index, in one sentence.
    _raises(
        TypeError,
        lambda: dist.all_reduce([1.0, 2.0]),
        "a list as the tensor",
        "Invalid function argument. allreduce[0]: expected a tensor",
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.all_reduce_coalesced([np.ones(2)])
    assert any(
        issubclass(w.category, FutureWarning)
        and issubclass(w.category, UserWarning)
        and "all_reduce_coalesced is deprecated" in str(w.message)
        for w in seen
    ), seen
    # A list mixing real and complex tensors reduces in one call (complex as pairs of reals).
    mixed = [np.ones(3, np.float32), np.full(2, (1 + 2j) * rank, np.complex64)]
    dist.all_reduce_coalesced(mixed)
    world = dist.get_world_size()
    assert (mixed[0] == world).all() and (mixed[1] == (1 + 2j) * sum(range(world))).all(), mixed
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(1), (4,), (0,), writeable=True)
    _raises(ValueError, lambda: dist.all_reduce(overlapping), "an output with a stride of 0")
    ro = np.ones(4)
    ro.setflags(write=False)
    _raises(ValueError, lambda: dist.all_reduce(ro), "read-only output")
    # The group still works after rejected calls.
    t = np.ones(3)
    dist.all_reduce(t)
    assert (t == dist.get_world_size()).all()


def broadcast_reduce(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in [np.float32, np.int64, np.float16, np.bool_, np.complex128, np.uint8]:
        for n in SIZES:
            xs = _inputs(dtype, n, world, salt=3)
            for root in range(world):
                t = xs[rank].copy()
                dist.broadcast(t, src=root)
                _close(t, xs[root], dtype, f"broadcast {dtype} n={n} root={root}")
                t = xs[rank].copy()
                dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
                if rank == root:
                    _close(
                        t,
                        _expected(dist.ReduceOp.SUM, dist, xs, dtype),
                        dtype,
                        f"reduce {dtype} n={n} root={root}",
                    )
    t = np.zeros(2)
    _raises(ValueError, lambda: dist.broadcast(t, src=world), "broadcast from a bad rank")


def gathers(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in [np.float32, np.int32, np.float16, np.bool_, np.complex64]:
        for n in SIZES:
            xs = _inputs(dtype, n, world, salt=1)
            out = [np.zeros(n, dtype) for _ in range(world)]
            dist.all_gather(out, xs[rank])
            for r in range(world):
                _close(out[r], xs[r], dtype, f"all_gather {dtype} n={n} from {r}")
            flat = np.zeros(n * world, dtype)
            dist.all_gather_into_tensor(flat, xs[rank])
            _close(flat, np.concatenate(xs), dtype, "all_gather_into_tensor flat")
            stacked = np.zeros((world, n), dtype)
            dist.all_gather_into_tensor(stacked, xs[rank])
            _close(stacked, np.stack(xs), dtype, "all_gather_into_tensor stacked")
            for root in range(world):
                gl = [np.zeros(n, dtype) for _ in range(world)] if rank == root else None
                dist.gather(xs[rank], gl, dst=root)
                if rank == root:
                    for r in range(world):
                        _close(gl[r], xs[r], dtype, f"gather root={root} from {r}")
                out1 = np.zeros(n, dtype)
                dist.scatter(out1, [x.copy() for x in xs] if rank == root else None, src=root)
                _close(out1, xs[rank], dtype, f"scatter root={root}")
    # Uneven all_gather (torch supports it): rank r contributes r + 1 rows of 2.
    outs = [np.full((r + 1, 2), -1, np.int32) for r in range(world)]
    work = dist.all_gather(outs, np.full((rank + 1, 2), rank, np.int32), async_op=True)
    work.wait()
    assert all((o == r).all() for r, o in enumerate(outs)), outs
    assert all(a is b for a, b in zip(work.result(), outs))
    if world > 1:
        bad = [np.zeros(r + 1, np.int32) for r in range(world)]
        _raises(
            ValueError,
            lambda: dist.all_gather(bad, np.zeros(rank + 2, np.int32)),
            "an uneven all_gather whose own output does not fit the input",
        )
        # Only rank 0's list is wrong (torch's gloo check): every rank raises, none waits.
        outs = [np.zeros(r + 1, np.int32) for r in range(world)]
        if rank == 0:
            outs[-1] = np.zeros(world + 5, np.int32)
        _raises(
            ValueError,
            lambda: dist.all_gather(outs, np.zeros(rank + 1, np.int32)),
            "an uneven all_gather with a wrong list on rank 0",
        )
        dist.barrier()
    # Coalesced all_gather of two tensors of different shapes.
    a, b = np.full(2, rank, np.int64), np.full((2, 3), rank * 10, np.int64)
    outs = [[np.zeros(2, np.int64), np.zeros((2, 3), np.int64)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [a, b])
    for r in range(world):
        assert (outs[r][0] == r).all() and (outs[r][1] == r * 10).all()
    # Real and complex tensors in one list.
    outs = [[np.zeros(2, np.float32), np.zeros(1, np.complex64)] for _ in range(world)]
    dist.all_gather_coalesced(
        outs, [np.full(2, rank, np.float32), np.full(1, 1j * rank, np.complex64)]
    )
    assert all((outs[r][0] == r).all() and outs[r][1][0] == 1j * r for r in range(world)), outs
    # Argument rules.
    x = np.zeros(3)
    if world > 1:
        other = (rank + 1) % world
        _raises(
            ValueError,
            lambda: dist.gather(x, [np.zeros(3)] * world, dst=other),
            "gather_list on a non-destination rank",
        )
        _raises(
            ValueError,
            lambda: dist.scatter(x, [np.zeros(3)] * world, src=other),
            "scatter_list on a non-source rank",
        )
    _raises(ValueError, lambda: dist.gather(x, None, dst=rank), "no gather_list on dst")
    _raises(
        ValueError,
        lambda: dist.all_gather([np.zeros(3)] * (world + 1), x),
        "all_gather list too long",
    )
    _raises(
        ValueError,
        lambda: dist.all_gather([np.zeros(3, np.int32)] * world, x),
        "all_gather dtype mismatch",
    )
    _raises(
        ValueError,
        lambda: dist.all_gather_into_tensor(np.zeros(3 * world + 1), x),
        "all_gather_into_tensor size mismatch",
    )
    _raises(TypeError, lambda: dist.all_gather(x, x), "all_gather output not a list")


def reduce_scatters(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in [np.float32, np.int64, np.float16, np.complex64]:
        for n in [0, 1, 5]:
            # Rank r's input list: world chunks of n.
            lists = [_inputs(dtype, n * world, world, salt=s) for s in range(1)][0]
            ops = (
                [dist.ReduceOp.SUM, dist.ReduceOp.AVG]
                if dtype == np.complex64
                else [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
            )
            for op in ops:
                exp_full = _expected(op, dist, lists, dtype)
                out = np.zeros(n, dtype)
                chunks = [lists[rank][i * n : (i + 1) * n].copy() for i in range(world)]
                dist.reduce_scatter(out, chunks, op=op)
                _close(out, exp_full[rank * n : (rank + 1) * n], dtype, f"reduce_scatter {op}")
                out2 = np.zeros(n, dtype)
                dist.reduce_scatter_tensor(out2, lists[rank].copy(), op=op)
                _close(
                    out2, exp_full[rank * n : (rank + 1) * n], dtype, f"reduce_scatter_tensor {op}"
                )
    _raises(
        ValueError,
        lambda: dist.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * world + 1)),
        "reduce_scatter_tensor size mismatch",
    )


def all_to_alls(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in [np.float32, np.int16, np.complex64]:
        # Even splits: rank r sends value 100*r + j to rank j.
        inp = np.array([100 * rank + j for j in range(world) for _ in range(2)], dtype)
        out = np.zeros(2 * world, dtype)
        dist.all_to_all_single(out, inp)
        exp = np.array([100 * j + rank for j in range(world) for _ in range(2)], dtype)
        _close(out, exp, dtype, "all_to_all_single even")
        # Uneven: rank r sends (j + 1) copies of 100*r + j to rank j; receives rank+1 from each.
        in_splits = [j + 1 for j in range(world)]
        inp = np.concatenate([np.full(j + 1, 100 * rank + j) for j in range(world)]).astype(dtype)
        out_splits = [rank + 1] * world
        out = np.zeros(sum(out_splits), dtype)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        exp = np.concatenate([np.full(rank + 1, 100 * j + rank) for j in range(world)])
        _close(out, exp.astype(dtype), dtype, "all_to_all_single uneven")
        # 2-D rows.
        inp2 = np.full((world, 3), rank, dtype)
        out2 = np.zeros((world, 3), dtype)
        dist.all_to_all_single(out2, inp2)
        _close(
            out2,
            np.repeat(np.arange(world), 3).reshape(world, 3).astype(dtype),
            dtype,
            "all_to_all_single 2-D",
        )
        # List form with different sizes per peer.
        ins = [np.full(j + 1, 10 * rank + j, dtype) for j in range(world)]
        outs = [np.zeros(rank + 1, dtype) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for j in range(world):
            _close(outs[j], np.full(rank + 1, 10 * j + rank, dtype), dtype, "all_to_all list")
    _raises(
        ValueError,
        lambda: dist.all_to_all_single(np.zeros(world), np.zeros(world), [1] * world, [2] * world),
        "splits that do not sum to the size",
    )


def strided_arrays(dist, backend):
    """Arrays laid out other than in C order (transposed, sliced, reversed) work in every
    collective, read and written through their strides; what lies between their elements is
    left alone. Sends and receives still need contiguous arrays, as in torch."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def grid(r, dtype=np.float32):  # 3 x 4, laid out transposed (Fortran order)
        return np.asfortranarray(np.arange(12, dtype=dtype).reshape(3, 4) * (r + 1))

    total = sum(r + 1 for r in range(world))
    t = grid(rank)
    dist.all_reduce(t)
    assert np.array_equal(t, grid(0) * total) and t.flags.f_contiguous, t
    base = np.arange(10, dtype=np.int64) * (rank + 1)
    dist.all_reduce(base[::3], op=dist.ReduceOp.MAX)  # elements 0, 3, 6, 9
    expected = np.arange(10) * (rank + 1)
    expected[::3] = np.arange(10)[::3] * world
    assert np.array_equal(base, expected), base
    t = np.arange(8, dtype=np.float64)[::-1] * (rank + 1)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert np.array_equal(t, np.arange(8)[::-1] * total) and w.result()[0] is t, t
    for root in range(world):
        t = grid(rank).T
        dist.broadcast(t, src=root)
        assert np.array_equal(t, grid(root).T), t
        t = grid(rank)[:, 1:3]
        dist.reduce(t, dst=root)
        assert rank != root or np.array_equal(t, grid(0)[:, 1:3] * total), t
    outs = [np.zeros((4, 3), np.float32).T for _ in range(world)]
    dist.all_gather(outs, grid(rank)[::-1])
    assert all(np.array_equal(o, grid(r)[::-1]) for r, o in enumerate(outs)), outs
    flat = np.zeros((world * 3, 8), np.float32)[:, ::2]
    dist.all_gather_into_tensor(flat, grid(rank))
    assert np.array_equal(flat, np.concatenate([grid(r) for r in range(world)])), flat
    out = np.zeros((4, 3), np.float32).T
    dist.reduce_scatter(out, [grid(rank) + r for r in range(world)])
    assert np.array_equal(out, grid(0) * total + world * rank), out
    out = np.zeros((4, 3), np.float32).T
    dist.reduce_scatter_tensor(
        out, np.asfortranarray(np.concatenate([grid(rank) + r for r in range(world)]))
    )
    assert np.array_equal(out, grid(0) * total + world * rank), out
    src = np.asfortranarray(
        np.arange(world * 2 * 3, dtype=np.int32).reshape(world * 2, 3) + 100 * rank
    )
    out = np.zeros((3, world * 2), np.int32).T
    dist.all_to_all_single(out, src)
    want = np.concatenate(
        [
            np.arange(world * 2 * 3).reshape(world * 2, 3)[2 * rank : 2 * rank + 2] + 100 * r
            for r in range(world)
        ]
    )
    assert np.array_equal(out, want), out
    root = world - 1
    gathered = [np.zeros((4, 3), np.float32).T for _ in range(world)] if rank == root else None
    dist.gather(grid(rank), gathered, dst=root)
    assert rank != root or all(np.array_equal(g, grid(r)) for r, g in enumerate(gathered))
    out = np.zeros((4, 3), np.float32).T
    dist.scatter(out, [grid(r).copy() for r in range(world)] if rank == root else None, src=root)
    assert np.array_equal(out, grid(rank)), out
    if world > 1:
        t = grid(rank)
        peer = (rank + 1) % world
        _raises(
            ValueError,
            lambda: dist.send(t, peer) if rank % 2 == 0 else dist.recv(t, peer),
            "a send or receive of a transposed array",
        )
    try:
        import torch
    except ImportError:
        return
    t = torch.arange(12.0).reshape(3, 4).t() * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t() * total), t


def writes_beside_outputs(dist, backend):
    """Every collective, synchronous and asynchronous, changes only its outputs while another
    thread of this process writes the rest of the arrays those outputs are slices of."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n, head = 1 << 17, 3  # float32 slices of 512 KiB starting off a page boundary

    def sliced(total):
        owner = np.zeros(total + 2 * head + n, np.float32)
        return owner, owner[head : head + total], [owner[:head], owner[head + total :]]

    def run(what, total, start, check, async_op):
        owner, out, rest = sliced(total)
        start_fill = start(out)
        go = threading.Event()
        done = threading.Event()
        written = []

        def writer():
            go.set()
            value = 1000
            while not done.is_set():  # the last value written must be the one found
                value += 1
                for part in rest:
                    part[:] = value
                written.append(value)
            value += 1
            for part in rest:
                part[:] = value
            written.append(value)

        t = threading.Thread(target=writer)
        t.start()
        go.wait()
        work = start_fill(async_op)
        if work is not None:
            work.wait()
        done.set()
        t.join()
        check(out, f"{what} (async_op={async_op})")
        for part in rest:
            wrong = int(np.count_nonzero(part != written[-1]))
            assert wrong == 0, f"{what} (async_op={async_op}): {wrong} bytes beside it changed"

    def equal(want):
        def check(out, what):
            assert np.array_equal(out, want), what

        return check

    total_world = sum(range(1, world + 1))
    for async_op in (False, True):

        def reduce_all(out):
            out[:] = rank + 1
            return lambda a: dist.all_reduce(out, async_op=a)

        run("all_reduce", n, reduce_all, equal(np.full(n, total_world, np.float32)), async_op)

        def bcast(out):
            out[:] = np.arange(n) if rank == 0 else -1
            return lambda a: dist.broadcast(out, 0, async_op=a)

        run("broadcast", n, bcast, equal(np.arange(n, dtype=np.float32)), async_op)

        src = np.full(n, rank + 1, np.float32)
        run(
            "all_gather_into_tensor",
            n * world,
            lambda out: lambda a: dist.all_gather_into_tensor(out, src, async_op=a),
            equal(np.repeat(np.arange(1, world + 1, dtype=np.float32), n)),
            async_op,
        )

        big = np.arange(n * world, dtype=np.float32) + rank
        want = np.arange(n * world, dtype=np.float32) * world + sum(range(world))
        want = want[rank * n : (rank + 1) * n]
        run(
            "reduce_scatter_tensor",
            n,
            lambda out: lambda a: dist.reduce_scatter_tensor(out, big, async_op=a),
            equal(want),
            async_op,
        )

        parts = np.repeat(np.arange(world, dtype=np.float32) + 10 * rank, n // world)
        want = np.repeat(np.arange(world, dtype=np.float32) * 10 + rank, n // world)
        run(
            "all_to_all_single",
            n // world * world,
            lambda out: lambda a: dist.all_to_all_single(out, parts, async_op=a),
            equal(want),
            async_op,
        )


def integer_overflow(dist, backend):
    """Integer reductions wrap as numpy's do (two's complement), at the extremes of every
    integer dtype and at lengths that end inside and outside a vector register."""
    rank, world = dist.get_rank(), dist.get_world_size()
    O = dist.ReduceOp
    ops = [O.SUM, O.PRODUCT, O.MIN, O.MAX, O.BAND, O.BOR, O.BXOR]
    for dtype in [np.int8, np.uint8, np.int16, np.int32, np.int64]:
        info = np.iinfo(dtype)
        for n in [1, 7, 64, 1000]:
            # Values near both ends and in between, different on every rank.
            xs = []
            for r in range(world):
                i = np.arange(n, dtype=np.int64) + 37 * r
                pick = np.where(
                    i % 3 == 0, info.max - i % 5, np.where(i % 3 == 1, info.min + i % 7, i)
                )
                xs.append(pick.astype(dtype))
            stack = np.stack(xs)
            for op in ops:
                want = {
                    O.SUM: lambda: np.add.reduce(stack, 0, dtype=dtype),
                    O.PRODUCT: lambda: np.multiply.reduce(stack, 0, dtype=dtype),
                    O.MIN: lambda: stack.min(0),
                    O.MAX: lambda: stack.max(0),
                    O.BAND: lambda: np.bitwise_and.reduce(stack, 0),
                    O.BOR: lambda: np.bitwise_or.reduce(stack, 0),
                    O.BXOR: lambda: np.bitwise_xor.reduce(stack, 0),
                }[op]()
                what = f"{np.dtype(dtype).name} n={n} {op}"
                t = xs[rank].copy()
                dist.all_reduce(t, op=op)
                np.testing.assert_array_equal(t, want, err_msg=f"all_reduce {what}")
                t = xs[rank].copy()
                dist.reduce(t, dst=world - 1, op=op)
                if rank == world - 1:
                    np.testing.assert_array_equal(t, want, err_msg=f"reduce {what}")
                if n % world == 0:
                    k = n // world
                    out = np.zeros(k, dtype)
                    dist.reduce_scatter_tensor(out, xs[rank].copy(), op=op)
                    np.testing.assert_array_equal(
                        out, want[rank * k : (rank + 1) * k], err_msg=f"reduce_scatter {what}"
                    )


def aliased_outputs(dist, backend):
    """A collective whose output is (or holds) its input reads the input as it was before
    the call: all_to_all_single(x, x), all_gather into the array holding the input, a
    reduce_scatter into a piece of its input, lists that share arrays."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 5
    for dtype in [np.float32, np.int64]:
        for _ in range(20):
            x = np.array([100 * rank + j for j in range(world) for _ in range(n)], dtype)
            dist.all_to_all_single(x, x)
            want = np.array([100 * j + rank for j in range(world) for _ in range(n)], dtype)
            np.testing.assert_array_equal(x, want, err_msg="all_to_all_single(x, x)")
        # Uneven splits, in place.
        splits = [1 + (rank + j) % 3 for j in range(world)]  # to j; j sends me splits_j[rank]
        x = np.concatenate([np.full(splits[j], 10 * rank + j) for j in range(world)]).astype(dtype)
        recv = [1 + (j + rank) % 3 for j in range(world)]
        if sum(recv) == sum(splits):
            dist.all_to_all_single(x, x, recv, splits)
            want = np.concatenate([np.full(recv[j], 10 * j + rank) for j in range(world)])
            np.testing.assert_array_equal(x, want.astype(dtype), err_msg="uneven in place")
        # all_gather_into_tensor from this rank's piece of the output (torch's in-place form).
        out = np.zeros(world * n, dtype)
        mine = out[rank * n : (rank + 1) * n]
        mine[:] = rank + 1
        dist.all_gather_into_tensor(out, mine)
        np.testing.assert_array_equal(out, np.repeat(np.arange(1, world + 1), n).astype(dtype))
        # ...and from another rank's piece: the input is what it held before the call.
        out = np.arange(world * n, dtype=dtype) + 1000 * rank
        piece = out[((rank + 1) % world) * n : ((rank + 1) % world + 1) * n]
        sent = [
            np.arange(world * n, dtype=dtype)[((r + 1) % world) * n :][:n] + 1000 * r
            for r in range(world)
        ]
        dist.all_gather_into_tensor(out, piece)
        np.testing.assert_array_equal(out, np.concatenate(sent), err_msg="all_gather from a piece")
        # all_gather into a list holding the input.
        outs = [np.zeros(n, dtype) for _ in range(world)]
        outs[rank][:] = rank + 7
        dist.all_gather(outs, outs[rank])
        for r in range(world):
            np.testing.assert_array_equal(outs[r], np.full(n, r + 7, dtype), err_msg="list")
        outs = [np.zeros(n, dtype) for _ in range(world)]
        x = np.full(n, rank + 7, dtype)
        outs[(rank + 1) % world] = x
        dist.all_gather(outs, x)
        for r in range(world):
            np.testing.assert_array_equal(outs[r], np.full(n, r + 7, dtype), err_msg="list 2")
        # reduce_scatter_tensor into a piece of the input.
        inp = np.concatenate([np.full(n, 10 * rank + j) for j in range(world)]).astype(dtype)
        total = sum(10 * r for r in range(world))
        for j in (rank, (rank + 1) % world):
            x = inp.copy()
            out = x[j * n : (j + 1) * n]
            dist.reduce_scatter_tensor(out, x)
            np.testing.assert_array_equal(
                out, np.full(n, total + world * rank, dtype), err_msg=f"reduce_scatter piece {j}"
            )
        # all_to_all with the same arrays as inputs and outputs.
        xs = [np.full(n, 10 * rank + j, dtype) for j in range(world)]
        dist.all_to_all(xs, xs)
        for j in range(world):
            np.testing.assert_array_equal(xs[j], np.full(n, 10 * j + rank, dtype), err_msg="lists")
        # gather and scatter whose root list holds the root's own array.
        root = world - 1
        x = np.full(n, rank + 3, dtype)
        lst = [np.zeros(n, dtype) for _ in range(world)] if rank == root else None
        if rank == root:
            lst[0] = x
        dist.gather(x, lst, dst=root)
        if rank == root:
            for r in range(world):
                np.testing.assert_array_equal(lst[r], np.full(n, r + 3, dtype), err_msg="gather")
        lst = [np.full(n, 50 + r, dtype) for r in range(world)] if rank == root else None
        out = lst[0] if rank == root else np.zeros(n, dtype)
        dist.scatter(out, lst, src=root)
        np.testing.assert_array_equal(out, np.full(n, 50 + rank, dtype), err_msg="scatter")


def small_beside_async(dist, backend):
    """Small collectives (which MPI carries inside its cross-rank check) exact whether or not an
    asynchronous one is still in flight on some ranks: ranks that decide differently about
    carrying the data in the check agree to move it the usual way."""
    rank, world = dist.get_rank(), dist.get_world_size()
    O = dist.ReduceOp
    total = sum(range(1, world + 1))
    for i in range(12):
        big = np.full(1 << 16, rank + 1.0, np.float32)
        work = dist.all_reduce(big, async_op=True) if i % 2 == 0 else None
        x = np.arange(5, dtype=np.int32) + rank
        dist.all_reduce(x)
        np.testing.assert_array_equal(x, np.arange(5) * world + sum(range(world)))
        m = np.array([rank * 1.5, -rank], np.float64)
        dist.all_reduce(m, op=O.MAX)
        np.testing.assert_array_equal(m, [(world - 1) * 1.5, 0.0])
        a = np.full(3, float(rank + 1), np.float32)
        dist.all_reduce(a, op=O.AVG)
        np.testing.assert_allclose(a, total / world, rtol=1e-6)
        p = np.full(2, 1.0 + rank, np.float32)
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(2.0))
        np.testing.assert_array_equal(p, np.full(2, 2.0 * total, np.float32))
        root = i % world
        b = np.full(4, rank * 10 + i, np.int64)
        dist.broadcast(b, root)
        np.testing.assert_array_equal(b, np.full(4, root * 10 + i))
        r = np.full(3, rank + 1, np.int16)
        dist.reduce(r, root, op=O.PRODUCT)
        if rank == root:
            np.testing.assert_array_equal(r, np.full(3, np.prod(np.arange(1, world + 1)), np.int16))
        else:
            np.testing.assert_array_equal(r, np.full(3, rank + 1, np.int16))
        g = np.empty(2 * world, np.uint8)
        dist.all_gather_into_tensor(g, np.array([rank, i], np.uint8))
        np.testing.assert_array_equal(g, np.array([[q, i] for q in range(world)]).ravel())
        dist.barrier()
        if work is not None:
            work.wait()
            np.testing.assert_array_equal(big, np.full(1 << 16, total, np.float32))


def torch_profiler_events(dist, backend):
    """Under torch's profiler every operation is one event "<backend>:<op>", asynchronous (it
    ends where the work completes), with the input shapes torch's backends record (complex
    tensors as real views); outside it, none."""
    import torch

    rank, world = dist.get_rank(), dist.get_world_size()
    name = dist.get_backend()
    t = torch.ones(3, 4)
    c = torch.ones(5, dtype=torch.complex64)
    calls = {
        "all_reduce": [lambda: dist.all_reduce(t), lambda: dist.all_reduce(c)],
        "broadcast": [lambda: dist.broadcast(np.ones(6, np.float32), 0)],
        "all_gather_into_tensor": [
            lambda: dist.all_gather_into_tensor(torch.empty(world * 2), torch.ones(2))
        ],
        "barrier": [lambda: dist.barrier()],
    }
    shapes = {"all_reduce": [[[3, 4]], [[5, 2]]], "broadcast": [[[6]]]}
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        for op_calls in calls.values():
            for call in op_calls:
                call()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        if world > 1:
            peer = (rank + 1) % world
            sent = dist.isend(torch.full((7,), float(rank)), peer)
            got = torch.empty(7)
            dist.recv(got, (rank - 1) % world)
            sent.wait()
            assert got[0] == (rank - 1) % world
        with dist.record_comm("layer1:all_gather"):  # torch 2.13's custom event names
            dist.all_gather_single(torch.empty(world * 2), torch.ones(2))
    dist.all_reduce(t)  # not profiled
    named = [e for e in prof.function_events if e.name == "layer1:all_gather"]
    assert len(named) == 1 and named[0].input_shapes == [[2]], named
    events = [e for e in prof.function_events if e.name.startswith(name + ":")]
    for op, op_calls in calls.items():
        mine = [e for e in events if e.name == f"{name}:{op}"]
        expected = len(op_calls) + (1 if op == "all_reduce" else 0)
        assert len(mine) == expected, (op, [e.name for e in events])
        for e in mine:
            assert e.is_async and e.count == 1 and e.cpu_time >= 0, (op, e)
        if op in shapes:
            assert [e.input_shapes for e in mine[: len(shapes[op])]] == shapes[op], mine
    if world > 1:
        for op in ["send", "recv"]:
            mine = [e for e in events if e.name == f"{name}:{op}"]
            assert len(mine) == 1 and mine[0].input_shapes == [[7]], (op, mine)
    print("PROFILER_OK")
