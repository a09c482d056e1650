"""Cases of point-to-point operations, barriers and asynchronous work, and the object
collectives."""

import copyreg
import os
import pickle
import signal
import threading
import time
from datetime import timedelta

import numpy as np

from .common import _raises


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
    ops = [
        dist.P2POp(dist.isend, np.full(4, rank, np.int64), nxt),
        dist.P2POp(dist.irecv, got, prv),
    ]
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


def inline_point_to_point(dist, backend):
    """Sends and receives on the default group take the inline path where the backend has one
    (shm): numbered and traced like the general path, their Works holding the arrays they
    read or write, and every call that path does not take reported as the general path does."""
    import gc
    import json

    import c10d
    from c10d import distributed_c10d as dc

    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if backend == "shm":
        assert all(None in t for t in (dc._inline_send, dc._inline_isend, dc._inline_irecv))
    pg = dist.group.WORLD
    before = pg._get_sequence_number_for_group()
    got = np.zeros(4, np.int32)
    if rank % 2 == 0:
        dist.send(np.full(4, rank, np.int32), nxt, tag=5)
        sender = dist.recv(got, prv, tag=5)
    else:
        sender = dist.recv(got, prv, tag=5)
        dist.send(np.full(4, rank, np.int32), nxt, tag=5)
    assert sender == prv and (got == prv).all(), (sender, got)
    assert pg._get_sequence_number_for_group() == before + 2
    dump = json.loads(c10d._dump_trace_json())
    uid = [g["uid"] for g in dump["groups"] if g["name"] == pg.group_name][-1]
    last = [e for e in dump["entries"] if e["group_uid"] == uid][-2:]
    seen = sorted((e["op"], e["peer"], e["state"]) for e in last)
    assert seen == sorted([("send", nxt, "completed"), ("recv", prv, "completed")]), last
    # The Work of an isend holds its array: a temporary one, collected and its memory
    # reused before the receiver reads it (1 MiB: shm lets the receiver read it in place).
    n = 1 << 18
    if rank == 0:
        work = dist.isend(np.full(n, 7.0, np.float32), 1)
        gc.collect()
        reuse = [np.full(n, -1.0, np.float32) for _ in range(4)]
        dist.barrier()
        work.wait()
        del reuse
    elif rank == 1:
        dist.barrier()
        big = np.zeros(n, np.float32)
        dist.recv(big, 0)
        assert (big == 7.0).all(), np.unique(big)
    else:
        dist.barrier()
    # An irecv's result is the array it wrote.
    mine = np.full(3, rank, np.int16)
    theirs = np.zeros(3, np.int16)
    works = [dist.irecv(theirs, prv), dist.isend(mine, nxt)]
    for w in works:
        w.wait()
    assert (theirs == prv).all(), theirs
    assert np.shares_memory(works[0].result()[0], theirs)
    # A bytearray (its export pins its memory) goes to the general path, asynchronously too.
    raw = bytearray(8)
    works = [dist.irecv(raw, prv), dist.isend(bytearray([rank]) * 8, nxt)]
    for w in works:
        w.wait()
    assert raw == bytearray([prv]) * 8, raw
    # What the inline path leaves alone fails as on the general path.
    ro = np.ones(2)
    ro.setflags(write=False)
    _raises(ValueError, lambda: dist.send(np.ones(1), rank), "send to self")
    _raises(ValueError, lambda: dist.isend(np.ones(1), rank), "isend to self")
    _raises(ValueError, lambda: dist.irecv(np.ones(1), rank), "irecv from self")
    _raises(ValueError, lambda: dist.send(np.ones(1), world), "send past the last rank")
    _raises(ValueError, lambda: dist.irecv(ro, prv), "irecv into a read-only array")
    _raises(TypeError, lambda: dist.isend(np.ones(1), nxt, tag="7"), "a tag that is no int")
    dist.barrier()


