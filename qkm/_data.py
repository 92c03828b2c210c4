"""The training data as the kernels see it.

:class:`KMeansData` wraps validated data (dense ndarray or CSR) with its row
norms and offers the three operations every algorithm is made of: assign rows
to their nearest centroid (through a :class:`qkm.operator.CentroidOperator`),
compute chosen (point, centroid) partials, and recompute the centroids from
labels. The operator runs the assignment (its ``assign_rows``): with a
:class:`~qkm.operator.DenseOperator`, dense data go through BLAS in row blocks
and sparse data through one fused numba kernel per row chunk, against ``C^T``
kept dense or in CSR, whichever was measured faster (:class:`StorageChooser`,
one per data set); any other operator (a sparse factor chain) computes its own
partials. This module imports no operator.
"""

import numpy as np
import scipy.sparse as sp

from . import _config
from . import _kernels as K_
from ._kernels import centroid_sq_norms
from ._empty import relocate_empty_clusters

class StorageChooser:
    """Chooses the layout of C^T for sparse data by measured wall-clock time.

    Work is counted in multiply-adds: ``nnz(X) * K`` with dense C^T,
    ``sum_k df(k) * nnz(C^T_k)`` with CSR C^T. Each pass records its seconds
    per unit of work; once both layouts have been timed, the one with the
    lower predicted time wins. Until then the prior cost factor of
    :mod:`qkm._config` predicts, and the untimed layout is tried once as soon
    as it is predicted to be at most ``explore`` times slower. Both layouts
    give bit-identical results, so the choice only changes the speed.
    """

    def __init__(self, explore=2.0):
        self.explore = explore
        self.seconds_per_unit = {"dense": None, "sparse": None}

    def choose(self, dense_work, sparse_work):
        cost = self.seconds_per_unit
        if cost["dense"] is not None and cost["sparse"] is not None:
            return "sparse" if sparse_work * cost["sparse"] < dense_work * cost["dense"] else "dense"
        prior = {"dense": float(dense_work), "sparse": float(sparse_work) * _config.SPARSE_CENTROID_COST_FACTOR}
        best = min(prior, key=prior.get)
        other = "sparse" if best == "dense" else "dense"
        if cost[other] is None and cost[best] is not None and prior[other] <= self.explore * prior[best]:
            return other
        return best

    def record(self, storage, work, seconds):
        if work > 0 and seconds > 0:
            self.seconds_per_unit[storage] = seconds / work


