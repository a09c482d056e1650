"""Cases of data-parallel gradient reduction: c10d.Reducer, comm hooks, and
DistributedDataParallel on torch modules."""

import time

import numpy as np

from .common import _raises


def _ddp_grads(rank, iteration):
    """Three float32 gradients and one float64, filled from (rank, iteration)."""
    shapes = [(3,), (2, 4), (5,), (6,)]
    dtypes = [np.float32, np.float32, np.float32, np.float64]
    return [
        np.arange(int(np.prod(s)), dtype=d).reshape(s) + 10 * rank + iteration
        for s, d in zip(shapes, dtypes)
    ]


def _ddp_reducer(dist, grads, limits=(16, 32), **kwargs):
    buckets, sizes = dist._compute_bucket_assignment_by_size(grads, list(limits))
    # Gradients arrive last parameter first, so the last bucket is reduced first.
    return dist.Reducer(
        grads, list(reversed(buckets)), list(reversed(sizes)), dist.group.WORLD, **kwargs
    )


def _ddp_expected(world, iteration):
    return [
        np.mean([g[i] for g in (_ddp_grads(r, iteration) for r in range(world))], axis=0)
        for i in range(4)
    ]


def ddp_waits_run_queued_reductions(dist, backend):
    """Waiting on a queued asynchronous operation's future (as the reducer does for its
    buckets, and users through get_future()) runs it: shm's worker only polls its queue every
    millisecond while asynchronous operations are in use, and each such wait took >= 1 ms."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grad = np.zeros(256, np.float32)
    reducer = dist.Reducer([grad], [[0]], [1 << 20], dist.group.WORLD)
    passes = 200
    start = time.perf_counter()
    for i in range(passes):
        reducer.prepare_for_backward()
        grad[...] = rank + i
        reducer._autograd_hook(0)
        assert np.all(grad == (world - 1) / 2 + i), (i, grad[:4])
    reducer_s = time.perf_counter() - start
    x = np.ones(256, np.float32)
    start = time.perf_counter()
    for _ in range(passes):
        x[...] = 1
        dist.all_reduce(x, async_op=True).get_future().wait()
        assert np.all(x == world), x[:4]
    future_s = time.perf_counter() - start
    # A few us each without the stall; 1 ms or more each with it.
    assert reducer_s < 0.15 and future_s < 0.15, (reducer_s, future_s)


def ddp_reducer(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads)
    assert len(reducer.bucket_indices) >= 3, reducer.bucket_indices
    for iteration in range(3):
        reducer.prepare_for_backward()
        for g, fresh in zip(grads, _ddp_grads(rank, iteration)):
            g[...] = fresh
        for i in reversed(range(len(grads))):
            reducer._autograd_hook(i)
        reducer._check_reducer_finalized()  # the last hook finished the pass
        for g, want in zip(grads, _ddp_expected(world, iteration)):
            assert np.allclose(g, want), (iteration, g, want)
    assert reducer.num_iterations == 3
    assert all(ns >= 0 for ns in reducer.get_backward_stats())
    # Outside a pass gradients stay local (what DDP's no_sync relies on).
    before = grads[0].copy()
    reducer._autograd_hook(0)
    assert np.array_equal(grads[0], before)
    # A gradient passed explicitly is read from, and receives the average.
    reducer.prepare_for_backward()
    separate = [g.copy() for g in _ddp_grads(rank, 7)]
    for i in reversed(range(4)):
        reducer._autograd_hook(i, grad=separate[i])
    for g, want in zip(separate, _ddp_expected(world, 7)):
        assert np.allclose(g, want)
    # A pass in which nothing was marked (a forward without backward) is simply dropped.
    reducer.prepare_for_backward()
    reducer.prepare_for_backward()
    reducer._reset_state()
    _raises(ValueError, lambda: reducer._autograd_hook(9), "hook of a parameter index too large")
    _raises(ValueError, lambda: dist.Reducer(grads, [[0, 1, 2, 3]], [], None), "no group")
    _raises(
        ValueError,
        lambda: dist.Reducer(grads, [[0, 1], [2]], [], dist.group.WORLD),
        "parameter 3 in no bucket",
    )
    _raises(
        ValueError,
        lambda: dist.Reducer(grads, [[0, 1, 2, 3]], [], dist.group.WORLD),
        "float32 and float64 in one bucket",
    )


def ddp_unused_parameters(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads, find_unused_parameters=True)
    reducer.prepare_for_backward()
    for i in (3, 0):
        reducer._autograd_hook(i)
    if rank == 0:
        reducer._autograd_hook(1)  # parameter 1 only on rank 0; parameter 2 on no rank
    untouched = grads[2].copy()
    reducer.finalize_backward()
    want = _ddp_expected(world, 0)
    assert np.allclose(grads[0], want[0]) and np.allclose(grads[3], want[3])
    assert np.allclose(grads[1], _ddp_grads(0, 0)[1] / world), grads[1]
    assert np.array_equal(grads[2], untouched)
    assert reducer._get_local_used_map().tolist() == [1, int(rank == 0), 0, 1]
    assert reducer._get_global_used_map().tolist() == [1, 1, 0, 1]

    # Without find_unused_parameters an unready parameter fails the next pass, named.
    strict = _ddp_reducer(dist, _ddp_grads(rank, 0), limits=(1 << 20,))
    strict.prepare_for_backward()
    strict._autograd_hook(0)
    try:
        strict.prepare_for_backward()
        raise AssertionError("a pass started over an unfinished one")
    except dist.DistError as e:
        assert "parameters 1, 2, 3" in str(e) and "find_unused_parameters" in str(e), e
    strict._reset_state()
    strict.prepare_for_backward()
    for i in range(4):
        strict._autograd_hook(i)
    _raises(
        dist.DistError,
        lambda: (strict.prepare_for_backward(), strict._autograd_hook(0), strict._autograd_hook(0)),
        "a gradient marked twice",
    )


def ddp_comm_hooks(dist, backend):
    from c10d.algorithms.ddp_comm_hooks import default_hooks

    rank, world = dist.get_rank(), dist.get_world_size()
    seen = []

    def recording_hook(state, bucket):
        seen.append(
            (
                bucket.index(),
                bucket.is_last(),
                [g.shape for g in bucket.gradients()],
                len(bucket.parameters()),
            )
        )
        return default_hooks.allreduce_hook(state, bucket)

    def doubling_hook(state, bucket):
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] * 2 / world)  # a new array as the result

    for name, register in [
        ("python allreduce", lambda r: dist._register_comm_hook(r, None, recording_hook)),
        (
            "python fp16",
            lambda r: dist._register_comm_hook(r, None, default_hooks.fp16_compress_hook),
        ),
        (
            "builtin fp16",
            lambda r: dist._register_builtin_comm_hook(r, dist.BuiltinCommHookType.FP16_COMPRESS),
        ),
        (
            "builtin allreduce",
            lambda r: dist._register_builtin_comm_hook(r, dist.BuiltinCommHookType.ALLREDUCE),
        ),
        ("then value", lambda r: dist._register_comm_hook(r, None, doubling_hook)),
    ]:
        grads = _ddp_grads(rank, 0)
        reducer = _ddp_reducer(dist, grads)
        register(reducer)
        _raises(dist.DistError, lambda: register(reducer), f"{name}: a second hook")
        reducer.prepare_for_backward()
        for i in reversed(range(4)):
            reducer._autograd_hook(i)
        scale = 2 if name == "then value" else 1
        tol = 1e-2 if "fp16" in name else 1e-6
        for g, want in zip(grads, _ddp_expected(world, 0)):
            assert np.allclose(g, want * scale, rtol=tol, atol=tol), (name, g, want)
    n = len(_ddp_reducer(dist, _ddp_grads(rank, 0)).bucket_indices)
    assert [s[0] for s in seen] == list(range(n)), seen
    assert [s[1] for s in seen] == [False] * (n - 1) + [True], seen
    assert seen[0][2] == [(6,)] and seen[0][3] == 1, seen

    # A hook that fails ends the pass on every rank (all fail alike here); the next works.
    calls = []

    def failing_once(state, bucket):
        calls.append(bucket.index())
        if len(calls) == 1:
            raise KeyError("hook failure")
        return default_hooks.allreduce_hook(state, bucket)

    grads = _ddp_grads(rank, 0)
    reducer = _ddp_reducer(dist, grads)
    dist._register_comm_hook(reducer, None, failing_once)
    reducer.prepare_for_backward()
    _raises(
        KeyError,
        lambda: [reducer._autograd_hook(i) for i in reversed(range(4))],
        "a failing comm hook",
    )
    reducer._check_reducer_finalized()
    reducer.prepare_for_backward()
    for i in reversed(range(4)):
        reducer._autograd_hook(i)
    for g, want in zip(grads, _ddp_expected(world, 0)):
        assert np.allclose(g, want)

    # The default hooks run on demand, on buckets of zeros.
    reducer = _ddp_reducer(dist, _ddp_grads(rank, 0))
    buckets = reducer._get_zeros_like_grad_buckets()
    assert len(buckets) == n and not buckets[0].buffer().any()
    fut = reducer._run_allreduce_hook(buckets[0])
    assert np.array_equal(fut.wait()[0], np.zeros(6))


def ddp_startup(dist, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    state = [
        np.full(5, rank, np.float32),
        np.full((2, 3), rank, np.float64),
        np.arange(300, dtype=np.float32) + rank,
    ]
    dist._broadcast_coalesced(dist.group.WORLD, state, 64, world - 1)
    assert (state[0] == world - 1).all() and (state[1] == world - 1).all()
    assert np.array_equal(state[2], np.arange(300) + world - 1)
    dist._verify_params_across_processes(dist.group.WORLD, state)
    if world == 1:
        return
    odd = state[:2] + ([np.zeros((30, 10), np.float32)] if rank == 1 else state[2:])
    try:
        dist._verify_params_across_processes(dist.group.WORLD, odd)
        raise AssertionError("a different shape passed the check")
    except dist.DistError as e:  # on every rank, so that none goes on alone
        if rank == 1:
            assert "parameter 2" in str(e) and "[30, 10]" in str(e), e
        else:
            assert "rank 1's parameters differ" in str(e), e
    fewer = state[:2] if rank == 0 else state
    _raises(
        dist.DistError,
        lambda: dist._verify_params_across_processes(dist.group.WORLD, fewer),
        "different parameter counts",
    )


def _torch_or_skip():
    """torch, or None after printing the harness's SKIP line when it is not installed."""
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return None
    return torch


