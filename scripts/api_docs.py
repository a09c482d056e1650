"""Builds the API reference (HTML, pdoc) of c10d and its public modules into a directory;
any warning is an error (make docs, tests/python/test_api_reference.py).

    python scripts/api_docs.py OUT_DIR
"""

import os
import pkgutil
import sys
import warnings
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def public_modules():
    """c10d and its modules whose names have no leading underscore. pdoc walks a spec's own
    submodules, but c10d's __all__ lists names rather than modules, so the modules it does not
    reach from c10d are given one by one."""
    import c10d
    from pdoc import extract

    reached = set(extract.walk_specs(["c10d"]))
    public = (info.name for info in pkgutil.iter_modules(c10d.__path__, "c10d."))
    return ["c10d"] + sorted(
        name for name in public if not name.split(".")[-1].startswith("_") and name not in reached
    )


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    sys.path.insert(0, os.path.join(REPO, "python"))
    warnings.simplefilter("error")
    # Deprecated on purpose: every access warns, as torch's reduce_op does.
    warnings.filterwarnings("ignore", "c10d.reduce_op is deprecated", FutureWarning)
    import pdoc

    pdoc.pdoc(*public_modules(), output_directory=Path(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
