"""palm4MSA: hierarchical factorisation of K-means centroids and warm sweeps, qkm vs FAuST side by side.

Rerun (from the repository root; pyfaust is optional, its rows are skipped without it):

    .venv/bin/pip install -r benchmarks/requirements.txt
    .venv/bin/python benchmarks/palm_factorization.py --out benchmarks/results/palm_factorization

Data: ``U`` = the 64 x 784 centroids of ``qkm.KMeans(64, random_state=0)`` on the
Fashion-MNIST training images (pixels / 255, float64), computed once and cached
in ``benchmarks/.cache/`` with the cluster sizes. Every timing is process CPU
time with BLAS/OpenMP/numba pinned to one thread (set before numpy is imported);
numba kernels are compiled before anything is timed. qkm rows are the median of
``--repeat`` runs; FAuST rows are run ``--faust-repeat`` times (they take tens of
seconds). Error is ``||U - V||_F / ||U||_F``; nnz counts the stored factors.

Measured:

1. hierarchical palm4MSA on ``U`` (``Q = 9``, ``s = 3`` and ``5``): qkm at several
   iteration budgets (``split/global/final`` sweeps) and FAuST's ``hierarchical``
   (2020 backend, same constraints: ``splincol(s)`` factors, residual ``sp`` budget
   ``max(s D, A D / 2^l)``, last residual ``splincol(s)``), plus plain palm4MSA from
   the identity start (the rank-one trap) for reference, and ``qkm.palm4msa.factorize``
   (QK-means' factorisation: at most ``s max(r, c)`` values per factor, least-squares
   sweeps with greedy supports after the hierarchical start);
2. warm palm4MSA: CPU ms per sweep, 10 sweeps from a previous factorisation, at
   ``64 x 784, Q = 9`` (``U``, with and without ``sqrt(n_k)`` weights; FAuST's
   ``palm4msa`` from the same factors alongside) and ``256 x 2352, Q = 11``
   (Gaussian target, random feasible start).
"""

import argparse
import os
import sys

