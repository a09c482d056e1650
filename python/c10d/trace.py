"""Reads the flight-recorder dumps of every rank and says what went wrong.

    python -m c10d.trace DIR [--job JOB] [--verbose] [--html OUT.html] [--chrome-trace OUT.json]

Each rank writes ``c10d_trace_<job>_rank<rank>.json`` into ``C10D_TRACE_DUMP_DIR`` when one of its
operations fails with a backend error (and asks the others, through the store, to do the
same), on SIGUSR1, or when ``c10d._dump_trace_to_file()`` is called. ``<job>`` is the
launcher's run id (TORCHELASTIC_RUN_ID) or a name rank 0 made up at init_process_group, the
same on every rank of a job. The dumps of one job are read together, never those of two: a
directory holding several jobs' dumps needs ``--job``. This command compares the dumps group by
group:

- collectives are matched by their per-group sequence number, which every member assigns in
  the same order: the first one not completed by every member is the suspect. Members that
  never issued it "never joined"; what each of them was doing instead is its operation still
  in flight (or nothing, when it was busy outside c10d);
- members that issued it must agree on the operation and on the sizes and dtypes of their
  tensors; a difference is a desync;
- point-to-point receives still waiting are matched against the peer's sends.

``--html`` draws the job on one timeline in a page that needs nothing but a browser: a lane
per rank and group, every recorded operation as a bar (completed, failed, in flight), the
rank that started each collective last (the others waited for it) marked, and the ranks that
never joined the collective a group stopped at, or left no dump, marked in red.
``--chrome-trace`` writes the same in the Trace Event format that chrome://tracing and
Perfetto (ui.perfetto.dev) open. Times are the ranks' wall clocks (one host, or hosts kept
in step by NTP).

Exit status: 0 when nothing is wrong, 1 when a problem was found, 2 when there is nothing to
read.
"""

import argparse
import glob
import html
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

SUPPORTED_MAJOR = "1"
DONE = ("completed",)
ACTIVE = ("scheduled", "started")


@dataclass
class Dump:
    rank: int
    path: str
    data: dict

    @property
    def timestamp_ns(self) -> int:
        return int(self.data.get("timestamp_ns") or 0)


@dataclass
class GroupView:
    """One group as one rank saw it: its record and its entries, split by kind."""

    info: dict
    collectives: Dict[int, dict] = field(default_factory=dict)  # seq -> entry
    p2p: List[dict] = field(default_factory=list)


