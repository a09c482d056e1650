"""Cases of failures: timeouts, mismatched sizes, pending work at destroy, monitored barriers,
desync reports, a dead peer, and flight-recorder dumps of a hang."""

import os
import time
import warnings
from datetime import timedelta

import numpy as np


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
        dist.distributed_c10d._get_default_store().set("recv_timeout_done", "1")
        return
    # Rank 0 stays (never sending) until rank 1 is done, not a fixed time.
    dist.distributed_c10d._get_default_store().wait(["recv_timeout_done"], timedelta(seconds=60))


def default_timeout_change(dist, backend):
    """Rank 0 shortens its backend's timeout (_set_pg_timeout, torch's _set_default_timeout)
    from the group's 30 s to 2 s; its next all_reduce, which rank 1 never joins, fails within
    that."""
    from datetime import timedelta

    from c10d import distributed_c10d as c

    store = c._get_default_store()
    if dist.get_rank() == 1:  # stays out of the all_reduce until rank 0 is done with it
        store.wait(["default_timeout_done"], timedelta(seconds=60))
        return
    c._set_pg_timeout(timedelta(seconds=2))
    backend_object = c._get_default_group()._get_backend("cpu")
    assert backend_object.options_timeout == timedelta(seconds=2), backend_object.options_timeout
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(4))
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        assert elapsed < 8, (elapsed, e)
        print(f"DEFAULT_TIMEOUT_OK {elapsed:.1f}s: {e}")
        store.set("default_timeout_done", "1")
        return
    raise AssertionError("all_reduce without rank 1 returned")


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


def ring_disagreement(dist, backend):
    """On Gloo's ring, ranks that all_reduce different sizes, or broadcast from different
    roots, all raise within a second, naming the other side's call (Gloo's own transport
    terminated the process that received the larger message); the group then refuses further
    ring operations instead of mixing their bytes."""
    rank = dist.get_rank()
    calls = [
        ("all_reduce", lambda g: dist.all_reduce(np.ones(4 + rank), group=g), "allreduce sequence"),
        ("broadcast", lambda g: dist.broadcast(np.ones(4), rank, group=g), "from root"),
    ]
    for name, call, words in calls:
        group = dist.new_group(list(range(dist.get_world_size())))
        start = time.monotonic()
        try:
            call(group)
        except RuntimeError as e:
            assert time.monotonic() - start < 5, (name, time.monotonic() - start)
            assert "called different collectives" in str(e), (name, e)
            assert words in str(e), (name, e)
        else:
            raise AssertionError(f"a mismatched {name} returned")
        try:
            dist.all_reduce(np.ones(4), group=group)
        except RuntimeError as e:
            assert "the ring broke earlier" in str(e), (name, e)
        else:
            raise AssertionError(f"an all_reduce on a broken ring returned after {name}")
    print("RING_DISAGREEMENT_OK")


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
        words = (
            f"Rank {world - 1} failed to pass monitoredBarrier"
            if rank == 0
            else f"Rank {rank} successfully reached monitoredBarrier"
        )
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
            assert (
                f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                f"while waiting for send/recv from rank 0" in str(e)
            ), e
        print(f"MONITORED_OK: {e}")
    else:
        raise AssertionError("monitored_barrier passed with a rank missing")
    if rank == 0 and world > 1:
        # A zero timeout fails at once, as in torch, through the function, the group's own
        # method (torch's plugin door calls it) and as a float of seconds (torch warns).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for how, call in [
                ("function", lambda: dist.monitored_barrier(timeout=timedelta(0))),
                ("method", lambda: dist.group.WORLD.monitored_barrier(timedelta(0))),
                ("float seconds", lambda: dist.monitored_barrier(timeout=0.0)),
            ]:
                start = time.monotonic()
                try:
                    call()
                except RuntimeError as e:
                    took = time.monotonic() - start
                    assert took < 2 and "Rank 0 timed out in monitoredBarrier" in str(e), (how, e)
                else:
                    raise AssertionError(f"monitored_barrier ({how}) with a zero timeout passed")


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
        assert (
            "mismatch" in msg and "broadcast(float32[4]" in msg and "all_reduce(float32[4]" in msg
        ), msg
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
        job = dist._C._trace_job()
        path = os.path.join(dump_dir, f"c10d_trace_{job + '_' if job else ''}rank{r}.json")
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


