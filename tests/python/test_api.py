"""The torch.distributed API surface on one process, plus the launcher."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import numpy as np
import pytest

import c10d as dist

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def world1():
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_not_initialized_errors():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        dist.get_rank()
    with pytest.raises(ValueError, match="init_process_group"):
        dist.all_reduce(np.ones(1))


def test_argument_errors(monkeypatch):
    with pytest.raises(ValueError, match="Invalid backend"):
        dist.init_process_group("nonsense", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(ValueError):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=0)
    with pytest.raises(AssertionError):  # torch asserts here; ours is also a ValueError
        dist.init_process_group("gloo", store=dist.HashStore(), rank=-1, world_size=2)
    with pytest.raises(ValueError, match="init_method and store"):
        dist.init_process_group(
            "gloo", init_method="env://", store=dist.HashStore(), rank=0, world_size=1
        )
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        dist.init_process_group("gloo")
    with pytest.raises(ValueError, match="rank"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", world_size=1)
    with pytest.raises(TypeError):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=5)
    assert not dist.is_initialized()


def test_state_after_init(world1):
    assert dist.is_initialized()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "gloo" == dist.Backend.GLOO
    assert dist.get_backend_config() == "cpu:gloo"
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.group.WORLD
    assert dist._C._resolve_process_group(pg.group_name) is pg
    name = pg.group_name
    dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="resolve"):
        dist._C._resolve_process_group(name)


def test_registry_tables_at_module_level_follow_the_world(world1):
    """Scripts written for torch read distributed_c10d._pg_map and its siblings."""
    dc = dist.distributed_c10d
    sub = dist.new_group([0])
    assert set(dc._pg_map) == {dist.group.WORLD, sub}
    assert dc._pg_group_ranks[sub] == {0: 0}
    assert dc._default_pg is dist.group.WORLD and dc._group_count >= 1
    dist.destroy_process_group()
    assert dc._pg_map == {} and dc._default_pg is None
    with pytest.raises(AttributeError):
        _ = dc._no_such_table


def test_file_and_tcp_init_methods(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    t = np.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    from dist.harness import free_port

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}?rank=0&world_size=1"
    )
    dist.barrier()
    # As torch's: the group's store is its prefix of the rendezvous store, and under the
    # prefixes lies the TCPStore.
    store = dist.distributed_c10d._get_process_group_store(dist.group.WORLD)
    assert isinstance(store, dist.PrefixStore)
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    assert isinstance(store, dist.TCPStore)
    dist.destroy_process_group()


def test_backend_names_and_config():
    assert dist.Backend("GLOO") == "gloo"
    assert dist.Backend("Custom") == "custom"
    with pytest.raises(ValueError):
        dist.Backend(3)
    assert str(dist.BackendConfig("gloo")) == "cpu:gloo"
    assert dist.BackendConfig("cpu:gloo").get_device_backend_map() == {"cpu": "gloo"}
    assert dist.is_gloo_available() and not dist.is_nccl_available()
    assert dist.is_backend_available("gloo") and not dist.is_backend_available("nope")
    assert not dist.supports_complex(dist.ReduceOp.MAX)
    assert dist.supports_complex(dist.ReduceOp.SUM)
    with pytest.warns(FutureWarning):
        assert dist.reduce_op.SUM == dist.ReduceOp.SUM
    assert dist.default_pg_timeout == timedelta(minutes=30)
    assert dist.get_default_backend_for_device("cpu") == "gloo"


class _EchoGroup(dist.ProcessGroup):
    """A backend written in Python: multiplies tensors by `factor` (2) on all_reduce."""

    calls = []

    def __init__(self, rank, size, factor=2):
        super().__init__(rank, size)
        self.factor = factor

    def allreduce(self, tensors, opts):
        _EchoGroup.calls.append(("allreduce", opts.reduceOp))
        for t in tensors:
            t *= self.factor
        f = dist.Future()
        f.set_result(tensors)
        return dist._C._create_work_from_future(f)

    def name(self):
        return "echo"


def test_register_python_backend():
    dist.Backend.register_backend("echo", lambda store, rank, size, timeout: _EchoGroup(rank, size))
    assert dist.is_backend_available("echo")
    dist.init_process_group("echo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = np.ones(3)
        dist.all_reduce(t)
        assert (t == 2).all()
        assert _EchoGroup.calls[-1][0] == "allreduce"
        assert dist.get_backend() == "echo"
        # What the subclass does not implement is named, as torch's "does not support".
        with pytest.raises(RuntimeError, match="does not support ALLGATHER"):
            dist.all_gather([np.zeros(3)], np.ones(3))
    finally:
        dist.destroy_process_group()
    # Registering again replaces the creator, as in torch.
    dist.Backend.register_backend(
        "echo", lambda store, rank, size, timeout: _EchoGroup(rank, size, factor=3)
    )
    dist.init_process_group("echo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = np.ones(3)
        dist.all_reduce(t)
        assert (t == 3).all()
    finally:
        dist.destroy_process_group()


def test_process_group_built_by_hand_as_in_torch():
    # torch's idiom for a hand-made group: Options, then _register_backend with a BackendType.
    opts = dist.ProcessGroup.Options("gloo", timedelta(seconds=7))
    assert opts.backend == "gloo" and opts._timeout == timedelta(seconds=7)
    pg = dist.ProcessGroup(dist.HashStore(), 0, 1)
    backend = dist.FakeProcessGroup(0, 1)
    pg._register_backend("cpu", dist.ProcessGroup.BackendType.CUSTOM, backend)
    assert pg._get_backend("cpu") is backend
    assert dist.ProcessGroup.BackendType.GLOO != dist.ProcessGroup.BackendType.MPI
    assert issubclass(dist.ProcessGroupGloo, dist._Backend)


# A raising completion hook logs a WARNING for each operation it sees.
_HOOK_WARNS = """
import numpy as np
import c10d as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
def broken(info):
    raise KeyError("hook failure")
