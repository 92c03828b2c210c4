"""Approximate nearest-neighbour search: an inverted-file index with its own partition, or the model's clusters.

:class:`ClusterIndex` stores the training rows list by list, contiguous.
By default the lists are the index's own partition, a k-means of the rows'
coordinates on their first principal axes with about ``4 sqrt(n)`` lists,
and ``nprobe`` is calibrated at fit time for a target recall. With
``partition="model"`` the lists are the model's clusters, ranked per query
through the model's centroid operator (the 1-NN protocol of the QK-means
paper at ``nprobe=1``, faiss' ``IndexIVFFlat`` with the model's centroids).
Either way a query is answered by one compiled ``nogil`` kernel that ranks
the lists, bounds every row of the probed lists with its principal-axes
coordinates and computes exact float64 distances for the rows the bounds
cannot rule out, so the answer is exactly the ``k`` nearest rows of the
probed lists.
"""

import numbers

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..clustering._base import is_int, operator_of
from ._index import BATCH_MIN_QUERIES_PER_LIST, GROUPED_MIN_K, InvertedLists
from ._index_build import BLOCK_DIMS, HEAD_DIMS, TAIL_BLOCKS, coordinates, fit_basis, fit_quantizer
from ._index_probe import calibrate_nprobe, cluster_sq_distances, nearest_clusters, probe_lists
from ._index_state import export_state, import_state
from .._threads import effective_n_threads, numba_threads
from .._validation import check_data, check_feature_count, check_fitted_data

__all__ = ["ClusterIndex"]

#: ``nprobe="auto"``: held-out rows used for the calibration (at most, and at least to calibrate at all).
MAX_HELD_OUT = 2000
MIN_HELD_OUT = 200