def ddp_torch_params(dist, backend):
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2, 3))]
    reducer = dist.Reducer(params, [[1, 0]], [], dist.group.WORLD)
    reducer.prepare_for_backward()
    _raises(ValueError, lambda: reducer._autograd_hook(0), "a parameter without .grad")
    loss = (params[0].sum() + params[1].sum()) * (rank + 1)
    loss.backward()
    for i in (1, 0):
        reducer._autograd_hook(i)
    want = sum(r + 1 for r in range(world)) / world
    for p in params:
        assert torch.allclose(p.grad, torch.full_like(p, want)), p.grad


def ddp_unused_without_detection(dist, backend):
    """An unused parameter without find_unused_parameters: as in torch, backward() returns and
    the next forward raises that the reduction of the prior iteration never finished."""
    import torch

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(4, 1)
            self.unused = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    model = dist.DistributedDataParallel(TwoHeads())
    model(torch.ones(2, 4)).sum().backward()  # no error here
    try:
        model(torch.ones(2, 4))
    except RuntimeError as e:
        assert "Expected to have finished reduction in the prior iteration" in str(e), e
    else:
        raise AssertionError("the forward after an incomplete reduction did not raise")


def ddp_torch_module(dist, backend):
    """c10d.DistributedDataParallel on a torch model: rank 0's weights everywhere, gradients
    averaged (checked against every rank's gradient computed locally), unused parameters,
    no_sync."""
    torch = _torch_or_skip()
    if torch is None:
        return
    import copy

    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 3)
            self.b = torch.nn.Linear(3, 2)
            self.spare = torch.nn.Linear(3, 2)  # used on rank 0 only
            self.register_buffer("steps", torch.zeros(1))

        def forward(self, x, use_spare):
            h = torch.relu(self.a(x))
            return self.b(h).sum() + (self.spare(h).sum() if use_spare else 0)

    torch.manual_seed(rank)
    net = Net()
    net.steps += rank
    model = dist.DistributedDataParallel(net, find_unused_parameters=True)
    reference = copy.deepcopy(net)  # rank 0's weights, by now
    assert net.steps.item() == 0
    weights = [p.detach().clone() for p in net.parameters()]
    gathered = [None] * world
    dist.all_gather_object(gathered, [w.tolist() for w in weights])
    assert all(g == gathered[0] for g in gathered)

    def data(r):
        return torch.arange(8, dtype=torch.float32).reshape(2, 4) * (r + 1) / 8

    expected = [torch.zeros_like(p) for p in reference.parameters()]
    for r in range(world):
        reference.zero_grad()
        reference(data(r), r == 0).backward()
        for e, p in zip(expected, reference.parameters()):
            if p.grad is not None:
                e += p.grad / world
    model(data(rank), rank == 0).backward()
    for name, p, e in zip([n for n, _ in net.named_parameters()], net.parameters(), expected):
        # spare is used on rank 0 only: every rank gets the average as its gradient.
        assert torch.allclose(p.grad, e, atol=1e-6), (name, p.grad, e)
    # ... and the weights stay rank 0's (the average went to .grad, nowhere else).
    for p, w in zip(net.parameters(), weights):
        assert torch.equal(p.detach(), w)

    # gradient_as_bucket_view: .grad is the bucket's memory, averaged in place.
    torch.manual_seed(0)
    viewed = dist.DistributedDataParallel(torch.nn.Linear(3, 2), gradient_as_bucket_view=True)
    ptrs = [p.grad.data_ptr() for p in viewed.parameters()]
    viewed(torch.zeros(1, 3))  # a forward with grad enabled but no backward: dropped
    viewed(torch.full((1, 3), float(rank + 1))).sum().backward()
    assert [p.grad.data_ptr() for p in viewed.parameters()] == ptrs
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(viewed.module.weight.grad, torch.full((2, 3), mean))
    # The next forward regroups the buckets in the order the first backward produced the
    # gradients (once, as torch's DDP does): .grad follows the new buckets.
    assert not viewed.reducer._has_rebuilt_buckets()
    viewed.zero_grad(set_to_none=False)
    viewed(torch.full((1, 3), float(rank + 1))).sum().backward()
    assert viewed.reducer._has_rebuilt_buckets()
    assert torch.allclose(viewed.module.weight.grad, torch.full((2, 3), mean))
    views = [viewed.reducer._bucket_view(i) for i in range(2)]
    assert [p.grad.data_ptr() for p in viewed.parameters()] == [v.ctypes.data for v in views]
    assert viewed.reducer._rebuild_buckets() is False  # only once

    # Frozen parameters take rank 0's values too (torch syncs the whole module state).
    torch.manual_seed(rank)
    frozen = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    frozen[0].requires_grad_(False)
    tuned = dist.DistributedDataParallel(frozen)
    values = [None] * world
    dist.all_gather_object(values, frozen[0].weight.tolist())
    assert all(v == values[0] for v in values), values
    # torch.distributed's own hooks would fail inside backward(): refused up front.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks

    _raises(
        ValueError,
        lambda: tuned.register_comm_hook(None, torch_hooks.allreduce_hook),
        "a torch.distributed comm hook",
    )
    # A hook written as for torch's DDP: the bucket's tensors are torch tensors.
    hooked = dist.DistributedDataParallel(torch.nn.Linear(2, 1, bias=False))
    seen = []

    def torch_style_hook(state, bucket):
        buf = bucket.buffer()
        seen.append((type(buf), type(bucket.gradients()[0])))
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(world))

    hooked.register_comm_hook(None, torch_style_hook)
    hooked(torch.full((1, 2), float(rank + 1))).sum().backward()
    assert seen and seen[0] == (torch.Tensor, torch.Tensor), seen
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(hooked.module.weight.grad, torch.full((1, 2), mean)), (
        hooked.module.weight.grad
    )

    # no_sync: gradients stay local and accumulate; the next synced pass averages the sum.
    strict = dist.DistributedDataParallel(torch.nn.Linear(2, 1, bias=False))
    w = strict.module.weight
    with strict.no_sync():
        strict(torch.full((1, 2), float(rank + 1))).sum().backward()
    assert torch.equal(w.grad, torch.full((1, 2), float(rank + 1)))
    strict(torch.full((1, 2), 1.0)).sum().backward()
    mean = sum(r + 2 for r in range(world)) / world
    assert torch.allclose(w.grad, torch.full((1, 2), mean)), w.grad

    # _update_process_group: the model trains over another group from then on.
    other = dist.new_group(list(range(world)))
    strict._update_process_group(other)
    assert strict.process_group is other
    strict.zero_grad()
    strict(torch.full((1, 2), float(rank + 1))).sum().backward()
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(w.grad, torch.full((1, 2), mean)), w.grad


