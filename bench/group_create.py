"""Times creating a process group (new_group over every rank, then one all_reduce on it) on
c10d's backends and on torch's Gloo, in interleaved rounds, and prints the medians and their
ratios to torch's Gloo. torch is needed for its side (pip install torch==2.13.0).

    python bench/group_create.py --nproc 2,4 --backends shm,gloo --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import json, sys, time
kind, backend, groups = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "torch":
    import torch
    import torch.distributed as dist
    ones = lambda: torch.ones(1)
else:
    import numpy as np
    import c10d as dist
    ones = lambda: np.ones(1, np.float32)
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
times = []
for _ in range(groups):
    dist.barrier()
    start = time.perf_counter()
    group = dist.new_group(list(range(world)))
    dist.all_reduce(ones(), group=group)
    times.append(time.perf_counter() - start)
if rank == 0:
    print("RESULT " + json.dumps(sorted(times)[len(times) // 2] * 1e3))
dist.destroy_process_group()
"""


def launch(kind, backend, nproc, groups, path, timeout):
    launcher = "torch.distributed.run" if kind == "torch" else "c10d.run"
    cmd = [sys.executable, "-m", launcher, "--nproc-per-node", str(nproc)]
    cmd += [path, kind, backend, str(groups)]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "python"))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{kind} {backend} at {nproc} ranks failed:\n{out.stdout}\n{out.stderr}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--backends", default="shm,gloo", help="c10d's backends to time")
    p.add_argument("--groups", type=int, default=20, help="groups created per launch")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    configs = [("torch", "gloo")] + [("c10d", b) for b in args.backends.split(",")]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
    try:
        for nproc in [int(n) for n in args.nproc.split(",")]:
            samples = {c: [] for c in configs}
            for _ in range(args.rounds):
                for c in configs:  # interleaved: every round runs every configuration
                    samples[c].append(launch(*c, nproc, args.groups, f.name, args.timeout))
            base = statistics.median(samples[("torch", "gloo")])
            print(f"new_group + one all_reduce, {nproc} ranks, median of {args.rounds} rounds")
            for c in configs:
                m = statistics.median(samples[c])
                print(f"  {c[0]:>5} {c[1]:<5} {m:8.2f} ms  {m / base:6.2f}x torch's gloo")
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    main()
