"""all_reduce across test hosts (network namespaces joined by rate-limited veth links, see
tests/python/netns.py; needs root): c10d's hierarchical backend, c10d's Gloo, PyTorch's Gloo
and Open MPI (mpi4py, started by mpirun through the hosts' launch agent; when installed) side
by side, rounds interleaved, medians; 2 hosts x 2 ranks and 4 hosts x 1 rank, at each link
rate. busbw is against the link rate (the physical limit of a host's one link).

    python3 bench/multihost_bench.py [--rates 10gbit,1gbit] [--rounds 3]
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import netns  # noqa: E402

PORT = 29400
IMPLS = {  # label: (worker impl, backend, extra environment)
    "c10d hier": ("c10d", "hier", {}),
    "c10d gloo": ("c10d", "gloo", {}),
    # all_reduce on Gloo's own algorithm and transport instead of c10d's ring.
    "c10d gloo, no ring": ("c10d", "gloo", {"C10D_GLOO_RING": "0"}),
    # torch's Gloo listens where the hostname resolves (127.0.1.1 here): it needs the interface.
    "torch gloo": ("torch", "gloo", {"GLOO_SOCKET_IFNAME": "eth0"}),
    # Open MPI's defaults, but for the transports: shared memory in a host, TCP on the test
    # hosts' subnet between them.
    "open mpi": (
        "mpi",
        "mpi",
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
    ),
}


def mpi_runs() -> bool:
    """Whether mpirun and mpi4py are there (make venv-bench installs mpi4py)."""
    if shutil.which("mpirun") is None:
        return False
    probe = [sys.executable, "-c", "import mpi4py.MPI"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return float(rate)


def launch(hosts, nproc, label, args, out_path):
    impl, backend, extra = IMPLS[label]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **extra)
    if impl != "torch":
        env.pop("GLOO_SOCKET_IFNAME", None)
    worker = [
        os.path.join(HERE, "collective_bench.py"),
        "--worker",
        "--impl",
        impl,
        "--out",
        out_path,
        "--backend",
        backend,
        "--ops",
        "all_reduce",
        "--min-bytes",
        str(args.min_bytes),
        "--max-bytes",
        str(args.max_bytes),
        "--factor",
        "4",
        "--dtype",
        "float32",
        "--time-scale",
        str(args.time_scale),
        "--rounds",
        "1",
        "--min-seconds",
        str(args.min_seconds),
    ]
    if impl == "mpi":
        procs = [
            hosts.popen(
                0,
                hosts.mpirun_argv(nproc) + [sys.executable] + worker,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        ]
    else:
        # A rendezvous of its own per launch: a launcher must never join the previous one's.
        rdzv_id = os.path.basename(out_path).replace(" ", "_")
        procs = [
            hosts.popen(
                i,
                hosts.launcher_argv(nproc, PORT, rdzv_id) + worker,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(hosts.count)
        ]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append(err[-1500:])
    if errors or not os.path.exists(out_path):
        print(f"# {label} failed:\n" + "\n".join(errors), file=sys.stderr)
        return None
    with open(out_path) as f:
        return {r["bytes"]: r["us"] for r in json.load(f)["results"] if r.get("us")}


def run_layout(count, nproc, rate, args, workdir):
    labels = [label for label in IMPLS if nproc > 1 or label != "c10d hier"]
    if not mpi_runs():
        labels.remove("open mpi")
    times = {label: {} for label in labels}
    with netns.Hosts(count, rate=rate) as hosts:
        for k in range(args.rounds):
            for label in labels:
                print(
                    f"# {count} hosts x {nproc} at {rate}, round {k + 1}/{args.rounds}: {label}",
                    file=sys.stderr,
                    flush=True,
                )
                out = os.path.join(workdir, f"out-{count}-{nproc}-{rate}-{k}-{label}.json")
                got = launch(hosts, nproc, label, args, out)
                for size, us in (got or {}).items():
                    times[label].setdefault(size, []).append(us)
    return {
        label: {size: statistics.median(v) for size, v in by.items()} for label, by in times.items()
    }


def report(count, nproc, rate, medians):
    world = count * nproc
    link = rate_bits(rate) / 8  # bytes per second, one direction of a host's link
    labels = list(medians)
    print(
        f"\n## all_reduce, {count} hosts x {nproc} rank{'s' if nproc > 1 else ''}, "
        f"links {rate}: time per call in µs (busbw in GB/s; link {link / 1e9:.3f} GB/s)"
    )
    # Each other implementation's time over c10d's (hier where it runs, else Gloo).
    base_label = "c10d hier" if "c10d hier" in labels else "c10d gloo"
    others = [label for label in labels if label != base_label]
    head = ["size"] + labels + [f"{other} / {base_label}" for other in others]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    sizes = sorted(set().union(*[set(m) for m in medians.values()]))
    for size in sizes:
        row = [
            f"{size} B"
            if size < 1024
            else f"{size >> 10} KiB"
            if size < 1 << 20
            else f"{size >> 20} MiB"
        ]
        for label in labels:
            us = medians[label].get(size)
            busbw = size * 2 * (world - 1) / world / (us * 1e-6) / 1e9 if us else None
            row.append(f"{us:.0f} ({busbw:.3f})" if us else "n/a")
        base = medians[base_label].get(size)
        for other in others:
            them = medians[other].get(size)
            row.append(f"{them / base:.2f}x" if them and base else "-")
        print("| " + " | ".join(row) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="10gbit,1gbit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-bytes", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--min-seconds", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--layouts", default="2x2,4x1", help="hosts x ranks per host, e.g. 2x2,4x1")
    args = p.parse_args()
    reason = netns.available()
    if reason:
        raise SystemExit(f"multihost_bench: cannot make test hosts: {reason}")
    print(f"# {time.strftime('%Y-%m-%d')}: {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory() as workdir:
        for rate in args.rates.split(","):
            for layout in args.layouts.split(","):
                count, nproc = (int(v) for v in layout.split("x"))
                report(count, nproc, rate, run_layout(count, nproc, rate, args, workdir))


if __name__ == "__main__":
    main()
