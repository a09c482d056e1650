"""Writes python/c10d/_C.pyi, the type stubs of the compiled module c10d._C, from the module
itself: pybind11-stubgen (pinned in requirements/test.txt) reads its signatures and
docstrings, ruff formats the result. `make stubs` runs it after the bindings change;
`--check` (make test, tests/python/test_stubs.py) fails when the file in the tree is stale.

Run with the interpreter the extension was built for; the tree's python/ goes first on the
path, so it describes the tree's build."""

import argparse
import difflib
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, "python", "c10d", "_C.pyi")
HEADER = "# Generated from c10d._C by scripts/gen_stubs.py (`make stubs`): do not edit by hand.\n"


def generate() -> str:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "python")}
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "pybind11_stubgen", "--exit-code", "-o", out, "c10d._C"],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        )
        path = os.path.join(out, "c10d", "_C.pyi")
        subprocess.run(
            [sys.executable, "-m", "ruff", "format", "-q", "--config", "pyproject.toml", path],
            check=True,
            cwd=REPO,
        )
        with open(path) as f:
            return HEADER + f.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    try:
        stubs = generate()
    except subprocess.CalledProcessError as e:
        print(f"gen_stubs: {' '.join(e.cmd[:3])} failed:\n{e.stdout or ''}{e.stderr or ''}")
        return 1
    if not args.check:
        with open(TARGET, "w") as f:
            f.write(stubs)
        return 0
    with open(TARGET) as f:
        current = f.read()
    if current == stubs:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(True), stubs.splitlines(True), "python/c10d/_C.pyi", "generated"
    )
    sys.stdout.writelines(list(diff)[:80])
    print("\npython/c10d/_C.pyi is stale: run `make stubs` and commit it")
    return 1


if __name__ == "__main__":
    sys.exit(main())
