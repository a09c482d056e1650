"""torch's c10d names in c10d: the generated table (docs/api-names.md) still holds, and the
names added for it behave as torch's do (compared with torch itself where it is installed)."""

import os
import sys
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest

import c10d as dist
import c10d._functional_collectives as funcol
import c10d.distributed_c10d as dc
from dist import harness

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import api_names  # noqa: E402


@pytest.fixture
def world1():
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# The table


def test_no_name_the_table_lists_as_existing_has_disappeared():
    rows = api_names.read_table()
    assert len(rows) > 500, "docs/api-names.md lost its rows"
    kept = [
        (source, name)
        for source, name, status, _ in rows
        if status in ("present", "stub", "gpu-only")
    ]
    assert len(kept) > 400
    gone = [
        f"{source}: {name}"
        for source, name in kept
        if not api_names.resolves(source, name) and not api_names.gpu_explained(name)
    ]
    assert not gone, f"names listed in docs/api-names.md no longer resolve: {gone}"


def test_table_is_what_the_script_writes():
    seeds = os.environ.get("C10D_SEEDS", os.path.join(os.path.dirname(REPO), "shared", "seeds"))
    if not os.path.isdir(seeds):
        pytest.skip(f"no seed documents at {seeds}")
    written = open(api_names.DOC, encoding="utf-8").read()
    assert written == api_names.render(api_names.inventory(seeds)), (
        "docs/api-names.md is out of date: run PYTHONPATH=python python scripts/api_names.py"
    )


# --------------------------------------------------------------------------------------------
# Autograd of the functional collectives


def test_functional_collectives_are_differentiable_on_one_rank(world1):
    torch = pytest.importorskip("torch")
    x = torch.arange(8.0).reshape(4, 2).requires_grad_(True)
    weight = torch.arange(1.0, 9.0).reshape(4, 2)
    for fn in (
        lambda: funcol.all_gather_single_autograd(x, 0, world1),
        lambda: funcol.reduce_scatter_single_autograd(x, "sum", 0, world1),
        lambda: funcol.all_to_all_single_autograd(x, None, None, world1),
        lambda: funcol.all_reduce(x, "sum", world1),
    ):
        x.grad = None
        y = fn()
        assert y.requires_grad and y.grad_fn is not None
        (y * weight).sum().backward()
        assert torch.equal(x.grad, weight)
    with torch.no_grad():
        assert not funcol.all_reduce(x, "sum", world1).requires_grad
    # Only sums have a backward, and torch says so when backward runs.
    y = funcol.all_reduce(x, "max", world1)
    with pytest.raises(RuntimeError, match="only supports 'sum'"):
        y.sum().backward()
    # The *_tensor spellings warn, as torch 2.13's do.
    with pytest.warns(FutureWarning, match="all_gather_single"):
        funcol.all_gather_tensor(x, 0, world1)
    assert "torch" in sys.modules  # (imported by this test, not by c10d)


@pytest.mark.parametrize(
    "case", ["functional_autograd_matches_torch", "coalescing_fuses_all_reduces"]
)
def test_two_ranks(case, tmp_path):
    if case == "functional_autograd_matches_torch":
        pytest.importorskip("torch")
    harness.check_all_ok(
        harness.run(
            case, 2, "gloo", timeout=60, env={"C10D_TEST_TORCH_STORE": str(tmp_path / "store")}
        )
    )


# --------------------------------------------------------------------------------------------
# Tags and group names


def test_tags_name_groups_as_in_torch(world1):
    assert dc._get_group_tag(world1) == f"ptd:{world1.group_name}"
    assert dc._find_pg_by_ranks_and_tag("", [0]) is world1
    assert dc._find_pg_by_ranks_and_tag("nope", [0]) is None
    tagged = dc._new_group_with_tag([0], pg_tag="mine")
    assert tagged is not world1 and dc._get_group_tag(tagged) == "mine"
    assert dc._new_group_with_tag([0], pg_tag="mine") is tagged  # same tag, same ranks
    assert dc._find_or_create_pg_by_ranks_and_tag("user:mine", [0], 1) is tagged
    assert dc._resolve_group_name_by_ranks_and_tag([0], "mine") == tagged.group_name
    with pytest.raises(ValueError):
        dc._resolve_group_name_by_ranks_and_tag([0], "other")
    with pytest.raises(ValueError, match="empty tag"):
        dc._find_or_create_pg_by_ranks_and_tag("", [5, 0], 2)
    assert funcol._expand_group(tagged) == ("mine", [0], 1)
    assert funcol._expand_group([[0]]) == ("", [0], 1)
    assert funcol._resolve_group_name(world1) == world1.group_name
    with pytest.warns(FutureWarning):
        assert funcol._resolve_group_name([0], "mine") == tagged.group_name
    with pytest.raises(ValueError):
        funcol._expand_group(3)
    dist.destroy_process_group(tagged)
    assert tagged not in dc._world.pg_to_tag and dc._find_pg_by_ranks_and_tag("mine", [0]) is None


