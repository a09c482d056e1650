"""Collective test cases; each runs on every rank of a real multi-process job.

Every rank builds every rank's input from (rank, seed), so each can compute the expected
result with numpy and check its own output."""

import copyreg
import os
import pickle
import sys
import threading
import time
import warnings
from datetime import timedelta

import numpy as np

SIZES = [0, 1, 7, 1000]
R = None  # set per case: ReduceOp


def _inputs(dtype, n, world, salt=0):
    """Rank r's input: small values so PRODUCT and sums stay exact."""
    out = []
    for r in range(world):
        if dtype == np.bool_:
            a = ((np.arange(n) + r + salt) % 3 == 0)
        elif np.issubdtype(dtype, np.complexfloating):
            a = (np.arange(n) % 5 + r + 1) + 1j * (np.arange(n) % 3 - r)
        else:
            a = (np.arange(n) * (r + 1) + salt) % 4 + 1
        out.append(np.ascontiguousarray(a.astype(dtype)))
    return out


def _expected(op, dist, xs, dtype):
    stack = np.stack(xs) if xs[0].size else np.zeros((len(xs), 0), dtype=dtype)
    O = dist.ReduceOp
    if op == O.SUM:
        return np.any(stack, 0) if dtype == np.bool_ else stack.sum(0).astype(dtype)
    if op == O.AVG:
        wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
        return (stack.astype(wide).mean(0)).astype(dtype)
    if op == O.PRODUCT:
        return np.all(stack, 0) if dtype == np.bool_ else stack.prod(0).astype(dtype)
    if op == O.MIN:
        return stack.min(0)
    if op == O.MAX:
        return stack.max(0)
    if op == O.BAND:
        return np.bitwise_and.reduce(stack, 0)
    if op == O.BOR:
        return np.bitwise_or.reduce(stack, 0)
    if op == O.BXOR:
        return np.bitwise_xor.reduce(stack, 0)
    raise AssertionError(op)


def _valid_ops(dist, dtype):
    O = dist.ReduceOp
    if dtype == np.bool_:
        return [O.SUM, O.PRODUCT, O.MIN, O.MAX, O.BAND, O.BOR, O.BXOR]
    if np.issubdtype(dtype, np.complexfloating):
        return [O.SUM, O.AVG]
    ops = [O.SUM, O.PRODUCT, O.MIN, O.MAX]
    if np.issubdtype(dtype, np.integer):
        ops += [O.BAND, O.BOR, O.BXOR]
    else:
        ops += [O.AVG]
    return ops


def _close(actual, expected, dtype, what):
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        tol = 1e-2 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8, np.bool_,
          np.complex64]


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
    _raises(ValueError, lambda: dist.all_reduce(np.ones(4, np.float32), op=dist.ReduceOp.BAND),
            "BAND on float")
    # In torch's words.
    complex_max = "all_reduce does not support MAX on complex tensors"
    _raises(ValueError, lambda: dist.all_reduce(c, op=dist.ReduceOp.MAX), "complex", complex_max)
    _raises(ValueError, lambda: dist.all_reduce_coalesced([np.ones(2, np.float32), c],
                                                          op=dist.ReduceOp.MAX),
            "complex in a list", complex_max)
    _raises(ValueError, lambda: dist.all_reduce(np.ones(4), op=dist.ReduceOp.BOR), "BOR",
            "Cannot use ReduceOp.BOR with non-integral dtype")
    # PREMUL_SUM needs its factor, and a floating dtype (as torch's NCCL); a bare one used to
    # sum unscaled.
    _raises(ValueError, lambda: dist.all_reduce(np.ones(4), op=dist.ReduceOp.PREMUL_SUM),
            "PREMUL_SUM without a factor", "needs its factor")
    _raises(ValueError, lambda: dist.all_reduce(np.ones(4, np.int32),
                                                op=dist._make_nccl_premul_sum(2.0)),
            "PREMUL_SUM on int32", "PREMUL_SUM is not supported for int32")
    # A bad element of a list is named by its index, in one sentence.
    _raises(TypeError, lambda: dist.all_reduce([1.0, 2.0]), "a list as the tensor",
            "Invalid function argument. allreduce[0]: expected a tensor")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.all_reduce_coalesced([np.ones(2)])
    assert any(issubclass(w.category, FutureWarning) and issubclass(w.category, UserWarning)
               and "all_reduce_coalesced is deprecated" in str(w.message) for w in seen), seen
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