from _machine import cpu_name, stamp, stamp_md

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.path.join(REPO, "..", "shared", "data"))
    p.add_argument("--cache-dir", default=os.path.join(HERE, ".cache"))
    p.add_argument("--out", default=os.path.join(HERE, "results", "palm_factorization"),
                   help="write <out>.json and <out>.md")
    p.add_argument("--repeat", type=int, default=3, help="qkm runs per row (median reported)")
    p.add_argument("--faust-repeat", type=int, default=1)
    p.add_argument("--no-faust", action="store_true")
    p.add_argument("--quick", action="store_true", help="one qkm budget per s, no FAuST: a smoke test")
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"

    import json
    import platform
    import statistics
    import time

    import numpy as np

    sys.path.insert(0, REPO)
    import qkm
    from qkm.factorization import chain_shapes, factorize, hierarchical_palm4msa, palm4msa, project_splincol

    faust = None if args.no_faust or args.quick else _import_faust()

    def cpu(fn, repeat):
        times, walls, out = [], [], None
        for _ in range(repeat):
            t, w = time.process_time(), time.perf_counter()
            out = fn()
            times.append(time.process_time() - t)
            walls.append(time.perf_counter() - w)
        return statistics.median(times), statistics.median(walls), out

    U, counts = _centroids(args.data_dir, args.cache_dir)
    K, D = U.shape
    Q = 9
    nU = np.linalg.norm(U)
    err = lambda V: float(np.linalg.norm(U - V) / nU)
    nnz = lambda factors: int(sum(np.count_nonzero(f) for f in factors))
    print(f"U: {U.shape}, ||U||_F = {nU:.4f}, cluster sizes {counts.min()}..{counts.max()}", flush=True)

    # compile every numba kernel before timing anything
    warm = np.random.default_rng(0).standard_normal((8, 24))
    r = hierarchical_palm4msa(warm, 3, sparsity_level=2, max_iter_split=3, max_iter_global=3, max_iter_final=3)
    palm4msa(warm, r.factors, lambda_=r.lambda_, sparsity_level=2, weights=np.ones(8), max_iter=3)

    load_before = os.getloadavg()
    rows = []

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    # 1. hierarchical ---------------------------------------------------------
    budgets = [(30, 30, 100)] if args.quick else [(20, 20, 20), (30, 30, 100), (50, 50, 50), (50, 50, 300)]
    hier = {}
    for s in (3, 5):
        for its in budgets:
            t_cpu, t_wall, res = cpu(lambda: hierarchical_palm4msa(
                U, Q, sparsity_level=s, max_iter_split=its[0], max_iter_global=its[1], max_iter_final=its[2]),
                args.repeat)
            hier[s, its] = res
            default = its == (30, 30, 100)
            add({"part": "hierarchical", "method": "qkm" + (" (default)" if default else ""), "s": s,
                 "iterations": "%d/%d/%d" % its, "rel_error": err(res.product()), "nnz": nnz(res.factors),
                 "cpu_s": t_cpu, "wall_s": t_wall, "runs": args.repeat})
        for sweeps in ((100,) if args.quick else (100, 300)):
            t_cpu, t_wall, res = cpu(lambda: factorize(U, Q, sparsity_level=s, max_iter=sweeps), args.repeat)
            add({"part": "hierarchical", "method": "qkm factorize (QK-means' budgets and sweeps)", "s": s,
                 "iterations": f"30/30/100 + {sweeps} sweeps", "rel_error": err(res.product()),
                 "nnz": nnz(res.factors), "cpu_s": t_cpu, "wall_s": t_wall, "runs": args.repeat})
        if faust is not None:
            for its in [(50, 50), (30, 30)]:
                t_cpu, t_wall, (V, fnnz) = cpu(lambda: _faust_hierarchical(faust, U, Q, s, its), args.faust_repeat)
                add({"part": "hierarchical", "method": "FAuST 2020", "s": s, "iterations": "%d/%d" % its,
                     "rel_error": err(V), "nnz": fnnz, "cpu_s": t_cpu, "wall_s": t_wall, "runs": args.faust_repeat})
    s = 3
    start = [np.eye(*shape) for shape in chain_shapes(K, D, Q)]
    start[-1] = np.zeros((K, D))
    t_cpu, t_wall, res = cpu(lambda: palm4msa(U, start, sparsity_level=s, max_iter=100, tol=0.0), 1)
    add({"part": "hierarchical", "method": "qkm palm4msa from identity (no hierarchy)", "s": s,
         "iterations": "100", "rel_error": err(res.product()), "nnz": nnz(res.factors), "cpu_s": t_cpu,
         "wall_s": t_wall, "runs": 1})

    # 2. warm sweeps ----------------------------------------------------------
    n_sweeps = 10
    for s in (3, 5):
        first = hier[s, (30, 30, 100)]
        for label, weights in (("U, unweighted", None), ("U, sqrt(n_k) weights", np.sqrt(counts))):
            t_cpu, t_wall, res = cpu(lambda: palm4msa(U, first.factors, lambda_=first.lambda_, sparsity_level=s,
                                                      weights=weights, max_iter=n_sweeps, tol=0.0), args.repeat)
            add({"part": "warm", "method": "qkm", "case": f"64x784 Q=9 s={s} {label}", "s": s,
                 "ms_per_sweep": 1e3 * t_cpu / res.n_iter, "wall_ms_per_sweep": 1e3 * t_wall / res.n_iter,
                 "sweeps": res.n_iter, "rel_error_before": err(first.product()), "rel_error_after": err(res.product())})
        if faust is not None:
            t_cpu, t_wall, (V, _) = cpu(lambda: _faust_palm(faust, U, first, s, n_sweeps), args.faust_repeat)
            add({"part": "warm", "method": "FAuST 2020", "case": f"64x784 Q=9 s={s} U, unweighted", "s": s,
                 "ms_per_sweep": 1e3 * t_cpu / n_sweeps, "wall_ms_per_sweep": 1e3 * t_wall / n_sweeps,
                 "sweeps": n_sweeps, "rel_error_before": err(first.product()), "rel_error_after": err(V)})
    rng = np.random.default_rng(0)
    K2, D2, Q2, s = 256, 2352, 11, 3
    T2 = rng.standard_normal((K2, D2))
    start2 = [project_splincol(rng.standard_normal(shape), s) for shape in chain_shapes(K2, D2, Q2)]
    first2 = palm4msa(T2, start2, sparsity_level=s, max_iter=5)  # a feasible, already fitted start
    t_cpu, t_wall, res = cpu(lambda: palm4msa(T2, first2.factors, lambda_=first2.lambda_, sparsity_level=s,
                                              weights=rng.uniform(1, 10, K2), max_iter=n_sweeps, tol=0.0), args.repeat)
    add({"part": "warm", "method": "qkm", "case": f"{K2}x{D2} Q={Q2} s={s} Gaussian, weighted", "s": s,
         "ms_per_sweep": 1e3 * t_cpu / res.n_iter, "wall_ms_per_sweep": 1e3 * t_wall / res.n_iter,
         "sweeps": res.n_iter, "rel_error_before": None, "rel_error_after": None})

    # report ------------------------------------------------------------------
    load_after = os.getloadavg()
    info = {"argv": sys.argv, "python": platform.python_version(), "numpy": np.__version__,
            "numba": _version("numba"), "pyfaust": _version("pyfaust") if faust is not None else None,
            "qkm": qkm.__version__, "machine": platform.machine(), "cpu": cpu_name(), "n_cpus": os.cpu_count(),
            "loadavg_before": load_before, "loadavg_after": load_after,
            "U": {"shape": list(U.shape), "fro": float(nU), "sum": float(U.sum())}}
    text = _markdown(rows, info, faust is not None, args)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".md", "w") as f:
            f.write(stamp_md(text))
        with open(args.out + ".json", "w") as f:
            json.dump(stamp({"info": info, "rows": rows}), f, indent=1)
            f.write("\n")


