"""Launcher: ``python -m c10d.run --nproc-per-node N script.py args...``.

Starts N worker processes on this node with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT, ...), forwards their output (or writes it to --log-dir), and watches
them: when one fails the others are stopped and, while --max-restarts allows, the whole group
starts again; otherwise the exit code is non-zero and a summary says which rank failed and why.
With a dynamic rendezvous (--rdzv-backend c10d) the nodes' launchers meet at --rdzv-endpoint
and number themselves; with the static one each node gives its --node-rank.
"""

import argparse
import collections
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from typing import Dict, List, Optional

__all__ = ["main", "parse_args"]


def _free_port() -> int:
    """A port free on every address, as the store's server listens on all of them ([::] with
    IPv4 mapped in, or 0.0.0.0): a port free on one address only (::1) may be taken on
    another, and the server's bind then fails."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", 0))
            return s.getsockname()[1]
    except OSError:  # no IPv6 here
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            return s.getsockname()[1]


def _split_endpoint(endpoint: str, default_port: Optional[int]):
    """ "host:port", "[v6]:port", "host" or "v6" -> (host, port or default_port)."""
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif endpoint.count(":") == 1:
        host, _, port = endpoint.partition(":")
    else:
        host, port = endpoint, ""
    if port and not port.isdigit():
        raise ValueError(f"the port of rendezvous endpoint {endpoint!r} is not a number")
    return host, int(port) if port else default_port


# torchrun's --redirects/--tee values: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank,
# "0:1,1:3".
def _streams(spec: str, local_rank: int) -> int:
    spec = str(spec or "0")
    if ":" not in spec:
        return int(spec)
    for item in spec.split(","):
        rank, _, value = item.partition(":")
        if int(rank) == local_rank:
            return int(value)
    return 0


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's text as written, and every option's default."""


# What --numa-binding groups CPUs by: the sysfs file naming each CPU's group.
_CPU_GROUPINGS = {
    "node": None,  # /sys/devices/system/node/node<N>/cpulist
    "socket": "topology/physical_package_id",
    "core-complex": "cache/index3/id",  # CPUs sharing a last-level cache
}


