"""TCPStore across real processes: fixed and unfixed world sizes, missing workers, and the
store_server command-line entry point. Servers bind port 0 (or a socket bound to port 0)."""

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

import c10d

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "python")
NUM_CLIENTS = 8
TIMEOUT = timedelta(seconds=60)

# One client process: registers (world_size given or not), publishes its rank, then meets the
# others at a store barrier (add + wait) and checks everything it can see.
CLIENT = r"""
import sys
from datetime import timedelta
import c10d
port, rank, world = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
world_size = int(world) if world != "none" else None
store = c10d.TCPStore("127.0.0.1", port, world_size=world_size, is_master=False,
                      timeout=timedelta(seconds=60))
store.set(f"rank{rank}", str(rank))
n = int(sys.argv[4])
if store.add("arrived", 1) == n:
    store.set("all_arrived", "1")
store.wait(["all_arrived"])
values = store.multi_get([f"rank{r}" for r in range(n)])
assert values == [str(r).encode() for r in range(n)], values
store.queue_push("done", str(rank))
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _spawn_clients(port, world):
    return [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), str(rank), world, str(NUM_CLIENTS)],
            env=_env(),
        )
        for rank in range(NUM_CLIENTS)
    ]


def _join(procs):
    for p in procs:
        assert p.wait(timeout=120) == 0


def _bound_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _collect_done(store):
    return sorted(int(store.queue_pop("done")) for _ in range(NUM_CLIENTS))


def test_clients_in_processes_with_unfixed_world_size():
    server = c10d.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT)
    procs = _spawn_clients(server.port, "none")
    assert _collect_done(server) == list(range(NUM_CLIENTS))
    _join(procs)
    # arrived, all_arrived and one key per rank (no init/: without a world size, as in torch,
    # nobody registers).
    assert server.num_keys() == 2 + NUM_CLIENTS
    assert server.add("arrived", 0) == NUM_CLIENTS


def test_master_waits_for_a_fixed_world_size():
    # The clients must know the port before the master's constructor (which blocks until
    # everyone joined) returns, so the master adopts a socket already bound to port 0.
    sock = _bound_socket()
    port = sock.getsockname()[1]
    procs = _spawn_clients(port, str(NUM_CLIENTS + 1))
    server = c10d.TCPStore(
        "127.0.0.1",
        port,
        world_size=NUM_CLIENTS + 1,
        is_master=True,
        timeout=TIMEOUT,
        master_listen_fd=sock.fileno(),
    )
    assert server.port == port
    assert server.libuvBackend
    assert _collect_done(server) == list(range(NUM_CLIENTS))
    _join(procs)
    sock.close()


def test_missing_workers_time_out_with_a_count():
    sock = _bound_socket()
    port = sock.getsockname()[1]
    joined = []

    def one_worker():
        joined.append(c10d.TCPStore("127.0.0.1", port, world_size=4, timeout=TIMEOUT))

    worker = threading.Thread(target=one_worker)
    worker.start()
    # A DistStoreError, as torch raises, and a DistTimeoutError.
    with pytest.raises(
        c10d.DistStoreError,
        match=r"Timed out after 2 seconds waiting for clients\. [12]/4 clients "
        r"joined\.",
    ) as raised:
        c10d.TCPStore(
            "127.0.0.1",
            port,
            world_size=4,
            is_master=True,
            timeout=timedelta(seconds=2),
            master_listen_fd=sock.fileno(),
        )
    assert isinstance(raised.value, c10d.DistTimeoutError)
    worker.join()
    sock.close()


def test_client_timeout_names_the_address():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = sock.getsockname()[1]
    with pytest.raises(
        c10d.DistNetworkError,
        match=rf"timed out after 300ms while trying to connect to \(127\.0\.0\.1, "
        rf"{port}\)",
    ):
        c10d.TCPStore("127.0.0.1", port, timeout=timedelta(milliseconds=300))
    sock.close()


def test_client_waits_out_a_server_that_drops_it_while_another_takes_the_port():
    """A server shutting down may accept a connection and drop it in the handshake while the
    next one is about to listen on its port (rank 0 re-creating the process group): the client
    tries again instead of failing as if the server had refused it."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(20)  # accept() fails instead of blocking if the client never comes
    port = listener.getsockname()[1]
    servers = []

    def drop_then_serve():
        conn, _ = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset in the middle of the handshake
        listener.close()
        servers.append(
            c10d.TCPStore(
                "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=TIMEOUT
            )
        )

    thread = threading.Thread(target=drop_then_serve, daemon=True)
    thread.start()
    client = c10d.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
    thread.join(20)
    assert servers, "the replacement server did not start"
    client.set("k", "v")
    assert servers[0].get("k") == b"v"


def test_store_server_command_line():
    proc = subprocess.Popen(
        [sys.executable, "-m", "c10d.store_server", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("port="), line
        port = int(line.split("=", 1)[1])
        a = c10d.TCPStore("127.0.0.1", port, timeout=TIMEOUT)
        b = c10d.TCPStore("127.0.0.1", port, timeout=TIMEOUT)
        a.set("k", b"v")
        assert b.get("k") == b"v"
        assert b.num_keys() == 1  # k (no world size: no init/ registrations, as in torch)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # The server is gone: calls fail fast instead of hanging.
        with pytest.raises(c10d.DistNetworkError, match="closed the connection"):
            a.get("k")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
