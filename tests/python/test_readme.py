"""Every shell and Python sample of README.md, run as written, in the order a reader meets
them, in one scratch directory: install c10d with pip into a fresh venv, run the example
program under the launcher (one node, then two launchers meeting at a rendezvous endpoint),
under mpirun, and torch's two-liner. A sample no runner knows fails the test, so that a new
one gets a runner (or a stated reason) when it is written."""

import os
import re
import socket
import subprocess
import sys

import pytest

from dist import harness

README = os.path.join(harness.REPO, "README.md")
WHEELS = os.environ.get("C10D_WHEELS")

# Samples not run here, by their first line, with where they are tried instead.
NOT_RUN = {
    "make run": "the project's own commands: .ci/run runs `make test`, and `make run` is the "
    "benchmark (minutes, timings are not assertions)",
}


def samples():
    """(language, text, line number) of README's fenced sh and python blocks, in order."""
    with open(README) as f:
        lines = f.read().splitlines()
    found, block, lang, start = [], None, None, 0
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and block is None:
            block, lang, start = [], fence.group(1), number + 1
        elif fence:
            if lang in ("sh", "python"):
                found.append((lang, "\n".join(block) + "\n", start))
            block = None
        elif block is not None:
            block.append(line)
    return found


def first_line(text):
    """A sample's first command: its first line that is not a comment, without its comment."""
    lines = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    return lines[0].split("#")[0].strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Reader:
    """Runs the samples in a scratch directory, keeping what they leave there (the venv `v`,
    train.py) for the ones after them."""

    def __init__(self, scratch):
        self.dir = scratch
        # The samples that use the venv pip makes see nothing of the tree; those run with the
        # project venv (the import line, torch's two-liner) see c10d as the tests do.
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.project_env = {**os.environ, "PYTHONPATH": os.path.join(harness.REPO, "python")}
        self.program = None  # the example train.py, once read
        self.deferred = []  # samples that run train.py, met before it

    def sh(self, text, where, timeout=600, env=None):
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", text],
            cwd=self.dir,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert p.returncode == 0, (
            f"README line {where}:\n{text}\n{p.stdout[-3000:]}{p.stderr[-5000:]}"
        )
        return p.stdout

    def activated(self):
        """The environment with the venv `v` first on PATH, as `. v/bin/activate` leaves it."""
        venv = os.path.join(self.dir, "v")
        assert os.path.isdir(venv), "the install sample (python3 -m venv v ...) did not run first"
        return {**self.env, "PATH": f"{venv}/bin:{self.env['PATH']}", "VIRTUAL_ENV": venv}

    def write_program(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    # The runners, by sample.

    def python_snippet(self, text, where):
        p = subprocess.run(
            [sys.executable, "-c", text],
            cwd=self.dir,
            env=self.project_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, f"README line {where}:\n{text}\n{p.stderr}"

    def install(self, text, where):
        # `.` is the source tree: the sample runs beside it.
        self.sh(
            re.sub(r"pip install \.(\s|$)", rf"pip install {harness.REPO}\1", text), where, 1800
        )

    def example_program(self, text, where):
        self.program = text
        self.write_program("train.py", text)
        for runner, sample, at in self.deferred:  # README shows the command first
            runner(self, sample, at)
        self.deferred = []

    def launch(self, text, where):
        if self.program is None:
            self.deferred.append((Reader.launch, text, where))
            return
        self.sh(text, where, 300, env=self.activated())

    def launch_on_nodes(self, text, where):
        # Every "machine" is this one: the endpoint becomes a free local port, and the two
        # launchers the sample starts (one per node) run side by side.
        text = re.sub(r"--rdzv-endpoint \S+", f"--rdzv-endpoint 127.0.0.1:{free_port()}", text)
        command = " ".join(
            line.rstrip("\\").strip() for line in text.splitlines() if not line.startswith("#")
        )
        self.sh(f"{command} & first=$!; {command}; wait $first", where, 300, env=self.activated())

    def torch_two_liner(self, text, where):
        harness.require_peer("torch")
        self.write_program("torch_program.py", text)
        launcher = f"{sys.executable} -m c10d.run --nproc-per-node 2"
        self.sh(f"{launcher} torch_program.py", where, 300, env=self.project_env)

    def mpirun(self, text, where):
        if not harness.mpi_available():
            if os.environ.get("C10D_REQUIRE_PEERS") == "1":
                pytest.fail("mpirun or c10d's MPI backend is missing")
            return
        # The script of the section: the example program on the "mpi" backend; `.venv` is the
        # venv the install sample made.
        self.write_program("train.py", self.program.replace('"gloo"', '"mpi"'))
        link = os.path.join(self.dir, ".venv")
        if not os.path.exists(link):
            os.symlink(os.path.join(self.dir, "v"), link)
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        # As root, plain mpirun refuses to start: the sample's second line is for that case.
        as_root = os.geteuid() == 0
        line = next(l for l in lines if ("--allow-run-as-root" in l) == as_root)
        self.sh(line.split("#")[0], where, 300)


RUNNERS = {
    "import c10d as dist": Reader.python_snippet,
    "python3 -m venv v && v/bin/pip install .": Reader.install,
    ". v/bin/activate": Reader.launch,
    "import numpy as np": Reader.example_program,
    "python3 -m c10d.run --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\": (
        Reader.launch_on_nodes
    ),
    "import torch": Reader.torch_two_liner,
    "mpirun -np 4 .venv/bin/python train.py": Reader.mpirun,
}


@pytest.mark.skipif(not WHEELS, reason="part of `make test` (C10D_WHEELS=<dir>): pip builds c10d")
def test_every_readme_sample_runs_as_written(tmp_path):
    reader = Reader(str(tmp_path))
    found = samples()
    assert len(found) >= len(RUNNERS), found
    ran = []
    for lang, text, where in found:
        key = first_line(text)
        if key in NOT_RUN:
            continue
        runner = RUNNERS.get(key)
        assert runner is not None, (
            f"README line {where}: a {lang} sample no runner knows ({key!r}); give it one in "
            "tests/python/test_readme.py, or a reason in NOT_RUN"
        )
        runner(reader, text, where)
        ran.append(key)
    assert sorted(ran) == sorted(RUNNERS), f"samples gone from README: {set(RUNNERS) - set(ran)}"
    assert not reader.deferred, "README lost the example program the launcher samples run"
