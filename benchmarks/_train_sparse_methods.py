"""The k-means methods ``train_sparse.py`` times (scikit-learn, SparseKmeans, qkm), each as a fit from given centres.

Split from ``train_sparse.py``: ``make_fit(method, threads)`` returns ``fit(X, C0) -> (centres, labels,
iterations)`` for one method; ``check_sparsekmeans_init`` verifies that SparseKmeans really starts from the
given centres.
"""

from __future__ import annotations

import contextlib
import io
import sys

import numpy as np
import scipy.sparse as sp

from _bench_data import INIT_SEED, REPO_DIR, assign_and_objective

MAX_ITER = 300
TOL = 1e-4
REFERENCE_METHOD = "sklearn-elkan"  # label diffs, relative inertia and extrapolation refer to it

# Run order matters: the reference method goes first so later rows can be compared to it.
METHODS = ("sklearn-elkan", "sklearn-lloyd", "sparsekmeans-lloyd", "sparsekmeans-elkan", "qkm-lloyd", "qkm-elkan")
DEFAULT_METHODS = tuple(m for m in METHODS if m != "sparsekmeans-elkan")

ITER_UNITS = {
    "sklearn": "Lloyd/Elkan iterations (n_iter_)",
    "sparsekmeans": "assignment steps (= centre updates + 1 when converged)",
    "qkm": "iterations (n_iter_)",
}

# --------------------------------------------------------------------------- methods


def method_family(method):
    return method.split("-", 1)[0]


def method_algorithm(method):
    return method.split("-", 1)[1]


def make_sklearn_fit(algorithm, threads):
    from sklearn.cluster import KMeans

    def fit(X, C0, max_iter):
        km = KMeans(n_clusters=C0.shape[0], init=C0, n_init=1, max_iter=max_iter, tol=TOL, algorithm=algorithm)
        km.fit(X)
        return {"labels": km.labels_, "centers": km.cluster_centers_, "n_iter": int(km.n_iter_),
                "reported_inertia": float(km.inertia_)}

    return fit


def sparsekmeans_fixed_init_class(algorithm):
    """Subclass of sparsekmeans.LloydKmeans / ElkanKmeans that starts from given centres.

    sparsekmeans has no ``init=`` parameter: ``SparseKmeans.fit`` calls
    ``self._initialize_centroids(X: graphblas.Matrix) -> graphblas.Matrix`` (FP64,
    n_clusters x n_features; its own kmeans++ builds it row by row from rows of X, i.e. a
    sparse-format matrix) and then ``_single_kmeans``. We override ``_initialize_centroids`` to
    return C0 in that same form, and wrap ``_assign_cluster`` / ``_update_centroids`` to count
    steps and keep the first assignment's labels (to check that C0 really was used). The counts
    live in ``self.bench_stats``, a dict the caller keeps a reference to: ``fit`` ends with
    ``_cleanup()``, which deletes every attribute not on its keep-list.
    """
    import graphblas as gb
    import sparsekmeans

    base = {"lloyd": sparsekmeans.LloydKmeans, "elkan": sparsekmeans.ElkanKmeans}[algorithm]

    class FixedInitKmeans(base):
        def __init__(self, init_centers, **kwargs):
            super().__init__(**kwargs)
            self.bench_init = np.ascontiguousarray(init_centers, dtype=np.float64)
            self.bench_stats = {"init_calls": 0, "assign_steps": 0, "updates": 0, "first_labels": None}

        def _initialize_centroids(self, X):
            C0 = self.bench_init
            if C0.shape != (self.n_clusters, X.shape[1]):
                raise ValueError(f"init centres {C0.shape} != ({self.n_clusters}, {X.shape[1]})")
            self.bench_stats["init_calls"] += 1
            return gb.io.from_scipy_sparse(sp.csr_matrix(C0))  # FP64, explicit zeros dropped

        def _assign_cluster(self, X):
            super()._assign_cluster(X)
            stats = self.bench_stats
            if stats["assign_steps"] == 0:
                stats["first_labels"] = np.array(self.labels, copy=True)
            stats["assign_steps"] += 1

        def _update_centroids(self, X):
            self.bench_stats["updates"] += 1
            return super()._update_centroids(X)

    return FixedInitKmeans


