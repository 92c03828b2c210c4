"""Lloyd, k-means|| and QK-means in-process vs on a Dask LocalCluster (1 and 2 workers): time, traffic, memory.

Data sets (built once into ``benchmarks/.cache/``, not committed):

* ``20news-tfidf``: 20 Newsgroups bydate train+test, ``TfidfVectorizer()`` (the
  vectoriser and cache of ``train_sparse.py``), cut with ``qkm shard``;
* ``generated``: a sparse 2,000,000 x 100,000 matrix of density 1e-4 (rows
  draw most terms from one of 200 topics, values exponential, rows
  L2-normalised), written to ``.npz`` and cut with ``qkm shard``.

Every configuration runs in a fresh subprocess from the same initial centres
(k-means++ on a 100,000-row sample), ``tol=0`` and a fixed iteration count,
after one warm-up iteration (numba caches, page cache):

* ``inproc-1t`` / ``inproc-2t``: ``qkm.KMeans.fit`` on the data loaded in memory
  (``load_data`` on the shard directory), 1 or 2 numba threads;
* ``dask-1w`` / ``dask-2w``: ``KMeans.fit(ShardedData(DIR, client))`` on a
  ``LocalCluster`` of 1 or 2 worker processes (1 thread each, 127.0.0.1).

Algorithms (``--algorithms``, one table row each per configuration):

* ``lloyd``: ``qkm.KMeans`` (Lloyd) from the initial centres;
* ``kmeans-par``: the k-means|| seeding (``init="k-means||"``, seed 0, defaults
  otherwise) followed by one Lloyd iteration; the time shown is the seeding's
  (``history_[0]["seeding_seconds"]``), and its cost must equal in-process;
* ``qkmeans``: ``qkm.QKMeans`` (s = 3, ``floor(log2 D)`` factors, ``--palm-warm-iter``
  least-squares sweeps per refit, default 2 instead of the estimator's 10 to
  keep the run short: the refit is the same driver work in every
  configuration) from the initial centres, no final polish
  (``palm_max_iter=0``); one iteration = an assignment pass over the data
  (on the shards: the factors are sent, not V) + the refit on the driver,
  both shown. The warm-up is a one-iteration QK-means with 2 factors (it
  loads the chain and least-squares kernels on the driver and the workers
  without repeating the full factorisation of the seeds).

Measured: median seconds per iteration, bytes driver -> workers and workers ->
driver per iteration (what the driver scattered and received) plus worker ->
worker bytes (Dask's transfer counters), peak RSS of the driver during the fit
and of each worker, the inertia (must equal in-process to the last bit), the
time of one K x D float64 round trip driver <-> worker, and ``uptime`` load.
The machine has 2 shared cores, so the 2-worker speed-up depends on the load.

Usage::

    .venv/bin/python benchmarks/distributed.py                 # full run (about 40 min)
    .venv/bin/python benchmarks/distributed.py --quick         # smoke test: small generated matrix
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import _bench_data as TS  # noqa: E402  (the 20 Newsgroups vectoriser and cache)
from _machine import cpu_name, stamp, stamp_md  # noqa: E402

# this file is named like the dask package: keep its folder off the path so `import distributed` finds dask's
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]

REPO_DIR = BENCH_DIR.parent
QKM = str(Path(sys.executable).with_name("qkm"))
CONFIGS = ("inproc-1t", "dask-1w", "dask-2w", "inproc-2t")


def uptime_load():
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


def vm_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# --------------------------------------------------------------------------- data


def generate(path, n_rows, n_features, density, seed=0, chunk=100_000, n_topics=200):
    """Topic-structured sparse rows, written as an uncompressed .npz (built chunk by chunk)."""
    rng = np.random.default_rng(seed)
    per_topic = n_features // n_topics
    parts = []
    for start in range(0, n_rows, chunk):
        m = min(chunk, n_rows - start)
        nnz_row = np.maximum(1, rng.poisson(density * n_features, size=m))
        topic = rng.integers(0, n_topics, size=m)
        total = int(nnz_row.sum())
        row = np.repeat(np.arange(m), nnz_row)
        in_topic = rng.random(total) < 0.7
        col = np.where(in_topic, np.repeat(topic, nnz_row) * per_topic + rng.integers(0, per_topic, total),
                       rng.integers(0, n_features, total))
        vals = rng.exponential(size=total)
        X = sp.csr_matrix((vals, (row, col)), shape=(m, n_features))
        X.sum_duplicates()
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        X = sp.csr_matrix(sp.diags(1.0 / norms) @ X)
        parts.append(X)
    X = sp.vstack(parts, format="csr")
    with TS.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            sp.save_npz(f, X, compressed=False)


DEFAULT_ROWS_PER_SHARD = 1 << 19


def shard(source, directory, rows_per_shard):
    if not (Path(directory) / "manifest.json").exists():
        subprocess.run([QKM, "shard", str(source), "-o", str(directory), "--rows-per-shard", str(rows_per_shard)],
                       check=True)
    return str(directory)


def prepare(args):
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    sets, init_names = {}, {}
    if "20news-tfidf" in args.datasets:
        npz = TS.ensure_matrix("20news-tfidf", args.data_dir, cache, None)
        sets["20news-tfidf"] = shard(npz, cache / "dist_20news-tfidf_shards", 4096)
    if "generated" in args.datasets:
        tag = f"gen_{args.rows}x{args.features}_d{args.density:g}"
        npz = cache / f"{tag}.npz"
        if not npz.exists():
            print(f"generating {npz} ...", flush=True)
            generate(npz, args.rows, args.features, args.density)
        usual = getattr(args, "usual_rows_per_shard", DEFAULT_ROWS_PER_SHARD)
        cut = "" if args.rows_per_shard == usual else f"_r{args.rows_per_shard}"
        sets["generated"] = shard(npz, cache / f"dist_{tag}{cut}_shards", args.rows_per_shard)
        init_names["generated"] = f"dist_{tag}_shards"  # the initial centres do not depend on the cut
    inits = {}
    for name, directory in sets.items():
        for k in args.ks:
            path = cache / f"dist_init_{init_names.get(name, Path(directory).name)}_k{k}.npy"
            if not path.exists():
                subprocess.run([sys.executable, __file__, "--make-init", directory, str(k), str(path)], check=True)
            inits[f"{name}:{k}"] = str(path)
    return sets, inits


def make_init(directory, k, out):
    """k-means++ on a uniform 100,000-row sample (the ShardedData default), seed 0."""
    from qkm import kmeans_plusplus
    from qkm.io import load_data

    X, _ = load_data(directory)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(X.shape[0], size=min(100_000, X.shape[0]), replace=False))
    centers, _ = kmeans_plusplus(X[rows], int(k), random_state=0)
    np.save(out, centers)


# --------------------------------------------------------------------------- one configuration


def make_estimator(algorithm, C0, iters, threads=None, palm_warm_iter=2):
    import qkm

    kw = {} if threads is None else {"n_jobs": threads}
    if algorithm == "qkmeans-warm-up":
        return qkm.QKMeans(len(C0), init=C0, max_iter=1, tol=0, n_factors=2, palm_max_iter=0, palm_warm_iter=1, **kw)
    if algorithm == "lloyd":
        return qkm.KMeans(len(C0), init=C0, n_init=1, max_iter=iters, tol=0, **kw)
    if algorithm == "kmeans-par":
        return qkm.KMeans(len(C0), init="k-means||", n_init=1, max_iter=1, tol=0, random_state=0, **kw)
    if algorithm == "qkmeans":
        return qkm.QKMeans(len(C0), init=C0, max_iter=iters, tol=0, palm_max_iter=0, palm_warm_iter=palm_warm_iter,
                           random_state=0, **kw)
    raise ValueError(algorithm)


def timings(algorithm, km):
    """Seconds per iteration (and its parts) from the fit's history."""
    recs = km.history_
    if algorithm == "kmeans-par":
        return {"seconds_per_iter": recs[0]["seeding_seconds"], "seeding_cost": recs[0]["seeding_cost"],
                "iter_seconds": [recs[0]["seeding_seconds"]]}, recs[:0]
    if algorithm == "qkmeans":
        assign = [r for r in recs if r.get("step") == "assign"]
        refit = [r for r in recs if r.get("step") == "refit"]
        secs = [a["seconds"] + r["seconds"] for a, r in zip(assign, refit)]
        return {"seconds_per_iter": statistics.median(secs), "iter_seconds": secs,
                "assign_seconds": statistics.median(r["seconds"] for r in assign),
                "refit_seconds": statistics.median(r["seconds"] for r in refit), "nnz": int(km.nnz_),
                "paths": sorted({r.get("path") for r in assign})}, assign
    secs = [r["seconds"] for r in recs]
    return {"seconds_per_iter": statistics.median(secs), "iter_seconds": secs}, recs


