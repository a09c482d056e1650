"""Runs PyTorch's own distributed test suite (DistributedTest._DistTestBase, from the installed
torch wheel: torch/testing/_internal/distributed/distributed_test.py; nothing is copied) on
c10d, through either door, the way torch's test/distributed/test_distributed_spawn.py runs it,
with the fork start method:

    --door torch   torch.distributed on torch's own backend (the baseline: --backend gloo)
    --door plugin  torch.distributed on c10d's backends (--backend c10d_shm or c10d_gloo)
    --door c10d    the test module's `dist` is c10d (--backend gloo or shm); torch's DDP and
                   algorithms see c10d's default group through its mirror in torch

    python tests/torch_suite/run.py --door c10d --backend gloo [-k pattern] [--world-size 2]

Prints every test's outcome and the counts; exits non-zero when a test fails that is not
listed in REFUSED (failures whose cause lies in torch, with the reason).
"""

import argparse
import fnmatch
import os
import shutil
import sys
import tempfile
import time
import types
import unittest

# Failures whose cause lies in torch, by (door, test): c10d cannot change them.
_MONITORED = "torch's frontend runs monitored_barrier on groups of its own Gloo only"
_HOOK_TYPES = (
    "the hook is annotated with c10d's GradBucket and returns c10d's Future (the module's "
    "dist is c10d); torch's DDP takes its own types only"
)
REFUSED = {
    ("plugin", "test_monitored_barrier_gloo"): _MONITORED,
    ("plugin", "test_monitored_barrier_gloo_subgroup"): _MONITORED,
    ("plugin", "test_monitored_barrier_failure_order"): _MONITORED,  # from world size 3
    ("plugin", "test_monitored_barrier_wait_all_ranks"): _MONITORED,  # from world size 3
    ("plugin", "test_get_backend"): "torch names the group's backend as registered "
    "(c10d_gloo), the test expects BACKEND's name (gloo)",
    ("c10d", "test_get_backend"): "on shm c10d names the backend shm, the test expects "
    "BACKEND's name (gloo)",
    ("c10d", "test_ddp_logging_data_cpu"): "torch's DDP logs its group's backend name, which "
    "for torch's view of c10d's gloo group is c10d_gloo: named gloo, torch's DDP would take it "
    "for its own ProcessGroupGloo and look inside (on shm it passes)",
    ("c10d", "test_accumulate_gradients_no_sync_allreduce_hook"): _HOOK_TYPES,
    ("c10d", "test_accumulate_gradients_no_sync_allreduce_with_then_hook"): _HOOK_TYPES,
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--door", choices=["torch", "plugin", "c10d"], required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("-k", dest="patterns", action="append", default=[], help="fnmatch pattern")
    p.add_argument("--verbose", action="store_true")
    return p.parse_args()


def name_of(test):
    return test.id().rsplit(".", 1)[-1]


def door(module, backend):
    """`module` (torch.distributed or c10d) for the suite, with its default group made on
    `backend` where the suite asks for "gloo": its tests run the gloo branches they pick by
    name (BACKEND stays "gloo")."""

    class Door(types.ModuleType):
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def init_process_group(*args, backend=None, **kwargs):
            return module.init_process_group(*args, backend=door_backend(backend), **kwargs)

    def door_backend(asked):
        return backend if asked == "gloo" else asked

    return Door(module.__name__)


def main():
    args = parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "python"))
    temp = tempfile.mkdtemp(prefix="c10d_torch_suite_")
    # BACKEND decides which tests apply and which branches they take: those of torch's Gloo;
    # door() puts the group on --backend.
    os.environ.update(
        BACKEND="gloo",
        WORLD_SIZE=str(args.world_size),
        TEMP_DIR=temp,
        MASTER_ADDR="127.0.0.1",
    )
    import torch.multiprocessing as mp

    if args.door == "plugin":
        import c10d.torch_backend  # noqa: F401  (registers c10d_shm, c10d_gloo with torch)
    from torch.testing._internal.distributed import distributed_test as suite

    if args.door == "c10d":
        import c10d

        suite.dist = door(c10d, args.backend)  # collectives, groups and init are c10d's
    elif args.backend != "gloo":
        import torch.distributed

        suite.dist = door(torch.distributed, args.backend)

    class TestOnC10d(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(mp.get_context("fork").Process)

    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestOnC10d)
    if args.patterns:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    tests = unittest.TestSuite(TestOnC10d(n) for n in names)
    start = time.monotonic()
    runner = unittest.TextTestRunner(verbosity=2 if args.verbose else 1, stream=sys.stderr)
    try:
        result = runner.run(tests)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    failed = {name_of(t) for t, _ in result.failures + result.errors}
    failed |= {name_of(t) for t in result.unexpectedSuccesses}
    skipped = {name_of(t) for t, _ in result.skipped}
    counts = {"pass": 0, "fail": 0, "skip": 0}
    unexpected = []
    for name in names:
        outcome = "fail" if name in failed else "skip" if name in skipped else "pass"
        counts[outcome] += 1
        reason = REFUSED.get((args.door, name))
        if outcome == "fail" and reason is None:
            unexpected.append(name)
        print(f"{outcome:5} {name}" + (f"  (refused by torch: {reason})" if reason else ""))
    took = time.monotonic() - start
    print(
        f"door {args.door}, backend {args.backend}, world size {args.world_size}: "
        f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
        f"in {took:.0f} s; {len(unexpected)} unexpected failures"
    )
    for name in unexpected:
        print(f"UNEXPECTED {name}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
