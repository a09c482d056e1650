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


def _torch_ddp():
    return harness.require_peer("torch").nn.parallel.DistributedDataParallel


def test_constructor_takes_torchs_arguments_in_order_with_its_defaults():
    import inspect

    from c10d.parallel import DistributedDataParallel

    theirs = inspect.signature(_torch_ddp().__init__).parameters
    ours = inspect.signature(DistributedDataParallel.__init__).parameters
    assert list(ours) == list(theirs)
    for name, param in theirs.items():
        assert ours[name].default == param.default, name
        assert ours[name].kind == param.kind, name


def test_has_torchs_commonly_used_methods_and_attributes():
    from c10d.parallel import DistributedDataParallel

    names = [
        "no_sync",
        "join",
        "join_hook",
        "join_device",
        "join_process_group",
        "register_comm_hook",
        "_register_builtin_comm_hook",
        "will_sync_module_buffers",
        "broadcast_buffers",
        "_set_static_graph",
        "_get_ddp_logging_data",
        "_set_params_and_buffers_to_ignore_for_model",
        "_get_data_parallel_params",
        "_update_process_group",
        "_check_reducer_finalized",
        "_remove_autograd_hooks",
        "_set_ddp_runtime_logging_sample_rate",
        "_set_sparse_metadata",
        "_set_ddp_sink_clone",
        "_delayed_all_reduce_hook",
        "_register_delay_all_reduce_hook",
        "_clear_grad_buffer",
        "_distributed_rank",
        "_find_common_rank",
        "_sync_buffers",
        "_sync_final_model",
        "_sync_module_buffers",
        "_default_broadcast_coalesced",
        "_distributed_broadcast_coalesced",
        "_assign_modules_buffers",
        "_check_sync_bufs_pre_fwd",
        "_check_sync_bufs_post_fwd",
        "_get_active_ddp_module",
        "_inside_ddp_forward",
        "_active_ddp_module",
        "_check_default_group",
        "_get_parameters",
        "_log_and_throw",
        "scatter",
        "gather",
        "to_kwargs",
    ]
    torch_ddp = _torch_ddp()
    for name in names:
        assert hasattr(torch_ddp, name), f"torch has no {name}: update this list"
        assert hasattr(DistributedDataParallel, name), name


@pytest.mark.parametrize(
    "case,world_size,backend",
    [
        ("ddp_torch_arguments", 1, "gloo"),
        ("ddp_torch_arguments", 2, "gloo"),
        ("ddp_torch_arguments", 3, "gloo"),
        ("ddp_torch_arguments", 2, "shm"),
        ("ddp_mixed_precision", 1, "gloo"),
        ("ddp_mixed_precision", 2, "gloo"),
        ("ddp_mixed_precision", 3, "shm"),
    ],
)
def test_constructor_arguments_match_torch(case, world_size, backend, tmp_path):
    """Each argument of torch's constructor, on c10d's model and torch's side by side."""
    _torch_ddp()
    env = {"C10D_TEST_TORCH_STORE": str(tmp_path / "torch_store")}
    harness.check_all_ok(harness.run(case, world_size, backend, timeout=180, env=env))
