"""Where one iteration of a fit over shards goes, per phase, on the driver and on each worker (1 vs 2 workers).

Runs ``KMeans`` (Lloyd) or ``QKMeans`` on a shard directory of ``distributed.py``
(same data, initial centres and settings) on a ``LocalCluster`` of 1 and of 2
worker processes (1 thread each), each configuration in a fresh subprocess,
interleaved over ``--rounds``, and reads the phases the fit records
(:mod:`qkm.distributed._timeline`: wall-clock events of the driver and of
every shard task, per iteration). Per configuration it reports the median over
the measured iterations (and rounds) of:

* driver phases: ``compact`` (dense centres -> CSR pack), ``scatter`` (pack to
  a worker), ``submit`` (shard tasks + combine tree), ``wait`` (until the
  combined partial is ready), ``result`` (its transfer and deserialisation),
  ``means`` (means, norms, repair), ``other`` (the rest of the iteration: the
  stopping rule and log; for QK-means the refit of the factors);
* worker phases, summed over the shard tasks of each worker: ``check``,
  ``operator`` (the pack made an operator: densified centres), ``assign``
  (incl. the C^T layout: ``assign/transpose``, ``assign/column_nnz``),
  ``sq_distances``, ``sums``, ``combine``, their total ``busy``;
* ``start latency`` (driver's submit done -> first task of the worker starts:
  the pack's transfer and deserialisation, scheduling) and ``tail`` (last
  shard task done -> combined partial on the driver: the combine tree and its
  transfers).

The serial part of an iteration (``serial`` row) is the iteration's time minus
the ``busy`` time of its busiest worker: the part that more workers do not
shorten (driver work, transfers, hand-offs, idle workers). Also records ``uptime`` load per run.

Usage::

    .venv/bin/python benchmarks/distributed_phases.py --iters 3 --rounds 2 --out benchmarks/results/distributed_phases
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("distributed_bench", BENCH_DIR / "distributed.py")
DB = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DB)  # the data, initial centres and estimators of distributed.py

DRIVER_PHASES = ("compact", "scatter", "submit", "wait", "result", "means", "other")
WORKER_PHASES = ("check", "operator", "assign", "assign/transpose", "assign/column_nnz", "sq_distances", "sums",
                 "combine", "busy")


def iteration_phases(start, end, events, driver_pid):
    """One iteration's phases: driver table, per-worker tables (ordered by first shard), latency and tail."""
    driver = {k: 0.0 for k in DRIVER_PHASES}
    workers = {}
    submit_end = wait_end = None
    for pid, shard, name, a, b in events:
        if pid == driver_pid:
            driver[name] = driver.get(name, 0.0) + (b - a)
            if name == "submit":
                submit_end = b if submit_end is None else submit_end
            if name == "wait":
                wait_end = b
            continue
        w = workers.setdefault(pid, {"first_shard": 1 << 30, "first_start": a, "last_task_end": 0.0})
        w[name] = w.get(name, 0.0) + (b - a)
        w["first_start"] = min(w["first_start"], a)
        if shard >= 0:
            w["first_shard"] = min(w["first_shard"], shard)
            w["last_task_end"] = max(w["last_task_end"], b)
    driver["other"] = (end - start) - sum(v for k, v in driver.items() if k != "other")
    out = {"seconds": end - start, "driver": driver, "workers": []}
    for pid, w in sorted(workers.items(), key=lambda kv: kv[1]["first_shard"]):
        row = {k: w.get(k, 0.0) for k in WORKER_PHASES if k != "busy"}
        row["busy"] = sum(v for k, v in row.items() if "/" not in k)
        row["start_latency"] = w["first_start"] - submit_end if submit_end is not None else float("nan")
        out["workers"].append(row)
    out["serial"] = out["seconds"] - max((w["busy"] for w in out["workers"]), default=0.0)
    last = max((w["last_task_end"] for w in workers.values()), default=None)
    out["tail"] = (wait_end - last) if (wait_end is not None and last) else float("nan")
    return out


