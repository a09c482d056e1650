"""Randomized stress test: hypothesis draws programs of collectives (sizes around the shm
backend's thresholds, views of shared owner arrays, async Works waited or dropped, several
groups at once, a thread writing around the op's view, destroy and re-init) and a pool of
worker processes (dist/stress_worker.py) runs each, every rank checking its results exactly.

C10D_STRESS_EXAMPLES sets the examples per test (default: a ~60 s run of the file);
C10D_STRESS_SEED replays a run (the seed is printed with every failure)."""

import json
import os
import random
import select
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "dist", "stress_worker.py")

REPLY_SECONDS = 60  # per program and per pool start
PG_TIMEOUT_SECONDS = 20  # a hung collective fails in the worker before the parent gives up
GRACE_SECONDS = 3  # after one rank failed, how long the others get to report theirs
SEED = int(os.environ.get("C10D_STRESS_SEED") or random.randrange(2**32))
EXAMPLES = os.environ.get("C10D_STRESS_EXAMPLES")

KINDS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
    "destroy_and_reinit",
]
DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}
# Bytes around the shm backend's thresholds (one-shot, mid-size direct path, adoption, slots,
# direct path); "tiny" is 1-64 elements. Repeats weight the draw toward the cheaper ones.
SIZES = ["tiny", "tiny", 32 << 10, 64 << 10, 256 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_op(kind, **fields):
    op = {
        "kind": kind,
        "dtype": "float32",
        "n": 1,
        "red": "SUM",
        "root": 0,
        "async": False,
        "drop": False,
        "group": "default",
        "out": None,
        "gap": None,
        "writer": 0,
        "uneven": False,
    }
    op.update(fields)
    return op


# ---------------------------------------------------------------------------------------------
# Programs


@st.composite
def ops_of(draw, previous):
    # Repeating an earlier owner-backed op's view as an all_reduce is what moves an owner
    # into shared memory (the second all_reduce of >= 256 KiB on one owner).
    reusable = [
        i
        for i, op in enumerate(previous)
        if op["out"] is not None and op["kind"] in ("all_reduce", "broadcast", "reduce")
    ]
    again = draw(st.none() | st.sampled_from(reusable)) if reusable else None
    if again is not None:
        base = previous[again]
        kind, dtype, n, out = "all_reduce", base["dtype"], base["n"], base["out"]
    else:
        kind = draw(st.sampled_from(KINDS))
        dtype = draw(st.sampled_from(sorted(DTYPES)))
        size = draw(st.sampled_from(SIZES))
        if size == "tiny":
            n = draw(st.integers(1, 64))
        else:
            n = max(1, size // DTYPES[dtype] + draw(st.integers(-3, 3)))
        # Offsets of 8 bytes keep every dtype aligned; owners start 16 bytes into a page (or
        # anywhere, for small ones), so almost no view starts on a page.
        out = draw(
            st.none()
            | st.tuples(st.integers(0, 2), st.integers(0, 1100).map(lambda k: 8 * k)).map(list)
        )
    if kind in ("barrier", "destroy_and_reinit"):
        return make_op(
            kind,
            group=draw(st.sampled_from(["default", "gloo", "shm"])),
            **(
                {"async": draw(st.booleans()), "drop": draw(st.booleans())}
                if kind == "barrier"
                else {}
            ),
        )
    reds = ["SUM", "MAX", "MIN", "PRODUCT"] + (["AVG"] if dtype.startswith("float") else [])
    asyn = draw(st.booleans())
    two_buffers = kind in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
    return make_op(
        kind,
        dtype=dtype,
        n=n,
        red=draw(st.sampled_from(reds)),
        root=draw(st.integers(0, 3)),
        out=out,
        group=draw(st.sampled_from(["default", "gloo", "shm"])),
        **{
            "async": asyn,
            "drop": asyn and draw(st.booleans()),
            "gap": draw(st.none() | st.integers(0, 600).map(lambda k: 8 * k))
            if two_buffers and out is not None
            else None,
            "writer": draw(st.integers(0, 2)) if out is not None else 0,
            "uneven": kind == "all_to_all_single" and draw(st.booleans()),
        },
    )


@st.composite
def programs(draw):
    ops = []
    for _ in range(draw(st.integers(1, 12))):
        ops.append(draw(ops_of(ops)))
    return {"seed": draw(st.integers(0, 2**31 - 1)), "ops": ops}


# Always run: the same 512 KiB view all_reduced again (adopted at the second) and another view
# of that owner, with a writer thread around them, then reuse across a re-init.
_VIEW = dict(dtype="float32", n=(512 << 10) // 4, out=[0, 40])
ADOPT_WITH_WRITER = {
    "seed": 1,
    "ops": [
        make_op("all_reduce", writer=2, **_VIEW),
        make_op("all_reduce", writer=2, **_VIEW),
        make_op("all_reduce", writer=1, **dict(_VIEW, out=[0, 40 + 4096 + 8])),
        make_op("all_reduce", writer=2, **{"async": True, **_VIEW}),
        make_op("broadcast", root=1, writer=1, **_VIEW),
    ],
}
ADOPT_ACROSS_GROUPS = {
    "seed": 2,
    "ops": [
        make_op(
            "all_reduce",
            dtype="int64",
            n=(1 << 20) // 8,
            out=[1, 8],
            group="shm",
            **{"async": True},
        ),
        make_op(
            "all_reduce",
            dtype="int64",
            n=(1 << 20) // 8,
            out=[1, 8],
            group="shm",
            red="MAX",
            **{"async": True, "drop": True},
        ),
        make_op(
            "all_reduce",
            dtype="float64",
            n=(256 << 10) // 8,
            out=[1, 8 + (1 << 20) + 64],
            **{"async": True},
        ),
        make_op(
            "all_gather_into_tensor",
            dtype="int32",
            n=9000,
            out=[2, 16],
            gap=24,
            group="gloo",
            **{"async": True, "drop": True},
        ),
        make_op("destroy_and_reinit"),
        make_op("all_reduce", dtype="int64", n=(1 << 20) // 8, out=[1, 8], writer=1),
        make_op("all_reduce", dtype="int64", n=(1 << 20) // 8, out=[1, 8], writer=2),
    ],
}


# ---------------------------------------------------------------------------------------------
# The worker pool


class Pool:
    """WORLD worker processes of one process group, fed programs over their stdin."""

    def __init__(self, backend, world):
        self.backend, self.world = backend, world
        self.procs = []
        self.broken = "not started"

    def start(self):
        port = free_port()
        self.procs, self.errs, self.bufs = [], [], []
        for rank in range(self.world):
            env = dict(os.environ)
            env.update(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(self.world),
                    "C10D_STRESS_BACKEND": self.backend,
                    "C10D_STRESS_PG_TIMEOUT": str(PG_TIMEOUT_SECONDS),
                    "PYTHONPATH": os.pathsep.join(
                        [os.path.join(REPO, "python"), env.get("PYTHONPATH", "")]
                    ),
                }
            )
            err = tempfile.TemporaryFile()
            self.errs.append(err)
            self.bufs.append(b"")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, WORKER],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            )
        replies = self.collect(lambda r, msg: "ready" in msg, "start")
        self.broken = None
        return replies

    def stop(self):
        """Asks every worker to exit and returns [(rank, exit code)] of those that failed."""
        bad = []
        for rank, p in enumerate(self.procs):
            try:
                p.stdin.write(b'{"cmd": "exit"}\n')
                p.stdin.flush()
            except OSError:
                pass
        deadline = time.monotonic() + 30
        for rank, p in enumerate(self.procs):
            try:
                code = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
            if code != 0:
                bad.append((rank, code, self.tail(rank)))
        self.procs = []
        return bad

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs = []

    def tail(self, rank, chars=2500):
        err = self.errs[rank]
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - chars))
        return err.read().decode(errors="replace")

    def collect(self, final, what, program=None):
        """Reads every rank's reply lines until `final` accepts one; returns {rank: reply}.
        Raises AssertionError naming the rank and op on a death, an error or the deadline."""
        deadline = time.monotonic() + REPLY_SECONDS
        at = {r: None for r in range(self.world)}
        replies, failures = {}, {}
        failed_at = None  # when the first failure was seen
        while len(replies) + len(failures) < self.world:
            if failures:
                deadline = min(deadline, failed_at + GRACE_SECONDS)
            left = deadline - time.monotonic()
            waiting = {
                self.procs[r].stdout.fileno(): r
                for r in range(self.world)
                if r not in replies and r not in failures
            }
            if left <= 0:
                for r in waiting.values():
                    failures[r] = f"no reply within {REPLY_SECONDS} s"
                break
            ready, _, _ = select.select(list(waiting), [], [], left)
            for fd in ready:
                r = waiting[fd]
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self.procs[r].wait()
                    failures[r] = f"died (exit code {code})"
                    failed_at = time.monotonic()
                    continue
                self.bufs[r] += chunk
                while b"\n" in self.bufs[r] and r not in replies and r not in failures:
                    line, self.bufs[r] = self.bufs[r].split(b"\n", 1)
                    msg = json.loads(line)
                    if "at" in msg:
                        at[r] = msg["at"]
                    elif "error" in msg:
                        failures[r] = f"raised:\n{msg['error']}"
                        failed_at = time.monotonic()
                    elif final(r, msg):
                        replies[r] = msg
        if failures:
            self.broken = "failed"
            text = []
            for r in sorted(failures):
                where = what if at[r] is None else f"op {at[r]}"
                if program is not None and at[r] is not None:
                    where += f" {json.dumps(program['ops'][at[r]])}"
                text.append(f"rank {r} {failures[r]} in {where}")
            tails = "\n".join(
                f"--- rank {r} stderr tail:\n{self.tail(r)}" for r in range(self.world)
            )
            self.kill()
            raise AssertionError(f"{self.backend} x{self.world}: " + "\n".join(text) + f"\n{tails}")
        return replies

    def run(self, program):
        """Runs `program` on every rank; returns {rank: mismatches}."""
        if self.broken:
            self.kill()
            self.start()
        program = dict(
            program,
            ops=[
                dict(op, port=free_port()) if op["kind"] == "destroy_and_reinit" else op
                for op in program["ops"]
            ],
        )
        line = (json.dumps(program) + "\n").encode()
        for rank, p in enumerate(self.procs):
            try:
                p.stdin.write(line)
                p.stdin.flush()
            except OSError:
                pass  # collect() reports the dead worker
        replies = self.collect(lambda r, msg: "mismatches" in msg, "the program", program)
        return {r: msg["mismatches"] for r, msg in replies.items()}


