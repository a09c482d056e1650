"""Store demo: N local processes rendezvous on a TCPStore hosted by rank 0, exchange values
and pass a store barrier. `make run` runs this until collectives land.

    PYTHONPATH=python .venv/bin/python examples/store_demo.py --nproc 4
"""

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta


def worker(rank: int, world: int, port: int) -> None:
    import c10d

    store = c10d.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=30))
    store.set(f"hello/{rank}", f"rank {rank} pid {os.getpid()}")
    arrived = store.add("arrived", 1)
    store.wait([f"hello/{r}" for r in range(world)])
    peers = store.multi_get([f"hello/{r}" for r in range(world)])
    start = time.perf_counter()
    for i in range(1000):
        store.add("counter", 1)
    per_add_us = (time.perf_counter() - start) * 1e6 / 1000
    if store.add("done", 1) == world:  # the last rank to finish releases everyone
        store.set("all_done", "1")
    store.wait(["all_done"])
    print(
        f"[rank {rank}] arrived #{arrived}, saw {[p.decode() for p in peers]}, "
        f"add() {per_add_us:.1f} us/op",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args.rank, args.nproc, args.port)
        return 0

    import c10d

    # The launcher hosts the store; the ranks are clients. world_size counts them + us.
    server = c10d.TCPStore(
        "127.0.0.1",
        0,
        args.nproc + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=30),
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--nproc",
                str(args.nproc),
                "--rank",
                str(r),
                "--port",
                str(server.port),
            ]
        )
        for r in range(args.nproc)
    ]
    server.wait(["all_done"])
    codes = [p.wait(timeout=60) for p in procs]
    total = int(server.get("counter"))
    print(
        f"{args.nproc} ranks on TCPStore port {server.port}: counter = {total} "
        f"(expected {1000 * args.nproc}), exit codes {codes}"
    )
    return 0 if total == 1000 * args.nproc and not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