def _pin_process(cpu):
    """Pin every thread of the calling (worker) process to ``cpu`` (threads it starts later inherit it).

    A copy of ``parallel_ceiling.py``'s ``_pin``, on purpose: the Dask workers cannot import the benchmark
    folder's modules (``_machine``), so the function travels by value from this script."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:  # a thread that ended meanwhile
            pass
    return cpu


def run_config(spec):
    import numpy as np
    from distributed import Client, LocalCluster

    from qkm.distributed import ShardedData

    pin = spec["config"].endswith("-pin")  # each worker process on a CPU of its own
    workers = int(spec["config"].removesuffix("-pin")[-2])
    C0 = np.load(spec["init"])
    algorithm = spec["algorithm"]
    warm_up = "qkmeans-warm-up" if algorithm == "qkmeans" else algorithm
    load = {"before": DB.uptime_load()}
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, worker_dashboard_address=None, memory_limit=0) as cluster, \
            Client(cluster) as client:
        if pin:  # worker i (sorted addresses) on CPU i of this process's mask, every thread of it
            cpus = sorted(os.sched_getaffinity(0))
            for i, address in enumerate(sorted(client.scheduler_info()["workers"])):
                client.run(_pin_process, cpus[i % len(cpus)], workers=[address])
        sd = ShardedData(spec["directory"], client)
        DB.make_estimator(warm_up, C0, 1).fit(sd)
        km = DB.make_estimator(algorithm, C0, spec["iters"], None, spec.get("palm_warm_iter", 2)).fit(sd)
        rounds = list(sd.rounds)
        rounds = rounds[1:] if algorithm == "qkmeans" else rounds  # QK-means: round 0 = the seeds' factorisation
        if algorithm == "qkmeans":  # the last iteration's means and refit end with the fit, not at an assignment
            rounds = rounds[:spec["iters"] - 1]
        its = [iteration_phases(a, b, ev, os.getpid()) for a, b, ev in rounds]
        sd.close()
    out = {"config": spec["config"], "algorithm": algorithm, "iterations": its, "inertia": float(km.inertia_),
           "seconds_per_iter": DB.timings(algorithm, km)[0]["seconds_per_iter"],
           "load": dict(load, after=DB.uptime_load())}
    print("RESULT " + json.dumps(out), flush=True)


def median_table(results, config):
    its = [it for r in results if r["config"] == config for it in r["iterations"]]
    if not its:
        return None
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    n_workers = max(len(it["workers"]) for it in its)
    table = {"seconds": med([it["seconds"] for it in its]), "tail": med([it["tail"] for it in its]),
             "serial": med([it["seconds"] - max(w["busy"] for w in it["workers"]) for it in its]),
             "driver": {k: med([it["driver"][k] for it in its]) for k in DRIVER_PHASES}, "workers": []}
    for w in range(n_workers):
        rows = [it["workers"][w] for it in its if len(it["workers"]) > w]
        table["workers"].append({k: med([r[k] for r in rows]) for k in rows[0]})
    return table


def summarise(results, meta):
    lines = ["# Phases of one distributed iteration: 1 vs 2 workers\n",
             f"Command: `{meta['command']}`  ",
             f"Data: {meta['shape']}; {meta['algorithm']}, K = {meta['k']}; {meta['iters']} measured iterations "
             f"after one warm-up, {meta['rounds']} round(s) per configuration, interleaved; medians over "
             f"iterations and rounds (seconds).  ", f"Machine: {meta['cpu']}, 2 cores shared with other jobs; "
             f"qkm {meta['qkm']}, dask {meta['dask']}.\n"]
    if meta.get("micro"):
        m = meta["micro"]
        lines += ["Serial parts before / after this change (one process, interleaved, median of "
                  f"{next(iter(m.values()))['reps']}; load 1-min {m['load']['before'][0]:.1f} / "
                  f"{m['load']['after'][0]:.1f}):\n", "| part | before s | after s |", "|---|---|---|"]
        lines += [f"| {k} | {v['before']:.4f} | {v['after']:.4f} |" for k, v in m.items() if k != "load"]
        lines.append("")
    if not results:
        return "\n".join(lines) + "\n"
    configs = list(dict.fromkeys(r["config"] for r in results))
    tables = {c: median_table(results, c) for c in configs}
    lines += ["| phase | " + " | ".join(f"{c} {w}" for c in configs for w in
                                      ["driver"] + [f"worker {i + 1}" for i in range(len(tables[c]["workers"]))])
             + " |"]
    cols = [(c, None) for c in configs]
    cols = []
    for c in configs:
        cols.append((c, -1))
        cols += [(c, i) for i in range(len(tables[c]["workers"]))]
    lines.append("|---|" + "---|" * len(cols))

    def cell(c, i, key):
        t = tables[c]
        if i == -1:
            return f"{t['driver'][key]:.3f}" if key in t["driver"] else ""
        return f"{t['workers'][i][key]:.3f}" if key in t["workers"][i] else ""

    for key in DRIVER_PHASES + WORKER_PHASES + ("start_latency",):
        lines.append(f"| {key} | " + " | ".join(cell(c, i, key) for c, i in cols) + " |")
    lines.append("| tail (last shard task -> result on driver) | " + " | ".join(
        f"{tables[c]['tail']:.3f}" if i == -1 else "" for c, i in cols) + " |")
    lines.append("| serial: iteration - busiest worker's busy | " + " | ".join(
        f"{tables[c]['serial']:.3f}" if i == -1 else "" for c, i in cols) + " |")
    lines.append("| **iteration** | " + " | ".join(
        f"**{tables[c]['seconds']:.3f}**" if i == -1 else "" for c, i in cols) + " |")
    lines.append("")
    for r in results:
        lines.append(f"* {r['config']}: {r['seconds_per_iter']:.3f} s/iter (fit's own timing), inertia "
                     f"{r['inertia']!r}, load 1-min {r['load']['before'][0]:.1f} / {r['load']['after'][0]:.1f}")
    for prefix in ("ref-", ""):
        for two, one in ((f"{prefix}dask-2w", f"{prefix}dask-1w"), (f"{prefix}dask-2w-pin", f"{prefix}dask-1w"),
                         (f"{prefix}dask-2w-pin", f"{prefix}dask-1w-pin")):
            if {one, two} <= set(tables):
                t1, t2 = tables[one]["seconds"], tables[two]["seconds"]
                fit1 = statistics.median(r["seconds_per_iter"] for r in results if r["config"] == one)
                fit2 = statistics.median(r["seconds_per_iter"] for r in results if r["config"] == two)
                lines.append(f"* {two} vs {one} (medians of the phase runs): {t1 / t2:.2f}x; (medians of the fits' "
                             f"own s/iter): {fit1 / fit2:.2f}x")
    return "\n".join(lines) + "\n"


def micro(args, directory, init, reps):
    """A/B of the serial parts this benchmark found, one process, interleaved, medians (seconds).

    On the first shard and the means after one Lloyd step from the benchmark's
    initial centres: the workers' C^T layouts from the compact pack (densified
    first, as before, vs straight from the CSR), the driver's means (copy of
    the centres then in place, as before, vs written into the new buffer), the
    workers' sparse C^T fill from the CSR pack (row by row of C vs in column
    blocks that stay in cache; the same arrays), and one pack out + combined
    sums back through the scheduler vs directly.
    """
    import numpy as np
    from distributed import Client, LocalCluster

    from qkm._data import KMeansData
    from qkm._reduce import means_from_csr_sums
    from qkm.io._shards import load_shard, read_manifest
    from qkm.distributed import _packs
    from qkm._kernels import centroid_sq_norms
    from qkm.operator import DenseOperator

    X, _ = load_shard(read_manifest(directory), 0, verify=False)
    data = KMeansData(X)
    C = np.ascontiguousarray(np.load(init), dtype=np.float64)
    labels, partial = np.empty(X.shape[0], dtype=np.int32), np.empty(X.shape[0])
    data.assign(DenseOperator(C), labels, partial)
    counts, sums = data.cluster_sums(labels, C.shape[0])
    C_new, shift = np.empty_like(C), np.empty(C.shape[0])
    means_from_csr_sums(sums.indptr, sums.indices, sums.data, counts, C, C_new, shift)
    pack = _packs.compact_pack((C_new, centroid_sq_norms(C_new)))

    def layouts_before():
        op = DenseOperator(_packs._unpack(pack)[0], pack[1])
        op.column_nnz()
        op.sparse_transpose()

    def layouts_after():
        op = _packs._SharedCSROperator(pack[0], pack[1])
        op.column_nnz()
        op.sparse_transpose()

    out_old, out_new, sh = np.empty_like(C), np.empty_like(C), np.empty(C.shape[0])

    def means_before():
        np.copyto(out_old, C)
        means_from_csr_sums(sums.indptr, sums.indices, sums.data, counts, out_old, out_old, sh)

    def means_after():
        means_from_csr_sums(sums.indptr, sums.indices, sums.data, counts, C, out_new, sh)

    C_csr = pack[0]
    ct_ptr = np.zeros(C_csr.shape[1] + 1, dtype=np.int64)
    np.cumsum(_packs._SharedCSROperator(C_csr, pack[1]).column_nnz(), out=ct_ptr[1:])
    ct_rowwise = (np.empty(ct_ptr[-1], dtype=np.int32), np.empty(ct_ptr[-1]))
    ct_blocked = (np.empty(ct_ptr[-1], dtype=np.int32), np.empty(ct_ptr[-1]))

    def ct_before():
        _csr_fill_transpose_rowwise(C_csr.indptr, C_csr.indices, C_csr.data, ct_ptr, *ct_rowwise)

    def ct_after():
        _packs._csr_fill_transpose(C_csr.indptr, C_csr.indices, C_csr.data, _packs._tile(C_csr.shape[0]), ct_ptr,
                                   *ct_blocked)

    cases = {"worker C^T layouts from the pack": (layouts_before, layouts_after),
             "driver means from the CSR sums": (means_before, means_after),
             "worker sparse C^T fill: row by row vs column blocks": (ct_before, ct_after)}
    times = {name: ([], []) for name in cases}
    for _ in range(reps):
        for name, fns in cases.items():
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                times[name][i].append(time.perf_counter() - t0)
    means_before()
    means_after()
    assert np.array_equal(out_old, out_new)
    assert all(np.array_equal(a, b) for a, b in zip(ct_rowwise, ct_blocked))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        name = "pack out + sums back (a task between)"
        times[name] = ([], [])
        for _ in range(reps):
            for i, direct in enumerate((False, True)):
                t0 = time.perf_counter()
                f = client.scatter([pack], hash=False, direct=direct)[0]
                g = client.submit(_sums_like, f, sums, pure=False)
                client.gather(g, direct=direct)
                times[name][i].append(time.perf_counter() - t0)
    return {name: {"before": statistics.median(a), "after": statistics.median(b), "reps": reps}
            for name, (a, b) in times.items()}


def _csr_fill_transpose_rowwise(indptr, indices, data, ct_ptr, ct_idx, ct_val):
    """The workers' sparse C^T fill before the column blocks (for ``--micro``): row by row of C, so the writes
    jump across the whole of C^T."""
    from numba import njit

    global _ROWWISE
    if _ROWWISE is None:
        @njit(nogil=True)
        def fill(indptr, indices, data, ct_ptr, ct_idx, ct_val):
            pos = ct_ptr[:-1].copy()
            for j in range(indptr.shape[0] - 1):
                for q in range(indptr[j], indptr[j + 1]):
                    if data[q] != 0:
                        k = indices[q]
                        ct_idx[pos[k]] = j
                        ct_val[pos[k]] = data[q]
                        pos[k] += 1
        _ROWWISE = fill
    _ROWWISE(indptr, indices, data, ct_ptr, ct_idx, ct_val)


_ROWWISE = None


def _sums_like(pack, sums):
    return sums.copy()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default=str(DB.TS.CACHE_DIR))
    p.add_argument("--data-dir", default=str(DB.TS.DEFAULT_DATA_DIR))
    p.add_argument("--datasets", default="generated", help="generated or 20news-tfidf (one)")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--algorithm", default="lloyd", choices=["lloyd", "qkmeans"])
    p.add_argument("--configs", default="dask-1w,dask-2w",
                   help="dask-Nw: a LocalCluster of N worker processes; dask-Nw-pin: the same, worker i pinned to "
                        "CPU i; ref-dask-Nw: with --ref-src")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=100_000)
    p.add_argument("--density", type=float, default=1e-4)
    p.add_argument("--rows-per-shard", type=int, default=DB.DEFAULT_ROWS_PER_SHARD,
                   help="generated matrix: rows per shard (another value gets its own shard directory)")
    p.add_argument("--out", default=str(BENCH_DIR / "results" / "distributed_phases"))
    p.add_argument("--ref-src", help="A/B: the source tree of another qkm version (e.g. `git archive REV qkm | "
                   "tar -x -C DIR`); configs named ref-dask-1w, ref-dask-2w run with it on PYTHONPATH")
    p.add_argument("--micro", type=int, default=0, metavar="REPS",
                   help="also time the serial parts before/after this change in one process (REPS interleaved)")
    p.add_argument("--run", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        return run_config(json.loads(args.run))
    args.ks = [args.k]
    args.datasets = [args.datasets]
    sets, inits = DB.prepare(args)
    name, directory = next(iter(sets.items()))
    m = json.load(open(Path(directory) / "manifest.json"))
    configs = [c for c in args.configs.split(",") if c]  # none: --micro only
    results = []
    meta = {"command": " ".join([".venv/bin/python", "benchmarks/distributed_phases.py"] + sys.argv[1:]),
            "shape": f"{name} {m['n_rows']:,} x {m['n_features']:,} CSR, nnz {m['nnz']:,}, {len(m['shards'])} shards",
            "algorithm": args.algorithm, "k": args.k, "iters": args.iters, "rounds": args.rounds,
            "cpu": DB.cpu_name()}
    import dask

    import qkm

    meta.update(qkm=qkm.__version__, dask=dask.__version__)
    micro_results = {}
    if args.micro:
        load0 = DB.uptime_load()
        micro_results = micro(args, directory, inits[f"{name}:{args.k}"], args.micro)
        micro_results["load"] = {"before": load0, "after": DB.uptime_load()}
        meta["micro"] = micro_results
        print(json.dumps(micro_results), flush=True)
    for rnd in range(args.rounds if configs else 0):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for config in order:
            spec = {"config": config, "directory": directory, "init": inits[f"{name}:{args.k}"],
                    "iters": args.iters, "algorithm": args.algorithm}
            print(f"[{time.strftime('%H:%M:%S')}] round {rnd + 1} {config} load {DB.uptime_load()}", flush=True)
            env = dict(os.environ)
            if config.startswith("ref-"):
                if not args.ref_src:
                    raise SystemExit("ref-* configs need --ref-src")
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.ref_src, env.get("PYTHONPATH")]))
            proc = subprocess.run([sys.executable, __file__, "--run", json.dumps(spec)], capture_output=True,
                                  text=True, env=env)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stdout[-2000:], proc.stderr[-4000:], flush=True)
                raise SystemExit(f"{config} failed")
            results.append(json.loads(line[-1][7:]))
            print(f"    {results[-1]['seconds_per_iter']:.3f} s/iter", flush=True)
            save(args, meta, results)  # after every configuration: a partial run still leaves results
    print(save(args, meta, results))


def save(args, meta, results):
    text = summarise(results, meta)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    DB.TS.write_text_atomic(args.out + ".json", json.dumps(DB.stamp({"meta": meta, "results": results}), indent=1))
    DB.TS.write_text_atomic(args.out + ".md", DB.stamp_md(text))
    return text


if __name__ == "__main__":
    main()
