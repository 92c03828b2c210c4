"""The :class:`KMeans` estimator: a thin scikit-learn style layer over the kernels."""

import types
import warnings

import numpy as np
from sklearn.utils import check_random_state

from ._base import (OperatorClusterMixin, check_nonnegative_float, check_seeding, check_verbose, initial_centers,
                    resolve_n_clusters, run_random_states, seeding_of, warn_if_clusters_lost)
from ._base import is_int as _is_int
from .._data import KMeansData
from ..operator._base import DenseOperator
from ._elkan import kmeans_single_elkan
from ._init import distinct_row_indices
from ._init import greedy_kmeanspp
from .._reduce import column_variances
from ._lloyd import kmeans_single_lloyd
from ._stopping import IterationLog
from .._threads import effective_n_threads, numba_threads, run_concurrently
from .._validation import check_data, check_n_clusters

__all__ = ["KMeans", "kmeans_plusplus", "seed_centers"]

_ALGORITHMS = {"lloyd": kmeans_single_lloyd, "elkan": kmeans_single_elkan}


def kmeans_plusplus(X, n_clusters, *, random_state=None, n_local_trials=None, n_jobs=None):
    """Greedy k-means++ seeding for dense or sparse data.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
    n_clusters : int
    random_state : int, RandomState instance or None, default=None
    n_local_trials : int, default=None
        Candidates per step; ``None`` gives ``2 + floor(log2 n_clusters)``.
        Draws follow scikit-learn's ``kmeans_plusplus``, so with the same
        ``n_local_trials`` and seed both pick the same rows (up to
        rounding-level ties).
    n_jobs : int or None, default=None
        numba threads.

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features)
    indices : ndarray of shape (n_clusters,)
        Row of ``X`` behind each centre.

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import kmeans_plusplus
    >>> X = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0], [10.0, 11.0]])
    >>> centers, idx = kmeans_plusplus(X, 2, random_state=0)
    >>> sorted(X[idx, 0].tolist())
    [0.0, 10.0]
    """
    X = check_data(X)
    n_clusters = check_n_clusters(n_clusters)
    if n_clusters > X.shape[0]:
        raise ValueError(f"n_samples={X.shape[0]} should be >= n_clusters={n_clusters}.")
    if n_local_trials is not None and not (_is_int(n_local_trials) and n_local_trials >= 1):
        raise ValueError(f"n_local_trials must be an integer >= 1; got {n_local_trials!r}.")
    with numba_threads(effective_n_threads(n_jobs)):
        return greedy_kmeanspp(KMeansData(X), n_clusters, check_random_state(random_state), n_local_trials)


def seed_centers(X, n_clusters, *, init="d2-seeding", d2_samples=None, oversampling_factor=2.0, init_rounds=5,
                 init_sample=None, random_state=None, n_jobs=None):
    """Initial centres from one of qkm's seedings, with their potential.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
    n_clusters : int
    init : {"d2-seeding", "k-means||", "k-means++", "random"}, default="d2-seeding"
        See :class:`KMeans`; ``d2_samples``, ``oversampling_factor``,
        ``init_rounds`` and ``init_sample`` as there.
    random_state : int, RandomState instance or None, default=None
    n_jobs : int or None, default=None
        numba threads; the result does not depend on it.

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features)
        Distinct centres, in the dtype of ``X`` (float32 stays float32).
    potential : float
        Sum over the rows of ``X`` of the squared distance to the nearest
        centre (the seeding cost).

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import seed_centers
    >>> X = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0], [10.0, 11.0]])
    >>> centers, cost = seed_centers(X, 2, init="k-means||", random_state=0)
    >>> sorted(centers.tolist()), cost
    ([[0.0, 0.5], [10.0, 10.5]], 1.0)
    """
    X = check_data(X)
    n_clusters = check_n_clusters(n_clusters)
    if n_clusters > X.shape[0]:
        raise ValueError(f"n_samples={X.shape[0]} should be >= n_clusters={n_clusters}.")
    params = types.SimpleNamespace(init=init, d2_samples=d2_samples, oversampling_factor=oversampling_factor,
                                   init_rounds=init_rounds, init_sample=init_sample)
    if not isinstance(init, str):
        raise ValueError(f"init must be a seeding name; got {type(init).__name__}.")
    seeding = seeding_of(params)
    if len(distinct_row_indices(X, stop_at=n_clusters)) < n_clusters:
        raise ValueError(f"X holds fewer than n_clusters={n_clusters} distinct points.")
    with numba_threads(effective_n_threads(n_jobs)):
        seeds = initial_centers(seeding, KMeansData(X), n_clusters, check_random_state(random_state))
    return seeds.centers, seeds.cost


