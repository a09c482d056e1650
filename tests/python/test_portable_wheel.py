"""The portable wheel (`make wheel-portable`) where c10d was never built: a bare Debian root
file system made by debootstrap (python3 and nothing of the -dev packages or Open MPI), in
which pip installs the wheel and a 2-rank shm and gloo all_reduce and torch's plugin run;
`init_process_group("mpi")` there says what is missing. On this host, the same wheel's "mpi"
backend runs under mpirun. The tag is the one `auditwheel show` reports."""

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from dist import harness

WHEELS = os.environ.get("C10D_PORTABLE_WHEELS")
ROOTFS = os.environ.get("C10D_ROOTFS")
pytestmark = pytest.mark.skipif(
    not WHEELS or not ROOTFS,
    reason="part of `make test` (C10D_PORTABLE_WHEELS, C10D_ROOTFS): needs the portable wheel",
)

# manylinux_2_35: glibc 2.34 symbols and GCC 12's libstdc++ (GLIBCXX_3.4.30), which Debian
# 12's toolchain and its Gloo and cpp-httplib builds need (docs/packaging.md).
TAG = "manylinux_2_35_x86_64"

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import c10d as dist
    backend = sys.argv[1]
    dist.init_process_group(backend)
    rank = dist.get_rank()
    x = np.arange(1000, dtype=np.float32) * (rank + 1)
    dist.all_reduce(x)
    assert (x == np.arange(1000, dtype=np.float32) * 3).all(), x[:4]
    dist.destroy_process_group()
    print(f"rank {rank}: ok {backend} {dist.__file__}")
""")

TORCH_PROGRAM = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    import c10d.torch_backend
    dist.init_process_group("c10d_gloo")
    rank = dist.get_rank()
    t = torch.ones(8) * (rank + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 8, t
    dist.destroy_process_group()
    print(f"rank {rank}: ok torch")
""")

NO_MPI = textwrap.dedent("""
    import c10d
    assert not c10d.is_mpi_available()
    try:
        c10d.init_process_group("mpi")
    except RuntimeError as e:
        print("refused:", e)
    else:
        raise SystemExit("init_process_group('mpi') worked without an MPI library")
""")


def portable_wheel():
    found = glob.glob(os.path.join(WHEELS, "c10d-*.whl"))
    assert len(found) == 1, found
    return found[0]


def run(args, timeout=600, **kwargs):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert p.returncode == 0, f"{args}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def test_auditwheel_reports_the_manylinux_tag():
    wheel = portable_wheel()
    assert os.path.basename(wheel).endswith(f"-{TAG}.whl"), wheel
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    shown = " ".join(run([sys.executable, "-m", "auditwheel", "show", wheel], env=env).split())
    assert f'consistent with the following platform tag: "{TAG}"' in shown, shown
    assert "libmpi" not in shown, shown  # the host's, loaded by c10d._mpi on first use


def test_the_wheels_mpi_backend_runs_under_mpirun(tmp_path):
    if shutil.which("mpirun") is None:
        if os.environ.get("C10D_REQUIRE_PEERS") == "1":
            pytest.fail("mpirun is missing (scripts/install-deps.sh installs Open MPI)")
        pytest.skip("no mpirun")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    python = str(venv / "bin" / "python")
    numpy = harness.pinned("numpy")
    run([python, "-m", "pip", "install", "-q", *numpy, portable_wheel()])
    (tmp_path / "program.py").write_text(PROGRAM)
    launch = ["mpirun", "--oversubscribe", "-np", "2"]
    if os.geteuid() == 0:
        launch.insert(1, "--allow-run-as-root")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run(launch + [python, "program.py", "mpi"], cwd=tmp_path, env=env, timeout=300)
    assert out.count(": ok mpi") == 2 and str(venv) in out, out


class Chroot:
    """The root file system with /proc, /sys, /dev and /dev/shm mounted while in use."""

    # /dev brings /dev/shm, which the shm backend's segments live in.
    MOUNTS = [
        ("proc", "proc", ["-t", "proc"]),
        ("sys", "sys", ["-t", "sysfs"]),
        ("/dev", "dev", ["--rbind"]),
    ]

    def __init__(self, root):
        self.root = root
        self.mounted = []

    def __enter__(self):
        for source, target, how in self.MOUNTS:
            path = os.path.join(self.root, target)
            os.makedirs(path, exist_ok=True)
            run(["mount", *how, source, path])
            self.mounted.append(path)
            if "--rbind" in how:  # unmounting it later must not reach the host's /dev mounts
                run(["mount", "--make-rslave", path])
        return self

    def __exit__(self, *exc):
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-R", "-l", path], capture_output=True)

    def run(self, command, timeout=900):
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # found on this side's PATH
        return run(
            [chroot, self.root, "bash", "-euo", "pipefail", "-c", command],
            timeout=timeout,
            env=env,
        )


def bare_root_file_system():
    """A Debian 12 minbase with python3 (made once, kept in C10D_ROOTFS)."""
    done = os.path.join(ROOTFS, ".made")
    if not os.path.exists(done):
        shutil.rmtree(ROOTFS, ignore_errors=True)
        run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv",
                "bookworm",
                ROOTFS,
                "http://deb.debian.org/debian",
            ],
            timeout=1200,
        )
        open(done, "w").close()
    return ROOTFS


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mount need root")
def test_the_wheel_runs_on_a_bare_root_file_system(tmp_path):
    root = bare_root_file_system()
    # What pip installs in there, fetched here (pinned): the wheel, numpy, torch and its
    # dependencies; the root file system has no network configuration of its own.
    inside = "/tmp/c10d-portable"
    work = os.path.join(root, inside.lstrip("/"))
    shutil.rmtree(work, ignore_errors=True)
    wheelhouse = os.path.join(work, "wheels")
    pins = harness.pinned("numpy", "torch")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary=:all:",
            "-d",
            wheelhouse,
            *pins,
        ]
    )
    shutil.copy(portable_wheel(), wheelhouse)
    for name, text in [
        ("program.py", PROGRAM),
        ("torch_program.py", TORCH_PROGRAM),
        ("no_mpi.py", NO_MPI),
    ]:
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    try:
        with Chroot(root) as chroot:
            # Nothing of c10d's build is in there: no Gloo, libuv, cpp-httplib or MPI.
            chroot.run("! ls /usr/lib/x86_64-linux-gnu | grep -E 'libgloo|libuv|httplib|libmpi'")
            chroot.run(
                f"cd {inside} && python3 -m venv venv && venv/bin/pip install -q "
                "--no-index --find-links wheels c10d numpy torch"
            )
            for backend in ("shm", "gloo"):
                out = chroot.run(
                    f"cd {inside} && venv/bin/c10drun --nproc-per-node 2 program.py {backend}",
                    timeout=300,
                )
                assert out.count(f": ok {backend} {inside}/venv/") == 2, out
            out = chroot.run(
                f"cd {inside} && venv/bin/c10drun --nproc-per-node 2 torch_program.py", timeout=300
            )
            assert out.count(": ok torch") == 2, out
            out = chroot.run(f"cd {inside} && venv/bin/python no_mpi.py")
            assert "libmpi.so.40" in out and "apt install libopenmpi3" in out, out
    finally:
        shutil.rmtree(work, ignore_errors=True)
