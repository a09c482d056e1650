"""Communication hooks for data-parallel gradient reduction (see ``c10d.Reducer``)."""

from .default_hooks import allreduce_hook, fp16_compress_hook  # noqa: F401
