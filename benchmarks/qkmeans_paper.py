"""QK-means against K-means, low-rank K-means and K-means + palm4MSA: the paper's protocol, and when QK-means pays.

Rerun (from the repository root; matplotlib draws the plot)::

    .venv/bin/pip install -r benchmarks/requirements.txt
    .venv/bin/python benchmarks/qkmeans_paper.py --out benchmarks/results/qkmeans_paper

Protocol. For every (data set, K, seed) one seeding is shared by
every method: scikit-learn's ``kmeans_plusplus(X - mean, K, random_state=seed)``
on the centred float32 data, plus the mean (every method runs on the raw
data; K-means and the objectives do not depend on the translation). Every
method runs 20 Lloyd iterations from those seeds:

* ``kmeans``            ``qkm.KMeans(init=seeds, max_iter=20, tol=0)``: the objective to match;
* ``qkmeans s=2,3,5``   ``qkm.QKMeans(K, sparsity_level=s, init=seeds, max_iter=20)``, defaults otherwise;
* ``lowrank r``         ``qkm.LowRankKMeans(K, rank=r, init=seeds, max_iter=20)`` with ``r (K + D)``
                        closest to the matching QK-means model's values;
* ``kmeans+palm4msa``   the paper's Table 3 baseline: hierarchical palm4MSA (s) of K-means' centroids on the
                        paper's chain of ``floor(log2(max(K, D)))`` factors;
* ``kmeans+factorize``  K-means' centroids through QK-means' factorisation on QK-means' default chain
                        (``qkm.palm4msa.factorize``, 2 factors, ``budget_split="total"``, weighted by the
                        cluster sizes, 300 sweeps): the same values in the same shapes as ``qkmeans``.

Each model is then measured: objective (sum of squared distances to the assigned
centroid) and its ratio to K-means', AMI against the true labels, values stored
(factor nonzeros, plus the mean when a model keeps one), bytes of its safe-format
file, CPU seconds of the fit, and assignment time through its centroid operator
(``operator.assign``): one row per call (median over 200 rows of the best of 3
calls each) and per row of a batch of 10,000 (best of 5): best-of timings, since
the machine is shared. The ``defaults`` table fits
``QKMeans(n_clusters=K, sparsity_level=s)`` and ``KMeans(n_clusters=K)`` with
every other parameter at its default on the raw data (seeds from ``random_state``),
interleaved, and compares objective, AMI and CPU time.

Threads are pinned to ``--threads`` (default 1) before numpy is imported. Data
(``--data-dir``, default ``<repo>/../shared/data``): see ``_paper_data.py``.
"""

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paper_data import load_dataset  # noqa: E402  (also used by paper_table4.py)

REPO = Path(__file__).resolve().parents[1]

#: (K values) per data set; sparsity levels for every cell.
CELLS = {"fashion-mnist": (64,), "coil20": (20, 32, 64), "kddcup99": (256,)}
LEVELS = (2, 3, 5)
ITERATIONS = 20

