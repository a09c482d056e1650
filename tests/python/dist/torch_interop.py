"""One rank of test_torch_interop's group test: torch_interop.py <rank> <world> <dir>.

Rank 0 serves a c10d TCPStore and a torch TCPStore (port 0 each, ports published through a
file in <dir>). Every rank then builds a torch gloo group over c10d's server and a c10d gloo
group over torch's server, and all_reduces through both in one process."""

import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as tdist

import c10d

TIMEOUT = timedelta(seconds=60)


def ports(rank, directory):
    path = os.path.join(directory, "ports.json")
    if rank == 0:
        servers = (
            c10d.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False),
            tdist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False),
        )
        with open(path + ".tmp", "w") as f:
            json.dump([s.port for s in servers], f)
        os.rename(path + ".tmp", path)
        return servers, servers[0].port, servers[1].port
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no ports from rank 0 in {path} after 60 s")
        time.sleep(0.02)
    with open(path) as f:
        ours, theirs = json.load(f)
    return (), ours, theirs


def main():
    rank, world, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    servers, c10d_port, torch_port = ports(rank, directory)
    # torch's group rendezvous through c10d's server, c10d's through torch's.
    torch_store = tdist.TCPStore("127.0.0.1", c10d_port, None, False, TIMEOUT)
    c10d_store = c10d.TCPStore("127.0.0.1", torch_port, None, False, TIMEOUT)
    tdist.init_process_group(
        "gloo", store=torch_store, rank=rank, world_size=world, timeout=TIMEOUT
    )
    c10d.init_process_group("gloo", store=c10d_store, rank=rank, world_size=world, timeout=TIMEOUT)
    expected = sum(range(1, world + 1))
    for n in (1, 1000, 1 << 18):
        t = torch.full((n,), float(rank + 1))
        tdist.all_reduce(t)
        assert torch.equal(t, torch.full((n,), float(expected))), ("torch gloo", n, t[:4])
        u = torch.full((n,), float(rank + 1))
        c10d.all_reduce(u)  # a torch tensor through c10d, in place
        assert torch.equal(u, torch.full((n,), float(expected))), ("c10d gloo", n, u[:4])
        a = np.full(n, rank + 1, np.int64)
        c10d.all_reduce(a)
        assert (a == expected).all(), ("c10d gloo numpy", n, a[:4])
    # Interleaved, and each side's broadcast and all_gather too.
    b = torch.arange(8, dtype=torch.float32) * (rank + 1)
    tdist.broadcast(b, src=1)
    c = torch.arange(8, dtype=torch.float32) * (rank + 1)
    c10d.broadcast(c, src=1)
    assert torch.equal(b, torch.arange(8, dtype=torch.float32) * 2) and torch.equal(b, c)
    gathered = [torch.empty(3) for _ in range(world)]
    tdist.all_gather(gathered, torch.full((3,), float(rank)))
    ours = [torch.empty(3) for _ in range(world)]
    c10d.all_gather(ours, torch.full((3,), float(rank)))
    for r in range(world):
        assert torch.equal(gathered[r], torch.full((3,), float(r))) and torch.equal(
            ours[r], gathered[r]
        )
    tdist.barrier()
    c10d.barrier()
    c10d.destroy_process_group()
    tdist.destroy_process_group()
    del servers
    print(f"rank {rank}: interop ok (torch {torch.__version__}, numpy {np.__version__})")


if __name__ == "__main__":
    main()
