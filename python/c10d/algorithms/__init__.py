"""Algorithms built on the collectives (as ``torch.distributed.algorithms``)."""

from .join import Join, Joinable, JoinHook  # noqa: F401