def ddp_logging_and_ignored(dist, backend):
    """_set_params_and_buffers_to_ignore_for_model: those stay local (weights, gradients and
    buffers); _get_ddp_logging_data reports the construction and the buckets as torch's."""
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 1)
            self.register_buffer("synced", torch.full((1,), float(rank)))
            self.register_buffer("kept", torch.full((1,), float(rank)))

        def forward(self, x):
            return self.b(self.a(x)).sum()

    torch.manual_seed(rank)
    m = M()
    own_weight = m.a.weight.detach().clone()
    dist.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        m, ["a.weight", "kept"]
    )
    model = dist.DistributedDataParallel(m, bucket_cap_mb=1)
    assert torch.equal(m.a.weight.detach(), own_weight)  # not rank 0's
    assert model.will_sync_module_buffers()
    for _ in range(3):
        model.zero_grad()
        model(torch.full((1, 3), float(rank + 1))).backward()
    assert m.synced.item() == 0 and m.kept.item() == rank, (m.synced, m.kept)
    # a.weight's gradient stays this rank's own (its input and b's weight, rank 0's).
    want = m.b.weight.detach().reshape(3, 1) * torch.full((1, 3), float(rank + 1))
    assert torch.allclose(m.a.weight.grad, want), (m.a.weight.grad, want)
    grads = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(grads, m.a.bias.grad.clone())
    assert all(torch.equal(g, grads[0]) for g in grads), grads  # reduced
    data = model._get_ddp_logging_data()
    assert data["module_name"] == "M" and data["world_size"] == world, data
    assert data["rank"] == rank and data["backend_name"] == backend, data
    assert data["bucket_cap_bytes"] == 1 << 20 and data["find_unused_parameters"] == 0, data
    assert data["num_parameter_tensors"] == 3, data  # a.bias, b.weight, b.bias
    assert data["total_parameter_size_bytes"] == 4 * 7, data
    assert data["bucket_sizes"] == "28" and data["dtypes"] == "float", data
    assert data["iteration"] == 2 and data["has_rebuilt_buckets"] == 1, data
    assert "static_graph" not in data and data["avg_forward_compute_time"] > 0, data
    static = dist.DistributedDataParallel(torch.nn.Linear(2, 1))
    static._set_static_graph()
    assert static._get_ddp_logging_data()["static_graph"] == 1
    # Without require_forward_param_sync the forward pass leaves the buffers alone.
    model.require_forward_param_sync = False
    assert not model.will_sync_module_buffers()
    m.synced.fill_(float(rank))
    model(torch.ones(1, 3)).backward()
    assert m.synced.item() == rank, m.synced