def run_config(spec):
    config, directory, iters = spec["config"], spec["directory"], spec["iters"]
    algorithm = spec.get("algorithm", "lloyd")
    warm_up = "qkmeans-warm-up" if algorithm == "qkmeans" else algorithm
    C0 = np.load(spec["init"])
    palm_warm_iter = spec.get("palm_warm_iter", 2)
    load = {"before": uptime_load()}
    out = {"config": config}
    if config.startswith("inproc"):
        from qkm.io import load_data

        threads = int(config[-2])
        X, _ = load_data(directory)
        make_estimator(warm_up, C0, 1, threads).fit(X)  # warm-up
        rss0 = vm_kb("VmRSS")
        reset_peak()
        km = make_estimator(algorithm, C0, iters, threads, palm_warm_iter).fit(X)
        out["driver_peak_mb"] = vm_kb("VmHWM") / 1024
        out["driver_fit_growth_mb"] = (vm_kb("VmHWM") - rss0) / 1024
    else:
        from distributed import Client, LocalCluster

        from qkm.distributed import ShardedData

        workers = int(config[-2])
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, worker_dashboard_address=None, memory_limit=0) as cluster, \
                Client(cluster) as client:
            sd = ShardedData(directory, client)
            make_estimator(warm_up, C0, 1).fit(sd)  # warm-up (loads the shards)
            w0 = client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
            rss0 = vm_kb("VmRSS")
            reset_peak()
            km = make_estimator(algorithm, C0, iters, None, palm_warm_iter).fit(sd)
            out["driver_peak_mb"] = vm_kb("VmHWM") / 1024
            out["driver_fit_growth_mb"] = (vm_kb("VmHWM") - rss0) / 1024
            w1 = client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
            out["worker_peak_mb"] = sorted(
                v / 1024 for v in client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).values())
            recs = timings(algorithm, km)[1]
            if algorithm == "kmeans-par":
                out["seeding_steps"] = sd.seeding_steps
            if recs:
                out["to_workers_bytes"] = statistics.median(r["sent_bytes"] for r in recs)
                out["to_driver_bytes"] = statistics.median(r["received_bytes"] for r in recs)
            outgoing = (sum(w1.values()) - sum(w0.values())) / max(len(recs), 1)
            out["worker_to_worker_bytes"] = max(0.0, outgoing - out.get("to_driver_bytes", 0))
            C = np.asarray(km.cluster_centers_, dtype=np.float64)
            t = []
            for _ in range(3):  # one K x D float64 round trip driver -> worker -> driver
                t0 = time.perf_counter()
                client.scatter(C, hash=False).result()
                t.append(time.perf_counter() - t0)
            out["kxd_round_trip_s"] = statistics.median(t)
            sd.close()
    out.update(timings(algorithm, km)[0])
    out.update(algorithm=algorithm, n_iter=km.n_iter_, inertia=float(km.inertia_), load=dict(load, after=uptime_load()))
    print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------- orchestration


