"""Data safety of the shared-memory backend (and of the others' asynchronous paths):
a collective changes only the bytes of its outputs, whatever other threads do with the rest of
the memory; no record of moved memory outlives the memory; a peer that resumes after a rank
gave up never writes into that rank's memory; exiting with work never waited never crashes.

This file is also the worker: ``python test_shm_safety.py <case>`` runs one rank of a case."""

import gc
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from test_shm import _all_ok, _report, _run

HERE = os.path.dirname(os.path.abspath(__file__))
ADOPT_OFF = {"C10D_SHM_ADOPT_BYTES": "0"}


def _launch(case, world, env=None, timeout=120, pg_timeout=30):
    return _run(
        case,
        world,
        timeout=timeout,
        env_for_rank=lambda rank: dict(env or {}),
        pg_timeout=pg_timeout,
        script=os.path.abspath(__file__),
    )


# ---------------------------------------------------------------------------------------------
# Tests (run by pytest)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_writes_outside_the_reduced_view_are_never_lost(world, backend):
    # Another thread, and another group's asynchronous all_reduce, write the rest of the array
    # whose slice is being reduced (the slice is moved into shared memory meanwhile on shm).
    _all_ok(_launch("writer_outside_view", world, env={"C10D_TEST_BACKEND": backend}))


@pytest.mark.parametrize("world", [2, 4])
def test_memory_numpy_replaced_is_never_reduced_through_a_stale_record(world):
    # A fixed mmap threshold: numpy's large arrays are mapped and unmapped, and the next one
    # of the same size lands where the freed one was (the case a stale record would hit).
    results = _launch("stale_record", world, env={"MALLOC_MMAP_THRESHOLD_": str(1 << 17)})
    _all_ok(results)
    assert all("address reused" in out for _, out, _ in results), _report(results)


@pytest.mark.parametrize("world,adopt", [(2, True), (2, False), (4, True)])
def test_a_peer_resumed_after_a_timeout_never_writes_into_the_rank_that_gave_up(
    world, adopt, tmp_path
):
    env = {"C10D_TEST_DIR": str(tmp_path), **({} if adopt else ADOPT_OFF)}
    results = _launch("resumed_peer", world, env=env, pg_timeout=3, timeout=90)
    # The stopped rank's own outcome does not matter (it may fail or even finish); the others
    # must see their new memory untouched.
    stopped = world - 1
    assert all(code == 0 for r, (code, _, _) in enumerate(results) if r != stopped), _report(
        results
    )
    assert "untouched" in results[0][1], _report(results)
    assert "WRONG" not in results[stopped][1], _report(results)


EXIT_RUNS = int(os.environ.get("C10D_EXIT_RUNS", "8"))
JOIN_RUNS = int(os.environ.get("C10D_EXIT_RUNS", "3"))  # each imports torch: slower


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_exiting_with_unwaited_work_never_crashes(backend):
    # Backend threads drop the last reference to finished work (and the arrays it holds) while
    # the interpreter exits: they must never take the GIL then. `make exit-soak` runs 200.
    for attempt in range(EXIT_RUNS):
        results = _launch("exit_unwaited", 2, env={"C10D_TEST_BACKEND": backend}, timeout=60)
        assert all(code == 0 for code, _, _ in results), f"run {attempt}\n" + _report(results)


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_the_join_tutorial_program_exits_cleanly(backend):
    # PyTorch's tutorial for the generic join context manager: ranks with uneven inputs.
    pytest.importorskip("torch")
    for attempt in range(JOIN_RUNS):
        results = _launch("join_tutorial", 2, env={"C10D_TEST_BACKEND": backend}, timeout=90)
        assert all(code == 0 for code, _, _ in results), f"run {attempt}\n" + _report(results)
        for rank, (_, out, _) in enumerate(results):
            assert f"Rank {rank} has exhausted all {5 + rank} of its inputs!" in out, out


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_the_join_tutorial_with_torchs_zero_redundancy_optimizer(backend):
    pytest.importorskip("torch")
    results = _launch("join_tutorial_zero", 2, env={"C10D_TEST_BACKEND": backend}, timeout=90)
    assert all(code == 0 for code, _, _ in results), _report(results)
    for rank, (_, out, _) in enumerate(results):
        assert f"Rank {rank} has exhausted all {10 + rank} of its inputs!" in out, out


# ---------------------------------------------------------------------------------------------
# Cases (run by the ranks)


def _init(dist):
    seconds = float(os.environ.get("C10D_TEST_PG_TIMEOUT", "30"))
    backend = os.environ.get("C10D_TEST_BACKEND", "shm")
    dist.init_process_group(backend, timeout=timedelta(seconds=seconds))
    return dist.get_rank(), dist.get_world_size()


