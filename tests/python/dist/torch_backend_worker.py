"""One rank of a c10d.torch_backend check: python torch_backend_worker.py CASE RANK WORLD PORT.

Each case runs torch.distributed operations on torch's own Gloo and on c10d's backends in the
same process, and fails (exit code != 0) on the first difference. Prints "OK <case>" at the end.
"""

import os
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as tdist

TIMEOUT = timedelta(seconds=30)


def env_init(rank, world, port):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )


def same(a, b, what, rounding=False):
    """a equals b exactly; with `rounding`, floating-point values within rounding of each other
    (sums of more than two ranks may be added in another order than Gloo's): a few units of
    their dtype's last place, or the relative tolerance `rounding` if it is a number."""
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), (what, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]", rounding)
        return
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
        if rounding and (a.is_floating_point() or a.is_complex()):
            tol = 8 * torch.finfo(a.real.dtype).eps if rounding is True else rounding
            assert torch.allclose(a, b, rtol=tol, atol=tol), (what, (a - b).abs().max())
        else:
            assert torch.equal(a, b), (what, a, b)
        return
    assert a == b, (what, a, b)


# --------------------------------------------------------------------------------------------


def run_all(group, rank, world):
    """Every operation once on `group`; returns the results, in order, for comparison."""
    g = torch.Generator().manual_seed(1234 + rank)
    out = []

    def rnd(*shape, dtype=torch.float32):
        if dtype.is_floating_point:
            return torch.randn(*shape, generator=g).to(dtype)
        return torch.randint(-50, 50, shape, generator=g, dtype=dtype)

    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32):
        for op in (
            tdist.ReduceOp.SUM,
            tdist.ReduceOp.MAX,
            tdist.ReduceOp.MIN,
            tdist.ReduceOp.PRODUCT,
        ):
            t = rnd(5, 3, dtype=dtype)
            tdist.all_reduce(t, op=op, group=group)
            out.append(t)
    for op in (tdist.ReduceOp.BAND, tdist.ReduceOp.BOR, tdist.ReduceOp.BXOR):
        t = rnd(7, dtype=torch.int64)
        tdist.all_reduce(t, op=op, group=group)
        out.append(t)
    # Sizes around c10d's and Gloo's algorithm switches.
    for n in (1, 1000, 70000):
        t = rnd(n)
        tdist.all_reduce(t, group=group)
        out.append(t)
    # Asynchronous: the Work, its future's value and result() all see the reduced tensor.
    t = rnd(10)
    work = tdist.all_reduce(t, group=group, async_op=True)
    fut = work.get_future()
    work.wait()
    assert work.is_completed() and work.is_success()
    value = fut.wait()
    assert value[0] is t or torch.equal(value[0], t)
    out.append(t)
    out.append(work.result()[0].clone())
    # A view of a larger tensor, reduced in place.
    base = rnd(4, 6)
    tdist.all_reduce(base[1:3], group=group)
    out.append(base)
    base = rnd(4, 6)
    tdist.all_reduce(base.t(), group=group)  # not contiguous: strides reach c10d as they are
    out.append(base)
    for dtype in (torch.float16, torch.bfloat16):
        t = rnd(5, dtype=dtype)
        tdist.all_reduce(t, group=group)
        out.append(t)
    c = torch.complex(rnd(4), rnd(4))
    tdist.all_reduce(c, group=group)
    out.append(c)

    t = rnd(9)
    tdist.broadcast(t, src=world - 1, group=group)
    out.append(t)
    t = rnd(3, dtype=torch.int64)
    tdist.broadcast(t, src=0, group=group, async_op=True).wait()
    out.append(t)

    t = rnd(6)
    tdist.reduce(t, dst=world - 1, group=group)
    if rank == world - 1:
        out.append(t)

    lst = [torch.empty(4) for _ in range(world)]
    tdist.all_gather(lst, rnd(4), group=group)
    out.append(lst)
    flat = torch.empty(world * 5, dtype=torch.int64)
    tdist.all_gather_into_tensor(flat, rnd(5, dtype=torch.int64), group=group)
    out.append(flat)

    o = torch.empty(3)
    tdist.reduce_scatter(o, [rnd(3) for _ in range(world)], group=group)
    out.append(o)
    o = torch.empty(4)
    tdist.reduce_scatter_tensor(o, rnd(4 * world), group=group)
    out.append(o)
    o = torch.empty(4, dtype=torch.int64)
    tdist.reduce_scatter_tensor(
        o, rnd(4 * world, dtype=torch.int64), op=tdist.ReduceOp.MAX, group=group
    )
    out.append(o)

    o = torch.empty(2 * world)
    tdist.all_to_all_single(o, rnd(2 * world), group=group)
    out.append(o)
    # Uneven splits: rank r sends r + i + 1 elements to rank i.
    in_splits = [rank + i + 1 for i in range(world)]
    out_splits = [i + rank + 1 for i in range(world)]
    o = torch.empty(sum(out_splits))
    tdist.all_to_all_single(o, rnd(sum(in_splits)), out_splits, in_splits, group=group)
    out.append(o)
    outs = [torch.empty(3) for _ in range(world)]
    tdist.all_to_all(outs, [rnd(3) for _ in range(world)], group=group)
    out.append(outs)

    root = world - 1
    gl = [torch.empty(3) for _ in range(world)] if rank == root else None
    tdist.gather(rnd(3), gl, dst=root, group=group)
    if rank == root:
        out.append(gl)
    o = torch.empty(2)
    sl = [rnd(2) for _ in range(world)] if rank == 0 else None
    tdist.scatter(o, sl, src=0, group=group)
    out.append(o)

    tdist.barrier(group=group)
    tdist.barrier(group=group, async_op=True).wait()

    # Point to point: a ring, blocking and not, and a receive from any source.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send = rnd(6)
    recv = torch.empty(6)
    if rank % 2 == 0:
        tdist.send(send, dst=nxt, group=group)
        tdist.recv(recv, src=prv, group=group)
    else:
        tdist.recv(recv, src=prv, group=group)
        tdist.send(send, dst=nxt, group=group)
    out.append(recv)
    recv = torch.empty(6)
    works = [tdist.isend(send, dst=nxt, group=group), tdist.irecv(recv, src=prv, group=group)]
    for w in works:
        w.wait()
    out.append(recv)
    ops = [tdist.P2POp(tdist.isend, send, nxt, group), tdist.P2POp(tdist.irecv, recv, prv, group)]
    for w in tdist.batch_isend_irecv(ops):
        w.wait()
    out.append(recv)
    if rank == 0:
        got = []
        for _ in range(world - 1):
            r = torch.empty(2)
            sender = tdist.recv(r, group=group)  # any source: returns the sender
            got.append((sender, r))
        got.sort(key=lambda p: p[0])
        out.append([s for s, _ in got])
        out.append([r for _, r in got])
    else:
        tdist.send(torch.full((2,), float(rank)), dst=0, group=group)

    objs = [None] * world
    tdist.all_gather_object(objs, {"rank": rank, "s": "x" * rank}, group=group)
    out.append(objs)
    lst = [rank, "abc"] if rank == 0 else [None, None]
    tdist.broadcast_object_list(lst, src=0, group=group)
    out.append(lst)

    # Coalesced forms.
    ts = [rnd(3), rnd(5)]
    with tdist._coalescing_manager(group=group):
        for t in ts:
            tdist.all_reduce(t, group=group)
    out.append(ts)
    outs = [torch.empty(2 * world), torch.empty(3 * world)]
    with tdist._coalescing_manager(group=group):
        tdist.all_gather_into_tensor(outs[0], rnd(2), group=group)
        tdist.all_gather_into_tensor(outs[1], rnd(3), group=group)
    out.append(outs)
    outs = [torch.empty(2), torch.empty(3)]
    with tdist._coalescing_manager(group=group):
        tdist.reduce_scatter_tensor(outs[0], rnd(2 * world), group=group)
        tdist.reduce_scatter_tensor(outs[1], rnd(3 * world), group=group)
    out.append(outs)
    with warnings.catch_warnings():  # the deprecated coalesced forms
        warnings.simplefilter("ignore")
        ts = [rnd(2), rnd(4)]
        tdist.all_reduce_coalesced(ts, group=group)
        out.append(ts)
        lists = [[torch.empty(2), torch.empty(3)] for _ in range(world)]
        tdist.all_gather_coalesced(lists, [rnd(2), rnd(3)], group=group)
        out.append(lists)

    # Sparse COO all_reduce (SUM), as Gloo supports it.
    idx = torch.tensor([[rank, 2], [0, rank]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0 + rank, 2.0]), (4, 4))
    tdist.all_reduce(sp, group=group)
    out.append(sp.to_dense())

    # Functional collectives (torch resolves the group by name in C++).
    import torch.distributed._functional_collectives as fc

    out.append(fc.all_reduce(rnd(4), "sum", group).wait())
    out.append(fc.all_gather_tensor(rnd(3), 0, group).wait())
    out.append(fc.reduce_scatter_tensor(rnd(2 * world), "sum", 0, group).wait())
    return out


