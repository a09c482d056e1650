"""Runs a test case on N real processes (one per rank) and reports every rank's outcome."""

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    code: int
    stdout: str
    stderr: str


def run(case: str, world_size: int, backend: str = "gloo", timeout: float = 90,
        env: Optional[Dict[str, str]] = None, init: bool = True) -> List[RankResult]:
    """Starts `world_size` processes running dist.worker's `case`; waits at most `timeout`
    seconds, killing stragglers, and returns each rank's exit code and output."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        e = dict(os.environ)
        e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                  "WORLD_SIZE": str(world_size),
                  "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "python"), HERE + "/..",
                                                 e.get("PYTHONPATH", "")])})
        if env:
            e.update(env)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dist.worker", case, backend, "1" if init else "0"],
            env=e, cwd=os.path.join(HERE, ".."), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += f"\n[harness] rank {rank} killed after {timeout}s".encode()
        results.append(RankResult(rank, p.returncode, out.decode(), err.decode()))
    return results


def check_all_ok(results: List[RankResult]) -> None:
    bad = [r for r in results if r.code != 0]
    if bad:
        report = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.stdout}\n{r.stderr}"
                           for r in bad)
        raise AssertionError(f"{len(bad)} rank(s) failed:\n{report}")