def fmt_mb(v):
    return f"{v / 1e6:.1f} MB" if v >= 1e5 else f"{v / 1e3:.1f} kB"


TITLES = {"lloyd": "Lloyd (s/iter: one iteration)",
          "kmeans-par": "k-means|| seeding (s/iter: the whole seeding; traffic not counted)",
          "qkmeans": "QK-means (s/iter: assignment pass + refit on the driver)"}


def summarise(results, meta):
    lines = ["# Distributed k-means: in-process vs Dask LocalCluster\n",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['cpu']}, 2 cores shared with other jobs; "
             f"qkm {meta['qkm']}, dask {meta['dask']}.  ",
             f"{meta['iters']} measured iterations after one warm-up; median seconds per iteration; "
             f"{meta['rounds']} round(s) per configuration, interleaved"
             + (" in the same order every round.\n" if meta.get("interleave") else " (order rotated by round).\n")]
    for key in results:
        name, k = key.rsplit(":", 1)
        for algorithm in dict.fromkeys(r.get("algorithm", "lloyd") for r in results[key]):
            rows = [r for r in results[key] if r.get("algorithm", "lloyd") == algorithm]
            lines += summarise_rows(rows, f"{name}, K = {k}, {TITLES[algorithm]} ({meta['shapes'][name]})")
    return "\n".join(lines) + "\n"