def _mismatches(dist, rank, world):
    """(name, call) pairs: each call differs between rank 0 and the others in one respect."""
    odd = rank != 0
    n = 4
    f32_or_i32 = np.int32 if odd else np.float32
    return [
        ("all_reduce dtype", lambda g: dist.all_reduce(np.ones(n, f32_or_i32), group=g)),
        (
            "all_reduce op",
            lambda g: dist.all_reduce(
                np.ones(n), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM, group=g
            ),
        ),
        ("broadcast dtype", lambda g: dist.broadcast(np.ones(n, f32_or_i32), 0, group=g)),
        # Nothing to send, and only rank 1 differs: on a ring of three or more, neither the
        # root nor the member after rank 1's successor sees rank 1's call in its header check.
        (
            "broadcast of nothing dtype",
            lambda g: dist.broadcast(np.ones(0, np.int32 if rank == 1 else np.float32), 0, group=g),
        ),
        # A receive buffer larger than the root's.
        ("broadcast size", lambda g: dist.broadcast(np.ones(n + n * odd), 0, group=g)),
        (
            "all_gather_into_tensor dtype",
            lambda g: dist.all_gather_into_tensor(
                np.zeros(n * world, f32_or_i32), np.ones(n, f32_or_i32), group=g
            ),
        ),
        (
            "all_gather dtype",
            lambda g: dist.all_gather(
                [np.zeros(n, f32_or_i32) for _ in range(world)], np.ones(n, f32_or_i32), group=g
            ),
        ),
        (
            "barrier against all_reduce",
            lambda g: dist.all_reduce(np.zeros(1, np.uint8), group=g) if odd else dist.barrier(g),
        ),
        (
            "all_reduce against reduce_scatter_tensor",
            lambda g: (
                dist.reduce_scatter_tensor(np.zeros(n), np.ones(n * world), group=g)
                if odd
                else dist.all_reduce(np.ones(n * world), group=g)
            ),
        ),
        (
            "reduce op",
            lambda g: dist.reduce(
                np.ones(n), 0, op=dist.ReduceOp.MIN if odd else dist.ReduceOp.SUM, group=g
            ),
        ),
        (
            "gather size",
            lambda g: dist.gather(
                np.ones(n + odd),
                [np.zeros(n) for _ in range(world)] if rank == 0 else None,
                0,
                group=g,
            ),
        ),
        (
            "scatter size",
            lambda g: dist.scatter(
                np.zeros(n + odd),
                [np.ones(n) for _ in range(world)] if rank == 0 else None,
                0,
                group=g,
            ),
        ),
        (
            "all_to_all_single splits",
            # Rank 0 expects 2 rows from everyone; the others send 1 row to everyone.
            lambda g: dist.all_to_all_single(
                np.zeros(2 * world if not odd else world),
                np.ones(world if odd else 2 * world),
                output_split_sizes=[2] * world if not odd else [1] * world,
                input_split_sizes=[1] * world if odd else [2] * world,
                group=g,
            ),
        ),
        (
            "all_to_all dtype",
            lambda g: dist.all_to_all(
                [np.zeros(n, f32_or_i32) for _ in range(world)],
                [np.ones(n, f32_or_i32) for _ in range(world)],
                group=g,
            ),
        ),
    ]


def mismatched_calls(dist, backend):
    """Ranks that call one collective differently (dtype, reduction, kind, sizes) raise, naming
    the calls, within the group's timeout: never a wrong value, an abort or a hang. A rank whose
    part needs nothing from the others (a broadcast's root, a reduce's or gather's non-root, a
    scatter's root) may return first, its result being its own."""
    rank, world = dist.get_rank(), dist.get_world_size()
    one_sided = {
        "broadcast dtype": rank == 0,
        "broadcast size": rank == 0,
        "reduce op": rank != 0,
        "gather size": rank != 0,
        "scatter size": rank == 0,
    }
    only = os.environ.get("C10D_TEST_MISMATCH")
    timeout = 10
    returned = []
    for name, call in _mismatches(dist, rank, world):
        if only and name != only:
            continue
        # Where a mismatch ends in a timeout (hier runs some kinds on its hosts' groups, others
        # on a group of all ranks) the ranks leave at different times: meet on the default
        # group, whose timeout is longer, before the next group.
        dist.barrier()
        group = dist.new_group(list(range(world)), timeout=timedelta(seconds=timeout))
        start = time.monotonic()
        try:
            call(group)
        except RuntimeError as e:
            elapsed = time.monotonic() - start
            assert elapsed < timeout + 5, (name, elapsed, str(e))
            print(f"MISMATCH {name}: {e}".replace("\n", " "), flush=True)
        else:
            if not one_sided.get(name, False):
                returned.append(name)
    assert not returned, f"rank {rank}: mismatched calls returned: {returned}"
    print("MISMATCHES_OK", flush=True)