def ddp_sparse(dist, backend):
    """Parameters of modules with sparse=True get sparse gradients averaged over the group
    (torch's DDP on Gloo does that too): alone or beside dense ones, used on some ranks only,
    accumulated under no_sync, made dense by another use, and in join mode."""
    torch = _torch_or_skip()
    if torch is None:
        return
    import copy

    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 3, sparse=True)
            self.bag = torch.nn.EmbeddingBag(6, 2, mode="sum", sparse=True)
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, ids, use_bag, dense_use=False):
            out = self.lin(self.emb(ids)).sum()
            if use_bag:
                out = out + self.bag(ids[:2].reshape(1, 2) % 6).sum()
            if dense_use:  # the weight used densely too: its gradient becomes dense
                out = out + self.emb.weight.sum()
            return out

    def ids(r):
        return torch.tensor([r % 8, (r + 3) % 8, 5])

    torch.manual_seed(rank)
    net = Net()
    model = dist.DistributedDataParallel(net, find_unused_parameters=True)
    reference = copy.deepcopy(net)  # rank 0's weights, by now

    def expected(use_bag_on, dense_use=False, calls=((0, True),)):
        """The average over the ranks of each rank's local gradients (dense)."""
        want = [torch.zeros_like(p) for p in reference.parameters()]
        for r in range(world):
            reference.zero_grad(set_to_none=True)
            for shift, synced in calls:
                reference(ids(r + shift), use_bag_on(r), dense_use).backward()
            for w, p in zip(want, reference.parameters()):
                if p.grad is not None:
                    w += p.grad.to_dense() / world
        return want

    def check(what, want):
        for (name, p), w in zip(net.named_parameters(), want):
            got = torch.zeros_like(w) if p.grad is None else p.grad.to_dense()
            assert torch.allclose(got, w, atol=1e-6), (what, name, got, w)

    # The bag is used on rank 0 only: every rank gets the average of its gradient.
    model(ids(rank), rank == 0).backward()
    assert net.emb.weight.grad.is_sparse
    check("first pass", expected(lambda r: r == 0))
    model.zero_grad(set_to_none=True)
    model(ids(rank), True, dense_use=True).backward()
    assert not net.emb.weight.grad.is_sparse
    check("dense use", expected(lambda r: True, dense_use=True))
    # no_sync: the local gradients add up; the next synced pass averages the sum.
    model.zero_grad(set_to_none=True)
    with model.no_sync():
        model(ids(rank), True).backward()
    model(ids(rank + 1), True).backward()
    check("no_sync", expected(lambda r: True, calls=((0, False), (1, True))))

    # Only sparse parameters: the reducer has no bucket.
    torch.manual_seed(0)
    bag = dist.DistributedDataParallel(torch.nn.EmbeddingBag(5, 2, mode="sum", sparse=True))
    bag(torch.tensor([[rank % 5, 4]])).sum().backward()
    want = torch.zeros(5, 2)
    for r in range(world):
        want[r % 5] += 1 / world
        want[4] += 1 / world
    got = bag.module.weight.grad
    assert got.is_sparse and torch.allclose(got.to_dense(), want), got

    # Uneven inputs: rank r trains 1 + r steps; joined ranks give empty sparse gradients.
    torch.manual_seed(0)
    emb = dist.DistributedDataParallel(torch.nn.Embedding(4, 1, sparse=True))
    with emb.join():
        for step in range(1 + rank):
            emb.zero_grad(set_to_none=True)
            emb(torch.tensor([rank % 4])).sum().backward()
            training = [r for r in range(world) if 1 + r > step]
            want = torch.zeros(4, 1)
            for r in training:
                want[r % 4] += 1 / world
            got = emb.module.weight.grad.to_dense()
            assert torch.allclose(got, want), (step, got, want)
    dist.barrier()