def load_dumps(directory: str, job: Optional[str] = None) -> Tuple[Dict[int, Dump], List[str]]:
    """The dumps of one job in `directory` by rank (of `job`, or of the only job there; a
    ValueError names the jobs when there are several), and warnings about files skipped."""
    dumps: Dict[int, Dump] = {}
    warnings: List[str] = []
    by_job: Dict[str, List[str]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "c10d_trace_*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            warnings.append(f"{os.path.basename(path)}: unreadable ({e})")
            continue
        version = str(data.get("version", ""))
        if version.split(".")[0] != SUPPORTED_MAJOR:
            warnings.append(
                f"{os.path.basename(path)}: format version {version!r} is not "
                f"supported (expected {SUPPORTED_MAJOR}.x)"
            )
            continue
        dump_job = str(data.get("job") or "")
        by_job.setdefault(dump_job, []).append(os.path.basename(path))
        if job is not None and dump_job != job:
            continue
        rank = data.get("rank")
        if not isinstance(rank, int) or rank < 0:
            m = re.search(r"rank(\d+)", os.path.basename(path))
            if not m:
                warnings.append(f"{os.path.basename(path)}: no rank, skipped")
                continue
            rank = int(m.group(1))
        if rank in dumps:
            warnings.append(f"{os.path.basename(path)}: a second dump of rank {rank}, skipped")
            continue
        dumps[rank] = Dump(rank, path, data)
    if job is None and len(by_job) > 1:
        listed = "; ".join(
            f"job {name or '(unnamed)'}: {', '.join(files)}"
            for name, files in sorted(by_job.items())
        )
        raise ValueError(
            f"{directory} holds the dumps of {len(by_job)} jobs, which must not be read "
            f"together ({listed}): choose one with --job"
        )
    return dumps, warnings


def group_views(dump: Dump) -> Dict[str, GroupView]:
    """Groups by name; a name reused after destroy_process_group keeps its newest group."""
    newest: Dict[str, dict] = {}
    for g in dump.data.get("groups", []):
        name = g.get("name", "")
        if name not in newest or g.get("uid", 0) > newest[name].get("uid", 0):
            newest[name] = g
    views = {name: GroupView(info) for name, info in newest.items()}
    uid_to_name = {g["uid"]: name for name, g in newest.items()}
    for e in dump.data.get("entries", []):
        name = uid_to_name.get(e.get("group_uid"))
        if name is None:
            continue
        if e.get("p2p"):
            views[name].p2p.append(e)
        else:
            views[name].collectives[int(e["seq"])] = e
    return views


def ranks_text(ranks: List[int]) -> str:
    return ",".join(str(r) for r in ranks)


def tensors_text(sizes: List[List[int]], dtypes: List[str]) -> str:
    if not sizes:
        return "-"
    parts = [f"{d}[{', '.join(str(s) for s in shape)}]" for shape, d in zip(sizes, dtypes)]
    if len(parts) > 3:
        parts = parts[:2] + [f"... ({len(parts)} tensors)"]
    return ", ".join(parts)


def seconds(ns: Optional[int]) -> str:
    return "?" if ns is None else f"{ns / 1e9:.1f} s"


def describe_entry(
    e: dict, group_label: str, dump: Optional[Dump] = None, with_error: bool = True
) -> str:
    kind = "p2p seq" if e.get("p2p") else "seq"
    text = f"{e['op']} {kind} {e['seq']} on {group_label}"
    if e.get("p2p") and e.get("peer") is not None:
        peer = e.get("peer_global", e["peer"])
        text += (" from" if e["op"].startswith("recv") else " to") + f" rank {peer}"
    state = e.get("state")
    if state in ACTIVE and dump is not None:
        since = e.get("time_started_ns") or e.get("time_enqueued_ns")
        if since:
            text += f" ({state} {seconds(dump.timestamp_ns - since)} before the dump)"
    elif state == "failed":
        text += f" (failed: {e.get('error')})" if with_error else " (failed)"
    else:
        text += f" ({state})"
    return text


class Analysis:
    def __init__(self, dumps: Dict[int, Dump]):
        self.dumps = dumps
        self.views = {rank: group_views(d) for rank, d in dumps.items()}
        self.problems: List[List[str]] = []  # each: headline, then detail lines
        # Where a group stopped: (group, seq, op, ranks that never joined, ranks without a dump).
        self.stopped: List[Tuple[str, int, str, List[int], List[int]]] = []

    # -- groups ---------------------------------------------------------------------------
    def group_members(self, name: str) -> List[int]:
        for views in self.views.values():
            if name in views and views[name].info.get("ranks") is not None:
                return list(views[name].info["ranks"])
        # Unknown global ranks: the ranks that have the group.
        return sorted(r for r, views in self.views.items() if name in views)

    def group_label(self, name: str) -> str:
        return f"group {name} [ranks {ranks_text(self.group_members(name))}]"

    def all_group_names(self) -> List[str]:
        names = {name for views in self.views.values() for name in views}

        def key(n: str):
            return (0, int(n), "") if n.isdigit() else (1, 0, n)

        return sorted(names, key=key)

    # -- what a rank is doing ---------------------------------------------------------------
    def in_flight(self, rank: int) -> List[Tuple[str, dict]]:
        out = []
        for name, view in self.views[rank].items():
            for e in list(view.collectives.values()) + view.p2p:
                if e.get("state") in ACTIVE:
                    out.append((name, e))
        out.sort(key=lambda item: item[1].get("id", 0))
        return out

    def doing(self, rank: int) -> str:
        if rank not in self.dumps:
            return f"rank {rank} left no dump (dead, or it never saw the dump request)"
        active = self.in_flight(rank)
        if active:
            name, e = active[0]
            text = f"rank {rank} is stuck in " + describe_entry(
                e, self.group_label(name), self.dumps[rank]
            )
            if len(active) > 1:
                text += f" (+{len(active) - 1} more in flight)"
            return text
        last = None
        for name, view in self.views[rank].items():
            for e in list(view.collectives.values()) + view.p2p:
                if last is None or e.get("id", 0) > last[1].get("id", 0):
                    last = (name, e)
        if last is None:
            return f"rank {rank} has no c10d operation in flight (and none recorded)"
        return (
            f"rank {rank} has no c10d operation in flight (busy elsewhere?); its last was "
            + describe_entry(last[1], self.group_label(last[0]), with_error=False)
        )

    # -- collectives ------------------------------------------------------------------------
    def check_collectives(self, name: str) -> None:
        members = self.group_members(name)
        present = [r for r in members if r in self.dumps and name in self.views[r]]
        if not present:
            return
        views = {r: self.views[r][name] for r in present}
        enqueued = {r: int(v.info.get("last_enqueued_seq", 0)) for r, v in views.items()}

        def first_unfinished(r: int) -> int:
            pending = [s for s, e in views[r].collectives.items() if e.get("state") not in DONE]
            return min(pending) if pending else enqueued[r] + 1

        seq = min(first_unfinished(r) for r in present)
        # Desyncs before the suspect: operations that completed but disagree.
        for s in sorted({s for v in views.values() for s in v.collectives if s < seq}):
            if self.report_mismatch(name, s, views):
                return
        if seq > max(enqueued.values()):
            return  # everyone finished everything they issued
        joined = [r for r in present if enqueued[r] >= seq]
        never = [r for r in present if enqueued[r] < seq]
        no_dump = [r for r in members if r not in present]
        sample = next(
            (views[r].collectives[seq] for r in joined if seq in views[r].collectives), None
        )
        op = sample["op"] if sample else "?"
        self.stopped.append((name, seq, op, never, no_dump))
        head = f"collective {seq} ({op}) on {self.group_label(name)}: "
        if never:
            who = "rank" if len(never) == 1 else "ranks"
            head += f"{who} {ranks_text(never)} never joined"
            head += "".join(f"; {self.doing(r)}" for r in never)
        elif no_dump:
            head += f"no dump from rank(s) {ranks_text(no_dump)}"
        else:
            if self.report_mismatch(name, seq, views):
                return
            head += "every rank joined but it did not complete"
        details = []
        for r in joined:
            e = views[r].collectives.get(seq)
            if e is None:
                details.append(f"rank {r}: issued it (record overwritten)")
                continue
            details.append(
                f"rank {r}: {e['op']}({tensors_text(e['input_sizes'], e['input_dtypes'])})"
                f" {self.state_text(e, self.dumps[r])}"
            )
        for r in never:
            last = enqueued[r]
            e = views[r].collectives.get(last)
            what = f"{e['op']}, {e['state']}" if e else "no collective yet" if last == 0 else "?"
            details.append(f"rank {r}: last collective on group {name} is seq {last} ({what})")
        for r in no_dump:
            details.append(self.doing(r))
        self.problems.append([head] + details)
        if len(joined) > 1:
            self.report_mismatch(name, seq, views)

    def state_text(self, e: dict, dump: Dump) -> str:
        state = e.get("state")
        started = e.get("time_started_ns") or e.get("time_enqueued_ns")
        if state == "failed":
            return f"failed after {seconds(e.get('duration_ns'))}: {e.get('error')}"
        if state in ACTIVE:
            return f"{state}, waiting for {seconds(dump.timestamp_ns - started)} at the dump"
        return state

    def report_mismatch(self, name: str, seq: int, views: Dict[int, GroupView]) -> bool:
        calls = {}
        for r, v in views.items():
            e = v.collectives.get(seq)
            if e is not None:
                calls[r] = (
                    e["op"],
                    tensors_text(e["input_sizes"], e["input_dtypes"]),
                    tensors_text(e["output_sizes"], e["output_dtypes"]),
                )
        if len(set(calls.values())) <= 1:
            return False
        lines = [f"collective {seq} on {self.group_label(name)}: ranks disagree on the call"]
        for r, (op, ins, outs) in sorted(calls.items()):
            lines.append(f"rank {r}: {op}(inputs {ins}; outputs {outs})")
        self.problems.append(lines)
        return True

    # -- point to point ---------------------------------------------------------------------
    def check_p2p(self, name: str) -> None:
        members = self.group_members(name)
        for r in members:
            if r not in self.dumps or name not in self.views[r]:
                continue
            for e in self.views[r][name].p2p:
                if e.get("state") not in ACTIVE or e.get("peer") is None:
                    continue
                peer_group_rank = e["peer"]
                peer = members[peer_group_rank] if peer_group_rank < len(members) else None
                me = members.index(r)
                receiving = e["op"].startswith("recv")
                want = "send" if receiving else "recv"
                line = f"rank {r}: " + describe_entry(e, self.group_label(name), self.dumps[r])
                detail = []
                if peer is None or peer not in self.dumps or name not in self.views[peer]:
                    detail.append(f"rank {peer}: no dump")
                else:
                    mine = sum(
                        1
                        for x in self.views[r][name].p2p
                        if x["op"] == e["op"] and x.get("peer") == peer_group_rank
                    )
                    theirs = sum(
                        1
                        for x in self.views[peer][name].p2p
                        if x["op"].startswith(want) and x.get("peer") == me
                    )
                    if theirs < mine:
                        detail.append(
                            f"rank {peer} issued {theirs} {want}(s) to rank {r} on this "
                            f"group against {mine} {e['op']}(s) here; " + self.doing(peer)
                        )
                    else:
                        detail.append(f"rank {peer} issued the matching {want}")
                self.problems.append([line] + detail)

    # -- failures nobody else explains ------------------------------------------------------
    def check_failures(self) -> None:
        if self.problems:
            return
        for r, views in sorted(self.views.items()):
            for name, view in views.items():
                for e in list(view.collectives.values()) + view.p2p:
                    if e.get("state") == "failed":
                        self.problems.append(
                            [f"rank {r}: " + describe_entry(e, self.group_label(name))]
                        )

    def run(self) -> List[List[str]]:
        for name in self.all_group_names():
            self.check_collectives(name)
            self.check_p2p(name)
        self.check_failures()
        return self.problems


# -- the picture ------------------------------------------------------------------------------


def timeline(dumps: Dict[int, Dump], analysis: "Analysis") -> dict:
    """The job on one clock (microseconds from its first recorded operation): a lane per rank
    and group with its operations, the last rank to start each collective, and the ranks
    marked where their group stopped. Run after analysis.run()."""
    entries = [
        (rank, name, e)
        for rank, views in analysis.views.items()
        for name, view in views.items()
        for e in list(view.collectives.values()) + view.p2p
    ]
    starts = [e.get("time_started_ns") or e.get("time_enqueued_ns") for _, _, e in entries]
    origin = min([t for t in starts if t] or [0])

    def us(ns: int) -> float:
        return round((ns - origin) / 1000.0, 3)

    # Per collective, who started it last: the others waited for that rank.
    last: Dict[Tuple[str, int], Tuple[int, int]] = {}
    count: Dict[Tuple[str, int], int] = {}
    for rank, name, e in entries:
        started = e.get("time_started_ns")
        if e.get("p2p") or not started:
            continue
        key = (name, int(e["seq"]))
        count[key] = count.get(key, 0) + 1
        if key not in last or started > last[key][1]:
            last[key] = (rank, started)
    ops = []
    for rank, name, e in entries:
        started = e.get("time_started_ns") or e.get("time_enqueued_ns")
        if not started:
            continue
        ended = e.get("time_completed_ns") or analysis.dumps[rank].timestamp_ns
        key = (name, int(e["seq"]))
        ops.append(
            {
                "rank": rank,
                "group": name,
                "op": e["op"],
                "seq": int(e["seq"]),
                "p2p": bool(e.get("p2p")),
                "state": e.get("state"),
                "start": us(started),
                "end": us(max(ended, started)),
                "inputs": tensors_text(e.get("input_sizes", []), e.get("input_dtypes", [])),
                "error": e.get("error"),
                "last_to_start": not e.get("p2p")
                and count.get(key, 0) > 1
                and last[key][0] == rank,
            }
        )
    lanes = []
    for name in analysis.all_group_names():
        for rank in analysis.group_members(name):
            dump = analysis.dumps.get(rank)
            lanes.append(
                {
                    "rank": rank,
                    "group": name,
                    "label": f"rank {rank} / group {name or '(unnamed)'}",
                    "host": dump.data.get("hostname") if dump else None,
                    "dumped": dump is not None and name in analysis.views[rank],
                }
            )
    missing = []
    for name, seq, op, never, no_dump in analysis.stopped:
        for rank in never:
            missing.append(
                {"rank": rank, "group": name, "seq": seq, "op": op, "why": "never joined"}
            )
        for rank in no_dump:
            missing.append({"rank": rank, "group": name, "seq": seq, "op": op, "why": "no dump"})
    end = max([o["end"] for o in ops] or [0.0])
    return {"lanes": lanes, "ops": ops, "missing": missing, "end_us": end}


def chrome_trace(picture: dict) -> dict:
    """`picture` in the Trace Event format (chrome://tracing, Perfetto): a process per rank, a
    thread per group, complete events for operations, instant events for the missing."""
    events = []
    tids: Dict[str, int] = {}
    for lane in picture["lanes"]:
        tid = tids.setdefault(lane["group"], len(tids) + 1)
        host = f" on {lane['host']}" if lane["host"] else " (no dump)"
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": lane["rank"],
                "args": {"name": f"rank {lane['rank']}{host}"},
            }
        )
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": lane["rank"],
                "tid": tid,
                "args": {"name": f"group {lane['group']}"},
            }
        )
    for o in picture["ops"]:
        args = {"seq": o["seq"], "state": o["state"], "inputs": o["inputs"]}
        if o["error"]:
            args["error"] = o["error"]
        if o["last_to_start"]:
            args["last to start"] = True
        events.append(
            {
                "name": f"{o['op']} #{o['seq']}",
                "cat": "p2p" if o["p2p"] else "collective",
                "ph": "X",
                "ts": o["start"],
                "dur": round(o["end"] - o["start"], 3),
                "pid": o["rank"],
                "tid": tids.get(o["group"], 0),
                "args": args,
            }
        )
    for m in picture["missing"]:
        events.append(
            {
                "name": f"{m['why']}: {m['op']} #{m['seq']}",
                "cat": "missing",
                "ph": "i",
                "s": "t",
                "ts": picture["end_us"],
                "pid": m["rank"],
                "tid": tids.get(m["group"], 0),
                "args": dict(m),
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def html_page(picture: dict, title: str) -> str:
    """A page that draws `picture` (SVG, drawn by its own script: no network needed)."""
    data = json.dumps(picture).replace("</", "<\\/")
    return _PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)


_PAGE = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 13px sans-serif; margin: 16px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
            vertical-align: middle; }