# --------------------------------------------------------------------------- #
def _centroids(data_dir, cache_dir):
    """K-means centroids of Fashion-MNIST (train) and the cluster sizes, cached."""
    import numpy as np

    path = os.path.join(cache_dir, "fashion_mnist_kmeans64_rs0.npz")
    if os.path.exists(path):
        z = np.load(path)
        return z["U"], z["counts"]
    import qkm
    from qkm.io import load_data

    X, _ = load_data(os.path.join(data_dir, "fashion-mnist", "train-images-idx3-ubyte.gz"))
    X = np.ascontiguousarray(X.reshape(X.shape[0], -1), dtype=np.float64) / 255.0
    print(f"fitting KMeans(64) on {X.shape} (once, cached in {path}) ...", flush=True)
    km = qkm.KMeans(64, random_state=0).fit(X)
    counts = np.bincount(km.labels_, minlength=64)
    os.makedirs(cache_dir, exist_ok=True)
    np.savez(path, U=km.cluster_centers_, counts=counts)
    return km.cluster_centers_, counts


def _import_faust():
    try:
        import pyfaust  # noqa: F401
        from pyfaust import fact, factparams, proj
    except ImportError as e:
        print(f"pyfaust not available ({e}): FAuST rows skipped", flush=True)
        return None
    return {"fact": fact, "params": factparams, "proj": proj}


class _Quiet:
    """Silence the C++ progress lines FAuST prints on stdout."""

    def __enter__(self):
        sys.stdout.flush()
        self.saved = os.dup(1)
        self.null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self.null, 1)

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)
        os.close(self.null)
        os.close(self.saved)


def _faust_hierarchical(faust, U, Q, s, its):
    import numpy as np

    from qkm.factorization import chain_shapes

    K, D = U.shape
    A = min(K, D)
    shapes = chain_shapes(K, D, Q)
    proj, params = faust["proj"], faust["params"]
    fact_cons = [proj.splincol(shapes[i], s) for i in range(Q - 1)]
    res_cons = [proj.sp((A, D), max(s * D, (A * D) >> (i + 1))) for i in range(Q - 2)] + [proj.splincol((A, D), s)]
    p = params.ParamsHierarchical(fact_cons, res_cons, params.StoppingCriterion(num_its=its[0]),
                                  params.StoppingCriterion(num_its=its[1]), is_update_way_R2L=True,
                                  is_fact_side_left=False)
    with _Quiet():
        F = faust["fact"].hierarchical(np.asfortranarray(U), p, backend=2020)
    return F.toarray(), int(F.nnz_sum())


def _faust_palm(faust, U, first, s, n_its):
    import numpy as np

    proj, params = faust["proj"], faust["params"]
    cons = [proj.splincol(f.shape, s) for f in first.factors]
    p = params.ParamsPalm4MSA(cons, params.StoppingCriterion(num_its=n_its), is_update_way_R2L=True,
                              init_facts=[np.asfortranarray(f) for f in first.factors],
                              init_lambda=first.lambda_)
    with _Quiet():
        F = faust["fact"].palm4msa(np.asfortranarray(U), p, backend=2020)
    return F.toarray(), int(F.nnz_sum())


