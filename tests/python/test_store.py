"""One conformance suite for every store, driven through the Python API."""

import threading
import time
from datetime import timedelta

import pytest

import c10d


class DictStore(c10d.Store):
    """A store written in Python, to check the C++ side can drive Python subclasses."""

    def __init__(self):
        super().__init__()
        self._data = {}
        self._cv = threading.Condition()

    def set(self, key, value):
        with self._cv:
            self._data[key] = value if isinstance(value, bytes) else value.encode()
            self._cv.notify_all()

    def get(self, key):
        self.wait([key], timedelta(seconds=5))
        with self._cv:
            return self._data[key]

    def add(self, key, amount):
        with self._cv:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cv.notify_all()
            return value

    def compare_set(self, key, expected, desired):
        with self._cv:
            if key not in self._data:
                if expected:
                    return expected
                self._data[key] = desired
            elif self._data[key] == expected:
                self._data[key] = desired
            self._cv.notify_all()
            return self._data[key]

    def check(self, keys):
        with self._cv:
            return all(k in self._data for k in keys)

    def delete_key(self, key):
        with self._cv:
            return self._data.pop(key, None) is not None

    def num_keys(self):
        with self._cv:
            return len(self._data)

    def wait(self, keys, timeout=None):
        seconds = timeout.total_seconds() if timeout else 5
        with self._cv:
            if not self._cv.wait_for(lambda: all(k in self._data for k in keys), seconds):
                raise c10d.DistStoreError(f"DictStore: timed out waiting for {keys}")


def _tcp_server():
    return c10d.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


_servers = []  # keeps each test's server alive (a PrefixStore holds only the C++ client)


def _tcp_client():
    server = _tcp_server()
    _servers.append(server)
    return c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=10))


def _file(tmp_path):
    return c10d.FileStore(str(tmp_path / "store"), 1)


FACTORIES = {
    "hash": lambda tmp: c10d.HashStore(),
    "file": _file,
    "tcp-server": lambda tmp: _tcp_server(),
    "tcp-client": lambda tmp: _tcp_client(),
    "prefix-hash": lambda tmp: c10d.PrefixStore("p", c10d.HashStore()),
    "prefix-file": lambda tmp: c10d.PrefixStore("p", _file(tmp)),
    "prefix-tcp": lambda tmp: c10d.PrefixStore("p", _tcp_client()),
}


@pytest.fixture(params=sorted(FACTORIES))
def store(request, tmp_path):
    s = FACTORIES[request.param](tmp_path)
    s.set_timeout(timedelta(seconds=10))
    return s


def test_set_get(store):
    store.set("k", "v1")
    assert store.get("k") == b"v1"
    store.set("k", b"\x00\xffbin")
    assert store.get("k") == b"\x00\xffbin"
    store.set("empty", "")
    assert store.get("empty") == b""


def test_add_accumulates(store):
    assert store.add("c", 1) == 1
    assert store.add("c", 6) == 7
    assert store.add("c", -8) == -1
    assert store.get("c") == b"-1"


def test_add_on_a_value_that_is_not_a_counter(request, store):
    if "tcp" in request.node.callspec.params["store"]:
        pytest.skip("a TCPStore server drops the client for it, as torch's does")
    store.set("text", "abc")
    with pytest.raises(ValueError, match="text' is not an integer counter"):
        store.add("text", 1)  # a ValueError, as torch's stores raise
    assert store.get("text") == b"abc"


def test_num_keys_counts_only_user_keys_without_waiting_for_workers():
    # As in torch, only stores that wait for a world size register under init/.
    server = c10d.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), wait_for_workers=False)
    server.set("a", "1")
    assert server.num_keys() == 1
    client = c10d.TCPStore("127.0.0.1", server.port, 2, False, timedelta(seconds=10))
    assert server.num_keys() == 2  # the client registered (world size 2, waits by default)
    del client


def test_compare_set_cases(store):
    assert store.compare_set("cs", "", "first") == b"first"
    assert store.compare_set("cs", "first", "second") == b"second"
    assert store.compare_set("cs", "nope", "third") == b"second"
    assert store.get("cs") == b"second"
    assert store.compare_set("missing", "exp", "des") == b"exp"
    assert not store.check(["missing"])