def _raises(exc, fn, what, words=None):
    """fn() raises exc (with `words` in its message, when given)."""
    try:
        fn()
    except exc as e:
        assert words is None or words in str(e), f"{what}: {words!r} not in {e}"
        return
    except Exception as e:
        raise AssertionError(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"{what}: expected {exc.__name__}, nothing raised")


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
                    _close(t, _expected(dist.ReduceOp.SUM, dist, xs, dtype), dtype,
                           f"reduce {dtype} n={n} root={root}")
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
        _raises(ValueError, lambda: dist.all_gather(bad, np.zeros(rank + 2, np.int32)),
                "an uneven all_gather whose own output does not fit the input")
        # Only rank 0's list is wrong (torch's gloo check): every rank raises, none waits.
        outs = [np.zeros(r + 1, np.int32) for r in range(world)]
        if rank == 0:
            outs[-1] = np.zeros(world + 5, np.int32)
        _raises(ValueError, lambda: dist.all_gather(outs, np.zeros(rank + 1, np.int32)),
                "an uneven all_gather with a wrong list on rank 0")
        dist.barrier()
    # Coalesced all_gather of two tensors of different shapes.
    a, b = np.full(2, rank, np.int64), np.full((2, 3), rank * 10, np.int64)
    outs = [[np.zeros(2, np.int64), np.zeros((2, 3), np.int64)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [a, b])
    for r in range(world):
        assert (outs[r][0] == r).all() and (outs[r][1] == r * 10).all()
    # Real and complex tensors in one list.
    outs = [[np.zeros(2, np.float32), np.zeros(1, np.complex64)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [np.full(2, rank, np.float32), np.full(1, 1j * rank,
                                                                          np.complex64)])
    assert all((outs[r][0] == r).all() and outs[r][1][0] == 1j * r for r in range(world)), outs
    # Argument rules.
    x = np.zeros(3)
    if world > 1:
        other = (rank + 1) % world
        _raises(ValueError, lambda: dist.gather(x, [np.zeros(3)] * world, dst=other),
                "gather_list on a non-destination rank")
        _raises(ValueError, lambda: dist.scatter(x, [np.zeros(3)] * world, src=other),
                "scatter_list on a non-source rank")
    _raises(ValueError, lambda: dist.gather(x, None, dst=rank), "no gather_list on dst")
    _raises(ValueError, lambda: dist.all_gather([np.zeros(3)] * (world + 1), x),
            "all_gather list too long")
    _raises(ValueError, lambda: dist.all_gather([np.zeros(3, np.int32)] * world, x),
            "all_gather dtype mismatch")
    _raises(ValueError, lambda: dist.all_gather_into_tensor(np.zeros(3 * world + 1), x),
            "all_gather_into_tensor size mismatch")
    _raises(TypeError, lambda: dist.all_gather(x, x), "all_gather output not a list")


def reduce_scatters(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in [np.float32, np.int64, np.float16, np.complex64]:
        for n in [0, 1, 5]:
            # Rank r's input list: world chunks of n.
            lists = [_inputs(dtype, n * world, world, salt=s) for s in range(1)][0]
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.AVG] if dtype == np.complex64 else \
                [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
            for op in ops:
                exp_full = _expected(op, dist, lists, dtype)
                out = np.zeros(n, dtype)
                chunks = [lists[rank][i * n:(i + 1) * n].copy() for i in range(world)]
                dist.reduce_scatter(out, chunks, op=op)
                _close(out, exp_full[rank * n:(rank + 1) * n], dtype, f"reduce_scatter {op}")
                out2 = np.zeros(n, dtype)
                dist.reduce_scatter_tensor(out2, lists[rank].copy(), op=op)
                _close(out2, exp_full[rank * n:(rank + 1) * n], dtype,
                       f"reduce_scatter_tensor {op}")
    _raises(ValueError, lambda: dist.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * world + 1)),
            "reduce_scatter_tensor size mismatch")


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
        _close(out2, np.repeat(np.arange(world), 3).reshape(world, 3).astype(dtype), dtype,
               "all_to_all_single 2-D")
        # List form with different sizes per peer.
        ins = [np.full(j + 1, 10 * rank + j, dtype) for j in range(world)]
        outs = [np.zeros(rank + 1, dtype) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for j in range(world):
            _close(outs[j], np.full(rank + 1, 10 * j + rank, dtype), dtype, "all_to_all list")
    _raises(ValueError, lambda: dist.all_to_all_single(np.zeros(world), np.zeros(world),
                                                       [1] * world, [2] * world),
            "splits that do not sum to the size")


def point_to_point(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        _raises(ValueError, lambda: dist.send(np.zeros(1), 0), "send to self")
        return
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # Ring with blocking calls: even ranks send first.
    out, got = np.full(5, rank, np.int32), np.zeros(5, np.int32)
    if rank % 2 == 0:
        dist.send(out, nxt)
        sender = dist.recv(got, prv)
    else:
        sender = dist.recv(got, prv)
        dist.send(out, nxt)
    assert sender == prv and (got == prv).all(), (sender, got)
    # isend/irecv.
    got = np.zeros(3, np.float64)
    works = [dist.irecv(got, prv), dist.isend(np.full(3, rank * 1.5), nxt)]
    for w in works:
        w.wait()
    assert (got == prv * 1.5).all()
    # A send's or receive's future would complete only through wait() (it used to hang):
    # get_future() raises until then, as torch's gloo does for them.
    got = np.zeros(2, np.float32)
    recv = dist.irecv(got, prv)
    if backend == "mpi":
        # MPI's engine completes receives by itself: the future is a real one.
        pending = recv.get_future()
        assert not pending.done()
    else:
        _raises(RuntimeError, recv.get_future, "get_future of an unfinished irecv")
    dist.barrier()  # nobody sends before every rank has tried
    send = dist.isend(np.full(2, rank, np.float32), nxt)
    recv.wait()
    send.wait()
    assert recv.get_future().then(lambda f: "ran").wait() == "ran"
    assert (got == prv).all(), got
    # batch_isend_irecv in the order that would deadlock with blocking calls.
    got = np.zeros(4, np.int64)
    ops = [dist.P2POp(dist.isend, np.full(4, rank, np.int64), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert (got == prv).all()
    # Tags keep messages apart.
    if rank == 0:
        dist.send(np.full(1, 7.0), 1, tag=7)
        dist.send(np.full(1, 3.0), 1, tag=3)
    elif rank == 1:
        a, b = np.zeros(1), np.zeros(1)
        w3 = dist.irecv(b, 0, tag=3)
        w7 = dist.irecv(a, 0, tag=7)
        w3.wait()
        w7.wait()
        assert a[0] == 7.0 and b[0] == 3.0, (a, b)
    # Receive from any source: rank 0 collects one message from each other rank.
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            buf = np.zeros(1, np.int64)
            sender = dist.recv(buf)
            assert buf[0] == sender * 11, (buf, sender)
            seen.add(sender)
        assert seen == set(range(1, world))
    else:
        dist.send(np.array([rank * 11], np.int64), 0)
    if world > 1:  # an any-source irecv names its sender once done, -1 before (as torch)
        dist.barrier()
        if rank == 0:
            buf = np.zeros(1, np.int64)
            work = dist.irecv(buf)
            early = work.source_rank()
            dist.barrier()  # the sender sends only now
            work.wait()
            assert early == -1 and work.source_rank() == world - 1 == buf[0], (early, buf)
        else:
            dist.barrier()
            if rank == world - 1:
                dist.send(np.array([rank], np.int64), 0)
    _raises(ValueError, lambda: dist.send(np.zeros(1), rank), "send to self")
    _raises(ValueError, lambda: dist.recv(np.zeros(1), world + 3), "recv from a bad rank")
    _raises(ValueError, lambda: dist.P2POp(print, np.zeros(1), 0), "P2POp with a bad op")
    dist.barrier()


def p2p_torch_conformance(dist, backend):
    """Point-to-point results torch's API defines: batch_isend_irecv's Works in list order,
    recv returning global ranks also for group_src, RuntimeError-compatible argument errors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = np.zeros(2, np.int64)
    ops = [dist.P2POp(dist.isend, np.full(2, rank, np.int64), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    works = dist.batch_isend_irecv(ops)
    assert [w.op_type for w in works] == ["SEND", "RECV"], [w.op_type for w in works]
    # P2POp fills in the group and both forms of the peer's rank, as torch's does.
    assert ops[0].peer == nxt and ops[0].group_peer == nxt and ops[1].peer == prv
    assert ops[0].group is dist.distributed_c10d._get_default_group()
    for w in works:
        w.wait()
    assert (got == prv).all()
    # An empty list raises where torch does (IndexError), with a message.
    _raises(IndexError, lambda: dist.batch_isend_irecv([]), "empty batch_isend_irecv")
    _raises(ValueError, lambda: dist.batch_isend_irecv([]), "empty batch_isend_irecv")
    # Group [1, 2]: group rank 0 is global rank 1.
    g = dist.new_group([1, 2])
    buf = np.zeros(1, np.int64)
    if rank == 1:
        dist.send(np.array([5], np.int64), group=g, group_dst=1)
        dist.send(np.array([6], np.int64), group=g, group_dst=1)
        dist.send(np.array([7], np.int64), group=g, group_dst=1)
        op = dist.P2POp(dist.isend, buf, group=g, group_peer=1)
        assert (op.peer, op.group_peer, op.group) == (2, 1, g), (op.peer, op.group_peer)
    elif rank == 2:
        assert dist.recv(buf, group=g, group_src=0) == 1 and buf[0] == 5
        assert dist.recv(buf, src=1, group=g) == 1 and buf[0] == 6
        assert dist.recv(buf, group=g) == 1 and buf[0] == 7
    for bad in (lambda: dist.send(np.zeros(1), rank), lambda: dist.recv(np.zeros(1), world)):
        _raises(RuntimeError, bad, "bad peer")
    dist.barrier()


def barriers_and_async(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    dist.monitored_barrier(timeout=timedelta(seconds=20))
    dist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True)
    works = []
    tensors = [np.full(100, rank + i, np.float32) for i in range(5)]
    for t in tensors:
        works.append(dist.all_reduce(t, async_op=True))
    for i, w in enumerate(works):
        assert w.wait()
        assert w.is_completed() and w.is_success()
        exp = sum(r + i for r in range(world))
        assert (tensors[i] == exp).all()
    w = dist.barrier(async_op=True)
    w.wait()
    t = np.ones(4)
    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.wait()
    assert (t == world).all()
    # all_reduce_coalesced over tensors of several shapes.
    a, b = np.full(3, rank, np.float64), np.full((2, 2), 2 * rank, np.float64)
    dist.all_reduce_coalesced([a, b])
    s = world * (world - 1) / 2
    assert (a == s).all() and (b == 2 * s).all()
    # Asynchronously the coalesced calls return the future of their tensors, as torch's do.
    fut = dist.all_reduce_coalesced([a, b], async_op=True)
    values = fut.wait()
    assert values[0] is a and values[1] is b and (a == s * world).all(), values
    outs = [[np.zeros(1)] for _ in range(world)]
    values = dist.all_gather_coalesced(outs, [np.full(1, rank, np.float64)], async_op=True).wait()
    assert [o[0][0] for o in outs] == list(range(world)), (outs, values)
    assert all(v[0] is o[0] for v, o in zip(values, outs)), values  # the output lists, as torch
    # _coalescing_manager: leaving the block waits for its collectives, or with async_ops
    # the manager holds one Work for all of them.
    c, d = np.full(2, rank, np.float32), np.full(5, 1.0, np.float32)
    with dist._coalescing_manager():
        dist.all_reduce(c)
        dist.all_reduce(d, async_op=True)
    assert (c == s).all() and (d == world).all(), (c, d)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        dist.all_reduce(d)
    assert isinstance(cm, dist._CoalescingManager) and len(cm.works) == 1, cm.works
    cm.wait()
    assert (c == s).all() and (d == world * world).all(), (c, d)
    try:
        with dist._coalescing_manager():
            raise KeyError("inside the block")
    except KeyError:
        pass
    with dist._coalescing_manager():  # the failed block closed its window
        dist.all_reduce(c)
    assert (c == s * world).all(), c
    # broadcast and reduce need a root, as in torch.
    _raises(ValueError, lambda: dist.broadcast(np.zeros(1)), "broadcast without src")
    _raises(ValueError, lambda: dist.reduce(np.zeros(1)), "reduce without dst")
    # breakpoint(rank) stops that rank in the debugger (stubbed here: it sleeps) while the
    # others wait; `skip` lets the first calls from a line pass.
    import c10d.distributed_c10d as c10d_module
    stops = []

    class Debugger:
        def message(self, text):
            assert "breakpoint" in text, text

        def set_trace(self, frame):
            stops.append(frame.f_code.co_name)
            time.sleep(0.3)

    c10d_module._rank_pdb = Debugger
    target = world - 1
    for _ in range(3):
        start = time.monotonic()
        dist.breakpoint(rank=target, skip=1)
        waited = time.monotonic() - start
    assert stops == (["barriers_and_async"] * 2 if rank == target else []), stops
    assert waited >= 0.25, waited  # every rank waited for the stopped one


class _Locked:
    """An object pickle refuses (it holds a lock) unless a Pickler's dispatch_table knows it."""

    def __init__(self, value):
        self.value = value
        self.lock = threading.Lock()

    @staticmethod
    def reduce(obj):
        return _Locked, (obj.value,)


def objects(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "data": list(range(rank))})
    assert objs == [{"rank": r, "data": list(range(r))} for r in range(world)]
    out = [None] * world if rank == 0 else None
    dist.gather_object(("g", rank), out, dst=0)
    if rank == 0:
        assert out == [("g", r) for r in range(world)]
    # A longer list keeps its extra entries; an empty one on other ranks is no list (torch).
    out = [None] * (world + 1) if rank == 0 else []
    dist.gather_object(rank, out, dst=0)
    if rank == 0:
        assert out == list(range(world)) + [None], out
    lst = [f"from{rank}", rank, None] if rank == world - 1 else [None, None, None]
    dist.broadcast_object_list(lst, src=world - 1)
    assert lst == [f"from{world - 1}", world - 1, None]
    recv_obj = [None]
    dist.scatter_object_list(recv_obj, [{"to": r} for r in range(world)] if rank == 0 else None,
                             src=0)
    assert recv_obj == [{"to": rank}]
    # The pickler the object collectives use is a module attribute, as in torch: one with a
    # dispatch_table sends objects plain pickle refuses (a lock inside).
    dc = dist.distributed_c10d

    class Pickler(pickle.Pickler):
        dispatch_table = {**copyreg.dispatch_table, _Locked: _Locked.reduce}

    default_pickler, dc._pickler = dc._pickler, Pickler
    try:
        objs = [None] * world
        dist.all_gather_object(objs, _Locked(rank))
        assert [o.value for o in objs] == list(range(world)), objs
    finally:
        dc._pickler = default_pickler
    if world > 1:
        if rank == 0:
            dist.send_object_list(["hello", 42], dst=1)
        elif rank == 1:
            got = [None, None]
            sender = dist.recv_object_list(got, src=0)
            assert got == ["hello", 42] and sender == 0


def subgroups(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    members = [r for r in range(world) if r % 2 == 0]
    g = dist.new_group(members[::-1])  # order does not matter: ranks are sorted
    # The worker's default group has a short timeout; a new group without one gets torch's
    # default (default_pg_timeout), with one that timeout.
    timed = dist.new_group(members, timeout=timedelta(seconds=7))
    if rank in members:
        assert g._timeout == dist.default_pg_timeout != dist.group.WORLD._timeout, g._timeout
        assert timed._timeout == timedelta(seconds=7), timed._timeout
        assert g is not dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_process_group_ranks(g) == members
        assert dist.get_rank(g) == members.index(rank)
        assert dist.get_world_size(g) == len(members)
        assert dist.get_global_rank(g, 0) == 0
        assert dist.get_group_rank(g, rank) == members.index(rank)
        t = np.full(2, rank, np.int64)
        dist.all_reduce(t, group=g)
        assert (t == sum(members)).all()
        t = np.full(2, rank, np.int64)
        dist.broadcast(t, src=members[-1], group=g)
        assert (t == members[-1]).all()
        t = np.full(2, rank, np.int64)
        dist.broadcast(t, group_src=0, group=g)
        assert (t == members[0]).all()
        out = [np.zeros(1, np.int64) for _ in members]
        dist.all_gather(out, np.array([rank]), group=g)
        assert [int(o[0]) for o in out] == members
        if len(members) > 1 and rank in members[:2]:
            peer = members[1] if rank == members[0] else members[0]
            buf = np.zeros(1, np.int64)
            if rank == members[0]:
                dist.send(np.array([rank]), peer, group=g)
            else:
                assert dist.recv(buf, peer, group=g) == peer
                assert buf[0] == peer
                buf[:] = 0
                # recv with group_src returns the group rank
        dist.barrier(group=g)
    else:
        assert g is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(g) == -1 and dist.get_world_size(g) == -1
        t = np.ones(2)
        assert dist.all_reduce(t, group=g) is None  # a no-op on non-members
        assert (t == 1).all()
        # batch_isend_irecv gives them no Works, as torch does (not [None]).
        assert dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 0, group=g)]) == []
    # new_subgroups: pairs of consecutive ranks.
    if world % 2 == 0:
        cur, subs = dist.new_subgroups(group_size=2)
        assert len(subs) == world // 2
        assert dist.get_process_group_ranks(cur) == [rank - rank % 2, rank - rank % 2 + 1]
        t = np.array([rank], np.int64)
        dist.all_reduce(t, group=cur)
        assert t[0] == 2 * (rank - rank % 2) + 1
    cur, subs = dist.new_subgroups_by_enumeration([[r] for r in range(world)])
    assert dist.get_world_size(cur) == 1
    assert dist.get_pg_count() >= 2
    # With use_local_synchronization only the members call new_group: the odd ranks here.
    odd = [r for r in range(1, world, 2)]
    if rank in odd:
        g = dist.new_group(odd, use_local_synchronization=True)
        t = np.array([rank], np.int64)
        dist.all_reduce(t, group=g)
        assert t[0] == sum(odd)
    # split_group: the parent's ranks in halves (the second may be empty), rank 0 left out.
    rest = list(range(1, world))
    halves = [h for h in (rest[:len(rest) // 2], rest[len(rest) // 2:]) if h]
    if halves:
        g = dist.split_group(split_ranks=halves)
        if rank == 0:
            assert g is None
        else:
            mine = next(h for h in halves if rank in h)
            assert dist.get_process_group_ranks(g) == mine
            t = np.array([rank], np.int64)
            dist.all_reduce(t, group=g)
            assert t[0] == sum(mine)
    # The default group maps ranks to themselves, unchecked.
    assert dist.get_group_rank(dist.group.WORLD, world + 3) == world + 3
    assert dist.get_global_rank(dist.group.WORLD, world + 3) == world + 3
    # The world still works.
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == world


def reinit_on_one_store(dist, backend):
    """init/new_group/all_reduce/destroy again and again over one FileStore: each incarnation
    must not meet the keys of the one before (they once made rendezvous connect to closed
    ports or barriers pass early)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(os.environ["C10D_TEST_STORE_FILE"], world)
    for i in range(4):
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        g = dist.new_group(list(range(world)))
        t = np.array([rank + i], np.int64)
        dist.all_reduce(t, group=g)
        assert t[0] == sum(range(world)) + world * i, (i, t)
        dist.destroy_process_group()


def state_queries(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.is_initialized()
    assert dist.get_backend() == backend
    assert backend in dist.get_backend_config()
    assert dist.group.WORLD is dist.GroupMember.WORLD
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(world))
    try:
        dist.init_process_group(backend)
    except ValueError as e:
        assert "twice" in str(e)
    else:
        raise AssertionError("a second init_process_group did not raise")
    # torch's words for bad arguments.
    _raises(ValueError, lambda: dist.new_group([world]), "rank outside",
            "The new group's rank should be within the the world_size")
    _raises(TypeError, lambda: dist.barrier(device_ids=0), "device_ids",
            "device_ids type should be List[int]")
    _raises(TypeError, lambda: dist.all_reduce("x"), "a str", "Invalid function argument")
    _raises(ValueError, lambda: dist.gather_object(1, None, dst=rank), "no gather list",
            "Argument ``gather_list`` must be specified on destination rank")
    # The private helpers torch-based tools call.
    dc = dist.distributed_c10d
    sub = dist.new_group(list(range(world))[::-1])  # sorted, as in torch
    assert dc._get_group_size(None) == world and dc._get_group_size(sub) == world
    config = dc._get_pg_config(sub)
    assert config["ranks"] == list(range(world)) and config["pg_size"] == world
    assert backend in config["backend_config"] and config["pg_desc"] == "undefined"
    assert dc._get_pg_config()["pg_desc"] == "default_pg"
    assert dc._get_process_group_name(sub) in [c["pg_name"] for c in dc._get_all_pg_configs()]
    assert dc._get_group_size_by_name(dc._get_process_group_name(sub)) == world
    assert dc._canonicalize_group_rank(sub, global_rank=rank) == rank
    assert dc._canonicalize_group_rank(sub, group_rank=world - 1, return_global=True) == world - 1
    _raises(ValueError, lambda: dc._canonicalize_group_rank(sub), "no rank given")
    _raises(ValueError, lambda: dc._check_not_self_rank(sub, sub.rank(), "source"), "self")
    assert dc._get_object_coll_device(sub) == "cpu" and dc._device_capability() == ["cpu"]
    _raises(TypeError, lambda: dc._check_valid_timeout(30), "timeout of int")
    store = dc._get_default_store()
    dc._store_based_barrier(rank, store, "case", world, timedelta(seconds=30))
    try:
        dc._store_based_barrier(rank, store, "short", world + 1, timedelta(milliseconds=200))
    except dist.DistStoreError as e:
        assert f"key: store_based_barrier_key:short (world_size={world + 1}" in str(e), e
    else:
        raise AssertionError("a store based barrier one rank short did not time out")
    dist.barrier()  # rank 0's store serves the others until they timed out too


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
    _raises(ValueError, lambda: dist.send(tt, (rank + 1) % world) if world > 1 else
            dist.send(tt, 1), "non-contiguous torch send")
    # Every synchronous form takes torch tensors (the inline path where there is one).
    x = torch.full((world, 3), float(rank), dtype=torch.float64)
    y = torch.zeros(world, 3, dtype=torch.float64)
    dist.all_to_all_single(y, x)
    assert torch.equal(y, torch.arange(world, dtype=torch.float64).repeat_interleave(3)
                       .reshape(world, 3)), y
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
    sp = torch.sparse_coo_tensor(torch.tensor([[0, rank % 3, 2], [1, 0, rank % 3]]),
                                 torch.tensor([1.0, 2.0 + rank, 3.0]), (3, 3))
    want = sum(torch.sparse_coo_tensor(torch.tensor([[0, r % 3, 2], [1, 0, r % 3]]),
                                       torch.tensor([1.0, 2.0 + r, 3.0]), (3, 3)).to_dense()
               for r in range(world))
    w = dist.all_reduce(sp, async_op=True)
    w.wait()
    assert sp.is_sparse and sp.is_coalesced() and torch.equal(sp.to_dense(), want), sp
    assert w.result()[0] is sp
    hybrid = torch.sparse_coo_tensor(torch.tensor([[rank % 2]]), torch.ones(1, 3) * (rank + 1),
                                     (2, 3))
    dist.all_reduce(hybrid)
    dense = hybrid.to_dense()
    assert dense.sum() == 3 * world * (world + 1) / 2 and hybrid.dense_dim() == 1, dense
    _raises(ValueError, lambda: dist.all_reduce(sp, op=dist.ReduceOp.MAX), "sparse MAX",
            "only ReduceOp.SUM")
    _raises(TypeError, lambda: dist.broadcast(sp, src=0), "sparse broadcast",
            "layout torch.sparse_coo are not supported")


def recv_timeout(dist, backend):
    """Rank 1 receives from rank 0, which never sends: the recv fails within its timeout, and
    so does the next one (gloo: at once, its pair to rank 0 closed; it used to wait out the
    timeout again and then fail with "this future was already completed")."""
    rank = dist.get_rank()
    if rank == 1:
        messages = []
        for attempt in range(2):
            start = time.monotonic()
            try:
                dist.recv(np.zeros(1), 0)
            except RuntimeError as e:
                elapsed = time.monotonic() - start
                assert elapsed < 20, (attempt, elapsed)
                assert "already completed" not in str(e), e
                messages.append(f"{elapsed:.1f}s: {e}")
                continue
            raise AssertionError("recv without a sender returned")
        print("RECV_TIMEOUT_OK", *messages)
        return
    time.sleep(10)


def p2p_size_mismatch(dist, backend):
    """Rank 0 sends 16 bytes, rank 1 receives 8: both raise (shm names the sizes, gloo times
    out) instead of gloo's network thread terminating the process."""
    rank = dist.get_rank()
    start = time.monotonic()
    try:
        if rank == 0:
            dist.send(np.arange(2, dtype=np.int64), 1)
        else:
            dist.recv(np.zeros(2, np.float32), 0)
    except RuntimeError as e:
        assert time.monotonic() - start < 20, time.monotonic() - start
        print("MISMATCH_OK", e)
        return
    # The shm sender may finish before the receiver sees the size: only the receiver must fail.
    assert rank == 0 and backend in ("shm", "mpi"), "the mismatched send/recv completed"
    print("MISMATCH_OK sent")


def destroy_with_pending(dist, backend):
    """destroy_process_group() lets operations already submitted finish, as torch's does: the
    peers that called them too get their results."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = np.full(4, rank + 1.0)
    if rank == world - 1:
        time.sleep(0.3)  # the others destroy while their all_reduce still waits for this rank
    work = dist.all_reduce(t, async_op=True)
    dist.destroy_process_group()
    assert work.wait() and (t == world * (world + 1) / 2).all(), t


def barrier_timeout_words(dist, backend):
    """The last rank skips a barrier: the others time out with torch's words around them (its
    tests match " (Timed out|closed|timeout) ")."""
    import re
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(5)
        return
    start = time.monotonic()
    try:
        dist.barrier()
    except RuntimeError as e:
        assert time.monotonic() - start < 4.5, e
        assert re.search(" (Timed out|closed|timeout) ", str(e)), e
        print("BARRIER_TIMEOUT_OK", e)
    else:
        raise AssertionError("a barrier without the last rank passed")


def detail_missing_rank(dist, backend):
    """At DETAIL, a rank that never calls a collective is named, as torch's wrapper does."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = np.ones(2)
    dist.all_reduce(t)
    if rank == world - 1:
        time.sleep(5)
        return
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        words = (f"Rank {world - 1} failed to pass monitoredBarrier" if rank == 0 else
                 f"Rank {rank} successfully reached monitoredBarrier")
        assert words in str(e), e
        print("DETAIL_MISSING_OK", e)
    else:
        raise AssertionError("an all_reduce without the last rank passed")


def monitored_barrier_reports(dist, backend):
    """The last rank skips the barrier; the others learn which rank is missing."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(6)
        return
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
    except RuntimeError as e:
        if rank == 0:
            assert f"Rank {world - 1} failed to pass monitoredBarrier in 2000 ms" in str(e), e
        else:  # torch's words on the other ranks
            assert f"Rank {rank} successfully reached monitoredBarrier, but received errors " \
                   f"while waiting for send/recv from rank 0" in str(e), e
        print(f"MONITORED_OK: {e}")
    else:
        raise AssertionError("monitored_barrier passed with a rank missing")
    if rank == 0 and world > 1:  # a zero timeout fails at once, as in torch
        start = time.monotonic()
        try:
            dist.monitored_barrier(timeout=timedelta(0))
        except RuntimeError as e:
            assert time.monotonic() - start < 2 and "failed to pass monitoredBarrier" in str(e), e
        else:
            raise AssertionError("monitored_barrier with a zero timeout passed")


def monitored_barrier_late_ranks(dist, backend):
    """As in torch, the timeout bounds rank 0's wait for the others only: a late rank 0 (within
    the group's timeout) lets everyone pass, while a rank that arrives after rank 0 gave up on
    it does not pass, and hears so at once."""
    rank = dist.get_rank()
    if rank == 0:
        time.sleep(2)
    start = time.monotonic()
    dist.monitored_barrier(timeout=timedelta(seconds=1))
    assert rank == 0 or time.monotonic() - start > 1.5, time.monotonic() - start
    if rank == 1:
        time.sleep(2.5)
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=1))
    except RuntimeError as e:
        took = time.monotonic() - start
        if rank == 0:
            assert "Rank 1 failed to pass monitoredBarrier in 1000 ms" in str(e), e
            assert 0.9 < took < 2, took
            time.sleep(3)  # stays until rank 1 has heard the verdict
        else:
            assert "Rank 1 successfully reached monitoredBarrier" in str(e), e
            assert took < 1, took
        print(f"MONITORED_LATE_OK: {e}")
    else:
        raise AssertionError(f"rank {rank}: monitored_barrier passed with rank 1 late")
    os._exit(0)  # the group cannot be torn down collectively any more


def monitored_barrier_exits(dist, backend):
    """Ranks 1 and 3 of 4 exit instead of entering the barrier, rank 3 a little later; with
    wait_all_ranks rank 0 names both, well before its timeout."""
    rank = dist.get_rank()
    dist.barrier()
    if rank in (1, 3):
        time.sleep(0.5 * (rank == 3))
        os._exit(0)
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True)
    except RuntimeError as e:
        if rank == 0:
            assert "Ranks 1, 3 failed to pass monitoredBarrier" in str(e), e
        else:
            assert f"Rank {rank} successfully reached monitoredBarrier" in str(e), e
        assert time.monotonic() - start < 10, (time.monotonic() - start, e)
        print(f"MONITORED_EXITS_OK: {e}")
    else:
        raise AssertionError("monitored_barrier passed with two ranks gone")
    os._exit(0)  # the group cannot be torn down collectively any more


def desync_detail(dist, backend):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL, mismatched collectives raise on every rank and
    name both calls; matching ones (barrier included) work."""
    rank = dist.get_rank()
    t = np.ones(4, np.float32)
    dist.all_reduce(t)
    dist.barrier()
    assert (t == dist.get_world_size()).all()
    try:
        if rank == 0:
            dist.broadcast(np.zeros(4, np.float32), src=0)
        else:
            dist.all_reduce(np.zeros(4, np.float32))
    except RuntimeError as e:
        msg = str(e)
        assert "mismatch" in msg and "broadcast(float32[4]" in msg and \
            "all_reduce(float32[4]" in msg, msg
        print("DESYNC_OK:", msg)
        return
    raise AssertionError("mismatched collectives were not detected")


def dead_peer(dist, backend):
    """Rank 1 dies abruptly; rank 0's next collective fails quickly, naming rank 1."""
    import os

    rank = dist.get_rank()
    dist.barrier()
    if rank == 1:
        os._exit(17)
    start = time.monotonic()
    try:
        t = np.ones(1024)
        dist.all_reduce(t)
        dist.all_reduce(t)
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        assert elapsed < 15, elapsed
        print(f"DEAD_PEER_OK {elapsed:.2f}s: {e}")
        # Tearing down never hangs on the dead peer.
        dist.destroy_process_group()
        return
    raise AssertionError("collectives with a dead peer succeeded")


def trace_hang(dist, backend):
    """Rank 1 skips an all_reduce that rank 0 calls and waits in a receive on a second group
    instead. Rank 0 times out (C10D_TEST_PG_TIMEOUT) and both ranks write their flight-recorder
    dumps to C10D_TRACE_DUMP_DIR: rank 0 on the failure, rank 1 when asked through the store."""
    import os
    rank = dist.get_rank()
    side = dist.new_group([0, 1], timeout=timedelta(seconds=60))
    t = np.ones(4, np.float32)
    dist.all_reduce(t)
    dist.all_reduce(t)
    dump_dir = os.environ["C10D_TRACE_DUMP_DIR"]

    def wait_for_dump(r, seconds=20.0):
        path = os.path.join(dump_dir, f"c10d_trace_rank{r}.json")
        deadline = time.monotonic() + seconds
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"rank {r} wrote no dump in {seconds}s"
            time.sleep(0.05)

    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(t)  # rank 1 never joins
        except RuntimeError as e:
            print(f"TRACE_HANG_TIMEOUT after {time.monotonic() - start:.1f}s: {e}")
        else:
            raise AssertionError("an all_reduce without rank 1 returned")
        wait_for_dump(0, 1.0)  # written before the error reached us
        wait_for_dump(1)  # keep the store (hosted here) up until rank 1 has seen the request
    else:
        work = dist.irecv(np.zeros(1, np.float32), 0, group=side)  # rank 0 never sends
        wait_for_dump(1)
        assert not work.is_completed()


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
    np.testing.assert_array_equal(funcol.all_reduce(x, "max", list(range(world))),
                                  base(world - 1))
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
        a2a, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(world)]))
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
            s = funcol.all_reduce(np.full(1, 10 ** rank), "sum", mine)
        assert s[0] == 10 ** mine[0] + 10 ** mine[1], s
        assert any(issubclass(w.category, FutureWarning) for w in caught), caught
        odd = dist.new_group([r for r in range(world) if r % 2])
        if rank % 2:
            s = funcol.all_reduce(np.full(1, 10 ** rank), "sum", odd)
            assert s[0] == sum(10 ** r for r in range(1, world, 2)), s
        dist.barrier()  # rank 0 holds the store the odd ranks' group is built through
    _raises(AssertionError, lambda: funcol.reduce_scatter_tensor(np.ones(world + 1), "sum", 0,
                                                                 W) if world > 1 else
            funcol.reduce_scatter_tensor(np.ones(()), "sum", 0, W), "indivisible")
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


# --- data-parallel gradient reduction (c10d.Reducer) ---------------------------------------

def device_mesh(dist, backend):
    """init_device_mesh: a group along every dimension, coordinates, sub-meshes, and the
    functional collectives over a mesh or (mesh, dim)."""
    from c10d import _functional_collectives as funcol
    rank, world = dist.get_rank(), dist.get_world_size()
    line = dist.init_device_mesh("cpu", (world,))
    assert line.ndim == 1 and line.size() == world and line.get_local_rank() == rank
    assert dist.get_process_group_ranks(line.get_group()) == list(range(world))
    assert funcol.all_reduce(np.array([rank], np.int64), "sum", line)[0] == sum(range(world))
    _raises(ValueError, lambda: dist.init_device_mesh("cpu", (world + 1,)), "too many ranks")
    _raises(ValueError, lambda: dist.init_device_mesh("cuda", (world,)), "a cuda mesh")
    if world % 2:
        return
    cols = world // 2
    mesh = dist.init_device_mesh("cpu", (2, cols), mesh_dim_names=("dp", "tp"))
    row, col = divmod(rank, cols)
    assert mesh.shape == (2, cols) and mesh.size() == world and mesh.size("tp") == cols
    assert mesh.get_coordinate() == [row, col], mesh.get_coordinate()
    assert mesh.get_local_rank("dp") == row and mesh.get_local_rank(1) == col
    tp, dp = mesh.get_group("tp"), mesh.get_group(0)
    assert dist.get_process_group_ranks(tp) == [row * cols + c for c in range(cols)]
    assert dist.get_process_group_ranks(dp) == [col, cols + col]
    x = np.array([rank], np.int64)
    dist.all_reduce(x, group=tp)
    assert x[0] == sum(row * cols + c for c in range(cols)), x
    assert funcol.all_reduce(np.array([rank], np.int64), "sum", (mesh, 0))[0] == 2 * col + cols
    sub = mesh["dp"]
    assert sub.mesh.tolist() == [col, cols + col] and sub.get_group() is dp
    assert sub.mesh_dim_names == ("dp",) and sub.get_local_rank() == row
    assert mesh["tp", "dp"].mesh.tolist() == mesh.mesh.T.tolist()
    _raises(ValueError, lambda: mesh.get_group(), "a 2-D mesh's group without a dimension")
    _raises(KeyError, lambda: mesh["pp"], "an unknown dimension name")
    assert repr(mesh) == f"DeviceMesh('cpu', {mesh.mesh.tolist()}, mesh_dim_names=('dp', 'tp'))"
    assert isinstance(mesh.mesh, np.ndarray) or "torch" in sys.modules, type(mesh.mesh)
    try:
        import torch
    except ImportError:
        return
    # With torch loaded, .mesh is a tensor, as torch's DeviceMesh has it.
    assert isinstance(mesh.mesh, torch.Tensor) and mesh.mesh.size(0) == 2, mesh.mesh


def _ddp_grads(rank, iteration):
    """Three float32 gradients and one float64, filled from (rank, iteration)."""
    shapes = [(3,), (2, 4), (5,), (6,)]
    dtypes = [np.float32, np.float32, np.float32, np.float64]
    return [np.arange(int(np.prod(s)), dtype=d).reshape(s) + 10 * rank + iteration
            for s, d in zip(shapes, dtypes)]


def _ddp_reducer(dist, grads, limits=(16, 32), **kwargs):
    buckets, sizes = dist._compute_bucket_assignment_by_size(grads, list(limits))
    # Gradients arrive last parameter first, so the last bucket is reduced first.
    return dist.Reducer(grads, list(reversed(buckets)), list(reversed(sizes)),
                        dist.group.WORLD, **kwargs)


def _ddp_expected(world, iteration):
    return [np.mean([g[i] for g in (_ddp_grads(r, iteration) for r in range(world))], axis=0)
            for i in range(4)]


def ddp_waits_run_queued_reductions(dist, backend):
    """Waiting on a queued asynchronous operation's future (as the reducer does for its
    buckets, and users through get_future()) runs it: shm's worker only polls its queue every
    millisecond while asynchronous operations are in use, and each such wait took >= 1 ms."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grad = np.zeros(256, np.float32)
    reducer = dist.Reducer([grad], [[0]], [1 << 20], dist.group.WORLD)
    passes = 200
    start = time.perf_counter()
    for i in range(passes):
        reducer.prepare_for_backward()
        grad[...] = rank + i
        reducer._autograd_hook(0)
        assert np.all(grad == (world - 1) / 2 + i), (i, grad[:4])
    reducer_s = time.perf_counter() - start
    x = np.ones(256, np.float32)
    start = time.perf_counter()
    for _ in range(passes):
        x[...] = 1
        dist.all_reduce(x, async_op=True).get_future().wait()
        assert np.all(x == world), x[:4]
    future_s = time.perf_counter() - start
    # A few us each without the stall; 1 ms or more each with it.
    assert reducer_s < 0.15 and future_s < 0.15, (reducer_s, future_s)


def ddp_reducer(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads)
    assert len(reducer.bucket_indices) >= 3, reducer.bucket_indices
    for iteration in range(3):
        reducer.prepare_for_backward()
        for g, fresh in zip(grads, _ddp_grads(rank, iteration)):
            g[...] = fresh
        for i in reversed(range(len(grads))):
            reducer._autograd_hook(i)
        reducer._check_reducer_finalized()  # the last hook finished the pass
        for g, want in zip(grads, _ddp_expected(world, iteration)):
            assert np.allclose(g, want), (iteration, g, want)
    assert reducer.num_iterations == 3
    assert all(ns >= 0 for ns in reducer.get_backward_stats())
    # Outside a pass gradients stay local (what DDP's no_sync relies on).
    before = grads[0].copy()
    reducer._autograd_hook(0)
    assert np.array_equal(grads[0], before)
    # A gradient passed explicitly is read from, and receives the average.
    reducer.prepare_for_backward()
    separate = [g.copy() for g in _ddp_grads(rank, 7)]
    for i in reversed(range(4)):
        reducer._autograd_hook(i, grad=separate[i])
    for g, want in zip(separate, _ddp_expected(world, 7)):
        assert np.allclose(g, want)
    # A pass in which nothing was marked (a forward without backward) is simply dropped.
    reducer.prepare_for_backward()
    reducer.prepare_for_backward()
    reducer._reset_state()
    _raises(ValueError, lambda: reducer._autograd_hook(9), "hook of a parameter index too large")
    _raises(ValueError, lambda: dist.Reducer(grads, [[0, 1, 2, 3]], [], None), "no group")
    _raises(ValueError, lambda: dist.Reducer(grads, [[0, 1], [2]], [], dist.group.WORLD),
            "parameter 3 in no bucket")
    _raises(ValueError, lambda: dist.Reducer(grads, [[0, 1, 2, 3]], [], dist.group.WORLD),
            "float32 and float64 in one bucket")


def ddp_unused_parameters(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads, find_unused_parameters=True)
    reducer.prepare_for_backward()
    for i in (3, 0):
        reducer._autograd_hook(i)
    if rank == 0:
        reducer._autograd_hook(1)  # parameter 1 only on rank 0; parameter 2 on no rank
    untouched = grads[2].copy()
    reducer.finalize_backward()
    want = _ddp_expected(world, 0)
    assert np.allclose(grads[0], want[0]) and np.allclose(grads[3], want[3])
    assert np.allclose(grads[1], _ddp_grads(0, 0)[1] / world), grads[1]
    assert np.array_equal(grads[2], untouched)
    assert reducer._get_local_used_map().tolist() == [1, int(rank == 0), 0, 1]
    assert reducer._get_global_used_map().tolist() == [1, 1, 0, 1]

    # Without find_unused_parameters an unready parameter fails the next pass, named.
    strict = _ddp_reducer(dist, _ddp_grads(rank, 0), limits=(1 << 20,))
    strict.prepare_for_backward()
    strict._autograd_hook(0)
    try:
        strict.prepare_for_backward()
        raise AssertionError("a pass started over an unfinished one")
    except dist.DistError as e:
        assert "parameters 1, 2, 3" in str(e) and "find_unused_parameters" in str(e), e
    strict._reset_state()
    strict.prepare_for_backward()
    for i in range(4):
        strict._autograd_hook(i)
    _raises(dist.DistError, lambda: (strict.prepare_for_backward(), strict._autograd_hook(0),
                                     strict._autograd_hook(0)), "a gradient marked twice")


def ddp_comm_hooks(dist, backend):
    from c10d.algorithms.ddp_comm_hooks import default_hooks

    rank, world = dist.get_rank(), dist.get_world_size()
    seen = []

    def recording_hook(state, bucket):
        seen.append((bucket.index(), bucket.is_last(), [g.shape for g in bucket.gradients()],
                     len(bucket.parameters())))
        return default_hooks.allreduce_hook(state, bucket)

    def doubling_hook(state, bucket):
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] * 2 / world)  # a new array as the result

    for name, register in [
            ("python allreduce", lambda r: dist._register_comm_hook(r, None, recording_hook)),
            ("python fp16", lambda r: dist._register_comm_hook(r, None,
                                                              default_hooks.fp16_compress_hook)),
            ("builtin fp16", lambda r: dist._register_builtin_comm_hook(
                r, dist.BuiltinCommHookType.FP16_COMPRESS)),
            ("builtin allreduce", lambda r: dist._register_builtin_comm_hook(
                r, dist.BuiltinCommHookType.ALLREDUCE)),
            ("then value", lambda r: dist._register_comm_hook(r, None, doubling_hook))]:
        grads = _ddp_grads(rank, 0)
        reducer = _ddp_reducer(dist, grads)
        register(reducer)
        _raises(dist.DistError, lambda: register(reducer), f"{name}: a second hook")
        reducer.prepare_for_backward()
        for i in reversed(range(4)):
            reducer._autograd_hook(i)
        scale = 2 if name == "then value" else 1
        tol = 1e-2 if "fp16" in name else 1e-6
        for g, want in zip(grads, _ddp_expected(world, 0)):
            assert np.allclose(g, want * scale, rtol=tol, atol=tol), (name, g, want)
    n = len(_ddp_reducer(dist, _ddp_grads(rank, 0)).bucket_indices)
    assert [s[0] for s in seen] == list(range(n)), seen
    assert [s[1] for s in seen] == [False] * (n - 1) + [True], seen
    assert seen[0][2] == [(6,)] and seen[0][3] == 1, seen

    # A hook that fails ends the pass on every rank (all fail alike here); the next works.
    calls = []

    def failing_once(state, bucket):
        calls.append(bucket.index())
        if len(calls) == 1:
            raise KeyError("hook failure")
        return default_hooks.allreduce_hook(state, bucket)

    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads)
    dist._register_comm_hook(reducer, None, failing_once)
    reducer.prepare_for_backward()
    _raises(KeyError, lambda: [reducer._autograd_hook(i) for i in reversed(range(4))],
            "a failing comm hook")
    reducer._check_reducer_finalized()
    reducer.prepare_for_backward()
    for i in reversed(range(4)):
        reducer._autograd_hook(i)
    for g, want in zip(grads, _ddp_expected(world, 0)):
        assert np.allclose(g, want)

    # The default hooks run on demand, on buckets of zeros.
    reducer = _ddp_reducer(dist, _ddp_grads(rank, 0))
    buckets = reducer._get_zeros_like_grad_buckets()
    assert len(buckets) == n and not buckets[0].buffer().any()
    fut = reducer._run_allreduce_hook(buckets[0])
    assert np.array_equal(fut.wait()[0], np.zeros(6))


def ddp_startup(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    state = [np.full(5, rank, np.float32), np.full((2, 3), rank, np.float64),
             np.arange(300, dtype=np.float32) + rank]
    dist._broadcast_coalesced(dist.group.WORLD, state, 64, world - 1)
    assert (state[0] == world - 1).all() and (state[1] == world - 1).all()
    assert np.array_equal(state[2], np.arange(300) + world - 1)
    dist._verify_params_across_processes(dist.group.WORLD, state)
    if world == 1:
        return
    odd = state[:2] + ([np.zeros((30, 10), np.float32)] if rank == 1 else state[2:])
    try:
        dist._verify_params_across_processes(dist.group.WORLD, odd)
        raise AssertionError("a different shape passed the check")
    except dist.DistError as e:  # on every rank, so that none goes on alone
        if rank == 1:
            assert "parameter 2" in str(e) and "[30, 10]" in str(e), e
        else:
            assert "rank 1's parameters differ" in str(e), e
    fewer = state[:2] if rank == 0 else state
    _raises(dist.DistError, lambda: dist._verify_params_across_processes(dist.group.WORLD, fewer),
            "different parameter counts")


def _torch_or_skip():
    """torch, or None after printing the harness's SKIP line when it is not installed."""
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return None
    return torch


def ddp_torch_params(dist, backend):
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2, 3))]
    reducer = dist.Reducer(params, [[1, 0]], [], dist.group.WORLD)
    reducer.prepare_for_backward()
    _raises(ValueError, lambda: reducer._autograd_hook(0), "a parameter without .grad")
    loss = (params[0].sum() + params[1].sum()) * (rank + 1)
    loss.backward()
    for i in (1, 0):
        reducer._autograd_hook(i)
    want = sum(r + 1 for r in range(world)) / world
    for p in params:
        assert torch.allclose(p.grad, torch.full_like(p, want)), p.grad


