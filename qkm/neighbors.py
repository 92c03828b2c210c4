"""Approximate nearest-neighbour search through the centroid operator (an inverted-file index).

:class:`ClusterIndex` stores the training rows grouped by their nearest
centroid (one inverted list per cluster). A query is compared with the
centroids through the model's operator (for QK-means, the factor chain) and
searched exactly inside the ``nprobe`` nearest lists, which is the 1-NN
protocol of the QK-means paper (``nprobe=1``) and faiss' ``IndexIVFFlat``.
"""

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from ._base import check_export_header, is_int, operator_of
from ._index import (cluster_sq_distances, nearest_clusters, probe_lists, search_lists, select_neighbors,
                     stored_row_sq_norms)
from ._threads import effective_n_threads, numba_threads
from ._validation import check_data, check_feature_count

__all__ = ["ClusterIndex"]

#: Version of the state written by :meth:`ClusterIndex._export_state`.
_STATE_VERSION = 1


class ClusterIndex(BaseEstimator):
    """Inverted-file nearest-neighbour index on the clusters of a qkm model.

    ``fit`` assigns every training row to its nearest centroid and stores the
    rows list by list (with their labels ``y`` if given). ``query`` ranks the
    centroids for each query through the model's centroid operator
    (``operator.sq_distances``: a QK-means factor chain costs its nnz), then
    searches exactly inside the ``nprobe`` nearest lists with BLAS / sparse
    products, so ``nprobe = K`` is exact brute force.

    Parameters
    ----------
    estimator : fitted qkm estimator or loaded model
        Anything holding a :class:`qkm.operator.CentroidOperator` as
        ``operator_`` (a fitted :class:`qkm.KMeans`, :class:`qkm.QKMeans`,
        :class:`qkm.LowRankKMeans`) or ``operator`` (a model read by
        ``qkm.export.load_model``), or an operator itself. It is not refitted;
        an unfitted qkm estimator (for instance after
        :func:`sklearn.base.clone`) is cloned and fitted on ``X``.
    nprobe : int, default=1
        Lists searched per query, ``1 <= nprobe <= n_clusters``.
    n_jobs : int or None, default=None
        numba threads for the operator.

    Attributes
    ----------
    operator_ : qkm.operator.CentroidOperator
    n_features_in_ : int
    n_samples_fit_ : int
        Rows stored.
    labels_ : ndarray of shape (n_samples_fit_,), int64
        List (cluster) of each training row.
    list_sizes_ : ndarray of shape (n_clusters,), int64
        Rows per list.
    y_ : ndarray of shape (n_samples_fit_,) or None
        Training labels, for :meth:`predict`.

    Notes
    -----
    Lists are ranked by the squared distance of the query to their centroid
    (ties: lowest index); empty lists are never probed. If the ``nprobe``
    nearest lists hold fewer than ``k`` rows in total, the next nearest lists
    are probed too until they hold at least ``k``, so ``query`` always
    returns ``k`` neighbours. Candidates are ranked with
    ``||x||^2 - 2 x.y + ||y||^2``; the returned distances are recomputed
    exactly in float64 and sorted by (distance, index).

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import ClusterIndex, KMeans
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(300, 4))
    >>> y = (X[:, 0] > 0).astype(int)
    >>> index = ClusterIndex(KMeans(n_clusters=8, random_state=0).fit(X), nprobe=8).fit(X, y)
    >>> dist, ind = index.query(X[:3], k=2)
    >>> ind[:, 0].tolist(), dist[:, 0].tolist()   # every row is its own nearest neighbour
    ([0, 1, 2], [0.0, 0.0, 0.0])
    >>> bool(np.all(index.predict(X) == y))
    True
    """

    def __init__(self, estimator, nprobe=1, *, n_jobs=None):
        self.estimator = estimator
        self.nprobe = nprobe
        self.n_jobs = n_jobs

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
    def _check_nprobe(nprobe, n_clusters):
        if not is_int(nprobe) or not 1 <= nprobe <= n_clusters:
            raise ValueError(f"nprobe must be an integer in [1, n_clusters={n_clusters}]; got {nprobe!r}.")
        return int(nprobe)

    def fit(self, X, y=None):
        """Store the rows of ``X`` in the list of their nearest centroid.

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
        effective_n_threads(self.n_jobs)
        X = check_data(X)
        with numba_threads(effective_n_threads(self.n_jobs)):
            operator = self._resolve_operator(X)
            self._check_nprobe(self.nprobe, operator.n_clusters)
            check_feature_count(X, operator.n_features, estimator="the model's centroid operator")
            if y is not None:
                y = np.asarray(y)
                if y.ndim != 1 or y.shape[0] != X.shape[0]:
                    raise ValueError(f"y must be 1-D with one label per row of X ({X.shape[0]}); got shape {y.shape}.")
            labels = nearest_clusters(operator, X)
        K = operator.n_clusters
        row_ids = np.argsort(labels, kind="stable").astype(np.int64)
        sizes = np.bincount(labels, minlength=K).astype(np.int64)
        offsets = np.zeros(K + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        store = X[row_ids]
        if sp.issparse(store):
            store = sp.csr_matrix(store)
            store.sort_indices()
        else:
            store = np.ascontiguousarray(store)
        self._set_fitted(operator, store, offsets, row_ids, y)
        return self

    def _set_fitted(self, operator, store, offsets, row_ids, y):
        n = store.shape[0]
        sizes = np.diff(offsets)
        self.operator_ = operator
        self.n_features_in_ = int(store.shape[1])
        self.n_samples_fit_ = int(n)
        self.list_sizes_ = sizes
        labels = np.empty(n, dtype=np.int64)
        labels[row_ids] = np.repeat(np.arange(sizes.size), sizes)
        self.labels_ = labels
        self.y_ = y
        self._fit_X = store
        self._fit_sq = stored_row_sq_norms(store)
        self._offsets = offsets
        self._row_ids = row_ids

    # ------------------------------------------------------------------ #
    def _check_query(self, X, k, nprobe):
        check_is_fitted(self, "operator_")
        if not is_int(k) or k < 1:
            raise ValueError(f"k must be an integer >= 1; got {k!r}.")
        if k > self.n_samples_fit_:
            raise ValueError(f"k={k} is larger than the number of indexed rows ({self.n_samples_fit_}).")
        nprobe = self._check_nprobe(self.nprobe if nprobe is None else nprobe, self.operator_.n_clusters)
        X = check_data(X, dtype=self._fit_X.dtype)
        check_feature_count(X, self.n_features_in_, estimator=type(self).__name__)
        return X, int(k), nprobe

    def _probe(self, X, k, nprobe):
        """Lists probed for every row of validated ``X``: (n, p_max) int64, -1 padded."""
        with numba_threads(effective_n_threads(self.n_jobs)):
            sq = cluster_sq_distances(self.operator_, X)
        return probe_lists(sq, self.list_sizes_, nprobe, k)

    def query(self, X, k=1, nprobe=None):
        """The ``k`` nearest indexed rows of every query, searched in the ``nprobe`` nearest lists.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_queries, n_features)
        k : int, default=1
            Neighbours per query, at most ``n_samples_fit_``.
        nprobe : int or None, default=None
            Lists searched per query; None uses ``self.nprobe``.

        Returns
        -------
        distances : ndarray of shape (n_queries, k), float64
            Euclidean distances, increasing along each row.
        indices : ndarray of shape (n_queries, k), int64
            Rows of the ``X`` given to :meth:`fit`.
        """
        X, k, nprobe = self._check_query(X, k, nprobe)
        probe = self._probe(X, k, nprobe)
        xq_sq = stored_row_sq_norms(X)
        cand_sq, cand_pos = search_lists(X, xq_sq, probe, self._fit_X, self._fit_sq, self._offsets, k)
        return select_neighbors(X, xq_sq, cand_sq, cand_pos, self._fit_X, self._fit_sq, self._row_ids, k)

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

    # -- serialization (the operator is stored separately) --------------- #
    def _export_state(self):
        """``(arrays, metadata)`` of the fitted index, without the operator (see ``qkm.export``).

        Arrays: ``fit_X`` (dense rows, list by list) or ``fit_X_indptr`` /
        ``fit_X_indices`` / ``fit_X_data`` / ``fit_X_shape`` (CSR),
        ``list_offsets``, ``row_ids`` and ``y`` (numeric or boolean labels)
        or ``y_codes`` (string labels, with ``metadata["classes"]``).
        """
        check_is_fitted(self, "operator_")
        store = self._fit_X
        arrays = {"list_offsets": self._offsets.astype(np.int64), "row_ids": self._row_ids.astype(np.int64)}
        sparse = sp.issparse(store)
        if sparse:
            arrays.update(fit_X_indptr=store.indptr.astype(np.int64), fit_X_indices=store.indices.astype(np.int32),
                          fit_X_data=store.data, fit_X_shape=np.asarray(store.shape, dtype=np.int64))
        else:
            arrays["fit_X"] = store
        metadata = {
            "state_version": _STATE_VERSION,
            "nprobe": int(self.nprobe),
            "n_samples": int(self.n_samples_fit_),
            "n_features": int(self.n_features_in_),
            "n_clusters": int(self.operator_.n_clusters),
            "sparse": bool(sparse),
            "dtype": str(store.dtype),
            "y": "none",
        }
        y = self.y_
        if y is not None:
            if y.dtype.kind in "biuf":
                arrays["y"] = y
                metadata["y"] = "values"
            elif y.dtype.kind in "USO" and all(isinstance(v, str) for v in y.tolist()):
                classes, codes = np.unique(y.astype(str), return_inverse=True)
                arrays["y_codes"] = codes.astype(np.int64)
                metadata["y"] = "codes"
                metadata["classes"] = [str(c) for c in classes]
            else:
                raise TypeError(f"labels of dtype {y.dtype} cannot be exported: use numbers or strings.")
        return arrays, metadata

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
        K, D = check_export_header("ClusterIndex", operator, metadata, _STATE_VERSION)

        def get(name):
            if name not in arrays:
                raise ValueError(f"ClusterIndex state: array {name!r} is missing.")
            return np.asarray(arrays[name])

        def int_vector(name, length=None):
            a = get(name)
            if a.ndim != 1 or a.dtype.kind not in "iu" or (length is not None and a.shape[0] != length):
                want = f" of length {length}" if length is not None else ""
                raise ValueError(f"ClusterIndex state: {name!r} must be a 1-D integer array{want}; "
                                 f"got {a.dtype} {a.shape}.")
            return a.astype(np.int64)

        if metadata.get("sparse", False):
            shape = int_vector("fit_X_shape", 2)
            indptr = int_vector("fit_X_indptr")
            indices = int_vector("fit_X_indices")
            data = get("fit_X_data")
            n_rows = int(shape[0])
            if n_rows < 1 or shape[1] != D or indptr.shape[0] != n_rows + 1 or data.ndim != 1:
                raise ValueError(f"ClusterIndex state: CSR shape {tuple(shape)} / indptr {indptr.shape} do not "
                                 f"match {D} features.")
            if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0] or \
                    indices.shape[0] != data.shape[0]:
                raise ValueError("ClusterIndex state: malformed CSR arrays (indptr / indices / data).")
            if indices.size and (indices.min() < 0 or indices.max() >= D):
                raise ValueError(f"ClusterIndex state: CSR column indices outside [0, {D}).")
            if data.dtype.kind != "f":
                raise ValueError(f"ClusterIndex state: CSR data must be float; got {data.dtype}.")
            store = sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(n_rows, D))
        else:
            store = get("fit_X")
            if store.ndim != 2 or store.dtype.kind != "f" or store.shape[0] < 1 or store.shape[1] != D:
                raise ValueError(f"ClusterIndex state: 'fit_X' must be a non-empty float (n, {D}) array; "
                                 f"got {store.dtype} {store.shape}.")
        store = check_data(store, dtype=store.dtype, what="ClusterIndex state: indexed rows")
        n = store.shape[0]
        if metadata.get("n_samples", n) != n:
            raise ValueError(f"ClusterIndex state: n_samples={metadata.get('n_samples')!r} but {n} rows are stored.")
        offsets = int_vector("list_offsets", K + 1)
        if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
            raise ValueError(f"ClusterIndex state: 'list_offsets' must rise from 0 to {n} in {K + 1} steps.")
        row_ids = int_vector("row_ids", n)
        if np.any(row_ids < 0) or np.any(row_ids >= n) or np.any(np.bincount(row_ids, minlength=n) != 1):
            raise ValueError(f"ClusterIndex state: 'row_ids' must be a permutation of 0..{n - 1}.")
        kind = metadata.get("y", "none")
        if kind == "none":
            y = None
        elif kind == "values":
            y = get("y")
            if y.ndim != 1 or y.shape[0] != n or y.dtype.kind not in "biuf":
                raise ValueError(f"ClusterIndex state: 'y' must be a 1-D numeric array of length {n}.")
        elif kind == "codes":
            classes = metadata.get("classes")
            codes = int_vector("y_codes", n)
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) or not classes:
                raise ValueError("ClusterIndex state: string labels need metadata 'classes' (a list of str).")
            if codes.min() < 0 or codes.max() >= len(classes):
                raise ValueError(f"ClusterIndex state: 'y_codes' outside [0, {len(classes)}).")
            y = np.asarray(classes)[codes]
        else:
            raise ValueError(f"ClusterIndex state: unknown label kind {kind!r}.")
        nprobe = metadata.get("nprobe", 1)
        if not isinstance(nprobe, numbers.Integral) or isinstance(nprobe, bool) or not 1 <= nprobe <= K:
            raise ValueError(f"ClusterIndex state: nprobe={nprobe!r} outside [1, {K}].")
        obj = cls(None, nprobe=int(nprobe))
        obj._set_fitted(operator, store, offsets, row_ids, y)
        return obj
