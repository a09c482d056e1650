"""Times one collective on one backend for two builds of c10d side by side (two `python`
directories, e.g. this tree and a worktree of an earlier commit), in interleaved rounds, and
prints the medians and their ratio: how much a change costs or gains.

    python bench/tree_compare.py --trees /tmp/old/python,python --backend gloo --sizes 4,1M

Each round launches both builds in turn (c10d.run, or mpirun for "mpi") on --nproc ranks; a
launch times --iters calls per size after a warm-up and reports rank 0's median per call.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import json, os, sys, time
import numpy as np
import c10d as dist

backend, op, sizes, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
out = {}
for size in [int(s) for s in sizes.split(",")]:
    n = max(1, size // 4)
    x = np.ones(n, np.float32)
    big = np.zeros(n * world, np.float32)
    call = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(big, x),
        "gather": lambda: dist.gather(x, [np.zeros(n, np.float32) for _ in range(world)]
                                      if rank == 0 else None, 0),
    }[op]
    for _ in range(max(5, iters // 10)):
        call()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    out[size] = times[len(times) // 2] * 1e6
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def launch(tree, worker, backend, op, sizes, iters, nproc, timeout):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    args = [backend, op, ",".join(map(str, sizes)), str(iters)]
    if backend == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nproc)]
        cmd += [sys.executable, worker] + args
    else:
        cmd = [sys.executable, "-m", "c10d.run", "--nproc-per-node", str(nproc), worker] + args
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[len("RESULT ") :]).items()}
    raise RuntimeError(f"{tree}: no result (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="two python directories: before,after")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--sizes", default="4,1M")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    trees = a.trees.split(",")
    if len(trees) != 2:
        p.error("--trees takes two directories")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    runs = {t: {s: [] for s in sizes} for t in trees}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
    try:
        for r in range(a.rounds):
            for t in trees if r % 2 == 0 else reversed(trees):
                got = launch(t, f.name, a.backend, a.op, sizes, a.iters, a.nproc, a.timeout)
                for s, us in got.items():
                    runs[t][s].append(us)
    finally:
        os.unlink(f.name)
    before, after = trees
    print(f"{a.op} on {a.backend}, {a.nproc} ranks, median of {a.rounds} interleaved rounds (us)")
    print(f"{'bytes':>10} {'before':>10} {'after':>10} {'after/before':>13}")
    for s in sizes:
        b, c = statistics.median(runs[before][s]), statistics.median(runs[after][s])
        print(f"{s:>10} {b:>10.1f} {c:>10.1f} {c / b:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