dist.group.WORLD._register_on_completion_hook(broken)
dist.all_reduce(np.ones(2))
dist._set_global_rank(5)
dist.all_reduce(np.ones(2))
dist.destroy_process_group()
"""


def _hook_warnings(tmp_path, **env):
    script = tmp_path / "job.py"
    script.write_text(_HOOK_WARNS)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **env)
    for name in ("C10D_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL"):
        if not env[name]:
            del env[name]
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out
    return [line for line in out.stderr.splitlines() if "hook failure" in line]


def test_log_level_follows_c10d_then_torch_variable(tmp_path):
    assert _hook_warnings(tmp_path, TORCH_CPP_LOG_LEVEL="ERROR", C10D_LOG_LEVEL="") == []
    assert _hook_warnings(tmp_path, TORCH_CPP_LOG_LEVEL="3", C10D_LOG_LEVEL="") == []
    assert len(_hook_warnings(tmp_path, TORCH_CPP_LOG_LEVEL="INFO", C10D_LOG_LEVEL="")) == 2
    # C10D_LOG_LEVEL, when set, wins.
    both = _hook_warnings(tmp_path, TORCH_CPP_LOG_LEVEL="ERROR", C10D_LOG_LEVEL="WARNING")
    assert len(both) == 2


def test_log_lines_name_the_global_rank(tmp_path):
    # init_process_group sets it (torch's _set_global_rank).
    lines = _hook_warnings(tmp_path, C10D_LOG_LEVEL="", TORCH_CPP_LOG_LEVEL="")
    assert len(lines) == 2, lines
    assert lines[0].startswith("[c10d rank 0 WARNING]"), lines
    assert lines[1].startswith("[c10d rank 5 WARNING]"), lines


def test_completion_hooks_and_coalescing(world1):
    pg = dist.group.WORLD
    seen = []
    pg._register_on_completion_hook(lambda info: seen.append((info.op_type, info.seq)))
    assert pg._has_hooks()
    t = np.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    # WorkInfo.op_type is an OpType, as in torch.
    assert [op for op, _ in seen] == [dist.OpType.ALLREDUCE, dist.OpType.BROADCAST]
    assert seen[1][1] == seen[0][1] + 1

    def broken_hook(info):
        raise KeyError("hook failure")

    # A hook that raises is logged; the collective and the other hooks are unaffected.
    pg._register_on_completion_hook(broken_hook)
    dist.all_reduce(t)
    assert (t == 1).all() and [op for op, _ in seen][-1] is dist.OpType.ALLREDUCE
    pg._start_coalescing("cpu")
    works = [dist.all_reduce(np.ones(2), async_op=True) for _ in range(3)]
    work = pg._end_coalescing("cpu")
    work.wait()
    assert all(w.is_completed() for w in works)


def test_work_op_type_numbers_boxing_and_duration(world1):
    # torch's OpType numbers: ALLREDUCE 1, ALLGATHER 4, BARRIER 15, and so on.
    works = [
        dist.all_reduce(np.ones(2), async_op=True),
        dist.all_gather([np.zeros(1)], np.ones(1), async_op=True),
        dist.barrier(async_op=True),
    ]
    for w in works:
        w.wait()
    assert [w._get_op_type() for w in works] == [1, 4, 15]
    assert [w.op_type for w in works] == ["ALLREDUCE", "ALLGATHER", "BARRIER"]
    assert dist.Work.unbox(works[0].boxed()) is works[0]
    with pytest.raises(TypeError, match="boxed Work"):
        dist.Work.unbox(3)
    with pytest.raises(RuntimeError, match="getDuration"):
        works[0]._get_duration()


def test_fake_backend_does_nothing_but_succeeds():
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = np.ones(2)
        dist.all_reduce(t)
        assert (t == 1).all()
        assert dist.all_reduce(t, async_op=True).is_success()
    finally:
        dist.destroy_process_group()


def _launch(script_text, nproc, tmp_path, *extra):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(script_text))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    return subprocess.run(
        [sys.executable, "-m", "c10d.run", "--nproc-per-node", str(nproc), *extra, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launcher_sets_environment_and_runs_collectives(tmp_path):
    out = _launch(
        """
        import os, numpy as np, c10d as dist
        dist.init_process_group("gloo")
        t = np.ones(1)
        dist.all_reduce(t)
        # One write per line: the workers share the launcher's stdout, and print() under
        # python -u may split a line into several writes that interleave.
        env = os.environ
        fields = ["RANK", env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"],
                  env["LOCAL_WORLD_SIZE"], int(t[0]), dist.is_torchelastic_launched()]
        os.write(1, (" ".join(str(x) for x in fields) + chr(10)).encode())
        dist.destroy_process_group()
    """,
        3,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("RANK"))
    assert lines == [f"RANK {r} {r} 3 3 3 True" for r in range(3)]


def test_launcher_stops_others_when_one_fails(tmp_path):
    out = _launch(
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("rank one gives up", file=sys.stderr)
            sys.exit(7)
        time.sleep(60)
    """,
        3,
        tmp_path,
    )
    assert out.returncode == 7
    assert "worker rank 1" in out.stderr and "exit code 7" in out.stderr
    assert "rank one gives up" in out.stderr
    assert "stopped the other workers" in out.stderr