#: The issue's measurements of the paper's code (lucgiffon/qkmeans, 2020 settings: hierarchical init, 300
#: palm4MSA iterations per Lloyd iteration) on Fashion-MNIST, K = 64, centred data, its own k-means++ seeds
#: (random_state=0 on data loaded elsewhere: the seeds are not these), and the paper's Table 3 for COIL-20.
REFERENCE = [
    dict(dataset="fashion-mnist", K=64, s=3, ratio=1.1223, nnz=4638, ami=0.4843, kmeans_ami=0.4910, cpu=1116.0,
         source="lucgiffon/qkmeans run"),
    dict(dataset="fashion-mnist", K=64, s=5, ratio=1.0579, nnz=7401, ami=0.4877, kmeans_ami=0.4910, cpu=1231.0,
         source="lucgiffon/qkmeans run (paper Table 3: 1.0582)"),
    dict(dataset="coil20", K=64, s=5, ratio=1.661e4 / 1.332e4, nnz=None, ami=None, kmeans_ami=None, cpu=None,
         source="paper Table 3 (1.661e4 / 1.332e4; '32' there is the 32 x 32 image size; s = 5 as its caption and "
                "the Fashion-MNIST cell say; K = 64 as its Table 4; its 964-row training split; nnz not given: "
                "its s = 3 model has 5,585)"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="fashion-mnist,coil20,kddcup99")
    p.add_argument("--seeds", default="0,1,2", help="k-means++ seeds of the protocol (each a full row group)")
    p.add_argument("--kdd-seeds", default="0", help="seeds for kddcup99 (494,021 rows: one by default)")
    p.add_argument("--default-seeds", default="0,1,2", help="random_state of the defaults runs ('' to skip)")
    p.add_argument("--default-levels", default="3,5")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--out", default=None, help="write <out>.json, <out>.md and <out>.png")
    p.add_argument("--render-from", default=None,
                   help="only rebuild the table and plot from results JSONs (comma-separated parts run apart, e.g. "
                        "one seed each, are merged; with --out the merged JSON is written too)")
    return p.parse_args()


# --------------------------------------------------------------------------- #
# measuring one model
# --------------------------------------------------------------------------- #
def measure_operator(op, X, tmp_path):
    import numpy as np

    from qkm.export import Model, save_model

    rows = X[:200]
    op.assign(rows[:1])
    op.assign(rows[:1])
    single = [min(_timed(lambda: op.assign(rows[i:i + 1])) for _ in range(3)) for i in range(rows.shape[0])]
    batch = X[:10000]
    op.assign(batch)
    best = min(_timed(lambda: op.assign(batch)) for _ in range(5))
    save_model(Model(op, {}), tmp_path)
    return dict(values=int(op.nnz + op.mean_nnz), mean_values=int(op.mean_nnz), bytes=int(Path(tmp_path).stat().st_size),
                us_one_row=float(np.median(single) * 1e6), us_per_row_batch=float(best / batch.shape[0] * 1e6),
                path_one_row=op.execution_path(1), path_batch=op.execution_path(batch.shape[0]))


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _fit(make):
    c, w = time.process_time(), time.perf_counter()
    est = make()
    return est, time.process_time() - c, time.perf_counter() - w


# --------------------------------------------------------------------------- #
# the protocol
# --------------------------------------------------------------------------- #
def run_cell(name, X, y, K, seed, tmp_path):
    import numpy as np
    from sklearn.cluster import kmeans_plusplus
    from sklearn.metrics import adjusted_mutual_info_score

    import qkm
    from qkm.factorization._shapes import default_n_factors
    from qkm.factorization._shapes import paper_n_factors
    from qkm.operator import FactorChainOperator
    from qkm.factorization import factorize, hierarchical_palm4msa

    n, D = X.shape
    Q, paper_Q = default_n_factors(K, D), paper_n_factors(K, D)   # QK-means' default chain, the paper's
    mean = X.mean(axis=0, dtype=np.float64)
    seeds = kmeans_plusplus((X - mean).astype(np.float32), K, random_state=seed)[0]
    init = (seeds + mean).astype(np.float32)
    rows = []

    def add(method, op, labels, cpu, wall, **extra):
        obj = float(op.assign(X)[1].sum())
        rec = dict(dataset=name, n_samples=n, n_features=D, K=K, Q=Q, paper_Q=paper_Q, seed=seed, method=method, objective=obj,
                   ami=float(adjusted_mutual_info_score(y, labels)), cpu=cpu, wall=wall, **extra)
        rec.update(measure_operator(op, X, tmp_path))
        rows.append(rec)
        print(f"{name} K={K} seed={seed} {method:22s} obj={obj:.6g} values={rec['values']} cpu={cpu:.1f}s "
              f"1-row={rec['us_one_row']:.1f}us batch={rec['us_per_row_batch']:.2f}us/row", flush=True)

    km, km_cpu, km_wall = _fit(lambda: qkm.KMeans(K, init=init, n_init=1, max_iter=ITERATIONS, tol=0.0).fit(X))
    add("kmeans", km.operator_, km.labels_, km_cpu, km_wall, s=None)
    counts = np.bincount(km.labels_, minlength=K).astype(np.float64)
    for s in LEVELS:
        qk, cpu, wall = _fit(lambda: qkm.QKMeans(K, sparsity_level=s, init=init, max_iter=ITERATIONS).fit(X))
        add(f"qkmeans s={s}", qk.operator_, qk.labels_, cpu, wall, s=s)
        rank = max(1, int(round(qk.nnz_with_mean_ / (K + D))))
        lr, cpu, wall = _fit(lambda: qkm.LowRankKMeans(K, rank=rank, init=init, max_iter=ITERATIONS).fit(X))
        add(f"lowrank r={rank}", lr.operator_, lr.labels_, cpu, wall, s=s, rank=rank)
        if s == 2:
            continue
        C = km.cluster_centers_.astype(np.float64)
        c0, w0 = time.process_time(), time.perf_counter()
        res = hierarchical_palm4msa(C, paper_Q, sparsity_level=s)
        op = FactorChainOperator([res.lambda_ * res.factors[0]] + res.factors[1:], dtype=X.dtype)
        add(f"kmeans+palm4msa s={s}", op, op.assign(X)[0], km_cpu + time.process_time() - c0,
            km_wall + time.perf_counter() - w0, s=s)
        c0, w0 = time.process_time(), time.perf_counter()
        res = factorize(C, Q, sparsity_level=s, weights=np.sqrt(counts), max_iter=300, budget_split="total")
        op = FactorChainOperator([res.lambda_ * res.factors[0]] + res.factors[1:], dtype=X.dtype)
        add(f"kmeans+factorize s={s}", op, op.assign(X)[0], km_cpu + time.process_time() - c0,
            km_wall + time.perf_counter() - w0, s=s)
    base = rows[0]["objective"]
    for r in rows:
        r["ratio"] = r["objective"] / base
        r["kmeans_ami"] = rows[0]["ami"]
    return rows


def run_defaults(X, y, K, levels, seeds):
    import numpy as np
    from sklearn.metrics import adjusted_mutual_info_score

    import qkm

    out = []
    for seed in seeds:
        km, km_cpu, km_wall = _fit(lambda: qkm.KMeans(n_clusters=K, random_state=seed).fit(X))
        for s in levels:
            qk, cpu, wall = _fit(lambda: qkm.QKMeans(n_clusters=K, sparsity_level=s, random_state=seed).fit(X))
            out.append(dict(K=K, s=s, seed=seed, ratio=qk.inertia_ / km.inertia_,
                            ami=float(adjusted_mutual_info_score(y, qk.labels_)),
                            kmeans_ami=float(adjusted_mutual_info_score(y, km.labels_)), values=int(qk.nnz_with_mean_),
                            cpu=cpu, wall=wall, kmeans_cpu=km_cpu, kmeans_wall=km_wall, cpu_ratio=cpu / km_cpu,
                            n_iter=int(qk.n_iter_), kmeans_n_iter=int(km.n_iter_)))
            print(f"defaults K={K} s={s} seed={seed}: ratio={out[-1]['ratio']:.4f} ami={out[-1]['ami']:.4f} "
                  f"cpu={cpu:.1f}s vs KMeans {km_cpu:.1f}s", flush=True)
    return out


# --------------------------------------------------------------------------- #
# report
# --------------------------------------------------------------------------- #
def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarise(rows):
    """Mean over seeds of every (dataset, K, method) group (median for the timings), in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["K"], r["method"]), []).append(r)
    out = []
    for (dataset, K, method), rs in groups.items():
        s = dict(rs[0])
        for key in ("objective", "ratio", "ami", "kmeans_ami", "cpu", "wall", "values", "bytes"):
            s[key] = _mean([r[key] for r in rs])
        for key in ("us_one_row", "us_per_row_batch"):  # the machine is shared: medians
            s[key] = float(sorted(r[key] for r in rs)[len(rs) // 2])
        s["ratios"] = [r["ratio"] for r in rs]
        s["n_seeds"] = len(rs)
        out.append(s)
    return out


def goals(summary, defaults):
    def cell(dataset, K, method):
        return next((s for s in summary if s["dataset"] == dataset and s["K"] == K and s["method"] == method), None)

    out = []
    f3, f5 = cell("fashion-mnist", 64, "qkmeans s=3"), cell("fashion-mnist", 64, "qkmeans s=5")
    if f3:
        compression = 64 * 784 / f3["values"]
        out += [("Fashion-MNIST K=64 s=3: objective <= 1.10 x K-means (reference 1.1223)", f"{f3['ratio']:.4f}",
                 f3["ratio"] <= 1.10),
                ("... at >= 10x compression, values incl. any mean (reference 4,638 + its mean)",
                 f"{f3['values']:.0f} values, {compression:.1f}x", compression >= 10),
                ("... AMI >= 0.484 (reference 0.4843, its K-means 0.4910)",
                 f"{f3['ami']:.4f} (K-means {f3['kmeans_ami']:.4f})", f3["ami"] >= 0.484),
                ("... in <= 60 CPU-s (reference 1,116)", f"{f3['cpu']:.1f}", f3["cpu"] <= 60)]
    if f5:
        out += [("Fashion-MNIST K=64 s=5: <= 7,400 values and objective <= 1.05 x K-means (reference 1.0579)",
                 f"{f5['values']:.0f} values, {f5['ratio']:.4f}", f5["values"] <= 7400 and f5["ratio"] <= 1.05)]
    # the paper's Table 3 COIL-20 cell is s = 5, K = 64 (see REFERENCE); the issue read it as K = 32: both shown
    for K, s, note in ((64, 5, "Table 3's setting"), (64, 3, "more compressed than Table 3's s = 5"),
                       (32, 3, "the issue's reading, K = 32")):
        c = cell("coil20", K, f"qkmeans s={s}")
        if c:
            out.append((f"COIL-20 K={K} s={s} ({note}): objective below the paper's 1.247 x K-means",
                        f"{c['ratio']:.4f} at {c['values']:.0f} values, {K * 1024 / c['values']:.1f}x compression",
                        c["ratio"] < 1.247))
    for s3 in sorted({d["s"] for d in defaults}):
        ds = [d for d in defaults if d["s"] == s3]
        ratio, ami, cpu_ratio = (_mean([d[k] for d in ds]) for k in ("ratio", "ami", "cpu_ratio"))
        out.append((f"defaults QKMeans(64, sparsity_level={s3}) on raw Fashion-MNIST vs KMeans(64): <= 5x its CPU time",
                    f"{cpu_ratio:.2f}x", cpu_ratio <= 5))
        limit = 1.10 if s3 == 3 else 1.05
        out.append((f"... objective <= {limit} x the converged KMeans(64) (mean of {len(ds)} seeds)", f"{ratio:.4f}",
                    ratio <= limit))
        if s3 == 3:
            out.append(("... AMI >= 0.484", f"{ami:.4f}", ami >= 0.484))
    return out


def render(rows, defaults, env, command):
    summary = summarise(rows)
    lines = ["# QK-means on the paper's protocol, and when it pays", "",
             "Produced by `benchmarks/qkmeans_paper.py`; rerun with:", ""]
    commands, envs = (command, env) if isinstance(command, list) else ([command], [env])
    lines += ["    " + c for c in commands]
    if len(commands) > 1:  # parts run side by side, then merged
        lines += ["    .venv/bin/python benchmarks/qkmeans_paper.py --render-from "
                  + ",".join(c.split("--out ")[-1].split()[0] + ".json" for c in commands) + " --out benchmarks/results/qkmeans_paper"]
    lines += [""] + [f"Environment{f' (part {i + 1})' if len(envs) > 1 else ''}: {e}." for i, e in enumerate(envs)]
    lines += ["",
             "Every method of a row group starts from the same k-means++ seeds (scikit-learn, on the centred float32",
             f"data) and runs {ITERATIONS} Lloyd iterations on the raw data; `ratio` is the objective over K-means' after",
             f"its {ITERATIONS} iterations, averaged over the seeds. `values` counts every stored number (factor nonzeros",
             "plus a mean when a model keeps one); `bytes` is the safe-format file. Assignment times go through the",
             "model's centroid operator: one row per call (median over rows of the best of 3) and per row of a",
             "10,000-row batch (best of 5); the table and the plot give the median over the seeds. `qkmeans` and",
             "`kmeans+factorize` use QK-means' default chain (2 factors holding the values of the paper's",
             "floor(log2(max(K, D))) factors, `budget_split=\"total\"`); `kmeans+palm4msa` the paper's chain.", "",
             "## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    for text, value, ok in goals(summary, defaults):
        lines.append(f"| {text} | {value} | {'yes' if ok else '**no**'} |")
    lines += ["", "## Reference figures (not rerun here)", "",
              "| data set | K | s | ratio | nnz | AMI (its K-means) | CPU s | source |", "|---|---|---|---|---|---|---|---|"]
    for r in REFERENCE:
        ami = "-" if r["ami"] is None else "{:.4f} ({:.4f})".format(r["ami"], r["kmeans_ami"])
        lines.append(f"| {r['dataset']} | {r['K']} | {r['s'] or '-'} | {r['ratio']:.4f} | {r['nnz'] or '-'} | {ami} | "
                     f"{r['cpu'] or '-'} | {r['source']} |")
    lines += ["", "## Protocol results (mean over seeds)", "",
              "| data set | K | method | ratio | per seed | AMI | values | compression | bytes | fit CPU s | "
              "1 row µs | batch µs/row |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        per = ", ".join(f"{v:.4f}" for v in s["ratios"])
        lines.append(f"| {s['dataset']} | {s['K']} | {s['method']} | {s['ratio']:.4f} | {per} | {s['ami']:.4f} | "
                     f"{s['values']:.0f} | {s['K'] * s['n_features'] / s['values']:.1f}x | {s['bytes']:.0f} | "
                     f"{s['cpu']:.1f} | {s['us_one_row']:.1f} | {s['us_per_row_batch']:.3f} |")
    if defaults:
        lines += ["", "## Defaults on the raw data", "",
                  "| K | s | seed | QKMeans / KMeans objective | AMI (KMeans) | values | QKMeans CPU s | KMeans CPU s | "
                  "CPU ratio | iterations (KMeans) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for d in defaults:
            lines.append(f"| {d['K']} | {d['s']} | {d['seed']} | {d['ratio']:.4f} | {d['ami']:.4f} "
                         f"({d['kmeans_ami']:.4f}) | {d['values']} | {d['cpu']:.1f} | {d['kmeans_cpu']:.1f} | "
                         f"{d['cpu_ratio']:.2f} | {d['n_iter']} ({d['kmeans_n_iter']}) |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = summarise(rows)
    if not rows:  # a defaults-only part: nothing to plot
        return
    cells = []
    for r in rows:
        if (r["dataset"], r["K"]) not in cells:
            cells.append((r["dataset"], r["K"]))
    axes_spec = [("us_one_row", "one row per call (µs)"), ("us_per_row_batch", "batch of 10,000 (µs per row)"),
                 ("values", "values stored")]
    fig, axes = plt.subplots(len(cells), 3, figsize=(13, 3.2 * len(cells)), squeeze=False)
    style = {"kmeans": ("k", "*"), "qkmeans": ("tab:blue", "o"), "lowrank": ("tab:orange", "s"),
             "kmeans+palm4msa": ("tab:gray", "x"), "kmeans+factorize": ("tab:green", "^")}
    for i, (dataset, K) in enumerate(cells):
        group = [r for r in rows if r["dataset"] == dataset and r["K"] == K]
        for j, (key, label) in enumerate(axes_spec):
            ax = axes[i][j]
            for r in group:
                family = r["method"].split(" ")[0]
                color, marker = style.get(family, ("tab:red", "d"))
                ax.scatter(r[key], r["ratio"], c=color, marker=marker, s=40)
                ax.annotate(r["method"].replace("qkmeans ", "").replace("kmeans+", "+"), (r[key], r["ratio"]),
                            fontsize=6, xytext=(3, 2), textcoords="offset points")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(label)
            if j == 0:
                ax.set_ylabel(f"{dataset} K={K}\nobjective / K-means")
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker=m, linestyle="", label=f) for f, (c, m) in style.items()]
    fig.legend(handles=handles, loc="upper center", ncol=len(style), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)


def merge_parts(parts):
    """One results record from parts run apart (rows and defaults in the parts' order; every env and command)."""
    if len(parts) == 1:
        return parts[0]
    return dict(env=[p["env"] for p in parts], command=[p["command"] for p in parts],
                rows=[r for p in parts for r in p["rows"]], defaults=[d for p in parts for d in p["defaults"]])


def main():
    args = parse_args()
    if args.render_from:
        import json

        data = merge_parts([json.loads(Path(part).read_text()) for part in args.render_from.split(",")])
        text = render(data["rows"], data["defaults"], data["env"], data["command"])
        print(text)
        if args.out:
            from _machine import stamp, stamp_md

            parts = [json.loads(Path(part).read_text()) for part in args.render_from.split(",")]
            data = stamp(data, parts=parts)  # the merge records its parts' commits and machines
            if "," in args.render_from:
                Path(args.out + ".json").write_text(json.dumps(data, indent=1, default=float))
            Path(args.out + ".md").write_text(stamp_md(text, data))
            plot(data["rows"], args.out + ".png")
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import json
    import tempfile

    import numpy as np

    sys.path.insert(0, str(REPO))
    import qkm
    from _machine import cpu_name

    Xw = np.random.RandomState(0).rand(300, 20).astype(np.float32)  # compile outside the timings
    qkm.QKMeans(4, max_iter=2, palm_max_iter=2, random_state=0).fit(Xw)
    qkm.KMeans(4, random_state=0).fit(Xw)
    load_before = os.getloadavg()
    rows, defaults = [], []
    tmp = Path(tempfile.mkdtemp()) / "m.qkm"
    for name in args.datasets.split(","):
        X, y = load_dataset(name, args.data_dir, dtype=np.float32)
        seeds = args.kdd_seeds if name == "kddcup99" else args.seeds
        for K in CELLS[name] if seeds else ():
            for seed in (int(v) for v in seeds.split(",")):
                rows += run_cell(name, X, y, K, seed, tmp)
        if name == "fashion-mnist" and args.default_seeds:
            defaults += run_defaults(X, y, 64, [int(v) for v in args.default_levels.split(",")],
                                     [int(v) for v in args.default_seeds.split(",")])
    env = dict(python=platform.python_version(), numpy=np.__version__, qkm=qkm.__version__, cpu=cpu_name(),
               cpus=os.cpu_count(), threads=args.threads, loadavg_before=[round(v, 2) for v in load_before],
               loadavg_after=[round(v, 2) for v in os.getloadavg()])
    command = ".venv/bin/python benchmarks/qkmeans_paper.py " + shlex.join(sys.argv[1:])
    text = render(rows, defaults, env, command.strip())
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        from _machine import stamp, stamp_md

        Path(args.out + ".json").write_text(json.dumps(stamp(dict(env=env, command=command.strip(), rows=rows,
                                                                  defaults=defaults)), indent=1, default=float))
        Path(args.out + ".md").write_text(stamp_md(text))
        plot(rows, args.out + ".png")


if __name__ == "__main__":
    main()
