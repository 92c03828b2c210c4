"""The training data as the kernels see it, and the centroid layouts they use.

:class:`KMeansData` wraps validated data (dense ndarray or CSR) with its row
norms and offers the three operations every algorithm is made of: assign rows
to their nearest centroid, compute chosen (point, centroid) partials, and
recompute the centroids from labels. Dense data go through BLAS in row blocks;
sparse data through one fused numba kernel per row chunk, against ``C^T`` kept
dense or in CSR, whichever the cost model says is cheaper.
"""

import numpy as np
import scipy.sparse as sp

from . import _config
from . import _kernels as K_
from ._empty import relocate_empty_clusters

_EMPTY_LB = np.zeros((0, 0), dtype=np.float64)


class CentroidLayouts:
    """Centroids ``C`` (K, D) plus the transposed layouts built on demand.

    Attributes
    ----------
    C : ndarray of shape (n_clusters, n_features)
    c_sq : ndarray of shape (n_clusters,), float64 squared norms.
    storage : {"dense", "sparse", None}
        Layout of ``C^T`` used by the last sparse-data assignment.
    """

    def __init__(self, C, c_sq=None):
        self.C = C
        self.c_sq = centroid_sq_norms(C) if c_sq is None else c_sq
        self._CT = None
        self._sparse_ct = None
        self.storage = None

    def dense_transpose(self, buffer=None):
        if self._CT is None:
            k, d = self.C.shape
            CT = buffer if buffer is not None and buffer.shape == (d, k) else np.empty((d, k), dtype=self.C.dtype)
            K_.transpose_into(self.C, CT)
            self._CT = CT
        return self._CT

    def sparse_transpose(self, col_nnz):
        if self._sparse_ct is None:
            ptr = np.zeros(self.C.shape[1] + 1, dtype=np.int64)
            np.cumsum(col_nnz, out=ptr[1:])
            idx = np.empty(ptr[-1], dtype=np.int32)
            val = np.empty(ptr[-1], dtype=self.C.dtype)
            K_.fill_sparse_transpose(self.C, ptr, idx, val)
            self._sparse_ct = (ptr, idx, val)
        return self._sparse_ct


def centroid_sq_norms(C):
    """Squared row norms of the centroids, float64.

    Computed with ``np.einsum`` exactly as scikit-learn's ``row_norms`` does,
    so that points at (rounding-level) equal distance from several centroids
    break the tie the same way scikit-learn does on float64 data.
    """
    if C.dtype == np.float64:
        return np.einsum("ij,ij->i", C, C)
    return np.einsum("ij,ij->i", C, C, dtype=np.float64)


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
        self._ct_buffer = None

    # ------------------------------------------------------------------ #
    def choose_storage(self, layouts):
        """Pick dense or CSR ``C^T`` for sparse data by estimated cost; returns the choice."""
        col_nnz = np.empty(self.n_features, dtype=np.int64)
        K_.column_nnz(layouts.C, col_nnz)
        k = layouts.C.shape[0]
        sparse_work = float(self.doc_freq @ col_nnz) * _config.SPARSE_CENTROID_COST_FACTOR
        dense_work = float(self.nnz) * k
        layouts.storage = "sparse" if sparse_work < dense_work else "dense"
        layouts.col_nnz = col_nnz
        return layouts.storage

    def assign(self, layouts, labels, partial_best, rows=None, lb=None):
        """Nearest centroid of ``rows`` (all rows by default).

        Writes ``labels[rows]`` and ``partial_best[rows]``; with ``lb`` also
        writes lower bounds of every distance into ``lb[rows]`` (for Elkan).
        """
        rows = self.all_rows if rows is None else rows
        write_lb = lb is not None
        lb = lb if write_lb else _EMPTY_LB
        if self.sparse:
            X = self.X
            if self.choose_storage(layouts) == "sparse":
                ptr, idx, val = layouts.sparse_transpose(layouts.col_nnz)
                CT = np.zeros((0, layouts.C.shape[0]), dtype=layouts.C.dtype)
                use_sparse = True
            else:
                if self._ct_buffer is None or self._ct_buffer.shape != layouts.C.shape[::-1]:
                    self._ct_buffer = np.empty(layouts.C.shape[::-1], dtype=layouts.C.dtype)
                CT = layouts.dense_transpose(self._ct_buffer)
                ptr = np.zeros(1, dtype=np.int64)
                idx = np.zeros(0, dtype=np.int32)
                val = np.zeros(0, dtype=layouts.C.dtype)
                use_sparse = False
            K_.assign_sparse(
                X.data, X.indices, X.indptr, self.x_sq, rows, CT, ptr, idx, val, use_sparse,
                layouts.c_sq, self.err_rel, labels, partial_best, lb, write_lb,
            )
        else:
            layouts.storage = "dense"
            block = _config.DENSE_BLOCK_ROWS
            whole = rows is self.all_rows
            CT = layouts.C.T
            for start in range(0, rows.shape[0], block):
                block_rows = rows[start:start + block]
                Xb = self.X[start:start + block] if whole else self.X[block_rows]
                G = Xb @ CT
                K_.assign_dense_block(G, block_rows, self.x_sq, layouts.c_sq, self.err_rel,
                                      labels, partial_best, lb, write_lb)

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

    def update(self, labels, C, own_sq_distances):
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
        counts = np.diff(offsets)
        has_empty = bool((counts == 0).any())
        C_new = C.copy() if has_empty else C
        shift_sq = np.empty(k, dtype=np.float64)
        if self.sparse:
            X = self.X
            K_.update_centers_sparse(X.data, X.indices, X.indptr, order, offsets, C_new, shift_sq)
        else:
            K_.update_centers_dense(self.X, order, offsets, C_new, shift_sq)
        c_sq = centroid_sq_norms(C_new)
        relocated = 0
        if has_empty:
            relocated = relocate_empty_clusters(self, labels, own_sq_distances(), counts, C_new, shift_sq, c_sq, C)
        return C_new, shift_sq, c_sq, relocated

    def row(self, i):
        """Row ``i`` as a dense float64 vector."""
        if self.sparse:
            return np.asarray(self.X[i].toarray()).ravel().astype(np.float64)
        return self.X[i].astype(np.float64)
