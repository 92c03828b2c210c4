"""Seedings compared after Lloyd run to convergence, paired by seed index (the final-cost goal).

``seeding.py`` reports mean ± sd over 10 seeds with Lloyd capped at 100
iterations and ``tol=1e-4``; a final-cost gap of 0.1 % between seedings is
within that noise, and a Lloyd stopped early favours the seeding with the
lower seeding cost. This script runs, for every seed index s = 0 .. S-1 and
every method in turn (interleaved, so the machine's load hits all alike),
the seeding from ``RandomState(s)`` (as ``seeding.py`` does) and then Lloyd
from its centres to convergence (``qkm.KMeans(init=centres, n_init=1,
tol=0, max_iter=1000)``: it stops when no label changes, a fixed point of
Lloyd, unless the cap is hit, which the report counts). It reports, per
method, the seeding cost and the final cost, and per pair (method / reference)
the per-seed ratio of final costs: mean, sd, median, a bootstrap 95 %
interval of the mean ratio (10,000 resamples of the seeds), Wilcoxon's
signed-rank test on the paired final costs, a sign test (how often the
method ends lower than the reference), and how often both runs end in
the same local optimum (final costs equal to 1e-9 relative).

Rerun (from the repository root)::

    .venv/bin/python benchmarks/studies/seeding_paired.py --seeds 40 --threads 2 --out benchmarks/results/studies/seeding_d2_fmnist

Methods are ``seeding.py``'s names (``k-means++`` is plain k-means++,
``greedy k-means++`` has ``2 + floor(log2 K)`` candidates per step,
``d2-seeding N=10k`` ...); datasets are its ``DATASETS``.
"""

import argparse
import os
import sys

if __name__ == "__main__":
    # A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _machine import pin_threads

    pin_threads(sys.argv)  # before numpy is imported

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (see above)
import seeding as sb  # noqa: E402
import _bench_data as ts  # noqa: E402
from _machine import cpu_name, stamp, stamp_md  # noqa: E402

DEFAULT_METHODS = "d2-seeding N=10k,k-means++,greedy k-means++"
SAME = 1e-9  # relative difference of final costs below which two runs reached the same local optimum


def measure(X, data, K, method, seed, args):
    import qkm
    from qkm.clustering._seeding import run_seeding

    load_before = os.getloadavg()[0]
    seeds = run_seeding(sb.seeding_of(method, K), data, K, np.random.RandomState(seed))
    km = qkm.KMeans(K, init=seeds.centers, n_init=1, max_iter=args.max_iter, tol=args.tol,
                    algorithm=args.algorithm, n_jobs=args.threads)
    t = time.perf_counter()
    km.fit(X)
    return {"method": method, "seed": seed, "seeding_cost": seeds.cost, "seeding_s": seeds.seconds,
            "final_cost": float(km.inertia_), "lloyd_s": time.perf_counter() - t, "lloyd_iter": int(km.n_iter_),
            "capped": int(km.n_iter_) >= args.max_iter, "load1": load_before}


# --------------------------------------------------------------------------- statistics
def paired(rows, method, ref, key="final_cost", n_boot=10000):
    """Per-seed ratio ``method / ref`` of ``key`` over the seeds both have."""
    from scipy.stats import binomtest, wilcoxon

    a = {r["seed"]: r[key] for r in rows if r["method"] == method}
    b = {r["seed"]: r[key] for r in rows if r["method"] == ref}
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    x, y = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    ratio = x / y
    boot = np.random.RandomState(0).randint(len(seeds), size=(n_boot, len(seeds)))
    means = ratio[boot].mean(axis=1)
    medians = np.median(ratio[boot], axis=1)
    same = np.abs(x - y) <= SAME * np.maximum(np.abs(x), np.abs(y))
    diff = x - y
    p = float(wilcoxon(x[~same], y[~same]).pvalue) if np.count_nonzero(~same) >= 6 else float("nan")
    lower, higher = int(np.sum((diff < 0) & ~same)), int(np.sum((diff > 0) & ~same))
    sign_p = float(binomtest(lower, lower + higher).pvalue) if lower + higher else float("nan")
    return {"n": len(seeds), "mean": float(ratio.mean()), "sd": float(ratio.std(ddof=1)) if len(seeds) > 1 else 0.0,
            "median": float(np.median(ratio)), "ci95": [float(np.percentile(means, 2.5)),
                                                        float(np.percentile(means, 97.5))],
            "median_ci95": [float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))],
            "wilcoxon_p": p, "sign_p": sign_p, "same": int(same.sum()), "lower": lower, "higher": higher,
            "mean_of_costs_ratio": float(x.mean() / y.mean())}


