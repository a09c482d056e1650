"""The control plane: ask every rank of a running job something over HTTP.

Each rank runs a worker server (``start_worker_servers``) and publishes its address in the
job's store under ``c10d/worker_server/<rank>``; ``query_all`` then asks every rank at once::

    server = c10d.control.start_worker_servers(store, rank)        # on every rank
    print(c10d.control.query_all(store, world_size, "dump_traceback"))  # anywhere

Handlers are registered process-wide with ``c10d._C._register_handler(name, fn)`` where
``fn(request, response)`` reads ``request.body()`` / ``request.get_param(name)`` and calls
``response.set_content(content, content_type)`` / ``response.set_status(code)``. Built in:
``ping``, ``dump_traceback`` (every Python thread's stack), ``dump_trace_json`` (the flight
recorder) and ``store_keys`` (the keys of the server's store).

With ``C10D_CONTROL_SECRET`` set (or ``secret=`` passed), servers refuse requests that do not
carry ``Authorization: Bearer <secret>`` and ``query_all`` sends it.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import http.client
import os
import socket
import sys
import threading
import traceback
import urllib.parse
from typing import Dict, Mapping, Optional, Union

from . import _C

__all__ = ["ControlPlaneError", "address_key", "query_all", "start_worker_servers"]

_SECRET_ENV = "C10D_CONTROL_SECRET"  # declared in src/c10d/core/env.h
_ADDRESS_PREFIX = "c10d/worker_server/"
_DEFAULT_TIMEOUT = datetime.timedelta(seconds=30)

Timeout = Union[datetime.timedelta, float]


def address_key(rank: int) -> str:
    """The store key under which ``rank`` publishes its worker server's address."""
    return f"{_ADDRESS_PREFIX}{rank}"


def start_worker_servers(
    store,
    rank: int,
    dir: Optional[str] = None,
    *,
    host: str = "127.0.0.1",
    secret: Optional[str] = None,
):
    """Starts this rank's worker server and publishes its address in ``store``.

    With ``dir``, the server listens on the unix socket ``<dir>/rank<rank>.sock`` (the
    directory is created with mode 0700 if needed; the socket is 0600). Without, it listens on
    a free TCP port of ``host``; pass ``host="0.0.0.0"`` to be reachable from other machines
    (the published address then uses this machine's hostname), preferably with a secret.

    The server serves until its ``shutdown()`` or until the returned object is garbage
    collected, so keep a reference for as long as the job should answer.
    """
    if dir is not None:
        os.makedirs(dir, mode=0o700, exist_ok=True)
        path = os.path.join(dir, f"rank{rank}.sock")
        server = _C._WorkerServer(path, -1, store=store, secret=secret)
        address = "unix:" + path
    else:
        server = _C._WorkerServer(host, 0, store=store, secret=secret)
        public = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        address = f"{public}:{server.port}"
    store.set(address_key(rank), address)
    return server


class ControlPlaneError(RuntimeError):
    """Some ranks did not answer a ``query_all``. ``results`` holds the answers that did
    come back ({rank: text}) and ``errors`` the reason for each rank that did not."""

    def __init__(self, handler: str, results: Dict[int, str], errors: Dict[int, str]):
        lines = [f"rank {rank}: {reason}" for rank, reason in sorted(errors.items())]
        super().__init__(
            f"query_all({handler!r}) failed on {len(errors)} rank(s):\n  " + "\n  ".join(lines)
        )
        self.results = results
        self.errors = errors


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: connects to ``path`` instead of a host and port."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _connection(address: str, timeout: float) -> http.client.HTTPConnection:
    if address.startswith("unix:"):
        return _UnixHTTPConnection(address[len("unix:") :], timeout)
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)


def _seconds(timeout: Timeout) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _request(
    address: str,
    handler: str,
    params: Optional[Mapping[str, str]],
    body: bytes,
    secret: str,
    timeout: float,
) -> str:
    path = "/handler/" + urllib.parse.quote(handler, safe="")
    if params:
        path += "?" + urllib.parse.urlencode(params)
    headers = {"Content-Type": "application/octet-stream"}
    if secret:
        headers["Authorization"] = "Bearer " + secret
    conn = _connection(address, timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode("utf-8", errors="replace")
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status} from {address}: {text.strip()}")
    return text


def query_all(
    store,
    world_size: int,
    handler: str,
    params: Optional[Mapping[str, str]] = None,
    timeout: Timeout = _DEFAULT_TIMEOUT,
    *,
    body: bytes = b"",
    secret: Optional[str] = None,
) -> Dict[int, str]:
    """POSTs to ``handler`` on every rank's worker server, all ranks at once, and returns
    ``{rank: response text}``.

    ``timeout`` bounds both the wait for a rank's published address and its answer. If any
    rank fails (no address, refused, non-200 status, timeout), raises ``ControlPlaneError``
    naming each failed rank and carrying the answers of the others. ``secret`` defaults to
    ``C10D_CONTROL_SECRET``.
    """
    seconds = _seconds(timeout)
    if secret is None:
        secret = os.environ.get(_SECRET_ENV, "")

    def ask(rank: int) -> str:
        key = address_key(rank)
        try:
            store.wait([key], datetime.timedelta(seconds=seconds))
        except _C.DistStoreTimeoutError:
            raise RuntimeError(
                f"no worker server address published under {key!r} within "
                f"{seconds:g}s (did rank {rank} call start_worker_servers?)"
            ) from None
        address = store.get(key).decode()
        try:
            return _request(address, handler, params, body, secret, seconds)
        except (OSError, http.client.HTTPException) as e:
            raise RuntimeError(f"cannot reach worker server at {address}: {e}") from e

    results: Dict[int, str] = {}
    errors: Dict[int, str] = {}
    workers = max(1, min(world_size, 32))
    with concurrent.futures.ThreadPoolExecutor(workers, "c10d-query") as pool:
        futures = {pool.submit(ask, rank): rank for rank in range(world_size)}
        for future, rank in futures.items():
            try:
                results[rank] = future.result()
            except Exception as e:  # noqa: BLE001  (reported per rank)
                errors[rank] = str(e)
    if errors:
        raise ControlPlaneError(handler, results, errors)
    return results


def _dump_traceback(request, response) -> None:
    """Built-in handler: the stack of every Python thread of this process, innermost last."""
    names = {t.ident: t for t in threading.enumerate()}
    parts = []
    for ident, frame in sorted(sys._current_frames().items()):
        thread = names.get(ident)
        label = thread.name if thread is not None else "unnamed"
        if ident == threading.get_ident():
            label += ", answering this request"
        if thread is not None and thread.daemon:
            label += ", daemon"
        parts.append(f"Thread {ident} ({label}), most recent call last:\n")
        parts.append("".join(traceback.format_stack(frame)))
        parts.append("\n")
    response.set_content("".join(parts), "text/plain")


def _register_builtin_handlers() -> None:
    if "dump_traceback" not in _C._get_handler_names():
        _C._register_handler("dump_traceback", _dump_traceback)


_register_builtin_handlers()