def case_collectives(rank, world, port):
    env_init(rank, world, port)
    tdist.init_process_group("gloo", timeout=TIMEOUT)
    import c10d.torch_backend  # noqa: F401

    gloo = tdist.new_group(backend="gloo")
    groups = {
        name: tdist.new_group(backend=name, timeout=TIMEOUT)
        for name in ("c10d_shm", "c10d_gloo", "c10d")
    }
    for name, group in groups.items():
        assert type(group).__name__ == "ProcessGroupC10d", (name, group)
        assert tdist.get_backend(group) == name
        assert tdist.get_world_size(group) == world and tdist.get_rank(group) == rank
    assert groups["c10d"].c10d_group.name() == "shm"  # one host: the shm backend
    expected = run_all(gloo, rank, world)
    for name, group in groups.items():
        same(run_all(group, rank, world), expected, name, rounding=world > 2)
    # A subgroup of c10d_shm (ranks 0 and world-1), with its own group ranks.
    sub = tdist.new_group([0, world - 1], backend="c10d_shm")
    if rank in (0, world - 1):
        t = torch.tensor([float(rank)])
        tdist.all_reduce(t, group=sub)
        same(t, torch.tensor([float(world - 1)]), "subgroup")
        assert tdist.get_group_rank(sub, rank) == (0 if rank == 0 else 1)
    if world > 2:  # training at this size too, in the same processes (each start costs)
        compare_training(tdist.group.WORLD, groups["c10d_shm"], rank, world)
    tdist.destroy_process_group()
    assert not tdist.is_initialized()