class KMeansData:
    """Validated data plus the per-row quantities every iteration needs.

    Parameters
    ----------
    X : ndarray or scipy.sparse.csr_matrix
        Output of :func:`qkm._validation.check_data`.
    """

    def __init__(self, X):
        self.X = X
        self.sparse = sp.issparse(X)
        self.n_samples, self.n_features = X.shape
        self.dtype = X.dtype
        self.x_sq = np.empty(self.n_samples, dtype=np.float64)
        if self.sparse:
            K_.row_sq_norms_sparse(X.data, X.indptr, self.x_sq)
            self.doc_freq = np.bincount(X.indices, minlength=self.n_features).astype(np.float64)
            self.nnz = X.nnz
            # partials are accumulated in float64 from exact products
            self.err_rel = 1e-12
        else:
            K_.row_sq_norms_dense(X, self.x_sq)
            self.nnz = self.n_samples * self.n_features
            # BLAS computes the dots in the data's precision
            self.err_rel = 1e-12 if self.dtype == np.float64 else 64 * float(np.finfo(np.float32).eps)
        self.all_rows = np.arange(self.n_samples, dtype=np.int64)
        self.storage_chooser = StorageChooser()
        self._ct_buffer = None

    def column_mean(self):
        """The mean row in float64, summed in row order: bit-identical for dense and CSR data."""
        out = np.empty(self.n_features, dtype=np.float64)
        if self.sparse:
            K_.column_sums_sparse(self.X.data, self.X.indices, self.X.indptr, out)
        else:
            K_.column_sums_dense(self.X, out)
        out /= max(self.n_samples, 1)
        return out

    # ------------------------------------------------------------------ #
    def assign(self, layouts, labels, partial_best, rows=None, lb=None):
        """Nearest centroid of ``rows`` (all rows by default): the one entry point of assignment.

        Parameters
        ----------
        layouts : CentroidOperator
            IN  the centroids; its ``assign_rows`` runs the kernels (a
            :class:`~qkm.operator.DenseOperator` records the layout of C^T it
            used in ``layouts.storage``; any other operator computes its own
            partials).
        labels : ndarray of shape (n_samples,), int32
            OUT written at ``rows``.
        partial_best : ndarray of shape (n_samples,), float64
            OUT best partial ``||c||^2 - 2 x.c``, written at ``rows``.
        rows : ndarray of int64, default=None
        lb : ndarray of shape (n_samples, n_clusters), default=None
            OUT lower bounds of every distance at ``rows`` (Elkan; dense operator only).
        """
        rows = self.all_rows if rows is None else rows
        layouts.assign_rows(self, rows, labels, partial_best, lb)

    def ct_buffer(self, shape, dtype):
        """A reusable (D, K) buffer for a dense C^T (one per data set)."""
        if self._ct_buffer is None or self._ct_buffer.shape != shape or self._ct_buffer.dtype != dtype:
            self._ct_buffer = np.empty(shape, dtype=dtype)
        return self._ct_buffer

    def pair_partials(self, layouts, pair_i, pair_j):
        """Partials ``||c_j||^2 - 2 x_i.c_j`` for the given pairs."""
        out = np.empty(pair_i.shape[0], dtype=np.float64)
        if self.sparse:
            X = self.X
            K_.pair_partials_sparse(X.data, X.indices, X.indptr, layouts.C, layouts.c_sq, pair_i, pair_j, out)
        else:
            K_.pair_partials_dense(self.X, layouts.C, layouts.c_sq, pair_i, pair_j, out)
        return out

    def sq_distances(self, partial_best, rows=None):
        """Squared distances (clipped at 0) from partials."""
        rows = self.all_rows if rows is None else rows
        out = np.zeros(self.n_samples, dtype=np.float64)
        K_.sq_distances_from_partials(partial_best, rows, self.x_sq, out)
        return out

    def update(self, labels, C, own_sq_distances, labels_old=None, counts=None, repair=True):
        """Cluster means of the rows by label, with empty clusters repaired.

        Parameters
        ----------
        labels : ndarray of shape (n_samples,)
            IN  current assignment.
        C : ndarray of shape (n_clusters, n_features)
            IN/OUT the centres the labels refer to. Updated in place unless a
            cluster is empty, in which case a new array is returned and ``C``
            is left as it was (the repair needs the old centres).
        own_sq_distances : callable
            Returns the squared distance of every point to its centre in ``C``;
            called only when a cluster is empty.
        labels_old : ndarray of shape (n_samples,), default=None
            The labels ``C`` is the mean of. Clusters that kept exactly their
            members keep their centre (bit-identical to recomputing it); None
            recomputes every cluster.
        counts : ndarray of shape (n_clusters,), int64, default=None
            OUT cluster sizes after any empty-cluster repair (moved points
            are counted in their new cluster), in cluster-id order.
        repair : bool, default=True
            Repair empty clusters; False leaves them empty (count 0, centre
            unchanged).

        Returns
        -------
        C_new : ndarray of shape (n_clusters, n_features)
        shift_sq : ndarray of shape (n_clusters,), squared centre moves
        c_sq : ndarray of shape (n_clusters,), squared norms of the new centres
        n_relocated : int
        """
        k = C.shape[0]
        order = np.empty(self.n_samples, dtype=np.int64)
        offsets = np.empty(k + 1, dtype=np.int64)
        K_.group_by_label(labels, k, order, offsets)
        counts_ = np.diff(offsets)
        has_empty = bool((counts_ == 0).any())
        C_new = C.copy() if has_empty else C
        changed = np.ones(k, dtype=np.bool_)
        if labels_old is not None and not has_empty:
            moved = labels != labels_old
            changed[:] = False
            changed[labels[moved]] = True
            changed[labels_old[moved]] = True
        shift_sq = np.empty(k, dtype=np.float64)
        if self.sparse:
            X = self.X
            K_.update_centers_sparse(X.data, X.indices, X.indptr, order, offsets, changed, C_new, shift_sq)
        else:
            K_.update_centers_dense(self.X, order, offsets, changed, C_new, shift_sq)
        c_sq = centroid_sq_norms(C_new)
        relocated = 0
        if has_empty and repair:
            relocated = relocate_empty_clusters(self, labels, own_sq_distances(), counts_, C_new, shift_sq, c_sq, C)
        if counts is not None:
            counts[:] = counts_
        return C_new, shift_sq, c_sq, relocated

    def row(self, i):
        """Row ``i`` as a dense float64 vector."""
        if self.sparse:
            return np.asarray(self.X[i].toarray()).ravel().astype(np.float64)
        return self.X[i].astype(np.float64)