def _cpu_list(text: str) -> List[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: List[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _cpu_groups(mode: str) -> List[List[int]]:
    """The usable CPUs of this machine in groups: NUMA nodes ("node", "exclusive"), sockets, or
    core complexes (CPUs sharing a last-level cache); one group of every CPU where sysfs does
    not tell."""
    usable = sorted(os.sched_getaffinity(0))
    groups: Dict[str, List[int]] = {}
    if mode in ("node", "exclusive"):
        for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist")):
            with open(path) as f:
                groups[path] = [c for c in _cpu_list(f.read()) if c in usable]
    else:
        for cpu in usable:
            try:
                with open(f"/sys/devices/system/cpu/cpu{cpu}/{_CPU_GROUPINGS[mode]}") as f:
                    groups.setdefault(f.read().strip(), []).append(cpu)
            except OSError:
                groups.setdefault("", []).append(cpu)
    found = [g for g in groups.values() if g]
    return found or [usable]


def _numa_cpus(mode: Optional[str], nproc: int) -> List[Optional[List[int]]]:
    """The CPUs each local worker is bound to: workers go round the groups in turn; with
    "exclusive" each takes its own share of its group's CPUs."""
    if not mode:
        return [None] * nproc
    groups = _cpu_groups(mode)
    bound: List[Optional[List[int]]] = []
    for local_rank in range(nproc):
        group = groups[local_rank % len(groups)]
        if mode == "exclusive":
            sharers = len(range(local_rank % len(groups), nproc, len(groups)))
            index = local_rank // len(groups)
            share = max(1, len(group) // sharers)
            start = (index * share) % len(group)
            group = group[start : start + share]
        bound.append(list(group))
    return bound


def _filters(text: str) -> List[str]:
    """--duplicate-*-filters: comma-separated substrings, ",," standing for a comma."""
    return [f.replace("\0", ",") for f in text.replace(",,", "\0").split(",") if f]


def _parser() -> argparse.ArgumentParser:
    """torchrun's options, their defaults taken from PET_<OPTION> where set."""
    p = argparse.ArgumentParser(prog="c10drun", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        default="1",
        help="workers on this node (an integer, or 'cpu'/'auto' for one per core)",
    )
    p.add_argument(
        "--nnodes",
        default="1",
        help="number of nodes: N, or MIN:MAX (a dynamic rendezvous starts with MAX "
        "nodes, or with MIN or more once last_call_timeout passed)",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="this node's rank among the nodes (static rendezvous)",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        help="host of rank 0's store (static rendezvous); else --rdzv-endpoint's, else 127.0.0.1",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        help="port of rank 0's store; else --rdzv-endpoint's, else a free one (one node) or 29500",
    )
    p.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default="",
        help="host:port of the rendezvous (rank 0's store)",
    )
    p.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default="static",
        help="static (each node gives --node-rank) or c10d (the nodes' launchers "
        "meet at --rdzv-endpoint and number themselves)",
    )
    p.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default="none",
        help="the job's id: the same on every node (TORCHELASTIC_RUN_ID; names log folders "
        "and flight-recorder dumps)",
    )
    p.add_argument(
        "--rdzv-conf",
        "--rdzv_conf",
        dest="rdzv_conf",
        default="",
        help="key=value,...; join_timeout (seconds, default 600) is used",
    )
    p.add_argument("--role", default="default", help="the workers' ROLE_NAME")
    p.add_argument(
        "--log-dir",
        "--log_dir",
        dest="log_dir",
        default=None,
        help="with --redirects/--tee: where <attempt>/<local rank>/stdout.log etc. go",
    )
    p.add_argument(
        "-r",
        "--redirects",
        default="0",
        help="send workers' streams to files in --log-dir instead of the console: "
        "0 none, 1 stdout, 2 stderr, 3 both, or per local rank (0:1,1:3)",
    )
    p.add_argument(
        "-t",
        "--tee",
        default="0",
        help="as --redirects, but also to the console, each line there prefixed with its "
        "worker ([<role><local rank>]:)",
    )
    p.add_argument(
        "--local-addr",
        "--local_addr",
        dest="local_addr",
        default=None,
        help="this node's address for the other nodes (dynamic rendezvous)",
    )
    p.add_argument(
        "--start-method",
        "--start_method",
        dest="start_method",
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="accepted for torchrun's sake: workers are always new processes",
    )
    p.add_argument(
        "--run-path",
        "--run_path",
        dest="run_path",
        action="store_true",
        help="run the script by path (what Python does anyway)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="single node: pick a free local port for the rendezvous",
    )
    p.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=0,
        help="how many times the workers start again after one failed",
    )
    p.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        dest="monitor_interval",
        type=float,
        default=0.1,
        help="seconds between looks at the workers' state",
    )
    p.add_argument(
        "--grace-period",
        "--shutdown-timeout",
        "--shutdown_timeout",
        dest="grace_period",
        type=float,
        default=float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 5.0)),
        help="seconds between SIGTERM and SIGKILL when stopping workers "
        "(TORCH_ELASTIC_SHUTDOWN_TIMEOUT)",
    )
    p.add_argument(
        "--signals-to-handle",
        "--signals_to_handle",
        dest="signals_to_handle",
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help="signals the launcher passes on to the workers (then stops them and exits), "
        "comma-separated",
    )
    p.add_argument(
        "--virtual-local-rank",
        "--virtual_local_rank",
        dest="virtual_local_rank",
        action="store_true",
        help="LOCAL_RANK=0 for every worker (torchrun's mode for one GPU per worker; there "
        "are no GPU devices to remap on the CPU)",
    )
    p.add_argument(
        "--numa-binding",
        "--numa_binding",
        dest="numa_binding",
        default=None,
        choices=["node", "socket", "exclusive", "core-complex"],
        help="bind each worker to the CPUs of one NUMA node (node), socket, or last-level "
        "cache (core-complex), workers going round them in turn; exclusive: a share of its "
        "node's CPUs of its own",
    )
    p.add_argument(
        "--event-log-handler",
        "--event_log_handler",
        dest="event_log_handler",
        default="null",
        choices=["null", "console"],
        help="where the launcher's events go (the workers starting, failing, restarting, the "
        "run ending): nowhere, or as JSON lines on stderr",
    )
    p.add_argument(
        "--logs-specs",
        "--logs_specs",
        dest="logs_specs",
        default=None,
        help="refused: c10drun has no LogsSpecs plugins; --log-dir, --redirects, --tee and "
        "--local-ranks-filter say where the workers' output goes",
    )
    p.add_argument(
        "--duplicate-stdout-filters",
        "--duplicate_stdout_filters",
        dest="duplicate_stdout_filters",
        default="",
        help="also write the workers' stdout lines containing any of these comma-separated "
        "strings (,, for a comma) to <log-dir>/<rdzv id>/attempt_<n>/filtered_stdout.log",
    )
    p.add_argument(
        "--duplicate-stderr-filters",
        "--duplicate_stderr_filters",
        dest="duplicate_stderr_filters",
        default="",
        help="the same for stderr (filtered_stderr.log)",
    )
    p.add_argument(
        "--local-ranks-filter",
        "--local_ranks_filter",
        dest="local_ranks_filter",
        default="",
        help="show only these local ranks' output on the console (0,1,2); files "
        "from --redirects/--tee still get every rank's",
    )
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module")
    p.add_argument(
        "--no-python",
        "--no_python",
        dest="no_python",
        action="store_true",
        help="run the script as an executable, not with Python",
    )
    p.add_argument(
        "training_script",
        help="the program every worker runs (a Python script, or see -m and --no-python)",
    )
    p.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="the program's own arguments"
    )
    # As torchrun: PET_<OPTION> (PET_NPROC_PER_NODE=4, PET_STANDALONE=1) gives an option's
    # default, so a job's environment can configure the launcher.
    for action in p._actions:
        value = os.environ.get(f"PET_{action.dest.upper()}") if action.option_strings else None
        if value is None or action.dest == "help":
            continue
        action.default = value == "1" if isinstance(action, argparse._StoreTrueAction) else value
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    if args.nproc_per_node in ("cpu", "auto"):  # auto: one per GPU in torchrun; there are none
        args.nproc_per_node = os.cpu_count() or 1
    try:
        args.nproc_per_node = int(args.nproc_per_node)
    except ValueError:
        p.error(
            f"--nproc-per-node must be an integer, 'cpu' or 'auto', got {args.nproc_per_node!r}"
        )
    if args.max_restarts < 0:
        p.error("--max-restarts must not be negative")
    for name in ("redirects", "tee"):
        try:
            _streams(getattr(args, name), 0)
        except ValueError:
            p.error(f"--{name} takes 0-3 or local_rank:value pairs, got {getattr(args, name)!r}")
    try:
        args.local_ranks_filter = (
            {int(r) for r in args.local_ranks_filter.split(",")}
            if args.local_ranks_filter
            else None
        )
    except ValueError:
        p.error(
            "--local-ranks-filter must be a comma-separated list of integers, e.g. 0,1,2; "
            f"got {args.local_ranks_filter!r}"
        )
    if args.logs_specs:
        p.error(
            f"--logs-specs {args.logs_specs!r}: c10drun has no LogsSpecs plugins (torchrun's "
            "torchrun.logs_specs entry points); --log-dir, --redirects, --tee and "
            "--local-ranks-filter say where the workers' output goes"
        )
    try:
        args.signals_to_handle = [
            signal.Signals[s.strip().upper()]
            for s in args.signals_to_handle.split(",")
            if s.strip()
        ]
    except KeyError as e:
        p.error(
            f"--signals-to-handle: unknown signal {e.args[0]!r} (names such as SIGTERM,SIGUSR1)"
        )
    for s in args.signals_to_handle:
        if s in (signal.SIGKILL, signal.SIGSTOP):
            p.error(f"--signals-to-handle: {s.name} cannot be handled")
    args.duplicate_filters = {
        "stdout": _filters(args.duplicate_stdout_filters),
        "stderr": _filters(args.duplicate_stderr_filters),
    }
    to_files = any(args.duplicate_filters.values()) or any(
        _streams(args.redirects, r) | _streams(args.tee, r) for r in range(args.nproc_per_node)
    )
    if to_files and not args.log_dir:
        # As torchrun: the files go to a new temporary folder.
        args.log_dir = tempfile.mkdtemp(prefix="c10drun_logs_")
        print(f"c10drun: worker logs go to {args.log_dir}", file=sys.stderr)
    try:
        conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if item)
        args.join_timeout = float(conf.get("join_timeout", 600))
        args.last_call_timeout = float(conf.get("last_call_timeout", 30))
    except ValueError:
        p.error(f"--rdzv-conf takes key=value pairs, got {args.rdzv_conf!r}")
    try:
        bounds = [int(n) for n in str(args.nnodes).split(":")]
    except ValueError:
        p.error(f"--nnodes takes N or MIN:MAX, got {args.nnodes!r}")
    if len(bounds) > 2:
        p.error(f"--nnodes takes N or MIN:MAX, got {args.nnodes!r}")
    args.min_nodes, args.nnodes = bounds[0], bounds[-1]
    if args.nproc_per_node <= 0 or args.min_nodes <= 0 or args.min_nodes > args.nnodes:
        p.error("--nproc-per-node and --nnodes must be positive (and MIN <= MAX)")
    if args.master_addr and args.master_addr.startswith("[") and args.master_addr.endswith("]"):
        args.master_addr = args.master_addr[1:-1]  # an IPv6 address as torchrun writes it
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank {args.node_rank} is outside [0, {args.nnodes})")
    # A dynamic rendezvous numbers the nodes itself; its endpoint defaults to port 29400.
    args.dynamic = args.rdzv_backend != "static" and args.nnodes > 1 and not args.standalone
    try:
        _split_endpoint(args.rdzv_endpoint, None)
    except ValueError as e:
        p.error(str(e))
    if args.dynamic and not args.rdzv_endpoint:
        p.error(f"--rdzv-backend {args.rdzv_backend} with several nodes needs --rdzv-endpoint")
    if args.standalone:
        args.rdzv_id = str(uuid.uuid4())
    return args


