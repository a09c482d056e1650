"""Test hosts on one machine: K network namespaces joined by veth pairs to a bridge that lives
in a namespace of its own (nothing changes in the machine's own namespace), each host with
its own address, hostname (UTS namespace) and /etc/hosts mapping that name to 127.0.1.1, as
Debian's default does. Needs root and iproute2; traffic goes only to the addresses made here.

    with Hosts(2, rate="1gbit") as hosts:
        p = hosts.popen(0, [sys.executable, "-c", "..."])

Everything is removed on exit, also when the test fails; namespaces left by a killed test
run (their creator's pid is gone) are removed by the next Hosts().
"""

import os
import re
import shutil
import signal
import subprocess
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


def _kill_in(ns):
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in pids.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
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
            with open(os.path.join(self._dir, f"hosts{i}"), "w") as f:
                f.write(f"127.0.0.1 localhost\n127.0.1.1 {self.hostnames[i]}\n")

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