def optima(rows, method):
    """Distinct final costs (to 1e-9 relative) reached by a method: [(cost, times)], lowest first."""
    costs = sorted(r["final_cost"] for r in rows if r["method"] == method)
    groups = []
    for c in costs:
        if groups and abs(c - groups[-1][0]) <= SAME * c:
            groups[-1][1] += 1
        else:
            groups.append([c, 1])
    return groups


def _ms(v, digits=4):
    v = np.asarray(v, dtype=float)
    return f"{v.mean():.{digits}g} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.2g}"


def report(out, meta, rows):
    methods = list(dict.fromkeys(r["method"] for r in rows))
    K, shape = meta["K"], meta["shape"]
    loads = [r["load1"] for r in rows]
    lines = [f"# Seedings after Lloyd to convergence, paired by seed ({meta['dataset']}, K = {K})", "",
             f"{'Report rebuilt from the JSONL rows by' if meta.get('report_only') else 'Rerun'}: "
             f"`{meta['command']}`", "", *([meta["note"], ""] if meta.get("note") else []),
             f"Machine: {meta['machine']}; threads = {meta['threads']}; load average (1 min) before each row: "
             f"min {min(loads):.2f}, median {np.median(loads):.2f}, max {max(loads):.2f}; data "
             f"{shape[0]} x {shape[1]}; Lloyd: `qkm.KMeans(init=centres, n_init=1, algorithm=\"{meta['algorithm']}\", "
             f"tol={meta['tol']}, max_iter={meta['max_iter']})` (tol=0: stops when no label changes).", "",
             "Costs are sums of squared distances over the whole data; mean ± sd over the seeds; times are wall "
             "seconds.", "",
             "| seeding | seeds | seeding cost | final cost | final cost median | Lloyd iters | capped | "
             "distinct optima | seeding s | Lloyd s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for m in methods:
        sel = [r for r in rows if r["method"] == m]
        f = [r["final_cost"] for r in sel]
        opt = optima(rows, m)
        summary[m] = {"seeds": len(sel), "seeding_cost": [float(np.mean([r["seeding_cost"] for r in sel])),
                                                          float(np.std([r["seeding_cost"] for r in sel], ddof=1))],
                      "final_cost": [float(np.mean(f)), float(np.std(f, ddof=1))], "optima": opt}
        lines.append(f"| {sb._cell(m)} | {len(sel)} | {_ms([r['seeding_cost'] for r in sel])} | {_ms(f)} | "
                     f"{np.median(f):.7g} | {_ms([r['lloyd_iter'] for r in sel], 3)} | "
                     f"{sum(r['capped'] for r in sel)} | {len(opt)} | {_ms([r['seeding_s'] for r in sel], 3)} | "
                     f"{_ms([r['lloyd_s'] for r in sel], 3)} |")
    lines += ["", "## Paired by seed index: per-seed ratio method / reference", "",
              "| method / reference | seeds | seeding cost ratio mean | final ratio mean | sd | median | "
              "bootstrap 95 % CI of mean | of median | Wilcoxon p (unequal pairs) | same optimum | lower | higher | "
              "sign test p |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pairs = {}
    refs = [m for m in methods if not m.startswith("d2-seeding")]
    for m in methods:
        for ref in refs:
            if m == ref or (not m.startswith("d2-seeding") and refs.index(m) > refs.index(ref)):
                continue
            st = paired(rows, m, ref)
            sc = paired(rows, m, ref, key="seeding_cost")
            if st is None:
                continue
            pairs[f"{m} / {ref}"] = {"final": st, "seeding": sc}
            lines.append(f"| {sb._cell(m)} / {sb._cell(ref)} | {st['n']} | {sc['mean']:.3f} | {st['mean']:.5f} | "
                         f"{st['sd']:.4f} | {st['median']:.5f} | [{st['ci95'][0]:.5f}, {st['ci95'][1]:.5f}] | "
                         f"[{st['median_ci95'][0]:.5f}, {st['median_ci95'][1]:.5f}] | {st['wilcoxon_p']:.3g} | "
                         f"{st['same']} | {st['lower']} | {st['higher']} | {st['sign_p']:.3g} |")
    lines += ["", "## Local optima reached (final cost: times)", ""]
    for m in methods:
        lines.append(f"- {sb._cell(m)}: " + ", ".join(f"{c:.7g}: {n}" for c, n in summary[m]["optima"]))
    lines.append("")
    text = "\n".join(lines)
    ts.write_text_atomic(out + ".md", stamp_md(text))
    ts.write_text_atomic(out + ".json", json.dumps(stamp({**meta, "summary": summary, "pairs": pairs, "rows": rows}),
                                                   indent=1, default=float) + "\n")
    return text


# --------------------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashion-mnist-10", help="one of " + ", ".join(sb.DATASETS))
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated (default: {DEFAULT_METHODS})")
    p.add_argument("--seeds", type=int, default=40, help="seeds 0 .. N-1 (default 40)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--tol", type=float, default=0.0)
    p.add_argument("--algorithm", default="elkan", help="Lloyd's labels either way; elkan is faster here")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=str(ts.DEFAULT_DATA_DIR))
    p.add_argument("--cache-dir", default=str(ts.CACHE_DIR))
    p.add_argument("--out", required=True, help="write <out>.json, <out>.md and <out>.jsonl (progress)")
    p.add_argument("--resume", action="store_true", help="skip rows already in <out>.jsonl")
    p.add_argument("--report-only", action="store_true", help="rebuild <out>.md/.json from <out>.jsonl")
    p.add_argument("--note", default="")
    args = p.parse_args()
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)

    from qkm._data import KMeansData
    from qkm._threads import numba_threads
    from qkm._validation import check_data
    from qkm.clustering._seeding import Seeding, run_seeding

    key, K = sb.DATASETS[args.dataset]
    methods = args.methods.split(",")
    progress = Path(args.out + ".jsonl")
    rows = []
    if (args.resume or args.report_only) and progress.exists():
        rows = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    elif progress.exists():
        progress.unlink()
    done = {(r["method"], r["seed"]) for r in rows}
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--note" and sys.argv[i] != "--note"]
    meta = {"command": " ".join([".venv/bin/python", "benchmarks/studies/seeding_paired.py"] + argv),
            "machine": f"{cpu_name()}, {os.cpu_count()} logical cores", "threads": args.threads,
            "dataset": args.dataset, "K": K, "max_iter": args.max_iter, "tol": args.tol,
            "algorithm": args.algorithm, "python": platform.python_version()}
    if args.note:
        meta["note"] = args.note
    X = check_data(sb.load(key, args.data_dir, args.cache_dir))
    meta["shape"] = list(X.shape)
    if args.report_only:
        meta["report_only"] = True
        print(report(args.out, meta, rows))
        return
    print(f"load at start {os.getloadavg()}", flush=True)
    with numba_threads(args.threads):
        data = KMeansData(X)
        for init in ("k-means++", "d2-seeding"):  # warm the kernels outside the timings
            run_seeding(Seeding(init, d2_samples=20), KMeansData(X[:200]), 3, np.random.RandomState(0))
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for m in methods:
                if (m, seed) in done:
                    continue
                row = measure(X, data, K, m, seed, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(progress, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"load at end {os.getloadavg()}", flush=True)
    print(report(args.out, meta, rows))


if __name__ == "__main__":
    main()
