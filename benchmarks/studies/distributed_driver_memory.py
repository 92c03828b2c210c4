"""Where the driver's memory goes in a fit over shards: tracemalloc and RSS at each phase of an iteration.

Runs Lloyd, Elkan and QK-means (``--algorithms``) on a ``LocalCluster`` of one
worker process from the initial centres of ``distributed.py`` (the generated
matrix of ``--rows`` rows, built and cut by ``distributed.py``'s code), one
fresh driver process per algorithm, after a one-iteration warm-up fit. During
the measured fit the driver's phases are marked by wrapping its functions
(results unchanged): after each round's combined partial sums arrive
(``received``), after the new means (``means``), after the empty-cluster
repair, after the centres are scattered, after the run and after ``fit``
(the final model). At each mark: the bytes traced by ``tracemalloc`` (numpy
registers its buffers there), the traced peak since the previous mark, the
process RSS and its high-water mark (``VmHWM``, reset before the fit), and the
live blocks of at least ``K x D x 8 / 8`` bytes with the line that made them.

Usage::

    .venv/bin/python benchmarks/studies/distributed_driver_memory.py --rows 200000 --rows-per-shard 65536 \\
        --out benchmarks/results/studies/distributed_driver_memory
"""

import argparse
import gc
import importlib.util
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
BENCH_DIR = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("qkm_bench_distributed", BENCH_DIR / "distributed.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)  # sets sys.path so that `import distributed` finds dask's


def _mb(v):
    return v / 2 ** 20


class Marks:
    def __init__(self, big):
        self.big, self.rows = big, []

    def mark(self, name):
        cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        blocks = sorted((tr.size, f"{tr.traceback[0].filename.split('/qkm/')[-1]}:{tr.traceback[0].lineno}")
                        for tr in snap.traces if tr.size >= self.big)[::-1]
        self.rows.append({"phase": name, "traced_mb": _mb(cur), "traced_peak_since_last_mb": _mb(peak),
                          "rss_mb": B.vm_kb("VmRSS") / 1024, "hwm_mb": B.vm_kb("VmHWM") / 1024,
                          "big_blocks": [[round(_mb(s), 1), w] for s, w in blocks]})


def _wrap(owner, name, marks, label):
    fn = getattr(owner, name)

    def wrapped(*a, **k):
        out = fn(*a, **k)
        marks.mark(label(a, out) if callable(label) else label)
        return out

    setattr(owner, name, wrapped)


def hooks(marks):
    from qkm.distributed import ShardedData, _driver, _factored, _fit

    _wrap(ShardedData, "map_reduce", marks, lambda a, out: f"received {a[1].__name__}")
    _wrap(ShardedData, "_scatter", marks, "scattered")
    _wrap(_driver, "update_means", marks, "means")
    _wrap(_driver, "_relocations", marks, "repair candidates")
    _wrap(_factored, "update_means_csr", marks, "means (csr)")
    _wrap(_driver, "update_means_csr", marks, "means (csr)")
    run_l, run_e = _fit._RUNS["lloyd"], _fit._RUNS["elkan"]

    def mk(run):
        def wrapped(*a, **k):
            out = run(*a, **k)
            marks.mark("run returned")
            return out
        return wrapped

    _fit._RUNS["lloyd"], _fit._RUNS["elkan"] = mk(run_l), mk(run_e)


def estimator(algorithm, C0, iters):
    import qkm

    if algorithm == "lloyd":
        return qkm.KMeans(len(C0), init=C0, n_init=1, max_iter=iters, tol=0)
    if algorithm == "elkan":
        return qkm.KMeans(len(C0), init=C0, n_init=1, max_iter=iters, tol=0, algorithm="elkan")
    if algorithm == "qkmeans":
        return qkm.QKMeans(len(C0), init=C0, max_iter=iters, tol=0, palm_max_iter=0, palm_warm_iter=2,
                           random_state=0)
    raise ValueError(algorithm)


def run_one(spec):
    from distributed import Client, LocalCluster

    from qkm.distributed import ShardedData

    algorithm, iters = spec["algorithm"], spec["iters"]
    rss_start = B.vm_kb("VmRSS") / 1024
    C0 = np.load(spec["init"])
    k, d = C0.shape
    out = {"algorithm": algorithm, "K": k, "D": d, "kxd_mb": _mb(k * d * 8), "load": {"before": B.uptime_load()},
           "rss_interpreter_mb": rss_start}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      worker_dashboard_address=None, memory_limit=0) as cluster, Client(cluster) as client:
        sd = ShardedData(spec["directory"], client)
        estimator(algorithm, C0, 1).fit(sd)  # warm-up: shards loaded, numba caches
        gc.collect()
        out["rss_before_fit_mb"] = B.vm_kb("VmRSS") / 1024
        marks = Marks(k * d)
        hooks(marks)
        tracemalloc.start(1)
        B.reset_peak()
        marks.mark("start (C0 held by the caller)")
        km = estimator(algorithm, C0, iters).fit(sd)
        marks.mark("fit returned (final model)")
        tracemalloc.stop()
        out["driver_peak_mb"] = B.vm_kb("VmHWM") / 1024
        out["inertia"] = float(km.inertia_)
        out["phases"] = marks.rows
        sd.close()
    out["load"]["after"] = B.uptime_load()
    print("RESULT " + json.dumps(out), flush=True)


