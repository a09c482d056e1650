"""python/c10d/_C.pyi is what scripts/gen_stubs.py generates from the built module: a binding
changed without `make stubs` fails here."""

import os
import subprocess
import sys

import pytest

from dist import harness


def test_the_stubs_of_the_compiled_module_are_current():
    if os.environ.get("C10D_REQUIRE_PEERS") != "1":
        pytest.importorskip("pybind11_stubgen")
    p = subprocess.run(
        [sys.executable, os.path.join(harness.REPO, "scripts", "gen_stubs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