def _scaled_tolerance(X, tol):
    """scikit-learn's rule: ``tol`` times the mean feature variance.

    The variances are summed in the fixed block order of :mod:`qkm._reduce`
    (no N x D temporary), so a fit over shards gets the same tolerance.
    """
    if tol == 0:
        return 0.0
    return float(np.mean(column_variances(X)) * tol)


class KMeans(OperatorClusterMixin):
    """K-means clustering for dense and sparse (CSR) data.

    Lloyd and Elkan iterations run in numba kernels made sparse-aware the way
    SparseKmeans does it: distances as ``||c||^2 - 2 X C^T`` (fused with the
    argmin, no ``n_samples x n_clusters`` buffer), centroids kept dense or
    sparse by estimated cost, Elkan's bounds applied to aggregated pair
    batches. Results do not depend on the number of threads.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters. When the data hold fewer distinct points, a
        warning says so and ``n_clusters_`` gives the number actually used.
    init : {"k-means++", "d2-seeding", "k-means||", "random"} or array-like of shape (n_clusters, n_features), \
default="k-means++"
        Greedy k-means++ with ``2 + floor(log2 K)`` candidates per step;
        D^2-seeding (each centre the mean of the heaviest group of a sample
        of ``d2_samples`` points drawn by D^2; lowest seeding cost); k-means||
        (``init_rounds`` rounds of independent D^2 sampling, then the
        weighted candidates reclustered; fewest passes over the data);
        distinct random rows; or given centres. See the README's "Seedings".
    d2_samples : int or None, default=None
        Points drawn per D^2-seeding step (N); None gives ``10 * n_clusters``.
    oversampling_factor : float, default=2.0
        k-means||: about ``oversampling_factor * n_clusters`` candidates
        are drawn per round (ell = 2K).
    init_rounds : int, default=5
        k-means|| rounds (r).
    init_sample : float or None, default=None
        SystemML's ``samp``: seed on a sample of about ``init_sample *
        n_clusters`` rows drawn by geometric skips (50 in SystemML); None
        seeds on every row. Ignored for "random".
    n_init : "auto" or int, default="auto"
        Runs from different seeds, executed in parallel threads; the one
        with the lowest WCSS is kept (SystemML's ``runs``; ties go to the
        earlier run). ``"auto"`` is 1 for a seeding or an array, 10 for
        random. A run whose clusters empty is repaired, never dropped.
    max_iter : int, default=300
        Iterations per run.
    tol : float, default=1e-4
        Stop when the total squared centre shift is at most ``tol`` times the
        mean feature variance (scikit-learn's rule).
    tol_wcss : float, default=0.0
        Also stop when the WCSS decreases by at most ``tol_wcss`` times its
        value (SystemML's rule); 0 disables it.
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        Both give the same labels from the same initial centres.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation.
    n_jobs : int or None, default=None
        numba threads (``None``: all; ``-1``: all; ``-2``: all but one).
    verbose : int, default=0
        Print the WCSS of every iteration on stderr.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters_, n_features)
    operator_ : qkm.operator.DenseOperator
        The centres as a centroid operator; prediction goes through it.
    labels_ : ndarray of shape (n_samples,)
    inertia_ : float
        Sum of squared distances of the samples to their closest centre.
    n_iter_ : int
        Iterations of the best run.
    n_clusters_ : int
        Clusters actually used (``< n_clusters`` only for too few distinct points).
    n_features_in_ : int
    history_ : list of dict
        Per-iteration records of the best run (WCSS, shift, centroid storage,
        ...). ``history_[0]`` also holds the seeding: ``seeding`` (its name),
        ``seeding_cost`` (the potential of the initial centres on ``X``),
        ``seeding_seconds`` and ``seeding_rows`` (rows it ran on).

    See Also
    --------
    sklearn.cluster.KMeans : the reference implementation.

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import KMeans
    >>> X = np.array([[1, 2], [1, 4], [1, 0], [10, 2], [10, 4], [10, 0]], dtype=float)
    >>> km = KMeans(n_clusters=2, random_state=0).fit(X)
    >>> sorted(km.cluster_centers_.tolist())
    [[1.0, 2.0], [10.0, 2.0]]
    >>> km.predict([[0, 0], [12, 3]]).tolist() == [km.labels_[0], km.labels_[3]]
    True
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        init="k-means++",
        d2_samples=None,
        oversampling_factor=2.0,
        init_rounds=5,
        init_sample=None,
        n_init="auto",
        max_iter=300,
        tol=1e-4,
        tol_wcss=0.0,
        algorithm="lloyd",
        random_state=None,
        n_jobs=None,
        verbose=0,
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.d2_samples = d2_samples
        self.oversampling_factor = oversampling_factor
        self.init_rounds = init_rounds
        self.init_sample = init_sample
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.tol_wcss = tol_wcss
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose

    # ------------------------------------------------------------------ #
    def _check_params(self):
        check_n_clusters(self.n_clusters)
        check_seeding(self)
        if not (self.n_init == "auto" or _is_int(self.n_init) and self.n_init >= 1):
            raise ValueError(f"n_init must be 'auto' or an integer >= 1; got {self.n_init!r}.")
        if not (_is_int(self.max_iter) and self.max_iter >= 1):
            raise ValueError(f"max_iter must be an integer >= 1; got {self.max_iter!r}.")
        for name in ("tol", "tol_wcss"):
            check_nonnegative_float(name, getattr(self, name))
        if self.algorithm not in _ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(_ALGORITHMS)}; got {self.algorithm!r}.")
        check_verbose(self.verbose)
        effective_n_threads(self.n_jobs)

    def _n_runs(self):
        if self.n_init != "auto":
            if not isinstance(self.init, str) and self.n_init != 1:
                warnings.warn(
                    f"Explicit initial centres given: n_init={self.n_init} runs would all be the same; running once.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return 1
            return int(self.n_init)
        return 10 if isinstance(self.init, str) and self.init == "random" else 1

    def fit(self, X, y=None, *, callback=None):
        """Compute k-means clustering.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features) or qkm.distributed.ShardedData
            Training data; sparse input is used as CSR without densifying.
            Shards on a Dask cluster give the same result, with ``labels_``
            as a dask array.
        y : Ignored
        callback : callable, default=None
            Called with each iteration's record (a dict: iteration, wcss, shift, ...).

        Returns
        -------
        self : KMeans
        """
        self._check_params()
        if hasattr(X, "_qkm_fit"):  # data on shards (qkm.distributed.ShardedData): the same steps, run there
            return X._qkm_fit(self, callback=callback)
        X = check_data(X)
        self.n_features_in_ = X.shape[1]
        n_clusters = resolve_n_clusters(X, self.n_clusters, isinstance(self.init, str))
        rng = check_random_state(self.random_state)
        tol = _scaled_tolerance(X, self.tol)
        run = _ALGORITHMS[self.algorithm]
        seeding = seeding_of(self)
        n_runs = self._n_runs()
        rngs = run_random_states(rng, n_runs)
        n_threads = effective_n_threads(self.n_jobs)
        with numba_threads(n_threads):
            data = KMeansData(X)

            def one_run(run_id):
                run_data = data if n_runs == 1 else data.for_run()
                seeds = initial_centers(seeding, run_data, n_clusters, rngs[run_id])
                log = IterationLog(self.verbose, prefix=f"run {run_id + 1}: " if self.verbose else "",
                                   callback=callback, first=seeds.record)
                labels, inertia, centers, n_iter = run(
                    run_data, seeds.centers, max_iter=self.max_iter, tol=tol, tol_wcss=self.tol_wcss,
                    verbose=self.verbose, log=log,
                )
                return labels, inertia, centers, n_iter, log.records

            results = run_concurrently(one_run, n_runs, n_threads)
        labels, inertia, centers, n_iter, records = min(results, key=lambda r: r[1])  # first of equals
        warn_if_clusters_lost(labels, n_clusters)
        return self._set_fitted(labels, inertia, centers, n_iter, n_clusters, records)

    def _set_fitted(self, labels, inertia, centers, n_iter, n_clusters, records):
        self.cluster_centers_ = centers
        self.operator_ = DenseOperator(centers)
        self.labels_ = labels
        self.inertia_ = inertia
        self.n_iter_ = n_iter
        self.n_clusters_ = n_clusters
        self.history_ = records
        self._n_features_out = n_clusters
        return self
