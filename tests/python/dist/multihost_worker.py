"""One rank of test_multihost: multihost_worker.py <backend> [<seconds> [<timeout>]]

all_reduces a rank-valued array over the world and checks it (every rank prints
"<hostname> rank <r> of <n>: ok"), then, for <seconds> more, keeps all_reducing 1 MiB arrays
(the fault tests cut a link or kill a host meanwhile; an error is printed and exits 3)."""

import socket
import sys
import time
from datetime import timedelta

import numpy as np

import c10d as dist


def main():
    backend = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = np.arange(1 << 16, dtype=np.float64) + rank
    dist.all_reduce(x)
    expected = np.arange(1 << 16, dtype=np.float64) * world + world * (world - 1) // 2
    assert np.array_equal(x, expected), (rank, x[:4], expected[:4])
    print(f"{socket.gethostname()} rank {rank} of {world}: ok", flush=True)
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
