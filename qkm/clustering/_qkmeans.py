"""QK-means and low-rank k-means: k-means whose centroid matrix has a cheap structure.

Both estimators are thin layers over :func:`qkm.clustering._factored_lloyd.factored_lloyd`;
they differ only in the *fitter* that turns weighted cluster means into a
centroid operator: a product of sparse factors fitted by palm4MSA
(:class:`QKMeans`), or a rank-``r`` matrix fitted by a truncated SVD
(:class:`LowRankKMeans`, the baseline the paper did not measure).
"""

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ._base import (OperatorClusterMixin, check_nonnegative_float, check_seeding, check_verbose, initial_centers,
                    is_int, resolve_n_clusters, warn_if_clusters_lost)
from .._data import KMeansData
from ._factored_lloyd import factored_lloyd, keeps_csr_means
from ._stopping import IterationLog
from .._threads import effective_n_threads, numba_threads, single_threaded_blas
from .._validation import check_choice, check_data
from ..factorization._shapes import BUDGET_SPLITS, default_n_factors
from ._fitters import _ChainFitter, _LowRankFitter

__all__ = ["QKMeans", "LowRankKMeans"]


# --------------------------------------------------------------------------- #
class _FactoredKMeans(OperatorClusterMixin):
    """Shared fit for the structured-centroid estimators."""

    def _check_common_params(self):
        check_seeding(self)
        for name in ("n_init", "max_iter"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
        check_nonnegative_float("tol", self.tol)
        if not isinstance(self.center, (bool, np.bool_)):
            raise ValueError(f"center must be True or False; got {self.center!r}.")
        check_verbose(self.verbose)
        effective_n_threads(self.n_jobs)

    def fit(self, X, y=None, *, callback=None):
        """Fit the structured centroids.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features) or qkm.distributed.ShardedData
            Training data; sparse input is used as CSR without densifying.
            Shards on a Dask cluster give the same result, with ``labels_``
            as a dask array.
        y : Ignored
        callback : callable, default=None
            Called with every step's record (a dict: iteration, step, objective, ...).

        Returns
        -------
        self
        """
        self._check_params()
        if hasattr(X, "_qkm_fit"):  # data on shards (qkm.distributed.ShardedData): the same loop, passes there
            return X._qkm_fit(self, callback=callback)
        X = check_data(X)
        self.n_features_in_ = X.shape[1]
        n_clusters = resolve_n_clusters(X, self.n_clusters, isinstance(self.init, str))
        rng = check_random_state(self.random_state)
        n_runs = self.n_init if isinstance(self.init, str) else 1
        best = None
        with numba_threads(effective_n_threads(self.n_jobs)), single_threaded_blas():
            data = KMeansData(X)
            # with center=True the structure fits the centred means; the mean is kept beside it
            mean = data.column_mean() if self.center else None
            for run_id in range(n_runs):
                fitter = self._make_fitter(n_clusters, X.shape[1])
                # wide sparse data: seeds, means and refits in CSR, never a dense K x D buffer (_factored_lloyd)
                wide = keeps_csr_means(fitter, data.sparse, mean, n_clusters, X.shape[1])
                seeds = initial_centers(self, data, n_clusters, rng, sparse_centers=wide)
                prefix = f"run {run_id + 1}: " if self.verbose else ""
                log = IterationLog(self.verbose, prefix=prefix, callback=callback, first=seeds.record)
                result = factored_lloyd(data, seeds.centers, fitter, max_iter=self.max_iter, tol=self.tol, rng=rng,
                                        polish_iter=self._polish_iter(), log=log, mean=mean)
                if best is None or result["inertia"] < best[0]["inertia"]:
                    best = (result, log.records)
        result, records = best
        warn_if_clusters_lost(result["labels"], n_clusters)
        return self._set_fitted(result, records, n_clusters)

    @property
    def cluster_centers_(self):
        """``mean_ + S_1 ... S_Q`` as a dense array, folded on first access when the chain is large."""
        check_is_fitted(self, "operator_")
        if self.__dict__.get("_cluster_centers") is None:
            self._cluster_centers = np.ascontiguousarray(self.operator_.to_dense())
        return self._cluster_centers

    @cluster_centers_.setter
    def cluster_centers_(self, value):
        self._cluster_centers = value

    def _set_fitted(self, result, records, n_clusters):
        operator = result["operator"]
        self.operator_ = operator
        self.factors_ = list(operator.factors)
        self.mean_ = None if operator.mean is None else np.array(operator.mean)
        self.nnz_with_mean_ = int(operator.nnz + operator.mean_nnz)
        # folded now only when the operator holds V (a small chain); a large one (wide data) on first access
        self._cluster_centers = np.ascontiguousarray(operator.to_dense()) if operator.holds_dense else None
        self.labels_ = result["labels"]
        self.inertia_ = result["inertia"]
        self.n_iter_ = result["n_iter"]
        self.n_clusters_ = n_clusters
        self.objective_history_ = result["objective_history"]
        self.history_ = records
        self.nnz_ = int(operator.nnz)
        self.flops_ = int(operator.flops)
        self.compression_ = float(operator.compression)
        self._n_features_out = n_clusters
        return self


class QKMeans(_FactoredKMeans):
    """QK-means: k-means whose centroid matrix is a product of sparse factors.

    Each Lloyd iteration assigns the points with the factored operator
    ``V = S_1 S_2 ... S_Q``, recomputes the cluster means ``U`` and refits the
    factors to ``diag(sqrt(n_k)) U`` (warm-started from the previous factors),
    which minimises the k-means objective for the current labels (Giffon et
    al., 2021, Algorithm 1). The paper's chain has ``floor(log2(max(K, D)))``
    factors of at most ``sparsity_level * max(r, c)`` values each (the
    nominal budget of the paper's code; its projection keeps more). By
    default, when ``K <= D``, two factors ``K x K`` and ``K x D`` hold the
    same values in all: the wide one keeps its ``s * D``, the other the rest
    (up to ``K * K``; ``budget_split``); when ``K > D`` (many clusters), two
    factors ``K x D`` and ``D x D`` hold ``s * floor(log2(K))`` values per
    centroid, half in each, and warm refits move the supports in their first
    sweep only (``history_`` records the shapes, budgets and support sweeps;
    docs/decisions.md, 'Many clusters'). The first factors come from
    hierarchical palm4MSA on the initial centres (on wide sparse data, when the
    seeds fit the last factor's budget, the exact chain of identities and the
    seeds); every refit then runs
    least-squares sweeps that solve each factor exactly on a support and pick
    the supports afresh (greedy orthogonal least squares for the first and last
    factors; see :func:`qkm.factorization.factorize`); a longer polish runs at the
    end. A refit that would raise the objective is discarded. When the means
    are sparse (tf-idf data) the sweeps keep them and the wide last factor
    sparse, move the last factor's support by a gradient step, and run fewer
    sweeps (see ``palm_warm_iter``; ``history_`` records what ran).

    Applying ``V`` to a vector costs ``2 * nnz_`` flops instead of
    ``2 * K * D``; which code path actually runs fastest (the sparse chain or
    the folded dense matrix) is measured, see ``operator_``.

    Parameters
    ----------
    n_clusters : int, default=8
    sparsity_level : int, default=3
        ``s``, the paper's sparsity level. When ``K <= D`` the model keeps at
        most the values of the paper's chain, ``s * max(r, c)`` per factor
        of shape ``(r, c)`` over its ``P = floor(log2(max(K, D)))`` factors
        (``s (A (P - 1) + D)``: 3,888 at K = 64, D = 784, s = 3), however
        many factors hold them (``budget_split``); when ``K > D``,
        ``s * floor(log2(K))`` values per centroid (30,720 at K = 1,024,
        s = 3: :func:`qkm.factorization.chain_total`).
    n_factors : int or None, default=None
        Factors ``Q``. Shapes are ``K x A``, ``A x A`` ..., ``A x D`` with
        ``A = min(K, D)``. None: 2 (1 when ``max(K, D) < 4``), holding
        :func:`qkm.factorization.chain_total` values (see docs/decisions.md,
        'Chain length' and 'Many clusters'); a given ``n_factors`` with the
        default ``budget_split`` is the paper's chain on that many factors.
    init : {"k-means++", "d2-seeding", "k-means||", "random"} or array of shape (n_clusters, n_features), \
default="k-means++"
    d2_samples, oversampling_factor, init_rounds, init_sample
        Seeding parameters, as in :class:`qkm.KMeans`.
    n_init : int, default=1
        Runs from different seeds; the lowest objective wins.
    max_iter : int, default=50
        Lloyd iterations (assignment + refit).
    tol : float, default=1e-4
        Stop when one iteration lowers the objective by at most ``tol`` times its value.
    palm_max_iter : int or None, default=None
        Factorisation sweeps of the final polish; None: 300, or 3 when the
        means are sparse (wide sparse data, see ``history_``).
    palm_warm_iter : int or None, default=None
        Factorisation sweeps per Lloyd iteration (warm-started); None: 10, or
        1 when the means are sparse. With sparse means the supports are
        updated in the first sweep of every refit only (the others solve the
        values on them), with dense means in every sweep.
    palm_tol : float, default=1e-6
        A factorisation stops when its objective changes by less than this (relative).
    center : bool, default=False
        Keep the data mean beside the factors (``V = mean_ + S_1 ... S_Q``)
        and fit the factors to the centred means. Off by default: the chain
        can represent the mean itself (an atom with a scale per centroid), and
        the model is ``n_features`` values smaller (see docs/decisions.md,
        'Centring'). Sparse data stay sparse either way.
    budget_split : {"auto", "total", "even", "wide"}, default="auto"
        "auto": "total" when ``n_factors`` is None, "even" when it is given
        (a given ``n_factors`` fits the chain it fitted before the 2-factor
        default). "total": the total of the paper's chain of
        ``floor(log2(max(K, D)))`` factors whatever ``n_factors``: the widest factor (``A x D``, or
        ``K x A`` when ``K > D``) keeps ``s * max(r, c)``, the others share
        the rest (a short chain gets denser inner factors; K = 64, D = 784,
        s = 3, 2 factors: 1,536 and 2,352 values). On the paper's chain it
        is "even"; on 3 or more factors it makes the inner ones denser,
        which on wide sparse data costs memory (dense products of the inner
        factors). "even": every factor keeps ``s * max(r, c)``, as the
        paper's code (fewer values in all on a shorter chain;
        ``n_factors=floor(log2(max(K, D)))`` is the chain this estimator
        fitted by default before). "wide": the even
        total, ``(s - 1) * max(r, c)`` for every factor but the widest,
        which takes the rest (see docs/decisions.md, 'Budget splits').
    random_state : int, RandomState instance or None, default=None
    n_jobs : int or None, default=None
        numba threads.
    verbose : int, default=0
        Print every step's objective on stderr.

    Attributes
    ----------
    factors_ : list of scipy.sparse.csr_matrix
        ``[S_1, ..., S_Q]`` whose product (plus ``mean_``) is the centroid
        matrix (the scale is folded into ``S_1``).
    mean_ : ndarray of shape (n_features,) or None
        The mean kept beside the factors (``center=True``), else None.
    operator_ : qkm.operator.FactorChainOperator
    cluster_centers_ : ndarray of shape (n_clusters_, n_features)
        ``mean_ + S_1 ... S_Q`` as a dense matrix, for convenience; on wide
        data (a chain too large to fold, see ``operator_``) folded on first
        access: the fit itself never forms a dense ``K x D`` array there.
    labels_ : ndarray of shape (n_samples,)
    inertia_ : float
        Sum of squared distances of the samples to their closest (factored) centre.
    n_iter_ : int
    n_clusters_ : int
    n_features_in_ : int
    objective_history_ : ndarray
        The k-means objective after every step (assignment, refit, ..., polish,
        final assignment); non-increasing.
    history_ : list of dict
        One record per step (step name, objective, palm4MSA result kept,
        execution path of the operator, seconds); ``history_[0]`` also holds
        ``seeding``, ``seeding_cost``, ``seeding_seconds`` and ``seeding_rows``.
        The ``init``, ``refit`` and ``polish`` records also say where the
        factorisation ran: ``columns`` is "columns" when it ran on the active
        columns only (the nonzero columns of the means and of the last factor,
        wide sparse data) and "dense" otherwise, ``n_columns`` how many it saw;
        ``target`` is "sparse" when the means (and the wide factor) were kept
        sparse (at most 30 % nonzeros and at least 2,048 columns:
        :mod:`qkm.factorization._lsq_sparse`)
        and "dense" otherwise; ``sweeps`` counts the least-squares sweeps run;
        the ``init`` record's ``start`` is "exact" when the seeds fit the last
        factor's budget (the chain starts as identities times the seeds, wide
        sparse data) and "hierarchical" (palm4MSA) otherwise; ``means`` is
        "csr" when the cluster means were kept as CSR from the sparse rows
        (sparse data, at least 2,048 columns, ``center=False``: no dense
        ``K x D`` array in the fit) and "dense" otherwise.
    nnz_, flops_ : int
        Nonzeros of the factors and flops to assign a sample (``2 * nnz_``;
        the mean needs none for the labels).
    nnz_with_mean_ : int
        ``nnz_`` plus the nonzeros of ``mean_``: every value the model stores
        (``2 * nnz_with_mean_`` flops give the distances).
    compression_ : float
        ``K * D / nnz_``.

    See Also
    --------
    LowRankKMeans : the rank-constrained baseline.
    qkm.factorization.factorize : the factorisation of the seeds (and of any matrix).

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import QKMeans
    >>> rng = np.random.RandomState(0)
    >>> X = np.vstack([rng.normal(c, 0.1, size=(20, 8)) for c in (0.0, 3.0, 6.0, 9.0)])
    >>> qk = QKMeans(n_clusters=4, sparsity_level=2, random_state=0).fit(X)
    >>> len(np.unique(qk.labels_))
    4
    >>> bool(np.all(np.diff(qk.objective_history_) <= 1e-9 * qk.objective_history_[:-1]))
    True
    """

    def __init__(self, n_clusters=8, *, sparsity_level=3, n_factors=None, init="k-means++", d2_samples=None,
                 oversampling_factor=2.0, init_rounds=5, init_sample=None, n_init=1,
                 max_iter=50, tol=1e-4, palm_max_iter=None, palm_warm_iter=None, palm_tol=1e-6, center=False,
                 budget_split="auto", random_state=None, n_jobs=None, verbose=0):
        self.n_clusters = n_clusters
        self.sparsity_level = sparsity_level
        self.budget_split = budget_split
        self.n_factors = n_factors
        self.init = init
        self.d2_samples = d2_samples
        self.oversampling_factor = oversampling_factor
        self.init_rounds = init_rounds
        self.init_sample = init_sample
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.palm_max_iter = palm_max_iter
        self.palm_warm_iter = palm_warm_iter
        self.palm_tol = palm_tol
        self.center = center
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose

    def _check_params(self):
        if not (is_int(self.sparsity_level) and self.sparsity_level >= 1):
            raise ValueError(f"sparsity_level must be an integer >= 1; got {self.sparsity_level!r}.")
        if self.n_factors is not None and not (is_int(self.n_factors) and self.n_factors >= 1):
            raise ValueError(f"n_factors must be None or an integer >= 1; got {self.n_factors!r}.")
        for name in ("palm_max_iter", "palm_warm_iter"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 0):
                raise ValueError(f"{name} must be None or an integer >= 0; got {value!r}.")
        check_nonnegative_float("palm_tol", self.palm_tol)
        check_choice("budget_split", self.budget_split, ("auto",) + BUDGET_SPLITS)
        self._check_common_params()

    def _make_fitter(self, n_clusters, n_features):
        n_factors = self.n_factors if self.n_factors is not None else default_n_factors(n_clusters, n_features)
        split = self.budget_split
        if split == "auto":         # the default chain holds the paper chain's values; a given one is split evenly
            split = "total" if self.n_factors is None else "even"
        return _ChainFitter(n_factors, self.sparsity_level, self.palm_warm_iter, self.palm_tol, split)

    def _polish_iter(self):
        return self.palm_max_iter


class LowRankKMeans(_FactoredKMeans):
    """k-means with centroids restricted to rank ``r``: ``V = P Q``, ``P`` K x r, ``Q`` r x D.

    The same Lloyd loop as :class:`QKMeans`, with the structure fitted
    exactly by a truncated SVD of ``diag(sqrt(n_k)) U`` at every iteration.
    It stores ``r (K + D)`` values; choose ``r`` so that this matches a
    QK-means model's ``nnz_`` for a like-for-like comparison.

    Parameters
    ----------
    n_clusters : int, default=8
    rank : int, default=8
        Rank of the centroid matrix (capped at ``min(K, D)``).
    init, d2_samples, oversampling_factor, init_rounds, init_sample, n_init, max_iter, tol, center, \
random_state, n_jobs, verbose
        As in :class:`QKMeans` (``center=True``: ``V = mean_ + P Q``, for
        ``n_features`` more values; see docs/decisions.md, 'Centring').

    Attributes
    ----------
    factors_ : list of two ndarrays-as-CSR ``[P, Q]``
    mean_, nnz_with_mean_
    operator_, cluster_centers_, labels_, inertia_, n_iter_, n_clusters_,
    n_features_in_, objective_history_, history_, nnz_, flops_, compression_
        As in :class:`QKMeans`.

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import LowRankKMeans
    >>> rng = np.random.RandomState(0)
    >>> X = np.vstack([rng.normal(c, 0.1, size=(20, 8)) for c in (0.0, 3.0, 6.0)])
    >>> lr = LowRankKMeans(n_clusters=3, rank=1, random_state=0).fit(X)
    >>> int(np.linalg.matrix_rank(lr.cluster_centers_))
    1
    """

    def __init__(self, n_clusters=8, *, rank=8, init="k-means++", d2_samples=None, oversampling_factor=2.0,
                 init_rounds=5, init_sample=None, n_init=1, max_iter=50, tol=1e-4, center=False, random_state=None,
                 n_jobs=None, verbose=0):
        self.n_clusters = n_clusters
        self.rank = rank
        self.center = center
        self.init = init
        self.d2_samples = d2_samples
        self.oversampling_factor = oversampling_factor
        self.init_rounds = init_rounds
        self.init_sample = init_sample
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose

    def _check_params(self):
        if not (is_int(self.rank) and self.rank >= 1):
            raise ValueError(f"rank must be an integer >= 1; got {self.rank!r}.")
        self._check_common_params()

    def _make_fitter(self, n_clusters, n_features):
        return _LowRankFitter(self.rank)

    def _polish_iter(self):
        return 0
