"""Seedings side by side: the "Fast Parallel Initialisation for k-means" supplement's Table 1 and 2 protocol.

For every dataset and seed, every seeding runs in turn (interleaved, so the
machine's load hits all of them alike): random rows, k-means++ (plain: one
candidate per step; greedy: ``2 + floor(log2 K)`` candidates), k-means||
(ell = 2K, r = 5), D^2-seeding with N = K, 2K, 5K, 10K, 20K, and SystemML's
sampled k-means++ (greedy k-means++ on about 50 K rows). Each seeding's cost
(potential on the whole data) and time are recorded, then Lloyd runs from its
centres (``qkm.KMeans(init=centres, n_init=1, algorithm="elkan")``, dense and
sparse: Elkan gives Lloyd's labels, faster; ``--max-iter`` caps the
iterations, ``tol=1e-4``) and its final cost and time are recorded. The
seeding time excludes the extra assignment pass that measures the cost of
seedings that do not know it (random rows, k-means||, sampled).

Rerun (from the repository root; caches go to ``benchmarks/.cache``)::

    .venv/bin/python benchmarks/seeding.py --out benchmarks/results/seeding
    .venv/bin/python benchmarks/seeding.py --datasets birch,coil20 --seeds 3     # a subset
    .venv/bin/python benchmarks/seeding.py --groups-study --out benchmarks/results/seeding_groups

``--groups-study`` measures how the D^2 sample is clustered instead (flat K
groups, 2 + log2 K groups, the supplement read literally, a tree of K leaves).
Rows are appended to ``<out>.jsonl`` as they finish; ``--resume`` skips the
rows already there. Datasets (``--data-dir``, default ``../shared/data``):

* ``fashion-mnist-10``, ``fashion-mnist-64``: 60,000 x 784 train images / 255.
* ``kddcup99``: the 10 % file, 494,021 x 118: the 38 numeric columns z-scored,
  protocol_type / service / flag one-hot (0/1, not scaled), label dropped.
* ``coil20``: 1,440 x 1,024 images / 255.
* ``20news-tfidf``: train + test, ``TfidfVectorizer()``, 18,846 x 173,762 CSR
  (``train_sparse.py``'s vectoriser and cache).
* ``birch``: Birch1-like synthetic set, 100 Gaussian blobs (sd 1, 1,000
  points each) on a 10 x 10 grid with spacing 4 sqrt(2), seed 0.
"""

import argparse
import os
import sys


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _machine import pin_threads

    pin_threads(sys.argv)  # before numpy is imported

import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_data as ts  # noqa: E402
from _machine import cpu_name, stamp, stamp_md  # noqa: E402

DATASETS = {  # name: (loader key, K)
    "fashion-mnist-10": ("fashion-mnist", 10),
    "fashion-mnist-64": ("fashion-mnist", 64),
    "kddcup99": ("kddcup99", 100),
    "coil20": ("coil20", 20),
    "20news-tfidf": ("20news-tfidf", 500),
    "birch": ("birch", 100),
}
GROUP_STUDY = {  # name: (loader key, K)
    "fashion-mnist-10": ("fashion-mnist", 10),
    "coil20": ("coil20", 20),
    "birch": ("birch", 100),
    "birch-20x20": ("birch-20x20", 400),
    "20news-tfidf-100": ("20news-tfidf", 100),
}
D2_MULTIPLES = (1, 2, 5, 10, 20)
METHODS = (["random", "k-means++", "greedy k-means++", "k-means||"]
           + [f"d2-seeding N={m}k" if m > 1 else "d2-seeding N=k" for m in D2_MULTIPLES] + ["sampled k-means++"])