def kmpar_traffic(rows):
    """k-means|| bytes per round (driver <-> workers): the sampled rows back, the new candidates out."""
    lines = []
    for r in rows:
        steps = r.get("seeding_steps")
        if not steps:
            continue
        rounds = [(a, b) for a, b in zip(steps, steps[1:]) if a["step"] == "chunk_sample" and b["step"] == "chunk_lower"]
        if not rounds:
            continue
        back = [a["received_bytes"] for a, _ in rounds]
        out = [b["sent_bytes"] for _, b in rounds]
        other = sum(x["sent_bytes"] + x["received_bytes"] for x in steps) - sum(back) - sum(out)
        lines.append(f"* k-means|| traffic, {r['config']}: {len(rounds)} rounds; per round sampled rows back "
                     + " / ".join(fmt_mb(v) for v in back) + ", new candidates out "
                     + " / ".join(fmt_mb(v) for v in out) + f"; other steps {fmt_mb(other)} in all")
        break  # the same bytes in every distributed configuration (the draws do not depend on the workers)
    return lines


def summarise_rows(rows, title):
    qk = rows[0].get("algorithm") == "qkmeans"
    lines = [f"\n## {title}\n",
             "| config | s/iter | " + ("assign / refit s | " if qk else "") + "driver->workers / iter | "
             "workers->driver / iter | worker<->worker / iter | driver peak RSS | worker peak RSS | K x D round trip "
             "| inertia | load 1-min (before/after) |",
             "|---|---|" + ("---|" if qk else "") + "---|---|---|---|---|---|---|---|"]
    ref = next((r for r in rows if r["config"] == "inproc-1t"), None)
    for r in rows:
        same = ("(no in-process run)" if ref is None else
                "identical" if r["inertia"] == ref["inertia"] else
                f"{r['inertia']!r} (rel. {abs(r['inertia'] / ref['inertia'] - 1):.1e})")
        if "seeding_cost" in r and ref is not None:
            rel = abs(r["seeding_cost"] / ref["seeding_cost"] - 1)
            same += ", seeding cost " + ("identical" if rel == 0 else f"rel. {rel:.1e}")
        lines.append(
            f"| {r['config']} | {r['seconds_per_iter']:.3f} | "
            + (f"{r['assign_seconds']:.3f} / {r['refit_seconds']:.3f} | " if qk else "")
            + f"{fmt_mb(r.get('to_workers_bytes', 0))} | {fmt_mb(r.get('to_driver_bytes', 0))} | "
            f"{fmt_mb(r.get('worker_to_worker_bytes', 0))} | {r['driver_peak_mb']:.0f} MB | "
            + (", ".join(f"{v:.0f}" for v in r["worker_peak_mb"]) + " MB" if "worker_peak_mb" in r else "-")
            + f" | {r.get('kxd_round_trip_s', float('nan')):.3f} s | {same} | "
            f"{r['load']['before'][0]:.1f} / {r['load']['after'][0]:.1f} |")
    lines += kmpar_traffic(rows)
    lines.append("")
    by = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r["seconds_per_iter"])
    med = {c: statistics.median(v) for c, v in by.items()}
    if {"inproc-1t", "dask-1w", "dask-2w"} <= set(med):
        over = med["dask-1w"] - med["inproc-1t"]
        kxd = statistics.median(r["kxd_round_trip_s"] for r in rows if r["config"] == "dask-1w")
        lines.append(f"* overhead dask-1w - inproc-1t: {over:.3f} s/iter (allowance 0.2 s + K x D round trip "
                     f"{kxd:.3f} s = {0.2 + kxd:.3f} s): {'met' if over <= 0.2 + kxd else 'missed'}")
        lines.append(f"* speed-up dask-2w over dask-1w: {med['dask-1w'] / med['dask-2w']:.2f}x")
    lines += paired_overhead(rows)
    return lines


