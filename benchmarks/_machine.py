"""What machine a benchmark ran on (shared by the benchmark scripts, which run from this folder)."""

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