# --------------------------------------------------------------------------------------------
# Hand-built groups and backends


def test_groups_and_backends_built_by_hand():
    options = dist.ProcessGroup.Options("gloo", timedelta(seconds=9))
    pg = dist.ProcessGroup(dist.HashStore(), 0, 1, options)
    assert (pg.options.backend, pg.options._timeout) == ("gloo", timedelta(seconds=9))
    assert pg._timeout == timedelta(seconds=9)
    assert pg.name() == "gloo" and isinstance(pg._id(), int)
    backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=3))
    pg._register_backend("cpu", dist.ProcessGroup.BackendType.GLOO, backend)
    assert pg._backend_id(dist.ProcessGroup.BackendType.GLOO) == id(backend)
    with pytest.raises(RuntimeError, match="Could not find backend type"):
        pg._backend_id(dist.ProcessGroup.BackendType.MPI)
    assert backend.supports_splitting and backend._get_backend_name() == "gloo"
    # A backend reports the sequence number of the group it serves.
    assert backend._get_sequence_number_for_group() == pg._get_sequence_number_for_group() == 0
    pg.allreduce([np.ones(2, np.float32)]).wait()
    assert backend._get_sequence_number_for_group() == pg._get_sequence_number_for_group() == 1
    assert len(backend.options._devices) == 1
    assert backend.options._timeout == timedelta(seconds=3)
    backend._set_default_timeout(timedelta(seconds=5))
    assert backend.options._timeout == timedelta(seconds=5)
    with pytest.raises(RuntimeError, match="does not implement startCoalescing"):
        backend._start_coalescing()
    assert backend.eager_connect_single_device("cpu") is None
    assert dist.ProcessGroup.unbox(pg.boxed()) is pg
    opts = dist.BarrierOptions()
    assert opts.device is None
    opts.device = "cpu"
    assert opts.device == "cpu"


def test_extended_api_creators_get_group_id_and_global_ranks():
    seen = []

    def create(backend_options, pg_options):
        seen.append(backend_options)
        return dist.FakeProcessGroup(backend_options.group_rank, backend_options.group_size)

    dist.Backend.register_backend("names_ext", create, extended_api=True)
    dist.init_process_group("names_ext", store=dist.HashStore(), rank=0, world_size=1)
    try:
        opts = seen[-1]
        assert isinstance(opts, dist._DistributedBackendOptions)
        assert opts.group_id == dist.group.WORLD.group_name
        assert opts.global_ranks_in_group == [0] and opts.group_size == 1
    finally:
        dist.destroy_process_group()


def test_op_type_values_and_work_info(world1):
    assert [(m.name, m.value) for m in dist.OpType][:3] == [
        ("BROADCAST", 0),
        ("ALLREDUCE", 1),
        ("ALLREDUCE_COALESCED", 2),
    ]
    assert dist.OpType.UNKNOWN.value == 100 and int(dist.OpType.BARRIER) == 15
    assert dist.OpType.ALLREDUCE != 1 and dist.OpType(1) is dist.OpType.ALLREDUCE
    seen = []
    world1._register_on_completion_hook(lambda info: seen.append(info.op_type))
    work = dist.all_reduce(np.ones(2), async_op=True)
    work.wait()
    assert dist.OpType(work._get_op_type()) is dist.OpType.ALLREDUCE
    dist.barrier()
    deadline = time.monotonic() + 10  # hooks run on the backend's thread, as in torch
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(seen[:2], key=int) == [dist.OpType.ALLREDUCE, dist.OpType.BARRIER]


def test_python_store_with_only_set_get_add():
    class Minimal(dist.Store):
        def __init__(self):
            super().__init__()
            self.data = {}

        def set(self, key, value):
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()

        def get(self, key):
            return self.data[key]

        def add(self, key, amount):
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    dist._test_python_store(Minimal())

    class Wrong(Minimal):
        def add(self, key, amount):
            return super().add(key, amount + 1)

    with pytest.raises(RuntimeError, match="key"):
        dist._test_python_store(Wrong())


# --------------------------------------------------------------------------------------------
# Things that used to do nothing


