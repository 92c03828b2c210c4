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


# -- provenance: the commit and machine every result file records ------------------------------------------------- #
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_provenance = {}


def git_commit(repo=REPO_DIR):
    """``git rev-parse HEAD`` of ``repo``, with ``+dirty`` when ``git status --porcelain`` lists changes outside
    ``benchmarks/results/`` (the results a run writes do not make its code dirty); "unknown (...)" outside git."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unknown ({type(exc).__name__}: not a git checkout or no git)"
    return commit + ("+dirty" if dirty else "")


def machine():
    """CPU model, logical and usable CPUs, OS and the load average now, with a one-line ``description``."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    info = {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "load_average": load}
    info["description"] = (f"{info['cpu']}, {info['logical_cpus']} logical CPUs ({usable} usable), {info['os']}, "
                           f"load average {', '.join(map(str, load)) if load else 'unknown'} (1, 5, 15 min) "
                           f"when the results were written")
    return info


def provenance():
    """``{"commit": ..., "machine": ...}`` of this run (computed once per process, at the first call)."""
    if not _provenance:
        _provenance.update(commit=git_commit(), machine=machine())
    return dict(_provenance)


def stamp(payload, parts=None):
    """The JSON payload of a result with ``commit`` and ``machine`` added when it is a dict (a payload read back
    from a result file keeps the ones it has; a merge of ``parts`` records theirs); anything else is returned as
    it is."""
    if not isinstance(payload, dict):
        return payload
    prov = provenance()
    if parts is not None:
        def unique(key, default):
            seen = []
            for p in parts:
                v = p.get(key, default) if isinstance(p, dict) else default
                v = v.get("description", v) if isinstance(v, dict) else v
                if v not in seen:
                    seen.append(v)
            return " / ".join(map(str, seen))
        prov = {"commit": unique("commit", "unknown (a part that did not record it)"),
                "machine": unique("machine", "unknown (a part that did not record it)")}
    return {**payload, "commit": payload.get("commit", prov["commit"]), "machine": payload.get("machine", prov["machine"])}


def stamp_md(text, payload=None):
    """The Markdown of a result with its commit and machine lines after the title (taken from ``payload`` when
    it has them, e.g. a report rebuilt from a saved JSON, else this run's)."""
    prov = stamp(payload if isinstance(payload, dict) else {})
    desc = prov["machine"]["description"] if isinstance(prov["machine"], dict) else prov["machine"]
    block = [f"Commit: `{prov['commit']}` (the checkout when this file was written).", "", f"Machine: {desc}.", ""]
    lines = text.split("\n")
    at = 1 if lines and lines[0].startswith("#") else 0
    rest = lines[at + 1:] if at and len(lines) > at and not lines[at].strip() else lines[at:]
    return "\n".join(lines[:at] + ([""] if at else []) + block + rest)
