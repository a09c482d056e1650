"""c10d beside PyTorch 2.x in one process: TCPStore wire compatibility in both directions
(against torch's libuv and non-libuv servers), rendezvous of each side's groups through the
other's store, and c10d's Gloo groups next to torch's own (Debian's libgloo and the copy
inside torch must not clash)."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from dist import harness

torch = harness.require_peer("torch", min_version="2.0")
import torch.distributed as tdist  # noqa: E402

import c10d  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHORT = timedelta(milliseconds=300)


def make_server(kind):
    """A TCPStore server of `kind` on a free port: c10d's, or torch's with or without libuv."""
    cls = c10d.TCPStore if kind == "c10d" else tdist.TCPStore
    return cls(
        "127.0.0.1",
        0,
        None,
        True,
        timedelta(seconds=30),
        wait_for_workers=False,
        use_libuv=kind != "torch-legacy",
    )


def make_client(kind, port):
    # 5 s: what a client waits for an answer the non-libuv server never sends (queue_pop).
    cls = c10d.TCPStore if kind == "c10d" else tdist.TCPStore
    return cls("127.0.0.1", port, None, False, timedelta(seconds=5))


# Every operation torch's TCPStore has, as (name, what it does on a store). Each runs on a new
# client: a server may drop a client for an operation it does not know (torch's non-libuv
# server has no queues), and that must not decide the operations after it.
def _wait_missing(s):
    s.wait(["never-set"], SHORT)


def _get_missing(s):
    s.set_timeout(SHORT)
    return s.get("never-set")


def _get_later(s):
    # A key set while get() waits: the get must block, then return it.
    return s.get("set-later")


OPS = [
    ("set", lambda s: s.set("k", "v")),
    ("get", lambda s: s.get("k")),
    ("get (missing, times out)", _get_missing),
    ("add", lambda s: (s.add("n", 5), s.add("n", -2))),
    ("compare_set (matches)", lambda s: s.compare_set("k", "v", "w")),
    ("compare_set (differs)", lambda s: s.compare_set("k", "x", "y")),
    ("compare_set (missing key)", lambda s: s.compare_set("fresh", "", "z")),
    ("check", lambda s: (s.check(["k", "n"]), s.check(["k", "nope"]))),
    ("multi_set", lambda s: s.multi_set(["a", "b"], ["1", "2"])),
    ("multi_get", lambda s: s.multi_get(["a", "b", "k"])),
    ("append", lambda s: (s.append("app", "x"), s.append("app", "y"), s.get("app"))),
    ("delete_key", lambda s: (s.delete_key("a"), s.delete_key("a"), s.check(["a"]))),
    ("num_keys", lambda s: s.num_keys()),
    ("wait", lambda s: s.wait(["k", "n"])),
    ("wait with timeout", lambda s: s.wait(["k"], SHORT)),
    ("wait (missing, times out)", _wait_missing),
    # A push has no answer: the round trip after it decides whether the server took it (one
    # that drops the connection may do so before or after the second push is sent).
    ("queue_push", lambda s: (s.queue_push("q", "a"), s.queue_push("q", "b"), s.check(["k"]))),
    ("queue_len", lambda s: s.queue_len("q")),
    ("queue_pop", lambda s: (s.queue_pop("q"), s.queue_pop("q", block=False))),
    ("queue_pop (empty, not blocking)", lambda s: s.queue_pop("q", block=False)),
    ("list_keys", lambda s: sorted(s.list_keys())),
]


def outcome(fn, store):
    """What an operation gave: its value, or the names of the exception's classes."""
    try:
        return ("value", fn(store))
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("raised", [c.__name__ for c in type(e).__mro__])


def run_all(server_kind, client_kind):
    server = make_server(server_kind)
    results = {}
    try:
        for name, fn in OPS:
            client = make_client(client_kind, server.port)
            results[name] = outcome(fn, client)
            del client
    finally:
        del server
    return results


# c10d's names for torch's exceptions where they differ (c10d's are subclasses where torch's
# are more general: a timeout is a DistStoreTimeoutError, also a DistStoreError).
ALIASES = {"QueueEmptyError": "DistQueueEmptyError"}


