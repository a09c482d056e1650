"""Several hosts on one machine (netns.Hosts: network namespaces, own hostnames, Debian's
/etc/hosts mapping each name to 127.0.1.1): launchers that meet through a dynamic
rendezvous, Gloo across hosts without GLOO_SOCKET_IFNAME, network faults, and MPI ranks that
mpirun starts on both hosts."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import netns
from dist import harness

reason = netns.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"test hosts: {reason}")

WORKER = os.path.join(harness.HERE, "multihost_worker.py")
PORT = 29400  # inside namespaces made for the test: nothing else listens there


def launch(hosts, backend, seconds=0.0, timeout=60.0, nproc=(2, 2)):
    """c10d.run on every host (nproc[i] ranks on host i): --nnodes len(hosts) with a c10d
    rendezvous at host 0."""
    env = harness.package_env()
    env.pop("GLOO_SOCKET_IFNAME", None)
    procs = []
    for i in range(hosts.count):
        argv = hosts.launcher_argv(nproc[i], PORT) + [
            WORKER,
            backend,
            str(seconds),
            str(timeout),
        ]
        procs.append(
            hosts.popen(
                i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return procs


def outputs(procs, timeout, already=None):
    """Each launcher's whole output (after `already`, what wait_for_lines read)."""
    results = harness.collect(procs, timeout)
    return [(already[i] if already else "") + r.stdout + r.stderr for i, r in enumerate(results)]


def wait_for_lines(procs, pattern, count, timeout):
    """Reads the launchers' output until `count` lines match `pattern` (then returns what was
    read, per launcher), failing after `timeout` seconds."""
    import selectors

    seen = [""] * len(procs)
    sel = selectors.DefaultSelector()
    for i, p in enumerate(procs):
        # From the descriptor itself: nothing is read through the text wrapper before
        # outputs() does, so none of it is left in a buffer there.
        sel.register(p.stdout.fileno(), selectors.EVENT_READ, i)
    deadline = time.monotonic() + timeout
    try:
        while sum(len(re.findall(pattern, s)) for s in seen) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {count} lines matching {pattern!r} in {timeout}s: {seen}"
            for key, _ in sel.select(timeout=min(left, 1.0)):
                seen[key.data] += os.read(key.fd, 1 << 16).decode(errors="replace")
    finally:
        sel.close()
    return seen


def test_gloo_across_two_hosts_finds_the_route_without_gloo_socket_ifname():
    # Each hostname resolves to 127.0.1.1: listening there, the ranks of the other host could
    # not connect. Links at 1 Gbit/s (tbf).
    with netns.Hosts(2, rate="1gbit") as hosts:
        outs = outputs(launch(hosts, "gloo"), timeout=120)
    for i, out in enumerate(outs):
        ranks = sorted(int(r) for r in re.findall(rf"testhost{i} rank (\d) of 4: ok", out))
        assert ranks == [2 * i, 2 * i + 1], out


@pytest.mark.parametrize("backend,nproc", [("hier", (2, 2)), ("default", (2, 2)), ("hier", (2, 1))])
def test_hierarchical_backend_across_hosts(backend, nproc):
    # With no backend named, c10d picks hier when the ranks span hosts. Hosts with as many
    # ranks each split the network part among their ranks; (2, 1) takes the other path.
    world = sum(nproc)
    with netns.Hosts(2, rate="1gbit") as hosts:
        outs = outputs(launch(hosts, backend, nproc=nproc), timeout=180)
    first = 0
    for i, out in enumerate(outs):
        ranks = sorted(
            int(r)
            for r in re.findall(
                rf"testhost{i} rank (\d) of {world}: ok \(hier, ProcessGroupHier\)", out
            )
        )
        assert ranks == list(range(first, first + nproc[i])), out
        first += nproc[i]


def test_shm_across_hosts_says_it_connects_one_host_only():
    with netns.Hosts(2) as hosts:
        procs = launch(hosts, "shm")
        outs = outputs(procs, timeout=120)
    assert all(p.returncode != 0 for p in procs), outs
    assert "connects ranks of one host only" in outs[0], outs[0]


@pytest.mark.parametrize("backend", ["gloo", "hier"])
def test_killed_host_is_named_by_the_survivors_and_the_launchers_stop(backend):
    with netns.Hosts(2) as hosts:
        procs = launch(hosts, backend, seconds=120, timeout=30)
        seen = wait_for_lines(procs, r"rank \d of 4: ok", 4, timeout=180)
        hosts.kill_host(1)
        outs = outputs(procs[:1], timeout=60, already=seen[:1])
    out = outs[0]
    assert procs[0].returncode not in (0, None), out
    # Every survivor fails; the first to notice names a rank of the killed host and its
    # address (the other may instead see that survivor leave first).
    lines = [re.search(rf"testhost0 rank {rank}: (\w+): (.*)", out) for rank in (0, 1)]
    assert all(lines), out
    assert any(
        re.search(r"\brank [23]\b", m.group(2)) and hosts.addresses[1] in m.group(2) for m in lines
    ), out