def ddp_unused_without_detection(dist, backend):
    """An unused parameter without find_unused_parameters: as in torch, backward() returns and
    the next forward raises that the reduction of the prior iteration never finished."""
    import torch

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(4, 1)
            self.unused = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    model = dist.DistributedDataParallel(TwoHeads())
    model(torch.ones(2, 4)).sum().backward()  # no error here
    try:
        model(torch.ones(2, 4))
    except RuntimeError as e:
        assert "Expected to have finished reduction in the prior iteration" in str(e), e
    else:
        raise AssertionError("the forward after an incomplete reduction did not raise")


def ddp_torch_module(dist, backend):
    """c10d.DistributedDataParallel on a torch model: rank 0's weights everywhere, gradients
    averaged (checked against every rank's gradient computed locally), unused parameters,
    no_sync."""
    torch = _torch_or_skip()
    if torch is None:
        return
    import copy
    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 3)
            self.b = torch.nn.Linear(3, 2)
            self.spare = torch.nn.Linear(3, 2)  # used on rank 0 only
            self.register_buffer("steps", torch.zeros(1))

        def forward(self, x, use_spare):
            h = torch.relu(self.a(x))
            return self.b(h).sum() + (self.spare(h).sum() if use_spare else 0)

    torch.manual_seed(rank)
    net = Net()
    net.steps += rank
    model = dist.DistributedDataParallel(net, find_unused_parameters=True)
    reference = copy.deepcopy(net)  # rank 0's weights, by now
    assert net.steps.item() == 0
    weights = [p.detach().clone() for p in net.parameters()]
    gathered = [None] * world
    dist.all_gather_object(gathered, [w.tolist() for w in weights])
    assert all(g == gathered[0] for g in gathered)

    def data(r):
        return torch.arange(8, dtype=torch.float32).reshape(2, 4) * (r + 1) / 8

    expected = [torch.zeros_like(p) for p in reference.parameters()]
    for r in range(world):
        reference.zero_grad()
        reference(data(r), r == 0).backward()
        for e, p in zip(expected, reference.parameters()):
            if p.grad is not None:
                e += p.grad / world
    model(data(rank), rank == 0).backward()
    for name, p, e in zip([n for n, _ in net.named_parameters()], net.parameters(), expected):
        # spare is used on rank 0 only: every rank gets the average as its gradient.
        assert torch.allclose(p.grad, e, atol=1e-6), (name, p.grad, e)
    # ... and the weights stay rank 0's (the average went to .grad, nowhere else).
    for p, w in zip(net.parameters(), weights):
        assert torch.equal(p.detach(), w)

    # gradient_as_bucket_view: .grad is the bucket's memory, averaged in place.
    torch.manual_seed(0)
    viewed = dist.DistributedDataParallel(torch.nn.Linear(3, 2), gradient_as_bucket_view=True)
    ptrs = [p.grad.data_ptr() for p in viewed.parameters()]
    viewed(torch.zeros(1, 3))  # a forward with grad enabled but no backward: dropped
    viewed(torch.full((1, 3), float(rank + 1))).sum().backward()
    assert [p.grad.data_ptr() for p in viewed.parameters()] == ptrs
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(viewed.module.weight.grad, torch.full((2, 3), mean))
    # The next forward regroups the buckets in the order the first backward produced the
    # gradients (once, as torch's DDP does): .grad follows the new buckets.
    assert not viewed.reducer._has_rebuilt_buckets()
    viewed.zero_grad(set_to_none=False)
    viewed(torch.full((1, 3), float(rank + 1))).sum().backward()
    assert viewed.reducer._has_rebuilt_buckets()
    assert torch.allclose(viewed.module.weight.grad, torch.full((2, 3), mean))
    views = [viewed.reducer._bucket_view(i) for i in range(2)]
    assert [p.grad.data_ptr() for p in viewed.parameters()] == [v.ctypes.data for v in views]
    assert viewed.reducer._rebuild_buckets() is False  # only once

    # Frozen parameters take rank 0's values too (torch syncs the whole module state).
    torch.manual_seed(rank)
    frozen = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    frozen[0].requires_grad_(False)
    tuned = dist.DistributedDataParallel(frozen)
    values = [None] * world
    dist.all_gather_object(values, frozen[0].weight.tolist())
    assert all(v == values[0] for v in values), values
    # torch.distributed's own hooks would fail inside backward(): refused up front.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
    _raises(ValueError, lambda: tuned.register_comm_hook(None, torch_hooks.allreduce_hook),
            "a torch.distributed comm hook")
    # A hook written as for torch's DDP: the bucket's tensors are torch tensors.
    hooked = dist.DistributedDataParallel(torch.nn.Linear(2, 1, bias=False))
    seen = []

    def torch_style_hook(state, bucket):
        buf = bucket.buffer()
        seen.append((type(buf), type(bucket.gradients()[0])))
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(world))

    hooked.register_comm_hook(None, torch_style_hook)
    hooked(torch.full((1, 2), float(rank + 1))).sum().backward()
    assert seen and seen[0] == (torch.Tensor, torch.Tensor), seen
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(hooked.module.weight.grad, torch.full((1, 2), mean)), \
        hooked.module.weight.grad

    # no_sync: gradients stay local and accumulate; the next synced pass averages the sum.
    strict = dist.DistributedDataParallel(torch.nn.Linear(2, 1, bias=False))
    w = strict.module.weight
    with strict.no_sync():
        strict(torch.full((1, 2), float(rank + 1))).sum().backward()
    assert torch.equal(w.grad, torch.full((1, 2), float(rank + 1)))
    strict(torch.full((1, 2), 1.0)).sum().backward()
    mean = sum(r + 2 for r in range(world)) / world
    assert torch.allclose(w.grad, torch.full((1, 2), mean)), w.grad

    # _update_process_group: the model trains over another group from then on.
    other = dist.new_group(list(range(world)))
    strict._update_process_group(other)
    assert strict.process_group is other
    strict.zero_grad()
    strict(torch.full((1, 2), float(rank + 1))).sum().backward()
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(w.grad, torch.full((1, 2), mean)), w.grad