def concurrent_threads(dist, backend):
    """Collectives issued from several threads at once on one group reach the ranks in
    different orders: each returns the exact result or raises, never another call's data.
    (Every call has a size of its own: calls alike in every respect cannot be told
    apart, by c10d or by torch.)"""
    import threading

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=10))
    wrong, raised, exact = [], [], []

    def run(t):
        for i in range(5):
            value = 10 * t + i + 1
            n = 4 + 5 * t + i  # every call its own size
            try:
                if t % 2:
                    x = np.full(n, float(value) if rank == 0 else -1.0)
                    dist.broadcast(x, 0, group=group)
                    want = np.full(n, float(value))
                else:
                    x = np.full(n, float(value))
                    dist.all_reduce(x, group=group)
                    want = np.full(n, float(value * world))
            except RuntimeError as e:
                raised.append(str(e))
                continue
            (exact if np.array_equal(x, want) else wrong).append((t, i, x[0], want[0]))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not wrong, f"rank {rank}: wrong results {wrong[:5]}"
    print(f"THREADS exact={len(exact)} raised={len(raised)}", flush=True)


def killed_rank_named(dist, backend):
    """The last rank is killed (SIGKILL) between all_reduces: every survivor fails within the
    timeout naming it, and none blames a survivor that merely passed the failure on."""
    import re
    import signal

    rank, world = dist.get_rank(), dist.get_world_size()
    victim = world - 1
    t = np.ones(1 << 12)
    for i in range(4):
        dist.all_reduce(t)
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(t)
    except RuntimeError as e:
        text = str(e)
        assert time.monotonic() - start < 25, (time.monotonic() - start, text)
        assert f"rank {victim}" in text, text
        # A rank said to have ended without a word is the victim.
        for silent in re.findall(r"rank (\d+) [^:]*?closed the connection without reporting", text):
            assert int(silent) == victim, text
        print(f"KILLED_RANK_NAMED: {text}", flush=True)
        return
    raise AssertionError("all_reduces with a killed rank succeeded")


def _random_call(rng, world):
    kind = rng.choice(
        ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor"]
        + ["all_to_all_single", "gather", "scatter", "barrier"]
    )
    return {
        "kind": kind,
        "dtype": rng.choice(["float32", "int32", "float64", "int64"]),
        "n": rng.randint(1, 6),
        "op": rng.choice(["SUM", "MAX", "MIN"]),
        "root": rng.randrange(world),
    }


def _deviate(rng, call, world):
    """`call` changed in one respect that every backend must notice."""
    call = dict(call)
    choices = ["kind"]
    if call["kind"] != "barrier":
        choices += ["dtype", "n"]
    if call["kind"] in ("all_reduce", "reduce", "reduce_scatter_tensor"):
        choices.append("op")
    if call["kind"] in ("broadcast", "reduce", "gather", "scatter") and world > 1:
        choices.append("root")
    what = rng.choice(choices)
    if what == "kind":
        call["kind"] = rng.choice(
            [
                k
                for k in ("all_reduce", "broadcast", "all_gather_into_tensor", "barrier")
                if k != call["kind"]
            ]
        )
    elif what == "dtype":
        call["dtype"] = {
            "float32": "int32",
            "int32": "float32",
            "float64": "int64",
            "int64": "float64",
        }[call["dtype"]]
    elif what == "n":
        call["n"] += rng.randint(1, 3)
    elif what == "op":
        call["op"] = {"SUM": "MAX", "MAX": "MIN", "MIN": "SUM"}[call["op"]]
    else:
        call["root"] = (call["root"] + rng.randint(1, world - 1)) % world
    return call, what


