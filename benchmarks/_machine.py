"""What machine a benchmark ran on (shared by the benchmark scripts, which run from this folder)."""

import os
import platform


def cpu_name():
    """The CPU model from ``/proc/cpuinfo``, else what ``platform`` knows, else "unknown"."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pin_threads(argv):
    """Set the BLAS / OpenMP / numba thread counts from ``--threads N`` in ``argv`` (default 1); call it before
    numpy is imported."""
    threads = "1"
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = threads
