"""Test hosts on one machine: K network namespaces joined by veth pairs to a bridge that lives
in a namespace of its own (nothing changes in the machine's own namespace), each host with
its own address, hostname (UTS namespace) and /etc/hosts mapping that name to 127.0.1.1, as
Debian's default does (and the other hosts' names to their addresses). Needs root and iproute2;
traffic goes only to the addresses made here. `hosts.agent` starts a command on a host by name,
as ssh would (Open MPI's launch agent).

    with Hosts(2, rate="1gbit") as hosts:
        p = hosts.popen(0, [sys.executable, "-c", "..."])

Everything is removed on exit, also when the test fails; namespaces left by a killed test
run (their creator's pid is gone) are removed by the next Hosts().
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

PREFIX = "c10dt"  # namespaces: c10dt<pid>s (the switch), c10dt<pid>h<i> (hosts)


def available() -> Optional[str]:
    """None when test hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = f"{PREFIX}{os.getpid()}probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def remove_stale():
    """Removes namespaces of earlier runs whose creating process is gone."""
    listing = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)\S*)", listing, re.M):
        ns, pid = name[0], int(name[1])
        try:
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_in(ns)
        _ip("netns", "del", ns, check=False)


def pids(ns) -> List[int]:
    """The processes in network namespace ns."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def _kill_in(ns):
    for pid in pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Hosts:
    def __init__(self, count: int, rate: Optional[str] = None):
        self.count = count
        self.rate = rate
        tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{tag}s"
        self.names = [f"{tag}h{i}" for i in range(count)]
        self.hostnames = [f"testhost{i}" for i in range(count)]
        # One /24 per creating process, so concurrent runs never share addresses.
        self.subnet = f"10.231.{os.getpid() % 250}"
        self.addresses = [f"{self.subnet}.{i + 1}" for i in range(count)]
        self._dir = None
        self.agent: Optional[str] = None  # see _write_agent
        self._procs: List[subprocess.Popen] = []

    def __enter__(self):
        remove_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _create(self):
        self._dir = tempfile.mkdtemp(prefix="c10d-hosts-")
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n",
                self.switch,
                "link",
                "add",
                f"port{i}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            if self.rate:
                self.tc(
                    i,
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    self.rate,
                    "burst",
                    "256kb",
                    "latency",
                    "50ms",
                )
        for i in range(self.count):
            # Its own name on 127.0.1.1 (Gloo's route choice depends on it); the other hosts'
            # names on their addresses, as DNS would give them (mpirun reaches hosts by name).
            others = "".join(
                f"{self.addresses[j]} {self.hostnames[j]}\n" for j in range(self.count) if j != i
            )
            with open(os.path.join(self._dir, f"hosts{i}"), "w") as f:
                f.write(f"127.0.0.1 localhost\n127.0.1.1 {self.hostnames[i]}\n{others}")
        self._write_agent()

    def _write_agent(self):
        """A remote-launch agent in the manner of ssh (`agent <host> <command words...>`, the
        words joined and run by sh): runs the command on the test host of that name or address,
        as command() does. Open MPI's --mca plm_rsh_agent starts its daemons with it."""
        cases = "".join(
            f"{self.hostnames[i]}|{self.addresses[i]}) exec "
            f'{shlex.join(self.command(i, ["sh", "-c"]))} "$*" ;;\n'
            for i in range(self.count)
        )
        self.agent = os.path.join(self._dir, "agent")
        with open(self.agent, "w") as f:
            f.write(
                "#!/bin/sh\n"
                "host=$1\n"
                "shift\n"
                'case "$host" in\n'
                f"{cases}"
                '*) echo "netns agent: no test host $host" >&2; exit 255 ;;\n'
                "esac\n"
            )
        os.chmod(self.agent, 0o755)

    def launcher_argv(self, nproc: int, port: int, rdzv_id: Optional[str] = None) -> List[str]:
        """c10d.run's words for one host's launcher with `nproc` ranks, meeting the others at
        host 0's address and `port`; the program's words follow."""
        return (
            [sys.executable, "-m", "c10d.run", "--nnodes", str(self.count)]
            + ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
            + (["--rdzv-id", rdzv_id] if rdzv_id else [])
            + ["--rdzv-endpoint", f"{self.addresses[0]}:{port}"]
        )

    def mpirun_argv(self, nproc: int) -> List[str]:
        """mpirun's words for `nproc` ranks on every host, to run on host 0: it starts the
        other hosts' daemons through the agent, as through ssh; ranks of one host share memory
        (vader), those of different hosts use TCP on the test hosts' subnet. The program's
        words follow."""
        subnet = f"{self.subnet}.0/24"
        return [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "--host",
            ",".join(f"{name}:{nproc}" for name in self.hostnames),
            "-np",
            str(self.count * nproc),
            "--mca",
            "plm_rsh_agent",
            self.agent,
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
            "--mca",
            "oob_tcp_if_include",
            subnet,
            "--mca",
            "btl_tcp_if_include",
            subnet,
            "--mca",
            "btl",
            "tcp,vader,self",
            "-x",
            "PYTHONPATH",
        ]

    def tc(self, i: int, *args):
        r = subprocess.run(
            ["ip", "netns", "exec", self.names[i], "tc", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode != 0:
            raise RuntimeError(f"tc {' '.join(args)} on host {i}: {r.stderr.strip()}")

    def command(self, i: int, argv: List[str]) -> List[str]:
        """argv as run on host i: its network, its hostname, its /etc/hosts."""
        setup = (
            f"hostname {self.hostnames[i]} && "
            f"mount --bind {os.path.join(self._dir, f'hosts{i}')} /etc/hosts && "
            'exec "$@"'
        )
        return [
            "ip",
            "netns",
            "exec",
            self.names[i],
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            setup,
            "sh",
            *argv,
        ]

    def popen(self, i: int, argv: List[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(i, argv), **kwargs)
        self._procs.append(p)
        return p

    def link(self, i: int, up: bool):
        """Takes host i's link to the bridge down or up (from the bridge's side)."""
        _ip("-n", self.switch, "link", "set", f"port{i}", "up" if up else "down")

    def kill_host(self, i: int):
        """SIGKILLs every process on host i."""
        _kill_in(self.names[i])

    def close(self):
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        for ns in self.names + [self.switch]:
            _kill_in(ns)
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for ns in self.names + [self.switch]:
            _ip("netns", "del", ns, check=False)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