text.missing { fill: #b00020; font-weight: bold; }
</style></head>
<body>
<h2>__TITLE__</h2>
<div class="legend">
<span><i style="background:#4c9a2a"></i>completed</span>
<span><i style="background:#d62728"></i>failed</span>
<span><i style="background:#ff9f1c"></i>in flight at the dump</span>
<span><i style="background:#ffffff;outline:2px solid #000"></i>last rank to start it</span>
<span><i style="background:#ffc2d1"></i>never joined / no dump</span>
</div>
<svg id="timeline" xmlns="http://www.w3.org/2000/svg"></svg>
<script type="application/json" id="c10d-timeline">__DATA__</script>
<script>
(function () {
  var d = JSON.parse(document.getElementById("c10d-timeline").textContent);
  var NS = "http://www.w3.org/2000/svg", svg = document.getElementById("timeline");
  var LEFT = 330, WIDTH = 900, ROW = 28, TOP = 30;
  var span = Math.max(d.end_us, 1) * 1.02;
  var x = function (t) { return LEFT + (t / span) * WIDTH; };
  svg.setAttribute("width", LEFT + WIDTH + 60);
  svg.setAttribute("height", TOP + ROW * d.lanes.length + 10);
  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    (parent || svg).appendChild(e);
    return e;
  }
  for (var i = 0; i <= 5; i++) {
    var t = span * i / 5;
    el("line", {x1: x(t), x2: x(t), y1: TOP - 6, y2: TOP + ROW * d.lanes.length,
                stroke: "#ddd"});
    el("text", {x: x(t), y: TOP - 10, "text-anchor": "middle", fill: "#555"},
       undefined, (t / 1000).toFixed(1) + " ms");
  }
  var laneY = {};
  d.lanes.forEach(function (lane, i) {
    var y = TOP + i * ROW, key = lane.rank + "/" + lane.group;
    laneY[key] = y;
    var missing = d.missing.filter(function (m) {
      return m.rank === lane.rank && m.group === lane.group;
    });
    var g = el("g", {"class": "lane", "data-rank": lane.rank, "data-group": lane.group,
                     "data-y": y, "data-missing": missing.length ? 1 : 0});
    if (missing.length) {
      el("rect", {"class": "missing-band", x: LEFT, y: y + 1, width: WIDTH, height: ROW - 2,
                  fill: "#ffc2d1"}, g);
    }
    var label = lane.label + (lane.host ? " (" + lane.host + ")" : "");
    if (missing.length) {
      label = lane.label + ": " + missing[0].why + " " + missing[0].op + " #" + missing[0].seq;
    }
    el("text", {x: 4, y: y + ROW / 2 + 4, "class": missing.length ? "missing" : ""}, g, label);
  });
  var COLORS = {completed: "#4c9a2a", failed: "#d62728", started: "#ff9f1c",
                scheduled: "#ff9f1c"};
  d.ops.forEach(function (o) {
    var y = laneY[o.rank + "/" + o.group];
    if (y === undefined) return;
    var w = Math.max(x(o.end) - x(o.start), 2);
    var r = el("rect", {"class": "op", x: x(o.start), y: y + 5, width: w, height: ROW - 10,
                        fill: COLORS[o.state] || "#999", "data-op": o.op, "data-seq": o.seq,
                        "data-state": o.state, stroke: o.last_to_start ? "#000" : "none",
                        "stroke-width": 2});
    el("title", {}, r, "rank " + o.rank + " " + o.op + " #" + o.seq + " (" + o.state + ") " +
       o.inputs + (o.error ? "\n" + o.error : "") +
       (o.last_to_start ? "\nlast rank to start it" : ""));
  });
  document.body.setAttribute("data-drawn", d.lanes.length);
})();
</script>
</body></html>
"""


def report(
    directory: str,
    verbose: bool = False,
    out=sys.stdout,
    job: Optional[str] = None,
    html_path: Optional[str] = None,
    chrome_path: Optional[str] = None,
) -> int:
    try:
        dumps, warnings = load_dumps(directory, job)
    except ValueError as e:
        print(f"c10d.trace: {e}", file=out)
        return 2
    if not dumps:
        print(f"c10d.trace: no flight-recorder dumps (c10d_trace_*.json) in {directory}", file=out)
        for w in warnings:
            print(f"  {w}", file=out)
        return 2
    print(
        f"c10d flight recorder: {len(dumps)} dump(s) in {directory} "
        f"(ranks {ranks_text(sorted(dumps))})",
        file=out,
    )
    for rank, d in sorted(dumps.items()):
        print(
            f"  rank {rank}: pid {d.data.get('pid')} on {d.data.get('hostname')}, "
            f"{len(d.data.get('entries', []))} entries; dumped because: "
            f"{d.data.get('reason')}",
            file=out,
        )
    for w in warnings:
        print(f"  warning: {w}", file=out)
    analysis = Analysis(dumps)
    expected = set()
    for name in analysis.all_group_names():
        expected.update(analysis.group_members(name))
    missing = sorted(expected - set(dumps))
    if missing:
        print(f"  no dump from rank(s) {ranks_text(missing)}", file=out)
    problems = analysis.run()
    if html_path or chrome_path:
        picture = timeline(dumps, analysis)
        if html_path:
            with open(html_path, "w") as f:
                f.write(
                    html_page(
                        picture,
                        f"c10d job {next(iter(dumps.values())).data.get('job') or ''}".strip(),
                    )
                )
            print(f"  timeline: {html_path}", file=out)
        if chrome_path:
            with open(chrome_path, "w") as f:
                json.dump(chrome_trace(picture), f)
            print(f"  trace events (chrome://tracing, Perfetto): {chrome_path}", file=out)
    if verbose:
        for rank, d in sorted(dumps.items()):
            for name, view in sorted(analysis.views[rank].items()):
                i = view.info
                print(
                    f"  rank {rank} {analysis.group_label(name)}: seq enqueued "
                    f"{i.get('last_enqueued_seq')} started {i.get('last_started_seq')} "
                    f"completed {i.get('last_completed_seq')}",
                    file=out,
                )
    if not problems:
        print("No problem found: every rank completed every operation it recorded.", file=out)
        return 0
    print(f"\n{len(problems)} problem(s):", file=out)
    for i, lines in enumerate(problems, 1):
        print(f"{i}. {lines[0]}", file=out)
        for line in lines[1:]:
            print(f"   {line}", file=out)
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c10d.trace",
        description="Explain a hang or failure from the flight-recorder dumps of every rank.",
    )
    parser.add_argument(
        "directory", help="where the c10d_trace_*.json files are (C10D_TRACE_DUMP_DIR)"
    )
    parser.add_argument(
        "--job",
        default=None,
        help="read only this job's dumps (the name in their files, c10d_trace_<job>_rank<N>.json); "
        "needed when the directory holds several jobs' (default: the only job there)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print every group's sequence numbers per rank",
    )
    parser.add_argument(
        "--html",
        metavar="OUT.html",
        default=None,
        help="also draw every rank's operations on one timeline in this page (default: none)",
    )
    parser.add_argument(
        "--chrome-trace",
        metavar="OUT.json",
        default=None,
        help="also write the timeline as Trace Event JSON for chrome://tracing or Perfetto "
        "(default: none)",
    )
    args = parser.parse_args(argv)
    return report(
        args.directory,
        args.verbose,
        job=args.job,
        html_path=args.html,
        chrome_path=args.chrome_trace,
    )


if __name__ == "__main__":
    sys.exit(main())