def _endpoint(args):
    """MASTER_ADDR and MASTER_PORT of the static rendezvous (rank 0's store)."""
    host, port = args.master_addr, args.master_port
    if args.rdzv_endpoint:
        h, pt = _split_endpoint(args.rdzv_endpoint, None)
        host = host or h
        if port is None:
            if pt is None and args.nnodes > 1 and not args.standalone:
                raise SystemExit(
                    f"c10drun: port is absent in --rdzv-endpoint "
                    f"{args.rdzv_endpoint!r}: give host:port or --master-port"
                )
            port = pt
    host = host or "127.0.0.1"
    single = args.standalone or args.nnodes == 1
    if port is None or (port == 0 and single):
        # Port 0 asks for any free one, as torchrun's docs suggest for several single-node
        # jobs on one host.
        port = _free_port() if single else 29500
    elif port == 0:
        raise SystemExit(
            "c10drun: port 0 (any free port) works for a single node only: the "
            "other nodes could not know which one was taken"
        )
    return host, port


def _is_local(host: str) -> bool:
    """Whether `host` names an address of this machine (one can bind to it)."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as s:
                s.bind(address)
                return True
    except OSError:
        pass
    return False


def _dynamic_rendezvous(args):
    """Meets the other nodes' launchers at --rdzv-endpoint (default port 29400) and returns
    (node rank, node count, MASTER_ADDR, MASTER_PORT, the rendezvous store, to keep open while
    the workers run). The launcher that can host the store there is node 0; it picks the
    workers' port and publishes it, and closes the rendezvous once MAX nodes joined, or MIN
    or more and last_call_timeout passed since MIN joined. A node that joins after that
    fails."""
    from . import _C  # the compiled module only when a dynamic rendezvous needs it

    host, port = _split_endpoint(args.rdzv_endpoint, 29400)
    timeout = timedelta(seconds=args.join_timeout)
    prefix = f"c10drun/{args.rdzv_id}/"
    store = None
    if _is_local(host):
        try:
            store = _C.TCPStore(
                host, port, world_size=None, is_master=True, timeout=timeout, wait_for_workers=False
            )
        except _C.DistNetworkError:  # another launcher on this host hosts it
            pass
    if store is not None:
        node_rank = 0
        master_addr = args.local_addr or host
        master_port = _free_port()
        store.set(prefix + "master", f"{master_addr} {master_port}")
    else:
        store = _C.TCPStore(host, port, is_master=False, timeout=timeout)
        # The store's host is node 0; the counter numbers the others from 1 in the order they
        # reach it, which may be before node 0 itself gets to count.
        node_rank = store.add(prefix + "joined", 1)
        try:
            master_addr, master_port = store.get(prefix + "master").decode().split()
        except _C.DistStoreError as e:
            raise SystemExit(
                f"c10drun: no launcher hosts rendezvous {args.rdzv_id!r} at "
                f"{args.rdzv_endpoint} (node 0 is the launcher on the host of that "
                f"address): {e}"
            ) from None
    if node_rank >= args.nnodes:
        raise SystemExit(
            f"c10drun: {node_rank + 1} nodes joined rendezvous {args.rdzv_id!r} "
            f"at {args.rdzv_endpoint} but --nnodes is {args.nnodes}"
        )
    if node_rank == 0:
        deadline = time.monotonic() + timeout.total_seconds()
        enough_since = None  # when MIN nodes had joined
        while True:
            joined = store.add(prefix + "joined", 0) + 1
            now = time.monotonic()
            if joined >= args.min_nodes and enough_since is None:
                enough_since = now
            if joined >= args.nnodes or (
                enough_since is not None and now - enough_since >= args.last_call_timeout
            ):
                break
            if enough_since is None and now > deadline:
                raise SystemExit(
                    f"c10drun: only {joined} of {args.min_nodes} nodes joined "
                    f"rendezvous {args.rdzv_id!r} at {args.rdzv_endpoint} within "
                    f"{timeout.total_seconds():g} s"
                )
            time.sleep(0.05)
        store.set(prefix + "nodes", str(min(joined, args.nnodes)))
    nodes = int(store.get(prefix + "nodes").decode())
    if node_rank >= nodes:
        raise SystemExit(
            f"c10drun: this node joined rendezvous {args.rdzv_id!r} at "
            f"{args.rdzv_endpoint} after it closed with {nodes} nodes"
        )
    # Nodes may run different numbers of workers (as with torchrun): ranks follow node order.
    store.set(prefix + f"nproc/{node_rank}", str(args.nproc_per_node))
    counts = [int(v) for v in store.multi_get([prefix + f"nproc/{n}" for n in range(nodes)])]
    args.rank_offset, args.world_size = sum(counts[:node_rank]), sum(counts)
    return node_rank, nodes, master_addr, int(master_port), store


# The launcher's console: workers' lines pass through it whole, one at a time.
_console_lock = threading.Lock()


class _Filtered:
    """One attempt's filtered_<stream>.log (--duplicate-*-filters), shared by its workers."""

    def __init__(self, path: str, filters: List[str]):
        self.filters = [f.encode() for f in filters]
        self.file = open(path, "wb")
        self.lock = threading.Lock()

    def offer(self, line: bytes):
        if any(f in line for f in self.filters):
            with self.lock:
                self.file.write(line)
                self.file.flush()


