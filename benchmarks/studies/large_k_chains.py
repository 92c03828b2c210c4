"""Which chain for many clusters (K > D)? Candidate shapes and budgets on K-means' own clusters, and the cost
of moving the supports in every sweep of a refit.

Rerun (from the repository root, after ``benchmarks/qkmeans_large_k.py --phase kmeans --k 1024``, whose
cached K-means model gives the clusters)::

    .venv/bin/python benchmarks/studies/large_k_chains.py --out benchmarks/results/studies/large_k_chains

Part 1 (structures). Fashion-MNIST (60,000 x 784, / 255), K = 1,024: the
clusters of ``KMeans(n_clusters=1024, init=k-means++ seeds of random_state=0)``
(the cached model). For each candidate chain ``V = S_1 S_2`` (``S_1``
K x A, ``S_2`` A x D, nonzero budgets ``b1``, ``b2``) the weighted means
``diag(sqrt(n_k)) U`` are factorised (hierarchical palm4MSA start, then 10
least-squares sweeps, supports moved in every sweep) and the objective those
labels would have with ``V`` is reported as a ratio to K-means'
(``1 + sum_k n_k ||u_k - v_k||^2 / inertia``): a fixed-label proxy, higher
than what the Lloyd loop reaches (the labels adapt to the structure).

Part 2 (support sweeps). ``QKMeans(n_clusters=1024, sparsity_level=3)`` on the
first ``--rows`` rows, 8 Lloyd iterations, from the same seeds, with the
supports moved in the first sweep of each refit (the default at K > D) and in
all 10: seconds per refit and the objective after each.

Part 3 (seed assignment). ``QKMeans(n_clusters=256, sparsity_level=3)`` on
the 60,000 rows from the cached seeds, the first chain fitted to the seeds
(as below ``SEED_ASSIGN_MIN_CLUSTERS``) or to the means of the seeds' clusters.
"""

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

#: (A, b1, b2): inner dimension, nonzeros of S_1 (K x A) and of S_2 (A x D).
CANDIDATES = [
    (784, 3072, 21168),      # the paper chain's total on 2 factors, S_1 keeping s K (the "total" split of K <= D)
    (784, 12288, 18432),     # 30,720 values, 12 per centroid row in S_1
    (784, 15360, 15360),     # the default: s floor(log2 K) = 30 values per centroid, shared evenly
    (784, 16384, 14336),     # 16 per centroid row in S_1
    (784, 16384, 20000),     # 36,384 values
]


def part1(X, km):
    import numpy as np
    from qkm.factorization._hierarchical import hierarchical
    from qkm.factorization._lsq import lsq_palm
    K = km.n_clusters_
    n = np.bincount(km.labels_, minlength=K).astype(float)
    U = np.zeros((K, X.shape[1]))
    np.add.at(U, km.labels_, X)
    U /= np.maximum(n, 1)[:, None]
    w = np.sqrt(n)
    out = []
    for A, b1, b2 in CANDIDATES:
        t0 = time.perf_counter()
        st = hierarchical(U, w, 2, 3, 30, 30, 100, 1e-6)
        t1 = time.perf_counter()
        st = lsq_palm(w[:, None] * U, w, list(st.factors), st.lam, [("sp", b1), ("sp", b2)], 10, 1e-6, 10)
        t2 = time.perf_counter()
        V = st.lam * st.factors[0] @ st.factors[1]
        nnz = sum(int(np.count_nonzero(f)) for f in st.factors)
        rec = {"A": A, "b1": b1, "b2": b2, "nnz": nnz, "compression": K * X.shape[1] / nnz,
               "proxy_ratio": 1 + float(((U - V) ** 2 * n[:, None]).sum()) / km.inertia_,
               "start_seconds": t1 - t0, "sweeps_seconds": t2 - t1}
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def part2(X, seeds, rows):
    import numpy as np
    import qkm.clustering._fitters as fitters
    from qkm import QKMeans
    out = {}
    for label, sweeps in (("first sweep", 1), ("every sweep", 10)):
        fitters.MANY_CLUSTERS_SUPPORT_SWEEPS = sweeps
        recs = []
        qk = QKMeans(n_clusters=seeds.shape[0], sparsity_level=3, init=seeds, max_iter=8, palm_max_iter=0,
                     random_state=0, n_jobs=1).fit(X[:rows], callback=recs.append)
        refits = [r for r in recs if r.get("step") == "refit"]
        out[label] = {"refit_seconds": [r["seconds"] for r in refits],
                      "objective_after_refit": [r["objective"] for r in refits], "final": float(qk.inertia_)}
        print(label, json.dumps(out[label]), flush=True)
    fitters.MANY_CLUSTERS_SUPPORT_SWEEPS = 1
    return out