def ddp_logging_and_ignored(dist, backend):
    """_set_params_and_buffers_to_ignore_for_model: those stay local (weights, gradients and
    buffers); _get_ddp_logging_data reports the construction and the buckets as torch's."""
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 1)
            self.register_buffer("synced", torch.full((1,), float(rank)))
            self.register_buffer("kept", torch.full((1,), float(rank)))

        def forward(self, x):
            return self.b(self.a(x)).sum()

    torch.manual_seed(rank)
    m = M()
    own_weight = m.a.weight.detach().clone()
    dist.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        m, ["a.weight", "kept"])
    model = dist.DistributedDataParallel(m, bucket_cap_mb=1)
    assert torch.equal(m.a.weight.detach(), own_weight)  # not rank 0's
    assert model.will_sync_module_buffers()
    for _ in range(3):
        model.zero_grad()
        model(torch.full((1, 3), float(rank + 1))).backward()
    assert m.synced.item() == 0 and m.kept.item() == rank, (m.synced, m.kept)
    # a.weight's gradient stays this rank's own (its input and b's weight, rank 0's).
    want = (m.b.weight.detach().reshape(3, 1) * torch.full((1, 3), float(rank + 1)))
    assert torch.allclose(m.a.weight.grad, want), (m.a.weight.grad, want)
    grads = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(grads, m.a.bias.grad.clone())
    assert all(torch.equal(g, grads[0]) for g in grads), grads  # reduced
    data = model._get_ddp_logging_data()
    assert data["module_name"] == "M" and data["world_size"] == world, data
    assert data["rank"] == rank and data["backend_name"] == backend, data
    assert data["bucket_cap_bytes"] == 1 << 20 and data["find_unused_parameters"] == 0, data
    assert data["num_parameter_tensors"] == 3, data  # a.bias, b.weight, b.bias
    assert data["total_parameter_size_bytes"] == 4 * 7, data
    assert data["bucket_sizes"] == "28" and data["dtypes"] == "float", data
    assert data["iteration"] == 2 and data["has_rebuilt_buckets"] == 1, data
    assert "static_graph" not in data and data["avg_forward_compute_time"] > 0, data
    static = dist.DistributedDataParallel(torch.nn.Linear(2, 1))
    static._set_static_graph()
    assert static._get_ddp_logging_data()["static_graph"] == 1
    # Without require_forward_param_sync the forward pass leaves the buffers alone.
    model.require_forward_param_sync = False
    assert not model.will_sync_module_buffers()
    m.synced.fill_(float(rank))
    model(torch.ones(1, 3)).backward()
    assert m.synced.item() == rank, m.synced