class ClusterIndex(BaseEstimator):
    """Inverted-file nearest-neighbour index over the training rows of a qkm model.

    ``fit`` partitions the rows into lists, stores them list by list with
    their coordinates on the data's first principal axes, and (with
    ``nprobe="auto"``) picks how many lists a query searches. ``query``
    ranks the lists for each query, bounds the distance of every row of the
    ``nprobe`` nearest lists from its coordinates and computes the exact
    distance of every row the bounds leave in play, all in one compiled
    kernel, so ``nprobe = n_lists_`` is exact brute force.

    Parameters
    ----------
    estimator : fitted qkm estimator or loaded model
        Anything holding a :class:`qkm.operator.CentroidOperator` as
        ``operator_`` (a fitted :class:`qkm.KMeans`, :class:`qkm.QKMeans`,
        :class:`qkm.LowRankKMeans`) or ``operator`` (a model read by
        ``qkm.export.load_model``), or an operator itself. It is not refitted;
        an unfitted qkm estimator (for instance after
        :func:`sklearn.base.clone`) is cloned and fitted on ``X``. Its
        clusters are the lists with ``partition="model"`` and are
        ``labels_`` in any case.
    nprobe : "auto" or int, default="auto"
        Lists searched per query. ``"auto"``: the smallest number whose
        recall@1 on held-out fitted rows reaches ``target_recall`` with 90 %
        confidence (``nprobe_``, see ``calibration_``).
    partition : {"auto", "model"}, default="auto"
        ``"auto"``: the index's own lists, a :class:`qkm.KMeans` of the rows'
        first principal coordinates with ``n_lists`` lists. ``"model"``: the
        model's clusters, ranked per query through its centroid operator.
    n_lists : int or None, default=None
        Lists of the own partition; None gives ``round(4 sqrt(n_samples))``.
    target_recall : float, default=0.99
        Recall@1 aimed at by ``nprobe="auto"``, in (0, 1].
    store : {"float32", "int8"}, default="float32"
        How the rows' principal coordinates (what the bounds scan) and the
        lists' centroids are stored: float32, or int8 steps over each
        coordinate's range (4x smaller: 192 instead of 768 bytes per row; the
        bounds widen by half a step, the answers stay exact within the probed
        lists). The rows themselves are kept as given in either case.
    random_state : int, RandomState instance or None, default=None
        Row sample of the principal axes, held-out rows, k-means seeding.
    n_jobs : int or None, default=None
        numba threads (batches of queries run in parallel).

    Attributes
    ----------
    operator_ : qkm.operator.CentroidOperator
        The model's centroid operator.
    n_features_in_ : int
    n_samples_fit_ : int
        Rows stored.
    labels_ : ndarray of shape (n_samples_fit_,), int64
        The model's cluster of each training row.
    n_lists_ : int
    list_of_row_ : ndarray of shape (n_samples_fit_,), int64
        List of each training row.
    list_sizes_ : ndarray of shape (n_lists_,), int64
        Rows per list.
    nprobe_ : int
        Lists searched when ``query`` gets no ``nprobe``.
    calibration_ : dict
        How ``nprobe_`` was chosen: ``held_out`` rows, their ``recall`` at
        ``nprobe_`` and its one-sided 90 % ``recall_lower_bound`` (empty for
        an integer ``nprobe``).
    y_ : ndarray of shape (n_samples_fit_,) or None
        Training labels, for :meth:`predict`.

    Notes
    -----
    Lists are ranked by the squared distance of the query to their centroid
    (ties: lowest index); empty lists are never probed. If the ``nprobe``
    nearest lists hold fewer than ``k`` rows in total, the next nearest lists
    are probed too until they hold at least ``k``. Results are exactly the
    ``k`` nearest rows of the probed lists (distances in float64, sorted by
    (distance, index)), the same for one query, a batch and any thread
    count. Small indexes (fewer than 2,000 rows with ``nprobe="auto"``) are
    searched exhaustively. Memory: the rows (in the dtype they were given),
    plus ``HEAD_DIMS + 2 * BLOCK_DIMS`` = 192 float32 coordinates per row
    (at most ``n_features``; int8 with ``store="int8"``) - see :meth:`describe`.

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import ClusterIndex, KMeans
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(300, 4))
    >>> y = (X[:, 0] > 0).astype(int)
    >>> index = ClusterIndex(KMeans(n_clusters=8, random_state=0).fit(X), random_state=0).fit(X, y)
    >>> dist, ind = index.query(X[:3], k=2)
    >>> ind[:, 0].tolist(), dist[:, 0].tolist()   # every row is its own nearest neighbour
    ([0, 1, 2], [0.0, 0.0, 0.0])
    >>> bool(np.all(index.predict(X) == y))
    True
    >>> index.describe()["nprobe"] == index.nprobe_ == index.n_lists_   # 300 rows: exhaustive
    True
    """

    def __init__(self, estimator, nprobe="auto", *, partition="auto", n_lists=None, target_recall=0.99,
                 store="float32", random_state=None, n_jobs=None):
        self.estimator = estimator
        self.nprobe = nprobe
        self.partition = partition
        self.n_lists = n_lists
        self.target_recall = target_recall
        self.store = store
        self.random_state = random_state
        self.n_jobs = n_jobs

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # CSR rows are indexed and searched as CSR
        return tags

    # ------------------------------------------------------------------ #
    def _resolve_operator(self, X):
        operator = operator_of(self.estimator)
        if operator is not None:
            return operator
        if hasattr(self.estimator, "fit") and hasattr(self.estimator, "get_params"):
            operator = operator_of(clone(self.estimator).fit(X))
            if operator is not None:
                return operator
        raise ValueError(
            "estimator must be a fitted qkm estimator (with operator_), a loaded model (with operator) or a "
            f"CentroidOperator; got {type(self.estimator).__name__}."
        )

    @staticmethod
    def _check_nprobe(nprobe, n_lists):
        if not is_int(nprobe) or not 1 <= nprobe <= n_lists:
            raise ValueError(f"nprobe must be an integer in [1, n_lists_={n_lists}]; got {nprobe!r}.")
        return int(nprobe)

    def _check_params(self):
        if not (self.nprobe == "auto" if isinstance(self.nprobe, str) else is_int(self.nprobe) and self.nprobe >= 1):
            raise ValueError(f"nprobe must be 'auto' or an integer >= 1; got {self.nprobe!r}.")
        if self.partition not in ("auto", "model"):
            raise ValueError(f"partition must be 'auto' or 'model'; got {self.partition!r}.")
        if self.store not in ("float32", "int8"):
            raise ValueError(f"store must be 'float32' or 'int8'; got {self.store!r}.")
        if self.n_lists is not None and not (is_int(self.n_lists) and self.n_lists >= 1):
            raise ValueError(f"n_lists must be None or an integer >= 1; got {self.n_lists!r}.")
        t = self.target_recall
        if not isinstance(t, numbers.Real) or isinstance(t, bool) or not 0.0 < t <= 1.0:
            raise ValueError(f"target_recall must be a float in (0, 1]; got {t!r}.")

    def fit(self, X, y=None):
        """Partition the rows of ``X`` into lists, store them, and calibrate ``nprobe="auto"``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Rows to index; CSR input is stored as CSR.
        y : array-like of shape (n_samples,), default=None
            Labels of the rows, needed by :meth:`predict`.

        Returns
        -------
        self : ClusterIndex
        """
        self._check_params()
        n_threads = effective_n_threads(self.n_jobs)
        X = check_data(X)
        with numba_threads(n_threads):
            operator = self._resolve_operator(X)
            check_feature_count(X, operator.n_features, estimator="the model's centroid operator")
            if y is not None:
                y = np.asarray(y)
                if y.ndim != 1 or y.shape[0] != X.shape[0]:
                    raise ValueError(f"y must be 1-D with one label per row of X ({X.shape[0]}); got shape {y.shape}.")
            labels = nearest_clusters(operator, X)
        n = X.shape[0]
        rng = check_random_state(self.random_state)
        n_held = min(MAX_HELD_OUT, n // 10) if self.nprobe == "auto" else 0
        n_held = n_held if n_held >= MIN_HELD_OUT else 0
        held = np.sort(rng.permutation(n)[:n_held])
        train = np.setdiff1d(np.arange(n), held, assume_unique=True) if n_held else slice(None)
        X_train = X[train]
        mean, basis = fit_basis(X_train, HEAD_DIMS + TAIL_BLOCKS * BLOCK_DIMS, rng)
        if self.partition == "model":
            lists, n_lists, centers = labels, operator.n_clusters, None
        else:
            h = min(HEAD_DIMS, basis.shape[1])
            n_train = X_train.shape[0]
            n_lists = min(self.n_lists or max(1, int(round(4 * np.sqrt(n)))), n_train)
            head = np.ascontiguousarray(coordinates(X, mean, basis, 0, h), dtype=np.float32)
            centers = fit_quantizer(head[train], n_lists, rng, self.n_jobs)
            n_lists = centers.shape[0]
            from ..operator import DenseOperator

            with numba_threads(n_threads):
                lists = DenseOperator(centers).assign(head)[0].astype(np.int64)
        self._set_fitted(operator, X, lists, n_lists, mean, basis, centers, labels, y)
        if self.nprobe != "auto":
            self.nprobe_ = self._check_nprobe(self.nprobe, self.n_lists_)
            self.calibration_ = {}
        elif n_held:
            X_held = X[held]
            given = cluster_sq_distances(operator, X_held) if self.partition == "model" else None
            self.nprobe_, self.calibration_ = calibrate_nprobe(self._lists, X_held, held, given, self.target_recall,
                                                               n_threads)
        else:
            self.nprobe_ = int((self.list_sizes_ > 0).sum())
            self.calibration_ = {"held_out": 0, "recall": 1.0, "recall_lower_bound": None}
        if self.calibration_:
            self.calibration_["target_recall"] = float(self.target_recall)
        return self

    def _set_fitted(self, operator, X, lists, n_lists, mean, basis, centers, labels, y):
        self._lists = InvertedLists(X, lists, n_lists, mean, basis, centers, self.store)
        self.operator_ = operator
        self.n_features_in_ = int(X.shape[1])
        self.n_samples_fit_ = int(X.shape[0])
        self.n_lists_ = int(n_lists)
        self.list_of_row_ = np.asarray(lists, dtype=np.int64)
        self.list_sizes_ = self._lists.sizes
        self.labels_ = np.asarray(labels, dtype=np.int64)
        self.y_ = y

    # ------------------------------------------------------------------ #
    def _check_query(self, X, k, nprobe):
        if not hasattr(self, "_lists"):
            check_is_fitted(self, "operator_")
        if not is_int(k) or k < 1:
            raise ValueError(f"k must be an integer >= 1; got {k!r}.")
        if k > self.n_samples_fit_:
            raise ValueError(f"k={k} is larger than the number of indexed rows ({self.n_samples_fit_}).")
        nprobe = self.nprobe_ if nprobe is None else self._check_nprobe(nprobe, self.n_lists_)
        if type(X) is np.ndarray and X.ndim == 2 and X.dtype.kind == "f" and X.dtype.itemsize in (4, 8) \
                and X.shape[0] >= 1 and X.shape[1] == self.n_features_in_ and self._lists.centers is not None:
            return X, int(k), nprobe  # the kernels flag rows that are not finite (then validated in full)
        return check_fitted_data(self, X, "operator_"), int(k), nprobe

    def _given(self, X):
        """The queries' distances to the lists when the lists are the model's clusters, else None."""
        return cluster_sq_distances(self.operator_, X) if self._lists.centers is None else None

    def _probe(self, X, k, nprobe):
        """Lists probed for every row of validated ``X``: (n, p_max) int64, -1 padded (diagnostics)."""
        n_threads = effective_n_threads(self.n_jobs)
        with numba_threads(n_threads):
            given = self._given(X)
            sq = given if given is not None else self._lists.list_distances(X, n_threads)
        return probe_lists(sq, self.list_sizes_, nprobe, k)

    def query(self, X, k=1, nprobe=None):
        """The ``k`` nearest indexed rows of every query, searched in the ``nprobe`` nearest lists.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_queries, n_features)
        k : int, default=1
            Neighbours per query, at most ``n_samples_fit_``.
        nprobe : int or None, default=None
            Lists searched per query, in ``[1, n_lists_]``; None uses ``nprobe_``.

        Returns
        -------
        distances : ndarray of shape (n_queries, k), float64
            Euclidean distances, increasing along each row.
        indices : ndarray of shape (n_queries, k), int64
            Rows of the ``X`` given to :meth:`fit`.
        """
        lists = self.__dict__.get("_lists")
        if (type(X) is np.ndarray and type(k) is int and lists is not None and lists.centers is not None
                and not lists.sparse and X.ndim == 2 and X.shape[0] == 1 and X.shape[1] == self.n_features_in_
                and X.dtype.kind == "f" and X.dtype.itemsize in (4, 8) and X.flags.c_contiguous
                and 1 <= k <= self.n_samples_fit_ and (nprobe is None or type(nprobe) is int and
                                                       1 <= nprobe <= self.n_lists_)):
            return lists.search_row(X, k, self.nprobe_ if nprobe is None else nprobe)  # one row: no overhead
        X, k, nprobe = self._check_query(X, k, nprobe)
        n_threads = effective_n_threads(self.n_jobs) if X.shape[0] > 1 else 1
        if self._lists.centers is None:
            with numba_threads(n_threads):
                given = self._given(X)
        else:
            given = None
        return self._lists.search(X, k, nprobe, given, n_threads)

    def query_path(self, n_queries, k=1, nprobe=None):
        """Which search path :meth:`query` takes for a batch of ``n_queries`` rows (all give the same answers).

        ``"per-query"``: every query probed, bounded and re-ranked in turn
        (one query, small batches, CSR rows); ``"prefiltered"``: the queries
        grouped by probed list, every list bounded once for all its queries
        by a matrix product on the stored coordinates, the survivors
        re-ranked (dense rows, ``store="float32"``); ``"grouped"``: the same
        grouping with the approximate distances on all the features
        (``store="int8"``, ``k >= 8``). The choice depends only on the batch
        shape: ``n_queries * nprobe >= 8 * n_lists`` for the batch paths
        (see docs/decisions.md, 'Batch search paths').

        Parameters
        ----------
        n_queries : int
        k : int, default=1
        nprobe : int or None, default=None
            None: ``nprobe_``.

        Returns
        -------
        path : str

        Examples
        --------
        >>> import numpy as np
        >>> from qkm import ClusterIndex, KMeans
        >>> X = np.random.RandomState(0).normal(size=(400, 5))
        >>> index = ClusterIndex(KMeans(n_clusters=4, random_state=0).fit(X), nprobe=2, n_lists=8,
        ...                      random_state=0).fit(X)
        >>> index.query_path(1), index.query_path(1000)
        ('per-query', 'prefiltered')
        >>> index.describe()["batch_path"]
        {'path': 'prefiltered', 'from_queries': 32, 'k': 1}
        """
        check_is_fitted(self, "operator_")
        nprobe = self.nprobe_ if nprobe is None else self._check_nprobe(nprobe, self.n_lists_)
        if not is_int(n_queries) or n_queries < 0 or not is_int(k) or k < 1:
            raise ValueError(f"n_queries must be an integer >= 0 and k >= 1; got {n_queries!r}, {k!r}.")
        return self._lists.batch_path(int(n_queries), int(k), nprobe)

    def _batch_path_from(self):
        """Smallest batch taking a batch path at ``nprobe_`` (k = 1, or k = 8 for int8), and that path."""
        n = -(-BATCH_MIN_QUERIES_PER_LIST * self.n_lists_ // min(self.nprobe_, self.n_lists_))
        k = 1 if self._lists.store == "float32" else GROUPED_MIN_K
        path = self._lists.batch_path(n, k, self.nprobe_)
        return {"path": path, "from_queries": int(n), "k": k} if path != "per-query" else None

    def kneighbors(self, X, n_neighbors=1, return_distance=True):
        """scikit-learn style :meth:`query`: ``(distances, indices)`` or just ``indices``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_queries, n_features)
        n_neighbors : int, default=1
        return_distance : bool, default=True

        Returns
        -------
        distances : ndarray of shape (n_queries, n_neighbors)
            Only if ``return_distance``.
        indices : ndarray of shape (n_queries, n_neighbors)
        """
        distances, indices = self.query(X, k=n_neighbors)
        return (distances, indices) if return_distance else indices

    def predict(self, X):
        """Label of the (approximate) nearest indexed row: 1-NN classification.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_queries, n_features)

        Returns
        -------
        labels : ndarray of shape (n_queries,)
        """
        check_is_fitted(self, "operator_")
        if self.y_ is None:
            raise ValueError("predict needs the labels of the indexed rows: fit the index with y.")
        return self.y_[self.query(X, k=1)[1][:, 0]]

    def score(self, X, y):
        """Accuracy of :meth:`predict` on ``(X, y)``."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def describe(self):
        """Summary as a JSON-ready dict: partition, lists, the ``nprobe`` used and how it was chosen, memory.

        Returns
        -------
        info : dict
        """
        check_is_fitted(self, "operator_")
        lists = self._lists
        return {
            "partition": "model" if lists.centers is None else "own",
            "n_lists": self.n_lists_,
            "nprobe": int(self.nprobe_),
            "nprobe_param": self.nprobe if isinstance(self.nprobe, str) else int(self.nprobe),
            "calibration": dict(self.calibration_),
            "n_samples": self.n_samples_fit_,
            "n_features": self.n_features_in_,
            "sparse": bool(lists.sparse),
            "rows_dtype": str(lists.dtype),
            "store": lists.store,
            "coordinates": {"head": lists.head_dims, "total": lists.n_coords, "block": lists.block},
            "bytes": lists.nbytes(),
            "batch_path": self._batch_path_from(),
        }

    # -- serialization (the operator is stored separately) --------------- #
    def _export_state(self):
        """``(arrays, metadata)`` of the fitted index, without the operator (see :mod:`qkm.approximate._index_state`)."""
        check_is_fitted(self, "operator_")
        return export_state(self)

    @classmethod
    def _from_export_state(cls, operator, arrays, metadata):
        """A fitted :class:`ClusterIndex` from :meth:`_export_state` output and the model's operator.

        The result has ``estimator=None`` and answers ``query`` / ``predict``
        exactly as the exported index did.

        Raises
        ------
        ValueError
            When the arrays or metadata are inconsistent with each other or with ``operator``.
        """
        return import_state(cls, operator, arrays, metadata)
