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

import copy
import time

import numpy as np
import scipy.sparse as sp

from . import _config
from . import _kernels as K_
from . import _reduce
from ._kernels import centroid_sq_norms
from ._empty import relocate_empty_clusters, relocate_empty_clusters_csr, replace_rows

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



def csr_means(sums, counts, C_prev, dtype):
    """Cluster means from CSR cluster sums, each rounded to ``dtype`` (kept float64), as :meth:`KMeansData.update`
    stores them; an empty cluster keeps its row of ``C_prev`` (CSR). ``sums`` is not modified.

    One function for the in-memory CSR update and the driver of a fit over
    shards (whose sums are combined in the same fixed order): the same bits.
    """
    sums = sp.csr_matrix(sums)
    inv = 1.0 / np.maximum(counts, 1)
    data = (sums.data * np.repeat(inv, np.diff(sums.indptr))).astype(dtype).astype(np.float64)
    means = sp.csr_matrix((data, sums.indices, sums.indptr), shape=sums.shape)
    return replace_rows(means, {int(j): C_prev[j] for j in np.flatnonzero(counts == 0)})

def dense_err_rel(dtype):
    """Relative error of BLAS dot products in ``dtype`` that the assignment's tie rule allows for."""
    return 1e-12 if dtype == np.float64 else 64 * float(np.finfo(np.float32).eps)


