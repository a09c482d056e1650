"""Building c10d where a library it needs is missing stops with a message that names the
library, its Debian package and scripts/install-deps.sh (pip shows CMake's output)."""

import shutil
import subprocess

import pytest

from dist import harness


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
@pytest.mark.parametrize(
    "hidden, package",
    [("Gloo", "libgloo-dev"), ("nlohmann_json", "nlohmann-json3-dev")],
)
def test_a_missing_library_names_the_package_and_install_deps(tmp_path, hidden, package):
    p = subprocess.run(
        [
            "cmake",
            "-S",
            harness.REPO,
            "-B",
            str(tmp_path),
            "-DC10D_BUILD_TESTS=OFF",
            "-DC10D_BUILD_PYTHON=OFF",
            "-DC10D_BUILD_BENCH=OFF",
            f"-DCMAKE_DISABLE_FIND_PACKAGE_{hidden}=ON",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0, p.stdout
    message = " ".join(p.stderr.split())
    assert "scripts/install-deps.sh" in message and f"apt install {package}" in message, message
