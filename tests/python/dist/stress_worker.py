"""One rank of tests/python/test_stress.py's worker pool.

Started with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and C10D_STRESS_BACKEND (the default
group's backend). Reads one JSON program a line on stdin, runs it, and answers on stdout with
JSON lines: {"at": i} before op i, then {"mismatches": [...]} or {"error": ..., "op": i}.

A program is {"seed": s, "ops": [op, ...]}; an op is a dict with
  kind    all_reduce | broadcast | reduce | all_gather_into_tensor | reduce_scatter_tensor |
          all_to_all_single | barrier | destroy_and_reinit
  dtype   float32 | float64 | int32 | int64
  n       elements (the per-rank chunk for all_gather / reduce_scatter / all_to_all)
  red     SUM | MAX | MIN | PRODUCT | AVG
  root    any int (taken modulo the world size)
  async   bool;  drop: bool (an async Work whose reference is dropped at once)
  group   default | gloo | shm
  out     null (a fresh array) or [owner slot, byte offset]: where the op's output lives
  gap     null (a fresh input) or bytes between the output and the input in the same owner
  writer  0 | 1 | 2: a thread rewrites the rest of the output's owner while the op runs
  uneven  bool: all_to_all_single with unequal splits
  port    destroy_and_reinit: the port of the new rendezvous
Inputs are functions of (seed, op index, rank, buffer), so every rank knows every result.
"""

import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta

import numpy as np

DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64}
GROUPS = ("default", "gloo", "shm")
WRITER_JOIN_SECONDS = 30
PACES = {1: 0.0, 2: 50e-6}  # writer: 0 none, 1 back to back, 2 paced (see Writer)


def import_c10d():
    """c10d, retrying for a while: the extension may be replaced by a rebuild meanwhile."""
    deadline = time.monotonic() + 60
    while True:
        try:
            import c10d

            return c10d
        except ImportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


# ---------------------------------------------------------------------------------------------
# What every op reads and writes, and what it must produce (pure numpy, the same on all ranks)


def splits(op, world, sender, receiver):
    """Elements `sender` sends to `receiver` in all_to_all_single."""
    if not op.get("uneven"):
        return op["n"]
    return max(0, op["n"] + (sender * 5 + receiver * 3 + op["n"]) % 7 - 3)


def sizes(op, world, rank):
    """(output elements, input elements or None) of `op` on `rank`."""
    kind, n = op["kind"], op["n"]
    if kind in ("all_reduce", "broadcast", "reduce"):
        return n, None
    if kind == "all_gather_into_tensor":
        return n * world, n
    if kind == "reduce_scatter_tensor":
        return n, n * world
    if kind == "all_to_all_single":
        return (
            sum(splits(op, world, j, rank) for j in range(world)),
            sum(splits(op, world, rank, j) for j in range(world)),
        )
    return None, None


def values(seed, index, rank, role, count, op):
    """Deterministic small integers: sums, averages (over 2 or 4 ranks) and products (of 1s
    and 2s) stay exact in every dtype."""
    rng = np.random.default_rng([seed, index, rank, role])
    low, high = (1, 3) if op.get("red") == "PRODUCT" else (-100, 101)
    return rng.integers(low, high, count, dtype=np.int64).astype(DTYPES[op["dtype"]])


def combine(arrays, red, dtype):
    stack = np.stack(arrays)
    if red == "SUM":
        return np.add.reduce(stack, axis=0, dtype=dtype)
    if red == "MAX":
        return stack.max(axis=0)
    if red == "MIN":
        return stack.min(axis=0)
    if red == "PRODUCT":
        return np.multiply.reduce(stack, axis=0, dtype=dtype)
    if red == "AVG":
        return (np.add.reduce(stack, axis=0, dtype=dtype) / len(arrays)).astype(dtype)
    raise ValueError(red)