class _Worker:
    """One worker process. Its stderr always passes through the launcher (the summary quotes
    its last lines); stdout only when redirected or teed to a file or filtered. A stream
    redirected to --log-dir goes only there; teed, to both, its console lines prefixed with
    `prefix`. A rank --local-ranks-filter leaves out shows nothing on the console."""

    def __init__(
        self,
        local_rank: int,
        rank: int,
        command: List[str],
        env: Dict[str, str],
        files: Dict[str, Optional[str]],
        console: Dict[str, bool],
        prefix: Dict[str, bytes],
        filtered: Dict[str, Optional[_Filtered]],
        cpus: Optional[List[int]] = None,
    ):
        self.local_rank = local_rank
        self.rank = rank
        self.error_file = env.get("TORCHELASTIC_ERROR_FILE", "")
        self.tail = collections.deque(maxlen=20)
        self.files = {name: open(path, "wb") if path else None for name, path in files.items()}
        self.console = console
        self.prefix = prefix
        self.filtered = filtered
        pipe_out = self.files["stdout"] is not None or filtered["stdout"] is not None
        stdout = subprocess.PIPE if pipe_out else None if console["stdout"] else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            command,
            env=env,
            stderr=subprocess.PIPE,
            stdout=stdout,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        self.readers = [threading.Thread(target=self._forward, args=("stderr",), daemon=True)]
        if pipe_out:
            self.readers.append(
                threading.Thread(target=self._forward, args=("stdout",), daemon=True)
            )
        for t in self.readers:
            t.start()

    def _forward(self, name: str):
        source = getattr(self.proc, name)
        sink = getattr(sys, name)
        for raw in iter(source.readline, b""):
            if not raw.endswith(b"\n"):  # the last line, unfinished: kept apart from others
                raw += b"\n"
            if name == "stderr":
                self.tail.append(raw.decode(errors="replace").rstrip("\n"))
            if self.files[name] is not None:
                self.files[name].write(raw)
                self.files[name].flush()
            if self.filtered[name] is not None:
                self.filtered[name].offer(raw)
            if self.console[name]:
                with _console_lock:
                    sink.buffer.write(self.prefix[name] + raw)
                    sink.flush()

    def join(self):
        for t in self.readers:
            t.join(timeout=2)
        for f in self.files.values():
            if f is not None:
                f.close()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(workers: List[_Worker], grace: float, signum: int = signal.SIGTERM) -> None:
    """Sends `signum` to the workers still running, and SIGKILL to those left after `grace`
    seconds."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signum)
    deadline = time.monotonic() + grace
    for w in workers:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            w.proc.wait(remaining)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def _start_group(args, command, base_env, attempt) -> List[_Worker]:
    workers = []
    filtered: Dict[str, Optional[_Filtered]] = {"stdout": None, "stderr": None}
    for name, filters in args.duplicate_filters.items():
        if filters:
            folder = os.path.join(args.log_dir, args.rdzv_id, f"attempt_{attempt}")
            os.makedirs(folder, exist_ok=True)
            filtered[name] = _Filtered(os.path.join(folder, f"filtered_{name}.log"), filters)
    cpus = _numa_cpus(args.numa_binding, args.nproc_per_node)
    for local_rank in range(args.nproc_per_node):
        rank = args.rank_offset + local_rank
        # Where a worker may record why it failed (torch's @record writes this JSON file).
        error_file = os.path.join(
            base_env["C10DRUN_ERROR_DIR"], f"attempt_{attempt}", str(local_rank), "error.json"
        )
        os.makedirs(os.path.dirname(error_file), exist_ok=True)
        env = dict(
            base_env,
            RANK=str(rank),
            LOCAL_RANK="0" if args.virtual_local_rank else str(local_rank),
            ROLE_RANK=str(rank),
            TORCHELASTIC_RESTART_COUNT=str(attempt),
            TORCHELASTIC_ERROR_FILE=error_file,
        )
        env.pop("C10DRUN_ERROR_DIR")
        files: Dict[str, Optional[str]] = {"stdout": None, "stderr": None}
        shown = args.local_ranks_filter is None or local_rank in args.local_ranks_filter
        console = {"stdout": shown, "stderr": shown}
        prefix = {"stdout": b"", "stderr": b""}
        to_file = _streams(args.redirects, local_rank) | _streams(args.tee, local_rank)
        if args.log_dir and to_file:
            folder = os.path.join(args.log_dir, args.rdzv_id, f"attempt_{attempt}", str(local_rank))
            os.makedirs(folder, exist_ok=True)
            for bit, name in ((1, "stdout"), (2, "stderr")):
                if to_file & bit:
                    files[name] = os.path.join(folder, f"{name}.log")
                    console[name] = shown and bool(_streams(args.tee, local_rank) & bit)
                    if console[name]:  # teed: as torchrun, the console says whose line it is
                        prefix[name] = f"[{args.role}{local_rank}]:".encode()
        workers.append(
            _Worker(
                local_rank, rank, command, env, files, console, prefix, filtered, cpus[local_rank]
            )
        )
    return workers


def _watch(workers: List[_Worker], args) -> Optional[_Worker]:
    """Waits until every worker exited (None) or one failed (then stops the others)."""
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
        w.join()
    for f in {id(f): f for w in workers for f in w.filtered.values() if f}.values():
        f.file.close()
    return failed


def _event(args, name: str, **metadata) -> None:
    """One of the launcher's events, to --event-log-handler (console: a JSON line on stderr,
    in the shape of torchelastic's events)."""
    if args.event_log_handler != "console":
        return
    record = {
        "name": f"c10drun.{name}",
        "source": "AGENT",
        "timestamp": int(time.time() * 1000),
        "metadata": {"run_id": args.rdzv_id, "node_rank": args.node_rank, **metadata},
    }
    with _console_lock:
        print(json.dumps(record), file=sys.stderr, flush=True)


