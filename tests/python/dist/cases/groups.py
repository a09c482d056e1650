"""Cases of process groups: subgroups, re-initialization on one store, state queries, device
meshes, backend objects called directly, and the ProcessGroup methods' short forms."""

import os
import sys
from datetime import timedelta

import numpy as np

from .common import _raises


def subgroups(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    members = [r for r in range(world) if r % 2 == 0]
    g = dist.new_group(members[::-1])  # order does not matter: ranks are sorted
    # The worker's default group has a short timeout; a new group without one gets torch's
    # default (default_pg_timeout), with one that timeout.
    timed = dist.new_group(members, timeout=timedelta(seconds=7))
    if rank in members:
        assert g._timeout == dist.default_pg_timeout != dist.group.WORLD._timeout, g._timeout
        assert timed._timeout == timedelta(seconds=7), timed._timeout
        assert g is not dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_process_group_ranks(g) == members
        assert dist.get_rank(g) == members.index(rank)
        assert dist.get_world_size(g) == len(members)
        assert dist.get_global_rank(g, 0) == 0
        assert dist.get_group_rank(g, rank) == members.index(rank)
        t = np.full(2, rank, np.int64)
        dist.all_reduce(t, group=g)
        assert (t == sum(members)).all()
        t = np.full(2, rank, np.int64)
        dist.broadcast(t, src=members[-1], group=g)
        assert (t == members[-1]).all()
        t = np.full(2, rank, np.int64)
        dist.broadcast(t, group_src=0, group=g)
        assert (t == members[0]).all()
        out = [np.zeros(1, np.int64) for _ in members]
        dist.all_gather(out, np.array([rank]), group=g)
        assert [int(o[0]) for o in out] == members
        if len(members) > 1 and rank in members[:2]:
            peer = members[1] if rank == members[0] else members[0]
            buf = np.zeros(1, np.int64)
            if rank == members[0]:
                dist.send(np.array([rank]), peer, group=g)
            else:
                assert dist.recv(buf, peer, group=g) == peer
                assert buf[0] == peer
                buf[:] = 0
                # recv with group_src returns the group rank
        dist.barrier(group=g)
    else:
        assert g is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(g) == -1 and dist.get_world_size(g) == -1
        t = np.ones(2)
        assert dist.all_reduce(t, group=g) is None  # a no-op on non-members
        assert (t == 1).all()
        # batch_isend_irecv gives them no Works, as torch does (not [None]).
        assert dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 0, group=g)]) == []
    # new_subgroups: pairs of consecutive ranks.
    if world % 2 == 0:
        cur, subs = dist.new_subgroups(group_size=2)
        assert len(subs) == world // 2
        assert dist.get_process_group_ranks(cur) == [rank - rank % 2, rank - rank % 2 + 1]
        t = np.array([rank], np.int64)
        dist.all_reduce(t, group=cur)
        assert t[0] == 2 * (rank - rank % 2) + 1
    cur, subs = dist.new_subgroups_by_enumeration([[r] for r in range(world)])
    assert dist.get_world_size(cur) == 1
    assert dist.get_pg_count() >= 2
    # With use_local_synchronization only the members call new_group: the odd ranks here.
    odd = [r for r in range(1, world, 2)]
    if rank in odd:
        g = dist.new_group(odd, use_local_synchronization=True)
        t = np.array([rank], np.int64)
        dist.all_reduce(t, group=g)
        assert t[0] == sum(odd)
    # split_group: the parent's ranks in halves (the second may be empty), rank 0 left out.
    rest = list(range(1, world))
    halves = [h for h in (rest[: len(rest) // 2], rest[len(rest) // 2 :]) if h]
    if halves:
        g = dist.split_group(split_ranks=halves)
        if rank == 0:
            assert g is None
        else:
            mine = next(h for h in halves if rank in h)
            assert dist.get_process_group_ranks(g) == mine
            t = np.array([rank], np.int64)
            dist.all_reduce(t, group=g)
            assert t[0] == sum(mine)
    # The default group maps ranks to themselves, unchecked.
    assert dist.get_group_rank(dist.group.WORLD, world + 3) == world + 3
    assert dist.get_global_rank(dist.group.WORLD, world + 3) == world + 3
    # The world still works.
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == world


def reinit_on_one_store(dist, backend):
    """init/new_group/all_reduce/destroy again and again over one FileStore: each incarnation
    must not meet the keys of the one before (they once made rendezvous connect to closed
    ports or barriers pass early)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(os.environ["C10D_TEST_STORE_FILE"], world)
    for i in range(4):
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        g = dist.new_group(list(range(world)))
        t = np.array([rank + i], np.int64)
        dist.all_reduce(t, group=g)
        assert t[0] == sum(range(world)) + world * i, (i, t)
        dist.destroy_process_group()


def state_queries(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.is_initialized()
    assert dist.get_backend() == backend
    assert backend in dist.get_backend_config()
    assert dist.group.WORLD is dist.GroupMember.WORLD
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(world))
    try:
        dist.init_process_group(backend)
    except ValueError as e:
        assert "twice" in str(e)
    else:
        raise AssertionError("a second init_process_group did not raise")
    # torch's words for bad arguments.
    _raises(
        ValueError,
        lambda: dist.new_group([world]),
        "rank outside",
        "The new group's rank should be within the the world_size",
    )
    _raises(
        TypeError,
        lambda: dist.barrier(device_ids=0),
        "device_ids",
        "device_ids type should be List[int]",
    )
    _raises(TypeError, lambda: dist.all_reduce("x"), "a str", "Invalid function argument")
    _raises(
        ValueError,
        lambda: dist.gather_object(1, None, dst=rank),
        "no gather list",
        "Argument ``gather_list`` must be specified on destination rank",
    )
    # The private helpers torch-based tools call.
    dc = dist.distributed_c10d
    sub = dist.new_group(list(range(world))[::-1])  # sorted, as in torch
    assert dc._get_group_size(None) == world and dc._get_group_size(sub) == world
    config = dc._get_pg_config(sub)
    assert config["ranks"] == list(range(world)) and config["pg_size"] == world
    assert backend in config["backend_config"] and config["pg_desc"] == "undefined"
    assert dc._get_pg_config()["pg_desc"] == "default_pg"
    assert dc._get_process_group_name(sub) in [c["pg_name"] for c in dc._get_all_pg_configs()]
    assert dc._get_group_size_by_name(dc._get_process_group_name(sub)) == world
    assert dc._canonicalize_group_rank(sub, global_rank=rank) == rank
    assert dc._canonicalize_group_rank(sub, group_rank=world - 1, return_global=True) == world - 1
    _raises(ValueError, lambda: dc._canonicalize_group_rank(sub), "no rank given")
    _raises(ValueError, lambda: dc._check_not_self_rank(sub, sub.rank(), "source"), "self")
    assert dc._get_object_coll_device(sub) == "cpu" and dc._device_capability() == ["cpu"]
    _raises(TypeError, lambda: dc._check_valid_timeout(30), "timeout of int")
    store = dc._get_default_store()
    dc._store_based_barrier(rank, store, "case", world, timedelta(seconds=30))
    try:
        dc._store_based_barrier(rank, store, "short", world + 1, timedelta(milliseconds=200))
    except dist.DistStoreError as e:
        assert f"key: store_based_barrier_key:short (world_size={world + 1}" in str(e), e
    else:
        raise AssertionError("a store based barrier one rank short did not time out")
    dist.barrier()  # rank 0's store serves the others until they timed out too


def device_mesh(dist, backend):
    """init_device_mesh: a group along every dimension, coordinates, sub-meshes, and the
    functional collectives over a mesh or (mesh, dim)."""
    from c10d import _functional_collectives as funcol

    rank, world = dist.get_rank(), dist.get_world_size()
    line = dist.init_device_mesh("cpu", (world,))
    assert line.ndim == 1 and line.size() == world and line.get_local_rank() == rank
    assert dist.get_process_group_ranks(line.get_group()) == list(range(world))
    assert funcol.all_reduce(np.array([rank], np.int64), "sum", line)[0] == sum(range(world))
    _raises(ValueError, lambda: dist.init_device_mesh("cpu", (world + 1,)), "too many ranks")
    _raises(ValueError, lambda: dist.init_device_mesh("cuda", (world,)), "a cuda mesh")
    if world % 2:
        return
    cols = world // 2
    mesh = dist.init_device_mesh("cpu", (2, cols), mesh_dim_names=("dp", "tp"))
    row, col = divmod(rank, cols)
    assert mesh.shape == (2, cols) and mesh.size() == world and mesh.size("tp") == cols
    assert mesh.get_coordinate() == [row, col], mesh.get_coordinate()
    assert mesh.get_local_rank("dp") == row and mesh.get_local_rank(1) == col
    tp, dp = mesh.get_group("tp"), mesh.get_group(0)
    assert dist.get_process_group_ranks(tp) == [row * cols + c for c in range(cols)]
    assert dist.get_process_group_ranks(dp) == [col, cols + col]
    x = np.array([rank], np.int64)
    dist.all_reduce(x, group=tp)
    assert x[0] == sum(row * cols + c for c in range(cols)), x
    assert funcol.all_reduce(np.array([rank], np.int64), "sum", (mesh, 0))[0] == 2 * col + cols
    sub = mesh["dp"]
    assert sub.mesh.tolist() == [col, cols + col] and sub.get_group() is dp
    assert sub.mesh_dim_names == ("dp",) and sub.get_local_rank() == row
    assert mesh["tp", "dp"].mesh.tolist() == mesh.mesh.T.tolist()
    _raises(ValueError, lambda: mesh.get_group(), "a 2-D mesh's group without a dimension")
    _raises(KeyError, lambda: mesh["pp"], "an unknown dimension name")
    assert repr(mesh) == f"DeviceMesh('cpu', {mesh.mesh.tolist()}, mesh_dim_names=('dp', 'tp'))"
    assert isinstance(mesh.mesh, np.ndarray) or "torch" in sys.modules, type(mesh.mesh)
    try:
        import torch
    except ImportError:
        return
    # With torch loaded, .mesh is a tensor, as torch's DeviceMesh has it.
    assert isinstance(mesh.mesh, torch.Tensor) and mesh.mesh.size(0) == 2, mesh.mesh


def backend_object_checks(dist, backend):
    """A backend object called directly (c10d.ProcessGroupGloo(store, rank, size), as torch's
    own tests use it) validates like a group, in torch's words, and never crashes."""
    import re

    rank, world = dist.get_rank(), dist.get_world_size()
    raw = dist.ProcessGroupGloo(dist.PrefixStore("raw", dist._get_default_store()), rank, world)

    def refused(pattern, fn):
        try:
            fn()
        except ValueError as e:
            assert re.search(pattern, str(e)), (pattern, str(e))
            return
        raise AssertionError(f"nothing raised; expected {pattern!r}")

    t1, t2, f64 = np.zeros(1, np.float32), np.zeros(2, np.float32), np.zeros(1, np.float64)
    refused("requires non-empty tensor list", lambda: raw.allreduce([], dist.AllreduceOptions()))
    refused("invalid tensor type", lambda: raw.allreduce([t1, f64], dist.AllreduceOptions()))
    refused("invalid tensor size", lambda: raw.allreduce([t1, t2], dist.AllreduceOptions()))
    opts = dist.BroadcastOptions()
    opts.rootTensor = 0
    refused("invalid root tensor", lambda: raw.broadcast([], opts))
    opts = dist.ReduceOptions()
    opts.rootTensor = 1
    refused("invalid root tensor", lambda: raw.reduce([t1], opts))
    refused(
        "requires a single-element tensor list", lambda: raw.reduce([t1, t1], dist.ReduceOptions())
    )
    refused(
        "requires a single-element input tensor list",
        lambda: raw.gather([[t1] * world], [], dist.GatherOptions()),
    )
    if world > 1:
        refused(
            "requires empty output on non-root",
            lambda: raw.gather(
                [[t1] * world], [t1], _root_opts(dist.GatherOptions(), 1 - min(rank, 1))
            ),
        )
        refused(
            "Incorrect input list size 1. Input list size should be",
            lambda: (
                raw.scatter([t1], [[t1]], dist.ScatterOptions())
                if rank == 0
                else raw.scatter([t1], [[t1]], _root_opts(dist.ScatterOptions(), rank))
            ),
        )
        refused("takes a single tensor", lambda: raw.send([t1, t1], 1 - min(rank, 1), 0))
    refused(
        "requires input/output tensor lists to have the same length",
        lambda: raw.allgather([], [t1], dist.AllgatherOptions()),
    )
    refused(
        "invalid output tensor list",
        lambda: raw.allgather([[t1] * (world + 1)], [t1], dist.AllgatherOptions()),
    )
    # The backend still works, strided arrays included.
    t = np.asfortranarray(np.full((2, 3), rank + 1, np.float32))
    raw.allreduce([t], dist.AllreduceOptions()).wait()
    assert (t == world * (world + 1) / 2).all(), t


def _root_opts(opts, root):
    opts.rootRank = root
    return opts


def pg_overloads(dist, backend):
    """The ProcessGroup methods' short forms, as torch's bindings have them: a root or a
    reduce op instead of an options object."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    root = world - 1

    def one(v):
        return np.array([v], np.float32)

    t = one(rank + 1)
    pg.allreduce([t], dist.ReduceOp.MAX).wait()
    assert t[0] == world, t
    t = one(rank + 1)
    pg.allreduce(t).wait()
    assert t[0] == world * (world + 1) / 2, t
    t = one(rank)
    pg.broadcast(t, root).wait()
    assert t[0] == root, t
    t = one(rank + 1)
    pg.reduce(t, root, dist.ReduceOp.PRODUCT).wait()
    assert rank != root or t[0] == np.prod(np.arange(1, world + 1)), t
    gathered = [one(-1) for _ in range(world)]
    pg.gather(gathered if rank == root else [], one(rank), root).wait()
    assert rank != root or [g[0] for g in gathered] == list(range(world)), gathered
    t = one(-1)
    pg.scatter(t, [one(10 + r) for r in range(world)] if rank == root else [], root).wait()
    assert t[0] == 10 + rank, t
    t = one(-1)
    pg.reduce_scatter(t, [one(r) for r in range(world)], dist.ReduceOp.SUM).wait()
    assert t[0] == world * rank, t


def new_group_rank_lists_differ(dist, backend):
    """Ranks that pass new_group different rank lists all fail at creation naming both lists
    (they used to wire rank 0 and rank 2 into one group), and the next group still works."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = [0, 1] if rank == 0 else [1, 2]
    try:
        dist.new_group(ranks)
    except ValueError as e:
        assert "asked for a group of ranks" in str(e) and "[0,1]" in str(e) and "[1,2]" in str(e), e
    else:
        raise AssertionError(f"rank {rank}: new_group with differing rank lists returned")
    g = dist.new_group(list(range(world)))
    t = np.ones(2)
    dist.all_reduce(t, group=g)
    assert (t == world).all(), t


def reinit_cycles(dist, backend):
    """destroy_process_group() then init_process_group() with the same environment (one
    MASTER_PORT), again and again: every cycle meets the new store, never the one being torn
    down."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cycles = int(os.environ.get("C10D_TEST_CYCLES", "100"))
    for i in range(cycles):
        if i:
            dist.init_process_group(backend, timeout=timedelta(seconds=30))
        t = np.array([rank + i], np.int64)
        dist.all_reduce(t)
        assert t[0] == sum(range(world)) + world * i, (i, t)
        dist.destroy_process_group()