def test_launcher_rendezvous_endpoint_port_0_takes_a_free_port(tmp_path):
    script = _launched_job(tmp_path, "SUM {int(t[0])}")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "c10d.run",
            "--nnodes",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "--nproc-per-node",
            "2",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SUM 2") == 2, out.stdout


def test_launcher_takes_an_ipv6_master_addr_in_brackets(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    script = _launched_job(tmp_path, "SUM {int(t[0])} {os.environ['MASTER_ADDR']}")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "c10d.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "[::1]",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SUM 2 ::1") == 2, out.stdout


def _signal_launcher(tmp_path, body, signum, *extra):
    """Starts a 2-worker launcher on `body` (which touches up<RANK> in tmp_path once it runs),
    sends it `signum` once both workers run, and returns its exit code."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "c10d.run", "--nproc-per-node", "2", *extra, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"up{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.poll()
        time.sleep(0.05)
    launcher.send_signal(signum)
    launcher.communicate(timeout=60)
    return launcher.returncode


def test_launcher_passes_sigint_on(tmp_path):
    """SIGINT reaches the workers as SIGINT (KeyboardInterrupt, so their cleanup runs), as
    torchrun passes it on, instead of a SIGTERM."""
    code = _signal_launcher(
        tmp_path,
        f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "up" + os.environ["RANK"]), "w").close()
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            open(os.path.join({str(tmp_path)!r}, "interrupted" + os.environ["RANK"]),
                 "w").close()
    """,
        signal.SIGINT,
    )
    assert code == 128 + signal.SIGINT
    assert all((tmp_path / f"interrupted{r}").exists() for r in range(2))


