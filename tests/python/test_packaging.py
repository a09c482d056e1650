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
    # One write: with PYTHONUNBUFFERED, print's pieces go out one by one and the ranks' lines
    # would interleave.
    sys.stdout.write(f"rank {rank}: ok {dist.__file__} {np.__version__}\\n")
""")


def clean_env():
    """The environment without the in-tree package on the path."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def run_clean(args, cwd=None, timeout=300):
    """Runs `args` without the in-tree package on the path; fails the test on a non-zero exit."""
    p = subprocess.run(
        args, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def run_installed(python, tmp_path):
    """Runs PROGRAM on 2 ranks with the c10drun next to `python`, from outside the tree."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    launcher = os.path.join(os.path.dirname(python), "c10drun")
    assert os.access(launcher, os.X_OK), f"no console script {launcher}"
    p = run_clean([launcher, "--nproc-per-node", "2", str(script)], cwd=tmp_path)
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


def test_editable_install_uses_the_trees_python_files(tmp_path):
    # `pip install -e .` with the project's pinned build tools, as a developer would: the
    # package's Python files must be the tree's own (an edit is seen at the next import), the
    # extension the one pip built, and the launcher must run from outside the tree.
    # The new venv sees the project venv's packages (numpy, pybind11, scikit-build-core)
    # behind its own, so pip builds where `make wheel` did (build-wheel/) with the same numpy
    # headers: only what changed is compiled again.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    project = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p))
    with open(os.path.join(site, "project_venv.pth"), "w") as f:
        f.write(project + "\n")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run_clean(pip + ["--no-build-isolation", "--no-deps", "-e", harness.REPO], timeout=1200)
    probe = (
        "import c10d, c10d.futures, c10d._C; print(c10d.futures.__file__); print(c10d._C.__file__)"
    )
    module, extension = run_clean([python, "-c", probe], cwd=tmp_path).stdout.split()
    assert module == os.path.join(harness.REPO, "python", "c10d", "futures.py"), module
    assert extension.startswith(str(venv)), extension  # not the tree's `make` build
    launcher = os.path.join(os.path.dirname(python), "c10drun")
    p = run_clean([launcher, "--help"], timeout=120)
    assert "--nproc-per-node" in p.stdout, p.stdout
