"""FileStore shared by real processes: concurrent adds lose nothing, the last user removes the
file."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest

import c10d

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")

CHILDREN = 8
ADDS = 1000

# Each child opens its own FileStore as one of world_size workers, signals that it is ready,
# waits for the parent's "go" so that all adds overlap, then adds ADDS times.
CHILD = textwrap.dedent(
    """
    import sys
    import c10d

    path, world_size, adds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = c10d.FileStore(path, world_size)
    store.add("ready", 1)
    store.wait(["go"])
    for _ in range(adds):
        store.add("count", 1)
    del store  # record this worker's leave now rather than at interpreter teardown
    """
)


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_processes_add_concurrently(tmp_path):
    path = str(tmp_path / "store")
    world_size = CHILDREN + 1  # the parent is a worker too and keeps the file alive
    store = c10d.FileStore(path, world_size)
    assert store.path == path

    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, path, str(world_size), str(ADDS)], env=_child_env()
        )
        for _ in range(CHILDREN)
    ]
    try:
        while store.add("ready", 0) < CHILDREN:
            assert all(c.poll() is None for c in children), "a child exited early"
        store.set("go", "1")
        codes = [c.wait(timeout=120) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    assert codes == [0] * CHILDREN
    assert store.add("count", 0) == CHILDREN * ADDS

    # Every worker has joined: one more may still open it, as with torch's FileStore.
    extra = c10d.FileStore(path, world_size)
    assert extra.add("count", 0) == CHILDREN * ADDS
    del extra
    gc.collect()
    assert os.path.exists(path)

    del store
    gc.collect()
    assert not os.path.exists(path)


def test_two_handles_and_basic_semantics(tmp_path):
    path = str(tmp_path / "store")
    a = c10d.FileStore(path)
    b = c10d.FileStore(path)
    a.set("k", "v")
    assert b.get("k") == b"v"
    assert b.add("n", 3) == 3
    assert a.add("n", 4) == 7
    assert a.delete_key("k")
    assert not b.check(["k"])
    assert a.num_keys() == 2  # "n", and the handles' count, as torch counts
    assert "FileStore" in repr(a)

    del a
    gc.collect()
    assert os.path.exists(path)
    del b
    gc.collect()
    # Without a world size the file stays, as with torch: a later user reads what was left.
    assert os.path.exists(path)
    assert c10d.FileStore(path).add("n", 0) == 7


def test_wait_timeout_names_keys(tmp_path):
    from datetime import timedelta

    store = c10d.FileStore(str(tmp_path / "store"))
    with pytest.raises(c10d.DistStoreTimeoutError, match="missing_key"):
        store.wait(["missing_key"], timedelta(milliseconds=50))


def test_torch_and_c10d_share_one_file(tmp_path):
    tdist = pytest.importorskip("torch.distributed")
    path = str(tmp_path / "store")
    theirs = tdist.FileStore(path, 2)
    ours = c10d.FileStore(path, 2)
    theirs.set("from_torch", b"t")
    ours.set("from_c10d", b"c")
    assert ours.get("from_torch") == b"t"
    assert theirs.get("from_c10d") == b"c"
    assert theirs.add("n", 2) == 2
    assert ours.add("n", 3) == 5
    assert theirs.add("n", 0) == 5
    ours.append("log", b"po")
    theirs.append("log", b"ta")
    ours.append("log", b"to")
    assert theirs.get("log") == b"potato"
    assert ours.compare_set("cs", "", "one") == b"one"
    assert theirs.compare_set("cs", "one", "two") == b"two"
    assert ours.get("cs") == b"two"
    assert ours.delete_key("from_torch")
    assert not theirs.check(["from_torch"])
    ours.multi_set(["a", "b"], [b"1", b"2"])
    assert theirs.get("b") == b"2"
    # Both count the same keys, the handles' counter among them.
    assert ours.num_keys() == theirs.num_keys()
    ours.queue_push("q", b"x")  # c10d's own: torch's handles read past it
    assert theirs.get("a") == b"1" and ours.queue_pop("q", False) == b"x"
    # Two workers of two: the file goes when both have finished, whichever closes last.
    del theirs
    gc.collect()
    assert os.path.exists(path)
    del ours
    gc.collect()
    assert not os.path.exists(path)


def test_a_file_torch_left_behind_opens_in_c10d(tmp_path):
    tdist = pytest.importorskip("torch.distributed")
    path = str(tmp_path / "store")
    first = tdist.FileStore(path)
    first.set("kept", b"yes")
    first.add("n", 7)
    del first
    gc.collect()
    later = c10d.FileStore(path)
    assert later.get("kept") == b"yes" and later.add("n", 1) == 8
    assert later.num_keys() == tdist.FileStore(path).num_keys()
