"""The control plane from Python: StoreCollectives across threads, handlers written in Python,
worker servers over unix sockets and TCP, and query_all across stores and processes."""

import json
import os
import stat
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

import c10d
from c10d import control

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "python")
TIMEOUT = timedelta(seconds=10)


def run_ranks(world_size, fn):
    """Runs fn(collectives) on one thread per rank over one HashStore; returns the results."""
    store = c10d.HashStore()
    results, errors = [None] * world_size, []

    def body(rank):
        try:
            results[rank] = fn(c10d.StoreCollectives(store, rank, world_size))
        except Exception as e:  # noqa: BLE001  (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# --- StoreCollectives -----------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_collective(world_size):
    def fn(c):
        r, n = c.rank, c.world_size
        c.barrier("b", TIMEOUT)
        total = c.all_sum("sum", r + 1, TIMEOUT)
        if r == 0:
            c.broadcast_send("bc", b"hello", TIMEOUT)
            bc = b"hello"
            gathered = c.gather_recv("g", f"g{r}", TIMEOUT)
            mine = c.scatter_send("s", [f"s{i}".encode() for i in range(n)], TIMEOUT)
        else:
            bc = c.broadcast_recv("bc", TIMEOUT)
            c.gather_send("g", f"g{r}", TIMEOUT)
            gathered = None
            mine = c.scatter_recv("s", TIMEOUT)
        everyone = c.all_gather("ag", bytes([r]), TIMEOUT)
        return total, bc, gathered, mine, everyone

    n = world_size
    for rank, (total, bc, gathered, mine, everyone) in enumerate(run_ranks(n, fn)):
        assert total == n * (n + 1) // 2
        assert bc == b"hello"
        if rank == 0:
            assert gathered == [f"g{i}".encode() for i in range(n)]
        assert mine == f"s{rank}".encode()
        assert everyone == [bytes([i]) for i in range(n)]


def test_timeout_names_missing_ranks():
    store = c10d.HashStore()
    c0 = c10d.StoreCollectives(store, 0, 3)
    c10d.StoreCollectives(store, 2, 3).barrier("b", TIMEOUT, block=False)
    with pytest.raises(c10d.DistTimeoutError, match=r"barrier\(key='b'\).*rank\(s\) \[1\] did"):
        c0.barrier("b", timedelta(milliseconds=50))
    with pytest.raises(c10d.DistStoreError, match=r"all_gather.*\[1, 2\] did not arrive"):
        c0.all_gather("ag", b"x", 0.05)  # a float timeout is seconds
    with pytest.raises(c10d.DistTimeoutError, match="no rank called broadcast_send"):
        c0.broadcast_recv("bc", timedelta(milliseconds=20))


def test_key_reuse_is_an_error():
    c = c10d.StoreCollectives(c10d.HashStore(), 0, 1)
    c.barrier("k")
    with pytest.raises(ValueError, match="key 'k' was already used"):
        c.barrier("k")
    assert isinstance(c, c10d._C._ControlCollectives)
    assert c10d._C._StoreCollectives is c10d.StoreCollectives


# --- handlers ---------------------------------------------------------------------------------


class Request(c10d._C._Request):
    def __init__(self, body=b"", params=None):
        super().__init__()
        self._body, self._params = body, params or {}

    def body(self):
        return self._body

    def params(self):
        return self._params


class Response(c10d._C._Response):
    def __init__(self):
        super().__init__()
        self.status, self.content, self.content_type = 200, b"", None

    def set_content(self, content, content_type):
        # Python handlers call this directly with str; C++ handlers pass bytes.
        self.content = content.encode() if isinstance(content, str) else content
        self.content_type = content_type

    def set_status(self, status):
        self.status = status


def _echo(request, response):
    response.set_content(request.body() + b"|" + request.get_param("x").encode(), "text/plain")


def _fail(request, response):
    raise ValueError("handler exploded")


def _register_once(name, fn):
    if name not in c10d._C._get_handler_names():
        c10d._C._register_handler(name, fn)


def test_builtin_handlers_are_registered():
    names = c10d._C._get_handler_names()
    assert {"ping", "dump_traceback", "dump_trace_json", "store_keys"} <= set(names)
    assert names == sorted(names)


def test_python_handler_through_get_handler():
    _register_once("py_echo", _echo)
    with pytest.raises(ValueError, match="already registered"):
        c10d._C._register_handler("py_echo", _echo)
    response = Response()
    c10d._C._get_handler("py_echo")(Request(b"body", {"x": "7"}), response)
    assert response.content == b"body|7"
    with pytest.raises(ValueError, match="no control-plane handler named 'missing'"):
        c10d._C._get_handler("missing")


