"""c10d as pip installs it: the wheel `make test` builds (C10D_WHEELS), installed into the
project venv and into a fresh venv with numpy 1.26, used from outside the source tree, with
the launcher as the console script c10drun."""

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from dist import harness

WHEELS = os.environ.get("C10D_WHEELS")
pytestmark = pytest.mark.skipif(
    not WHEELS, reason="needs the wheel `make test` builds (C10D_WHEELS=<dir>)"
)

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import c10d as dist
    assert "torch" not in sys.modules, "importing c10d imported torch"
    dist.init_process_group("shm")
    rank = dist.get_rank()
    for group in (None, dist.new_group(backend="gloo")):
        x = np.arange(1000, dtype=np.float32) * (rank + 1)
        dist.all_reduce(x, group=group)
        assert (x == np.arange(1000, dtype=np.float32) * 3).all(), (group, x[:4])
    dist.destroy_process_group()
    print(f"rank {rank}: ok", dist.__file__, np.__version__)
""")


def clean_env():
    """The environment without the in-tree package on the path."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def run_installed(python, tmp_path):
    """Runs PROGRAM on 2 ranks with the c10drun next to `python`, from outside the tree."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    launcher = os.path.join(os.path.dirname(python), "c10drun")
    assert os.access(launcher, os.X_OK), f"no console script {launcher}"
    p = subprocess.run(
        [launcher, "--nproc-per-node", "2", str(script)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if ": ok" in line]
    assert len(lines) == 2, p.stdout + p.stderr
    for line in lines:
        assert os.path.join(harness.REPO, "python") not in line, line  # the installed copy
    return lines


def test_project_venv_has_the_wheel_with_numpy_2(tmp_path):
    lines = run_installed(sys.executable, tmp_path)
    assert all(line.split()[-1].startswith("2.") for line in lines), lines


def test_wheel_installs_into_a_fresh_venv_with_numpy_1_26(tmp_path):
    wheels = glob.glob(os.path.join(WHEELS, "c10d-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    p = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "numpy==1.26.4",
            wheels[0],
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = run_installed(python, tmp_path)
    assert all(line.split()[-1] == "1.26.4" for line in lines), lines
