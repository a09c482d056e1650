"""A representative part of PyTorch's own distributed test suite (tests/torch_suite/run.py,
from the installed wheel) on c10d through both doors: torch's frontend on c10d's backends,
and the suite's `dist` replaced by c10d. `make test-torch` runs all of it."""

import os
import subprocess
import sys

import pytest

from dist import harness

harness.require_peer("torch", min_version="2.0")
pytest.importorskip("expecttest")  # torch's test utilities import it

RUNNER = os.path.join(os.path.dirname(__file__), "..", "torch_suite", "run.py")
# Collectives and their async forms, point to point with profiler events, DDP, subgroups,
# monitored barriers and the checks torch's suite makes of errors.
SAMPLE = [
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_complex_unsupported_ops",
    "test_broadcast_full_group",
    "test_all_gather_coalesced_simple",
    "test_reduce_scatter*",
    "test_scatter_checks",
    "test_send_recv_any_source_autograd_profiler",
    "test_isend_torch_profiler",
    "test_batch_isend_irecv_gloo_tags",
    "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_barrier_timeout_full_group",
    "test_destroy_group",
]


@pytest.mark.parametrize(
    "door,backend",
    [("plugin", "c10d_shm"), ("plugin", "c10d_gloo"), ("c10d", "gloo"), ("c10d", "shm")],
)
def test_torchs_distributed_tests_pass(door, backend):
    argv = [sys.executable, RUNNER, "--door", door, "--backend", backend]
    for pattern in SAMPLE:
        argv += ["-k", pattern]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    summary = [line for line in out.stdout.splitlines() if line.startswith("door ")]
    assert out.returncode == 0 and summary, out.stdout + out.stderr[-5000:]
    assert " 0 unexpected failures" in summary[0], out.stdout
    assert " 0 passed" not in summary[0], out.stdout  # the sample ran