# The supplement (Tables 1 and 2): mean cost, seeding seconds on 40 threads.
SUPPLEMENT = {
    "MNIST (x1e10)": {"random": (31.97, 9.75), "k-means++": (32.42, 1.91), "k-means||": (31.21, 10.68),
                      "d2-seeding N=10k": (21.23, 2.26)},
    "Birch1 (x1e12)": {"random": (296.02, 21.95), "k-means++": (189.54, 27.39), "k-means||": (190.09, 9.93),
                       "d2-seeding N=10k": (120.63, 37.16)},
    "Birch2 (x1e10)": {"random": (788.84, 9.80), "k-means++": (165.16, 26.83), "k-means||": (156.26, 10.15),
                       "d2-seeding N=10k": (50.40, 36.51)},
    "Birch3 (x1e12)": {"random": (168.08, 28.24), "k-means++": (67.78, 25.55), "k-means||": (67.73, 10.21),
                       "d2-seeding N=10k": (45.66, 38.50)},
}
SUPPLEMENT_N = {  # Table 1: D^2-seeding cost against N (MNIST x1e10, Birch1 x1e12)
    "MNIST (x1e10)": {1: 31.98, 2: 22.65, 5: 21.42, 10: 20.99, 20: 21.42},
    "Birch1 (x1e12)": {1: 140.97, 2: 131.82, 5: 121.09, 10: 122.42, 20: 121.53},
}


# --------------------------------------------------------------------------- data
def _cached(cache_dir, name, build):
    path = Path(cache_dir) / f"seeding_{name}.npy"
    if not path.exists():
        ts.save_array_atomic(path, build())
    return np.load(path)