def test_losing_the_host_that_serves_the_store_fails_the_others_without_a_hang():
    with netns.Hosts(2) as hosts:
        procs = launch(hosts, "gloo", seconds=120, timeout=30)
        seen = wait_for_lines(procs, r"rank \d of 4: ok", 4, timeout=180)
        hosts.kill_host(0)  # rank 0's store, the rendezvous store and ranks 0-1
        start = time.monotonic()
        outs = outputs(procs[1:], timeout=90, already=seen[1:])
        took = time.monotonic() - start
    out = outs[0]
    assert procs[1].returncode not in (0, None), out
    assert took < 30 + 20, took
    # Every survivor fails; the first to notice names the lost host or one of its ranks (the
    # other may instead see that survivor leave first).
    lines = [re.search(rf"testhost1 rank {rank}: (\w+): (.*)", out) for rank in (2, 3)]
    assert all(lines), out
    assert any(
        hosts.addresses[0] in m.group(2) or re.search(r"\brank [01]\b", m.group(2)) for m in lines
    ), out


# What a rank's timeout says about the far host's ranks 2, 3 (seen from host 0) or 0, 1: Gloo
# probes every peer's host; hier names the ranks its step between hosts waited for.
UNREACHABLE = {
    "gloo": lambda ranks, host: f"unreachable: ranks {', '.join(map(str, ranks))} on host {host}",
    "hier": lambda ranks, host: rf"rank [{''.join(map(str, ranks))}] on host {host}\b",
}


@pytest.mark.parametrize("backend", ["gloo", "hier"])
def test_link_down_fails_every_rank_within_the_timeout_naming_the_far_host(backend):
    with netns.Hosts(2) as hosts:
        procs = launch(hosts, backend, seconds=120, timeout=8)
        seen = wait_for_lines(procs, r"rank \d of 4: ok", 4, timeout=180)
        hosts.link(1, up=False)
        start = time.monotonic()
        outs = outputs(procs, timeout=60, already=seen)
        took = time.monotonic() - start
        # Once the link is back, a new job (new launchers, store and groups) runs across it.
        hosts.link(1, up=True)
        again = launch(hosts, backend)
        again_outs = outputs(again, timeout=120)
    assert all(p.returncode == 0 for p in again), again_outs
    assert took < 8 + 20, took  # the group's timeout, a second of diagnosis, the launchers
    for i, out in enumerate(outs):
        assert procs[i].returncode not in (0, None), out
        far = hosts.addresses[1 - i]
        far_ranks = [2, 3] if i == 0 else [0, 1]
        for rank in (2 * i, 2 * i + 1):
            line = re.search(rf"testhost{i} rank {rank}: DistTimeoutError: (.*)", out)
            assert line, out
            assert re.search(UNREACHABLE[backend](far_ranks, far), line.group(1)), line.group(0)


def eth0_bytes(hosts, i):
    """(received, sent) bytes on host i's eth0."""
    stats = netns._ip("-n", hosts.names[i], "-s", "-j", "link", "show", "eth0").stdout
    s = json.loads(stats)[0]["stats64"]
    return s["rx"]["bytes"], s["tx"]["bytes"]


def test_mpi_across_two_hosts_started_by_mpirun_through_a_launch_agent():
    # mpirun on host 0 starts host 1's daemon (orted) through hosts.agent, as it would
    # through ssh; the ranks of one host share memory (vader), those of different hosts use
    # TCP on eth0 (the subnet of the test hosts).
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun")
    if not harness.mpi_available():
        pytest.skip("c10d built without its MPI backend")
    env = harness.package_env(
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "GLOO_SOCKET_IFNAME"):
        env.pop(key, None)
    with netns.Hosts(2) as hosts:
        argv = hosts.mpirun_argv(2) + [
            sys.executable,
            WORKER,
            "mpi",
            "0",
            "30",
        ]
        received = eth0_bytes(hosts, 1)[0]
        proc = hosts.popen(
            0, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        out = outputs([proc], timeout=60)[0]
        received = eth0_bytes(hosts, 1)[0] - received
        # Host 1's daemon and ranks end with the job (closing the hosts would kill them).
        deadline = time.monotonic() + 10
        while netns.pids(hosts.names[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = netns.pids(hosts.names[1])
    assert proc.returncode == 0, out
    assert not left, f"still running on testhost1 after mpirun: {left}"
    for i in range(2):
        ok = rf"testhost{i} rank (\d) of 4: ok \(mpi, ProcessGroupMPI\)"
        assert sorted(int(r) for r in re.findall(ok, out)) == [2 * i, 2 * i + 1], out
    # The 8 MiB all_reduces crossed the test network.
    assert received > 8 << 20, (received, out)