def make_sparsekmeans_fit(algorithm, threads):
    import graphblas as gb

    gb.ss.config["nthreads"] = threads  # global default; per-call n_threads is set below too
    cls = sparsekmeans_fixed_init_class(algorithm)

    def fit(X, C0, max_iter):
        model = cls(C0, n_clusters=C0.shape[0], n_threads=threads, max_iter=max_iter, tol=TOL,
                    random_state=INIT_SEED, verbose=False)
        stats = model.bench_stats
        with contextlib.redirect_stdout(io.StringIO()):  # fit() prints "Total samples: n"
            labels = model.fit(X)
        if stats["init_calls"] != 1:
            raise RuntimeError(f"init override called {stats['init_calls']} times, expected 1")
        return {"labels": np.asarray(labels, dtype=np.int64), "centers": model.centroids.to_dense(fill_value=0.0),
                "n_iter": stats["assign_steps"], "n_updates": stats["updates"], "reported_inertia": None,
                "first_labels": stats["first_labels"]}

    return fit


def make_qkm_fit(algorithm, threads):
    sys.path.insert(0, str(REPO_DIR))  # use the working tree's qkm even if not pip-installed
    from qkm import KMeans

    def fit(X, C0, max_iter):
        km = KMeans(n_clusters=C0.shape[0], init=C0, n_init=1, max_iter=max_iter, tol=TOL, algorithm=algorithm,
                    n_jobs=threads)
        km.fit(X)
        centers = km.cluster_centers_
        centers = centers.toarray() if sp.issparse(centers) else np.asarray(centers)
        return {"labels": np.asarray(km.labels_, dtype=np.int64), "centers": centers, "n_iter": int(km.n_iter_),
                "reported_inertia": float(km.inertia_)}

    return fit


def make_fit(method, threads):
    """Import the method's library and return ``fit(X, C0, max_iter) -> dict`` (ImportError propagates)."""
    family, algorithm = method_family(method), method_algorithm(method)
    factory = {"sklearn": make_sklearn_fit, "sparsekmeans": make_sparsekmeans_fit, "qkm": make_qkm_fit}[family]
    return factory(algorithm, threads)


def method_input(method, X):
    """sparsekmeans only takes CSR: dense data is converted before (outside) the timed fit."""
    if method_family(method) == "sparsekmeans" and not sp.issparse(X):
        return sp.csr_matrix(X)
    return X


# --------------------------------------------------------------------------- sparsekmeans init self-check


def check_sparsekmeans_init(n=2000, d=3000, k=20, density=0.02, seed=0):
    """Show that the override is used: first-step labels are nearest-C0 labels; a control run is not."""
    import sparsekmeans
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.preprocessing import normalize

    X = normalize(sp.random(n, d, density=density, format="csr", random_state=seed, dtype=np.float64))
    C0, _ = kmeans_plusplus(X, k, random_state=INIT_SEED)
    nearest_C0, _, _ = assign_and_objective(X, C0)
    print(f"random sparse problem {n} x {d}, density {density}, K={k}; C0 = kmeans_plusplus(random_state={INIT_SEED})")
    ok = True
    for algorithm in ("lloyd", "elkan"):
        fit = make_sparsekmeans_fit(algorithm, 1)
        one = fit(X, C0, 1)
        exact = int(np.count_nonzero(one["first_labels"] != nearest_C0))
        not_nearest = assign_and_objective(X, C0, labels=one["first_labels"])[2]
        full = fit(X, C0, MAX_ITER)
        sk = KMeans(n_clusters=k, init=C0, n_init=1, max_iter=MAX_ITER, tol=TOL, algorithm=algorithm).fit(X)
        obj_skm = assign_and_objective(X, full["centers"])[1]
        obj_sk = assign_and_objective(X, sk.cluster_centers_)[1]
        print(f"sparsekmeans-{algorithm}: first-step labels not nearest to C0: {not_nearest} of {n} "
              f"({exact} differ from numpy argmin; such rows are ties); converged inertia {obj_skm:.10f} "
              f"({full['n_iter']} assignment steps, {full['n_updates']} updates) vs sklearn-{algorithm} "
              f"{obj_sk:.10f} ({sk.n_iter_} it); final labels differ: {int(np.count_nonzero(full['labels'] != sk.labels_))}")
        ok &= not_nearest == 0
    own = sparsekmeans.LloydKmeans(n_clusters=k, n_threads=1, max_iter=1, random_state=123)
    with contextlib.redirect_stdout(io.StringIO()):
        own_labels = np.asarray(own.fit(X))
    print(f"control, its own kmeans++ (no override), max_iter=1: labels not nearest to C0: "
          f"{assign_and_objective(X, C0, labels=own_labels)[2]} of {n}")
    print("init override OK" if ok else "init override FAILED")
    return 0 if ok else 1
