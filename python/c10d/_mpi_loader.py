"""The MPI backend's module, c10d._mpi, imported on first use.

It is apart from c10d._C, and linked with no MPI library, so that c10d imports and runs its
other backends on hosts without one. Its MPI symbols are the host's: before importing it,
this loads the MPI library of the `mpirun` on PATH (its ../lib), else the one the dynamic
loader finds (LD_LIBRARY_PATH, the system's), with RTLD_GLOBAL, which Open MPI also needs for
the components it loads itself.
"""

import ctypes
import importlib
import importlib.util
import os
import shutil
from typing import List, Optional

# Debian/Ubuntu's package of Open MPI 4's libmpi.so.40, which the module is built against.
_WHAT_TO_INSTALL = (
    "Open MPI 4's libmpi.so.40 (Debian/Ubuntu: apt install libopenmpi3 openmpi-bin; "
    "RHEL/Fedora: dnf install openmpi, then `module load mpi`)"
)

_LIBRARY = "libmpi.so.40"  # Open MPI 4's, which c10d._mpi is compiled against

_module = None
_error: Optional[str] = None


def _library_candidates() -> List[str]:
    found = []
    for launcher in ("mpirun", "mpiexec"):
        path = shutil.which(launcher)
        if path:
            lib = os.path.join(os.path.dirname(os.path.realpath(path)), os.pardir, "lib")
            found.append(os.path.join(os.path.normpath(lib), _LIBRARY))
    return [c for c in found if os.path.exists(c)] + [_LIBRARY]


def _load_library() -> None:
    """Loads the host's MPI library into the global namespace; OSError when there is none."""
    errors = []
    for candidate in _library_candidates():
        try:
            ctypes.CDLL(candidate, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            return
        except OSError as e:
            errors.append(str(e))
    raise OSError("; ".join(errors))


def module():
    """c10d._mpi, or None when it cannot be loaded (`why_unavailable()` says why)."""
    global _module, _error
    if _module is None and _error is None:
        if importlib.util.find_spec("c10d._mpi") is None:
            _error = "this build of c10d has no MPI backend (it was built without an MPI library)"
            return None
        try:
            _load_library()
            _module = importlib.import_module("c10d._mpi")
        except (OSError, ImportError) as e:  # no MPI library, or one c10d._mpi cannot use
            _error = f"c10d's MPI backend needs {_WHAT_TO_INSTALL}; loading it failed: {e}"
    return _module


def why_unavailable() -> Optional[str]:
    module()
    return _error


def process_group_class():
    """ProcessGroupMPI; raises RuntimeError naming what is missing when MPI cannot be used."""
    loaded = module()
    if loaded is None:
        raise RuntimeError(f"Backend mpi is not available: {_error}")
    return loaded.ProcessGroupMPI