def test_check_delete_num_keys(store):
    base = store.num_keys()
    store.set("a", "1")
    store.set("b", "2")
    assert store.check(["a", "b"])
    assert not store.check(["a", "zz"])
    assert store.num_keys() == base + 2
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert store.num_keys() == base + 1


def test_append_multi(store):
    store.append("ap", "po")
    store.append("ap", b"tato")
    assert store.get("ap") == b"potato"
    store.multi_set(["x", "y"], ["1", b"2"])
    assert store.multi_get(["y", "x"]) == [b"2", b"1"]
    assert store.has_extended_api()


def test_wait_timeout_names_keys_and_store_survives(store):
    store.set("here", "1")
    start = time.monotonic()
    with pytest.raises(c10d.DistStoreError, match="absent_key") as info:
        store.wait(["here", "absent_key"], timedelta(milliseconds=200))
    assert isinstance(info.value, c10d.DistTimeoutError)
    assert isinstance(info.value, RuntimeError)
    assert 0.15 <= time.monotonic() - start < 5
    store.set("after", "ok")
    assert store.get("after") == b"ok"


def test_get_missing_times_out(store):
    store.set_timeout(timedelta(milliseconds=200))
    assert store.timeout == timedelta(milliseconds=200)
    with pytest.raises(c10d.DistStoreError, match="never_set"):
        store.get("never_set")


def test_negative_timeout_has_run_out(store):
    """`wait(keys, deadline - now)` computed too late times out at once (it waited forever once:
    the stores read a negative timeout as none); present keys still pass."""
    store.set("here", "1")
    start = time.monotonic()
    store.wait(["here"], timedelta(seconds=-1))
    with pytest.raises(c10d.DistStoreTimeoutError, match="negative timeout.*absent"):
        store.wait(["here", "absent"], timedelta(seconds=-1))
    store.set_timeout(timedelta(seconds=-1))
    assert store.get("here") == b"1"
    with pytest.raises(c10d.DistStoreTimeoutError, match="absent"):
        store.get("absent")
    with pytest.raises(c10d.DistStoreTimeoutError, match="absent"):
        store.wait(["absent"])
    assert time.monotonic() - start < 5
    store.set("after", "ok")
    assert store.get("after") == b"ok"


@pytest.mark.parametrize("write", ["set", "add", "append", "compare_set", "multi_set"])
def test_wait_woken_by_write(store, write):
    done = threading.Event()

    def waiter():
        store.wait(["wk"], timedelta(seconds=10))
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.02)  # covers both orders; the assertion does not depend on which happened
    {
        "set": lambda: store.set("wk", "v"),
        "add": lambda: store.add("wk", 1),
        "append": lambda: store.append("wk", "v"),
        "compare_set": lambda: store.compare_set("wk", "", "v"),
        "multi_set": lambda: store.multi_set(["wk"], ["v"]),
    }[write]()
    t.join(10)
    assert done.is_set()


def test_bad_value_type(store):
    with pytest.raises(TypeError):
        store.set("k", 12)


def test_python_store_driven_from_cpp():
    s = DictStore()
    c10d._C._test_python_store(s)  # raises if any step misbehaves
    assert s.get("_cpp/x") == b"xz"
    # And through a C++ PrefixStore wrapping the Python store.
    p = c10d.PrefixStore("pre", s)
    p.set("k", "v")
    assert s.get("pre/k") == b"v"
    assert p.add("n", 3) == 3
    assert p.underlying_store is s
    c10d._C._test_python_store(p)


def test_prefix_store_accessors():
    inner = c10d.HashStore()
    outer = c10d.PrefixStore("a", c10d.PrefixStore("b", inner))
    outer.set("k", "v")
    assert inner.get("b/a/k") == b"v"
    assert outer._underlying_non_prefix_store is inner
    assert isinstance(outer.underlying_store, c10d.PrefixStore)


def test_hash_store_honours_timeout():
    s = c10d.HashStore()
    s.set_timeout(timedelta(milliseconds=100))
    start = time.monotonic()
    with pytest.raises(c10d.DistStoreTimeoutError):
        s.get("nothing")
    assert time.monotonic() - start < 5


def test_queue_ops_hash():
    s = c10d.HashStore()
    s.set_timeout(timedelta(milliseconds=100))
    s.queue_push("q", "a")
    s.queue_push("q", b"b")
    assert s.queue_len("q") == 2
    assert s.queue_pop("q") == b"a"
    assert s.queue_pop("q", block=False) == b"b"
    with pytest.raises(c10d.DistQueueEmptyError):
        s.queue_pop("q", block=False)