def ddp_join(dist, backend):
    """model.join() with uneven inputs (rank r trains 2 + r steps): no hang; each step's
    gradient is the sum over the ranks still training divided by the world size (or by how
    many still train); afterwards every rank holds the last joiner's weights. With
    throw_on_early_termination every rank raises when the first runs out."""
    torch = _torch_or_skip()
    if torch is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = 2 + rank
    for divide_by_world, find_unused in [(True, False), (False, True)]:
        torch.manual_seed(0)
        model = dist.DistributedDataParallel(
            torch.nn.Linear(3, 1, bias=False), find_unused_parameters=find_unused
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with model.join(divide_by_initial_world_size=divide_by_world):
            for step in range(steps):
                opt.zero_grad()
                model(torch.full((1, 3), float(rank + 1))).sum().backward()
                training = [r for r in range(world) if 2 + r > step]
                want = sum(r + 1 for r in training) / (world if divide_by_world else len(training))
                grad = model.module.weight.grad
                assert torch.allclose(grad, torch.full_like(grad, want)), (step, grad, want)
                opt.step()
        weights = [np.zeros(3, np.float32) for _ in range(world)]
        dist.all_gather(weights, model.module.weight.detach().reshape(-1).numpy().copy())
        assert all(np.array_equal(w, weights[0]) for w in weights), weights
    if world == 1:
        return
    model = dist.DistributedDataParallel(torch.nn.Linear(3, 1, bias=False))
    raised = False
    try:
        with model.join(throw_on_early_termination=True):
            for _ in range(steps):
                model(torch.ones(1, 3)).sum().backward()
    except RuntimeError as e:
        raised = "exhausted" in str(e)
    assert raised, "throw_on_early_termination raised nothing"
    dist.barrier()


def _torch_side_by_side(dist):
    """torch.distributed's gloo group beside c10d's (on a FileStore named by the test)."""
    import os

    import torch.distributed as tdist

    store = tdist.FileStore(os.environ["C10D_TEST_TORCH_STORE"], dist.get_world_size())
    tdist.init_process_group(
        "gloo", store=store, rank=dist.get_rank(), world_size=dist.get_world_size()
    )
    return tdist


def _same_error(ours, theirs, what):
    """Both calls raise the same exception type, c10d's message starting with torch's."""
    import warnings

    errors = []
    for fn in (ours, theirs):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except Exception as e:  # noqa: BLE001 (compared below)
            errors.append(e)
        else:
            errors.append(None)
    got, want = errors
    assert want is not None, f"{what}: torch raised nothing"
    assert type(got) is type(want), f"{what}: c10d raised {got!r}, torch {want!r}"
    assert str(got).startswith(str(want)), f"{what}: c10d said {got}, torch {want}"


def ddp_torch_arguments(dist, backend):
    """Every constructor argument of torch's DistributedDataParallel, given to c10d's and to
    torch's (on its own gloo group, in the same process) on copies of one model: gradients,
    parameters, buffers and bucket layouts agree step by step, and the argument errors are
    torch's."""
    import contextlib
    import copy
    import warnings

    import torch
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    rank, world = dist.get_rank(), dist.get_world_size()
    tdist = _torch_side_by_side(dist)

    class Net(torch.nn.Module):
        def __init__(self, spare=False):
            super().__init__()
            self.a = torch.nn.Linear(4, 5)
            self.b = torch.nn.Linear(5, 5)
            self.c = torch.nn.Linear(5, 2)
            if spare:
                self.spare = torch.nn.Linear(5, 2)  # used by no rank
            self.register_buffer("count", torch.full((1,), float(rank)))

        def forward(self, x):
            self.count += 1
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    def data(step):
        return (torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1) + step) / 10

    def pair(args=lambda module, side: {}, make=Net):
        """(c10d's, torch's) models on copies of one rank-dependent module."""
        torch.manual_seed(100 + rank)
        net = make()
        models = []
        for side, cls in (("c10d", dist.DistributedDataParallel), ("torch", TorchDDP)):
            module = copy.deepcopy(net)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # broadcast_buffers' FutureWarning
                models.append(cls(module, **args(module, side)))
        return models

    def state(model):
        module = getattr(model, "module", model)
        return [p.detach().clone() for p in module.parameters()] + [
            b.clone() for b in module.buffers()
        ]

    def step(model, i, scale=None, no_sync=False):
        with model.no_sync() if no_sync else contextlib.nullcontext():
            x = data(i) if scale is None else data(i) * scale
            model(x).sum().backward()
        if isinstance(model, TorchDDP):
            tdist.barrier()  # the delayed all_reduce is never waited for by torch itself

    def train(model, steps=3, scale=None, no_sync_steps=()):
        """Per step: the gradients (None kept) and the state after an SGD step."""
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for i in range(steps):
            if i not in no_sync_steps:
                opt.zero_grad()
            step(model, i, scale, no_sync=i in no_sync_steps)
            grads = [None if p.grad is None else p.grad.clone() for p in model.module.parameters()]
            if i not in no_sync_steps:
                opt.step()
            out.append((grads, state(model)))
        return out

    def agree(ours, theirs, what, **kwargs):
        for i, (a, b) in enumerate(zip(train(ours, **kwargs), train(theirs, **kwargs))):
            for kind, xs, ys in (("grad", a[0], b[0]), ("state", a[1], b[1])):
                for k, (x, y) in enumerate(zip(xs, ys)):
                    assert (x is None) == (y is None), (what, i, kind, k, x, y)
                    assert x is None or torch.allclose(x, y, rtol=1e-5, atol=1e-6), (
                        what,
                        i,
                        kind,
                        k,
                        x,
                        y,
                    )

    def buckets(model):
        """The bucket sizes at construction, and after regrouping."""
        data = model._get_ddp_logging_data()
        return data.get("bucket_sizes"), data.get("rebuilt_bucket_sizes")

    try:
        # Defaults: rank 0's state everywhere, one bucket for the first iteration, then
        # regrouped in gradient order.
        ours, theirs = pair()
        assert all(torch.equal(x, y) for x, y in zip(state(ours), state(theirs)))
        assert buckets(ours) == buckets(theirs), (buckets(ours), buckets(theirs))
        agree(ours, theirs, "defaults")
        assert buckets(ours) == buckets(theirs), (buckets(ours), buckets(theirs))
        for name in (
            "bucket_bytes_cap",
            "bucket_bytes_cap_list",
            "bucket_bytes_cap_default",
            "forward_sync_buffers",
            "broadcast_buffers",
            "static_graph",
            "device_ids",
            "output_device",
            "parameters_to_ignore",
        ):
            assert getattr(ours, name) == getattr(theirs, name), (name, getattr(ours, name))

        # init_sync=False: every rank keeps its own state (no check, no broadcast).
        ours, theirs = pair(lambda m, s: {"init_sync": False})
        torch.manual_seed(100 + rank)
        own = state(Net())
        for x, y, z in zip(state(ours), state(theirs), own):
            assert torch.equal(x, z) and torch.equal(y, z), (x, y, z)
        agree(ours, theirs, "init_sync=False")

        # broadcast_buffers=False: buffers stay local at init too; forward_sync_buffers=False
        # syncs them at init only.
        for args in (
            {"broadcast_buffers": False},
            {"forward_sync_buffers": False},
            {"broadcast_buffers": True, "forward_sync_buffers": False},
        ):
            ours, theirs = pair(lambda m, s, args=args: args)
            assert ours.module.count.item() == theirs.module.count.item(), args
            assert ours.broadcast_buffers == theirs.broadcast_buffers is False, args
            agree(ours, theirs, f"buffers {args}")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            dist.DistributedDataParallel(Net(), broadcast_buffers=True, check_reduction=True)
        assert sorted(type(w.message).__name__ for w in seen) == ["FutureWarning"] * 2, seen

        # device_mesh: a 1-D mesh's group.
        from torch.distributed.device_mesh import init_device_mesh as torch_mesh

        meshes = {
            "c10d": dist.init_device_mesh("cpu", (world,)),
            "torch": torch_mesh("cpu", (world,)),
        }
        ours, theirs = pair(lambda m, s: {"device_mesh": meshes[s]})
        assert ours.device_mesh is meshes["c10d"]
        agree(ours, theirs, "device_mesh")
        _same_error(
            lambda: dist.DistributedDataParallel(
                Net(), process_group=dist.group.WORLD, device_mesh=meshes["c10d"]
            ),
            lambda: TorchDDP(Net(), process_group=tdist.group.WORLD, device_mesh=meshes["torch"]),
            "process_group and device_mesh",
        )
        flat = {
            "c10d": dist.init_device_mesh("cpu", (1, world)),
            "torch": torch_mesh("cpu", (1, world)),
        }
        try:
            dist.DistributedDataParallel(Net(), device_mesh=flat["c10d"])
        except RuntimeError as e:
            assert str(e).startswith("Only 1D device mesh is supported, but got "), e
        else:
            raise AssertionError("a 2-D mesh was accepted")
        _raises(RuntimeError, lambda: TorchDDP(Net(), device_mesh=flat["torch"]), "torch 2-D")

        # Delayed all_reduce: b's and c's parameters stay out of the buckets and are averaged
        # when a.weight's gradient (the last) is computed; under no_sync too, as in torch.
        def delayed(m, s):
            return {
                "delay_all_reduce_named_params": [
                    (n, p) for n, p in m.named_parameters() if n[0] in "bc"
                ],
                "param_to_hook_all_reduce": m.a.weight,
            }

        ours, theirs = pair(delayed)
        assert ours.parameters_to_ignore == theirs.parameters_to_ignore
        assert len(ours._params) == 1 + 1 and not ours._delay_all_reduce_all_params
        agree(ours, theirs, "delay_all_reduce_named_params")
        ours, theirs = pair(delayed)
        agree(ours, theirs, "delayed, no_sync", steps=4, no_sync_steps=(0, 2))
        ours, theirs = pair(lambda m, s: {"init_sync": False, **delayed(m, s)})
        agree(ours, theirs, "delayed, init_sync=False")
        # Every parameter that requires a gradient delayed (c is frozen): no reducer, no
        # start-up sync but of the delayed parameters. The hook sits on an input scale (a
        # delayed parameter's gradient would race with the all_reduce, in torch too).
        scales = {}

        def all_delayed(m, s):
            m.c.requires_grad_(False)
            scales[s] = torch.ones(1, requires_grad=True)
            return {
                "delay_all_reduce_named_params": [
                    (n, p) for n, p in m.named_parameters() if n[0] in "ab"
                ],
                "param_to_hook_all_reduce": scales[s],
            }

        _same_error(
            lambda: dist.DistributedDataParallel(
                Net(),
                delay_all_reduce_named_params=list(Net().named_parameters()),
                param_to_hook_all_reduce=torch.ones(1, requires_grad=True),
            ),
            lambda: TorchDDP(
                Net(),
                delay_all_reduce_named_params=list(Net().named_parameters()),
                param_to_hook_all_reduce=torch.ones(1, requires_grad=True),
            ),
            "every parameter delayed",
        )
        ours, theirs = pair(all_delayed)
        assert all(torch.equal(x, y) for x, y in zip(state(ours), state(theirs)))
        assert ours._delay_all_reduce_all_params and theirs._delay_all_reduce_all_params
        # torch 2.13's forward fails in this mode (its constructor returns before setting
        # _lazy_init_ran): c10d's gradients are checked against the average of local ones.
        plain = copy.deepcopy(ours.module)
        for i in range(3):
            ours.zero_grad()
            step(ours, i, scale=scales["c10d"])
            plain.zero_grad()
            plain(data(i)).sum().backward()
            for name, p in plain.named_parameters():
                if p.grad is None:
                    continue
                want = p.grad.clone()
                dist.all_reduce(want)
                got = ours.module.get_parameter(name).grad
                assert torch.allclose(got, want / world, atol=1e-6), (name, i, got, want)
            assert ours.module.c.weight.grad is None
        _same_error(
            lambda: dist.DistributedDataParallel(Net(), param_to_hook_all_reduce=Net().a.weight),
            lambda: TorchDDP(Net(), param_to_hook_all_reduce=Net().a.weight),
            "param_to_hook_all_reduce alone",
        )

        # skip_all_reduce_unused_params: the buckets of the parameters no rank uses are not
        # reduced (torch's num_buckets_reduced says how many were).
        for skip in (False, True):
            ours, theirs = pair(
                lambda m, s, skip=skip: {
                    "find_unused_parameters": True,
                    "bucket_cap_mb": 0.00001,
                    "skip_all_reduce_unused_params": skip,
                },
                make=lambda: Net(spare=True),
            )
            assert buckets(ours) == buckets(theirs), (buckets(ours), buckets(theirs))
            agree(ours, theirs, f"skip_all_reduce_unused_params={skip}")
            reduced = [m._get_ddp_logging_data().get("num_buckets_reduced") for m in (ours, theirs)]
            assert reduced[0] == reduced[1] and reduced[0] is not None, (skip, reduced)

        # bucket_cap_mb and bucket_cap_mb_list: torch's layouts, before and after regrouping.
        for args in (
            {"bucket_cap_mb": 0.00002},
            {"bucket_cap_mb_list": [0.00002]},
            {"bucket_cap_mb_list": [0.0000001, 0.00002]},
            {"bucket_cap_mb_list": [0.00001, 0.00003, 0.00003]},
            {"bucket_cap_mb": 0.00002, "find_unused_parameters": True},
        ):
            ours, theirs = pair(lambda m, s, args=args: args)
            assert buckets(ours) == buckets(theirs), (args, buckets(ours), buckets(theirs))
            assert ours.bucket_bytes_cap == theirs.bucket_bytes_cap, args
            agree(ours, theirs, f"buckets {args}")
            assert buckets(ours) == buckets(theirs), (args, buckets(ours), buckets(theirs))
        _raises(
            NotImplementedError,
            lambda: dist.DistributedDataParallel(Net(), bucket_cap_mb_list=[1, 2, 3]),
            "three different bucket limits",
        )

        # The rest: static_graph, gradient_as_bucket_view, batched_grad_copy (no effect on
        # CPU), check_reduction (a deprecation warning).
        for args in (
            {"static_graph": True},
            {"gradient_as_bucket_view": True},
            {"batched_grad_copy": True},
            {"check_reduction": True},
            {"dim": 1, "output_device": 0, "device_ids": []},
        ):
            ours, theirs = pair(lambda m, s, args=args: args)
            agree(ours, theirs, f"{args}")

        # Methods torch's users touch.
        ours, theirs = pair()
        for model in (ours, theirs):
            active = []
            model.module.register_forward_hook(
                lambda *_, model=model: active.append(type(model)._get_active_ddp_module())
            )
            model(data(0)).sum().backward()
            assert active == [model] and type(model)._get_active_ddp_module() is None
            model._check_reducer_finalized()
            assert model._distributed_rank == rank and model.will_sync_module_buffers()
            assert len(list(model._get_data_parallel_params(model.module))) == 6
        _same_error(
            lambda: ours._set_ddp_runtime_logging_sample_rate(0),
            lambda: theirs._set_ddp_runtime_logging_sample_rate(0),
            "sample rate 0",
        )
        _same_error(
            lambda: ours.register_comm_hook(None, 3),
            lambda: theirs.register_comm_hook(None, 3),
            "a hook that is no callable",
        )
        # Without the reducer's hooks, gradients stay local.
        ours._remove_autograd_hooks()
        theirs._remove_autograd_hooks()
        agree(ours, theirs, "_remove_autograd_hooks")

        # skip_all_reduce_unused_params with a comm hook of the user's (torch-style: on torch
        # tensors, returning a future of c10d's for c10d and of torch's for torch).
        def hook_for(side):
            def hook(state, bucket):
                collective = dist if side == "c10d" else tdist
                fut = collective.all_reduce(bucket.buffer(), async_op=True).get_future()
                return fut.then(lambda f: f.value()[0].div_(world))

            return hook

        ours, theirs = pair(
            lambda m, s: {
                "find_unused_parameters": True,
                "skip_all_reduce_unused_params": True,
                "bucket_cap_mb": 0.00001,
            },
            make=lambda: Net(spare=True),
        )
        ours.register_comm_hook(None, hook_for("c10d"))
        theirs.register_comm_hook(None, hook_for("torch"))
        agree(ours, theirs, "skip_all_reduce_unused_params with a comm hook")
        reduced = [m._get_ddp_logging_data().get("num_buckets_reduced") for m in (ours, theirs)]
        assert reduced[0] == reduced[1], reduced

        # Argument errors, as torch's.
        _same_error(
            lambda: dist.DistributedDataParallel(Net(), device_ids=[0]),
            lambda: TorchDDP(Net(), device_ids=[0]),
            "device_ids=[0]",
        )
        _same_error(
            lambda: dist.DistributedDataParallel(Net(), device_ids=[0, 1]),
            lambda: TorchDDP(Net(), device_ids=[0, 1]),
            "two device_ids",
        )
        frozen = Net().requires_grad_(False)
        _same_error(
            lambda: dist.DistributedDataParallel(frozen),
            lambda: TorchDDP(frozen),
            "no parameter requires grad",
        )
        lazy = torch.nn.Sequential(torch.nn.LazyLinear(2))
        _same_error(
            lambda: dist.DistributedDataParallel(lazy),
            lambda: TorchDDP(lazy),
            "an uninitialized parameter",
        )
        dist.barrier()
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def ddp_mixed_precision(dist, backend):
    """mixed_precision's reduce_dtype: gradients summed in that dtype (rounding and all),
    divided by the group size and written back in the parameters' dtype; buffer_dtype: the
    buffers take it (and are broadcast in it). param_dtype raises NotImplementedError (torch's
    mixed precision needs device streams and events: it fails on CPU)."""
    import torch
    from torch.nn.parallel.distributed import _MixedPrecision

    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(3, 1, bias=False)
            self.register_buffer("mean", torch.full((3,), float(rank) + 0.1))
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

        def forward(self, x):
            return self.w(x + self.mean)

    # Gradients of w: x + mean (rank 0's buffer), values fp16 must round.
    def x(r):
        return torch.tensor([[2049.0 + r, 1.0 / 3 + r, 7.0]])

    for reduce_dtype in (torch.float16, torch.bfloat16, None):
        for hooked in (False, True):
            model = dist.DistributedDataParallel(
                Net(),
                mixed_precision=_MixedPrecision(
                    reduce_dtype=reduce_dtype, buffer_dtype=torch.bfloat16
                ),
            )
            assert model.module.mean.dtype == torch.bfloat16, model.module.mean
            assert model.module.steps.dtype == torch.int64  # only floating-point buffers
            assert (
                model.module.mean.float().tolist()
                == torch.full((3,), 0.1, dtype=torch.bfloat16).float().tolist()
            )
            if hooked:  # as torch: its mixed precision is a comm hook of its own
                _raises(
                    RuntimeError,
                    lambda: model.register_comm_hook(None, lambda s, b: None),
                    "a comm hook beside mixed precision",
                )
            for step in range(2):
                model.zero_grad()
                model(x(rank) + step).sum().backward()
                local = [
                    (x(r) + step + model.module.mean.float()).reshape(-1) for r in range(world)
                ]
                if reduce_dtype is None:
                    want = sum(local) / world
                else:
                    # One rounding per rank's gradient; the sums and the division then in
                    # reduce_dtype (each partial sum rounded: exact here for world <= 2).
                    wire = [g.to(reduce_dtype) for g in local]
                    total = wire[0]
                    for g in wire[1:]:
                        total = total + g
                    want = (total / world).float()
                got = model.module.w.weight.grad
                assert got.dtype == torch.float32
                # Exact but for the order of the sums with more than two ranks.
                rtol = 1e-6 if world <= 2 or reduce_dtype is None else 1e-2
                assert torch.allclose(got.reshape(-1), want, rtol=rtol, atol=0), (
                    reduce_dtype,
                    step,
                    got,
                    want,
                )
    # In reduce_dtype the average differs from float32's.
    if world == 2:
        model = dist.DistributedDataParallel(
            torch.nn.Linear(1, 1, bias=False),
            mixed_precision=_MixedPrecision(reduce_dtype=torch.float16),
        )
        model(torch.tensor([[2049.0 + rank]])).sum().backward()
        assert model.module.weight.grad.item() == 2048.0, model.module.weight.grad
    _raises(
        NotImplementedError,
        lambda: dist.DistributedDataParallel(
            Net(), mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16)
        ),
        "param_dtype",
    )
    dist.barrier()