def ddp_sparse(dist, backend):
    """Parameters of modules with sparse=True get sparse gradients averaged over the group
    (torch's DDP on Gloo does that too): alone or beside dense ones, used on some ranks only,
    accumulated under no_sync, made dense by another use, and in join mode."""
    torch = _torch_or_skip()
    if torch is None:
        return
    import copy
    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 3, sparse=True)
            self.bag = torch.nn.EmbeddingBag(6, 2, mode="sum", sparse=True)
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, ids, use_bag, dense_use=False):
            out = self.lin(self.emb(ids)).sum()
            if use_bag:
                out = out + self.bag(ids[:2].reshape(1, 2) % 6).sum()
            if dense_use:  # the weight used densely too: its gradient becomes dense
                out = out + self.emb.weight.sum()
            return out

    def ids(r):
        return torch.tensor([r % 8, (r + 3) % 8, 5])

    torch.manual_seed(rank)
    net = Net()
    model = dist.DistributedDataParallel(net, find_unused_parameters=True)
    reference = copy.deepcopy(net)  # rank 0's weights, by now

    def expected(use_bag_on, dense_use=False, calls=((0, True),)):
        """The average over the ranks of each rank's local gradients (dense)."""
        want = [torch.zeros_like(p) for p in reference.parameters()]
        for r in range(world):
            reference.zero_grad(set_to_none=True)
            for shift, synced in calls:
                reference(ids(r + shift), use_bag_on(r), dense_use).backward()
            for w, p in zip(want, reference.parameters()):
                if p.grad is not None:
                    w += p.grad.to_dense() / world
        return want

    def check(what, want):
        for (name, p), w in zip(net.named_parameters(), want):
            got = torch.zeros_like(w) if p.grad is None else p.grad.to_dense()
            assert torch.allclose(got, w, atol=1e-6), (what, name, got, w)

    # The bag is used on rank 0 only: every rank gets the average of its gradient.
    model(ids(rank), rank == 0).backward()
    assert net.emb.weight.grad.is_sparse
    check("first pass", expected(lambda r: r == 0))
    model.zero_grad(set_to_none=True)
    model(ids(rank), True, dense_use=True).backward()
    assert not net.emb.weight.grad.is_sparse
    check("dense use", expected(lambda r: True, dense_use=True))
    # no_sync: the local gradients add up; the next synced pass averages the sum.
    model.zero_grad(set_to_none=True)
    with model.no_sync():
        model(ids(rank), True).backward()
    model(ids(rank + 1), True).backward()
    check("no_sync", expected(lambda r: True, calls=((0, False), (1, True))))

    # Only sparse parameters: the reducer has no bucket.
    torch.manual_seed(0)
    bag = dist.DistributedDataParallel(torch.nn.EmbeddingBag(5, 2, mode="sum", sparse=True))
    bag(torch.tensor([[rank % 5, 4]])).sum().backward()
    want = torch.zeros(5, 2)
    for r in range(world):
        want[r % 5] += 1 / world
        want[4] += 1 / world
    got = bag.module.weight.grad
    assert got.is_sparse and torch.allclose(got.to_dense(), want), got

    # Uneven inputs: rank r trains 1 + r steps; joined ranks give empty sparse gradients.
    torch.manual_seed(0)
    emb = dist.DistributedDataParallel(torch.nn.Embedding(4, 1, sparse=True))
    with emb.join():
        for step in range(1 + rank):
            emb.zero_grad(set_to_none=True)
            emb(torch.tensor([rank % 4])).sum().backward()
            training = [r for r in range(world) if 1 + r > step]
            want = torch.zeros(4, 1)
            for r in training:
                want[r % 4] += 1 / world
            got = emb.module.weight.grad.to_dense()
            assert torch.allclose(got, want), (step, got, want)
    dist.barrier()


