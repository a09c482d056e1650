"""Cases of data-parallel gradient reduction below DistributedDataParallel: c10d.Reducer (on
numpy arrays and torch parameters), its comm hooks, and the start-up checks and broadcast."""

import time

import numpy as np

from .common import _raises
from .ddp_common import _torch_or_skip


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