def test_launcher_takes_every_torchrun_option():
    # Each option torch's torchrun lists is accepted (or refused saying what c10d does instead).
    torch_run = pytest.importorskip("torch.distributed.run")
    from c10d import run

    ours = {s for a in run._parser()._actions for s in a.option_strings}
    theirs = {s for a in torch_run.get_args_parser()._actions for s in a.option_strings}
    assert not theirs - ours, sorted(theirs - ours)


def test_launcher_help_describes_every_option_with_its_default(capsys):
    from c10d import run

    for action in run._parser()._actions:
        assert action.help, action.option_strings or action.dest
    with pytest.raises(SystemExit):
        run.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: none)" in text and "(default: SIGTERM,SIGINT,SIGHUP,SIGQUIT)" in text, text


def test_launcher_refuses_logs_specs_saying_what_to_use(capsys):
    from c10d import run

    with pytest.raises(SystemExit):
        run.parse_args(["--logs-specs", "mine", "job.py"])
    assert "--log-dir, --redirects, --tee" in capsys.readouterr().err


def test_launcher_tee_prefixes_whole_lines(tmp_path):
    # Lines written in pieces, unbuffered, by two workers: each console line is one worker's
    # whole line behind its prefix, as torchrun writes them.
    out = _launch(
        """
        import os, sys, time
        r = os.environ["LOCAL_RANK"]
        for i in range(20):
            sys.stdout.write(f"rank{r}-")
            time.sleep(0.001)
            sys.stdout.write(f"line{i}\\n")
        sys.stdout.write(f"last{r}")
    """,
        2,
        tmp_path,
        "--tee",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 42, lines
    for line in lines:
        assert re.fullmatch(r"\[default(\d)\]:(rank\1-line\d+|last\1)", line), line


def test_launcher_torchrun_options_take_effect(tmp_path):
    logs = tmp_path / "logs"
    out = _launch(
        """
        import os
        cpus = sorted(os.sched_getaffinity(0))
        line = f"rank {os.environ['RANK']} local {os.environ['LOCAL_RANK']} cpus {cpus}"
        rank = os.environ["RANK"]
        os.write(1, (line + chr(10) + "apple " + rank + chr(10) + "pear" + chr(10)).encode())
    """,
        2,
        tmp_path,
        "--virtual-local-rank",
        "--numa-binding",
        "exclusive",
        "--duplicate-stdout-filters",
        "apple,kiwi",
        "--log-dir",
        str(logs),
        "--rdzv-id",
        "job7",
        "--event-log-handler",
        "console",
        "--shutdown-timeout",
        "2",
    )
    assert out.returncode == 0, out.stderr
    found = dict(
        (m.group(1), (m.group(2), m.group(3)))
        for m in re.finditer(r"rank (\d) local (\d) cpus \[([\d, ]+)\]", out.stdout)
    )
    assert sorted(found) == ["0", "1"] and {v[0] for v in found.values()} == {"0"}, out.stdout
    cpus = [set(map(int, v[1].split(","))) for v in found.values()]
    usable = os.sched_getaffinity(0)
    assert all(c <= usable for c in cpus)
    if len(usable) >= 2:
        assert not cpus[0] & cpus[1], cpus  # exclusive: a share of their own
    filtered = (logs / "job7" / "attempt_0" / "filtered_stdout.log").read_text().splitlines()
    assert sorted(filtered) == ["apple 0", "apple 1"], filtered
    events = [json.loads(l) for l in out.stderr.splitlines() if l.startswith("{")]
    names = [e["name"] for e in events]
    assert names == ["c10drun.workers_started", "c10drun.run_finished"], out.stderr
    assert events[-1]["metadata"]["state"] == "SUCCEEDED"


def test_launcher_passes_on_the_signals_it_is_told_to(tmp_path):
    code = _signal_launcher(
        tmp_path,
        f"""
        import os, signal, sys, time
        def got(signum, frame):
            open(os.path.join({str(tmp_path)!r}, "got" + os.environ["RANK"]), "w").close()
            sys.exit(0)
        signal.signal(signal.SIGUSR1, got)
        open(os.path.join({str(tmp_path)!r}, "up" + os.environ["RANK"]), "w").close()
        time.sleep(60)
    """,
        signal.SIGUSR1,
        "--signals-to-handle",
        "SIGTERM,SIGUSR1",
    )
    assert code == 128 + signal.SIGUSR1
    assert all((tmp_path / f"got{r}").exists() for r in range(2))


def test_argument_errors_are_also_runtime_errors(world1):
    # torch.distributed raises RuntimeError for these (its backends' checks, older releases'
    # Python checks) or ValueError (newer releases): c10d's errors are both.
    t = np.ones(2, dtype=np.float32)
    with pytest.raises(RuntimeError, match="root rank"):
        dist.broadcast(t, src=1)
    with pytest.raises(ValueError, match="root rank"):
        dist.broadcast(t, src=1, async_op=True)
    with pytest.raises(RuntimeError):
        dist.all_gather([np.zeros(2, dtype=np.float64)], t)
    with pytest.raises(RuntimeError):
        dist.all_reduce(t, op=dist.ReduceOp.BAND)
    with pytest.raises(RuntimeError):
        dist.send(t, 0)
    with pytest.raises(RuntimeError, match="twice"):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(RuntimeError):
        dist.new_group([0, 1])
    with pytest.raises(RuntimeError):
        dist.get_group_rank(dist.new_group([0]), 5)
    with pytest.raises(TypeError) as info:
        dist.all_gather(np.zeros(2), t)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(ValueError) as info:
        dist.P2POp(dist.send, t, 0)
    assert isinstance(info.value, RuntimeError)
    dist.destroy_process_group()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.get_world_size()
    with pytest.raises(AssertionError):  # torch asserts
        dist.destroy_process_group()
    with pytest.raises(RuntimeError, match="No rendezvous handler"):
        dist.init_process_group("gloo", init_method="nope://x", rank=0, world_size=1)


def test_errors_show_public_class_names(world1):
    # A traceback prints the class's module and name: both must be what users can import.
    t = np.ones(2, dtype=np.float32)
    calls = [
        lambda: dist.broadcast(t, src=1),
        lambda: dist.all_gather(np.zeros(2), t),
        lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND),
        lambda: dist.P2POp(dist.send, t, 0),
        lambda: dist.get_group_rank(dist.new_group([0]), 5),
    ]
    for call in calls:
        with pytest.raises(Exception) as info:
            call()
        cls = type(info.value)
        if cls.__module__ == "builtins":
            continue
        assert cls.__module__ == "c10d" and not cls.__name__.startswith("_"), cls
        assert getattr(dist, cls.__name__) is cls, cls
    assert issubclass(dist.DistValueError, ValueError)
    assert issubclass(dist.DistTypeError, TypeError)


