"""Algorithms built on the collectives (as ``torch.distributed.algorithms``)."""
