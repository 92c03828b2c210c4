"""The Markdown and JSON reports of ``train_sparse.py`` (split from it): tables per dataset and K, ratio summaries,
machine information, atomic writes of ``<out>.md`` and ``<out>.json``."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

from _bench_data import load_average, write_text_atomic
from _machine import stamp, stamp_md
from _train_sparse_methods import REFERENCE_METHOD, method_family

# --------------------------------------------------------------------------- reporting


def one_line(text, width=150):
    """First line of a message, safe inside a markdown table cell."""
    line = str(text).strip().splitlines()[0] if text else ""
    line = line.replace("|", "/")
    return line if len(line) <= width else line[: width - 3] + "..."


def fmt(value, spec=".3g", none="-"):
    if value is None:
        return none
    return format(value, spec)


def cap_note(r):
    if not r.get("cap_iter"):
        return ""
    if not r.get("capped"):
        return f"cap {r['cap_iter']} not reached"
    if r.get("extrapolated_s") is None:
        return f"capped at {r['cap_iter']} it; no {REFERENCE_METHOD} run to extrapolate to"
    return (f"capped at {r['cap_iter']} iterations, time extrapolated to the converged iteration count of "
            f"{REFERENCE_METHOD} ({r['extrapolated_to_iter']} it): {r['extrapolated_s']:.1f} s; inertia and "
            f"labels are after {r['cap_iter']} iterations (not converged)")


def format_table(name, k, info, rows, summary):
    shape = f"{info['n_samples']} x {info['n_features']}"
    dens = f", density {info['density']:.2e}" if info.get("sparse") else ", dense"
    lines = [f"### {name}, K = {k} ({shape}{dens})", "",
             "| method | fit wall s | CPU s | iters | s/iter | inertia (recomputed) | rel. vs "
             f"{REFERENCE_METHOD} | labels != {REFERENCE_METHOD} | peak MB | t / qkm-best | capped / extrapolated |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['method']} | {r['status']}: {one_line(r.get('reason'))} | | | | | | | | | |")
            continue
        iters = f"{r['n_iter']}" + ("*" if method_family(r["method"]) == "sparsekmeans" else "")
        ratio = r.get("time_over_qkm_best")
        ratio_s = ("~" if r.get("extrapolated_s") else "") + fmt(ratio, ".2f") if ratio else "n/a"
        lines.append(
            f"| {r['method']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {iters} | {r['s_per_iter']:.3f} | "
            f"{r['inertia']:.6f} | {fmt(r.get('inertia_rel_vs_ref'), '+.2e')} | {fmt(r.get('labels_diff_vs_ref'), 'd')} | "
            f"{r['peak_mb']:.0f} | {ratio_s} | {cap_note(r)} |")
    lines += ["", *summary_lines(summary), ""]
    return "\n".join(lines)


def summary_lines(s):
    if not s["qkm_best"]:
        return ["Ratios: no qkm method ran successfully, so no qkm ratios in this run."]
    out = [f"qkm-best = {s['qkm_best']} ({s['qkm_best_s']:.2f} s). Speed-up of qkm-best (other time / qkm-best "
           "time, > 1 means qkm is faster):"]
    if s.get("speedup_vs_fastest_sklearn"):
        out.append(f"vs fastest scikit-learn ({s['fastest_sklearn']}, {s['fastest_sklearn_s']:.2f} s) "
                   f"**{s['speedup_vs_fastest_sklearn']:.2f}x**;")
    if s.get("speedup_vs_sparsekmeans_lloyd"):
        out.append(f"vs SparseKmeans Lloyd ({s['sparsekmeans_lloyd_s']:.2f} s) "
                   f"**{s['speedup_vs_sparsekmeans_lloyd']:.2f}x**.")
    return [" ".join(out)]


NOTES = """Notes:
- All methods start from the same `kmeans_plusplus(X, K, random_state=0)` centres; max_iter=300, tol=1e-4.
- Each fit runs in a fresh subprocess after one untimed warm-up fit (2 iterations on the first rows).
- inertia = sum of squared distances to the nearest final centre, recomputed by the benchmark (float64).
- peak MB = RSS high-water mark during fit minus RSS before fit (VmHWM reset via /proc/self/clear_refs).
- iters*: SparseKmeans counts assignment steps (one more than its centre updates when it converges).
- t / qkm-best uses the extrapolated time for capped rows (marked ~)."""


def machine_info():
    import psutil  # benchmark-only dependency

    cpu_model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions = {"python": platform.python_version()}
    for pkg in ("numpy", "scipy", "scikit-learn", "numba", "sparsekmeans", "python-graphblas",
                "suitesparse-graphblas", "threadpoolctl", "psutil", "qkm"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpu_model": cpu_model, "logical_cores": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "loadavg_1min_at_start": load_average(),
            "versions": versions}


def write_results(out, meta, sections, all_rows):
    rows = [{k: v for k, v in r.items() if k != "labels_path"} for r in all_rows]
    payload = stamp(dict(meta, rows=rows, summaries=[s["summary"] for s in sections]))
    write_text_atomic(str(out) + ".json", json.dumps(payload, indent=1, default=str) + "\n")
    v = meta["machine"]["versions"]
    md = [f"# train_sparse benchmark ({meta['date']})", "",
          f"Machine: {meta['machine']['cpu_model']}, {meta['machine']['logical_cores']} logical cores, "
          f"{meta['machine']['memory_gb']} GB; threads = {meta['threads']}; 1-min load average at start "
          f"{fmt(meta['machine']['loadavg_1min_at_start'], '.2f')} (per-run values in the JSON).",
          "Versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]), "",
          "Rerun:", "", "```", meta["rerun"], "```", "", *[s["table"] for s in sections], NOTES, ""]
    write_text_atomic(str(out) + ".md", stamp_md("\n".join(md), payload))