def load_kddcup99(data_dir):
    """494,021 x 118: numeric columns z-scored, the three symbolic columns one-hot, label dropped."""
    with gzip.open(Path(data_dir) / "kddcup99" / "kddcup.data_10_percent.gz", "rt") as f:
        rows = [line.rstrip("\n").split(",") for line in f if line.strip()]
    symbolic = (1, 2, 3)
    numeric = [j for j in range(41) if j not in symbolic]
    num = np.array([[float(r[j]) for j in numeric] for r in rows])
    sd = num.std(axis=0)
    num = (num - num.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    blocks = [num]
    for j in symbolic:
        values = sorted({r[j] for r in rows})
        index = {v: i for i, v in enumerate(values)}
        onehot = np.zeros((len(rows), len(values)))
        onehot[np.arange(len(rows)), [index[r[j]] for r in rows]] = 1.0
        blocks.append(onehot)
    return np.ascontiguousarray(np.hstack(blocks))


def birch_like(grid=10, per_blob=1000, seed=0):
    rng = np.random.RandomState(seed)
    spacing = 4 * np.sqrt(2)
    centres = np.array([(i * spacing, j * spacing) for i in range(grid) for j in range(grid)])
    return np.repeat(centres, per_blob, axis=0) + rng.normal(size=(grid * grid * per_blob, 2))


def load(key, data_dir, cache_dir):
    if key in ("fashion-mnist", "20news-tfidf"):
        return ts.load_array(ts.ensure_matrix(key, data_dir, cache_dir, None))
    if key == "kddcup99":
        return _cached(cache_dir, "kddcup99", lambda: load_kddcup99(data_dir))
    if key == "coil20":
        import scipy.io

        return scipy.io.loadmat(str(Path(data_dir) / "coil20" / "COIL20.mat"))["X"].astype(np.float64) / 255.0
    if key == "birch":
        return birch_like()
    if key == "birch-20x20":
        return birch_like(grid=20, per_blob=250)
    raise ValueError(key)


# --------------------------------------------------------------------------- one measurement
def seeding_of(method, K):
    from qkm.clustering._seeding import Seeding

    if method == "random":
        return Seeding("random")
    if method == "k-means++":
        return Seeding("k-means++", n_local_trials=1)
    if method == "greedy k-means++":
        return Seeding("k-means++")
    if method == "k-means||":
        return Seeding("k-means||", oversampling_factor=2.0, init_rounds=5)
    if method == "sampled k-means++":
        return Seeding("k-means++", init_sample=50.0)
    if method.startswith("d2-seeding N="):
        m = method.split("=")[1]
        mult = 1 if m == "k" else int(m[:-1])
        return Seeding("d2-seeding", d2_samples=mult * K)
    raise ValueError(method)


def measure(X, data, K, method, seed, args, seeding=None):
    import qkm
    from qkm.clustering._seeding import run_seeding

    seeding = seeding or seeding_of(method, K)
    load_before = os.getloadavg()[0]
    seeds = run_seeding(seeding, data, K, np.random.RandomState(seed))
    row = {"method": method, "seed": seed, "seeding_cost": seeds.cost, "seeding_s": seeds.seconds,
           "seeded_rows": seeds.n_seeded_rows, "load1": load_before}
    if args.max_iter > 0:
        km = qkm.KMeans(K, init=seeds.centers, n_init=1, max_iter=args.max_iter,
                        algorithm="elkan", n_jobs=args.threads)
        t = time.perf_counter()
        km.fit(X)
        row.update(final_cost=float(km.inertia_), lloyd_s=time.perf_counter() - t, lloyd_iter=int(km.n_iter_))
    return row


# --------------------------------------------------------------------------- reports
def _stats(rows, key):
    v = np.array([r[key] for r in rows if r.get(key) is not None], dtype=float)
    return (float(v.mean()), float(v.std()), len(v)) if len(v) else (np.nan, np.nan, 0)


def summarise(rows, methods):
    out = {}
    for m in methods:
        sel = [r for r in rows if r["method"] == m]
        if sel:
            out[m] = {k: _stats(sel, k) for k in ("seeding_cost", "seeding_s", "final_cost", "lloyd_s", "lloyd_iter")}
    return out


def _fmt(mean_sd, digits=4):
    mean, sd, _ = mean_sd
    if not np.isfinite(mean):
        return "–"
    return f"{mean:.{digits}g} ± {sd:.2g}"


def _cell(text):
    """Text for a Markdown table cell (k-means|| has pipes)."""
    return text.replace("|", "\\|")


def goals(summary):
    """Every goal of the issue, measured: (text, value, met)."""
    res = []

    def get(ds, m, key):
        return summary.get(ds, {}).get(m, {}).get(key, (np.nan,))[0]

    for ds in ("fashion-mnist-10", "birch"):
        d2, pp, gr = (get(ds, m, "seeding_cost") for m in ("d2-seeding N=10k", "k-means++", "greedy k-means++"))
        f_d2, f_pp, f_gr = (get(ds, m, "final_cost") for m in ("d2-seeding N=10k", "k-means++", "greedy k-means++"))
        if np.isfinite(d2):
            res.append((f"{ds}: D2 (N=10k) seeding cost / k-means++ (plain) <= 0.70", d2 / pp, d2 / pp <= 0.70))
            res.append((f"{ds}: D2 (N=10k) seeding cost / greedy k-means++ <= 0.70", d2 / gr, d2 / gr <= 0.70))
            res.append((f"{ds}: D2 final cost / plain k-means++ final cost <= 1", f_d2 / f_pp, f_d2 <= f_pp))
            res.append((f"{ds}: D2 final cost / greedy k-means++ final cost <= 1", f_d2 / f_gr, f_d2 <= f_gr))
    ds = "20news-tfidf"
    t_kp, t_gr, t_d2 = (get(ds, m, "seeding_s") for m in ("k-means||", "greedy k-means++", "d2-seeding N=10k"))
    if np.isfinite(t_kp):
        res.append((f"{ds}: greedy k-means++ time / k-means|| time >= 3", t_gr / t_kp, t_gr / t_kp >= 3))
        fk, fg = get(ds, "k-means||", "final_cost"), get(ds, "greedy k-means++", "final_cost")
        res.append((f"{ds}: |k-means|| final / greedy final - 1| <= 1 %", fk / fg - 1, abs(fk / fg - 1) <= 0.01))
    if np.isfinite(t_d2):
        res.append((f"{ds}: D2 (N=10k) time / greedy k-means++ time <= 10", t_d2 / t_gr, t_d2 / t_gr <= 10))
        c_d2, c_gr = get(ds, "d2-seeding N=10k", "seeding_cost"), get(ds, "greedy k-means++", "seeding_cost")
        res.append((f"{ds}: D2 (N=10k) seeding cost / greedy k-means++ < 1", c_d2 / c_gr, c_d2 < c_gr))
    ds = "fashion-mnist-64"
    t_s, t_g = get(ds, "sampled k-means++", "seeding_s"), get(ds, "greedy k-means++", "seeding_s")
    if np.isfinite(t_s):
        res.append((f"{ds}: full (greedy) k-means++ time / sampled (samp=50) time >= 5", t_g / t_s, t_g / t_s >= 5))
        fs, fg = get(ds, "sampled k-means++", "final_cost"), get(ds, "greedy k-means++", "final_cost")
        res.append((f"{ds}: |sampled final / full final - 1| <= 1 %", fs / fg - 1, abs(fs / fg - 1) <= 0.01))
    return res


def write_reports(out, meta, rows, study):
    from qkm._version import __version__

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    summary = {ds: summarise([r for r in rows if r["dataset"] == ds], methods) for ds in datasets}
    lines = [f"# Seedings ({'D^2 sample clustering study' if study else 'supplement Table 1/2 protocol'})", "",
             f"{'Report rebuilt from the JSONL rows by' if meta.get('report_only') else 'Rerun'}: "
             f"`{meta['command']}`", "",
             *([meta["note"], ""] if meta.get("note") else []),
             f"Machine: {meta['machine']}; threads = {meta['threads']}; load average (1 min) "
             + (f"at start {meta['load_start']:.2f}, at end {meta.get('load_end', float('nan')):.2f} "
                if meta.get("load_start") is not None else "")
             + f"(before each row, in the JSON: min {min(r['load1'] for r in rows):.2f}, median "
             f"{np.median([r['load1'] for r in rows]):.2f}, max {max(r['load1'] for r in rows):.2f}); "
             f"qkm {__version__}; Lloyd cap {meta['max_iter']} iterations, tol 1e-4.", "",
             "Costs are sums of squared distances over the whole data; times are wall seconds; mean ± sd over "
             "the seeds. Seeding time excludes the cost-measuring pass of random / k-means|| / sampled.", ""]
    for ds in datasets:
        sel = [r for r in rows if r["dataset"] == ds]
        s = summary[ds]
        ref = s.get("k-means++", {}).get("seeding_cost", (np.nan,))[0]
        ref_g = s.get("greedy k-means++", {}).get("seeding_cost", (np.nan,))[0]
        ref_t = s.get("greedy k-means++", {}).get("seeding_s", (np.nan,))[0]
        lines += [f"## {ds} (K = {sel[0]['K']}, {sel[0]['shape'][0]} x {sel[0]['shape'][1]}"
                  f"{', sparse' if sel[0]['sparse'] else ''}; seeds: {len({r['seed'] for r in sel})})", "",
                  "| seeding | seeding cost | / k-means++ | / greedy | seeding s | / greedy s | final cost | "
                  "Lloyd s | Lloyd iters |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m in methods:
            if m not in s:
                continue
            st = s[m]
            c = st["seeding_cost"][0]
            lines.append(f"| {_cell(m)} | {_fmt(st['seeding_cost'])} | {c / ref:.3f} | {c / ref_g:.3f} | "
                         f"{_fmt(st['seeding_s'], 3)} | {st['seeding_s'][0] / ref_t:.2f} | {_fmt(st['final_cost'])} | "
                         f"{_fmt(st['lloyd_s'], 3)} | {_fmt(st['lloyd_iter'], 3)} |")
        lines.append("")
    if not study:
        lines += ["## The supplement's figures (40 threads; cost / k-means++ cost, seeding time / k-means++ time)", "",
                  "| data | k-means++ cost | random | k-means\\|\\| | D^2 N=10k | k-means++ s | k-means\\|\\| s | D^2 s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, t in SUPPLEMENT.items():
            pp = t["k-means++"]
            lines.append(f"| {name} | {pp[0]} | {t['random'][0] / pp[0]:.3f} | {t['k-means||'][0] / pp[0]:.3f} | "
                         f"{t['d2-seeding N=10k'][0] / pp[0]:.3f} | {pp[1]} | {t['k-means||'][1]} | "
                         f"{t['d2-seeding N=10k'][1]} |")
        lines += ["", "Table 1, D^2-seeding cost against N, relative to N = 10k: "
                  + "; ".join(f"{name}: " + ", ".join(f"N={m if m > 1 else ''}k {v / t[10]:.3f}" for m, v in t.items())
                              for name, t in SUPPLEMENT_N.items()), ""]
        lines += ["## Goals of the issue", "", "| goal | measured | met |", "|---|---:|---|"]
        for text, value, met in goals(summary):
            lines.append(f"| {_cell(text)} | {value:.3f} | {'yes' if met else '**no**'} |")
        lines.append("")
    text = "\n".join(lines)
    ts.write_text_atomic(out + ".md", stamp_md(text))
    ts.write_text_atomic(out + ".json", json.dumps(stamp({**meta, "summary": summary, "rows": rows}), indent=1,
                                                   default=float) + "\n")
    return text


# --------------------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=None, help="comma-separated subset (default: all of the mode)")
    p.add_argument("--methods", default=None, help="comma-separated subset of " + ", ".join(METHODS))
    p.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    p.add_argument("--seeds-for", default="", help="per-dataset seed counts, e.g. 20news-tfidf=3")
    p.add_argument("--max-iter", type=int, default=100, help="Lloyd iteration cap; 0 = no Lloyd (default 100)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--groups-study", action="store_true", help="compare the ways of clustering the D^2 sample")
    p.add_argument("--data-dir", default=str(ts.DEFAULT_DATA_DIR))
    p.add_argument("--cache-dir", default=str(ts.CACHE_DIR))
    p.add_argument("--out", default=None, help="write <out>.json, <out>.md and <out>.jsonl (progress)")
    p.add_argument("--resume", action="store_true", help="skip rows already in <out>.jsonl")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: rebuild <out>.md and <out>.json from the rows in <out>.jsonl")
    p.add_argument("--note", default="", help="a line for the report (e.g. how the rows were gathered)")
    args = p.parse_args()
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)

    from qkm._data import KMeansData
    from qkm.clustering._seeding import Seeding
    from qkm._threads import numba_threads
    from qkm._validation import check_data

    table = GROUP_STUDY if args.groups_study else DATASETS
    names = args.datasets.split(",") if args.datasets else list(table)
    if args.groups_study:
        methods = [f"d2-seeding groups={g}" for g in ("auto", "flat", "few", "k", "tree")] + ["greedy k-means++",
                                                                                              "k-means++"]
    else:
        methods = args.methods.split(",") if args.methods else list(METHODS)
    seeds_for = dict(item.split("=") for item in args.seeds_for.split(",") if item)
    done, rows = set(), []
    progress = Path(args.out + ".jsonl") if args.out else None
    if progress and (args.resume or args.report_only) and progress.exists():
        rows = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
        done = {(r["dataset"], r["method"], r["seed"]) for r in rows}
    elif progress and progress.exists():
        progress.unlink()
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--note" and sys.argv[i] != "--note"]  # no note text
    meta = {"command": " ".join([".venv/bin/python", "benchmarks/seeding.py"] + argv),
            "machine": f"{cpu_name()}, {os.cpu_count()} logical cores",
            "threads": args.threads, "max_iter": args.max_iter, "load_start": os.getloadavg()[0],
            "python": platform.python_version()}
    if args.note:
        meta["note"] = args.note
    if args.report_only:
        rows = [r for r in rows if r["dataset"] in names]
        meta.update(load_start=None, report_only=True)
        print(write_reports(args.out, meta, rows, args.groups_study))
        return
    print(f"load at start {os.getloadavg()}", flush=True)
    with numba_threads(args.threads):
        for name in names:
            key, K = table[name]
            X = check_data(load(key, args.data_dir, args.cache_dir))
            data = KMeansData(X)
            from qkm.clustering._seeding import run_seeding  # warm the kernels outside the timings

            for init in ("k-means++", "d2-seeding", "k-means||", "random"):
                run_seeding(Seeding(init, d2_samples=20), KMeansData(X[:200]), 3, np.random.RandomState(0))
            for seed in range(int(seeds_for.get(name, args.seeds))):
                for m in methods:
                    if (name, m, seed) in done:
                        continue
                    seeding = None
                    if m.startswith("d2-seeding groups="):
                        seeding = Seeding("d2-seeding", d2_groups=m.split("=")[1])
                    elif args.groups_study:
                        seeding = seeding_of(m, K)
                    row = measure(X, data, K, m, seed, args, seeding)
                    row.update(dataset=name, K=K, shape=list(X.shape), sparse=bool(sp.issparse(X)))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if progress:
                        with open(progress, "a") as f:
                            f.write(json.dumps(row) + "\n")
    meta["load_end"] = os.getloadavg()[0]
    print(f"load at end {os.getloadavg()}", flush=True)
    if args.out:
        print(write_reports(args.out, meta, rows, args.groups_study))


if __name__ == "__main__":
    main()
