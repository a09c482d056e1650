"""TCPStore throughput and rendezvous benchmark, c10d against torch.distributed when present.

    PYTHONPATH=python python3 bench/store_bench.py [--ops 20000] [--procs 8]
        [--clients 64,256,1024] [--no-torch]

Measures, for each available implementation, in the same run:
  1. ops/s of set, get and add from one client in this process;
  2. ops/s of a set/get/add mix from --procs client processes together;
  3. the time for N clients (threads, each with its own store object) to connect and pass a
     store barrier (add + wait), and for c10d also N asyncio clients speaking the wire
     protocol directly (one thread, so the server is what is measured).
Then prints c10d/torch ratios. The machine is shared and noisy: compare ratios from one run.
"""

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

TIMEOUT = timedelta(seconds=120)
VALUE = b"x" * 16


def make_store(backend, port, is_master=False):
    if backend == "c10d":
        import c10d

        return c10d.TCPStore(
            "127.0.0.1", port, is_master=is_master, wait_for_workers=False, timeout=TIMEOUT
        )
    import torch.distributed as td

    return td.TCPStore(
        "127.0.0.1", port, is_master=is_master, wait_for_workers=False, timeout=TIMEOUT
    )


def timed(fn, n):
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def single_client(backend, server, ops):
    client = make_store(backend, server.port)
    keys = [f"k{i % 100}" for i in range(ops)]

    def sets(n):
        for k in keys[:n]:
            client.set(k, VALUE)

    def gets(n):
        for k in keys[:n]:
            client.get(k)

    def adds(n):
        for k in keys[:n]:
            client.add("c" + k, 1)

    sets(200), gets(200), adds(200)  # warm-up
    result = {"set": timed(sets, ops), "get": timed(gets, ops), "add": timed(adds, ops)}
    client = None  # closes the connection before the next client's timings
    return result


WORKER = r"""
import sys, time
sys.path.insert(0, sys.argv[5])
from store_bench import make_store, VALUE
backend, port, ops, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = make_store(backend, port)
store.add("ready", 1)
store.wait(["go"])
start = time.perf_counter()
for i in range(ops // 3):
    k = f"w{rank}_{i % 50}"
    store.set(k, VALUE)
    store.get(k)
    store.add("count" + rank, 1)
print(time.perf_counter() - start, flush=True)
"""


def many_processes(backend, server, procs, ops):
    per = ops // procs
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, backend, str(server.port), str(per), str(r), HERE],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(procs)
    ]
    while server.add("ready", 0) < procs:
        time.sleep(0.01)
    server.set("go", b"1")
    elapsed = [float(c.communicate(timeout=600)[0].strip()) for c in children]
    return procs * (per // 3) * 3 / max(elapsed)


def barrier_threads(backend, server, n):
    tag = f"b{n}_{time.monotonic_ns()}"
    errors = []

    def client():
        try:
            s = make_store(backend, server.port)
            if s.add(tag, 1) == n:
                s.set(tag + "go", b"1")
            s.wait([tag + "go"])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} clients failed: {errors[0]}")
    return elapsed


# Raw protocol (PyTorch >= 2.4 TCPStore, which c10d speaks): query byte, u64-length strings.
def _s(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


async def _raw_client(port, n, tag):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 1))
    await reader.readexactly(4)
    writer.write(b"\x04" + _s("/" + tag) + struct.pack("<q", 1))  # ADD
    (count,) = struct.unpack("<q", await reader.readexactly(8))
    if count == n:
        writer.write(b"\x01" + _s("/" + tag + "go") + _s("1"))  # SET
    writer.write(b"\x06" + struct.pack("<Q", 1) + _s("/" + tag + "go"))  # WAIT
    assert await reader.readexactly(1) == b"\x00"
    writer.close()


def barrier_asyncio(server, n):
    tag = f"a{n}_{time.monotonic_ns()}"

    async def run():
        await asyncio.gather(*(_raw_client(server.port, n, tag) for _ in range(n)))

    start = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - start


def bench(backend, args):
    server = make_store(backend, 0, is_master=True)
    out = {
        "single": single_client(backend, server, args.ops),
        "procs": many_processes(backend, server, args.procs, args.ops),
        "barrier": {},
        "barrier_raw": {},
    }
    for n in args.clients:
        try:
            out["barrier"][n] = barrier_threads(backend, server, n)
        except Exception as e:  # noqa: BLE001
            out["barrier"][n] = None
            print(f"  {backend}: {n} thread clients failed: {e}", file=sys.stderr)
        if backend == "c10d":
            out["barrier_raw"][n] = barrier_asyncio(server, n)
    del server
    return out


def report(name, r):
    s = r["single"]
    print(
        f"{name}: 1 client   set {s['set']:>9.0f}/s  get {s['get']:>9.0f}/s  add {s['add']:>9.0f}/s"
    )
    print(f"{name}: {ARGS.procs} procs    mix {r['procs']:>9.0f} ops/s together")
    for n, t in r["barrier"].items():
        raw = r["barrier_raw"].get(n)
        extra = f"   (asyncio raw-protocol clients: {raw * 1000:.0f} ms)" if raw else ""
        shown = f"{t * 1000:.0f} ms" if t is not None else "failed"
        print(f"{name}: {n:>5} clients connect + barrier (threads): {shown}{extra}")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--clients", default="64,256,1024")
    parser.add_argument("--no-torch", action="store_true")
    ARGS = args = parser.parse_args()
    args.clients = [int(x) for x in args.clients.split(",")]

    results = {"c10d": bench("c10d", args)}
    report("c10d ", results["c10d"])
    if not args.no_torch:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            print("torch not importable: no comparison")
        else:
            results["torch"] = bench("torch", args)
            report("torch", results["torch"])
            c, t = results["c10d"], results["torch"]
            print("ratios c10d/torch (higher is better for c10d):")
            for op in ("set", "get", "add"):
                print(f"  1 client {op}: {c['single'][op] / t['single'][op]:.1f}x")
            print(f"  {args.procs} procs mix: {c['procs'] / t['procs']:.1f}x")
            for n in args.clients:
                if c["barrier"].get(n) and t["barrier"].get(n):
                    print(
                        f"  {n} clients barrier: torch/c10d time "
                        f"{t['barrier'][n] / c['barrier'][n]:.1f}x"
                    )


if __name__ == "__main__":
    main()
