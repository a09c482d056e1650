"""Rendezvous: turn an init_method URL (env://, tcp://, file://) into a store, rank and size."""

import logging
import os
import time
from datetime import timedelta
from typing import Tuple
from urllib.parse import parse_qs, urlparse

from . import _C

__all__ = ["rendezvous", "register_rendezvous_handler", "store_based_barrier"]

_handlers = {}


def register_rendezvous_handler(scheme, handler):
    """Adds a handler for URLs of `scheme`: handler(url, rank, world_size, timeout) returns
    (store, rank, world_size)."""
    if scheme in _handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _handlers[scheme] = handler


def _error(init_method: str, message: str) -> ValueError:
    return ValueError(f"Error initializing c10d using {init_method} rendezvous: {message}")


def _query_int(query, name, given, url):
    if given is not None and given != -1:
        return int(given)
    values = query.get(name)
    if not values:
        raise _error(url, f"{name} parameter missing (pass it in the URL or as an argument)")
    try:
        return int(values[0])
    except ValueError:
        raise _error(url, f"{name} must be an integer, got {values[0]!r}") from None


def _env_int(name: str, given, url: str) -> int:
    if given is not None and given != -1:
        return int(given)
    value = os.environ.get(name)
    if value is None or value == "":
        raise _error(url, f"environment variable {name} expected, but not set")
    try:
        return int(value)
    except ValueError:
        raise _error(url, f"environment variable {name} must be an integer, got {value!r}") \
            from None


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta):
    # Rank 0 hosts the server. Nobody waits inside the constructor: init_process_group's
    # rendezvous barrier waits instead, and can say which ranks are missing.
    return _C.TCPStore(host, port, world_size, rank == 0, timeout,
                       wait_for_workers=False, multi_tenant=True)


def _check_rank(rank: int, world_size: int, url: str):
    if world_size <= 0:
        raise _error(url, f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise _error(url, f"rank {rank} is outside [0, {world_size})")


def _env_handler(url, rank, world_size, timeout):
    rank = _env_int("RANK", rank, url)
    world_size = _env_int("WORLD_SIZE", world_size, url)
    _check_rank(rank, world_size, url)
    host = os.environ.get("MASTER_ADDR")
    if not host:
        raise _error(url, "environment variable MASTER_ADDR expected, but not set")
    port = _env_int("MASTER_PORT", None, url)
    return _tcp_store(host, port, rank, world_size, timeout), rank, world_size


def _tcp_handler(url, rank, world_size, timeout):
    parsed = urlparse(url)
    if not parsed.hostname or parsed.port is None:
        raise _error(url, "the URL must be tcp://host:port")
    query = parse_qs(parsed.query)
    rank = _query_int(query, "rank", rank, url)
    world_size = _query_int(query, "world_size", world_size, url)
    _check_rank(rank, world_size, url)
    return _tcp_store(parsed.hostname, parsed.port, rank, world_size, timeout), rank, world_size


def _file_handler(url, rank, world_size, timeout):
    parsed = urlparse(url)
    path = parsed.path or parsed.netloc
    if not path:
        raise _error(url, "the URL must name a file (file:///path/to/file)")
    query = parse_qs(parsed.query)
    rank = _query_int(query, "rank", rank, url)
    world_size = _query_int(query, "world_size", world_size, url)
    _check_rank(rank, world_size, url)
    store = _C.FileStore(path, world_size)
    store.set_timeout(timeout)
    return store, rank, world_size


register_rendezvous_handler("env", _env_handler)
register_rendezvous_handler("tcp", _tcp_handler)
register_rendezvous_handler("file", _file_handler)


def rendezvous(url: str, rank: int = -1, world_size: int = -1,
               timeout: timedelta = timedelta(minutes=30)) -> Tuple[object, int, int]:
    """Resolves `url` into (store, rank, world_size)."""
    if not isinstance(url, str):
        raise TypeError(f"init_method must be a str URL, got {type(url).__name__}")
    scheme = urlparse(url).scheme
    if scheme not in _handlers:
        raise _C._ArgumentValueError(f"No rendezvous handler for {scheme}:// (known: "
                                     f"{', '.join(sorted(_handlers))})")
    return _handlers[scheme](url, rank, world_size, timeout)


_log = logging.getLogger("c10d")


def store_based_barrier(store, rank: int, world_size: int, timeout: timedelta,
                        key: str = "c10d/rendezvous", progress_every: float = 10.0) -> None:
    """Waits until every rank has called this with the same `key`. Logs progress while
    waiting; at the deadline raises DistStoreTimeoutError naming the ranks that joined and
    the ranks that did not."""
    store.set(f"{key}/rank/{rank}", str(os.getpid()))
    keys = [f"{key}/rank/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.001, min(left, progress_every))))
            return
        except _C.DistStoreTimeoutError:
            pass
        joined = [r for r in range(world_size) if store.check([keys[r]])]
        missing = [r for r in range(world_size) if r not in joined]
        if time.monotonic() >= deadline:
            raise _C.DistStoreTimeoutError(
                f"Rendezvous timed out after {timeout.total_seconds():g}s on rank {rank}: "
                f"{len(joined)}/{world_size} ranks joined. Joined: {_ranges(joined)}; missing: "
                f"{_ranges(missing)}. Check that every rank started and uses the same "
                f"MASTER_ADDR/MASTER_PORT (or init_method) and WORLD_SIZE.")
        _log.warning("rank %d: waiting for ranks %s to join (%d/%d joined)", rank,
                     _ranges(missing), len(joined), world_size)


def _ranges(ranks) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start, prev = [], None, None
    for r in list(ranks) + [None]:
        if start is not None and (r is None or r != prev + 1):
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if r is not None and start is None:
            start = r
        prev = r
    return ", ".join(out) if out else "none"