def ddp_join(dist, backend):
    """model.join() with uneven inputs (rank r trains 2 + r steps): no hang; each step's
    gradient is the sum over the ranks still training divided by the world size (or by how
    many still train); afterwards every rank holds the last joiner's weights. With
    throw_on_early_termination every rank raises when the first runs out."""
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = 2 + rank
    for divide_by_world, find_unused in [(True, False), (False, True)]:
        torch.manual_seed(0)
        model = dist.DistributedDataParallel(torch.nn.Linear(3, 1, bias=False),
                                             find_unused_parameters=find_unused)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with model.join(divide_by_initial_world_size=divide_by_world):
            for step in range(steps):
                opt.zero_grad()
                model(torch.full((1, 3), float(rank + 1))).sum().backward()
                training = [r for r in range(world) if 2 + r > step]
                want = sum(r + 1 for r in training) / (world if divide_by_world else
                                                       len(training))
                grad = model.module.weight.grad
                assert torch.allclose(grad, torch.full_like(grad, want)), (step, grad, want)
                opt.step()
        weights = [np.zeros(3, np.float32) for _ in range(world)]
        dist.all_gather(weights, model.module.weight.detach().reshape(-1).numpy().copy())
        assert all(np.array_equal(w, weights[0]) for w in weights), weights
    if world == 1:
        return
    model = dist.DistributedDataParallel(torch.nn.Linear(3, 1, bias=False))
    raised = False
    try:
        with model.join(throw_on_early_termination=True):
            for _ in range(steps):
                model(torch.ones(1, 3)).sum().backward()
    except RuntimeError as e:
        raised = "exhausted" in str(e)
    assert raised, "throw_on_early_termination raised nothing"
    dist.barrier()


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
    dist.reduce_scatter_tensor(out, np.asfortranarray(
        np.concatenate([grid(rank) + r for r in range(world)])))
    assert np.array_equal(out, grid(0) * total + world * rank), out
    src = np.asfortranarray(np.arange(world * 2 * 3, dtype=np.int32).reshape(world * 2, 3)
                            + 100 * rank)
    out = np.zeros((3, world * 2), np.int32).T
    dist.all_to_all_single(out, src)
    want = np.concatenate([np.arange(world * 2 * 3).reshape(world * 2, 3)[2 * rank:2 * rank + 2]
                           + 100 * r for r in range(world)])
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
        _raises(ValueError, lambda: dist.send(t, peer) if rank % 2 == 0 else dist.recv(t, peer),
                "a send or receive of a transposed array")
    try:
        import torch
    except ImportError:
        return
    t = torch.arange(12.).reshape(3, 4).t() * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(12.).reshape(3, 4).t() * total), t


