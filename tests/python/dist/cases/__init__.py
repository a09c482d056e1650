"""Multi-process test cases, one module per theme; dist.worker runs one on every rank by name
(getattr(cases, name)), so every case is imported here."""

from .collectives import (  # noqa: F401
    all_reduce,
    inline_all_reduce,
    inline_numpy_arrays,
    all_reduce_errors,
    broadcast_reduce,
    gathers,
    reduce_scatters,
    all_to_alls,
    strided_arrays,
    writes_beside_outputs,
    integer_overflow,
    aliased_outputs,
    small_beside_async,
    torch_profiler_events,
)
from .p2p import (  # noqa: F401
    point_to_point,
    inline_point_to_point,
    message_order,
    p2p_torch_conformance,
    barriers_and_async,
    barrier_after_async,
    queue_rules,
    destroy_after_send,
    large_messages,
    large_message_withdrawn,
    objects,
)
from .groups import (  # noqa: F401
    subgroups,
    reinit_on_one_store,
    new_group_rank_lists_differ,
    reinit_cycles,
    state_queries,
    device_mesh,
    backend_object_checks,
    pg_overloads,
)
from .interop import torch_interop, functional_collectives  # noqa: F401
from .failures import (  # noqa: F401
    recv_timeout,
    default_timeout_change,
    p2p_size_mismatch,
    p2p_dtype_mismatch,
    ring_disagreement,
    mismatched_calls,
    concurrent_threads,
    killed_rank_named,
    random_mismatches,
    destroy_with_pending,
    barrier_timeout_words,
    detail_missing_rank,
    monitored_barrier_reports,
    monitored_barrier_late_ranks,
    monitored_barrier_exits,
    desync_detail,
    dead_peer,
    trace_hang,
)
from .ddp import (  # noqa: F401
    ddp_waits_run_queued_reductions,
    ddp_reducer,
    ddp_unused_parameters,
    ddp_comm_hooks,
    ddp_startup,
    ddp_torch_params,
)
from .ddp_module import (  # noqa: F401
    ddp_unused_without_detection,
    ddp_torch_module,
    ddp_logging_and_ignored,
    ddp_sparse,
    ddp_join,
)
from .ddp_torch import ddp_torch_arguments, ddp_mixed_precision  # noqa: F401
from .mpi import (  # noqa: F401
    mpi_broken_group,
    mpi_rank_from_launcher,
    mpi_reductions_every_algorithm,
)
from .api_names import (  # noqa: F401
    coalescing_fuses_all_reduces,
    functional_autograd_matches_torch,
)
