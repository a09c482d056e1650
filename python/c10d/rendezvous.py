"""Rendezvous: turn an init_method URL (env://, tcp://, file://) into a store, rank and size."""

import logging
import numbers
import os
import sys
import time
from datetime import timedelta
from typing import Iterator
from urllib.parse import parse_qs, urlparse, urlunparse

from . import _C

__all__ = ["rendezvous", "register_rendezvous_handler", "store_based_barrier"]

_handlers = {}
_DEFAULT_TIMEOUT = _C._DEFAULT_PG_TIMEOUT  # init_process_group's default


def register_rendezvous_handler(scheme, handler):
    """Adds a handler for URLs of `scheme`, as torch.distributed's: handler(url, **kwargs)
    returns an iterator of (store, rank, world_size); rendezvous() has put rank and world_size
    into the URL's query, and passes `timeout` among the keyword arguments."""
    if scheme in _handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _handlers[scheme] = handler


def _error(init_method: str, message: str) -> ValueError:
    # A ValueError, as torch's rendezvous raises for a bad URL or environment, that is also a
    # RuntimeError, as torch's backends raise for a rank outside the world.
    return _C.DistValueError(f"Error initializing c10d using {init_method} rendezvous: {message}")


def _query_int(query, name, url):
    values = query.get(name)
    if not values:
        raise _error(url, f"{name} parameter missing (pass it in the URL or as an argument)")
    try:
        return int(values[0])
    except ValueError:
        raise _error(url, f"{name} must be an integer, got {values[0]!r}") from None


def _env_int(name: str, query, url: str) -> int:
    if query.get(name.lower()):
        return _query_int(query, name.lower(), url)
    value = os.environ.get(name)
    if value is None or value == "":
        raise _error(url, f"environment variable {name} expected, but not set")
    try:
        return int(value)
    except ValueError:
        raise _error(
            url, f"environment variable {name} must be an integer, got {value!r}"
        ) from None


def _torch_server_port(host: str, port: int, world_size: int, timeout, use_libuv: bool):
    """The port of torch's multi-tenant rendezvous server on `port` in this process, when the
    program loaded torch and torch runs one there (torch.distributed's init_process_group and
    rpc.init_rpc share one on MASTER_PORT); else None."""
    tdist = sys.modules.get("torch.distributed")
    if tdist is None or not tdist.is_available():
        return None
    try:
        # A multi-tenant master on a port torch already serves is that server, not a new one.
        server = tdist.TCPStore(
            host,
            port,
            world_size,
            True,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            use_libuv=use_libuv,
        )
    except Exception:  # the port is somebody else's
        return None
    _torch_servers.append(server)
    return server.port


_torch_servers = []  # torch's servers reached through _torch_server_port, kept alive


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta, query):
    # Rank 0 hosts the server. Nobody waits inside the constructor: init_process_group's
    # rendezvous barrier waits instead, and can say which ranks are missing. use_libuv comes
    # from the URL or USE_LIBUV, as in torch.
    use_libuv = (query.get("use_libuv") or [os.environ.get("USE_LIBUV", "1")])[0] != "0"
    try:
        return _C.TCPStore(
            host,
            port,
            world_size,
            rank == 0,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            use_libuv=use_libuv,
        )
    except _C.DistNetworkError as e:
        # The port is taken: if by torch's server in this process, c10d's clients share it as
        # torch's own users do (the server c10d starts stays its own, with its bounds on what
        # a client may make it hold).
        if rank != 0 or "EADDRINUSE" not in str(e):  # the server names the errno
            raise
        shared = _torch_server_port(host, port, world_size, timeout, use_libuv)
        if shared is None:
            raise
        return _C.TCPStore(
            host, shared, world_size, False, timeout, wait_for_workers=False, use_libuv=use_libuv
        )


