"""Failures become prompt, named errors: missing ranks at init, dead peers, dead store."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import hypothesis
import pytest
from hypothesis import strategies

import c10d
from dist import harness
from dist.cases import failures

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_init_names_missing_ranks():
    # World size 3, but only ranks 0 and 1 start.
    port = harness.free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="3",
            PYTHONPATH=os.path.join(REPO, "python"),
        )
        code = (
            "import c10d, datetime\n"
            "try:\n"
            "    c10d.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
            "except c10d.DistError as e:\n"
            "    print('INIT_FAILED', e)\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    start = time.monotonic()
    outs = [p.communicate(timeout=60) for p in procs]
    assert time.monotonic() - start < 30
    for out, err in outs:
        assert "INIT_FAILED" in out, err
    # Rank 0 hosts the store and reports who is missing; rank 1, whose store goes away when
    # rank 0 gives up at the same moment, reports what it last saw.
    assert "2/3 ranks joined" in outs[0][0] and "missing: 2" in outs[0][0], outs[0][0]
    assert "missing: 2" in outs[1][0] and "Joined: 0-1" in outs[1][0], outs[1][0]


def test_rank_whose_store_host_gave_up_names_who_joined():
    # Rank 0 (the store's host) gives up after 3 s; rank 1 would wait 60 s: it learns at once
    # that the store went away, and says who had joined.
    port = harness.free_port()
    procs = []
    for rank, seconds in ((0, 3), (1, 60)):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="3",
            PYTHONPATH=os.path.join(REPO, "python"),
        )
        code = (
            "import c10d, datetime\n"
            "try:\n"
            f"    c10d.init_process_group('gloo', timeout=datetime.timedelta(seconds={seconds}))\n"
            "except c10d.DistError as e:\n"
            "    print('INIT_FAILED', type(e).__name__, e)\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        time.sleep(0.3 if rank == 0 else 0)
    start = time.monotonic()
    outs = [p.communicate(timeout=90) for p in procs]
    assert time.monotonic() - start < 30
    out = outs[1][0]
    assert "INIT_FAILED DistStoreError" in out and "went away" in out, (out, outs[1][1])
    assert "Joined: 0-1; missing: 2" in out, out


def test_wrong_address_fails_within_timeout():
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(harness.free_port()),
        RANK="1",
        WORLD_SIZE="2",
        PYTHONPATH=os.path.join(REPO, "python"),
    )
    code = (
        "import c10d, datetime\n"
        "try:\n"
        "    c10d.init_process_group('gloo', timeout=datetime.timedelta(seconds=2))\n"
        "except c10d.DistError as e:\n"
        "    print('CONNECT_FAILED', e)\n"
    )
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - start < 20
    assert "CONNECT_FAILED" in out.stdout, out.stderr
    assert "127.0.0.1" in out.stdout


def test_dead_peer_is_named():
    results = harness.run("dead_peer", 2, "gloo", env={"C10D_TEST_PG_TIMEOUT": "20"}, timeout=60)
    assert results[1].code == 17  # the victim's own exit
    assert results[0].code == 0, results[0].stderr
    assert "DEAD_PEER_OK" in results[0].stdout
    assert "rank 1" in results[0].stdout


def test_dead_store_server_fails_fast():
    port = harness.free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    server = subprocess.Popen(
        [sys.executable, "-m", "c10d.store_server", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        client = c10d.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=30))
        client.set("k", "v")
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        start = time.monotonic()
        with pytest.raises(c10d.DistError, match="127.0.0.1"):
            client.get("k2")
        assert time.monotonic() - start < 5
    finally:
        if server.poll() is None:
            server.kill()


MISMATCH_RUNS = [("gloo", 2), ("gloo", 3), ("shm", 2), ("shm", 3), ("hier", 3)] + (
    [("mpi", 2), ("mpi", 3)] if harness.mpi_available() else []
)


@pytest.mark.parametrize("backend,world_size", MISMATCH_RUNS)
def test_mismatched_calls_raise_on_every_rank(backend, world_size):
    results = harness.run("mismatched_calls", world_size, backend, timeout=240)
    harness.check_all_ok(results)
    assert all("MISMATCHES_OK" in r.stdout for r in results), results


@pytest.mark.parametrize("backend,world_size", MISMATCH_RUNS)
def test_collectives_from_several_threads_are_exact_or_raise(backend, world_size):
    harness.check_all_ok(harness.run("concurrent_threads", world_size, backend, timeout=240))


@pytest.mark.parametrize(
    "backend", ["gloo", "shm", "hier"] + (["mpi"] if harness.mpi_available() else [])
)
def test_new_group_rank_lists_that_differ_fail_on_every_rank(backend):
    harness.check_all_ok(harness.run("new_group_rank_lists_differ", 3, backend, timeout=120))


@pytest.mark.parametrize("backend", ["gloo", "shm", "hier"])
def test_destroy_and_init_again_with_one_environment_100_times(backend):
    harness.check_all_ok(harness.run("reinit_cycles", 3, backend, timeout=300))


@pytest.mark.parametrize("backend,world_size", [("gloo", 3), ("hier", 3), ("shm", 3)])
def test_survivors_name_the_killed_rank(backend, world_size):
    results = harness.run(
        "killed_rank_named", world_size, backend, env={"C10D_TEST_PG_TIMEOUT": "20"}, timeout=90
    )
    assert results[-1].code == -9, results[-1]
    for r in results[:-1]:
        assert r.code == 0 and "KILLED_RANK_NAMED" in r.stdout, (r.stdout, r.stderr[-3000:])


@pytest.mark.parametrize("backend,world_size", MISMATCH_RUNS)
@hypothesis.settings(max_examples=2, deadline=None, database=None)
@hypothesis.given(rng=strategies.randoms(use_true_random=False))
def test_random_mismatches_raise_on_every_rank(backend, world_size, rng):
    # Hypothesis draws the examples (one rank's call differs from the others' in kind, dtype,
    # count, reduction or root, after a few matching calls); each launch runs four.
    scenarios = [failures.mismatch_scenario(rng, world_size) for _ in range(4)]
    results = harness.run(
        "random_mismatches",
        world_size,
        backend,
        env={"C10D_TEST_SCENARIOS": json.dumps(scenarios)},
        timeout=400,
    )
    harness.check_all_ok(results)
    assert all("RANDOM_MISMATCHES_OK" in r.stdout for r in results), (scenarios, results)


def test_hier_rank_alone_on_its_host_naming_another_root_there_raises():
    # 3 ranks on hier: ranks 0 and 1 share a host, rank 2 is alone on its own. Rank 2 names
    # root 0 where the others name root 1 (both on the first host): the step between hosts sees
    # the same root host either way, and no host step compares rank 2's call with anyone's.
    scenarios = []
    for kind in ("reduce", "broadcast"):
        call = {"kind": kind, "dtype": "int32", "n": 5, "op": "MAX", "root": 1}
        changed = dict(call, root=0)
        scenarios.append(
            {"prefix": [], "call": call, "deviant": 2, "changed": changed, "what": "root"}
        )
    results = harness.run(
        "random_mismatches",
        3,
        "hier",
        env={"C10D_TEST_SCENARIOS": json.dumps(scenarios)},
        timeout=120,
    )
    harness.check_all_ok(results)
    assert all("RANDOM_MISMATCHES_OK" in r.stdout for r in results), results


def test_shm_send_and_recv_of_different_dtypes_fail():
    results = harness.run("p2p_dtype_mismatch", 2, "shm", timeout=60)
    harness.check_all_ok(results)
    assert "P2P_DTYPE_OK" in results[1].stdout, results[1]