def _run_call(dist, call, rank, world, group):
    """Runs `call` with inputs every rank can predict; returns (output, expected)."""
    dtype, n, root, kind = np.dtype(call["dtype"]), call["n"], call["root"], call["kind"]
    op = getattr(dist.ReduceOp, call["op"])
    mine = (np.arange(n) + 10 * rank + 1).astype(dtype)
    alls = [(np.arange(n) + 10 * r + 1).astype(dtype) for r in range(world)]
    reduce = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}[call["op"]]
    reduced = reduce(np.stack(alls), axis=0).astype(dtype)
    if kind == "all_reduce":
        dist.all_reduce(mine, op=op, group=group)
        return mine, reduced
    if kind == "broadcast":
        dist.broadcast(mine, root, group=group)
        return mine, alls[root]
    if kind == "reduce":
        dist.reduce(mine, root, op=op, group=group)
        return (mine, reduced) if rank == root else (None, None)
    if kind == "all_gather_into_tensor":
        out = np.zeros(n * world, dtype)
        dist.all_gather_into_tensor(out, mine, group=group)
        return out, np.concatenate(alls)
    if kind == "reduce_scatter_tensor":
        out = np.zeros(n, dtype)
        big = np.concatenate([mine + j for j in range(world)])
        dist.reduce_scatter_tensor(out, big, op=op, group=group)
        return out, reduce(np.stack([a + rank for a in alls]), axis=0).astype(dtype)
    if kind == "all_to_all_single":
        out = np.zeros(n * world, dtype)
        dist.all_to_all_single(out, np.tile(mine, world), group=group)
        return out, np.concatenate(alls)
    if kind == "gather":
        lst = [np.zeros(n, dtype) for _ in range(world)] if rank == root else None
        dist.gather(mine, lst, root, group=group)
        return (np.concatenate(lst), np.concatenate(alls)) if rank == root else (None, None)
    if kind == "scatter":
        out = np.zeros(n, dtype)
        dist.scatter(out, [a.copy() for a in alls] if rank == root else None, root, group=group)
        return out, alls[rank]
    dist.barrier(group)
    return None, None


def mismatch_scenario(rng, world):
    """One example for random_mismatches, drawn from `rng` (hypothesis's, in the test): a few
    matching calls, then a call that one rank (`deviant`) makes changed in one respect."""
    prefix = [_random_call(rng, world) for _ in range(rng.randint(0, 3))]
    call = _random_call(rng, world)
    deviant = rng.randrange(world)
    changed, what = _deviate(rng, call, world)
    return {"prefix": prefix, "call": call, "deviant": deviant, "changed": changed, "what": what}


def random_mismatches(dist, backend):
    """The examples in C10D_TEST_SCENARIOS (JSON, from mismatch_scenario): the matching calls
    are checked exactly; then every rank must raise within the timeout, the root of a
    broadcast and the senders of a gather as much as the ranks whose data is wrong."""
    import json

    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = 10
    for e, scenario in enumerate(json.loads(os.environ["C10D_TEST_SCENARIOS"])):
        dist.barrier()  # as in mismatched_calls: ranks may leave the last example apart
        group = dist.new_group(list(range(world)), timeout=timedelta(seconds=timeout))
        for call in scenario["prefix"]:
            got, want = _run_call(dist, call, rank, world, group)
            if want is not None:
                assert np.array_equal(got, want), (e, call, got, want)
        call, deviant = scenario["call"], scenario["deviant"]
        mine = scenario["changed"] if rank == deviant else call
        where = f"example {e}: rank {deviant} changed {scenario['what']}: {call} -> {mine}"
        start = time.monotonic()
        try:
            got, want = _run_call(dist, mine, rank, world, group)
        except RuntimeError as err:
            assert time.monotonic() - start < 2 * timeout + 5, (where, str(err))
            continue
        raise AssertionError(f"rank {rank}: a mismatched call returned {got} ({where})")
    print("RANDOM_MISMATCHES_OK", flush=True)


def p2p_dtype_mismatch(dist, backend):
    """Rank 0 sends float32, rank 1 receives int32 of the same size: the receiver raises
    naming both dtypes instead of reinterpreting the bytes (shm carries the dtype with the
    message; Gloo's and MPI's messages are bytes, as torch's)."""
    rank = dist.get_rank()
    if rank == 0:
        dist.send(np.ones(4, np.float32), 1)
        return
    try:
        dist.recv(np.zeros(4, np.int32), 0)
    except RuntimeError as e:
        assert "float32" in str(e) and "int32" in str(e), e
        print("P2P_DTYPE_OK", e)
        return
    raise AssertionError("a float32 message was received as int32")