def message_order(dist, backend):
    """Messages between two ranks arrive in the order they were sent whatever their sizes (shm
    carries small ones, chunked ones and ones read from the sender's buffer three ways), and
    a receive for a later tag gets its message past earlier ones, more of them than shm keeps
    in flight."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    # Element counts (int16): 2 B and 96 B messages on either side of shm's 48 B small
    # message, 10 KB chunked, 128 KiB read whole.
    counts = [1, 24, 48, 5000, 1 << 16, 3]
    if rank == 0:
        works = [
            dist.isend(np.full(counts[i % len(counts)], i, np.int16), 1, tag=3) for i in range(60)
        ]
        for w in works:
            w.wait()
    elif rank == 1:
        for i in range(60):
            got = np.zeros(counts[i % len(counts)], np.int16)
            dist.recv(got, 0, tag=3)
            assert (got == i).all(), (i, got[:4])
    dist.barrier()
    if rank == 0:
        works = [dist.isend(np.array([i], np.int64), 1, tag=1) for i in range(80)]
        works.append(dist.isend(np.array([-1], np.int64), 1, tag=2))
        for w in works:
            w.wait()
    elif rank == 1:
        last = np.zeros(1, np.int64)
        dist.recv(last, 0, tag=2)
        assert last[0] == -1, last
        for i in range(80):
            got = np.zeros(1, np.int64)
            dist.recv(got, 0, tag=1)
            assert got[0] == i, (i, got)
    dist.barrier()


def p2p_torch_conformance(dist, backend):
    """Point-to-point results torch's API defines: batch_isend_irecv's Works in list order,
    recv returning global ranks also for group_src, RuntimeError-compatible argument errors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = np.zeros(2, np.int64)
    ops = [
        dist.P2POp(dist.isend, np.full(2, rank, np.int64), nxt),
        dist.P2POp(dist.irecv, got, prv),
    ]
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
    dist.scatter_object_list(
        recv_obj, [{"to": r} for r in range(world)] if rank == 0 else None, src=0
    )
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


