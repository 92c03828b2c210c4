"""How centres travel to the workers and become operators there (private; used by the shard tasks).

A round's centres are one *pack*, scattered once and shared by every shard
task of a worker: dense centres ``(C, c_sq)`` (as CSR when that is at most
half their size, :func:`compact_pack`), or a QK-means factor chain
(:class:`ChainPack`: the sparse factors and the mean, never the dense ``V``).
:func:`_operator` turns a pack into one operator per worker process.
"""

import collections
import threading

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from .._config import _JIT
from ..operator import DenseOperator
from ._timeline import nested_phase

__all__ = ["ChainPack", "BufferRing", "Compacted", "compact_pack"]


def _nbytes(a):
    if sp.issparse(a):
        return a.data.nbytes + a.indices.nbytes + a.indptr.nbytes
    return getattr(a, "nbytes", 0)


def compact_pack(pack):
    """The centres of a pack as CSR when that is at most half their dense size (values unchanged)."""
    C = pack[0]
    if C.ndim != 2 or sp.issparse(C):  # CSR already (wide sparse seeds)
        return pack
    row_nnz = np.empty(C.shape[0], dtype=np.int64)
    _row_nnz(C, row_nnz)
    if 12 * int(row_nnz.sum()) + 8 * C.shape[0] > 0.5 * C.nbytes:
        return pack
    indptr = np.zeros(C.shape[0] + 1, dtype=np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    indices = np.empty(indptr[-1], dtype=np.int32)
    data = np.empty(indptr[-1], dtype=C.dtype)
    _fill_csr(C, indptr, indices, data)
    return (sp.csr_matrix((data, indices, indptr), shape=C.shape),) + tuple(pack[1:])


@njit(parallel=True, **_JIT)
def _row_nnz(C, out):
    for j in prange(C.shape[0]):
        c = 0
        for k in range(C.shape[1]):
            if C[j, k] != 0:
                c += 1
        out[j] = c


@njit(parallel=True, **_JIT)
def _fill_csr(C, indptr, indices, data):
    for j in prange(C.shape[0]):
        q = indptr[j]
        for k in range(C.shape[1]):
            if C[j, k] != 0:
                indices[q] = k
                data[q] = C[j, k]
                q += 1


class Compacted(tuple):
    """A pack already through :func:`compact_pack` (the driver keeps it: it is also the rebuild pack of the
    next iteration); scattered as a plain tuple."""


class BufferRing:
    """A few reused arrays per (shape, dtype), handed out in turn.

    K x D arrays are allocated fresh by the OS (page faults on every page)
    each time; reusing them keeps the per-iteration cost of a fit over shards
    near the in-memory fit's, which also reuses its buffers. An array is
    handed out again only ``size`` requests later, after the iterations that
    used it are over.
    """

    def __init__(self, size=3):
        self.size = size
        self._rings = {}
        self._lock = threading.Lock()

    def get(self, shape, dtype):
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            ring, turn = self._rings.get(key, ([], 0))
            if len(ring) < self.size:
                ring.append(np.empty(shape, dtype=dtype))
                buf = ring[-1]
            else:
                buf = ring[turn % self.size]
            self._rings[key] = (ring, turn + 1)
        return buf


_RING = BufferRing()


def _unpack(pack):
    """Dense centres back from :func:`compact_pack` (into a reused buffer)."""
    C = pack[0]
    if sp.issparse(C):
        out = _RING.get(C.shape, C.dtype)
        out.fill(0)
        C = C.toarray(out=out)
    return (C,) + tuple(pack[1:])


class _SharedOperator(DenseOperator):
    """A DenseOperator shared by the tasks of one worker: layouts of C^T built once, under a lock."""

    def __init__(self, C, c_sq):
        super().__init__(C, c_sq)
        self._lock = threading.RLock()

    def column_nnz(self):
        with self._lock:
            if self._col_nnz is None:
                with nested_phase("assign/column_nnz"):
                    return super().column_nnz()
            return self._col_nnz

    def dense_transpose(self, buffer=None):
        with self._lock:
            if self._dense_ct is None:
                with nested_phase("assign/transpose"):
                    return super().dense_transpose(_RING.get(self.C.shape[::-1], self.C.dtype))
            return self._dense_ct

    def sparse_transpose(self):
        with self._lock:
            if self._sparse_ct is None:
                with nested_phase("assign/transpose"):
                    return super().sparse_transpose()
            return self._sparse_ct


@njit(**_JIT)
def _csr_column_nnz(indices, data, out):
    """OUT out[k] = number of nonzero entries of column k of a CSR matrix (explicit zeros not counted)."""
    out[:] = 0
    for q in range(indices.shape[0]):
        if data[q] != 0:
            out[indices[q]] += 1


def _tile(n_clusters):
    """Features per column block of the sparse C^T build: the writes of a block stay in cache."""
    return max(64, (1 << 15) // max(int(n_clusters), 1))


@njit(**_JIT)
def _csr_fill_transpose(indptr, indices, data, tile, ct_ptr, ct_idx, ct_val):
    """OUT CSR of C^T from the CSR of C (sorted indices): the arrays
    :func:`~qkm._kernels.fill_sparse_transpose` makes from the dense C (rows of C^T by increasing
    cluster, zeros left out). Column blocks of ``tile`` features: the writes of a block stay in cache."""
    K, D = indptr.shape[0] - 1, ct_ptr.shape[0] - 1
    fill = ct_ptr[:-1].copy()
    pos = indptr[:-1].copy()
    for k1 in range(tile, D + tile, tile):
        for j in range(K):
            q, end = pos[j], indptr[j + 1]
            while q < end and indices[q] < k1:
                v = data[q]
                if v != 0:
                    k = indices[q]
                    ct_idx[fill[k]] = j
                    ct_val[fill[k]] = v
                    fill[k] += 1
                q += 1
            pos[j] = q


@njit(**_JIT)
def _csr_fill_dense_transpose(indptr, indices, data, CT):
    """OUT CT = C^T (zeros first) from the CSR of C."""
    CT[:] = 0
    for j in range(indptr.shape[0] - 1):
        for q in range(indptr[j], indptr[j + 1]):
            CT[indices[q], j] = data[q]


class _SharedCSROperator(_SharedOperator):
    """:class:`_SharedOperator` of a compact (CSR) pack: the layouts of C^T are built from the CSR in
    O(nnz) and the dense ``C`` (a pass over K x D) only when a kernel asks for it (Elkan's bounds)."""

    def __init__(self, C_csr, c_sq):
        if not C_csr.has_sorted_indices:  # the blocked C^T build walks each row once, in column order
            C_csr = C_csr.sorted_indices()
        self._csr = C_csr
        self._C = None
        self.n_clusters, self.n_features = C_csr.shape
        self.dtype = C_csr.dtype
        self.c_sq = c_sq
        self.storage = None
        self._col_nnz = None
        self._dense_ct = None
        self._sparse_ct = None
        self._lock = threading.RLock()

    @property
    def C(self):
        with self._lock:
            if self._C is None:
                with nested_phase("assign/densify"):
                    self._C = _unpack((self._csr,))[0]
            return self._C

    def column_nnz(self):
        with self._lock:
            if self._col_nnz is None:
                with nested_phase("assign/column_nnz"):
                    self._col_nnz = np.empty(self.n_features, dtype=np.int64)
                    _csr_column_nnz(self._csr.indices, self._csr.data, self._col_nnz)
            return self._col_nnz

    def dense_transpose(self, buffer=None):
        with self._lock:
            if self._dense_ct is None:
                with nested_phase("assign/transpose"):
                    CT = _RING.get((self.n_features, self.n_clusters), self.dtype)
                    _csr_fill_dense_transpose(self._csr.indptr, self._csr.indices, self._csr.data, CT)
                    self._dense_ct = CT
            return self._dense_ct

    def sparse_transpose(self):
        with self._lock:
            if self._sparse_ct is None:
                with nested_phase("assign/transpose"):
                    ptr = np.zeros(self.n_features + 1, dtype=np.int64)
                    np.cumsum(self.column_nnz(), out=ptr[1:])
                    idx = np.empty(ptr[-1], dtype=np.int32)
                    val = np.empty(ptr[-1], dtype=self.dtype)
                    _csr_fill_transpose(self._csr.indptr, self._csr.indices, self._csr.data, _tile(self.n_clusters),
                                        ptr, idx, val)
                    self._sparse_ct = (ptr, idx, val)
            return self._sparse_ct


class ChainPack:
    """The centroids of a QK-means step as sent to the workers: the sparse factors (and the mean), never ``V``.

    Parameters
    ----------
    factors : list of scipy.sparse.csr_matrix
    mean : ndarray of shape (n_features,) or None
    dtype : numpy dtype
        The data's precision (the operator's).
    norms : tuple of two ndarrays of shape (n_clusters,), default=None
        The driver operator's ``norms``: the workers then never fold the
        chain into ``V`` (nor pass over it for the norms).
    """

    def __init__(self, factors, mean, dtype, norms=None):
        self.factors, self.mean, self.dtype, self.norms = list(factors), mean, np.dtype(dtype), norms

    @property
    def nbytes(self):
        return sum(_nbytes(f) for f in self.factors) + _nbytes(self.mean) + sum(_nbytes(a) for a in self.norms or ())


_CALIBRATION = {}  # one measured choice of chain path per worker process (bit-identical paths only)


def _chain_operator(pack):
    from ..operator._chain_calibration import ChainCalibration
    from ..operator import FactorChainOperator

    calibration = _CALIBRATION.setdefault("chain", ChainCalibration(bit_identical=True))
    op = FactorChainOperator(pack.factors, dtype=pack.dtype, calibration=calibration, mean=pack.mean,
                             norms=getattr(pack, "norms", None))
    _CALIBRATION["chain"] = op.calibration  # a new one when the chain's shape changed
    return op


def fresh_operator(pack):
    """The operator of a pack: a factor chain (:class:`ChainPack`) or dense centres ``(C, c_sq)``."""
    if isinstance(pack, ChainPack):
        return _chain_operator(pack)
    C, c_sq = _unpack(pack)[:2]
    return DenseOperator(C, c_sq)


_OPERATORS = collections.OrderedDict()  # id(pack) -> (pack, operator): one per pack per worker process
_OPERATORS_LOCK = threading.Lock()


def _operator(pack):
    """The centres of ``pack`` as one operator per worker, shared by all its shards."""
    with _OPERATORS_LOCK:
        hit = _OPERATORS.get(id(pack))
        if hit is not None and hit[0] is pack:
            return hit[1]
        if isinstance(pack, ChainPack):
            op = _chain_operator(pack)
        elif sp.issparse(pack[0]):
            op = _SharedCSROperator(sp.csr_matrix(pack[0]), pack[1])
        else:
            op = _SharedOperator(*pack[:2])
        _OPERATORS[id(pack)] = (pack, op)
        while len(_OPERATORS) > 2:
            _OPERATORS.popitem(last=False)
        return op
