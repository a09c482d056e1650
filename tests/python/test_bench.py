"""The collective benchmark's placement checks and rounds (bench/collective_bench.py): a launch
that the CPUs were far apart around runs again while the budget lasts, the report says which
launches ran in which placement, and the minutes-long launches run fewer rounds."""

import importlib.util
import json
import os
import subprocess
import time

import pytest

REPO = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location(
        "collective_bench", os.path.join(REPO, "bench", "collective_bench.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake(bench, monkeypatch, trips, during=()):
    """Probe answers from `trips` in turn, and the largest trip while each launch ran from
    `during` (None once it runs out); launches that always work; no real sleeping."""
    answers, watched = iter(trips), iter(during)
    launches = []
    monkeypatch.setattr(bench, "round_trip_ns", lambda probe: next(answers))
    monkeypatch.setattr(bench, "start_watch", lambda probe: probe)
    monkeypatch.setattr(bench, "stop_watch", lambda watcher: next(watched, None))
    monkeypatch.setattr(bench, "launch", lambda impl, args, out: launches.append(impl) or True)
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    return launches


def test_a_launch_the_cpus_were_far_apart_around_runs_again(bench, monkeypatch):
    # Far after the first launch; close around the second.
    launches = fake(bench, monkeypatch, [100, 480, 110, 105])
    budget = [60.0]
    ok, around = bench.launch_close("c10d", None, "out", "probe", budget, "c10d-shm")
    assert ok and around == (110, 105, None)
    assert launches == ["c10d", "c10d"]
    assert budget[0] < 60


def test_a_launch_the_cpus_moved_far_apart_during_runs_again(bench, monkeypatch):
    # Close before and after the first launch, but far apart for a while as it ran (3 of 20
    # checks); a moment of it (2 of 40) in the second does not count.
    launches = fake(bench, monkeypatch, [100, 110, 105, 100], during=[(3, 20), (2, 40)])
    ok, around = bench.launch_close("mpi", None, "out", "probe", [60.0], "mpi")
    assert ok and around == (105, 100, (2, 40)) and launches == ["mpi", "mpi"]
    text = bench.placement_summary({"mpi": [(100, 110, (3, 20))], "c10d-shm": [(100, 100, (1, 5))]})
    assert (
        "far apart (>= 250 ns) while it ran around: mpi round 1 (100 -> 110 ns, far in 3 "
        "of 20 checks while it ran)"
    ) in text, text
    assert "c10d-shm" not in text, text


def test_pytorch_launches_wait_for_a_close_start_but_are_not_run_again(bench, monkeypatch):
    # Far before (a wait), then close before and far after the launch: it stands.
    launches = fake(bench, monkeypatch, [480, 100, 520], during=[(15, 20)])
    budget = [60.0]
    ok, around = bench.launch_close("torch", None, "out", "probe", budget, "torch")
    assert ok and around == (100, 520, (15, 20)) and launches == ["torch"]
    assert budget[0] == 58  # the one wait of 2 s
    assert "torch round 1 (100 -> 520 ns" in bench.placement_summary({"torch": [around]})


def test_it_waits_for_the_cpus_to_be_close_before_launching(bench, monkeypatch):
    launches = fake(bench, monkeypatch, [480, 470, 100, 100])
    budget = [60.0]
    ok, around = bench.launch_close("mpi", None, "out", "probe", budget, "mpi")
    assert around == (100, 100, None) and launches == ["mpi"]
    assert budget[0] == 56  # two waits of 2 s


def test_when_the_budget_is_spent_the_launch_stands_and_the_report_says_so(bench, monkeypatch):
    launches = fake(bench, monkeypatch, [480, 490])
    ok, around = bench.launch_close("mpi", None, "out", "probe", [0.0], "mpi")
    assert ok and around == (480, 490, None) and launches == ["mpi"]
    text = bench.placement_summary({"c10d-shm": [(100, 120, None)], "mpi": [around]})
    assert "far apart (>= 250 ns) around: mpi round 1 (480 -> 490 ns)" in text
    assert "close otherwise (100-120 ns)" in text
    text = bench.placement_summary({"c10d-shm": [(100, 120, (0, 9))], "mpi": [(90, 95, None)]})
    assert text.endswith("every launch ran with the CPUs close (< 250 ns, also while it ran)")
    assert "not checked" in bench.placement_summary({"mpi": [(None, None, None)]})


def test_one_physical_core_counts_as_unusual_too(bench, monkeypatch):
    # Both vCPUs on one physical core (the round trip through a shared L2): run again.
    launches = fake(bench, monkeypatch, [110, 36, 115, 120])
    ok, around = bench.launch_close("c10d", None, "out", "probe", [60.0], "c10d-shm")
    assert around == (115, 120, None) and launches == ["c10d", "c10d"]
    text = bench.placement_summary({"c10d-shm": [(110, 36, None)], "mpi": [(100, 500, None)]})
    assert "on one physical core (< 65 ns) around: c10d-shm round 1 (110 -> 36 ns)" in text
    assert "far apart (>= 250 ns) around: mpi round 1 (100 -> 500 ns)" in text


def built_probe():
    """bench/placement_probe, or a skip when it is not built or there are fewer than 2 CPUs."""
    probe = os.path.join(REPO, "build", "bench", "placement_probe")
    if not os.access(probe, os.X_OK):
        pytest.skip("bench/placement_probe is not built")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    return probe


def test_the_probe_program_prints_a_round_trip(bench):
    probe = built_probe()
    out = subprocess.run([probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert 0 < int(out.stdout) < 1_000_000
    # --watch: a round trip every WATCH_MS until stopped (a batch whose echo thread did not
    # get its CPU in time prints nothing; some of 10 do).
    watcher = bench.start_watch(probe)
    time.sleep(10 * bench.WATCH_MS / 1000)
    far, checks = bench.stop_watch(watcher)
    assert 0 < checks <= 11 and 0 <= far <= checks


def test_the_watching_probe_leaves_the_cpus_to_the_launch():
    # Every period the echo thread spins only until the pinger's batch is over: 50 periods
    # of 20 ms take a few ms of CPU (spinning out its 2 ms cap each time took over 100 ms).
    watcher = subprocess.Popen([built_probe(), "--watch", "20"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        with open(f"/proc/{watcher.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    finally:
        watcher.kill()
        out, _ = watcher.communicate(timeout=30)
    assert out.split()  # it did time trips meanwhile
    assert cpu_s < 0.05, f"the watching probe used {cpu_s:.3f} s of CPU in 1 s"


def test_slow_launches_run_fewer_rounds_and_the_report_says_so(
    bench, monkeypatch, capsys, tmp_path
):
    # c10d's gloo backend runs --slow-rounds rounds, shm --rounds; each row is the median of
    # the rounds an implementation ran, and the header names both counts.
    launched = []

    def launch(impl, args, out):
        launched.append((args.backend, args.rounds))
        us = 10.0 * (len(launched) if args.backend == "shm" else 1)
        with open(out, "w") as f:
            json.dump({"results": [{"op": "all_reduce", "bytes": 4, "us": us}]}, f)
        return True

    monkeypatch.setattr(bench, "launch", launch)
    monkeypatch.setattr(bench, "python_overhead_us", lambda backend: 0.3)
    assert (
        bench.main(
            [
                "--backend",
                "shm,gloo",
                "--rounds",
                "5",
                "--slow-rounds",
                "2",
                "--ops",
                "all_reduce",
                "--max-bytes",
                "4",
                "--placement-budget",
                "0",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert launched.count(("shm", 5)) == 5 and launched.count(("gloo", 2)) == 2
    assert len(launched) == 7
    out = capsys.readouterr().out
    assert "median of 5 interleaved rounds (c10d-gloo: 2)" in out, out
    # shm's launches were the 1st, 3rd, 5th, 6th and 7th: 10, 30, 50, 60 and 70 us.
    with open(tmp_path / "r.json") as f:
        results = json.load(f)
    assert results["c10d-shm"][0]["rounds_us"] == [10, 30, 50, 60, 70]
    assert results["c10d-shm"][0]["us"] == 50
    assert results["c10d-gloo"][0]["rounds_us"] == [10, 10]
