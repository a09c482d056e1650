"""The generic join context manager (as ``torch.distributed.algorithms.join``): training with
uneven inputs across ranks. A rank that runs out of inputs leaves the ``with Join(...)`` body
early and then, until every rank has left it, runs its joinables' main hooks, which issue the
collectives the ranks still training expect from it (zeros for a gradient allreduce, say).
Then every rank runs the post hooks.

Each iteration, a rank still training calls ``Join.notify_join_context(joinable)`` before its
own collectives: its allreduce of 1 meets the joined ranks' allreduce of 0, so the sum is the
number of ranks still training.
"""

from typing import Any, List, NamedTuple, Optional

import numpy as np

from .. import distributed_c10d as _dist

__all__ = ["JoinHook", "Joinable", "Join"]


class JoinHook:
    """What a joinable does for the ranks still training: ``main_hook`` once per iteration
    they run, ``post_hook(is_last_joiner)`` once when every rank has joined."""

    def main_hook(self) -> None:
        pass

    def post_hook(self, is_last_joiner: bool) -> None:
        pass


class _JoinConfig(NamedTuple):
    enable: bool
    throw_on_early_termination: bool
    is_first_joinable: bool

    @staticmethod
    def construct_disabled_join_config() -> "_JoinConfig":
        return _JoinConfig(enable=False, throw_on_early_termination=False, is_first_joinable=False)


class Joinable:
    """Something that takes part in a join: it gives a JoinHook, its process group and
    device, and calls ``Join.notify_join_context(self)`` every iteration."""

    def __init__(self):
        self._join_config = _JoinConfig.construct_disabled_join_config()

    def join_hook(self, **kwargs) -> JoinHook:
        raise NotImplementedError(f"{type(self).__name__} must implement join_hook")

    @property
    def join_device(self) -> Any:
        return "cpu"

    @property
    def join_process_group(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement join_process_group")


def _is_joinable(obj) -> bool:
    """c10d's Joinables, and anything else with their interface (torch's Joinables: its
    ZeroRedundancyOptimizer and DistributedDataParallel), whose notify_join_context reads the
    same _join_config fields."""
    if isinstance(obj, Joinable):
        return True
    kind = type(obj)
    return callable(getattr(obj, "join_hook", None)) and all(
        hasattr(kind, name) for name in ("join_device", "join_process_group")
    )


def _counter(value: float) -> np.ndarray:
    return np.full(1, value, np.float32)


class Join:
    """``with Join([model, optimizer, ...]):`` around a training loop whose ranks may run
    different numbers of iterations. All joinables must share one process group; ``kwargs``
    go to their ``join_hook``. With ``throw_on_early_termination`` the first rank to run
    out of inputs makes every rank raise instead."""

    def __init__(
        self,
        joinables: List[Joinable],
        enable: bool = True,
        throw_on_early_termination: bool = False,
        **kwargs,
    ):
        if len(joinables) == 0:
            raise _dist._DistValueError("The join context manager requires at least one joinable")
        for j in joinables:
            if not _is_joinable(j):
                raise _dist._DistTypeError(f"Join: {type(j).__name__} is not a Joinable")
        self._joinables = list(joinables)
        self._join_hooks = [j.join_hook(**kwargs) for j in self._joinables]
        self._enable = enable
        self._throw_on_early_termination = throw_on_early_termination
        for i, j in enumerate(self._joinables):
            j._join_config = _JoinConfig(
                enable=enable,
                throw_on_early_termination=throw_on_early_termination,
                is_first_joinable=i == 0,
            )
        # torch's joinables (ZeroRedundancyOptimizer) name torch's view of a c10d group.
        groups = {}
        for j in self._joinables:
            group = _dist._c10d_group(j.join_process_group)
            groups[id(group)] = group
        if len(groups) > 1:
            raise _dist._DistValueError(
                "Using join context manager with multiple process groups is not supported"
            )
        self._process_group = next(iter(groups.values()))
        self._rank = _dist.get_rank(self._process_group)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        # An exception in the body propagates as it is; a disabled join does nothing.
        if not self._enable or exc_type is not None:
            return False
        is_last_joiner = True
        while True:
            still_training = _counter(0)
            _dist.all_reduce(still_training, group=self._process_group)
            if still_training[0] == 0:
                break
            if self._throw_on_early_termination:
                _dist.all_reduce(_counter(1), group=self._process_group)
                raise RuntimeError(f"Rank {self._rank} exhausted all inputs.")
            for hook in self._join_hooks:
                hook.main_hook()
            is_last_joiner = False
        for hook in self._join_hooks:
            hook.post_hook(is_last_joiner)
        return False

    @staticmethod
    def notify_join_context(joinable: Joinable) -> Optional[Any]:
        """Called by a joinable every iteration before its collectives: tells the joined
        ranks this one still trains. Returns the asynchronous allreduce's Work (its result:
        how many ranks still train) for the first joinable, else None."""
        config = getattr(joinable, "_join_config", None)
        if config is None:
            raise _dist._DistValueError(
                f"{type(joinable).__name__}: call Joinable.__init__ in its constructor"
            )
        if not config.enable or not config.is_first_joinable:
            return None
        group = joinable.join_process_group
        work = _dist.all_reduce(_counter(1), group=group, async_op=True)
        if config.throw_on_early_termination:
            should_throw = _counter(0)
            _dist.all_reduce(should_throw, group=group)
            if should_throw[0] > 0:
                raise RuntimeError(
                    "Detected at least one rank that exhausted inputs. Throwing across all ranks."
                )
        return work