@pytest.mark.parametrize("server_kind", ["torch-libuv", "torch-legacy"])
def test_c10d_client_behaves_as_torchs_against_torchs_servers(server_kind):
    torch_side = run_all(server_kind, "torch")
    ours = run_all(server_kind, "c10d")
    for name, _ in OPS:
        t, c = torch_side[name], ours[name]
        assert c[0] == t[0], (server_kind, name, t, c)
        if t[0] == "value":
            assert c == t, (server_kind, name, t, c)
        elif server_kind == "torch-libuv":
            # The same exception class (torch's or a subclass of it under c10d's name).
            assert ALIASES.get(t[1][0], t[1][0]) in c[1], (name, t, c)
        # Against the non-libuv server, which has no queues, both clients fail the queue
        # operations (the connection is dropped), each with its own DistError.
    expected_errors = {
        "get (missing, times out)",
        "wait (missing, times out)",
        "queue_pop (empty, not blocking)",
    }
    if server_kind == "torch-legacy":
        expected_errors |= {"queue_push", "queue_len", "queue_pop"}
    assert {
        name for name, (kind, _) in torch_side.items() if kind == "raised"
    } == expected_errors, torch_side


def test_torch_client_behaves_against_c10ds_server_as_against_its_own():
    assert run_all("c10d", "torch") == run_all("torch-libuv", "torch")


def test_get_waits_for_a_key_set_later_on_a_non_libuv_server():
    # c10d's get sends GET only once the key exists: this server drops a client that GETs a
    # missing key.
    import threading

    server = make_server("torch-legacy")
    client = make_client("c10d", server.port)
    setter = threading.Timer(0.2, lambda: make_client("torch", server.port).set("late", "x"))
    setter.start()
    try:
        assert client.get("late") == b"x"
        assert client.get("late") == b"x"  # the connection survived
    finally:
        setter.join()


def test_groups_rendezvous_through_each_others_stores_and_gloo_copies_coexist(tmp_path):
    # 2 ranks, each with a torch gloo group over c10d's TCPStore server and a c10d gloo group
    # over torch's, both all_reducing torch tensors (c10d also numpy arrays) in one process.
    script = os.path.join(HERE, "dist", "torch_interop.py")
    results = harness.run_script(
        script, [[str(r), "2", str(tmp_path)] for r in range(2)], timeout=180
    )
    for r in results:
        assert r.code == 0, f"rank {r.rank}:\n{r.stdout}\n{r.stderr}"
        assert "interop ok" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "backend,world",
    [("gloo", 1), ("gloo", 2), ("shm", 2)] + ([("mpi", 2)] if harness.mpi_available() else []),
)
def test_torchs_profiler_records_every_operation(backend, world):
    results = harness.run("torch_profiler_events", world, backend, timeout=120)
    harness.check_all_ok(results)
    assert all("PROFILER_OK" in r.stdout for r in results), [r.stdout for r in results]


def test_c10d_shares_the_rendezvous_port_torch_serves_in_the_process():
    # torch's init_process_group serves MASTER_PORT first (torch's multi-tenant server, which
    # its rpc shares too); c10d's rendezvous on the same port joins that server instead of
    # failing with "address in use", and both see each other's keys.
    script = (
        "import os, sys\n"
        "import torch, torch.distributed as tdist\n"
        "import c10d\n"
        "tdist.init_process_group('gloo', init_method='env://', rank=0, world_size=1)\n"
        "c10d.init_process_group('gloo', init_method='env://', rank=0, world_size=1)\n"
        "t = torch.ones(3)\n"
        "c10d.all_reduce(t)\n"
        "tdist.all_reduce(t)\n"
        "assert t.tolist() == [1.0, 1.0, 1.0], t\n"
        "server = tdist.TCPStore('127.0.0.1', int(os.environ['MASTER_PORT']), 1, True,\n"
        "                        wait_for_workers=False, multi_tenant=True)\n"
        "server.set('from_torch', 'x')\n"
        "mine = c10d.distributed_c10d._get_default_store()\n"
        "while isinstance(mine, c10d.PrefixStore):\n"
        "    mine = mine.underlying_store\n"
        "assert mine.get('from_torch') == b'x'\n"
        "c10d.destroy_process_group()\n"
        "tdist.destroy_process_group()\n"
        "print('shared ok')\n"
    )
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(harness.free_port()))
    env["PYTHONPATH"] = os.path.join(HERE, "..", "..", "python")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "shared ok" in out.stdout, out.stdout + out.stderr
