"""Run a c10d TCPStore server until SIGINT or SIGTERM.

    python -m c10d.store_server --host 0.0.0.0 --port 29500 [--world-size N]

Prints ``port=<P>`` once the server accepts connections (useful with ``--port 0``). With
``--world-size`` the server counts as one of the N members and waits (up to ``--timeout``)
for the other N-1 to register before printing.
"""

import argparse
import signal
import sys
import threading
from datetime import timedelta

from . import _C


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c10d.store_server", description="Serve a TCPStore until interrupted."
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="host name clients use; the server listens on every interface",
    )
    parser.add_argument("--port", type=int, default=29500, help="0 picks a free port")
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="wait for this many members (the server included) to join",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for members and for each store operation",
    )
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    store = _C.TCPStore(
        args.host,
        args.port,
        world_size=args.world_size,
        is_master=True,
        timeout=timedelta(seconds=args.timeout),
        wait_for_workers=args.world_size is not None,
    )
    print(f"port={store.port}", flush=True)
    while not stop.wait(0.5):
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
