"""c10d.torch_backend: c10d's backends registered with PyTorch 2.x ("c10d_shm", "c10d_gloo",
"c10d"), checked against torch's own Gloo in the same processes, and torch's default group
made from c10d's (programs that swap `import c10d as dist` in)."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from dist import harness

torch = pytest.importorskip("torch")
if harness._version_tuple(torch.__version__.split("+")[0]) < (2, 0):
    pytest.skip("c10d.torch_backend needs torch >= 2.0", allow_module_level=True)
import torch.distributed as tdist  # noqa: E402

if not tdist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import c10d  # noqa: E402
import c10d.torch_backend as tb  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's renamed collectives

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist", "torch_backend_worker.py")
needs_shm = pytest.mark.skipif(not c10d.is_shm_available(), reason="c10d built without shm")


def run_ranks(case, world, timeout=60):
    port = harness.free_port()
    results = harness.run_script(
        WORKER, [[case, str(r), str(world), str(port)] for r in range(world)], timeout=timeout
    )
    harness.check_all_ok(results)
    for r in results:
        assert f"OK {case}" in r.stdout, (r.rank, r.stdout, r.stderr)
    return results


# --------------------------------------------------------------------------------------------
# One process


def test_importing_c10d_does_not_import_torch():
    code = (
        "import sys, c10d; c10d.init_process_group('gloo', store=c10d.HashStore(), rank=0, "
        "world_size=1); c10d.destroy_process_group(); assert 'torch' not in sys.modules"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=harness.package_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_backends_are_registered_once():
    for name in tb.BACKENDS:
        assert name.upper() in tdist.Backend._plugins
        assert tdist.Backend.backend_capability[name] == ["cpu"]
        assert tdist.is_backend_available(name)
    creators = {n: tdist.Backend._plugins[n.upper()].creator_fn for n in tb.BACKENDS}
    tb.register()
    assert creators == {n: tdist.Backend._plugins[n.upper()].creator_fn for n in tb.BACKENDS}


def test_errors_are_torch_and_c10d_classes():
    for cls, torch_cls in (
        (c10d.DistBackendError, tdist.DistBackendError),
        (c10d.DistTimeoutError, tdist.DistBackendError),
        (c10d.DistNetworkError, tdist.DistNetworkError),
        (c10d.DistStoreError, tdist.DistStoreError),
    ):
        e = tb._to_torch_error(cls("boom"))
        assert isinstance(e, torch_cls) and isinstance(e, cls) and str(e) == "boom"
    plain = ValueError("bad argument")
    assert tb._to_torch_error(plain) is plain


def test_reduce_ops_translate_alike_however_given():
    """torch's ReduceOp objects, fresh or reused, and its RedOpType members map to c10d's
    ReduceOp of the same name, first and cached alike; PREMUL_SUM keeps its own factor."""
    kinds = [k for k in tdist.ReduceOp.RedOpType.__members__.values() if k.name != "PREMUL_SUM"]
    for _ in range(2):
        for kind in kinds + kinds[::-1]:
            for given in (kind, tdist.ReduceOp(kind)):
                assert tb._reduce_op(given).name == kind.name, (given, tb._reduce_op(given))
    for factor in (2.0, 0.5):
        op = tb._reduce_op(tdist._make_nccl_premul_sum(factor))
        assert op.name == "PREMUL_SUM" and op.premul_factor == factor, op


def test_tensors_reach_c10d_without_copies():
    t = torch.arange(6, dtype=torch.float32)
    assert tb._view(t).ctypes.data == t.data_ptr()
    p = torch.nn.Parameter(torch.ones(3))
    assert tb._view(p).ctypes.data == p.data_ptr()
    b = torch.ones(3, dtype=torch.bfloat16)
    assert tb._view(b) is b  # no numpy dtype: c10d reads it through DLPack


@needs_shm
@pytest.mark.parametrize("backend", ["c10d_shm", "c10d_gloo", "c10d"])
def test_single_rank_group(backend):
    tdist.init_process_group(
        backend, store=tdist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10)
    )
    try:
        group = tdist.group.WORLD
        assert isinstance(group, tb.ProcessGroupC10d) and group.name() == backend
        assert tdist.get_backend() == backend
        t = torch.arange(4, dtype=torch.float32)
        tdist.all_reduce(t)
        work = tdist.all_reduce(t, async_op=True)
        assert work.wait() and work.is_completed()
        assert torch.equal(work.get_future().wait()[0], torch.arange(4, dtype=torch.float32))
        out = torch.empty(4)
        tdist.all_gather_into_tensor(out, t)
        assert torch.equal(out, t)
        with pytest.raises((ValueError, RuntimeError)):
            tdist.all_gather_into_tensor(torch.empty(3), t)
        # Object collectives run on the "cpu" device this group names.
        objs = [None]
        tdist.all_gather_object(objs, {"a": 1})
        assert objs == [{"a": 1}]
    finally:
        tdist.destroy_process_group()


@needs_shm
def test_mirror_in_one_process():
    c10d.init_process_group("shm", store=c10d.HashStore(), rank=0, world_size=1)
    try:
        assert tb.is_mirrored() and tdist.get_backend() == "c10d_shm"
        assert tdist.group.WORLD.c10d_group is c10d.group.WORLD
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(list(range(5)))
        assert (sampler.rank, sampler.num_replicas) == (0, 1)
        # A program that sets torch.distributed up itself afterwards gets its own group.
        tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
        assert tdist.get_backend() == "gloo" and not tb.is_mirrored()
        tdist.destroy_process_group()
    finally:
        if c10d.is_initialized():
            c10d.destroy_process_group()
    assert not tdist.is_initialized()


# --------------------------------------------------------------------------------------------
# Several processes, each comparing c10d's backends with torch's Gloo


@needs_shm
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_match_torch_gloo(world):
    # At 4 ranks the same processes also compare DDP and FSDP2 training (see compare_training).
    run_ranks("collectives", world, timeout=120)


@needs_shm
def test_default_group_through_torch_rendezvous():
    run_ranks("default", 2)


@needs_shm
def test_ddp_and_fsdp2_match_torch_gloo():
    run_ranks("ddp", 2, timeout=90)


@needs_shm
def test_c10d_program_uses_torch_utilities_under_torchrun():
    env = harness.package_env()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(harness.free_port()),
            WORKER,
            "mirror",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("OK mirror") == 2, out.stdout + out.stderr


@needs_shm
def test_timeouts_and_bad_arguments_raise():
    run_ranks("errors", 2, timeout=80)


@needs_shm
def test_dead_peer_raises_instead_of_hanging():
    port = harness.free_port()
    results = harness.run_script(
        WORKER, [["killed", str(r), "2", str(port)] for r in range(2)], timeout=60
    )
    assert results[0].code == 0, results[0].stdout + results[0].stderr
    assert "OK killed" in results[0].stdout, results[0].stdout + results[0].stderr


def test_torch_outside_the_tested_range_warns_naming_the_range():
    import warnings

    from c10d import torch_backend

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_backend._check_torch_version("2.13.0+cpu")
        assert not caught
        torch_backend._check_torch_version("3.0.0")
        torch_backend._check_torch_version("2.9.1")
        torch_backend._check_torch_version("nightly")
    assert len(caught) == 3, caught
    assert "tested with torch 2.11 to 2.14" in str(caught[0].message)
    assert "torch 3.0.0" in str(caught[0].message)
