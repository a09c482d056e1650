"""all_reduce time per call by size on the shm backend, ordinary or shm_empty arrays: the
best and the median of 5 timings of 50 calls each, printed by rank 0.

    python3 -m c10d.run --nproc-per-node 2 bench/allreduce_sizes.py [--shm-empty]
"""

import argparse
import time

import numpy as np

import c10d as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shm-empty", action="store_true", help="arrays from c10d.shm_empty")
    parser.add_argument("--kib", default="256,512,768,1024,1536,2048,4096")
    args = parser.parse_args()
    dist.init_process_group("shm")
    row = []
    for kib in (int(k) for k in args.kib.split(",")):
        n = kib * 256  # float32
        t = dist.shm_empty(n, np.float32) if args.shm_empty else np.ones(n, np.float32)
        t[:] = 1
        for _ in range(20):
            dist.all_reduce(t)
        times = []
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(50):
                dist.all_reduce(t)
            times.append((time.perf_counter() - start) / 50 * 1e6)
        times.sort()
        row.append(f"{kib} KiB {times[0]:.0f}/{times[2]:.0f} us")
        del t
    if dist.get_rank() == 0:
        print("; ".join(row))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