def expected(seed, index, op, world, rank, group_backend):
    """(initial output, initial input, expected output or None when unspecified)."""
    kind, n, red = op["kind"], op["n"], op.get("red", "SUM")
    dtype = DTYPES[op["dtype"]]
    root = op.get("root", 0) % world
    out_n, in_n = sizes(op, world, rank)
    mine = lambda role, count: values(seed, index, rank, role, count, op)
    every = lambda role, count: [values(seed, index, r, role, count, op) for r in range(world)]
    if kind == "all_reduce":
        ins = every(0, n)
        return ins[rank], None, combine(ins, red, dtype)
    if kind == "broadcast":
        return mine(0, n), None, values(seed, index, root, 0, n, op)
    if kind == "reduce":
        ins = every(0, n)
        if rank == root:
            return ins[rank], None, combine(ins, red, dtype)
        # torch leaves a non-root's tensor unspecified; shm promises to leave it alone.
        return ins[rank], None, (ins[rank] if group_backend == "shm" else None)
    if kind == "all_gather_into_tensor":
        ins = every(1, n)
        return np.zeros(out_n, dtype), ins[rank], np.concatenate(ins)
    if kind == "reduce_scatter_tensor":
        ins = every(1, n * world)
        return (
            np.zeros(out_n, dtype),
            ins[rank],
            combine(ins, red, dtype)[rank * n : (rank + 1) * n],
        )
    if kind == "all_to_all_single":
        ins = [
            values(seed, index, r, 1, sum(splits(op, world, r, j) for j in range(world)), op)
            for r in range(world)
        ]
        parts = []
        for j in range(world):
            start = sum(splits(op, world, j, k) for k in range(rank))
            parts.append(ins[j][start : start + splits(op, world, j, rank)])
        return np.zeros(out_n, dtype), ins[rank], np.concatenate(parts).astype(dtype)
    raise ValueError(kind)


def owner_sizes(program):
    """Bytes of each owner slot: the furthest byte any op places there, plus a tail."""
    ends = {}
    for op in program["ops"]:
        if op.get("out") is None or op["kind"] in ("barrier", "destroy_and_reinit"):
            continue
        slot, off = op["out"]
        item = np.dtype(DTYPES[op["dtype"]]).itemsize
        # The largest sizes any rank uses (all_to_all outputs differ between ranks).
        out_n = max(sizes(op, program["world"], r)[0] for r in range(program["world"]))
        in_n = max(sizes(op, program["world"], r)[1] or 0 for r in range(program["world"]))
        end = off + out_n * item
        if op.get("gap") is not None and in_n:
            end += op["gap"] + in_n * item
        ends[slot] = max(ends.get(slot, 0), end)
    # A tail that is no multiple of the page, different per slot and program.
    return {
        slot: end + 8 * ((program["seed"] + 97 * slot) % 700) + 40 for slot, end in ends.items()
    }


# ---------------------------------------------------------------------------------------------
# Running a program on this rank


def mismatch(index, what, got, want):
    wrong = np.flatnonzero(got != want) if got.shape == want.shape else np.arange(got.size)
    if wrong.size == 0:
        return None
    first = int(wrong[0])
    return {
        "op": index,
        "what": what,
        "wrong": int(wrong.size),
        "of": int(got.size),
        "first": first,
        "got": got.flat[first].item() if first < got.size else None,
        "want": want.flat[first].item() if first < want.size else None,
    }


class Pending:
    """An issued op whose results are checked once it is known to be complete."""

    def __init__(self, index, work, group, ranges, checks):
        self.index, self.work, self.group = index, work, group
        self.ranges = ranges  # [(slot, lo, hi)] bytes of owners it reads or writes
        self.checks = checks  # [(what, array, expected or None, slot, lo, hi)]