def _check_rank(rank: int, world_size: int, url: str):
    if world_size <= 0:
        raise _error(url, f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise _error(url, f"rank {rank} is outside [0, {world_size})")


def _once(url: str, result):
    """The iterator a handler returns: its one result, then an error, since a store cannot
    be rendezvoused with again (torch's handlers behave alike)."""
    yield result
    raise RuntimeError(f"Unable to perform re-rendezvous using {url.split('?')[0]}")


def _env_handler(url, timeout=_DEFAULT_TIMEOUT, **_):
    query = parse_qs(urlparse(url).query)
    rank = _env_int("RANK", query, url)
    world_size = _env_int("WORLD_SIZE", query, url)
    _check_rank(rank, world_size, url)
    host = os.environ.get("MASTER_ADDR")
    if not host:
        raise _error(url, "environment variable MASTER_ADDR expected, but not set")
    port = _env_int("MASTER_PORT", {}, url)
    return _once(url, (_tcp_store(host, port, rank, world_size, timeout, query), rank, world_size))


def _tcp_handler(url, timeout=_DEFAULT_TIMEOUT, **_):
    parsed = urlparse(url)
    if not parsed.hostname:
        raise _error(url, "host missing (tcp://host:port)")
    if parsed.port is None:
        raise _error(url, "port number missing (tcp://host:port)")
    query = parse_qs(parsed.query)
    rank = _query_int(query, "rank", url)
    world_size = _query_int(query, "world_size", url)
    _check_rank(rank, world_size, url)
    store = _tcp_store(parsed.hostname, parsed.port, rank, world_size, timeout, query)
    return _once(url, (store, rank, world_size))


def _file_handler(url, timeout=_DEFAULT_TIMEOUT, **_):
    parsed = urlparse(url)
    path = parsed.path or parsed.netloc
    if not path:
        raise _error(url, "path missing (file:///path/to/file)")
    query = parse_qs(parsed.query)
    rank = _query_int(query, "rank", url)
    world_size = _query_int(query, "world_size", url)
    _check_rank(rank, world_size, url)
    store = _C.FileStore(path, world_size)
    store.set_timeout(timeout)
    return _once(url, (store, rank, world_size))


register_rendezvous_handler("env", _env_handler)
register_rendezvous_handler("tcp", _tcp_handler)
register_rendezvous_handler("file", _file_handler)


def rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs) -> Iterator:
    """Resolves `url` into an iterator of (store, rank, world_size), as torch's does: a rank
    and world size given here join the URL's query (which must not hold them already), and
    the scheme's handler gets the URL and `kwargs` (`timeout`)."""
    if not isinstance(url, str):
        # A TypeError that is also a RuntimeError, which torch raises here.
        raise _C.DistTypeError(f"init_method must be a str URL, got {type(url).__name__}")
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise _C.DistTypeError(f"`{name}` must be an integer, got {value!r}")
    parsed = urlparse(url)
    if rank != -1 or world_size != -1:
        query = parse_qs(parsed.query)
        assert "rank" not in query and "world_size" not in query, (
            f"The url: {url} has node-specific arguments(rank, world_size) already."
        )
        extra = [f"{k}={v}" for k, v in (("rank", rank), ("world_size", world_size)) if v != -1]
        url = urlunparse(parsed._replace(query="&".join(filter(None, [parsed.query] + extra))))
    if parsed.scheme not in _handlers:
        raise _C.DistValueError(
            f"No rendezvous handler for {parsed.scheme}:// (known: {', '.join(sorted(_handlers))})"
        )
    result = _handlers[parsed.scheme](url, **kwargs)
    # A handler may also return the tuple itself rather than an iterator of it.
    return iter([result]) if isinstance(result, tuple) else result


_log = logging.getLogger("c10d")


def store_based_barrier(
    store,
    rank: int,
    world_size: int,
    timeout: timedelta,
    key: str = "c10d/rendezvous",
    progress_every: float = 10.0,
) -> None:
    """Waits until every rank has called this with the same `key`. Logs progress while
    waiting; at the deadline raises DistStoreTimeoutError naming the ranks that joined and
    the ranks that did not."""
    store.set(f"{key}/rank/{rank}", str(os.getpid()))
    keys = [f"{key}/rank/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout.total_seconds()
    seen = None  # (when, joined): the last look, for an error if the store goes away

    def look():
        nonlocal seen
        seen = (time.monotonic(), [r for r in range(world_size) if store.check([keys[r]])])
        return seen[1]

    # The first look (one check per rank) comes after a second, which most rendezvous never
    # reach; later ones with each progress report.
    first = True
    try:
        while True:
            left = deadline - time.monotonic()
            wait = FIRST_LOOK_S if first else progress_every
            try:
                store.wait(keys, timedelta(seconds=max(0.001, min(left, wait))))
                return
            except _C.DistStoreTimeoutError:
                pass
            joined = look()
            if not first or time.monotonic() >= deadline:
                _rendezvous_progress(joined, rank, world_size, timeout, deadline)
            first = False
    except _C.DistStoreTimeoutError:
        raise
    except (_C.DistNetworkError, _C.DistStoreError) as e:
        # The store's host gave up (its own rendezvous timed out at the same moment, or it
        # died): say what this rank last saw.
        if seen is None:
            last = "before this rank looked who had joined"
        else:
            joined = seen[1]
            missing = [r for r in range(world_size) if r not in joined]
            last = (
                f"Last seen {time.monotonic() - seen[0]:.0f}s before: {len(joined)}/"
                f"{world_size} ranks joined. Joined: {_ranges(joined)}; missing: "
                f"{_ranges(missing)}."
            )
        raise _C.DistStoreError(
            f"Rendezvous failed on rank {rank}: the store ({store_description(store)}) went "
            f"away while waiting for every rank to join ({e}). {last}"
        ) from e


FIRST_LOOK_S = 1.0


def store_description(store) -> str:
    """ "TCPStore at host:port" when the store (or the store it prefixes) is one, else its type."""
    inner = store
    for _ in range(8):
        nested = getattr(inner, "underlying_store", None)
        if nested is None:
            break
        inner = nested() if callable(nested) else nested
    host, port = getattr(inner, "host", None), getattr(inner, "port", None)
    if host is not None and port is not None:
        return f"TCPStore at {host}:{port}"
    return type(store).__name__


def _rendezvous_progress(joined, rank, world_size, timeout, deadline):
    """Raises at the deadline naming who joined and who did not; logs progress before."""
    missing = [r for r in range(world_size) if r not in joined]
    if time.monotonic() >= deadline:
        raise _C.DistStoreTimeoutError(
            f"Rendezvous timed out after {timeout.total_seconds():g}s on rank {rank}: "
            f"{len(joined)}/{world_size} ranks joined. Joined: {_ranges(joined)}; missing: "
            f"{_ranges(missing)}. Check that every rank started and uses the same "
            f"MASTER_ADDR/MASTER_PORT (or init_method) and WORLD_SIZE."
        )
    _log.warning(
        "rank %d: waiting for ranks %s to join (%d/%d joined)",
        rank,
        _ranges(missing),
        len(joined),
        world_size,
    )


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