class KMeansData:
    """Validated data plus the per-row quantities every iteration needs.

    Parameters
    ----------
    X : ndarray or scipy.sparse.csr_matrix
        Output of :func:`qkm._validation.check_data`.
    row0 : int, default=0
        Global index of the first row (a shard of a larger data set).
    block_rows : int, default=None
        Block size of the summation order (:mod:`qkm._reduce`);
        ``None``: ``_config.REDUCE_BLOCK_ROWS``.
    """

    def __init__(self, X, row0=0, block_rows=None):
        self.X = X
        self.row0 = int(row0)
        self.block_rows = _config.REDUCE_BLOCK_ROWS if block_rows is None else int(block_rows)
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
            self.err_rel = dense_err_rel(self.dtype)
        self.all_rows = np.arange(self.n_samples, dtype=np.int64)
        self.storage_chooser = StorageChooser()
        self._ct_buffer = None

    def column_mean(self):
        """The mean row in float64, summed in the block-tree order of :mod:`qkm._reduce` (dense and CSR: same bits)."""
        n_lev = _reduce.n_levels(self.n_samples, self.block_rows, self.row0)
        return _reduce.column_sums_node(self.X, self.row0, self.block_rows, n_lev) / max(self.n_samples, 1)

    def for_run(self):
        """The same data for one of several concurrent runs: shared arrays and timings, own C^T buffer."""
        clone = copy.copy(self)
        clone._ct_buffer = None
        return clone

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

    def total(self, values):
        """Sum of one value per row, in the fixed block-tree order (:mod:`qkm._reduce`)."""
        return _reduce.tree_sum_rows(values, self.row0, self.block_rows)

    def cluster_sums(self, labels, n_clusters, store=None, changed=None):
        """Per-cluster sums of the rows in the block-tree order.

        Parameters
        ----------
        labels : ndarray of shape (n_samples,)
        n_clusters : int
        store : tuple (C, shift_sq), default=None
            IN/OUT  when given, ``C[j]`` becomes the mean of cluster ``j`` (for
            the non-empty clusters flagged in ``changed``) and ``shift_sq[j]``
            its squared move; nothing is returned but the counts.
        changed : ndarray of shape (n_clusters,), bool, default=None
            Clusters to compute (all by default).

        Returns
        -------
        counts : ndarray of shape (n_clusters,), int64
        sums : (n_clusters, n_features) float64 array (dense data) or CSR matrix (sparse data: the
            touched entries only), or None with ``store``
        """
        order = np.empty(self.n_samples, dtype=np.int64)
        offsets = np.empty(n_clusters + 1, dtype=np.int64)
        K_.group_by_label(labels, n_clusters, order, offsets)
        counts = np.diff(offsets)
        changed = np.ones(n_clusters, dtype=np.bool_) if changed is None else changed
        n_lev = _reduce.n_levels(self.n_samples, self.block_rows, self.row0)
        head = (order, offsets, changed, self.row0, self.block_rows, n_lev, _reduce.n_tasks_for(n_clusters),
                store is not None)
        if store is not None:
            C, shift_sq = store
        else:
            C, shift_sq = np.zeros((0, self.n_features), dtype=self.dtype), np.zeros(0)
        if not self.sparse:
            sums = np.zeros((n_clusters if store is None else 0, self.n_features))
            _reduce.cluster_sums_dense(self.X, *head, C, shift_sq, sums)
            return counts, (None if store is not None else sums)
        X = self.X
        if store is not None:
            cap_ptr, out_idx, out_val, out_cnt = (np.zeros(n_clusters + 1, dtype=np.int64), np.zeros(0, np.int32),
                                                  np.zeros(0), np.zeros(n_clusters, dtype=np.int64))
        else:
            room = np.bincount(labels, weights=np.diff(X.indptr), minlength=n_clusters).astype(np.int64)
            cap_ptr = np.zeros(n_clusters + 1, dtype=np.int64)
            np.cumsum(np.minimum(room, self.n_features), out=cap_ptr[1:])
            out_idx, out_val = np.empty(cap_ptr[-1], dtype=np.int32), np.empty(cap_ptr[-1])
            out_cnt = np.zeros(n_clusters, dtype=np.int64)
        _reduce.cluster_sums_sparse(X.data, X.indices, X.indptr, *head, C, shift_sq, cap_ptr, out_idx, out_val,
                                    out_cnt)
        if store is not None:
            return counts, None
        indptr = np.zeros(n_clusters + 1, dtype=np.int64)
        np.cumsum(out_cnt, out=indptr[1:])
        take = np.repeat(cap_ptr[:-1] - indptr[:-1], out_cnt) + np.arange(indptr[-1])
        return counts, sp.csr_matrix((out_val[take], out_idx[take], indptr), shape=(n_clusters, self.n_features))

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
        counts_ = np.bincount(labels, minlength=k).astype(np.int64)
        has_empty = bool((counts_ == 0).any())
        C_new = C.copy() if has_empty else C
        changed = np.ones(k, dtype=np.bool_)
        if labels_old is not None and not has_empty:
            moved = labels != labels_old
            changed[:] = False
            changed[labels[moved]] = True
            changed[labels_old[moved]] = True
        shift_sq = np.empty(k, dtype=np.float64)
        self.cluster_sums(labels, k, store=(C_new, shift_sq), changed=changed)
        c_sq = centroid_sq_norms(C_new)
        relocated = 0
        if has_empty and repair:
            relocated = relocate_empty_clusters(self, labels, own_sq_distances(), counts_, C_new, shift_sq, c_sq, C)
        if counts is not None:
            counts[:] = counts_
        return C_new, shift_sq, c_sq, relocated

    def update_csr(self, labels, C, own_sq_distances, counts=None, repair=True):
        """:meth:`update` keeping the means as CSR (sparse data; wide sparse data never hold a ``K x D`` buffer).

        The sums come from the sparse rows (:meth:`cluster_sums`: the touched
        entries only, the block-tree order), each mean is rounded to the data's
        precision as :meth:`update` stores it, so the values are those of
        :meth:`update` (the same bits); empty clusters keep their row of ``C``
        or, with ``repair``, are repaired as there
        (:func:`qkm._empty.relocate_empty_clusters_csr`).

        Parameters
        ----------
        labels : ndarray of shape (n_samples,)
            IN  current assignment.
        C : scipy.sparse.csr_matrix of shape (n_clusters, n_features), float64
            IN  the previous means (rows of empty clusters are kept from it); not modified.
        own_sq_distances : callable
            As in :meth:`update`; called only when a cluster is empty.
        counts : ndarray of shape (n_clusters,), int64, default=None
            OUT cluster sizes after the repair.
        repair : bool, default=True

        Returns
        -------
        C_new : scipy.sparse.csr_matrix of shape (n_clusters, n_features), float64, sorted indices
        n_relocated : int
        """
        counts_, sums = self.cluster_sums(labels, C.shape[0])
        C_new = csr_means(sums, counts_, C, self.dtype)
        relocated = 0
        if (counts_ == 0).any() and repair:
            C_new, relocated = relocate_empty_clusters_csr(self, labels, own_sq_distances(), counts_, C_new)
        if counts is not None:
            counts[:] = counts_
        return C_new, relocated

    def row(self, i):
        """Row ``i`` as a dense float64 vector."""
        if self.sparse:
            return np.asarray(self.X[i].toarray()).ravel().astype(np.float64)
        return self.X[i].astype(np.float64)
