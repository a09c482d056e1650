"""Entry point of one rank: python -m dist.worker <case> <backend> <init>."""

import os
import sys
import traceback
from datetime import timedelta

import c10d as dist

from . import cases


def main() -> int:
    case, backend, init = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if backend == "mpi":
        # Cases that build their own store read these, which mpirun spells its own way.
        os.environ.setdefault("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        os.environ.setdefault("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    try:
        if init:
            seconds = float(os.environ.get("C10D_TEST_PG_TIMEOUT", "30"))
            dist.init_process_group(backend, timeout=timedelta(seconds=seconds))
        getattr(cases, case)(dist, backend)
        if init and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    print(f"[worker] exit {code}", flush=True)  # mpirun reports no per-rank exit codes
    sys.exit(code)
