"""QK-means on wide sparse text data against qkm's Elkan k-means from the same seeds.

For each data set and K: scikit-learn's ``kmeans_plusplus(X, K, random_state=0)``
seeds, then ``qkm.KMeans(algorithm="elkan")`` and ``qkm.QKMeans`` (defaults)
from those seeds, each in a fresh subprocess (pinned thread count; numba's
kernels warmed up on a tiny fit first, so compile time is not counted),
repeated ``--repeats`` times, the two methods interleaved. Recorded per run:
fit seconds, peak memory of the fit (VmHWM - VmRSS, the high-water mark reset
before the fit), the objective recomputed by one common float64 function at the
final centres, compression (``K * D / nnz``), the refit paths QK-means ran
(``history_``: step:columns/target[/start][/means=], e.g. ``refit:dense/sparse/means=csr``:
all columns, sparse target, the cluster means kept as CSR: no dense ``K x D`` buffer), and
assignment time through each model's ``predict``: single rows (median over rows) and the
whole data set.

Data sets (``--data-dir``, default ``<repo>/../shared/data``; the loaders and
caches of ``benchmarks/train_sparse.py``): ``20news-tfidf`` (20 Newsgroups
bydate train+test, ``TfidfVectorizer()``, 18,846 x 173,762) and ``news20``
(LIBSVM, 15,935 x 62,061, rows L2-normalised). ``--rows N`` takes a fixed
random subset of N rows (the full sets may be too slow on a busy machine).

Rerun (from the repository root)::

    .venv/bin/python benchmarks/qkmeans_sparse.py --datasets news20,20news-tfidf --k 100 --repeats 3

Results: ``<out>.json`` and ``<out>.md`` (default ``benchmarks/results/qkmeans_sparse``).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "_child":
    os.environ.update({v: sys.argv[3] for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                 "NUMBA_NUM_THREADS")})

import argparse
import json
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import _bench_data as ts  # noqa: E402  (loaders, caches, common objective, memory window)
from _machine import cpu_name, stamp, stamp_md  # noqa: E402

DEFAULT_OUT = BENCH_DIR / "results" / "qkmeans_sparse"
METHODS = ("elkan", "qkmeans")


def _load(spec):
    X = ts.load_array(spec["matrix"])
    C0 = np.load(spec["init"])
    return X, C0


def child(spec_path, threads):
    """Fit one method in this fresh process; print one JSON line."""
    import scipy.sparse as sp

    from qkm import KMeans, QKMeans

    with open(spec_path) as f:
        spec = json.load(f)
    X, C0 = _load(spec)
    K = C0.shape[0]

    def make(init, k, max_iter=None):
        if spec["method"] == "elkan":
            return KMeans(k, init=init, n_init=1, algorithm="elkan", n_jobs=threads,
                          **({} if max_iter is None else {"max_iter": max_iter}))
        return QKMeans(k, init=init, n_jobs=threads, random_state=0,
                       **({} if max_iter is None else {"max_iter": max_iter, "palm_max_iter": 2}))

    make(np.asarray(X[:5].toarray() if sp.issparse(X) else X[:5]), 5, 2).fit(X[:200])  # numba warm-up
    with ts.MemoryWindow() as mem:
        t0 = time.perf_counter()
        model = make(C0, K).fit(X)
        fit_s = time.perf_counter() - t0
    _, objective, _ = ts.assign_and_objective(X, model.cluster_centers_)
    rng = np.random.default_rng(0)
    rows = rng.choice(X.shape[0], size=min(200, X.shape[0]), replace=False)
    single = []
    for i in rows:
        xi = X[i:i + 1]
        t0 = time.perf_counter()
        model.predict(xi)
        single.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    model.predict(X)
    batch_s = time.perf_counter() - t0
    out = dict(method=spec["method"], fit_s=fit_s, peak_mb=mem.peak_mb, rss_before_mb=mem.rss_before_mb,
               objective=objective, n_iter=int(model.n_iter_), single_row_us=float(np.median(single)) * 1e6,
               batch_s=batch_s)
    if spec["method"] == "qkmeans":
        paths = [(r["step"], f'{r.get("columns")}/{r.get("target")}' + (f'/{r["start"]}' if "start" in r else "")
                  + (f'/means={r["means"]}' if "means" in r else ""),
                  r.get("n_columns")) for r in model.history_ if r["step"] in ("init", "refit", "polish")]
        steps = {}
        for r in model.history_:
            steps[r["step"]] = steps.get(r["step"], 0.0) + float(r.get("seconds") or 0.0)
        out.update(compression=float(model.compression_), nnz=int(model.nnz_), n_factors=len(model.factors_),
                   refit_paths=sorted({f"{s}:{c}" for s, c, _ in paths}),
                   n_columns=[n for _, _, n in paths][:3] + [n for _, _, n in paths][-1:],
                   seconds_by_step=steps, predict_path=model.operator_.execution_path(1, sparse=True))
    print("RESULT " + json.dumps(out), flush=True)


def run_child(spec, threads, tmp_dir, timeout):
    path = Path(tmp_dir) / f"spec_{spec['method']}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                         "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")})
    try:
        proc = subprocess.run([sys.executable, __file__, "_child", str(path), str(threads)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(method=spec["method"], error=f"timeout after {timeout} s")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return dict(method=spec["method"], error=proc.stderr[-2000:])


def _median(rows, key):
    vals = [r[key] for r in rows if key in r]
    return float(np.median(vals)) if vals else None


def summarise(name, k, shape, rows):
    ok = {m: [r for r in rows if r["method"] == m and "error" not in r] for m in METHODS}
    s = dict(dataset=name, k=k, shape=list(shape))
    for m in METHODS:
        for key in ("fit_s", "peak_mb", "objective", "single_row_us", "batch_s"):
            s[f"{m}_{key}"] = _median(ok[m], key)
    if ok["qkmeans"]:
        s["compression"] = ok["qkmeans"][0]["compression"]
        s["refit_paths"] = ok["qkmeans"][0]["refit_paths"]
    if ok["elkan"] and ok["qkmeans"]:
        s["fit_ratio"] = s["qkmeans_fit_s"] / s["elkan_fit_s"]
        s["objective_ratio"] = s["qkmeans_objective"] / s["elkan_objective"]
        s["memory_ratio"] = s["qkmeans_peak_mb"] / max(s["elkan_peak_mb"], 1e-9)
        s["goals"] = {"fit <= 3x elkan": s["fit_ratio"] <= 3.0,
                      "objective <= 1.02x": s["objective_ratio"] <= 1.02,
                      "compression >= 20x": s["compression"] >= 20.0,
                      "single row faster than dense": s["qkmeans_single_row_us"] < s["elkan_single_row_us"],
                      "peak memory <= 2x": s["memory_ratio"] <= 2.0}
    return s


def markdown(report):
    lines = ["# QK-means on wide sparse data vs qkm Elkan k-means", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {report['cpu']}, threads {report['threads']}; load (uptime) before: "
             f"{report['load_before']}; after: {report['load_after']}.", "",
             "| data | n x D | K | Elkan fit s | QK fit s | fit ratio | Elkan MB | QK MB | objective ratio | "
             "compression | 1-row us Elkan / QK | batch s Elkan / QK | refit paths |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for s in report["summary"]:
        lines.append(
            f"| {s['dataset']} | {s['shape'][0]} x {s['shape'][1]} | {s['k']} | {f(s['elkan_fit_s'])} | "
            f"{f(s['qkmeans_fit_s'])} | {f(s.get('fit_ratio'))} | {f(s['elkan_peak_mb'], 0)} | "
            f"{f(s['qkmeans_peak_mb'], 0)} | {f(s.get('objective_ratio'), 4)} | {f(s.get('compression'), 1)} | "
            f"{f(s['elkan_single_row_us'], 0)} / {f(s['qkmeans_single_row_us'], 0)} | "
            f"{f(s['elkan_batch_s'], 3)} / {f(s['qkmeans_batch_s'], 3)} | {', '.join(s.get('refit_paths', []))} |")
    lines += ["", "Goals per row:", ""]
    for s in report["summary"]:
        if "goals" in s:
            met = ", ".join(f"{g}: {'met' if v else 'MISSED'}" for g, v in s["goals"].items())
            lines.append(f"- {s['dataset']} K={s['k']}: {met}")
    errors = [r for r in report["runs"] if "error" in r]
    if errors:
        lines += ["", "Failed runs:", ""] + [f"- {r['dataset']} {r['method']}: {r['error'][-300:]}" for r in errors]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="20news-tfidf,news20")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--rows", type=int, default=0, help="fixed random subset of rows (0: all)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per fit before it is reported as failed")
    ap.add_argument("--data-dir", default=str(ts.DEFAULT_DATA_DIR))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    import tempfile

    report = dict(command=".venv/bin/python benchmarks/qkmeans_sparse.py " + shlex.join(sys.argv[1:]),
                  cpu=cpu_name(), threads=args.threads, load_before=os.getloadavg(), runs=[], summary=[])
    ts.CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            matrix = ts.ensure_matrix(name, args.data_dir, ts.CACHE_DIR, args.rows or None)
            init = ts.ensure_init(name, matrix, ts.CACHE_DIR, args.rows or None, args.k)
            shape = ts.load_array(matrix).shape
            rows = []
            for rep in range(args.repeats):
                for method in (METHODS if rep % 2 == 0 else METHODS[::-1]):   # interleaved
                    r = run_child(dict(method=method, matrix=str(matrix), init=str(init)), args.threads, tmp,
                                  args.timeout)
                    r.update(dataset=name, repeat=rep, load=os.getloadavg())
                    print(json.dumps(r), flush=True)
                    rows.append(r)
            report["runs"] += rows
            report["summary"].append(summarise(name, args.k, shape, rows))
            report["load_after"] = os.getloadavg()
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            ts.write_text_atomic(out.with_suffix(".json"), json.dumps(stamp(report), indent=1))
            ts.write_text_atomic(out.with_suffix(".md"), stamp_md(markdown(report)))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