def _expect_sum(world, value_of_rank):
    return sum(value_of_rank(r) for r in range(world))


def _adopts():
    return os.environ.get("C10D_SHM_ADOPT_BYTES") != "0"


def _shared_pages(arr):
    """Whether each page of `arr` is a shared (or file) page, from /proc/self/pagemap."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = arr.ctypes.data // page
    end = (arr.ctypes.data + arr.nbytes - 1) // page + 1
    arr.sum()  # faults every page in, so that pagemap describes it
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start * 8)
        entries = np.frombuffer(f.read((end - start) * 8), np.uint64)
    return [bool(e >> np.uint64(61) & np.uint64(1)) for e in entries]


def case_writer_outside_view(dist):
    rank, world = _init(dist)
    m = 1 << 21  # float32: the reduced view, 8 MiB
    head = (1 << 22) + 5  # written meanwhile; the view starts off a page boundary
    chunk = 1024
    owner = np.zeros(head + m + 7, np.float32)
    view = owner[head : head + m]
    before, after = owner[:head], owner[head + m :]
    other = dist.new_group(backend="gloo")
    for it in range(4):
        view[:] = rank + it
        dist.barrier()
        start = threading.Event()

        fill = it * 100000 + np.arange(head, dtype=np.float32) // chunk

        def write():
            start.set()
            np.copyto(before[::-1], fill[::-1])  # releases the GIL: runs beside the all_reduce
            after[:] = -it

        writer = threading.Thread(target=write)
        writer.start()
        start.wait()
        dist.all_reduce(view)
        writer.join()
        want = _expect_sum(world, lambda r: r + it)
        assert np.array_equal(view, np.full(m, want, np.float32)), f"iteration {it}: view"
        wrong = int(np.count_nonzero(before != fill)) + int(np.count_nonzero(after != -it))
        assert wrong == 0, f"iteration {it}: {wrong} elements outside the view lost"
    if dist.get_backend() == "shm":
        # Whatever the timing: no page outside the view was moved into shared memory.
        assert not any(_shared_pages(before)) and not any(_shared_pages(after))
        assert all(_shared_pages(view)[1:-1]) == _adopts()
    # Another group's asynchronous all_reduce on the other part while this one reduces the view.
    for it in range(3):
        view[:] = rank + it
        before[:] = 10 * rank + it
        dist.barrier()
        work = dist.all_reduce(before, group=other, async_op=True)
        dist.all_reduce(view)
        work.wait()
        assert np.array_equal(view, np.full(m, _expect_sum(world, lambda r: r + it), np.float32))
        want = _expect_sum(world, lambda r: 10 * r + it)
        assert np.array_equal(before, np.full(head, want, np.float32)), (
            f"iteration {it}: the other group's"
        )
    dist.destroy_process_group()


def case_stale_record(dist):
    rank, world = _init(dist)
    backend = dist.distributed_c10d._resolve_group(None)._get_backend("cpu")
    n = 1 << 22  # float32: 16 MiB

    def reduce_and_check(arr, what):
        for it in range(2):
            arr[:] = rank + 3 * it
            dist.all_reduce(arr)
            wrong = int(np.count_nonzero(arr != _expect_sum(world, lambda r: r + 3 * it)))
            assert wrong == 0, f"{what}: {wrong} wrong elements"

    # __setstate__ frees the array's memory and allocates new, often at the same address.
    a = np.zeros(n, np.float32)
    reduce_and_check(a, "before __setstate__")
    assert backend._aliased(a)
    old = a.ctypes.data
    a.__setstate__(np.ones(n, np.float32).__reduce__()[2])
    b = np.empty(n, np.float32)
    if old in (a.ctypes.data, b.ctypes.data):
        print("address reused")
    reduce_and_check(a, "the array after __setstate__")
    reduce_and_check(b, "a new array allocated after __setstate__")
    # Assigning `data` (numpy 1.x) frees the old memory too; a new array may take its place.
    c = np.zeros(n, np.float32)
    reduce_and_check(c, "before data assignment")
    keep = np.zeros(n, np.float32)
    try:
        with np.testing.suppress_warnings() as sup:
            sup.filter(DeprecationWarning)
            c.data = keep.data
    except AttributeError:
        pass  # numpy 2 no longer allows it
    d = np.empty(n, np.float32)
    reduce_and_check(d, "a new array allocated after data assignment")
    reduce_and_check(c, "the array after data assignment")
    del a, b, c, d, keep
    gc.collect()
    assert dist._C._shm_alias_count() == 0, dist._C._shm_alias_count()
    dist.destroy_process_group()


def _touch(path):
    with open(path, "w"):
        pass


def _wait_for(path, seconds, what):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what} ({path})")
        time.sleep(0.01)


def case_resumed_peer(dist):
    rank, world = _init(dist)
    folder = os.environ["C10D_TEST_DIR"]
    stopped = world - 1
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    n = 1 << 24  # float32: 64 MiB
    a = np.zeros(n, np.float32)
    for it in range(2):  # the second moves it into the shared heap, unless adoption is off
        a[:] = rank + it
        dist.all_reduce(a)
    a[:] = rank + 5
    dist.barrier()
    if rank == stopped:
        # Stops this whole process a moment into the all_reduce; rank 0 continues it later.
        threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        try:
            dist.all_reduce(a)
            # Succeeding is possible (it may have finished before it stopped), but then exact.
            wrong = int(np.count_nonzero(a != _expect_sum(world, lambda r: r + 5)))
            print(f"WRONG: {wrong} elements" if wrong else "finished")
        except Exception as e:
            print(f"failed: {type(e).__name__}")
        sys.stdout.flush()
        time.sleep(1)
        os._exit(0)
    try:
        dist.all_reduce(a)
        print("the stopped rank finished before it stopped")
    except Exception as e:  # DistTimeoutError, or DistBackendError naming the stopped rank
        print(f"gave up: {type(e).__name__}")
    # Memory freed and taken again, where the stopped rank was reading and writing.
    del a
    gc.collect()
    fresh = [np.full(n, 7.0, np.float32) for _ in range(2)]
    try:
        heap = dist.shm_empty(n, np.float32)
        heap[:] = 7.0
        fresh.append(heap)
    except Exception:
        pass  # no shared heap to take (the backend gave up): private memory is the case then
    _touch(os.path.join(folder, f"ready{rank}"))
    if rank == 0:
        for r in range(world):
            if r != stopped:
                _wait_for(os.path.join(folder, f"ready{r}"), 30, f"rank {r} to allocate")
        os.kill(pids[stopped], signal.SIGCONT)
        _touch(os.path.join(folder, "continued"))
    _wait_for(os.path.join(folder, "continued"), 30, "rank 0 to continue the stopped rank")
    time.sleep(1.5)  # the resumed rank runs on meanwhile
    wrong = sum(int(np.count_nonzero(f != 7.0)) for f in fresh)
    assert wrong == 0, f"rank {rank}: {wrong} elements of new memory changed"
    print("untouched")
    sys.stdout.flush()
    os._exit(0)  # the group is broken after the timeout; nothing to tear down


def case_join_tutorial(dist):
    import torch
    from c10d.algorithms.join import Join

    rank, _ = _init(dist)
    model = dist.DistributedDataParallel(torch.nn.Linear(1, 1))
    inputs = [torch.tensor([1]).float() for _ in range(5 + rank)]  # rank 1 has one more
    num_inputs = 0
    with Join([model]):
        for x in inputs:
            num_inputs += 1
            model(x).sum().backward()
    print(f"Rank {rank} has exhausted all {num_inputs} of its inputs!")
    # Exits without destroy_process_group, as the tutorial does.


def case_join_tutorial_zero(dist):
    # The tutorial's second program: c10d's DDP beside torch's ZeroRedundancyOptimizer (a torch
    # Joinable, on torch's view of c10d's group) in one Join.
    import torch
    from c10d.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer

    rank, _ = _init(dist)
    model = dist.DistributedDataParallel(torch.nn.Linear(1, 1))
    optim = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
    inputs = [torch.tensor([1]).float() for _ in range(10 + rank)]
    num_inputs = 0
    with Join([model, optim]):
        for x in inputs:
            num_inputs += 1
            model(x).sum().backward()
            optim.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = weights.clone()
    dist.broadcast(weights, 0)
    assert torch.equal(mine, weights), f"rank {rank}: {mine} against rank 0's {weights}"
    print(f"Rank {rank} has exhausted all {num_inputs} of its inputs!")
    dist.destroy_process_group()


def _ones():
    try:
        import torch  # the reported form: torch tensors, whose DLPack owner goes last

        return torch.ones(1)
    except ImportError:
        return np.ones(1, np.float32)


def case_exit_unwaited(dist):
    _init(dist)
    for _ in range(10):
        dist.all_reduce(_ones(), async_op=True)  # never waited
        dist.all_reduce(_ones())
    # Exits without destroy_process_group, the unwaited work perhaps still held by a backend.


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import c10d

    globals()["case_" + sys.argv[1]](c10d)
    sys.exit(0)