def _recorded_error(path: str) -> Optional[str]:
    """The message in a worker's error file ({"message": "..."} or torch's
    {"message": {"message": "...", "extraInfo": {...}}}), if it wrote one."""
    try:
        with open(path) as f:
            message = json.load(f).get("message")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(message, dict):
        message = message.get("message")
    return str(message) if message else None


def _report(failed: _Worker, workers: List[_Worker], attempts: int) -> None:
    code = failed.proc.returncode
    print("=" * 72, file=sys.stderr)
    print(
        f"c10drun: worker rank {failed.rank} (local_rank {failed.local_rank}, pid "
        f"{failed.proc.pid}) failed: {_describe_exit(code)}"
        + (f" (attempt {attempts} of {attempts}; no restarts left)" if attempts > 1 else ""),
        file=sys.stderr,
    )
    others = [w for w in workers if w is not failed]
    if others:
        print(
            "c10drun: stopped the other workers: "
            + ", ".join(f"rank {w.rank} ({_describe_exit(w.proc.returncode)})" for w in others),
            file=sys.stderr,
        )
    recorded = _recorded_error(failed.error_file)
    if recorded:
        print(
            f"c10drun: rank {failed.rank} recorded its error (TORCHELASTIC_ERROR_FILE): {recorded}",
            file=sys.stderr,
        )
    if failed.tail:
        print(f"c10drun: last lines of rank {failed.rank}'s stderr:", file=sys.stderr)
        for line in failed.tail:
            print(f"  {line}", file=sys.stderr)
    print("=" * 72, file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.dynamic:
        # The rendezvous store stays open (on node 0, its server) until main returns.
        args.node_rank, args.nnodes, host, port, _rendezvous_store = _dynamic_rendezvous(args)
    else:
        host, port = _endpoint(args)
        args.rank_offset = args.node_rank * args.nproc_per_node
        args.world_size = args.nproc_per_node * args.nnodes
    world_size = args.world_size
    base_env = dict(os.environ)
    base_env.update(
        {
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(args.nproc_per_node),
            "GROUP_RANK": str(args.node_rank),
            "GROUP_WORLD_SIZE": str(args.nnodes),
            "ROLE_NAME": args.role,
            "ROLE_WORLD_SIZE": str(world_size),
            "TORCHELASTIC_RUN_ID": args.rdzv_id,
            "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "False",  # as torchrun: the workers' rank 0 serves
        }
    )
    if args.nproc_per_node > 1 and "OMP_NUM_THREADS" not in base_env:
        # As torchrun: several workers with a thread per core each would oversubscribe.
        base_env["OMP_NUM_THREADS"] = "1"
    # Workers find this package the way the launcher did.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, base_env.get("PYTHONPATH", "")] if p
    )
    if args.no_python:
        command = [args.training_script]
    elif args.module:
        command = [sys.executable, "-u", "-m", args.training_script]
    else:
        command = [sys.executable, "-u", args.training_script]
    command += args.training_script_args

    workers: List[_Worker] = []

    def forward_signal(signum, _frame):
        # The workers get the launcher's signal (SIGINT too: their finally blocks and atexit
        # handlers run), as torchrun passes it on.
        _stop(workers, args.grace_period, signum)
        sys.exit(128 + signum)

    for signum in args.signals_to_handle:
        signal.signal(signum, forward_signal)

    error_dir = tempfile.mkdtemp(prefix="c10drun_errors_")
    base_env["C10DRUN_ERROR_DIR"] = error_dir
    try:
        return _run_attempts(args, command, base_env, workers)
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)