def test_gil_released_during_blocking_wait():
    s = c10d.HashStore()
    ticks = []

    def ticker():
        for _ in range(5):
            ticks.append(1)
            time.sleep(0.01)
        s.set("go", "1")

    t = threading.Thread(target=ticker)
    t.start()
    s.wait(["go"], timedelta(seconds=10))  # would deadlock if the GIL were held
    t.join()
    assert len(ticks) == 5


# --- Behaviour torch.distributed's own store tests check ----------------------------------


def test_timeouts_say_timeout_and_name_the_keys(tmp_path):
    tcp = c10d.TCPStore("127.0.0.1", 0, 1, True)
    for store, key in [
        (c10d.HashStore(), "bad_key"),
        (tcp, "/bad_key"),
        (c10d.FileStore(str(tmp_path / "f"), 1), "bad_key"),
    ]:
        with pytest.raises(c10d.DistStoreError, match=f"wait timeout after 250ms, keys: {key}"):
            store.wait(["bad_key"], timedelta(seconds=0.25))
        store.set_timeout(timedelta(seconds=0.05))
        with pytest.raises(c10d.DistStoreError, match="timeout"):
            store.queue_pop("empty")
        with pytest.raises(c10d.QueueEmptyError, match="empty"):
            store.queue_pop("empty", block=False)


def test_hash_store_clones_share_the_map():
    a = c10d.HashStore()
    b = a.clone()
    assert isinstance(b, c10d.Store)
    a.set("k", "v")
    assert b.get("k") == b"v"
    b.queue_push("q", "1")
    assert a.check(["q"]) and a.queue_pop("q") == b"1"


def test_file_store_opens_beyond_world_size_and_counts_queues(tmp_path):
    path = str(tmp_path / "f")
    first, second = c10d.FileStore(path, 1), c10d.FileStore(path, 1)
    first.queue_push("q", "x")
    assert second.check(["q"]) and second.queue_len("q") == 1
    del first
    assert (tmp_path / "f").exists()
    del second
    assert not (tmp_path / "f").exists()


def test_tcp_store_constructor_rules():
    with pytest.raises(ValueError, match="world size cannot be 0"):
        c10d.TCPStore("127.0.0.1", 0, world_size=0, is_master=False)
    with pytest.raises(TypeError):
        c10d.TCPStore("127.0.0.1", 0, 1, 1)  # is_master must be a bool
    assert not c10d.TCPStore("127.0.0.1", 0, 1, True, use_libuv=False).libuvBackend
    server = c10d.TCPStore("127.0.0.1", 0, 1, True)
    assert server.libuvBackend
    with pytest.raises(
        c10d.DistNetworkError,
        match=f"^The server socket has failed to listen on any local .*{server.port}",
    ):
        c10d.TCPStore("127.0.0.1", server.port, 1, True)


def test_agent_store_turns_a_master_into_a_client(monkeypatch):
    server = c10d.TCPStore("127.0.0.1", 0, 1, True)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    second = c10d.TCPStore("127.0.0.1", server.port, 1, True)
    second.set("k", "v")
    assert server.get("k") == b"v"


class MinimalStore(c10d.Store):
    """Only the four methods a Python store must define; the others fall back on them."""

    def __init__(self):
        super().__init__()
        self.data = {}

    def set(self, key, value):
        self.data[key] = value

    def get(self, key):
        return self.data[key]

    def add(self, key, value):
        self.data[key] = str(int(self.data.get(key, b"0")) + value).encode()
        return int(self.data[key])

    def compare_set(self, key, expected, desired):
        current = self.data.get(key)
        if current is None and expected == b"" or current == expected:
            self.data[key] = desired
            return desired
        return expected if current is None else current


def test_python_store_fallbacks_and_missing_methods():
    c10d._test_python_store(MinimalStore())
    store = c10d.PrefixStore("p", MinimalStore())  # the prefix store keeps the object alive
    store.append("foo", b"po")
    store.append("foo", b"tato")
    store.multi_set(["a", "b"], [b"c", b"d"])
    assert store.multi_get(["a", "b", "foo"]) == [b"c", b"d", b"potato"]
    assert store.add("n", 3) == 3

    class Empty(c10d.Store):
        pass

    with pytest.raises(RuntimeError, match="Not implemented"):
        Empty().append("foo", "bar")
    with pytest.raises(RuntimeError, match="Not implemented"):
        c10d.PrefixStore("p", Empty()).multi_get(["foo"])