def test_public_functions_keep_identity_and_signature():
    import inspect

    assert dist.isend is dist.distributed_c10d.isend
    assert list(inspect.signature(dist.all_reduce).parameters) == [
        "tensor",
        "op",
        "group",
        "async_op",
    ]
    assert dist._all_gather_base is dist.distributed_c10d._all_gather_base
    assert dist._reduce_scatter_base is dist.distributed_c10d._reduce_scatter_base


def test_non_member_warning_points_at_the_caller(world1):
    with pytest.warns(UserWarning, match="does not belong") as record:
        assert dist.all_reduce(np.ones(1), group=dist.GroupMember.NON_GROUP_MEMBER) is None
    assert record[0].filename == __file__


def test_all_gather_object_accepts_a_longer_list(world1):
    out = [None, "untouched"]
    dist.all_gather_object(out, {"a": 1})
    assert out == [{"a": 1}, "untouched"]
    with pytest.raises(ValueError):
        dist.all_gather_object([], 1)


def test_launcher_restarts_the_group_while_max_restarts_allows(tmp_path):
    counter = tmp_path / "attempts"
    script = f"""
        import os, sys
        p = {str(counter)!r}
        if os.environ["RANK"] == "0":  # only rank 0 touches the file (no torn reads)
            n = int(open(p).read()) if os.path.exists(p) else 0
            open(p, "w").write(str(n + 1))
        env = os.environ
        os.write(1, f"ATTEMPT {{env['RANK']}} {{env['TORCHELASTIC_RESTART_COUNT']}} "
                    f"{{env['TORCHELASTIC_MAX_RESTARTS']}} {{env['ROLE_NAME']}} "
                    f"{{env['OMP_NUM_THREADS']}}\\n".encode())
        sys.exit(3 if env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["RANK"] == "1" else 0)
    """
    out = _launch(script, 2, tmp_path, "--max-restarts", "2", "--role", "trainer")
    assert out.returncode == 0, out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("ATTEMPT"))
    assert lines == [
        "ATTEMPT 0 0 2 trainer 1",
        "ATTEMPT 0 1 2 trainer 1",
        "ATTEMPT 1 0 2 trainer 1",
        "ATTEMPT 1 1 2 trainer 1",
    ], lines
    assert "restarting the workers (restart 1 of 2)" in out.stderr
    # Without restarts left the job fails and says so.
    counter.unlink()
    out = _launch(script, 2, tmp_path)
    assert out.returncode == 3 and "worker rank 1" in out.stderr