def part3(X, cache):
    """Seed assignment off and on at K = 256 (every other parameter at its default, the cached seeds)."""
    import numpy as np
    import qkm.clustering._fitters as fitters
    from qkm import QKMeans
    seeds = np.load(Path(cache) / "seeds_256.npy")
    reference = json.loads((Path(cache) / "kmeans_256.json").read_text())["objective"]
    out = {}
    for label, threshold in (("off", 10**9), ("on", 1)):
        fitters.SEED_ASSIGN_MIN_CLUSTERS = threshold
        t0 = time.perf_counter()
        qk = QKMeans(n_clusters=256, sparsity_level=3, init=seeds, random_state=0, n_jobs=1).fit(X)
        out[label] = {"objective_ratio": float(qk.inertia_) / reference, "n_iter": int(qk.n_iter_),
                      "clusters": int(len(np.unique(qk.labels_))), "seconds": time.perf_counter() - t0}
        print(label, json.dumps(out[label]), flush=True)
    fitters.SEED_ASSIGN_MIN_CLUSTERS = 256
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=str(REPO / "benchmarks" / ".cache" / "qkmeans_large_k"))
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import numpy as np
    from _paper_data import load_dataset
    from _machine import stamp, stamp_md
    X, _ = load_dataset("fashion-mnist", args.data_dir)
    X = np.ascontiguousarray(X, dtype=np.float64)
    with open(Path(args.cache) / "kmeans_1024.pkl", "rb") as fh:
        km = pickle.load(fh)
    seeds = np.load(Path(args.cache) / "seeds_1024.npy")
    res1 = part1(X, km)
    res2 = part2(X, seeds, args.rows)
    res3 = part3(X, args.cache)
    lines = ["# Which chain for many clusters (K = 1,024 > D = 784)", "",
             "See `benchmarks/studies/large_k_chains.py` for the protocol. 1 thread, shared 2-core VM.", "",
             "## Candidate chains on K-means' clusters (fixed-label proxy)", "",
             "| A | S_1 values | S_2 values | compression | objective proxy / K-means' | start (s) | 10 sweeps (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in res1:
        lines.append(f"| {r['A']} | {r['b1']:,} | {r['b2']:,} | {r['compression']:.1f}x | {r['proxy_ratio']:.4f} | "
                     f"{r['start_seconds']:.1f} | {r['sweeps_seconds']:.1f} |")
    lines += ["", f"## Supports moved in the first sweep of a refit or in all 10 ({args.rows:,} rows, 8 iterations)",
              "", "| supports | seconds per refit (median) | objective after the last refit | final objective |",
              "|---|---|---|---|"]
    for label, r in res2.items():
        lines.append(f"| {label} | {float(np.median(r['refit_seconds'])):.2f} | "
                     f"{r['objective_after_refit'][-1]:,.0f} | {r['final']:,.0f} |")
    lines += ["", "## Seed assignment at K = 256 (60,000 rows, defaults, the same seeds)", "",
              "| first chain fitted to | objective / K-means' | iterations | non-empty clusters | fit (s) |",
              "|---|---|---|---|---|"]
    for label, r in res3.items():
        what = "the seeds" if label == "off" else "the means of the seeds' clusters"
        lines.append(f"| {what} | {r['objective_ratio']:.4f} | {r['n_iter']} | {r['clusters']} | {r['seconds']:.0f} |")
    lines += ["", "```", ".venv/bin/python benchmarks/studies/large_k_chains.py --out "
              "benchmarks/results/studies/large_k_chains", "```", ""]
    payload = stamp({"structures": res1, "support_sweeps": res2, "seed_assignment": res3, "rows": args.rows})
    text = stamp_md("\n".join(lines), payload)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(payload, indent=1))
        Path(args.out + ".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
