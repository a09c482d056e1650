"""Cases of torch DDP's constructor arguments on c10d.DistributedDataParallel: side by side with
torch's own DDP (same model, same steps, same errors), and mixed_precision, which torch's own
cannot run on CPU."""

from .common import _raises


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
