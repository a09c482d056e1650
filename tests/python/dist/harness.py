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
from typing import Callable, Dict, List, Optional

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


def run(
    case: str,
    world_size: int,
    backend: str = "gloo",
    timeout: float = 90,
    env: Optional[Dict[str, str]] = None,
    init: bool = True,
) -> List[RankResult]:
    """Starts `world_size` processes running dist.worker's `case`; waits at most `timeout`
    seconds, killing stragglers, and returns each rank's exit code and output. The "mpi"
    backend's ranks are started by mpirun."""
    if backend == "mpi":
        return _run_mpirun(case, world_size, timeout, env, init)

    def rank_env(rank):
        # "hier": two hosts as far as the backend can tell (ranks 0-1 and 2-3 of 4, 0-1 and 2
        # of 3); `env` comes after, so it may say otherwise.
        host = (
            {"C10D_SHM_HOST_ID": f"testhost{rank * 2 // max(world_size, 2)}"}
            if backend == "hier"
            else {}
        )
        return {**host, **(env or {})}

    return run_ranks(
        [sys.executable, "-m", "dist.worker", case, backend, "1" if init else "0"],
        world_size,
        timeout,
        env_for_rank=rank_env,
        cwd=os.path.join(HERE, ".."),
    )


def run_ranks(
    argv: List[str],
    world_size: int,
    timeout: float = 90,
    env: Optional[Dict[str, str]] = None,
    env_for_rank: Optional[Callable[[int], Dict[str, str]]] = None,
    cwd: Optional[str] = None,
) -> List[RankResult]:
    """Starts `world_size` processes running `argv`, each told its RANK, the WORLD_SIZE and a
    fresh MASTER_ADDR/MASTER_PORT, then given `env` and env_for_rank(rank); like run(), waits
    at most `timeout` seconds in all."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        e = package_env(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                **(env or {}),
            }
        )
        if env_for_rank:
            e.update(env_for_rank(rank))
        procs.append(
            subprocess.Popen(argv, env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    return collect(procs, timeout)


def package_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """os.environ (updated with `env`) with the in-tree package first on PYTHONPATH."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, "python"), HERE + "/..", e.get("PYTHONPATH", "")]
    )
    if env:
        e.update(env)
    return e


def run_script(
    script: str, args: List[List[str]], timeout: float = 90, env: Optional[Dict[str, str]] = None
) -> List[RankResult]:
    """Starts one process per entry of `args` running `script` (a path) with those
    arguments; like run(), waits at most `timeout` seconds in all."""
    procs = [
        subprocess.Popen(
            [sys.executable, script, *a],
            env=package_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for a in args
    ]
    return collect(procs, timeout)


def require_peer(module: str, min_version: str = "0"):
    """Imports a comparison peer (e.g. torch) or skips the test; under `make test`
    (C10D_REQUIRE_PEERS=1, the project venv has them pinned) a missing peer fails instead."""
    import importlib

    try:
        mod = importlib.import_module(module)
        version = getattr(mod, "__version__", "0").split("+")[0]
        if _version_tuple(version) < _version_tuple(min_version):
            raise ImportError(f"{module} {version} is older than {min_version}")
        return mod
    except ImportError as e:
        if os.environ.get("C10D_REQUIRE_PEERS") == "1":
            raise
        import pytest

        pytest.skip(f"needs {module} >= {min_version}: {e}", allow_module_level=True)


def _version_tuple(v: str):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def collect(procs: List[subprocess.Popen], timeout: float) -> List[RankResult]:
    """Waits for every process, at most `timeout` seconds in all, killing stragglers."""
    deadline = time.monotonic() + timeout
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err = _text(err) + f"\n[harness] rank {rank} killed after {timeout}s"
        results.append(RankResult(rank, p.returncode, _text(out), _text(err)))
    return results


def _text(stream) -> str:
    """A process's output as text (pipes opened in either mode; None when not piped)."""
    if stream is None:
        return ""
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream


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
    e.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_btl": "self,vader",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "PYTHONPATH": os.pathsep.join(
                [os.path.join(REPO, "python"), HERE + "/..", e.get("PYTHONPATH", "")]
            ),
        }
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        e.pop(key, None)
    if env:
        e.update(env)
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = [
            "mpirun",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            str(world_size),
            "--output-filename",
            out_dir,
            sys.executable,
            "-m",
            "dist.worker",
            case,
            "mpi",
            "1" if init else "0",
        ]
        proc = subprocess.Popen(
            cmd, env=e, cwd=os.path.join(HERE, ".."), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
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
            results.append(
                RankResult(
                    rank, code, texts[0], texts[1] + note + f"\n[mpirun] {err.decode()[-2000:]}"
                )
            )
        return results


def check_all_ok(results: List[RankResult]) -> None:
    bad = [r for r in results if r.code != 0]
    if bad:
        report = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.stdout}\n{r.stderr}" for r in bad)
        raise AssertionError(f"{len(bad)} rank(s) failed:\n{report}")


def pinned(*names: str, requirements: str = "test.txt") -> List[str]:
    """The pinned requirement lines ("numpy==2.4.6") of `names` in requirements/<file>."""
    with open(os.path.join(REPO, "requirements", requirements)) as f:
        pins = {line.split("==")[0]: line.strip() for line in f if "==" in line}
    return [pins[name] for name in names]