def test_python_store_with_torchs_cpp_method_names():
    """Stores written for torch define getNumKeys and deleteKey (the names torch's adapter
    calls); c10d calls them when num_keys and delete_key are not defined."""

    class TorchStyle(c10d.Store):
        def __init__(self):
            super().__init__()
            self.d = {}

        def set(self, key, value):
            self.d[key] = value

        def getNumKeys(self):
            return len(self.d)

        def deleteKey(self, key):
            return self.d.pop(key, None) is not None

    store = c10d.PrefixStore("p", TorchStyle())
    store.set("x", "y")
    store.set("z", "y")
    assert store.num_keys() == 2
    assert store.delete_key("x") is True
    assert store.delete_key("x") is False
    assert store.num_keys() == 1


def test_rendezvous_yields_like_torch(tmp_path, monkeypatch):
    url = f"file://{tmp_path / 'f'}?world_size=2"
    store0, rank0, size0 = next(c10d.rendezvous(url + "&rank=0"))
    store1, rank1, size1 = next(c10d.rendezvous(f"file://{tmp_path / 'f'}", 1, 2))
    assert (rank0, size0, rank1, size1) == (0, 2, 1, 2)
    store0.set("k", "v")
    assert store1.get("k") == b"v"
    with pytest.raises(AssertionError, match="has node-specific arguments"):
        c10d.rendezvous(url + "&rank=0", 0, 2)
    with pytest.raises(ValueError, match="path missing"):
        next(c10d.rendezvous("file://?rank=0&world_size=1"))
    with pytest.raises(ValueError, match="port number missing"):
        next(c10d.rendezvous("tcp://127.0.0.1?rank=0&world_size=1"))
    with pytest.raises(ValueError, match="rank parameter missing"):
        next(c10d.rendezvous("tcp://127.0.0.1:1?world_size=1"))
    with pytest.raises(ValueError, match="size parameter missing"):
        next(c10d.rendezvous("tcp://127.0.0.1:1?rank=0"))
    monkeypatch.setenv("USE_LIBUV", "0")
    store, _, _ = next(c10d.rendezvous("tcp://127.0.0.1:0?rank=0&world_size=1"))
    assert not store.libuvBackend


def test_append_fallback_keeps_every_append():
    # Through a prefix store (C++), append takes the fallback on compare_set. Appending the
    # bytes a key already holds used to look like a completed swap and was dropped.
    p = c10d.PrefixStore("p", MinimalStore())
    p.set("k", b"x")
    p.append("k", b"x")  # the appended bytes equal the current value
    p.append("k", b"x")
    assert p.get("k") == b"xxx"
    p.append("new", b"")
    assert p.get("new") == b""


class StoresIntoMissingKeys(MinimalStore):
    """compare_set stores into a missing key whatever was expected (as a store in torch's tests)."""

    def compare_set(self, key, expected, desired):
        current = self.data.get(key)
        if current is None or current == expected:
            self.data[key] = desired
            return desired
        return current


def test_append_fallback_on_a_store_that_stores_into_missing_keys():
    p = c10d.PrefixStore("p", StoresIntoMissingKeys())
    p.append("foo", b"po")
    p.append("foo", b"tato")
    assert p.get("foo") == b"potato"
    p.set("k", b"x")
    p.append("k", b"x")
    assert p.get("k") == b"xx"


def test_prefix_store_timeout_is_the_underlying_stores():
    """As torch's PrefixStore: the timeout is read from and set on the wrapped store, so one
    set on the base after wrapping bounds the prefix store's waits too."""
    base = c10d.HashStore()
    prefixed = c10d.PrefixStore("p", base)
    base.set_timeout(timedelta(milliseconds=200))
    assert prefixed.timeout == timedelta(milliseconds=200)
    start = time.monotonic()
    with pytest.raises(c10d.DistStoreTimeoutError, match="nope"):
        prefixed.wait(["nope"])
    assert time.monotonic() - start < 5
    prefixed.set_timeout(timedelta(seconds=7))
    assert base.timeout == timedelta(seconds=7)
