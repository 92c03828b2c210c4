"""Greedy k-means++ seeding: qkm vs scikit-learn vs SparseKmeans, side by side in one run.

Rerun (from the repository root, after `pip install -r benchmarks/requirements.txt`):

    .venv/bin/python benchmarks/init_kmeanspp.py --out benchmarks/results/init_kmeanspp

Uses the data caches of ``train_sparse.py`` (built on first use from ``../shared/data``).
Every method draws ``2 + floor(ln K)`` candidates per step (scikit-learn's and
SparseKmeans' default), so all do the same work; qkm's own default,
``2 + floor(log2 K)``, is timed as a fourth row. Threads are pinned to
``--threads`` (default 1) before numpy is imported. For each (dataset, K) the
table gives the wall time of each method (best of ``--repeat``), the ratios to
qkm at equal candidates, and whether qkm chose exactly scikit-learn's rows.
"""

import argparse
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="news20,20news-tfidf,fashion-mnist")
    p.add_argument("--ks", default=None, help="comma-separated K values (default: each dataset's benchmark Ks)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="timed repetitions per method (best is reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    import json
    import time

    import numpy as np
    import scipy.sparse as sp
    from sklearn.cluster import kmeans_plusplus as sk_pp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _bench_data as ts

    import qkm

    def timed(fn):
        best, out = float("inf"), None
        for _ in range(args.repeat):
            t = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t)
        return best, out

    def spk_init(X, K):
        try:
            import graphblas as gb
            import sparsekmeans
        except ImportError:
            return None
        gb.ss.config["nthreads"] = args.threads
        Xg = gb.io.from_scipy_sparse(sp.csr_matrix(X, dtype=np.float64))
        model = sparsekmeans.LloydKmeans(n_clusters=K, n_threads=args.threads, random_state=args.seed)
        return timed(lambda: model._initialize_centroids(Xg))[0]

    # warm the numba kernels outside the timings
    qkm.kmeans_plusplus(sp.random(50, 20, density=0.3, format="csr", random_state=0), 3, random_state=0)
    qkm.kmeans_plusplus(np.random.RandomState(0).rand(50, 20), 3, random_state=0)

    rows = []
    for name in args.datasets.split(","):
        path = ts.ensure_matrix(name, ts.DEFAULT_DATA_DIR, ts.CACHE_DIR, None)
        X = ts.load_array(path)
        ks = [int(k) for k in args.ks.split(",")] if args.ks else ts.DATASETS[name]["ks"]
        for K in ks:
            L_ln = 2 + int(np.log(K))
            L_log2 = 2 + int(np.log2(K))
            t_sk, (_, idx_sk) = timed(lambda: sk_pp(X, K, random_state=args.seed, n_local_trials=L_ln))
            t_q, (_, idx_q) = timed(lambda: qkm.kmeans_plusplus(X, K, random_state=args.seed, n_local_trials=L_ln,
                                                               n_jobs=args.threads))
            t_q2, _ = timed(lambda: qkm.kmeans_plusplus(X, K, random_state=args.seed, n_jobs=args.threads))
            t_spk = spk_init(X, K) if sp.issparse(X) else None
            row = {
                "dataset": name, "K": K, "shape": list(X.shape), "sparse": sp.issparse(X),
                "trials_ln": L_ln, "trials_log2": L_log2,
                "sklearn_s": t_sk, "sparsekmeans_s": t_spk, "qkm_s": t_q, "qkm_log2_trials_s": t_q2,
                "sklearn_over_qkm": t_sk / t_q, "sparsekmeans_over_qkm": (t_spk / t_q) if t_spk else None,
                "same_rows_as_sklearn": int((idx_q == idx_sk).sum()),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)

    lines = [
        "# Greedy k-means++ seeding, wall seconds (threads = %d, best of %d)" % (args.threads, args.repeat), "",
        "Rerun: `" + " ".join([".venv/bin/python", "benchmarks/init_kmeanspp.py"] + sys.argv[1:]) + "`", "",
        "| data | K | trials | scikit-learn | SparseKmeans | qkm | sklearn / qkm | SparseKmeans / qkm | "
        "qkm rows = sklearn rows | qkm, 2+⌊log2 K⌋ trials |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        spk = f"{r['sparsekmeans_s']:.2f}" if r["sparsekmeans_s"] else "–"
        spk_ratio = f"{r['sparsekmeans_over_qkm']:.1f}x" if r["sparsekmeans_over_qkm"] else "–"
        lines.append(
            f"| {r['dataset']} | {r['K']} | {r['trials_ln']} | {r['sklearn_s']:.2f} | {spk} | {r['qkm_s']:.2f} | "
            f"{r['sklearn_over_qkm']:.1f}x | {spk_ratio} | {r['same_rows_as_sklearn']}/{r['K']} | "
            f"{r['qkm_log2_trials_s']:.2f} ({r['trials_log2']} trials) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from _machine import stamp, stamp_md

        ts.write_text_atomic(args.out + ".md", stamp_md(text))
        ts.write_text_atomic(args.out + ".json", json.dumps(stamp({"argv": sys.argv, "threads": args.threads,
                                                                   "rows": rows}), indent=1) + "\n")


if __name__ == "__main__":
    main()
