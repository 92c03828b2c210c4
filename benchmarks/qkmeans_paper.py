"""QK-means on the paper's protocol: objective, size, speed and AMI against K-means and the baselines.

Rerun (from the repository root):

    .venv/bin/python benchmarks/qkmeans_paper.py --out benchmarks/results/qkmeans_paper

For every (dataset, K, sparsity level s) and seed, one k-means++ seeding is
drawn and shared by every method:

* ``kmeans``            qkm.KMeans (Lloyd) to convergence: the objective to match;
* ``qkmeans``           qkm.QKMeans (s, Q = floor(log2 max(K, D)), hierarchical init,
                        warm palm4MSA per iteration, final polish);
* ``kmeans+palm4msa``   hierarchical palm4MSA of the K-means centroids, once, then one
                        assignment (the paper's Table 3 baseline); also with the
                        sqrt(n_k) weights (``kmeans+palm4msa-w``), which fits the
                        objective rather than the centroids;
* ``lowrank``           qkm.LowRankKMeans with the rank whose parameter count
                        ``r (K + D)`` is closest to QK-means' nnz (not in the paper).

Columns: training objective (sum of squared distances of the training points to
their assigned centroid) and its excess over K-means, nnz / FLOPs per sample /
compression against K x D, AMI against the true labels, training wall time and
its ratio to K-means measured in the same process. Threads are pinned to
``--threads`` (default 1) before numpy is imported.

Data (``--data-dir``, default ``<repo>/../shared/data``): Fashion-MNIST train
images (60,000 x 784, /255) with K = 64 and s = 3, 5; COIL-20 (1,440 x 1,024, /255)
with K = 20 and 64.
"""

import argparse
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_dataset(name, data_dir):
    import numpy as np

    from qkm.io import load_data, load_labels

    if name == "fashion-mnist":
        X, _ = load_data(str(Path(data_dir) / "fashion-mnist" / "train-images-idx3-ubyte.gz"))
        y = load_labels(str(Path(data_dir) / "fashion-mnist" / "train-labels-idx1-ubyte.gz"))
        return np.ascontiguousarray(X, dtype=np.float64) / 255.0, np.asarray(y).ravel()
    if name == "coil20":
        from scipy.io import loadmat

        m = loadmat(str(Path(data_dir) / "coil20" / "COIL20.mat"))
        return np.ascontiguousarray(m["X"], dtype=np.float64) / 255.0, m["Y"].ravel().astype(int)
    raise ValueError(f"unknown dataset {name!r}")


