"""The centroid operator interface and the dense operator (private; public in :mod:`qkm.operator`).

Everything that uses a fitted model (assignment, Lloyd and Elkan, Nyström,
the index, export, serving) imports this module; it imports only the data
view (:mod:`qkm._data`) and the kernels, so no import circle can form.
"""

import math
import time

import numpy as np
import scipy.sparse as sp

from .. import _config
from .. import _kernels as K_
from .._data import KMeansData, dense_err_rel
from .._kernels import centroid_sq_norms
from .._validation import row_norm_bound

__all__ = ["CentroidOperator", "DenseOperator", "SMALL_BATCH_ROWS"]

#: Largest batch :meth:`CentroidOperator.labels_small` takes (the serial per-sample kernels' range).
SMALL_BATCH_ROWS = 16

_EMPTY_LB = np.zeros((0, 0), dtype=np.float64)
_NO_SPARSE_CT = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32))


def _n_compiled():
    """Compiled specialisations of the fused assignment kernel."""
    return len(K_.assign_sparse.signatures)


class CentroidOperator:
    """Interface of a centroid matrix ``V`` of shape ``(n_clusters, n_features)``.

    Subclasses implement :meth:`apply`, :meth:`to_dense`, :meth:`partials`,
    ``nnz`` and ``execution_path``; everything else is derived here.

    Attributes
    ----------
    n_clusters : int
    n_features : int
    dtype : numpy dtype of the stored values (float32 or float64).
    c_sq : ndarray of shape (n_clusters,)
        Squared row norms ``||v_k||^2`` in float64.
    mean : ndarray of shape (n_features,) or None
        A vector stored beside the structured part and added to every centroid
        (``V = mean + W``; a model fitted on centred data keeps the data mean
        here), or None. Everything above describes the full ``V``.
    """

    n_clusters: int
    n_features: int
    dtype: np.dtype
    c_sq: np.ndarray
    mean = None

    # -- to implement ------------------------------------------------------ #
    def apply(self, X):
        """``X @ V.T`` for a dense or CSR batch ``X`` of shape (n, n_features); returns (n, n_clusters)."""
        raise NotImplementedError

    def to_dense(self):
        """``V`` as a dense (n_clusters, n_features) array of ``dtype``."""
        raise NotImplementedError

    def partials(self, X, labels, partial_best):
        """Nearest centroid of every row of validated ``X`` (dense C-contiguous or CSR, ``dtype``).

        Writes ``labels[i] = argmin_k (||v_k||^2 - 2 x_i.v_k)`` (lowest index on
        ties) into ``labels`` (OUT, int32) and the minimum into ``partial_best``
        (OUT, float64).
        """
        raise NotImplementedError

    @property
    def nnz(self):
        """Stored values of the structured part (the factors; the mean is counted by :attr:`mean_nnz`)."""
        raise NotImplementedError

    def execution_path(self, n_samples):
        """Name of the code path used for a batch of ``n_samples`` rows."""
        raise NotImplementedError

    # -- derived ----------------------------------------------------------- #
    @property
    def shape(self):
        return (self.n_clusters, self.n_features)

    def row_sq_norms(self):
        """``||v_k||^2`` for every centroid, float64."""
        return self.c_sq

    @property
    def flops(self):
        """Floating-point operations to assign one vector: ``2 * nnz`` (the paper's count; the mean needs none)."""
        return 2 * self.nnz

    @property
    def mean_nnz(self):
        """Nonzeros of the mean (0 without one): its stored values, and half its flops for a distance."""
        return 0 if self.mean is None else int(np.count_nonzero(self.mean))

    @property
    def compression(self):
        """``n_clusters * n_features / nnz``: how many times smaller than the dense matrix."""
        return self.n_clusters * self.n_features / max(self.nnz, 1)

    def assign_rows(self, data, rows, labels, partial_best, lb=None):
        """Nearest centroid of ``data.X[rows]`` (see :meth:`qkm._data.KMeansData.assign`).

        ``labels`` and ``partial_best`` (OUT) are written at ``rows``. Distance
        lower bounds ``lb`` are only available from a :class:`DenseOperator`.
        """
        if lb is not None:
            raise ValueError("distance lower bounds need a DenseOperator")
        if rows is data.all_rows:
            self.partials(data.X, labels, partial_best)
            return
        sub_labels = np.empty(rows.shape[0], dtype=np.int32)
        sub_partial = np.empty(rows.shape[0], dtype=np.float64)
        self.partials(data.X[rows], sub_labels, sub_partial)
        labels[rows] = sub_labels
        partial_best[rows] = sub_partial

    def norm_bound(self, dtype):
        """Largest row norm of ``dtype`` data whose distances to these centroids stay finite (cached).

        See :func:`qkm._validation.row_norm_bound`.
        """
        cache = self.__dict__.get("_norm_bounds")
        if cache is None:
            cache = self._norm_bounds = {}
        bound = cache.get(dtype)
        if bound is None:
            bound = cache[dtype] = row_norm_bound(np.dtype(dtype), self.row_sq_norms())
        return bound

    def labels_small(self, X):
        """Labels of a small validated-shape dense batch, or None when ``X`` needs the full checks.

        The prediction fast path (no data view, no thread-count switch): ``X``
        a C-contiguous ndarray of this operator's dtype and width with at most
        :data:`SMALL_BATCH_ROWS` rows; its values are checked finite and within
        :meth:`norm_bound` in one serial pass (the common case of
        :func:`qkm._validation.check_row_norms`). Anything else returns None,
        and the caller takes the checked path, which raises the same errors as
        before. The labels equal :meth:`assign`'s (the same ``partials``).
        """
        if (type(X) is not np.ndarray or X.ndim != 2 or X.dtype != self.dtype or not X.flags.c_contiguous
                or not 0 < X.shape[0] <= SMALL_BATCH_ROWS or X.shape[1] != self.n_features):
            return None
        if not K_.max_abs_or_inf(X) * math.sqrt(X.shape[1]) <= self.norm_bound(X.dtype):
            return None
        labels = np.empty(X.shape[0], dtype=np.int32)
        self._small_partials(X, labels, np.empty(X.shape[0], dtype=np.float64))
        return labels

    def _small_partials(self, X, labels, partial_best):
        """:meth:`partials` for a batch :meth:`labels_small` checked (subclasses skip their own checks)."""
        self.partials(X, labels, partial_best)

    def assign(self, X):
        """Labels and squared distances to the nearest centroid.

        Parameters
        ----------
        X : {ndarray, scipy.sparse CSR} of shape (n_samples, n_features)
            Already validated (see :func:`qkm._validation.check_data`).

        Returns
        -------
        labels : ndarray of shape (n_samples,), int32
        sq_distances : ndarray of shape (n_samples,), float64
        """
        data = KMeansData(X)
        labels = np.empty(data.n_samples, dtype=np.int32)
        partial = np.empty(data.n_samples, dtype=np.float64)
        data.assign(self, labels, partial)
        return labels, data.sq_distances(partial)

    def sq_distances(self, X):
        """Squared Euclidean distances from every row of ``X`` to every centroid, (n, K) float64."""
        XV = np.asarray(self.apply(X), dtype=np.float64)
        if sp.issparse(X):
            x_sq = np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()
        else:
            x_sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
        out = x_sq[:, None] - 2.0 * XV + self.c_sq[None, :]
        return np.maximum(out, 0.0, out=out)

    def describe(self):
        """Summary as a JSON-ready dict."""
        return {
            "kind": type(self).__name__,
            "n_clusters": int(self.n_clusters),
            "n_features": int(self.n_features),
            "dtype": np.dtype(self.dtype).name,
            "nnz": int(self.nnz),
            "flops": int(self.flops),
            "compression": float(self.compression),
            "centered": self.mean is not None,
            "nnz_with_mean": int(self.nnz + self.mean_nnz),
            "flops_with_mean": int(self.flops + 2 * self.mean_nnz),
        }

    def __repr__(self):
        return (f"{type(self).__name__}(n_clusters={self.n_clusters}, n_features={self.n_features}, "
                f"nnz={self.nnz}, dtype={np.dtype(self.dtype).name})")


