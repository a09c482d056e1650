"""Cases only the MPI backend runs (under mpirun)."""

import os
import time

import numpy as np


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
    assert any(
        "are ignored since they are assigned by the MPI runtime" in str(w.message) for w in caught
    ), [str(w.message) for w in caught]
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
    long reduction is not slowed by the progress thread's polling (it slept between tests once:
    4 MiB took 0.6 s)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for count in (1, 3, 16383, 16384 + 5, 262147, 1 << 20):
        for dtype in (np.float32, np.float64, np.int64):
            base = np.arange(count) % 1009
            for op, want in (
                (dist.ReduceOp.SUM, base * sum(range(1, world + 1))),
                (dist.ReduceOp.MAX, base * world),
            ):
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
