"""Flight recorder: on-demand and signal dumps, the analyzer, and a real induced hang."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import c10d
from c10d import trace
from dist import harness

PYTHON_DIR = os.path.join(harness.REPO, "python")


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _analyze(directory):
    return subprocess.run(
        [sys.executable, "-m", "c10d.trace", str(directory)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fake_group(name, world=1):
    pg = c10d.ProcessGroup(c10d.HashStore(), 0, world)
    pg._register_backend("cpu", None, c10d.FakeProcessGroup(0, world))
    pg._set_group_name(name)
    pg._set_global_ranks(list(range(world)))
    return pg


def test_dump_trace_json_on_demand():
    pg = _fake_group("trace_on_demand", 2)
    pg.allreduce(np.ones(3, np.float32)).wait()
    pg.send([np.zeros(2, np.int64)], 1, 0).wait()
    dump = json.loads(c10d._dump_trace_json())
    assert dump["version"] == "1.0"
    assert dump["pid"] == os.getpid()
    group = [g for g in dump["groups"] if g["name"] == "trace_on_demand"][-1]
    assert group["ranks"] == [0, 1] and group["last_completed_seq"] == 1
    mine = [e for e in dump["entries"] if e["group_uid"] == group["uid"]]
    assert [(e["op"], e["seq"], e["state"]) for e in mine] == [
        ("allreduce", 1, "completed"),
        ("send", 1, "completed"),
    ]
    assert mine[0]["input_sizes"] == [[3]] and mine[0]["input_dtypes"] == ["float32"]
    assert mine[1]["peer"] == 1
    active = json.loads(c10d._dump_trace_json(include_completed=False))
    assert not [e for e in active["entries"] if e["group_uid"] == group["uid"]]


def test_sigusr1_dumps_from_the_watcher_thread(tmp_path):
    script = textwrap.dedent("""
        import os, signal, time
        import numpy as np
        import c10d
        pg = c10d.ProcessGroup(c10d.HashStore(), 0, 1)
        pg._register_backend("cpu", None, c10d.FakeProcessGroup(0, 1))
        pg._set_group_name("0")
        pg.allreduce(np.ones(2)).wait()
        os.kill(os.getpid(), signal.SIGUSR1)
        path = os.path.join(os.environ["C10D_TRACE_DUMP_DIR"], "c10d_trace_rank0.json")
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("DUMPED" if os.path.exists(path) else "MISSING")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=_env(C10D_TRACE_DUMP_DIR=str(tmp_path)),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "DUMPED" in proc.stdout, proc.stderr
    dump = json.loads((tmp_path / "c10d_trace_rank0.json").read_text())
    assert dump["reason"] == "signal SIGUSR1"
    assert [e["op"] for e in dump["entries"]] == ["allreduce"]
    # A healthy trace: the analyzer finds nothing wrong.
    result = _analyze(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "No problem found" in result.stdout


def _entry(id, op, seq, state, sizes=((4,),), dtype="float32", p2p=False, peer=None):
    e = {
        "id": id,
        "group": "0",
        "group_uid": 1,
        "op": op,
        "p2p": p2p,
        "seq": seq,
        "pg_seq": id,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": [dtype] * len(sizes),
        "state": state,
        "error": None,
        "time_enqueued_ns": 1,
        "time_started_ns": 1,
        "time_completed_ns": 2 if state in ("completed", "failed") else None,
        "duration_ns": 1 if state in ("completed", "failed") else None,
        "timeout_ms": 1000,
    }
    if p2p:
        e["peer"] = peer
        e["peer_global"] = peer
    return e


def _write_dump(directory, rank, entries, world=2, job=""):
    collectives = [e for e in entries if not e["p2p"]]
    done = [e["seq"] for e in collectives if e["state"] == "completed"]
    data = {
        "version": "1.0",
        "pid": 100 + rank,
        "rank": rank,
        "hostname": "h",
        "timestamp_ns": 10**10,
        "reason": "test",
        "job": job,
        "entries": entries,
        "groups": [
            {
                "name": "0",
                "uid": 1,
                "rank": rank,
                "size": world,
                "ranks": list(range(world)),
                "last_enqueued_seq": max([e["seq"] for e in collectives], default=0),
                "last_started_seq": max([e["seq"] for e in collectives], default=0),
                "last_completed_seq": max(done, default=0),
            }
        ],
    }
    name = f"c10d_trace_{job}_rank{rank}.json" if job else f"c10d_trace_rank{rank}.json"
    (directory / name).write_text(json.dumps(data))


def test_analyzer_reports_mismatched_calls(tmp_path):
    _write_dump(
        tmp_path, 0, [_entry(1, "allreduce", 1, "completed"), _entry(2, "allreduce", 2, "started")]
    )
    _write_dump(
        tmp_path,
        1,
        [
            _entry(1, "allreduce", 1, "completed"),
            _entry(2, "broadcast", 2, "started", sizes=((8,),)),
        ],
    )
    out = []
    code = trace.report(str(tmp_path), out=_Lines(out))
    text = "".join(out)
    assert code == 1, text
    assert "collective 2 on group 0 [ranks 0,1]: ranks disagree on the call" in text
    assert "rank 0: allreduce(inputs float32[4]" in text
    assert "rank 1: broadcast(inputs float32[8]" in text


def test_analyzer_reports_missing_dump_and_bad_directory(tmp_path):
    assert trace.report(str(tmp_path / "nothing"), out=_Lines([])) == 2
    _write_dump(tmp_path, 0, [_entry(1, "allreduce", 1, "started")])
    out = []
    assert trace.report(str(tmp_path), out=_Lines(out)) == 1
    text = "".join(out)
    assert "no dump from rank(s) 1" in text


def test_analyzer_reads_one_job_at_a_time(tmp_path):
    # Two jobs dumped into one directory: job a is healthy, job b has a rank that never
    # joined. Merged, they would say nothing true about either.
    for rank in (0, 1):
        _write_dump(tmp_path, rank, [_entry(1, "allreduce", 1, "completed")], job="a")
    _write_dump(tmp_path, 0, [_entry(1, "allreduce", 1, "started")], job="b")
    out = []
    assert trace.report(str(tmp_path), out=_Lines(out)) == 2
    text = "".join(out)
    assert "2 jobs" in text and "job a:" in text and "job b:" in text and "--job" in text, text
    out = []
    assert trace.report(str(tmp_path), out=_Lines(out), job="a") == 0, "".join(out)
    out = []
    assert trace.report(str(tmp_path), out=_Lines(out), job="b") == 1
    assert "no dump from rank(s) 1" in "".join(out)
    assert _analyze_job(tmp_path, "b").returncode == 1


def _analyze_job(directory, job):
    return subprocess.run(
        [sys.executable, "-m", "c10d.trace", str(directory), "--job", job],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )


@pytest.mark.parametrize("run_id", ["", "job-42"])
def test_dumps_are_named_after_their_job(tmp_path, run_id):
    # The launcher's run id names the job; without one, rank 0 makes a name up at init.
    script = textwrap.dedent("""
        import c10d
        c10d.init_process_group("gloo", store=c10d.HashStore(), rank=0, world_size=1)
        print("JOB", c10d._C._trace_job())
        print("PATH", c10d._dump_trace_to_file())
        c10d.destroy_process_group()
    """)
    env = _env(C10D_TRACE_DUMP_DIR=str(tmp_path))
    env.pop("TORCHELASTIC_RUN_ID", None)
    if run_id:
        env["TORCHELASTIC_RUN_ID"] = run_id
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    job = lines["JOB"]
    assert job == run_id if run_id else len(job) == 12, job
    assert os.path.basename(lines["PATH"]) == f"c10d_trace_{job}_rank0.json"
    assert json.loads(open(lines["PATH"]).read())["job"] == job


class _Lines:
    def __init__(self, sink):
        self.sink = sink

    def write(self, s):
        self.sink.append(s)

    def flush(self):
        pass


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_induced_hang_is_explained(tmp_path, backend):
    if backend == "shm" and not c10d.is_shm_available():
        pytest.skip("shm backend not built")
    results = harness.run(
        "trace_hang",
        2,
        backend,
        timeout=60,
        env={"C10D_TEST_PG_TIMEOUT": "3", "C10D_TRACE_DUMP_DIR": str(tmp_path)},
    )
    harness.check_all_ok(results)
    assert "TRACE_HANG_TIMEOUT" in results[0].stdout, results[0].stdout
    (path0,) = tmp_path.glob("c10d_trace_*rank0.json")
    dump0 = json.loads(path0.read_text())
    failed = [e for e in dump0["entries"] if e["state"] == "failed"]
    assert len(failed) == 1 and failed[0]["op"] == "allreduce", failed
    seq = failed[0]["seq"]
    (path1,) = tmp_path.glob("c10d_trace_*rank1.json")
    dump1 = json.loads(path1.read_text())
    assert "requested" in dump1["reason"], dump1["reason"]

    result = _analyze(tmp_path)
    print(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"collective {seq} (allreduce) on group 0 [ranks 0,1]: rank 1 never joined" in result.stdout
    ), result.stdout
    assert (
        "rank 1 is stuck in recv p2p seq 1 on group 1 [ranks 0,1] from rank 0" in result.stdout
    ), result.stdout


class _Request(c10d._C._Request):
    def __init__(self, params):
        super().__init__()
        self._params = params

    def body(self):
        return b""

    def params(self):
        return self._params


class _Response(c10d._C._Response):
    def __init__(self):
        super().__init__()
        self.status, self.content = 200, b""

    def set_content(self, content, content_type):
        self.content = content

    def set_status(self, status):
        self.status = status


def test_control_plane_serves_the_recorder():
    pg = _fake_group("trace_control", 2)
    pg.allreduce(np.ones(2, np.float32)).wait()
    handler = c10d._C._get_handler("dump_trace_json")
    response = _Response()
    handler(_Request({}), response)
    assert response.status == 200, response.content
    dump = json.loads(response.content)
    assert any(g["name"] == "trace_control" for g in dump["groups"])
    response = _Response()
    handler(_Request({"onlyActive": "true"}), response)
    assert json.loads(response.content)["only_active"] is True


def _png_rgb(path):
    """(height, width, 3) uint8 pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what
    Chromium's screenshots are)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8).reshape(height, -1)
    out = np.zeros((height, width * bpp), np.int32)
    prev = np.zeros(width * bpp, np.int32)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:
            cur = row
        elif kind == 2:
            cur = (row + prev) & 0xFF
        else:  # Sub, Average, Paeth: each byte depends on the one to its left
            cur = row.copy()
            for i in range(len(cur)):
                left = cur[i - bpp] if i >= bpp else 0
                up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
                if kind == 1:
                    pred = left
                elif kind == 3:
                    pred = (left + up) >> 1
                else:
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                cur[i] = (cur[i] + pred) & 0xFF
        out[y], prev = cur, cur
    return out.reshape(height, width, bpp)[:, :, :3].astype(np.uint8)


def test_timeline_page_draws_the_job_and_marks_the_rank_that_never_joined(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("C10D_REQUIRE_PEERS") == "1":
            pytest.fail("chromium is missing (scripts/install-deps.sh installs it)")
        pytest.skip("needs chromium")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    results = harness.run(
        "trace_hang",
        2,
        "gloo",
        timeout=60,
        env={"C10D_TEST_PG_TIMEOUT": "3", "C10D_TRACE_DUMP_DIR": str(dumps)},
    )
    harness.check_all_ok(results)
    page, events = tmp_path / "job.html", tmp_path / "job.json"
    result = subprocess.run(
        [sys.executable, "-m", "c10d.trace", str(dumps), "--html", str(page)]
        + ["--chrome-trace", str(events)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # a problem was found

    # The Trace Event file: rank 0's all_reduce failed, rank 1 is marked as never joining it.
    trace_events = json.loads(events.read_text())["traceEvents"]
    failed = [e for e in trace_events if e["ph"] == "X" and e["args"]["state"] == "failed"]
    assert [(e["pid"], e["name"].split()[0]) for e in failed] == [(0, "allreduce")], failed
    never = [e for e in trace_events if e["ph"] == "i"]
    assert [(e["pid"], e["name"].split(":")[0]) for e in never] == [(1, "never joined")], never
    assert any(e["args"].get("last to start") for e in trace_events if e["ph"] == "X")

    # In a real browser: the script draws a lane per rank and group, and rank 1's lane on the
    # group that stopped is marked.
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        browser + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert 'data-drawn="' in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
    lanes = re.findall(
        r'<g class="lane" data-rank="(\d+)" data-group="([^"]+)"[^>]*'
        r'data-missing="(\d)"',
        dom.stdout,
    )
    assert ("0", "0", "0") in lanes and ("1", "0", "1") in lanes, lanes
    assert sum(m == "1" for _, _, m in lanes) == 1, lanes
    assert dom.stdout.count('class="op"') >= 5, dom.stdout[-2000:]

    # The screenshot shows it: one lane's band in the "missing" pink, and a failed (red) bar.
    shot = tmp_path / "job.png"
    subprocess.run(
        browser + ["--window-size=1300,500", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    pixels = _png_rgb(shot)
    pink = np.all(pixels == (0xFF, 0xC2, 0xD1), axis=2)
    red = np.all(pixels == (0xD6, 0x27, 0x28), axis=2)
    rows = np.nonzero(pink.sum(axis=1) > 200)[0]  # the band (the legend's swatch is 12 px wide)
    assert len(rows) > 0, "no lane drawn as missing"
    assert rows.max() - rows.min() < 28, rows  # exactly one lane (28 px each)
    assert red.sum(axis=1).max() > 20, "no failed operation drawn"