def test_launcher_quotes_the_error_file_a_worker_recorded(tmp_path):
    out = _launch(
        """
        import json, os, sys
        assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        path = os.environ["TORCHELASTIC_ERROR_FILE"]
        assert os.path.isdir(os.path.dirname(path)), path
        if os.environ["RANK"] == "1":
            with open(path, "w") as f:  # as torch's @record writes it
                json.dump({"message": {"message": "ValueError: bad batch 17",
                                       "extraInfo": {"py_callstack": "..."}}}, f)
            sys.exit(5)
    """,
        2,
        tmp_path,
    )
    assert out.returncode == 5, out.stderr
    assert (
        "rank 1 recorded its error (TORCHELASTIC_ERROR_FILE): ValueError: bad batch 17"
        in out.stderr
    ), out.stderr


def test_launcher_writes_redirected_streams_to_the_log_dir(tmp_path):
    out = _launch(
        """
        import os, sys
        print("out of", os.environ["LOCAL_RANK"])
        print("err of", os.environ["LOCAL_RANK"], file=sys.stderr)
    """,
        2,
        tmp_path,
        "--log-dir",
        str(tmp_path / "logs"),
        "--redirects",
        "1",
        "--tee",
        "2",
    )
    assert out.returncode == 0, out.stderr
    for r in range(2):
        folder = tmp_path / "logs" / "none" / "attempt_0" / str(r)
        assert (folder / "stdout.log").read_text() == f"out of {r}\n"
        assert (folder / "stderr.log").read_text() == f"err of {r}\n"
        assert f"out of {r}" not in out.stdout  # redirected: only in the file
        assert f"err of {r}" in out.stderr  # teed: in the file and on the console


def test_launcher_local_ranks_filter_and_pet_environment(tmp_path):
    """--local-ranks-filter (here from PET_LOCAL_RANKS_FILTER, as torchrun reads PET_<OPTION>)
    shows only those ranks' output; the files of --tee still get every rank's."""
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        os.write(1, f"out of {os.environ['LOCAL_RANK']}\\n".encode())
        os.write(2, f"err of {os.environ['LOCAL_RANK']}\\n".encode())
    """)
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(REPO, "python"),
        PET_NPROC_PER_NODE="3",
        PET_LOCAL_RANKS_FILTER="0,2",
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "c10d.run",
            "--tee",
            "3",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for r in range(3):
        shown = r != 1
        assert (f"out of {r}" in out.stdout) == shown, out.stdout
        assert (f"err of {r}" in out.stderr) == shown, out.stderr
        folder = tmp_path / "logs" / "none" / "attempt_0" / str(r)
        assert (folder / "stdout.log").read_text() == f"out of {r}\n"
    bad = _launch("print(1)", 1, tmp_path, "--local-ranks-filter", "0,x")
    assert bad.returncode == 2 and "comma-separated list of integers" in bad.stderr


def test_launcher_redirects_without_log_dir_use_a_temporary_one(tmp_path):
    out = _launch(
        """
        import os
        print("out of", os.environ["LOCAL_RANK"])
    """,
        2,
        tmp_path,
        "--redirects",
        "1",
    )
    assert out.returncode == 0, out.stderr
    folder = out.stderr.split("c10drun: worker logs go to ")[1].split()[0]
    try:
        for r in range(2):
            path = os.path.join(folder, "none", "attempt_0", str(r), "stdout.log")
            assert open(path).read() == f"out of {r}\n"
            assert f"out of {r}" not in out.stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_launcher_endpoints():
    from c10d.run import _split_endpoint

    assert _split_endpoint("[::1]:29455", None) == ("::1", 29455)
    assert _split_endpoint("::1", 7) == ("::1", 7)
    assert _split_endpoint("node3:1234", None) == ("node3", 1234)
    assert _split_endpoint("node3", 29400) == ("node3", 29400)
    with pytest.raises(ValueError):
        _split_endpoint("node3:http", None)


def _launched_job(tmp_path, line):
    """A worker script that sums ones over the world and writes `line` (an f-string body
    that may use os, dist and t, the sum)."""
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, numpy as np, c10d as dist
        dist.init_process_group("gloo")
        t = np.ones(1)
        dist.all_reduce(t)
        os.write(1, (f"{line}" + "\\n").encode())
        dist.destroy_process_group()
    """)
    )
    return script