def test_dump_traceback_shows_the_calling_thread():
    response = Response()
    c10d._C._get_handler("dump_traceback")(Request(), response)
    text = response.content.decode()
    assert "MainThread" in text
    assert "test_dump_traceback_shows_the_calling_thread" in text


def test_dump_trace_json_answers_503_or_json():
    response = Response()
    c10d._C._get_handler("dump_trace_json")(Request(params={"onlyActive": "true"}), response)
    if response.status == 503:  # no flight recorder in this process
        assert b"flight recorder not enabled" in response.content
    else:
        assert response.status == 200
        json.loads(response.content)


# --- worker servers ---------------------------------------------------------------------------


def test_unix_socket_server(tmp_path):
    store = c10d.HashStore()
    _register_once("py_echo", _echo)
    _register_once("py_fail", _fail)
    with control.start_worker_servers(store, 0, dir=str(tmp_path / "sockets")) as server:
        path = server.socket_path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert store.get(control.address_key(0)) == ("unix:" + path).encode()
        assert control.query_all(store, 1, "ping") == {0: "pong"}
        assert control.query_all(store, 1, "py_echo", {"x": "y"}, body=b"hi") == {0: "hi|y"}
        with pytest.raises(control.ControlPlaneError, match=r"rank 0: HTTP 500.*handler exploded"):
            control.query_all(store, 1, "py_fail")
        with pytest.raises(control.ControlPlaneError, match="HTTP 404.*no handler named 'nope'"):
            control.query_all(store, 1, "nope")
    assert not os.path.exists(path)


def test_two_ranks_in_one_process_over_tcp_and_a_missing_rank():
    store = c10d.HashStore()
    servers = [control.start_worker_servers(store, rank) for rank in range(2)]
    try:
        assert all(s.port > 0 for s in servers)
        traces = control.query_all(store, 2, "dump_traceback")
        assert set(traces) == {0, 1}
        assert "test_two_ranks_in_one_process_over_tcp_and_a_missing_rank" in traces[0]
        with pytest.raises(control.ControlPlaneError) as info:
            control.query_all(store, 3, "ping", timeout=0.1)
        assert info.value.results == {0: "pong", 1: "pong"}
        assert "no worker server address published" in info.value.errors[2]
    finally:
        for s in servers:
            s.shutdown()


def test_shared_secret(monkeypatch):
    store = c10d.HashStore()
    with control.start_worker_servers(store, 0, secret="hunter2") as server:
        assert server.requires_auth
        monkeypatch.delenv("C10D_CONTROL_SECRET", raising=False)
        with pytest.raises(control.ControlPlaneError, match="HTTP 401.*Authorization: Bearer"):
            control.query_all(store, 1, "ping")
        with pytest.raises(control.ControlPlaneError, match="HTTP 401.*wrong secret"):
            control.query_all(store, 1, "ping", secret="nope")
        assert control.query_all(store, 1, "ping", secret="hunter2") == {0: "pong"}
        monkeypatch.setenv("C10D_CONTROL_SECRET", "hunter2")
        assert control.query_all(store, 1, "ping") == {0: "pong"}


def test_store_keys_lists_the_servers_store():
    store = c10d.HashStore()
    store.set("a", "1")
    with control.start_worker_servers(store, 0):
        keys = control.query_all(store, 1, "store_keys")[0]
    assert '"a"' in keys and '"c10d/worker_server/0"' in keys


# A worker process: starts its server on a TCPStore, then waits until told to finish, so the
# parent can ask it for its stacks while it is blocked.
WORKER = r"""
import sys
from datetime import timedelta
import c10d
from c10d import control
port, rank = int(sys.argv[1]), int(sys.argv[2])
store = c10d.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
server = control.start_worker_servers(store, rank, dir=sys.argv[3] if len(sys.argv) > 3 else None)
def waiting_for_the_parent():
    store.wait(["finish"])
waiting_for_the_parent()
server.shutdown()
"""


def test_query_all_across_processes(tmp_path):
    store = c10d.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("C10D_CONTROL_SECRET", None)
    args = [[], [str(tmp_path)]]  # rank 0 over TCP, rank 1 over a unix socket
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(store.port), str(rank)] + args[rank], env=env
        )
        for rank in range(2)
    ]
    try:
        assert control.query_all(store, 2, "ping", timeout=20) == {0: "pong", 1: "pong"}
        traces = control.query_all(store, 2, "dump_traceback", timeout=20)
        for rank in range(2):
            assert "waiting_for_the_parent" in traces[rank], traces[rank]
    finally:
        store.set("finish", "1")
        for p in procs:
            assert p.wait(timeout=30) == 0