def _version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def _markdown(rows, info, have_faust, args):
    L = ["# palm4MSA: hierarchical factorisation and warm sweeps (qkm vs FAuST)", "",
         "Rerun: `" + " ".join([".venv/bin/python", "benchmarks/palm_factorization.py"] + sys.argv[1:]) + "`", "",
         f"Machine: {info['cpu']}, {info['n_cpus']} CPUs, 1 thread everywhere; load average "
         f"{info['loadavg_before'][0]:.1f} before / {info['loadavg_after'][0]:.1f} after (other jobs were running: "
         "CPU time is the figure to read, wall time is shown for completeness). numpy "
         f"{info['numpy']}, numba {info['numba']}, pyfaust {info['pyfaust'] or 'not installed'}.", "",
         f"`U`: K-means centroids of Fashion-MNIST train (64 x 784, ||U||_F = {info['U']['fro']:.4f}). "
         "Error = ||U - V||_F / ||U||_F. qkm: median of %d runs; FAuST: %d run(s)." % (args.repeat, args.faust_repeat),
         ""]
    if not have_faust:
        L += ["**FAuST rows missing:** pyfaust was not importable (or `--no-faust`/`--quick`).", ""]
    goal = [r for r in rows if r["part"] == "hierarchical" and r["method"] == "qkm (default)" and r["s"] == 3]
    if goal:
        g = goal[0]
        met = g["rel_error"] <= 0.26 and g["cpu_s"] < 5.0
        L += [f"**Goal** (s = 3, Q = 9: error <= 0.26 in < 5 CPU-s): {'met' if met else 'NOT met'} by the defaults, "
              f"error {g['rel_error']:.4f} in {g['cpu_s']:.2f} CPU-s (numba compilation excluded: kernels are cached "
              "on disk after the first run).", ""]
    L += ["## Hierarchical palm4MSA, Q = 9", "",
          "Iterations: qkm `split/global/final` sweeps per level (the final global refit over all 9 factors is the "
          "polish); FAuST `split/global` per level.", "",
          "| s | method | iterations | rel. error | nnz | CPU s | wall s |", "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "hierarchical"):
        L.append(f"| {r['s']} | {r['method']} | {r['iterations']} | {r['rel_error']:.4f} | {r['nnz']} | "
                 f"{r['cpu_s']:.2f} | {r['wall_s']:.2f} |")
    if have_faust:
        L += ["", "Same run, FAuST 50/50 over qkm:", "", "| s | qkm budget | error ratio qkm / FAuST | "
              "CPU ratio FAuST / qkm |", "|---|---|---|---|"]
        for s in (3, 5):
            ref = [r for r in rows if r["part"] == "hierarchical" and r["method"] == "FAuST 2020" and r["s"] == s
                   and r["iterations"] == "50/50"]
            for r in rows:
                if r["part"] == "hierarchical" and r["method"].startswith("qkm") and r["s"] == s and ref \
                        and "identity" not in r["method"]:
                    L.append(f"| {s} | {r['iterations']} | {r['rel_error'] / ref[0]['rel_error']:.3f} | "
                             f"{ref[0]['cpu_s'] / r['cpu_s']:.1f}x |")
    L += ["", "## Warm palm4MSA sweeps (10 sweeps from a previous factorisation)", "",
          "| case | method | CPU ms / sweep | wall ms / sweep | error before -> after |", "|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "warm"):
        e = "–" if r["rel_error_before"] is None else f"{r['rel_error_before']:.4f} -> {r['rel_error_after']:.4f}"
        L.append(f"| {r['case']} | {r['method']} | {r['ms_per_sweep']:.2f} | {r['wall_ms_per_sweep']:.2f} | {e} |")
    L += ["", "Notes. The research note's FAuST figure (0.257 in 26 CPU-s) was for a different 64 x 784 matrix "
          "(upsampled digits); on these Fashion-MNIST centroids FAuST's 50/50 run is the reference above. FAuST's "
          "PALM steps are not monotone (its warm error can go up); qkm's palm4msa never increases the objective.",
          "", "nnz differ between the methods at equal `s` because `splincol(s)` keeps between `s max(n, m)` and "
          "`s (n + m)` entries per factor, depending on how the row and column choices overlap; `factorize` keeps "
          "at most `s max(n, m)` (3,888 at s = 3, 6,480 at s = 5).", ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