def test_launchers_of_two_nodes_number_themselves_through_the_c10d_rendezvous(tmp_path):
    script = _launched_job(
        tmp_path, "NODE {os.environ['GROUP_RANK']} RANK {dist.get_rank()} {t[0]}"
    )
    from dist.harness import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    # Each launcher in a session of its own, so that a failure kills its workers too (an
    # orphaned worker keeps the pipe open and would hold the next test).
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "c10d.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "job",
                "--rdzv-conf",
                "join_timeout=60",
                str(script),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert all(p.returncode == 0 for p in procs), outs
    lines = sorted(l for out, _ in outs for l in out.splitlines() if l.startswith("NODE"))
    assert lines == ["NODE 0 RANK 0 2.0", "NODE 1 RANK 1 2.0"], outs


def test_a_node_that_reaches_the_rendezvous_store_before_its_host_counts_is_node_1(monkeypatch):
    # The launcher that hosts the store is node 0 even when another one counts itself in
    # first (seen across test hosts: both took node rank 0 and waited forever).
    import threading
    from c10d import run
    from dist.harness import free_port

    real_free_port = run._free_port

    def slow_free_port():  # only node 0 picks the workers' port: delay it past the other
        time.sleep(0.5)
        return real_free_port()

    monkeypatch.setattr(run, "_free_port", slow_free_port)
    argv = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "race",
        "--rdzv-conf",
        "join_timeout=20",
        "job.py",
    ]
    results, errors = {}, []

    def node(name):
        try:
            # The whole result: node 0's store must serve until both are done.
            results[name] = run._dynamic_rendezvous(run.parse_args(argv))
        except BaseException as e:  # SystemExit too
            errors.append(e)

    host = threading.Thread(target=node, args=("host",))
    host.start()
    time.sleep(0.2)  # the host has bound the store and is in slow_free_port
    other = threading.Thread(target=node, args=("other",))
    other.start()
    host.join(60)
    other.join(60)
    assert not errors, errors
    assert {k: v[:2] for k, v in results.items()} == {"host": (0, 2), "other": (1, 2)}, results


def test_elastic_node_count_starts_with_min_nodes_after_the_last_call(tmp_path):
    # --nnodes MIN:MAX with one launcher: after last_call_timeout it runs with the one node.
    script = _launched_job(
        tmp_path, "W {os.environ['WORLD_SIZE']} G {os.environ['GROUP_WORLD_SIZE']} {t[0]}"
    )
    from dist.harness import free_port

    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "c10d.run",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-conf",
            "join_timeout=30,last_call_timeout=1",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out
    assert sorted(out.stdout.split("\n"))[-2:] == ["W 2 G 1 2.0"] * 2, out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "c10d.run", "--nnodes", "3:2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "MIN <= MAX" in bad.stderr, bad.stderr


def test_mpi_without_an_mpi_library_says_what_to_install():
    # c10d._mpi loads the host's MPI library first: where there is none, importing c10d and
    # every other backend still works, and the mpi backend is refused naming what is missing.
    program = textwrap.dedent("""
        import numpy as np
        import c10d
        from c10d import _mpi_loader
        _mpi_loader._LIBRARY = "libmpi-that-is-not-installed.so.40"
        assert not c10d.is_mpi_available() and not c10d.is_backend_available("mpi")
        try:
            c10d.init_process_group("mpi")
        except RuntimeError as e:
            print(e)
        else:
            raise SystemExit("the mpi backend started without its library")
        c10d.init_process_group("gloo", store=c10d.HashStore(), rank=0, world_size=1)
        x = np.ones(4, np.float32)
        c10d.all_reduce(x)
        c10d.destroy_process_group()
    """)
    p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Backend mpi is not available" in p.stdout, p.stdout
    assert "libmpi" in p.stdout and "apt install libopenmpi3" in p.stdout, p.stdout