CELLS = {"fashion-mnist": [(64, 3), (64, 5)], "coil20": [(20, 3), (64, 3), (64, 5)]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="fashion-mnist,coil20")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (one k-means++ seeding each)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    import json
    import time

    import numpy as np
    from sklearn.metrics import adjusted_mutual_info_score

    import qkm
    from qkm._qkmeans import default_n_factors
    from qkm.operator import FactorChainOperator
    from qkm.palm4msa import hierarchical_palm4msa

    def objective(X, op):
        labels, d = op.assign(X)
        return labels, float(d.sum())

    # compile the kernels outside the timings
    Xw = np.random.RandomState(0).rand(300, 20)
    qkm.QKMeans(4, max_iter=2, palm_max_iter=2, random_state=0).fit(Xw)
    qkm.KMeans(4, random_state=0).fit(Xw)

    rows = []
    for name in args.datasets.split(","):
        X, y = load_dataset(name, args.data_dir)
        n, D = X.shape
        for K, s in CELLS[name]:
            Q = default_n_factors(K, D)
            for seed in (int(v) for v in args.seeds.split(",")):
                init = qkm.kmeans_plusplus(X, K, random_state=seed, n_jobs=args.threads)[0]
                cell = dict(dataset=name, n_samples=n, n_features=D, K=K, s=s, Q=Q, seed=seed)

                def add(method, labels, obj, nnz, seconds, **extra):
                    rows.append(dict(cell, method=method, objective=obj, nnz=int(nnz), flops=2 * int(nnz),
                                     compression=K * D / nnz, ami=float(adjusted_mutual_info_score(y, labels)),
                                     seconds=seconds, **extra))
                    print(f"{name} K={K} s={s} seed={seed} {method:18s} obj={obj:.6g} nnz={nnz} "
                          f"t={seconds:.2f}s", flush=True)

                t = time.perf_counter()
                km = qkm.KMeans(K, init=init, n_init=1, n_jobs=args.threads).fit(X)
                t_km = time.perf_counter() - t
                add("kmeans", km.labels_, km.inertia_, K * D, t_km, n_iter=km.n_iter_)

                t = time.perf_counter()
                qk = qkm.QKMeans(K, sparsity_level=s, n_factors=Q, init=init, n_jobs=args.threads).fit(X)
                t_qk = time.perf_counter() - t
                init_s = sum(r["seconds"] for r in qk.history_ if r["step"] == "init")
                polish_s = sum(r["seconds"] for r in qk.history_ if r["step"] == "polish")
                paths = sorted({r["path"] for r in qk.history_ if r.get("path")})
                add("qkmeans", qk.labels_, qk.inertia_, qk.nnz_, t_qk, n_iter=qk.n_iter_,
                    init_seconds=init_s, polish_seconds=polish_s, paths=paths)

                counts = np.bincount(km.labels_, minlength=K).astype(float)
                for label, weights in (("kmeans+palm4msa", None), ("kmeans+palm4msa-w", np.sqrt(counts))):
                    t = time.perf_counter()
                    res = hierarchical_palm4msa(km.cluster_centers_, Q, sparsity_level=s, weights=weights)
                    op = FactorChainOperator([res.lambda_ * res.factors[0]] + list(res.factors[1:]))
                    labels, obj = objective(X, op)
                    add(label, labels, obj, op.nnz, t_km + time.perf_counter() - t,
                        centroid_rel_error=float(np.linalg.norm(res.product() - km.cluster_centers_)
                                                 / np.linalg.norm(km.cluster_centers_)))

                rank = max(1, int(round(qk.nnz_ / (K + D))))
                t = time.perf_counter()
                lr = qkm.LowRankKMeans(K, rank=rank, init=init, n_jobs=args.threads).fit(X)
                add("lowrank", lr.labels_, lr.inertia_, lr.nnz_, time.perf_counter() - t, rank=rank,
                    n_iter=lr.n_iter_)

    for r in rows:
        base = next(b for b in rows if b["method"] == "kmeans" and all(
            b[k] == r[k] for k in ("dataset", "K", "s", "seed")))
        r["objective_vs_kmeans"] = r["objective"] / base["objective"] - 1.0
        r["time_vs_kmeans"] = r["seconds"] / base["seconds"]

    env = dict(python=platform.python_version(), numpy=np.__version__, qkm=qkm.__version__,
               machine=platform.machine(), cpus=os.cpu_count(), threads=args.threads)
    command = "    .venv/bin/python benchmarks/qkmeans_paper.py " + " ".join(
        a for a in sys.argv[1:]) if len(sys.argv) > 1 else "    .venv/bin/python benchmarks/qkmeans_paper.py"
    lines = [
        "# QK-means on the paper's protocol (Fashion-MNIST, COIL-20)",
        "",
        "Produced by `benchmarks/qkmeans_paper.py`; rerun with:",
        "",
        command,
        "",
        f"Environment: {json.dumps(env)}. Every method of a row group starts from the same k-means++ seeding.",
        "Objective = sum of squared distances of the training points to their assigned centroid;",
        "`vs K-means` is its excess over exact K-means; time ratio is against K-means in the same run.",
        "",
        "| dataset | K | s | Q | method | objective | vs K-means | nnz | FLOPs/sample | compression | AMI | time s | time / K-means |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['K']} | {r['s']} | {r['Q']} | {r['method']}"
            f"{' (r=' + str(r['rank']) + ')' if 'rank' in r else ''} | {r['objective']:.6g} | "
            f"{100 * r['objective_vs_kmeans']:+.2f} % | {r['nnz']} | {r['flops']} | {r['compression']:.1f}x | "
            f"{r['ami']:.4f} | {r['seconds']:.2f} | {r['time_vs_kmeans']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(dict(env=env, rows=rows), indent=1, default=float))
        Path(args.out + ".md").write_text(text)


if __name__ == "__main__":
    main()