class Rank:
    def __init__(self, dist, backend, rank, world, timeout):
        self.dist, self.backend, self.rank, self.world = dist, backend, rank, world
        self.timeout = timeout
        self.groups = {}

    def init(self, init_method):
        dist = self.dist
        dist.init_process_group(
            self.backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world,
            timeout=self.timeout,
        )
        self.groups = {
            "default": None,
            "gloo": dist.new_group(backend="gloo", timeout=self.timeout),
            "shm": dist.new_group(backend="shm", timeout=self.timeout),
        }

    def group_backend(self, name):
        return self.backend if name == "default" else name

    # -- owners and their expected contents

    def run(self, program, send):
        self.seed = program["seed"]
        program = dict(program, world=self.world)
        self.owners = {}
        self.shadow = {}  # what every owner byte must hold once nothing is in flight
        for slot, size in owner_sizes(program).items():
            owner = np.empty(size, np.uint8)
            owner[:] = (np.arange(size) * 7 + slot) % 251
            self.owners[slot] = owner
            self.shadow[slot] = owner.copy()
        self.pending = []
        self.mismatches = []
        for index, op in enumerate(program["ops"]):
            send({"at": index})
            self.current = index
            self.step(index, op)
        self.current = len(program["ops"])
        self.retire_all()
        for slot in self.owners:
            self.compare_owner(-1, slot, "at the end")
        # Drop the owners now: freeing adopted memory is part of what is under test.
        del self.owners, self.shadow
        return self.mismatches

    def compare_owner(self, index, slot, when):
        found = mismatch(index, f"owner {slot} {when}", self.owners[slot], self.shadow[slot])
        if found:
            self.mismatches.append(found)
            self.shadow[slot][:] = self.owners[slot]  # report each wrong byte once

    def place(self, slot, lo, count, dtype):
        owner = self.owners[slot]
        nbytes = count * np.dtype(dtype).itemsize
        return owner[lo : lo + nbytes].view(dtype), (slot, lo, lo + nbytes)

    def step(self, index, op):
        kind = op["kind"]
        if kind == "destroy_and_reinit":
            self.retire_all(barriers=False)  # kept Works are waited; dropped ones...
            dropped = [p for p in self.pending]
            self.dist.destroy_process_group()  # ...must finish within destroy
            self.pending = []
            for p in dropped:
                self.check(p)
            self.init(f"tcp://127.0.0.1:{op['port']}")
            return
        group_name = op.get("group", "default")
        group = self.groups[group_name]
        if kind == "barrier":
            work = self.dist.barrier(group=group, async_op=op.get("async", False))
            self.track(index, op, work, group_name, [], [])
            return
        dtype = DTYPES[op["dtype"]]
        out0, in0, want = expected(
            self.seed, index, op, self.world, self.rank, self.group_backend(group_name)
        )
        ranges, checks = [], []
        if op.get("out") is None:
            out = out0.copy()
        else:
            slot, lo = op["out"]
            out, r = self.place(slot, lo, out0.size, dtype)
            ranges.append(r)
        inp = None
        if in0 is not None:
            if op.get("out") is not None and op.get("gap") is not None:
                inp, r2 = self.place(ranges[0][0], ranges[0][2] + op["gap"], in0.size, dtype)
                ranges.append(r2)
            else:
                inp = in0.copy()
        # What must be settled before this op touches its memory: a writer thread rewrites
        # the whole rest of the owner, so everything in flight there.
        touched = ranges
        if op.get("writer") and ranges:
            touched = [(ranges[0][0], 0, self.owners[ranges[0][0]].size)]
        self.retire(lambda p: overlaps(p.ranges, touched))
        out[...] = out0
        if inp is not None:
            inp[...] = in0
        for (slot, lo, hi), arr in zip(ranges, (out, inp)):
            self.shadow[slot][lo:hi] = arr.view(np.uint8)  # inputs stay; outputs overwritten
        checks.append(("output", out, want) + (ranges[0] if ranges else (None, 0, 0)))
        if inp is not None:
            checks.append(
                ("input", inp, in0.copy()) + (ranges[1] if len(ranges) > 1 else (None, 0, 0))
            )
        writer = None
        if op.get("writer") and ranges:
            writer = Writer(self.owners[ranges[0][0]], ranges, PACES[op["writer"]])
        if writer:
            writer.start()
        try:
            work = self.issue(kind, op, out, inp, group)
            if writer:
                # The op counts as running until its Work is waited: keep writing till then.
                if work is not None:
                    self.wait(work, group_name)
                    work = None
        finally:
            if writer:
                writer.stop(self)
        if writer:
            slot = ranges[0][0]
            writer.settle(self.shadow[slot])
        self.track(index, op, work, group_name, ranges, checks)
        if writer:
            # Nothing else is in flight in this owner: all of it can be compared now.
            self.compare_owner(index, slot, "after the writer thread")

    def issue(self, kind, op, out, inp, group):
        dist, asyn = self.dist, op.get("async", False)
        red = getattr(dist.ReduceOp, op.get("red", "SUM"))
        root = op.get("root", 0) % self.world
        if kind == "all_reduce":
            return dist.all_reduce(out, op=red, group=group, async_op=asyn)
        if kind == "broadcast":
            return dist.broadcast(out, src=root, group=group, async_op=asyn)
        if kind == "reduce":
            return dist.reduce(out, dst=root, op=red, group=group, async_op=asyn)
        if kind == "all_gather_into_tensor":
            return dist.all_gather_into_tensor(out, inp, group=group, async_op=asyn)
        if kind == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(out, inp, op=red, group=group, async_op=asyn)
        if kind == "all_to_all_single":
            if not op.get("uneven"):
                return dist.all_to_all_single(out, inp, group=group, async_op=asyn)
            w = self.world
            return dist.all_to_all_single(
                out,
                inp,
                output_split_sizes=[splits(op, w, j, self.rank) for j in range(w)],
                input_split_sizes=[splits(op, w, self.rank, j) for j in range(w)],
                group=group,
                async_op=asyn,
            )
        raise ValueError(kind)

    def wait(self, work, group_name):
        work.wait(self.timeout)

    def track(self, index, op, work, group_name, ranges, checks):
        entry = Pending(index, work, group_name, ranges, checks)
        if work is None:  # synchronous, or already waited
            self.check(entry)
        elif op.get("drop"):
            entry.work = None  # the only reference goes: the op must complete regardless
            del work
            self.pending.append(entry)
        else:
            self.pending.append(entry)

    def retire(self, pick):
        """Completes and checks the pending ops `pick` selects: kept Works are waited, and a
        group with a dropped one gets a barrier (after which its earlier ops are complete)."""
        chosen = [p for p in self.pending if pick(p)]
        if not chosen:
            return
        barrier_groups = sorted({p.group for p in chosen if p.work is None})
        for p in chosen:
            if p.work is not None:
                self.wait(p.work, p.group)
        for name in barrier_groups:
            self.dist.barrier(group=self.groups[name])
        # Every dropped op of a barrier's group is complete too (issued before the barrier).
        done = [
            p for p in self.pending if p in chosen or (p.work is None and p.group in barrier_groups)
        ]
        for p in done:
            self.pending.remove(p)
            self.check(p)

    def retire_all(self, barriers=True):
        if barriers:
            self.retire(lambda p: True)
        else:
            self.retire(lambda p: p.work is not None)

    def check(self, p):
        for what, arr, want, slot, lo, hi in p.checks:
            if want is None:  # unspecified contents: whatever is there is right
                if slot is not None:
                    self.shadow[slot][lo:hi] = arr.view(np.uint8)
                continue
            found = mismatch(p.index, what, arr, want)
            if found:
                self.mismatches.append(found)
            if slot is not None:
                self.shadow[slot][lo:hi] = np.ascontiguousarray(want).view(np.uint8)


