"""What the data-parallel cases (ddp, ddp_module) share: torch, or the SKIP line without it."""


def _torch_or_skip():
    """torch, or None after printing the harness's SKIP line when it is not installed."""
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return None
    return torch
