"""Combining futures, as ``torch.futures`` does: ``collect_all`` and ``wait_all`` over
``c10d.Future`` objects (the futures of asynchronous collectives, or ones made by hand)."""

import threading
from typing import List

from ._C import Future

__all__ = ["Future", "collect_all", "wait_all"]


def collect_all(futures: List[Future]) -> Future:
    """A future completed, with the list of `futures`, once every one of them is done (failed
    ones included: their errors stay in them)."""
    futures = list(futures)
    combined = Future()
    if not futures:
        combined.set_result([])
        return combined
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            combined.set_result(futures)

    for fut in futures:
        fut.add_done_callback(one_done)
    return combined


def wait_all(futures: List[Future]) -> list:
    """The values of `futures`, in order, once all are done; raises the first error found."""
    return [fut.wait() for fut in collect_all(futures).wait()]