def queue_rules(dist, backend):
    """The operation queue's rules, the same on every backend: a synchronous collective ends
    after the asynchronous ones submitted before it; destroying a group finishes what was
    submitted to it; after shutdown a call is refused through its Work, not at the call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    tensors = [np.full(1000 * (i + 1), rank + i, np.float32) for i in range(8)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    last = np.full(3, rank, np.float32)
    dist.all_reduce(last, group=group)
    for i, (t, w) in enumerate(zip(tensors, works)):
        assert w.is_completed(), f"async all_reduce {i} not complete after a later sync one"
        assert (t == sum(r + i for r in range(world))).all(), (i, t[:3])
    assert (last == sum(range(world))).all()

    pending = [np.full(500, rank * 10 + i, np.float64) for i in range(6)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in pending]
    dist.destroy_process_group(group)
    for i, (t, w) in enumerate(zip(pending, works)):
        assert w.is_completed(), f"async all_reduce {i} not finished by destroy_process_group"
        assert (t == sum(r * 10 + i for r in range(world))).all(), (i, t[:3])

    group = dist.new_group(list(range(world)))
    dist.barrier(group=group)
    group._shutdown()
    for async_op in (False, True):
        opts = dist.AllreduceOptions()
        opts.asyncOp = async_op
        try:
            work = group.allreduce([np.ones(4, np.float32)], opts)  # async: refused by the Work
            assert async_op == (work is not None), work
            if work is not None:
                work.wait()
        except dist.DistBackendError as e:
            assert "shut down" in str(e), e
        else:
            raise AssertionError(f"an all_reduce after shutdown succeeded (async_op={async_op})")
    dist.destroy_process_group(group)


def destroy_after_send(dist, backend):
    """A sender that destroys its group as soon as its send has ended (Gloo's send ends once
    the kernel holds the bytes) must leave the connection to deliver them: the receiver,
    stopped meanwhile, still gets every byte. A reset on close dropped them."""
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    # A send left waiting (the receiver stopped before it announced) fails within 30 s.
    group = dist.new_group([0, 1], timeout=timedelta(seconds=30))
    data = np.arange(32 << 10, dtype=np.int32) * 3 + 1
    if rank == 1:
        got = np.zeros_like(data)
        work = dist.irecv(got, 0, group=group)  # announces the receive to the sender
        store.set("destroy_after_send/pid", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 continues us after its destroy
        work.wait(timedelta(seconds=20))
        assert (got == data).all(), f"{(got != data).sum()} of {got.size} elements lost"
        dist.destroy_process_group(group)
    elif rank == 0:
        pid = int(store.get("destroy_after_send/pid"))
        try:
            _wait_until_stopped(pid)
            dist.send(data, 1, group=group)
            dist.destroy_process_group(group)
        finally:
            os.kill(pid, signal.SIGCONT)


def _wait_until_stopped(pid, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {seconds} s")


def large_messages(dist, backend):
    """Messages from 64 KiB up (on shm: read once from the sender's buffer), in the orders
    users write: a ring with blocking calls, every rank sending before it receives, a small
    message received before a large one sent ahead of it, from any source, of the wrong size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in (1 << 14, (1 << 18) + 3, 1 << 22):
        mine = np.arange(n, dtype=np.float32) + rank * 1e6
        got = np.zeros(n, np.float32)
        if rank % 2 == 0:
            dist.send(mine, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(mine, nxt)
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32) + prv * 1e6)
        # Every rank sends first, then receives: buffered, never a deadlock.
        got[:] = 0
        work = dist.isend(mine, nxt, tag=1)
        dist.recv(got, prv, tag=1)
        work.wait()
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32) + prv * 1e6)
    # A small message overtakes a large one with another tag, both sent with blocking calls:
    # shm buffers the large one. (Gloo and MPI complete a large send only once it is received,
    # as torch's Gloo does: there this order deadlocks.)
    if backend == "shm" and world > 1 and rank < 2:
        big = np.full(1 << 20, 3.0 + rank)
        small = np.full(4, 9.0 + rank)
        if rank == 0:
            dist.send(big, 1, tag=5)
            dist.send(small, 1, tag=6)
        else:
            got_small, got_big = np.zeros(4), np.zeros(1 << 20)
            dist.recv(got_small, 0, tag=6)
            dist.recv(got_big, 0, tag=5)
            assert (got_small == 9.0).all() and (got_big == 3.0).all(), (got_small, got_big[:3])
    dist.barrier()
    # From any source.
    if rank == 0:
        for _ in range(world - 1):
            buf = np.zeros(1 << 18, np.int64)
            sender = dist.recv(buf, tag=2)
            assert (buf == sender).all(), (sender, buf[:3])
    else:
        dist.send(np.full(1 << 18, rank, np.int64), 0, tag=2)
    dist.barrier()


def large_message_withdrawn(dist, backend):
    """A large send whose receiver never comes fails at its timeout, and the receive posted
    after that fails too: read from the sender's buffer, it does not even start (the buffer
    may be gone); through the channel, the chunk already there may land. The pair works
    afterwards."""
    import os

    read = os.environ.get("C10D_SHM_CMA") != "0"
    rank = dist.get_rank()
    g = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    if rank == 0:
        work = dist.isend(np.full(1 << 20, 7.0), 1, group=g, tag=3)
        _raises(dist.DistError, work.wait, "send nobody receives")
    dist.barrier()
    if rank == 1:
        buf = np.zeros(1 << 20)
        _raises(dist.DistError, lambda: dist.recv(buf, 0, group=g, tag=3), "withdrawn message")
        assert not read or (buf == 0).all(), buf[:3]
    dist.barrier()
    if rank < 2:
        out, got = np.full(1 << 20, 1.0 + rank), np.zeros(1 << 20)
        work = dist.isend(out, 1 - rank, group=g, tag=4)
        dist.recv(got, 1 - rank, group=g, tag=4)
        work.wait()
        assert (got == 2.0 - rank).all(), got[:3]
    dist.barrier()