def case_default(rank, world, port):
    """init_process_group("cpu:c10d_shm") as torch's default group, through torch's rendezvous."""
    env_init(rank, world, port)
    import c10d.torch_backend  # noqa: F401

    tdist.init_process_group("cpu:c10d_shm", timeout=TIMEOUT)
    assert type(tdist.group.WORLD).__name__ == "ProcessGroupC10d"
    t = torch.tensor([rank + 1.0])
    tdist.all_reduce(t)
    same(t, torch.tensor([world * (world + 1) / 2.0]), "default all_reduce")
    tdist.barrier()
    tdist.destroy_process_group()


# --------------------------------------------------------------------------------------------


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 8),
    )


class TwoHeads(torch.nn.Module):
    """One head is used only on even steps: find_unused_parameters must handle it."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 16)
        self.a = torch.nn.Linear(16, 4)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x, step):
        h = torch.relu(self.body(x))
        return self.a(h) if step % 2 else self.a(h) + self.b(h)


def train(group, rank, steps, **ddp_kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(0)
    # Ranks start from different weights: DDP broadcasts rank 0's.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)
    hook = ddp_kwargs.pop("hook", None)
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        opt.zero_grad()
        if step == 1:
            with ddp.no_sync():  # gradients accumulate locally, reduced with the next step
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_unused(group, rank, steps, static_graph=False):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = TwoHeads()
    ddp = DDP(
        model,
        process_group=group,
        find_unused_parameters=not static_graph,
        static_graph=static_graph,
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7 + rank)
    for step in range(steps):
        opt.zero_grad()
        ddp(torch.randn(8, 16, generator=g), 0 if static_graph else step).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_fsdp2(group, rank, steps):
    """FSDP2 (fully_shard) on a DeviceMesh over `group`, plus a DTensor redistribution."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = DeviceMesh.from_group(group, "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16, generator=g)).sum().backward()
        opt.step()
    d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    same(d.redistribute(mesh, [Replicate()]).to_local(), torch.arange(8.0), "DTensor")
    return [p.full_tensor() for p in model.parameters()]