def paired_overhead(rows):
    """dask-1w minus inproc-1t of the same round (run one after the other), each round and the median."""
    by_round = {}
    for r in rows:
        by_round.setdefault(r.get("round", 0), {})[r["config"]] = r
    pairs = [(rnd, p["inproc-1t"], p["dask-1w"]) for rnd, p in sorted(by_round.items())
             if {"inproc-1t", "dask-1w"} <= set(p)]
    if not pairs:
        return []
    diffs = [w["seconds_per_iter"] - i["seconds_per_iter"] for _, i, w in pairs]
    kxd = statistics.median(w["kxd_round_trip_s"] for _, _, w in pairs)
    med = statistics.median(diffs)
    lines = ["* overhead dask-1w - inproc-1t by round (adjacent runs): "
             + ", ".join(f"round {rnd + 1}: {w['seconds_per_iter']:.3f} - {i['seconds_per_iter']:.3f} = {d:.3f} s"
                         f" (load {i['load']['before'][0]:.1f} / {w['load']['before'][0]:.1f})"
                         for (rnd, i, w), d in zip(pairs, diffs)),
             f"* median paired overhead: {med:.3f} s/iter over a median in-process "
             f"{statistics.median(i['seconds_per_iter'] for _, i, _ in pairs):.3f} s/iter (allowance 0.2 s + "
             f"K x D round trip {kxd:.3f} s = {0.2 + kxd:.3f} s): "
             f"{'met' if med <= 0.2 + kxd else 'missed'}"]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(TS.DEFAULT_DATA_DIR))
    p.add_argument("--cache-dir", default=str(TS.CACHE_DIR))
    p.add_argument("--out", default=str(BENCH_DIR / "results" / "distributed"))
    p.add_argument("--datasets", default="20news-tfidf,generated")
    p.add_argument("--ks", default="100,500")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=100_000)
    p.add_argument("--density", type=float, default=1e-4)
    p.add_argument("--rows-per-shard", type=int, default=DEFAULT_ROWS_PER_SHARD,
                   help="generated matrix: rows per shard (another value gets its own shard directory)")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--interleave", action="store_true",
                   help="the configurations in the given order every round (A, B, A, B, ...; not rotated); the "
                        "summary adds the overhead of each round's dask-1w over its inproc-1t and their median")
    p.add_argument("--algorithms", default="lloyd,kmeans-par,qkmeans", help="any of lloyd, kmeans-par, qkmeans")
    p.add_argument("--palm-warm-iter", type=int, default=2, help="QK-means: least-squares sweeps per refit")
    p.add_argument("--quick", action="store_true", help="200,000 x 20,000 generated matrix, K=100, 2 iterations")
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--make-init", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        return run_config(json.loads(args.run))
    if args.make_init:
        return make_init(*args.make_init)
    if args.quick:
        args.rows, args.features, args.ks, args.iters, args.datasets = 200_000, 20_000, "100", 2, "generated"
        args.rows_per_shard = args.usual_rows_per_shard = 1 << 16
    args.datasets = args.datasets.split(",")
    args.ks = [int(k) for k in args.ks.split(",")]
    sets, inits = prepare(args)
    configs = args.configs.split(",")
    results, shapes = {}, {}
    for name, directory in sets.items():
        m = json.load(open(Path(directory) / "manifest.json"))
        shapes[name] = f"{m['n_rows']:,} x {m['n_features']:,} CSR, nnz {m['nnz']:,}, {len(m['shards'])} shards"
        for k in args.ks:
            key = f"{name}:{k}"
            results[key] = []
            for rnd in range(args.rounds):
                shift = 0 if args.interleave else rnd % len(configs)
                order = configs[shift:] + configs[:shift]
                for algorithm, config in [(a, c) for a in args.algorithms.split(",") for c in order]:
                    spec = {"config": config, "directory": directory, "init": inits[key], "iters": args.iters,
                            "algorithm": algorithm, "palm_warm_iter": args.palm_warm_iter}
                    print(f"[{time.strftime('%H:%M:%S')}] {key} round {rnd + 1} {algorithm} {config} "
                          f"load {uptime_load()}", flush=True)
                    proc = subprocess.run([sys.executable, __file__, "--run", json.dumps(spec)],
                                          capture_output=True, text=True)
                    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                    if proc.returncode or not line:
                        print(proc.stdout[-2000:], proc.stderr[-4000:], flush=True)
                        raise SystemExit(f"{key} {config} failed")
                    r = json.loads(line[-1][7:])
                    r["round"] = rnd
                    print("   ", {k2: r[k2] for k2 in ("seconds_per_iter", "inertia", "driver_peak_mb")}, flush=True)
                    results[key].append(r)
                    write(args, results, shapes)  # after every configuration: a partial run still leaves results
    print(write(args, results, shapes))


def write(args, results, shapes):
    import dask

    import qkm

    meta = {"command": " ".join([".venv/bin/python", "benchmarks/distributed.py"] + sys.argv[1:]),
            "cpu": cpu_name(), "qkm": qkm.__version__, "dask": dask.__version__, "iters": args.iters,
            "rounds": args.rounds, "interleave": args.interleave, "shapes": shapes}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    text = summarise(results, meta)
    TS.write_text_atomic(args.out + ".json", json.dumps(stamp({"meta": meta, "results": results}), indent=1))
    TS.write_text_atomic(args.out + ".md", stamp_md(text))
    return text


if __name__ == "__main__":
    main()
