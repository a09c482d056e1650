"""torch.distributed on c10d's shm backend (c10d.torch_backend) against torch's own Gloo, in
one run: all_reduce of 4 B and 16 MiB, and a DistributedDataParallel step of a ~10.5M-parameter
MLP; rounds interleaved, medians, printed by rank 0; and whether 20 DDP steps of that MLP give
the same parameters on both. The 4 B all_reduce also runs on torch's fake backend, which
moves nothing: what torch's own dispatch costs a call, so that the rest of the plugin's time is
c10d's (the glue and the collective).

    python3 -m c10d.run --nproc-per-node 2 bench/torch_backend_bench.py [--rounds 5]
"""

import argparse
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP

import c10d.torch_backend  # noqa: F401  (registers c10d_shm)

try:  # registers torch's "fake" backend
    import torch.testing._internal.distributed.fake_pg  # noqa: F401
except ImportError:
    pass


def timed(fn, calls):
    for _ in range(max(3, calls // 10)):
        fn()
    tdist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = torch.tensor([(time.perf_counter() - start) / calls * 1e6], dtype=torch.float64)
    tdist.all_reduce(elapsed, op=tdist.ReduceOp.MAX)  # the slowest rank's time per call
    return float(elapsed[0])


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 1024),
    )


def trained(group, steps=20):
    """The MLP's parameters after `steps` DDP steps over `group` (fixed seeds, rank-dependent
    data)."""
    ddp = DDP(mlp(), process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + tdist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(32, 1024, generator=gen)).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in ddp.module.parameters()]


def ddp_step(group):
    ddp = DDP(mlp(), process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(32, 1024)

    def step():
        opt.zero_grad()
        ddp(x).sum().backward()
        opt.step()

    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", timeout=timedelta(seconds=120))
    groups = {
        "torch gloo": tdist.group.WORLD,
        "torch + c10d_shm": tdist.new_group(backend="c10d_shm"),
    }
    try:
        fake = tdist.new_group(backend="fake")
    except (RuntimeError, ValueError):
        fake = None
    cases = {
        "all_reduce 4 B": (lambda g: lambda t=torch.ones(1): tdist.all_reduce(t, group=g), 3000),
        "all_reduce 16 MiB": (
            lambda g: lambda t=torch.ones(4 << 20): tdist.all_reduce(t, group=g),
            20,
        ),
        "DDP step (10.5M parameters)": (ddp_step, 10),
    }
    times = {(case, name): [] for case in cases for name in groups}
    dispatch = []  # the 4 B all_reduce on the fake backend
    for _ in range(args.rounds):
        for case, (make, calls) in cases.items():
            for name, group in groups.items():
                times[(case, name)].append(timed(make(group), calls))
        if fake is not None:
            dispatch.append(timed(cases["all_reduce 4 B"][0](fake), 3000))
    # The same 20 training steps on both: SUM of two ranks is one addition, so the
    # parameters are bitwise equal at 2 ranks; with more, the summation order may differ.
    pairs = list(zip(*(trained(g) for g in groups.values())))
    same = all(torch.equal(a, b) for a, b in pairs)
    worst = max(float(((a - b).abs() / b.abs().clamp_min(1e-12)).max()) for a, b in pairs)
    if tdist.get_rank() == 0:
        print(
            f"# parameters after 20 DDP steps of the MLP, torch gloo vs torch + c10d_shm: "
            f"{'bitwise equal' if same else f'largest relative difference {worst:.2e}'}"
        )
        print(
            f"# {tdist.get_world_size()} ranks, torch {torch.__version__}, median of "
            f"{args.rounds} interleaved rounds, µs per call"
        )
        print("| case | torch gloo | torch + c10d_shm | speed-up |")
        print("| --- | --- | --- | --- |")
        for case in cases:
            g = statistics.median(times[(case, "torch gloo")])
            c = statistics.median(times[(case, "torch + c10d_shm")])
            print(f"| {case} | {g:.1f} | {c:.1f} | {g / c:.1f}x |")
        if dispatch:
            floor = statistics.median(dispatch)
            c = statistics.median(times[("all_reduce 4 B", "torch + c10d_shm")])
            print(
                f"# all_reduce 4 B: torch's dispatch (fake backend) {floor:.1f} µs a call; "
                f"c10d's part of torch + c10d_shm (glue and collective) {c - floor:.1f} µs"
            )
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
