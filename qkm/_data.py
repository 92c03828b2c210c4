"""The training data as the kernels see it.

:class:`KMeansData` wraps validated data (dense ndarray or CSR) with its row
norms and offers the three operations every algorithm is made of: assign rows
to their nearest centroid (through a :class:`qkm.operator.CentroidOperator`),
compute chosen (point, centroid) partials, and recompute the centroids from
labels. With a :class:`~qkm.operator.DenseOperator`, dense data go through
BLAS in row blocks and sparse data through one fused numba kernel per row
chunk, against ``C^T`` kept dense or in CSR, whichever was measured faster.
Any other operator (a sparse factor chain) computes its own partials.
"""

import time

import numpy as np
import scipy.sparse as sp

from . import _config
from . import _kernels as K_
from . import _reduce
from ._kernels import centroid_sq_norms
from ._empty import relocate_empty_clusters
from .operator import DenseOperator

_EMPTY_LB = np.zeros((0, 0), dtype=np.float64)
_NO_SPARSE_CT = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32))


def _n_compiled():
    """Compiled specialisations of the fused assignment kernel."""
    return len(K_.assign_sparse.signatures)


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
            self.err_rel = 1e-12 if self.dtype == np.float64 else 64 * float(np.finfo(np.float32).eps)
        self.all_rows = np.arange(self.n_samples, dtype=np.int64)
        self.storage_chooser = StorageChooser()
        self._ct_buffer = None

    # ------------------------------------------------------------------ #
    def assign(self, layouts, labels, partial_best, rows=None, lb=None):
        """Nearest centroid of ``rows`` (all rows by default): the one entry point of assignment.

        Parameters
        ----------
        layouts : CentroidOperator
            IN  the centroids. A :class:`~qkm.operator.DenseOperator` runs the
            kernels below and records the layout of C^T it used in
            ``layouts.storage``; any other operator computes its own partials.
        labels : ndarray of shape (n_samples,), int32
            OUT written at ``rows``.
        partial_best : ndarray of shape (n_samples,), float64
            OUT best partial ``||c||^2 - 2 x.c``, written at ``rows``.
        rows : ndarray of int64, default=None
        lb : ndarray of shape (n_samples, n_clusters), default=None
            OUT lower bounds of every distance at ``rows`` (Elkan; dense operator only).
        """
        rows = self.all_rows if rows is None else rows
        write_lb = lb is not None
        if not isinstance(layouts, DenseOperator):
            if write_lb:
                raise ValueError("distance lower bounds need a DenseOperator")
            self._assign_with_operator(layouts, rows, labels, partial_best)
            return
        lb = lb if write_lb else _EMPTY_LB
        if self.sparse:
            self._assign_sparse(layouts, rows, labels, partial_best, lb, write_lb)
            return
        layouts.storage = "dense"
        block = _config.DENSE_BLOCK_ROWS
        whole = rows is self.all_rows
        CT = layouts.C.T
        for start in range(0, rows.shape[0], block):
            block_rows = rows[start:start + block]
            Xb = self.X[start:start + block] if whole else self.X[block_rows]
            K_.assign_dense_block(Xb @ CT, block_rows, self.x_sq, layouts.c_sq, self.err_rel,
                                  labels, partial_best, lb, write_lb)

    def _assign_with_operator(self, operator, rows, labels, partial_best):
        if rows is self.all_rows:
            operator.partials(self.X, labels, partial_best)
            return
        sub_labels = np.empty(rows.shape[0], dtype=np.int32)
        sub_partial = np.empty(rows.shape[0], dtype=np.float64)
        operator.partials(self.X[rows], sub_labels, sub_partial)
        labels[rows] = sub_labels
        partial_best[rows] = sub_partial

    def _assign_sparse(self, layouts, rows, labels, partial_best, lb, write_lb):
        k = layouts.C.shape[0]
        fraction = rows.shape[0] / max(self.n_samples, 1)
        dense_work = self.nnz * k * fraction
        sparse_work = float(self.doc_freq @ layouts.column_nnz()) * fraction
        storage = self.storage_chooser.choose(dense_work, sparse_work)
        if storage == "sparse":
            ptr, idx, val = layouts.sparse_transpose()
            CT = np.zeros((0, k), dtype=layouts.C.dtype)
        else:
            if self._ct_buffer is None or self._ct_buffer.shape != layouts.C.shape[::-1]:
                self._ct_buffer = np.empty(layouts.C.shape[::-1], dtype=layouts.C.dtype)
            CT = layouts.dense_transpose(self._ct_buffer)
            ptr, idx, val = _NO_SPARSE_CT[0], _NO_SPARSE_CT[1], np.zeros(0, dtype=layouts.C.dtype)
        X = self.X
        compiled_before = _n_compiled()
        t0 = time.perf_counter()  # the kernel only: building a layout is a one-off per centroid set
        K_.assign_sparse(
            X.data, X.indices, X.indptr, self.x_sq, rows, CT, ptr, idx, val, storage == "sparse",
            layouts.c_sq, self.err_rel, labels, partial_best, lb, write_lb,
        )
        if _n_compiled() == compiled_before:  # a pass that compiled a kernel says nothing about speed
            self.storage_chooser.record(storage, dense_work if storage == "dense" else sparse_work,
                                        time.perf_counter() - t0)
        layouts.storage = storage

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

    def update(self, labels, C, own_sq_distances, labels_old=None, counts=None):
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
        if has_empty:
            relocated = relocate_empty_clusters(self, labels, own_sq_distances(), counts_, C_new, shift_sq, c_sq, C)
        if counts is not None:
            counts[:] = counts_
        return C_new, shift_sq, c_sq, relocated

    def row(self, i):
        """Row ``i`` as a dense float64 vector."""
        if self.sparse:
            return np.asarray(self.X[i].toarray()).ravel().astype(np.float64)
        return self.X[i].astype(np.float64)