def test_pending_works_are_waited_for(world1):
    works = [dist.all_reduce(np.ones(1000), async_op=True) for _ in range(5)]
    world1._wait_for_pending_works()
    assert all(w.is_completed() for w in works)


def test_coalescing_defers_and_fuses(world1):
    ts = [np.ones(3), np.full(2, 2.0)]
    with dc._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            work = dist.all_reduce(t, async_op=True)
        with pytest.raises(ValueError, match="Illegal to call wait"):
            work.wait()
    cm.wait()
    assert len(cm.works) == 1
    # Kinds or reduce ops mixed: torch refuses (or reduces all with the first op); c10d runs
    # them one by one.
    gathered = np.zeros(3)
    with dc._coalescing_manager():
        dist.all_reduce(ts[0], op=dist.ReduceOp.MAX)
        dist.all_reduce(ts[1])
        dist.all_gather_into_tensor(gathered, ts[0])
    assert (gathered == ts[0]).all()
    with pytest.raises(KeyError):
        with dc._coalescing_manager():
            dist.all_reduce(ts[0])
            raise KeyError("inside")
    assert not dc._world.pg_coalesce_state  # a failed block leaves nothing behind
    assert dc._inline_allreduce.get(None) is not None  # the inline path is back


def test_reducer_prepare_for_forward_and_logger(world1):
    params = [np.zeros(4, dtype=np.float32)]
    reducer = dist.Reducer(params, [[0]], [1 << 20], world1)
    logger = dist.Logger(reducer)
    reducer.set_logger(logger)
    reducer._set_ddp_runtime_logging_sample_rate(2)
    for _ in range(4):
        reducer.prepare_for_forward()
    logger.set_construction_data_and_log("Net", [], -1, True, False, False)
    logger._set_comm_hook_name("allreduce")
    data = logger._get_ddp_logging_data()
    assert data["module_name"] == "Net" and data["iteration"] == 2, data
    assert data["comm_hook"] == "allreduce" and data["broadcast_buffers"] == 1
    for setter, args in [
        ("_set_sparse_metadata", ({},)),
        ("_delay_all_reduce", ()),
        ("_set_mixed_precision_param_dtype", ("float16",)),
        ("_set_optimizer_in_backward", ()),
    ]:
        getattr(reducer, setter)(*args)
    assert isinstance(dist.DDPLoggingData().strs_map, dict)


def test_module_functions_of_the_bindings(world1):
    a, b = np.arange(4.0), np.arange(4.0)
    assert dist._hash_tensors([a]) == dist._hash_tensors([b]) != dist._hash_tensors([a + 1])
    dist._set_thread_isolation_mode(True)
    dist._set_global_rank(0)
    work = dist.all_reduce(np.ones(2), async_op=True)
    dist._register_work(np.ones(1), work)
    assert work.is_completed()
    data, size = dc._object_to_tensor({"k": [1, 2]}, "cpu", world1)
    assert data.dtype == np.uint8 and size.tolist() == [data.size]
    assert dc._tensor_to_object(data, size[0], world1) == {"k": [1, 2]}
    dc._set_pg_timeout(timedelta(seconds=7))
    assert world1._get_backend("cpu").options._timeout == timedelta(seconds=7)
    assert dist._DEFAULT_NO_TIMEOUT == timedelta(0)
    assert dist.TCPStore.collect_client_counters is not None
    dc._abort_process_group()
    assert not dist.is_initialized()


# --------------------------------------------------------------------------------------------
# GPU-only names


def test_gpu_only_names_say_what_is_missing():
    with pytest.raises(AttributeError, match="NCCL backend needs CUDA GPUs"):
        dist.ProcessGroupNCCL  # noqa: B018
    assert not hasattr(dist, "ProcessGroupUCC")  # hasattr checks keep working
    assert dist._SymmetricMemory.has_multicast_support() is False
    with pytest.raises(RuntimeError, match="needs CUDA GPUs"):
        dist._SymmetricMemory.empty_strided_p2p((2,), (1,), None, "cuda", "0")
    with pytest.raises(RuntimeError, match="needs CUDA GPUs"):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()


def test_cpu_gloo_cuda_nccl_backend_string_serves_cpu_tensors():
    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = np.ones(3)
        dist.all_reduce(t)
        assert (t == 1).all()
        assert dist.get_backend_config() == "cpu:gloo,cuda:nccl"
        with pytest.raises(Exception, match="cuda"):
            dist.group.WORLD._get_backend("cuda")
    finally:
        dist.destroy_process_group()


def test_importing_c10d_does_not_import_torch():
    import subprocess

    code = "import sys, c10d, c10d._functional_collectives; sys.exit('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    with warnings.catch_warnings():
        assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0
