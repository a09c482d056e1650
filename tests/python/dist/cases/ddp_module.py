"""Cases of c10d.DistributedDataParallel on torch modules, checked against locally computed
gradients: averaging, unused and sparse parameters, no_sync, comm hooks, logging, join."""

import numpy as np

from .common import _raises
from .ddp_common import _torch_or_skip


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