def backend_object_checks(dist, backend):
    """A backend object called directly (c10d.ProcessGroupGloo(store, rank, size), as torch's
    own tests use it) validates like a group, in torch's words, and never crashes."""
    import re

    rank, world = dist.get_rank(), dist.get_world_size()
    raw = dist.ProcessGroupGloo(dist.PrefixStore("raw", dist._get_default_store()), rank, world)

    def refused(pattern, fn):
        try:
            fn()
        except ValueError as e:
            assert re.search(pattern, str(e)), (pattern, str(e))
            return
        raise AssertionError(f"nothing raised; expected {pattern!r}")

    t1, t2, f64 = np.zeros(1, np.float32), np.zeros(2, np.float32), np.zeros(1, np.float64)
    refused("requires non-empty tensor list", lambda: raw.allreduce([], dist.AllreduceOptions()))
    refused("invalid tensor type", lambda: raw.allreduce([t1, f64], dist.AllreduceOptions()))
    refused("invalid tensor size", lambda: raw.allreduce([t1, t2], dist.AllreduceOptions()))
    opts = dist.BroadcastOptions()
    opts.rootTensor = 0
    refused("invalid root tensor", lambda: raw.broadcast([], opts))
    opts = dist.ReduceOptions()
    opts.rootTensor = 1
    refused("invalid root tensor", lambda: raw.reduce([t1], opts))
    refused("requires a single-element tensor list",
            lambda: raw.reduce([t1, t1], dist.ReduceOptions()))
    refused("requires a single-element input tensor list",
            lambda: raw.gather([[t1] * world], [], dist.GatherOptions()))
    if world > 1:
        refused("requires empty output on non-root", lambda: raw.gather(
            [[t1] * world], [t1], _root_opts(dist.GatherOptions(), 1 - min(rank, 1))))
        refused("Incorrect input list size 1. Input list size should be",
                lambda: raw.scatter([t1], [[t1]], dist.ScatterOptions()) if rank == 0 else
                raw.scatter([t1], [[t1]], _root_opts(dist.ScatterOptions(), rank)))
        refused("takes a single tensor", lambda: raw.send([t1, t1], 1 - min(rank, 1), 0))
    refused("requires input/output tensor lists to have the same length",
            lambda: raw.allgather([], [t1], dist.AllgatherOptions()))
    refused("invalid output tensor list",
            lambda: raw.allgather([[t1] * (world + 1)], [t1], dist.AllgatherOptions()))
    # The backend still works, strided arrays included.
    t = np.asfortranarray(np.full((2, 3), rank + 1, np.float32))
    raw.allreduce([t], dist.AllreduceOptions()).wait()
    assert (t == world * (world + 1) / 2).all(), t