def compare_training(gloo, shm, rank, world):
    """DDP (several configurations) and FSDP2 on `shm` against the same on `gloo`."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # Two ranks add in the one order there is; more may add in another order than Gloo, and
    # training carries those fp32 roundings along its steps.
    rounding = 1e-5 if world > 2 else False
    variants = [
        {},
        {"gradient_as_bucket_view": True},
        {"hook": default_hooks.allreduce_hook},
        {"hook": default_hooks.fp16_compress_hook},
    ]
    if world > 2:  # the variants' own paths are covered at two ranks: keep the run short
        variants = variants[:1]
    for kwargs in variants:
        a = train(gloo, rank, 5, **dict(kwargs))
        b = train(shm, rank, 5, **dict(kwargs))
        same(b, a, f"ddp {sorted(kwargs)}", rounding)
    if world == 2:
        same(train_unused(shm, rank, 4), train_unused(gloo, rank, 4), "find_unused_parameters")
        same(train_unused(shm, rank, 3, True), train_unused(gloo, rank, 3, True), "static_graph")
    same(train_fsdp2(shm, rank, 3), train_fsdp2(gloo, rank, 3), "fully_shard", rounding)
    # Every rank ends with the same parameters.
    params = train(shm, rank, 3)
    flat = torch.cat([p.flatten() for p in params])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    tdist.all_gather(everyone, flat, group=shm)
    for other in everyone:
        same(other, flat, "parameters across ranks")


def case_ddp(rank, world, port):
    env_init(rank, world, port)
    tdist.init_process_group("gloo", timeout=TIMEOUT)
    import c10d.torch_backend  # noqa: F401

    compare_training(tdist.group.WORLD, tdist.new_group(backend="c10d_shm"), rank, world)
    tdist.destroy_process_group()


# --------------------------------------------------------------------------------------------


def case_mirror(rank, world, port):
    """A program written for torch.distributed with `import c10d as dist` swapped in: torch's
    DistributedSampler, ZeroRedundancyOptimizer and DDP find c10d's group as torch's world.
    Started by torchrun (env:// from its variables)."""
    import c10d as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    assert not tdist.is_initialized()
    dist.init_process_group("shm", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert tdist.is_initialized() and tdist.get_rank() == rank
    assert tdist.get_world_size() == world
    # The same group: c10d's default group under torch's, which c10d takes for its own.
    assert tdist.group.WORLD.c10d_group is dist.group.WORLD
    assert dist.get_backend(tdist.group.WORLD) == dist.get_backend()
    assert dist.get_rank(tdist.group.WORLD) == rank
    assert dist.get_world_size(tdist.group.WORLD) == world
    data = TensorDataset(
        torch.arange(40, dtype=torch.float32).view(20, 2), torch.arange(20, dtype=torch.float32)
    )
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    assert sampler.rank == rank and sampler.num_replicas == world
    mine = sorted(int(i) for i in sampler)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    assert sorted(i for part in everyone for i in part) == list(range(20)), everyone

    def run(zero, group=None):
        model = make_model(0)
        ddp = DDP(model, process_group=group)
        if zero:
            opt = ZeroRedundancyOptimizer(
                ddp.parameters(), optimizer_class=torch.optim.SGD, process_group=group, lr=0.05
            )
        else:
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(5 + rank)
        loader = DataLoader(data, batch_size=4, sampler=sampler)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for _ in loader:
                x, y = torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    same(run(zero=True), run(zero=False), "ZeroRedundancyOptimizer vs SGD")
    # A c10d subgroup handed to torch's DDP and ZeroRedundancyOptimizer works as a torch group
    # of the same ranks, and goes from torch's world with the c10d group.
    sub = dist.new_group(list(range(world)), backend="gloo")
    same(run(zero=True, group=sub), run(zero=False), "on a c10d subgroup")
    views = [n for n in tdist.distributed_c10d._world.pg_names.values() if n.startswith("c10d_")]
    assert views == [f"c10d_{sub.group_name}"], views
    dist.destroy_process_group(sub)
    views = [n for n in tdist.distributed_c10d._world.pg_names.values() if n.startswith("c10d_")]
    assert views == [], views
    # c10d's own calls and torch's interleave on the one group.
    t = torch.ones(3)
    dist.all_reduce(t)
    tdist.all_reduce(t)
    same(t, torch.full((3,), float(world * world)), "interleaved")
    dist.destroy_process_group()
    assert not tdist.is_initialized() and not dist.is_initialized()
    # A second incarnation mirrors again.
    dist.init_process_group("gloo", timeout=TIMEOUT)
    assert tdist.get_backend() == "c10d_gloo"
    dist.destroy_process_group()
    assert not tdist.is_initialized()


# --------------------------------------------------------------------------------------------


def case_errors(rank, world, port):
    env_init(rank, world, port)
    tdist.init_process_group("gloo", timeout=TIMEOUT)
    import c10d
    import c10d.torch_backend  # noqa: F401

    short = timedelta(seconds=1)
    for name in ("c10d_shm", "c10d_gloo"):
        group = tdist.new_group(backend=name, timeout=short)
        # Bad arguments fail on the calling rank, before anything is sent.
        try:
            tdist.all_gather_into_tensor(torch.empty(3), torch.empty(2), group=group)
        except (ValueError, RuntimeError):
            pass
        else:
            raise AssertionError("mismatched sizes were accepted")
        # A collective that only rank 0 enters times out as torch's DistBackendError.
        tdist.barrier()
        if rank == 0:
            start = time.monotonic()
            for async_op in (False, True):
                try:
                    work = tdist.all_reduce(torch.ones(4), group=group, async_op=async_op)
                    if async_op:
                        work.wait()
                except tdist.DistBackendError as e:
                    assert isinstance(e, c10d.DistError), type(e).__mro__
                else:
                    raise AssertionError(f"{name}: all_reduce without peers did not fail")
            assert time.monotonic() - start < 20, time.monotonic() - start
        tdist.barrier()  # torch's Gloo world: the others wait here meanwhile
        # Futures report a failure too.
        if rank == 0:
            fut = tdist.all_reduce(torch.ones(4), group=group, async_op=True).get_future()
            try:
                fut.wait()
            except RuntimeError as e:  # a torch future's error: RuntimeError, as from Gloo's
                assert "DistBackendError" in str(e), (type(e), e)
            else:
                raise AssertionError("the future of a failed all_reduce completed")
        tdist.barrier()
    # DDP's reducer waits on those futures in C++: backward raises, without crashing.
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = tdist.new_group(backend="c10d_shm", timeout=short)
    ddp = DDP(torch.nn.Linear(4, 4), process_group=group)
    ddp(torch.randn(2, 4)).sum().backward()
    tdist.barrier()
    if rank == 0:
        start = time.monotonic()
        try:
            ddp(torch.randn(2, 4)).sum().backward()
        except RuntimeError as e:
            assert "Timed out" in str(e), e
        else:
            raise AssertionError("DDP's backward without its peers did not fail")
        assert time.monotonic() - start < 20, time.monotonic() - start
    tdist.barrier()
    tdist.destroy_process_group()


def case_killed(rank, world, port):
    """A rank that dies: the survivors' next collective raises instead of hanging."""
    env_init(rank, world, port)
    import c10d.torch_backend  # noqa: F401

    tdist.init_process_group("c10d_shm", timeout=timedelta(seconds=3))
    t = torch.ones(2)
    tdist.all_reduce(t)
    if rank == world - 1:
        os._exit(0)  # gone without a word
    start = time.monotonic()
    try:
        for _ in range(3):
            tdist.all_reduce(torch.ones(2))
    except tdist.DistError:
        pass
    else:
        raise AssertionError("all_reduce with a dead peer did not fail")
    assert time.monotonic() - start < 30
    print("OK killed", flush=True)
    os._exit(0)  # nothing more to tear down with a peer gone


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    case = sys.argv[1]
    if case == "mirror":  # started by torchrun: rank and world come from its environment
        CASES[case](int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0)
    else:
        CASES[case](int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    print(f"OK {case}", flush=True)
