"""Every collective on real processes, for every backend and world sizes 1-4."""

import pytest

from dist import harness

BACKENDS = ["gloo", "shm", "hier"] + (["mpi"] if harness.mpi_available() else [])
CASES = [
    "all_reduce",
    "inline_all_reduce",
    "inline_numpy_arrays",
    "all_reduce_errors",
    "integer_overflow",
    "aliased_outputs",
    "small_beside_async",
    "broadcast_reduce",
    "gathers",
    "reduce_scatters",
    "all_to_alls",
    "point_to_point",
    "inline_point_to_point",
    "message_order",
    "barriers_and_async",
    "objects",
    "subgroups",
    "state_queries",
    "torch_interop",
    "functional_collectives",
    "device_mesh",
    "pg_overloads",
    "strided_arrays",
    "backend_object_checks",
]


# hier at 3 and 4 ranks: 2+1 and 2+2 ranks on two hosts (at 1 and 2 it is one shm or one Gloo
# group, which the other backends' runs cover).
WORLDS = [
    (backend, world_size)
    for backend in BACKENDS
    for world_size in [1, 2, 3, 4]
    if backend != "hier" or world_size >= 3
]


@pytest.mark.parametrize("backend,world_size", WORLDS)
@pytest.mark.parametrize("case", CASES)
def test_case(case, world_size, backend):
    harness.check_all_ok(harness.run(case, world_size, backend))


# The shared operation queue's rules (pg/op_queue.h) through the public API, on every backend;
# the C++ conformance suite checks them on gloo, shm and hier in rank threads.
@pytest.mark.parametrize(
    "backend,world_size", [(b, w) for b in BACKENDS for w in [2, 3] if b != "hier" or w == 3]
)
def test_queue_rules(backend, world_size):
    harness.check_all_ok(harness.run("queue_rules", world_size, backend))


# Gloo's send ends before the receiver has the bytes; shm and MPI sends of this size wait for it.
def test_destroy_after_send():
    harness.check_all_ok(harness.run("destroy_after_send", 2, "gloo"))


@pytest.mark.parametrize(
    "backend,world_size", [(b, w) for b in BACKENDS for w in [2, 3] if b != "hier" or w == 3]
)
def test_large_messages(backend, world_size):
    harness.check_all_ok(harness.run("large_messages", world_size, backend))


# shm reads a large message from the sender's buffer: a sender that gives up withdraws it.
@pytest.mark.parametrize("env", [{}, {"C10D_SHM_CMA": "0"}], ids=["read", "channel"])
def test_large_message_withdrawn(env):
    harness.check_all_ok(harness.run("large_message_withdrawn", 2, "shm", env=env))


# The Gloo backend runs all_reduce and reduce_scatter on c10d's ring unless told otherwise;
# Gloo's own algorithms stay a supported choice.
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", ["all_reduce", "all_reduce_errors", "reduce_scatters"])
def test_gloo_without_the_ring(case, world_size):
    harness.check_all_ok(harness.run(case, world_size, "gloo", env={"C10D_GLOO_RING": "0"}))


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_ranks_disagreeing_on_a_ring_collective_fail_naming_the_other(world_size):
    results = harness.run("ring_disagreement", world_size, "gloo")
    harness.check_all_ok(results)
    assert all("RING_DISAGREEMENT_OK" in r.stdout for r in results), results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_change_only_their_outputs(backend, world_size):
    # Another thread writes the rest of the arrays whose slices are the outputs.
    harness.check_all_ok(harness.run("writes_beside_outputs", world_size, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_barrier_waits_for_earlier_async_work(backend):
    harness.check_all_ok(harness.run("barrier_after_async", 3, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_groups_rebuilt_on_one_store(backend, tmp_path):
    harness.check_all_ok(
        harness.run(
            "reinit_on_one_store",
            3,
            backend,
            init=False,
            env={"C10D_TEST_STORE_FILE": str(tmp_path / "store")},
        )
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_without_sender_times_out(backend):
    results = harness.run("recv_timeout", 2, backend, env={"C10D_TEST_PG_TIMEOUT": "3"})
    harness.check_all_ok(results)
    assert "RECV_TIMEOUT_OK" in results[1].stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shortened_default_timeout_applies_to_the_next_operation(backend):
    results = harness.run("default_timeout_change", 2, backend, env={"C10D_TEST_PG_TIMEOUT": "30"})
    harness.check_all_ok(results)
    assert "DEFAULT_TIMEOUT_OK" in results[0].stdout, results[0].stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_destroy_lets_submitted_work_finish(backend):
    harness.check_all_ok(harness.run("destroy_with_pending", 3, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_barrier_timeout_says_timed_out(backend):
    results = harness.run("barrier_timeout_words", 3, backend, env={"C10D_TEST_PG_TIMEOUT": "2"})
    harness.check_all_ok(results)
    for r in results[:2]:
        assert "BARRIER_TIMEOUT_OK" in r.stdout, r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_size_mismatch_raises(backend):
    results = harness.run("p2p_size_mismatch", 2, backend, env={"C10D_TEST_PG_TIMEOUT": "3"})
    harness.check_all_ok(results)
    for r in results:
        assert "MISMATCH_OK" in r.stdout, r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_monitored_barrier_names_missing_rank(backend):
    results = harness.run("monitored_barrier_reports", 3, backend)
    harness.check_all_ok(results)
    assert "MONITORED_OK" in results[0].stdout


@pytest.mark.parametrize("backend", ["gloo", "shm"])  # under mpirun an exit ends the job
def test_monitored_barrier_waits_for_rank_0_and_fails_late_ranks(backend):
    results = harness.run("monitored_barrier_late_ranks", 2, backend, timeout=60)
    for r in results:
        assert r.code == 0 and "MONITORED_LATE_OK" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.parametrize("backend", ["gloo", "shm"])  # under mpirun an exit ends the job
def test_monitored_barrier_names_every_exited_rank(backend):
    results = harness.run("monitored_barrier_exits", 4, backend, timeout=60)
    for r in (results[0], results[2]):
        assert r.code == 0 and "MONITORED_EXITS_OK" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_rank_named_at_detail(backend):
    results = harness.run(
        "detail_missing_rank",
        3,
        backend,
        env={"C10D_TEST_PG_TIMEOUT": "2", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    )
    harness.check_all_ok(results)
    for r in results[:2]:
        assert "DETAIL_MISSING_OK" in r.stdout, r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_desync_detected_at_detail(backend):
    results = harness.run("desync_detail", 2, backend, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    harness.check_all_ok(results)
    for r in results:
        assert "DESYNC_OK" in r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_torch_conformance(backend):
    harness.check_all_ok(harness.run("p2p_torch_conformance", 3, backend))