def _root_opts(opts, root):
    opts.rootRank = root
    return opts


def pg_overloads(dist, backend):
    """The ProcessGroup methods' short forms, as torch's bindings have them: a root or a
    reduce op instead of an options object."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    root = world - 1

    def one(v):
        return np.array([v], np.float32)

    t = one(rank + 1)
    pg.allreduce([t], dist.ReduceOp.MAX).wait()
    assert t[0] == world, t
    t = one(rank + 1)
    pg.allreduce(t).wait()
    assert t[0] == world * (world + 1) / 2, t
    t = one(rank)
    pg.broadcast(t, root).wait()
    assert t[0] == root, t
    t = one(rank + 1)
    pg.reduce(t, root, dist.ReduceOp.PRODUCT).wait()
    assert rank != root or t[0] == np.prod(np.arange(1, world + 1)), t
    gathered = [one(-1) for _ in range(world)]
    pg.gather(gathered if rank == root else [], one(rank), root).wait()
    assert rank != root or [g[0] for g in gathered] == list(range(world)), gathered
    t = one(-1)
    pg.scatter(t, [one(10 + r) for r in range(world)] if rank == root else [], root).wait()
    assert t[0] == 10 + rank, t
    t = one(-1)
    pg.reduce_scatter(t, [one(r) for r in range(world)], dist.ReduceOp.SUM).wait()
    assert t[0] == world * rank, t


def mpi_broken_group(dist, backend):
    """MPI cannot withdraw a posted collective: once one times out, the group's later
    operations fail at once, naming it, instead of pairing with the wrong peers' calls."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(4)
        return
    try:
        dist.all_reduce(np.ones(3))
    except dist.DistTimeoutError as e:
        assert "allreduce (sequence" in str(e) and f"rank {rank} of {world}" in str(e), e
    else:
        raise AssertionError("an all_reduce without the last rank passed")
    start = time.monotonic()
    try:
        dist.broadcast(np.ones(3), 0)
    except RuntimeError as e:
        assert time.monotonic() - start < 1, time.monotonic() - start
        assert "unusable since allreduce" in str(e), e
    else:
        raise AssertionError("a broken group ran another collective")
    print("BROKEN_OK")


def mpi_rank_from_launcher(dist, backend):
    """With the mpi backend the launcher assigns ranks: rank and world_size arguments are
    ignored with torch's warning."""
    import warnings

    dist.destroy_process_group()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("mpi", rank=7, world_size=9)
    assert any("are ignored since they are assigned by the MPI runtime" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert dist.get_rank() == int(os.environ["OMPI_COMM_WORLD_RANK"])
    assert dist.get_world_size() == int(os.environ["OMPI_COMM_WORLD_SIZE"])
    assert dist.get_backend() == "mpi" and dist.is_mpi_available()
    # The default store is a real one, shared by every rank.
    store = dist.distributed_c10d._get_default_store()
    store.add("mpi_counter", 1)
    dist.barrier()
    assert int(store.get("mpi_counter")) == dist.get_world_size()
    dist.barrier()  # rank 0 serves the store: it stays until everyone has read


def mpi_reductions_every_algorithm(dist, backend):
    """The MPI backend picks Open MPI's algorithm per call (recursive doubling below 64 KiB,
    Rabenseifner or ring above, binomial reduce): every size and reduction stays exact, and a
    long reduction is not slowed by the engine's polling (it slept between tests once: 4 MiB
    took 0.6 s)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for count in (1, 3, 16383, 16384 + 5, 262147, 1 << 20):
        for dtype in (np.float32, np.float64, np.int64):
            base = np.arange(count) % 1009
            for op, want in ((dist.ReduceOp.SUM, base * sum(range(1, world + 1))),
                             (dist.ReduceOp.MAX, base * world)):
                t = (base * (rank + 1)).astype(dtype)
                dist.all_reduce(t, op=op)
                assert np.array_equal(t, want.astype(dtype)), (count, dtype, op)
                t = (base * (rank + 1)).astype(dtype)
                dist.reduce(t, dst=world - 1, op=op)
                expected = want if rank == world - 1 else base * (rank + 1)
                assert np.array_equal(t, expected.astype(dtype)), (count, dtype, op, "reduce")
    t = np.ones(1 << 20, np.float32)
    dist.barrier()
    start = time.monotonic()
    for _ in range(10):
        dist.reduce(t, dst=0)
        dist.all_reduce(t)
    took = time.monotonic() - start
    assert took < 5, f"10 reduce + all_reduce of 4 MiB took {took:.2f} s"


def writes_beside_outputs(dist, backend):
    """Every collective, synchronous and asynchronous, changes only its outputs while another
    thread of this process writes the rest of the arrays those outputs are slices of."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n, head = 1 << 17, 3  # float32 slices of 512 KiB starting off a page boundary

    def sliced(total):
        owner = np.zeros(total + 2 * head + n, np.float32)
        return owner, owner[head:head + total], [owner[:head], owner[head + total:]]

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
        run("all_gather_into_tensor", n * world,
            lambda out: lambda a: dist.all_gather_into_tensor(out, src, async_op=a),
            equal(np.repeat(np.arange(1, world + 1, dtype=np.float32), n)), async_op)

        big = np.arange(n * world, dtype=np.float32) + rank
        want = (np.arange(n * world, dtype=np.float32) * world + sum(range(world)))
        want = want[rank * n:(rank + 1) * n]
        run("reduce_scatter_tensor", n,
            lambda out: lambda a: dist.reduce_scatter_tensor(out, big, async_op=a),
            equal(want), async_op)

        parts = np.repeat(np.arange(world, dtype=np.float32) + 10 * rank, n // world)
        want = np.repeat(np.arange(world, dtype=np.float32) * 10 + rank, n // world)
        run("all_to_all_single", n // world * world,
            lambda out: lambda a: dist.all_to_all_single(out, parts, async_op=a),
            equal(want), async_op)


def barrier_after_async(dist, backend):
    """A barrier returns only after the asynchronous operations issued before it finished, as
    torch's does, whether their Work objects are kept or dropped."""
    rank, world = dist.get_rank(), dist.get_world_size()
    want = sum(range(1, world + 1))
    for it in range(100):
        ts = [np.full(17, rank + 1, np.float32) for _ in range(3)]
        for t in ts:
            dist.all_reduce(t, async_op=True)  # dropped
        dist.barrier()
        late = [i for i, t in enumerate(ts) if not (t == want).all()]
        assert not late, f"iteration {it}: all_reduce(s) {late} unfinished after the barrier"


# Cases of test_api_names (torch names checked against torch itself).
from .api_names_cases import (  # noqa: E402,F401
    coalescing_fuses_all_reduces,
    functional_autograd_matches_torch,
)