@pytest.fixture(scope="module")
def pool(request):
    p = Pool(*request.param)
    yield p
    bad = p.stop() if p.procs else []
    assert not bad, "workers exited badly after their last program:\n" + "\n".join(
        f"--- rank {r} exit {code}\n{tail}" for r, code, tail in bad
    )


def _check(pool, program):
    try:
        mismatches = pool.run(program)
    except AssertionError as e:
        raise AssertionError(
            f"{e}\nC10D_STRESS_SEED={SEED} program:\n{json.dumps(program)}"
        ) from None
    bad = {r: m for r, m in mismatches.items() if m}
    assert not bad, (
        f"{pool.backend} x{pool.world}: wrong data (C10D_STRESS_SEED={SEED}):\n"
        + "\n".join(f"rank {r}: {m}" for r, m in sorted(bad.items()))
        + f"\nprogram: {json.dumps(program)}"
    )


def _settings(default_examples):
    return settings(
        max_examples=int(EXAMPLES) if EXAMPLES else default_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


# The shm default group gets most of the budget: the gloo default group covers its async paths.
@pytest.mark.parametrize("pool", [("shm", 2), ("shm", 4)], indirect=True, ids=["x2", "x4"])
@seed(SEED)
@_settings(100)
@given(program=programs())
@example(program=ADOPT_WITH_WRITER)
@example(program=ADOPT_ACROSS_GROUPS)
def test_shm_default_group(pool, program):
    _check(pool, program)


@pytest.mark.parametrize("pool", [("gloo", 2), ("gloo", 4)], indirect=True, ids=["x2", "x4"])
@seed(SEED)
@_settings(60)
@given(program=programs())
def test_gloo_default_group(pool, program):
    _check(pool, program)
