"""Runs a test case on N real processes (one per rank) and reports every rank's outcome."""

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
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
    seconds, killing stragglers, and returns each rank's exit code and output. The "mpi"
    backend's ranks are started by mpirun."""
    if backend == "mpi":
        return _run_mpirun(case, world_size, timeout, env, init)
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


def mpi_available() -> bool:
    """Whether c10d has its MPI backend and mpirun is installed."""
    if shutil.which("mpirun") is None:
        return False
    probe = [sys.executable, "-c", "import c10d; assert c10d.is_mpi_available()"]
    e = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    return subprocess.run(probe, env=e, capture_output=True).returncode == 0


def _run_mpirun(case, world_size, timeout, env, init) -> List[RankResult]:
    """One mpirun for all ranks; each rank's output goes to its own files, and the worker's
    last line says how it exited."""
    e = dict(os.environ)
    e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_btl": "self,vader", "OMPI_MCA_rmaps_base_oversubscribe": "1",
              "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "python"), HERE + "/..",
                                             e.get("PYTHONPATH", "")])})
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        e.pop(key, None)
    if env:
        e.update(env)
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world_size),
               "--output-filename", out_dir, sys.executable, "-m", "dist.worker", case, "mpi",
               "1" if init else "0"]
        proc = subprocess.Popen(cmd, env=e, cwd=os.path.join(HERE, ".."),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
            note = ""
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            note = f"\n[harness] mpirun killed after {timeout}s"
        results = []
        for rank in range(world_size):
            texts = []
            for stream in ("stdout", "stderr"):
                files = glob.glob(os.path.join(out_dir, "*", f"rank.{rank}", stream))
                texts.append(open(files[0]).read() if files else "")
            found = re.findall(r"^\[worker\] exit (\d+)$", texts[0], re.M)
            code = int(found[-1]) if found else (proc.returncode or -1)
            results.append(RankResult(rank, code, texts[0],
                                      texts[1] + note + f"\n[mpirun] {err.decode()[-2000:]}"))
        return results


def check_all_ok(results: List[RankResult]) -> None:
    bad = [r for r in results if r.code != 0]
    if bad:
        report = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.stdout}\n{r.stderr}"
                           for r in bad)
        raise AssertionError(f"{len(bad)} rank(s) failed:\n{report}")
