"""One rank of test_multihost: multihost_worker.py <backend> [<seconds> [<timeout>]]

Without <seconds>, checks every collective the hierarchical backend splits (check_collectives);
with them, one small all_reduce, then all_reduces of 1 MiB arrays for <seconds> (the fault
tests cut a link or kill a host meanwhile; an error is printed and exits 3). Every rank prints
"<hostname> rank <r> of <n>: ok (<backend>, <backend class>)" once its check passed."""

import socket
import sys
import time
from datetime import timedelta

import numpy as np

import c10d as dist


def backend_of_world():
    from c10d import distributed_c10d as c

    return c._get_default_group()._get_backend("cpu")


def check_collectives(rank, world):
    """Every reduction, root and size class the hierarchical backend splits differently
    (fewer elements than ranks, parts of uneven length, several MiB, parts between hosts of
    odd length larger than a fold piece), checked exactly."""
    for n in (1, 3, 1000, 200006, 1 << 20):
        base = np.arange(n, dtype=np.float64)
        x = base + rank
        dist.all_reduce(x)
        assert np.array_equal(x, base * world + world * (world - 1) // 2), ("sum", n, x[:4])
        y = base * (rank + 1)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        assert np.array_equal(y, base * world), ("max", n, y[:4])
        z = np.full(n, rank + 1, np.float32)
        dist.all_reduce(z, op=dist.ReduceOp.AVG)
        assert np.allclose(z, (world + 1) / 2), ("avg", n, z[:4])
        for root in range(world):
            b = np.full(n, rank, np.int32)
            dist.broadcast(b, root)
            assert (b == root).all(), ("broadcast", n, root, b[:4])
            r = base + rank
            dist.reduce(r, root)
            want = base * world + world * (world - 1) // 2 if rank == root else base + rank
            assert np.array_equal(r, want), ("reduce", n, root, rank, r[:4])
    out = [np.empty(2, np.int64) for _ in range(world)]
    dist.all_gather(out, np.full(2, rank, np.int64))
    assert all((o == i).all() for i, o in enumerate(out)), out
    dist.barrier()


def main():
    backend = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    # "default": no backend given (c10d picks: shm on one host, hier across hosts).
    dist.init_process_group(
        None if backend == "default" else backend, timeout=timedelta(seconds=timeout)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    if seconds == 0:
        check_collectives(rank, world)
    else:  # a fault test: start the loop soon
        x = np.full(4, rank, np.int64)
        dist.all_reduce(x)
        assert (x == world * (world - 1) // 2).all(), x
    print(
        f"{socket.gethostname()} rank {rank} of {world}: ok "
        f"({dist.get_backend()}, {type(backend_of_world()).__name__})",
        flush=True,
    )
    end = time.monotonic() + seconds
    y = np.ones(1 << 18, dtype=np.float32)
    try:
        while time.monotonic() < end:
            dist.all_reduce(y)
            y[:] = 1
    except Exception as e:  # noqa: BLE001 - reported for the test to read
        print(f"{socket.gethostname()} rank {rank}: {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