def _run_attempts(args, command, base_env, workers: List[_Worker]) -> int:
    failed = None
    for attempt in range(args.max_restarts + 1):
        if attempt > 0 and not args.dynamic:
            # A fresh port where the launcher picks it: the last attempt's may still be taken.
            base_env["MASTER_PORT"] = str(_endpoint(args)[1])
        workers[:] = _start_group(args, command, base_env, attempt)
        _event(args, "workers_started", attempt=attempt, pids=[w.proc.pid for w in workers])
        failed = _watch(workers, args)
        if failed is None:
            _event(args, "run_finished", state="SUCCEEDED", attempts=attempt + 1)
            return 0
        _event(
            args,
            "worker_failed",
            attempt=attempt,
            rank=failed.rank,
            local_rank=failed.local_rank,
            exit=_describe_exit(failed.proc.returncode),
        )
        if attempt < args.max_restarts:
            print(
                f"c10drun: worker rank {failed.rank} failed "
                f"({_describe_exit(failed.proc.returncode)}); restarting the workers "
                f"(restart {attempt + 1} of {args.max_restarts})",
                file=sys.stderr,
            )
    _event(args, "run_finished", state="FAILED", attempts=args.max_restarts + 1)
    _report(failed, workers, args.max_restarts + 1)
    code = failed.proc.returncode
    return code if code > 0 else 1


def _console_main() -> None:
    """The `c10drun` console script."""
    sys.exit(main())


if __name__ == "__main__":
    _console_main()
