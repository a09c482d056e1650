"""What is particular to the MPI backend (the collective suite runs on it too, through
test_collectives.py): launcher-assigned ranks, a group broken by a timed-out collective, and
runs without mpirun."""

import os
import subprocess
import sys

import pytest

from dist import harness

pytestmark = pytest.mark.skipif(not harness.mpi_available(), reason="no MPI backend or mpirun")


def test_ranks_come_from_mpirun():
    harness.check_all_ok(harness.run("mpi_rank_from_launcher", 3, "mpi"))


def test_timed_out_collective_breaks_the_group():
    results = harness.run("mpi_broken_group", 3, "mpi", env={"C10D_TEST_PG_TIMEOUT": "2"})
    harness.check_all_ok(results)
    for r in results[:2]:
        assert "BROKEN_OK" in r.stdout, r.stdout


def test_singleton_without_mpirun():
    """A script run without mpirun is an MPI world of one."""
    script = (
        "import numpy as np, c10d as dist\n"
        "dist.init_process_group('mpi')\n"
        "t = np.arange(4.0)\n"
        "dist.all_reduce(t)\n"
        "assert dist.get_world_size() == 1 and (t == np.arange(4.0)).all()\n"
        "dist.destroy_process_group()\n"
        "print('SINGLETON_OK')\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(harness.REPO, "python"),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "SINGLETON_OK" in proc.stdout, proc.stderr


@pytest.mark.parametrize(
    "world,env",
    [(2, {}), (3, {}), (2, {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "2"})],
    ids=["2-ranks", "3-ranks", "user-choice"],
)
def test_reductions_with_every_algorithm(world, env):
    harness.check_all_ok(
        harness.run("mpi_reductions_every_algorithm", world, "mpi", env=env, timeout=120)
    )
