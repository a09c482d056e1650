"""Launcher: ``python -m c10d.run --nproc-per-node N script.py args...``.

Starts N worker processes on this node with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), forwards their output, and
watches them: when one fails the others are stopped, the exit code is non-zero and a summary
says which rank failed and why.
"""

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional

__all__ = ["main", "parse_args"]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="c10drun", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1",
                   help="workers on this node (an integer, or 'cpu' for one per core)")
    p.add_argument("--nnodes", default="1", help="number of nodes (N or MIN:MAX; MAX is used)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None)
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None)
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default="",
                   help="host:port of the rendezvous (rank 0's store)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="static")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default="none")
    p.add_argument("--standalone", action="store_true",
                   help="single node: pick a free local port for the rendezvous")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0)
    p.add_argument("--monitor-interval", "--monitor_interval", dest="monitor_interval",
                   type=float, default=0.1)
    p.add_argument("--grace-period", dest="grace_period", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping workers")
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run the script as an executable, not with Python")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.nproc_per_node == "cpu":
        args.nproc_per_node = os.cpu_count() or 1
    try:
        args.nproc_per_node = int(args.nproc_per_node)
    except ValueError:
        p.error(f"--nproc-per-node must be an integer or 'cpu', got {args.nproc_per_node!r}")
    args.nnodes = int(str(args.nnodes).split(":")[-1])
    if args.nproc_per_node <= 0 or args.nnodes <= 0:
        p.error("--nproc-per-node and --nnodes must be positive")
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank {args.node_rank} is outside [0, {args.nnodes})")
    return args


def _endpoint(args):
    host, port = args.master_addr, args.master_port
    if args.rdzv_endpoint:
        h, _, pt = args.rdzv_endpoint.rpartition(":")
        host = host or h or args.rdzv_endpoint
        if pt and port is None:
            port = int(pt)
    host = host or "127.0.0.1"
    if port is None:
        port = _free_port(host) if (args.standalone or args.nnodes == 1) else 29500
    return host, port


class _Worker:
    def __init__(self, local_rank: int, rank: int, proc: subprocess.Popen):
        self.local_rank = local_rank
        self.rank = rank
        self.proc = proc
        self.tail = collections.deque(maxlen=20)
        self.reader = threading.Thread(target=self._forward, daemon=True)
        self.reader.start()

    def _forward(self):
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace")
            self.tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(workers: List[_Worker], grace: float) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for w in workers:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            w.proc.wait(remaining)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    host, port = _endpoint(args)
    world_size = args.nproc_per_node * args.nnodes
    base_env = dict(os.environ)
    base_env.update({
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(args.nproc_per_node),
        "GROUP_RANK": str(args.node_rank),
        "GROUP_WORLD_SIZE": str(args.nnodes),
        "ROLE_WORLD_SIZE": str(world_size),
        "TORCHELASTIC_RUN_ID": args.rdzv_id if args.rdzv_id != "none" else f"c10d-{os.getpid()}",
    })
    # Workers find this package the way the launcher did.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, base_env.get("PYTHONPATH", "")] if p)
    if args.no_python:
        command = [args.training_script]
    elif args.module:
        command = [sys.executable, "-u", "-m", args.training_script]
    else:
        command = [sys.executable, "-u", args.training_script]
    command += args.training_script_args

    workers: List[_Worker] = []
    for local_rank in range(args.nproc_per_node):
        rank = args.node_rank * args.nproc_per_node + local_rank
        env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(local_rank), ROLE_RANK=str(rank))
        proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        workers.append(_Worker(local_rank, rank, proc))

    def forward_signal(signum, _frame):
        _stop(workers, args.grace_period)
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, forward_signal)
    signal.signal(signal.SIGTERM, forward_signal)

    failed: Optional[_Worker] = None
    while failed is None and any(w.proc.poll() is None for w in workers):
        for w in workers:
            code = w.proc.poll()
            if code is not None and code != 0:
                failed = w
                break
        else:
            time.sleep(args.monitor_interval)
    if failed is None:
        failed = next((w for w in workers if w.proc.returncode != 0), None)
    if failed is not None:
        _stop(workers, args.grace_period)
    for w in workers:
        w.reader.join(timeout=2)
    if failed is None:
        return 0
    code = failed.proc.returncode
    print("=" * 72, file=sys.stderr)
    print(f"c10drun: worker rank {failed.rank} (local_rank {failed.local_rank}, pid "
          f"{failed.proc.pid}) failed: {_describe_exit(code)}", file=sys.stderr)
    others = [w for w in workers if w is not failed]
    if others:
        print("c10drun: stopped the other workers: " + ", ".join(
            f"rank {w.rank} ({_describe_exit(w.proc.returncode)})" for w in others),
            file=sys.stderr)
    if failed.tail:
        print(f"c10drun: last lines of rank {failed.rank}'s stderr:", file=sys.stderr)
        for line in failed.tail:
            print(f"  {line}", file=sys.stderr)
    print("=" * 72, file=sys.stderr)
    return code if code > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