def summarise(results, meta):
    lines = ["# Driver memory of a fit over shards (1 worker), by phase\n", f"Command: `{meta['command']}`  ",
             f"Data: {meta['shape']}; initial centres of `distributed.py` (k-means++ on a 100,000-row sample); "
             f"{meta['iters']} iterations after a one-iteration warm-up; qkm {meta['qkm']}.  ",
             "traced = bytes held by tracemalloc-traced allocations (numpy buffers) at the mark; peak = the traced "
             "peak since the previous mark; RSS / HWM = the process's resident set and its high-water mark (reset "
             "before the fit). Big blocks: live allocations of at least K x D x 8 / 8 bytes, MB and the line that "
             "made them.\n"]
    for r in results:
        lines += [f"\n## {r['algorithm']}, K = {r['K']}, D = {r['D']} (K x D float64 = {r['kxd_mb']:.0f} MB)\n",
                  f"Driver peak RSS {r['driver_peak_mb']:.0f} MB (interpreter alone {r['rss_interpreter_mb']:.0f} MB,"
                  f" before the fit {r['rss_before_fit_mb']:.0f} MB, the caller's init array included); "
                  f"inertia {r['inertia']!r}; load {r['load']['before'][0]:.1f} / {r['load']['after'][0]:.1f}.\n",
                  "| phase | traced MB | traced peak since last MB | RSS MB | HWM MB | big live blocks (MB @ line) |",
                  "|---|---|---|---|---|---|"]
        for p in r["phases"]:
            blocks = ", ".join(f"{s:.0f} @ {w}" for s, w in p["big_blocks"]) or "-"
            lines.append(f"| {p['phase']} | {p['traced_mb']:.0f} | {p['traced_peak_since_last_mb']:.0f} | "
                         f"{p['rss_mb']:.0f} | {p['hwm_mb']:.0f} | {blocks} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default=str(B.TS.CACHE_DIR))
    p.add_argument("--data-dir", default=str(B.TS.DEFAULT_DATA_DIR))
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--features", type=int, default=100_000)
    p.add_argument("--density", type=float, default=1e-4)
    p.add_argument("--rows-per-shard", type=int, default=65536)
    p.add_argument("--k", type=int, default=500)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--algorithms", default="lloyd,elkan,qkmeans")
    p.add_argument("--out", default=str(BENCH_DIR / "results" / "studies" / "distributed_driver_memory"))
    p.add_argument("--run", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        return run_one(json.loads(args.run))
    args.datasets, args.ks = ["generated"], [args.k]
    sets, inits = B.prepare(args)
    directory = sets["generated"]
    m = json.load(open(Path(directory) / "manifest.json"))
    import qkm

    meta = {"command": " ".join([".venv/bin/python", "benchmarks/studies/distributed_driver_memory.py"] + sys.argv[1:]),
            "shape": f"{m['n_rows']:,} x {m['n_features']:,} CSR, nnz {m['nnz']:,}, {len(m['shards'])} shards",
            "iters": args.iters, "qkm": qkm.__version__}
    results = []
    for algorithm in args.algorithms.split(","):
        spec = {"algorithm": algorithm, "directory": directory, "init": inits[f"generated:{args.k}"],
                "iters": args.iters}
        print(f"[{time.strftime('%H:%M:%S')}] {algorithm} load {B.uptime_load()}", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--run", json.dumps(spec)], capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-2000:], proc.stderr[-4000:], flush=True)
            raise SystemExit(f"{algorithm} failed")
        results.append(json.loads(line[-1][7:]))
        B.TS.write_text_atomic(args.out + ".json", json.dumps(B.stamp({"meta": meta, "results": results}), indent=1))
        B.TS.write_text_atomic(args.out + ".md", B.stamp_md(summarise(results, meta)))
    print(summarise(results, meta))


if __name__ == "__main__":
    main()