def overlaps(a, b):
    return any(
        sa == sb and lo_a < hi_b and lo_b < hi_a for sa, lo_a, hi_a in a for sb, lo_b, hi_b in b
    )


class Writer:
    """Rewrites every byte of `owner` outside `ranges`, 16 KiB at a time with np.copyto (which
    lets go of the GIL), pass after pass with a new value each, until stopped between two
    pieces. `pace` seconds of sleep after every piece make a pass last about as long as the
    op, so a piece's last write may fall into the op rather than after it: later passes would
    hide a write the op lost. Each piece must end up holding the value last written to it."""

    PIECE = 16 << 10

    def __init__(self, owner, ranges, pace):
        cuts = sorted((lo, hi) for _, lo, hi in ranges)
        self.pieces, at = [], 0
        for lo, hi in cuts + [(owner.size, owner.size)]:
            for start in range(at, lo, self.PIECE):
                self.pieces.append((start, min(lo, start + self.PIECE)))
            at = max(at, hi)
        self.owner, self.pace = owner, pace
        self.last = [0] * len(self.pieces)  # 0: never written
        self.done = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        try:
            value = 0
            while self.pieces:
                value = value % 250 + 1
                for j, (lo, hi) in enumerate(self.pieces):
                    if self.done.is_set():
                        return
                    np.copyto(self.owner[lo:hi], np.uint8(value))
                    self.last[j] = value
                    if self.pace:
                        time.sleep(self.pace)
        except BaseException as e:  # reported by stop()
            self.error = e

    def start(self):
        self.thread.start()

    def stop(self, rank):
        self.done.set()
        self.thread.join(WRITER_JOIN_SECONDS)
        if self.thread.is_alive():
            raise RuntimeError(
                f"rank {rank.rank} op {rank.current}: the writer thread did "
                f"not stop within {WRITER_JOIN_SECONDS}s"
            )
        if self.error is not None:
            raise self.error

    def settle(self, shadow):
        """Records in `shadow` what the writer left in the owner."""
        for (lo, hi), value in zip(self.pieces, self.last):
            if value:
                shadow[lo:hi] = value


def main():
    # Replies go to the real stdout; anything else printing there (C++ included) goes to stderr.
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    send = lambda obj: reply.write(json.dumps(obj) + "\n")
    dist = import_c10d()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(os.environ.get("C10D_STRESS_PG_TIMEOUT", "20")))
    me = Rank(dist, os.environ["C10D_STRESS_BACKEND"], rank, world, timeout)
    me.init("env://")
    send({"ready": rank})
    for line in sys.stdin:
        program = json.loads(line)
        if program.get("cmd") == "exit":
            break
        me.current = -1
        try:
            send({"mismatches": me.run(program, send)})
        except BaseException:
            send({"error": traceback.format_exc(), "op": me.current})
            sys.stderr.flush()
    else:
        return  # the parent went away
    # Leave async work unwaited on every group, kept and dropped, and exit without
    # destroy_process_group(): the interpreter's exit must still be clean.
    kept = []
    for name in GROUPS:
        group = me.groups[name]
        kept.append(dist.all_reduce(np.ones(1 << 16, np.float32), group=group, async_op=True))
        dist.all_reduce(np.ones(100, np.int64), group=group, async_op=True)
    send({"bye": rank})


if __name__ == "__main__":
    main()