class DenseOperator(CentroidOperator):
    """Centroids stored as a dense matrix ``C``.

    Dense batches go through BLAS in row blocks; CSR batches through one fused
    numba kernel against ``C^T`` kept dense or in CSR, whichever was measured
    faster (see :class:`qkm._data.StorageChooser`). The layouts of ``C^T`` are
    built on first use and cached.

    Parameters
    ----------
    C : ndarray of shape (n_clusters, n_features)
        C-contiguous float32 or float64; not copied.
    c_sq : ndarray of shape (n_clusters,), default=None
        Squared norms if already known.

    Attributes
    ----------
    storage : {"dense", "sparse", None}
        Layout of ``C^T`` used by the last sparse assignment ("dense" for
        dense batches; None before any).
    """

    def __init__(self, C, c_sq=None):
        self.C = C
        self.n_clusters, self.n_features = C.shape
        self.dtype = C.dtype
        self.c_sq = centroid_sq_norms(C) if c_sq is None else c_sq
        self.storage = None
        self._col_nnz = None
        self._dense_ct = None
        self._sparse_ct = None

    @property
    def nnz(self):
        return int(self.C.size)

    def to_dense(self):
        return self.C

    def apply(self, X):
        out = X @ self.C.T
        return out.toarray() if sp.issparse(out) else np.asarray(out)

    def partials(self, X, labels, partial_best):
        if type(X) is np.ndarray and X.shape[0] <= SMALL_BATCH_ROWS:     # a few rows: no data view, no threads
            K_.assign_dense_small(X @ self.C.T, X, dense_err_rel(X.dtype), self.c_sq, labels, partial_best)
            self.storage = "dense"
            return
        KMeansData(X).assign(self, labels, partial_best)

    def execution_path(self, n_samples):
        return "dense"

    def assign_rows(self, data, rows, labels, partial_best, lb=None):
        """Dense data: BLAS in row blocks; CSR data: the fused kernel on the faster layout of C^T."""
        write_lb = lb is not None
        lb = lb if write_lb else _EMPTY_LB
        if data.sparse:
            self._assign_rows_sparse(data, rows, labels, partial_best, lb, write_lb)
            return
        self.storage = "dense"
        block = _config.DENSE_BLOCK_ROWS
        whole = rows is data.all_rows
        CT = self.C.T
        for start in range(0, rows.shape[0], block):
            block_rows = rows[start:start + block]
            Xb = data.X[start:start + block] if whole else data.X[block_rows]
            K_.assign_dense_block(Xb @ CT, block_rows, data.x_sq, self.c_sq, data.err_rel,
                                  labels, partial_best, lb, write_lb)

    def _assign_rows_sparse(self, data, rows, labels, partial_best, lb, write_lb):
        k = self.n_clusters
        fraction = rows.shape[0] / max(data.n_samples, 1)
        dense_work = data.nnz * k * fraction
        sparse_work = float(data.doc_freq @ self.column_nnz()) * fraction
        storage = data.storage_chooser.choose(dense_work, sparse_work)
        if storage == "sparse":
            ptr, idx, val = self.sparse_transpose()
            CT = np.zeros((0, k), dtype=self.dtype)
        else:
            CT = self.dense_transpose(data.ct_buffer((self.n_features, k), self.dtype))
            ptr, idx, val = _NO_SPARSE_CT[0], _NO_SPARSE_CT[1], np.zeros(0, dtype=self.dtype)
        X = data.X
        compiled_before = _n_compiled()
        t0 = time.perf_counter()  # the kernel only: building a layout is a one-off per centroid set
        K_.assign_sparse(
            X.data, X.indices, X.indptr, data.x_sq, rows, CT, ptr, idx, val, storage == "sparse",
            self.c_sq, data.err_rel, labels, partial_best, lb, write_lb,
        )
        if _n_compiled() == compiled_before:  # a pass that compiled a kernel says nothing about speed
            data.storage_chooser.record(storage, dense_work if storage == "dense" else sparse_work,
                                        time.perf_counter() - t0)
        self.storage = storage

    # -- layouts of C^T for the sparse-data kernels ------------------------- #
    def column_nnz(self):
        """Nonzeros of every column of C (= of every row of C^T), int64."""
        if self._col_nnz is None:
            self._col_nnz = np.empty(self.C.shape[1], dtype=np.int64)
            K_.column_nnz(self.C, self._col_nnz)
        return self._col_nnz

    def dense_transpose(self, buffer=None):
        """C^T as a C-contiguous (D, K) array, written into ``buffer`` when it fits."""
        if self._dense_ct is None:
            k, d = self.C.shape
            ok = buffer is not None and buffer.shape == (d, k) and buffer.dtype == self.C.dtype
            self._dense_ct = buffer if ok else np.empty((d, k), dtype=self.C.dtype)
            K_.transpose_into(self.C, self._dense_ct)
        return self._dense_ct

    def sparse_transpose(self):
        """C^T in CSR as ``(indptr, indices, values)``."""
        if self._sparse_ct is None:
            ptr = np.zeros(self.C.shape[1] + 1, dtype=np.int64)
            np.cumsum(self.column_nnz(), out=ptr[1:])
            idx = np.empty(ptr[-1], dtype=np.int32)
            val = np.empty(ptr[-1], dtype=self.C.dtype)
            K_.fill_sparse_transpose(self.C, ptr, idx, val)
            self._sparse_ct = (ptr, idx, val)
        return self._sparse_ct
