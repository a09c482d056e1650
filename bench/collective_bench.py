"""Collective benchmark in the style of nccl-tests: time per call, algbw and busbw for every
collective from 4 B to 64 MiB, on c10d and (with --compare) on PyTorch's torch.distributed
and mpi4py/Open MPI in the same run, with ratios.

    /usr/bin/python3 bench/collective_bench.py --nproc 2 --backend gloo --compare
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# all_gather and reduce_scatter are the into-tensor forms (all_gather_into_tensor,
# reduce_scatter_tensor); the _list forms take and fill lists of arrays; all_to_all is
# all_to_all_single; send_recv is one message round the ring (each rank sends to the next and
# receives from the one before); barrier has no size and runs at the first one only.
OPS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_list",
    "reduce_scatter",
    "reduce_scatter_list",
    "all_to_all",
    "gather",
    "scatter",
    "send_recv",
    "barrier",
]
SIZELESS = {"barrier"}


def busbw_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("broadcast", "reduce", "send_recv"):
        return 1.0
    if op in SIZELESS:
        return 0.0
    return (n - 1) / n


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def sizes(min_bytes: int, max_bytes: int, factor: int):
    s = min_bytes
    while s <= max_bytes:
        yield s
        s *= factor


def iterations(size: int, scale: float, rounds: int = 1) -> int:
    """Timed calls per size in one round; `rounds` rounds share what one round would make, but
    every round times at least 8 (with 3, one preempted call moved a 16 MiB row by 40%)."""
    total = max(8, min(2000, int(scale * 64e6 / max(size, 64))))
    return max(8, -(-total // rounds))


# ---------------------------------------------------------------------------------------------
# Workers: one per rank, one per implementation.


class C10dImpl:
    """c10d with `backend`; "shm-zc" is the shm backend on arrays from c10d.shm_empty (the
    zero-copy path)."""

    def __init__(self, backend):
        sys.path.insert(0, os.path.join(REPO, "python"))
        import c10d as dist

        self.zero_copy = backend == "shm-zc"
        dist.init_process_group("shm" if self.zero_copy else backend)
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def make(self, count, dtype):
        if self.zero_copy:
            a = self.dist.shm_empty(count, np.dtype(dtype).name)
            a[...] = 1
            return a
        return np.ones(count, dtype=dtype)

    def op(self, name, count, dtype):
        d, n, rank = self.dist, self.world, self.rank
        per = max(count // n, 1)
        if name == "all_reduce":
            t = self.make(count, dtype)
            return lambda: d.all_reduce(t)
        if name == "broadcast":
            t = self.make(count, dtype)
            return lambda: d.broadcast(t, 0)
        if name == "reduce":
            t = self.make(count, dtype)
            return lambda: d.reduce(t, 0)
        if name == "all_gather":
            out, inp = self.make(per * n, dtype), self.make(per, dtype)
            return lambda: d.all_gather_into_tensor(out, inp)
        if name == "all_gather_list":
            outs, inp = [self.make(per, dtype) for _ in range(n)], self.make(per, dtype)
            return lambda: d.all_gather(outs, inp)
        if name == "reduce_scatter":
            out, inp = self.make(per, dtype), self.make(per * n, dtype)
            return lambda: d.reduce_scatter_tensor(out, inp)
        if name == "reduce_scatter_list":
            out, ins = self.make(per, dtype), [self.make(per, dtype) for _ in range(n)]
            return lambda: d.reduce_scatter(out, ins)
        if name == "all_to_all":
            out, inp = self.make(per * n, dtype), self.make(per * n, dtype)
            return lambda: d.all_to_all_single(out, inp)
        if name == "gather":
            inp = self.make(per, dtype)
            outs = [self.make(per, dtype) for _ in range(n)] if rank == 0 else None
            return lambda: d.gather(inp, outs, 0)
        if name == "scatter":
            out = self.make(per, dtype)
            ins = [self.make(per, dtype) for _ in range(n)] if rank == 0 else None
            return lambda: d.scatter(out, ins, 0)
        if name == "send_recv":
            if n == 1:
                raise KeyError("send_recv needs two ranks")
            out, inp = self.make(count, dtype), self.make(count, dtype)
            to, frm = (rank + 1) % n, (rank - 1) % n

            def send_recv():
                work = d.isend(inp, to)
                d.recv(out, frm)
                work.wait()

            return send_recv
        if name == "barrier":
            return lambda: d.barrier()
        raise KeyError(name)

    def barrier(self):
        self.dist.barrier()

    def max_over_ranks(self, value):
        t = np.array([value], np.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def close(self):
        self.dist.destroy_process_group()


class TorchImpl(C10dImpl):
    def __init__(self, backend):
        import warnings

        import torch
        import torch.distributed as dist

        # torch 2.13 deprecates the into-tensor names it still runs; the warning is not data.
        warnings.filterwarnings("ignore", category=FutureWarning)
        torch.set_num_threads(1)
        if backend != "gloo":  # one of c10d's backends inside torch ("c10d_shm")
            import c10d.torch_backend  # noqa: F401
        dist.init_process_group(backend)
        self.torch, self.dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def make(self, count, dtype):
        return self.torch.from_numpy(np.ones(count, dtype=dtype))

    def op(self, name, count, dtype):
        d, n = self.dist, self.world
        per = max(count // n, 1)
        if name == "all_gather":
            out, inp = self.make(per * n, dtype), self.make(per, dtype)
            return lambda: d.all_gather_into_tensor(out, inp)
        if name == "reduce_scatter":
            out, inp = self.make(per, dtype), self.make(per * n, dtype)
            return lambda: d.reduce_scatter_tensor(out, inp)
        return super().op(name, count, dtype)

    def max_over_ranks(self, value):
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])


class MpiImpl:
    def __init__(self, backend):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.rank, self.comm.size

    def op(self, name, count, dtype):
        c, MPI, n = self.comm, self.MPI, self.world
        per = max(count // n, 1)
        if name == "all_reduce":
            t = np.ones(count, dtype)
            return lambda: c.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)
        if name == "broadcast":
            t = np.ones(count, dtype)
            return lambda: c.Bcast(t, root=0)
        if name == "reduce":
            t, out = np.ones(count, dtype), np.ones(count, dtype)
            return lambda: c.Reduce(t, out, op=MPI.SUM, root=0)
        if name == "all_gather":
            out, inp = np.ones(per * n, dtype), np.ones(per, dtype)
            return lambda: c.Allgather(inp, out)
        if name == "all_gather_list":  # MPI has no list form: the same bytes into one buffer
            return self.op("all_gather", count, dtype)
        if name in ("reduce_scatter", "reduce_scatter_list"):
            out, inp = np.ones(per, dtype), np.ones(per * n, dtype)
            return lambda: c.Reduce_scatter_block(inp, out, op=MPI.SUM)
        if name == "send_recv":
            if n == 1:
                raise KeyError("send_recv needs two ranks")
            out, inp = np.ones(count, dtype), np.ones(count, dtype)
            to, frm = (self.rank + 1) % n, (self.rank - 1) % n
            return lambda: c.Sendrecv(inp, to, recvbuf=out, source=frm)
        if name == "barrier":
            return lambda: c.Barrier()
        if name == "all_to_all":
            out, inp = np.ones(per * n, dtype), np.ones(per * n, dtype)
            return lambda: c.Alltoall(inp, out)
        if name == "gather":
            out, inp = np.ones(per * n, dtype), np.ones(per, dtype)
            return lambda: c.Gather(inp, out, root=0)
        if name == "scatter":
            out, inp = np.ones(per, dtype), np.ones(per * n, dtype)
            return lambda: c.Scatter(inp, out, root=0)
        raise KeyError(name)

    def barrier(self):
        self.comm.Barrier()

    def max_over_ranks(self, value):
        return self.comm.allreduce(value, op=self.MPI.MAX)

    def close(self):
        pass


def worker(args) -> int:
    impl = {"c10d": C10dImpl, "torch": TorchImpl, "mpi": MpiImpl}[args.impl](args.backend)
    dtype = np.dtype(args.dtype)
    results = []
    # Warm up for at least 50 ms before the first measurement, for every implementation alike;
    # without it the first size pays for cold caches and clock ramp-up. Ranks agree on when to
    # stop (max over ranks), so they issue the same number of calls. With all_reduce, which
    # every peer has.
    warm = impl.op("all_reduce", 1, dtype)
    start = time.perf_counter()
    while impl.max_over_ranks(time.perf_counter() - start) < 0.05:
        for _ in range(100):
            warm()
    for name in args.ops.split(","):
        all_sizes = (
            [parse_size(x) for x in args.sizes.split(",")]
            if args.sizes
            else sizes(args.min_bytes, args.max_bytes, args.factor)
        )
        for size in all_sizes[:1] if name in SIZELESS else all_sizes:
            count = max(size // dtype.itemsize, 1)
            try:
                fn = impl.op(name, count, dtype)
                iters = iterations(size, args.time_scale, args.rounds)
                # The last warm-up call sets the pace: not the first two, which may pay for
                # moving an array (shm adopts it on its second all_reduce).
                warm = max(4, iters // 10)
                for i in range(warm):
                    if i == warm - 1:  # the last warm-up call estimates the time per call
                        impl.barrier()
                        start = time.perf_counter()
                    fn()
                per_call = impl.max_over_ranks(time.perf_counter() - start)
                # At least --min-seconds of timed calls: 8 calls of a few ms each let one
                # preemption or a short slow spell of the host decide a row.
                iters = max(iters, int(args.min_seconds / max(per_call, 1e-9)))
                impl.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    fn()
                elapsed = (time.perf_counter() - start) / iters
                elapsed = impl.max_over_ranks(elapsed)
                results.append({"op": name, "bytes": count * dtype.itemsize, "us": elapsed * 1e6})
            except Exception as e:  # a peer may lack an op
                results.append(
                    {
                        "op": name,
                        "bytes": count * dtype.itemsize,
                        "us": None,
                        "error": f"{type(e).__name__}: {str(e)[:80]}",
                    }
                )
                try:
                    impl.barrier()
                except Exception:
                    pass
    if impl.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": impl.world, "results": results}, f)
    impl.close()
    return 0


# ---------------------------------------------------------------------------------------------
# Driver


def launch(impl: str, args, out_path: str) -> bool:
    common = [
        __file__,
        "--worker",
        "--impl",
        impl,
        "--out",
        out_path,
        "--backend",
        args.backend,
        "--ops",
        args.ops,
        "--min-bytes",
        str(args.min_bytes),
        "--max-bytes",
        str(args.max_bytes),
        "--factor",
        str(args.factor),
        "--sizes",
        args.sizes,
        "--dtype",
        args.dtype,
        "--time-scale",
        str(args.time_scale),
        "--rounds",
        str(args.rounds),
        "--min-seconds",
        str(args.min_seconds),
    ]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    if args.backend == "shm-zc":
        # Every size's buffers live in the shared heap (touched pages only use memory).
        env.setdefault("C10D_SHM_HEAP_BYTES", str(4 << 30))
    if impl == "mpi":
        env.update(
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            OMPI_MCA_btl="self,vader",
            OMPI_MCA_rmaps_base_oversubscribe="1",
        )
        cmd = [
            "mpirun",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            str(args.nproc),
            sys.executable,
        ] + common
    else:
        cmd = [
            sys.executable,
            "-m",
            "c10d.run",
            "--nproc-per-node",
            str(args.nproc),
            sys.executable if False else common[0],
        ] + common[1:]
    proc = subprocess.run(cmd, env=env, timeout=args.timeout)
    return proc.returncode == 0 and os.path.exists(out_path)


# The host of this project's 2-vCPU guests moves the vCPUs, for minutes at a time, to a
# placement where a cache line's round trip between them takes ~500 ns instead of ~100 and
# stores into lines the other CPU reads cost several times more (c10d's shm backend switches
# to streaming stores there; Open MPI's large transfers, single copies through the kernel,
# barely notice, while every implementation's small messages slow down). At times it also
# puts them on one physical core (~35-40 ns), where two busy ranks share its execution units
# (shm's 2-rank all_reduce of 4 MiB took 279 us in a run that saw it, 182 in one that did
# not). Columns timed in different placements do not compare, so every launch is bracketed
# by this probe and watched by it while it runs (for a move far apart: the host also moves the
# vCPUs in the middle of launches), and a launch that saw an unusual placement is run again
# once the CPUs are back on separate cores close together, within --placement-budget seconds
# of waiting and reruns per benchmark.
FAR_TRIP_NS = 250
SHARED_CORE_TRIP_NS = 65
WATCH_MS = 100
WATCH_FAR_SHARE = 0.1


def round_trip_ns(probe):
    """The median cache-line round trip between the first two CPUs, or None."""
    if probe is None:
        return None
    try:
        out = subprocess.run([probe], capture_output=True, text=True, timeout=30)
        return int(out.stdout)
    except subprocess.TimeoutExpired:
        print(f"# placement probe {probe} took over 30 s; placement not checked", file=sys.stderr)
        return None
    except ValueError:
        return None


def elsewhere(trip):
    """The unusual placement a round trip shows, or None for the usual one (or no probe)."""
    if trip is None:
        return None
    if trip >= FAR_TRIP_NS:
        return f"far apart (>= {FAR_TRIP_NS} ns)"
    if trip < SHARED_CORE_TRIP_NS:
        return f"on one physical core (< {SHARED_CORE_TRIP_NS} ns)"
    return None


def start_watch(probe):
    """The probe in --watch mode (a round trip every WATCH_MS while a launch runs), or None."""
    if probe is None:
        return None
    try:
        return subprocess.Popen(
            [probe, "--watch", str(WATCH_MS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return None


def stop_watch(watcher):
    """(far, all): how many of the watcher's round trips found the CPUs far apart, of how
    many; None without a watcher or trips. Its trips include two clock reads (~20-40 ns), too
    much to tell one physical core from two close ones: only far apart counts."""
    if watcher is None:
        return None
    watcher.terminate()
    out, _ = watcher.communicate(timeout=30)
    trips = [int(t) for t in out.split() if t.isdigit()]
    return (sum(t >= FAR_TRIP_NS for t in trips), len(trips)) if trips else None


def while_ran(during):
    return "" if during is None else f", far in {during[0]} of {during[1]} checks while it ran"


def where_launch_ran(before, after, during):
    """The unusual placement seen around a launch, or far apart for a while as it ran
    (WATCH_FAR_SHARE of its checks: Gloo's minute-long launches nearly always meet a moment
    of it, and a short one changes a row of one round at most), or None."""
    where = elsewhere(before) or elsewhere(after)
    if where is None and during is not None and during[0] >= max(2, WATCH_FAR_SHARE * during[1]):
        where = f"far apart (>= {FAR_TRIP_NS} ns) while it ran"
    return where


# PyTorch's launches are not run again for their placement: their column sets no target (Open
# MPI's and c10d's Gloo's do), and a launch takes minutes, long enough that the host nearly
# always moves the vCPUs apart during it (an earlier run: five in a row, each close before and far
# after, spent the whole budget). Their placement is still reported.
NOT_RERUN = ("torch",)


# The launches that take minutes (c10d's gloo backend, PyTorch): --slow-rounds of them. The
# others take seconds, so more rounds of them cost little and steady the medians their
# ratios are judged on (one slow round of 3 decided a row in earlier runs).
SLOW = ("c10d-gloo", "torch")


def rounds_text(rounds_of) -> str:
    """'3 interleaved rounds', or '7 interleaved rounds (c10d-gloo: 3, torch: 3)'."""
    most = max(rounds_of.values())
    text = f"{most} interleaved round{'s' if most != 1 else ''}"
    fewer = [f"{label}: {n}" for label, n in rounds_of.items() if n != most]
    return text + (f" ({', '.join(fewer)})" if fewer else "")


def launch_close(impl, args, out_path, probe, budget, label):
    """launch(), run again while the probe found the CPUs in an unusual placement before or
    after it (or far apart while it ran), as long as budget[0] (seconds of waiting and reruns
    left) lasts; implementations in NOT_RERUN only wait for a close start. Returns whether the
    last launch worked and the round trips around it (before, after, stop_watch's count while
    it ran)."""
    while True:
        before = round_trip_ns(probe)
        while elsewhere(before) and budget[0] > 0:
            time.sleep(2)
            budget[0] -= 2
            before = round_trip_ns(probe)
        start = time.monotonic()
        watcher = start_watch(probe)
        try:
            ok = launch(impl, args, out_path)
        finally:  # a launch that timed out must not leave the watcher running
            during = stop_watch(watcher)
        after = round_trip_ns(probe)
        where = where_launch_ran(before, after, during)
        if not ok or not where or budget[0] <= 0 or impl in NOT_RERUN:
            return ok, (before, after, during)
        budget[0] -= time.monotonic() - start
        print(
            f"# {label}: the CPUs were {where} around this launch (cache-line round trip "
            f"{before} ns before, {after} ns after{while_ran(during)}): running it again",
            file=sys.stderr,
            flush=True,
        )


def placement_summary(trips) -> str:
    """One line on the placement every launch ran in (trips: label -> [(before, after,
    stop_watch's count)])."""
    seen = [t for runs in trips.values() for run in runs for t in run[:2] if t is not None]
    if not seen:
        return "# placement: not checked (no placement probe: see --placement-probe)"
    odd = {}  # unusual placement -> the launches it was seen around
    for label, runs in trips.items():
        for k, (before, after, during) in enumerate(runs):
            where = where_launch_ran(before, after, during)
            if where:
                odd.setdefault(where, []).append(
                    f"{label} round {k + 1} ({before} -> {after} ns{while_ran(during)})"
                )
    close = [t for t in seen if not elsewhere(t)]
    text = (
        f"# placement: cache-line round trip between the CPUs around the launches "
        f"{min(seen)}-{max(seen)} ns"
    )
    if not odd:
        return text + (
            f"; none on one physical core (< {SHARED_CORE_TRIP_NS} ns); every "
            f"launch ran with the CPUs close (< {FAR_TRIP_NS} ns, also while it ran)"
        )
    for where, launches in odd.items():
        text += f"; {where} around: {', '.join(launches)}"
    return text + (f"; close otherwise ({min(close)}-{max(close)} ns)" if close else "")


def peers_available():
    found = []
    probe = "import torch.distributed as d; assert d.is_available()"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        found.append("torch")
    if (
        shutil.which("mpirun")
        and subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode
        == 0
    ):
        found.append("mpi")
    return found


def python_overhead_us(backend: str, iters: int = 20000) -> float:
    """Per-call cost of c10d's Python path: all_reduce of 4 bytes on a one-rank group, where
    the backend has (almost) nothing to do. With "shm" that is the inline path; with "fake"
    (FakeProcessGroup, no inline path) the general one with options and Work objects."""
    code = f"""
import sys, time, numpy as np
sys.path.insert(0, {os.path.join(REPO, "python")!r})
import c10d as dist
dist.init_process_group({backend!r}, store=dist.HashStore(), rank=0, world_size=1)
t = np.ones(1, np.float32)
for _ in range(1000): dist.all_reduce(t)
best = 1e9
for _ in range(5):
    s = time.perf_counter()
    for _ in range({iters}): dist.all_reduce(t)
    best = min(best, (time.perf_counter() - s) / {iters})
print(best * 1e6)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(out.stdout.strip()) if out.returncode == 0 else float("nan")


def median_of_rounds(rounds):
    """One result per (op, bytes): the median of the rounds' times (those that ran), with
    every round's time under "rounds_us"."""
    merged = {}
    for results in rounds:
        for r in results:
            row = merged.setdefault((r["op"], r["bytes"]), dict(r, rounds_us=[]))
            row["rounds_us"].append(r["us"])
    for row in merged.values():
        times = [us for us in row["rounds_us"] if us]
        row["us"] = statistics.median(times) if times else None
        if times:
            row.pop("error", None)
    return list(merged.values())


def fmt_size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def report(all_results, args, world):
    impls = list(all_results)
    w = max(13, max(len(i) for i in impls) + 4)
    lines = []
    header = f"{'op':<15}{'size':>10}"
    for impl in impls:
        header += f"{impl + ' us':>{w}}{'GB/s':>8}"
    for impl in impls[1:]:
        header += f"{'vs ' + impl:>{w}}"
    lines.append(header)
    base = {(r["op"], r["bytes"]): r for r in all_results[impls[0]]}
    for key, r0 in base.items():
        op, nbytes = key
        row = f"{op:<15}{fmt_size(nbytes):>10}"
        times = {}
        for impl in impls:
            r = next((x for x in all_results[impl] if (x["op"], x["bytes"]) == key), None)
            us = r["us"] if r else None
            times[impl] = us
            if us:
                busbw = nbytes / (us * 1e-6) * busbw_factor(op, world) / 1e9
                row += (
                    f"{us:>{w}.1f}{busbw:>8.3f}" if op not in SIZELESS else f"{us:>{w}.1f}{'':>8}"
                )
            else:
                row += f"{'n/a':>{w}}{'':>8}"
        behind = False
        for impl in impls[1:]:
            if times[impl] and times[impls[0]]:
                ratio = times[impl] / times[impls[0]]
                behind |= ratio < 1
                row += f"{ratio:>{w - 1}.2f}x"
            else:
                row += f"{'-':>{w}}"
        # A peer faster than the first column: marked, so that nobody misses it.
        lines.append(row + ("  <-- behind" if behind else ""))
    return "\n".join(lines)


def plot(all_results, world, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({r["op"] for r in next(iter(all_results.values()))})
    fig, axes = plt.subplots(len(ops), 1, figsize=(7, 3 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        for impl, results in all_results.items():
            pts = [
                (r["bytes"], r["bytes"] / (r["us"] * 1e-6) * busbw_factor(op, world) / 1e9)
                for r in results
                if r["op"] == op and r["us"]
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {world} ranks")
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw GB/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--backend",
        default="shm",
        help="c10d backend(s), comma-separated: shm, shm-zc (shm on shm_empty arrays), gloo",
    )
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-bytes", type=parse_size, default=4)
    p.add_argument("--max-bytes", type=parse_size, default=64 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument(
        "--sizes",
        default="",
        help="these sizes (e.g. 4,1K,1M) instead of --min-bytes to --max-bytes",
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="scales the iteration counts (lower = quicker, noisier)",
    )
    p.add_argument(
        "--min-seconds",
        type=float,
        default=0.02,
        help="time every size for at least this long per round",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every implementation this many times, interleaved, sharing the "
        "iterations of one run, and report the median per size",
    )
    p.add_argument(
        "--slow-rounds",
        type=int,
        default=None,
        help="rounds for the launches that take minutes (c10d's gloo backend and "
        "PyTorch), whose columns are compared only coarsely (default: --rounds)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run torch.distributed (gloo) and mpi4py when installed",
    )
    p.add_argument(
        "--peers",
        default="torch,mpi",
        help="with --compare, which of the installed peers to run (comma-separated)",
    )
    p.add_argument("--plot", default=None, help="write a busbw-vs-size PNG here")
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument(
        "--placement-probe",
        default=os.path.join(REPO, "build", "bench", "placement_probe"),
        help="the program built from bench/placement_probe.cc",
    )
    p.add_argument(
        "--placement-budget",
        type=float,
        default=240,
        help="seconds this run may spend waiting for the CPUs to be close and "
        "running again launches they were far apart around (0: no checks)",
    )
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="c10d", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    runs = [("c10d", b) for b in args.backend.split(",")]
    wanted = args.peers.split(",")
    peers = [p for p in peers_available() if p in wanted] if args.compare else []
    runs += [(peer, "gloo") for peer in peers]
    if "torch" in peers:
        runs.append(("torch", "c10d_shm"))  # torch.distributed calls on c10d's shm backend
    runs = [
        (
            impl,
            backend,
            f"c10d-{backend}"
            if impl == "c10d"
            else impl
            if backend == "gloo"
            else f"{impl}+{backend}",
        )
        for impl, backend in runs
    ]
    rounds_of = {
        label: args.slow_rounds if label in SLOW and args.slow_rounds is not None else args.rounds
        for _, _, label in runs
    }
    # Every implementation runs once per round, the rounds one after another, so that a slow
    # spell of this shared machine (they last seconds to minutes) hits all of them alike
    # instead of the one that happened to run then; each row is the median over the rounds.
    per_round = {}
    trips = {}
    probe = args.placement_probe if os.access(args.placement_probe, os.X_OK) else None
    if args.placement_budget <= 0:
        probe = None
    budget = [args.placement_budget]
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(max(rounds_of.values())):
            for impl, backend, label in runs:
                if k >= rounds_of[label]:
                    continue
                out = os.path.join(tmp, f"{label}.{k}.json")
                print(
                    f"# round {k + 1}/{rounds_of[label]}: running {label} on {args.nproc} "
                    f"ranks ...",
                    file=sys.stderr,
                    flush=True,
                )
                launch_args = dict(vars(args), backend=backend, rounds=rounds_of[label])
                ok, around = launch_close(
                    impl, argparse.Namespace(**launch_args), out, probe, budget, label
                )
                trips.setdefault(label, []).append(around)
                if ok:
                    with open(out) as f:
                        per_round.setdefault(label, []).append(json.load(f)["results"])
                else:
                    print(f"# {label} failed in round {k + 1}", file=sys.stderr)
    all_results = {label: median_of_rounds(rounds) for label, rounds in per_round.items()}
    if not all_results:
        return 1
    print(
        f"# {args.nproc} ranks, dtype {args.dtype}, time per call (max over ranks; median of "
        f"{rounds_text(rounds_of)}), busbw as nccl-tests; 'vs X' = X's time / first column's "
        f"(> 1: first is faster)"
    )
    print(report(all_results, args, args.nproc))
    print(placement_summary(trips))
    print(
        f"# Python overhead of a sync c10d all_reduce of 4 B on 1 rank: "
        f"{python_overhead_us('shm'):.2f} us/call (shm: inline path), "
        f"{python_overhead_us('fake'):.2f} us/call (fake backend: general path)"
    )
    if args.plot:
        plot(all_results, args.nproc, args.plot)
        print(f"# plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
