"""Data-parallel gradient reduction (Reducer, comm hooks, start-up checks) on real processes."""

import numpy as np
import pytest

import c10d as dist
from dist import harness

CASES = [
    "ddp_reducer",
    "ddp_unused_parameters",
    "ddp_comm_hooks",
    "ddp_startup",
    "ddp_unused_without_detection",
    "ddp_torch_params",
    "ddp_torch_module",
    "ddp_join",
    "ddp_sparse",
    "ddp_logging_and_ignored",
]


@pytest.mark.parametrize("backend", ["gloo", "shm"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_case(case, world_size, backend):
    harness.check_all_ok(harness.run(case, world_size, backend))


def test_bucket_assignment_follows_the_limits():
    t = [np.zeros(25, np.float32)] * 4 + [np.zeros(3, np.float64)] + [np.zeros(25, np.float32)]
    buckets, limits = dist._compute_bucket_assignment_by_size(t, [150, 250])
    assert buckets == [[0, 1], [2, 3, 5], [4]]
    assert limits == [150, 250, 150]
    buckets, _ = dist._compute_bucket_assignment_by_size(t[:3], [1], [False, True, False])
    assert buckets == [[0], [1], [2]]
    # With tensor_indices, tensors[i] counts as index tensor_indices[i], buckets in close order.
    buckets, _ = dist._compute_bucket_assignment_by_size(t[:3], [200], tensor_indices=[2, 1, 0])
    assert buckets == [[2, 1], [0]]
    with pytest.raises(ValueError):
        dist._compute_bucket_assignment_by_size([], [1])
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 1 << 20


def test_numpy_training_example_converges_in_lockstep():
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "c10d.run",
            "--nproc-per-node",
            "2",
            os.path.join(harness.REPO, "examples", "ddp_numpy.py"),
            "--steps",
            "60",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    losses = [float(v) for v in re.findall(r"mean loss over ranks ([0-9.]+)", out.stdout)]
    assert len(losses) >= 2 and losses[-1] < losses[0] / 2, out.stdout
    assert "weights identical on every rank: True" in out.stdout, out.stdout


def test_waits_on_futures_run_queued_reductions():
    harness.check_all_ok(harness.run("ddp_waits_run_queued_reductions", 2, "shm"))
