"""Small CSR helpers of the PALM sweep (private; see :mod:`qkm.factorization._palm`).

Factors hold about ``s`` nonzeros per row and column, so every product with a
factor (or with a step ``S_new - S``) is a CSR x dense product streaming
contiguous rows; :class:`SweepMatrix` wraps a factor with the products the sweep
needs and falls back to BLAS on the dense array for matrices denser than
``SPARSE_MAX_DENSITY`` (the ``sp`` residual of the first hierarchical levels).
"""

import numpy as np
from numba import njit

from .._config import _JIT

__all__ = ["SPARSE_MAX_DENSITY", "SweepMatrix", "csr_matmul_into"]

#: Factors with at most this fraction of nonzeros use the sparse products.
SPARSE_MAX_DENSITY = 0.15


@njit(**_JIT)
def csr_fill(
    S,                              # IN  (n, m) dense
    ptr,                            # OUT (n + 1,) row pointers
    idx, val,                       # OUT (>= nnz,) column indices (ascending per row), values
):
    """CSR of the nonzeros of ``S`` in one pass; returns nnz."""
    n, m = S.shape
    p = 0
    ptr[0] = 0
    for i in range(n):
        for j in range(m):
            v = S[i, j]
            if v != 0.0:
                idx[p] = j
                val[p] = v
                p += 1
        ptr[i + 1] = p
    return p


@njit(**_JIT)
def csr_transpose(
    ptr, idx, val,                  # IN  CSR of S (n, m)
    ptr_t, idx_t, val_t,            # OUT CSR of S.T: (m + 1,), (nnz,), (nnz,)
):
    """CSR of ``S.T`` from the CSR of ``S`` in ``O(nnz + m)``."""
    n = ptr.shape[0] - 1
    m = ptr_t.shape[0] - 1
    ptr_t[:] = 0
    for p in range(ptr[n]):
        ptr_t[idx[p] + 1] += 1
    for j in range(m):
        ptr_t[j + 1] += ptr_t[j]
    fill = ptr_t[:-1].copy()
    for i in range(n):
        for p in range(ptr[i], ptr[i + 1]):
            q = fill[idx[p]]
            idx_t[q] = i
            val_t[q] = val[p]
            fill[idx[p]] = q + 1


@njit(**_JIT)
def csr_sub(
    pa, ia, va,                     # IN  CSR of A (n rows, indices ascending)
    pb, ib, vb,                     # IN  CSR of B
    ptr, idx, val,                  # OUT CSR of A - B (capacity nnz(A) + nnz(B))
):
    """Row-by-row merge: ``A - B`` on the union of the supports; returns nnz."""
    n = pa.shape[0] - 1
    p = 0
    ptr[0] = 0
    for i in range(n):
        a, a1, b, b1 = pa[i], pa[i + 1], pb[i], pb[i + 1]
        while a < a1 or b < b1:
            if b >= b1 or (a < a1 and ia[a] < ib[b]):
                j, v = ia[a], va[a]
                a += 1
            elif a >= a1 or ib[b] < ia[a]:
                j, v = ib[b], -vb[b]
                b += 1
            else:
                j, v = ia[a], va[a] - vb[b]
                a += 1
                b += 1
            if v != 0.0:
                idx[p] = j
                val[p] = v
                p += 1
        ptr[i + 1] = p
    return p


@njit(**_JIT)
def csr_inner(
    ptr, idx, val,                  # IN  CSR of S (n, m)
    G,                              # IN  (n, m) dense
    row_weights,                    # IN  (n,) or (0,) for ones
):
    """``sum_ij w_i S_ij G_ij`` over the nonzeros of ``S``."""
    weighted = row_weights.shape[0] > 0
    total = 0.0
    for i in range(ptr.shape[0] - 1):
        acc = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            acc += val[p] * G[i, idx[p]]
        total += acc * row_weights[i] if weighted else acc
    return total


@njit(**_JIT)
def csr_matmul_into(
    ptr, idx, val,                  # IN  CSR of S (r, n)
    B,                              # IN  (n, m) dense, C-contiguous
    out,                            # OUT (r, m) S @ B
):
    """``S @ B`` as scaled row additions: contiguous, vectorisable inner loops."""
    m = B.shape[1]
    for i in range(ptr.shape[0] - 1):
        for k in range(m):
            out[i, k] = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            v = val[p]
            j = idx[p]
            for k in range(m):
                out[i, k] += v * B[j, k]


_NO_WEIGHTS = np.empty(0)


class SweepMatrix:
    """A sparse-ish matrix with the products the sweep needs: ``S @ B``, ``S.T @ B``, ``<S, G>``.

    Held as CSR (built in one pass from the dense factor, or given: the step
    ``S_new - S`` is merged from two CSRs); its transpose is derived on first
    use. Matrices denser than ``SPARSE_MAX_DENSITY`` (the ``sp`` residual of
    the first hierarchical levels) use BLAS on the dense array instead.
    """

    __slots__ = ("shape", "_a", "csr", "nnz", "sparse", "_csrt")

    def __init__(self, a=None, csr=None, shape=None):
        self._a, self._csrt = a, None
        if csr is None:
            n, m = self.shape = a.shape
            ptr, idx, val = np.empty(n + 1, dtype=np.int64), np.empty(a.size, dtype=np.int64), np.empty(a.size)
            nnz = csr_fill(a, ptr, idx, val)
            csr = ptr, idx[:nnz], val[:nnz]
        else:
            self.shape = shape
        self.csr = csr
        self.nnz = csr[0][-1]
        self.sparse = self.nnz <= SPARSE_MAX_DENSITY * self.shape[0] * self.shape[1]

    @property
    def a(self):
        """Dense array."""
        if self._a is None:
            ptr, idx, val = self.csr
            a = np.zeros(self.shape)
            rows = np.repeat(np.arange(self.shape[0]), np.diff(ptr))
            a[rows, idx] = val
            self._a = a
        return self._a

    def sub(self, other):
        """``self - other`` (same shape) as a new :class:`SweepMatrix`."""
        cap = self.nnz + other.nnz
        ptr, idx, val = np.empty(self.shape[0] + 1, dtype=np.int64), np.empty(cap, dtype=np.int64), np.empty(cap)
        nnz = csr_sub(*self.csr, *other.csr, ptr, idx, val)
        return SweepMatrix(csr=(ptr, idx[:nnz], val[:nnz]), shape=self.shape)

    def sq(self):
        """``||S||_F^2``."""
        v = self.csr[2]
        return float(np.dot(v, v))

    def inner(self, G, row_weights=None):
        """``<S, diag(row_weights) G>``."""
        return csr_inner(*self.csr, G, _NO_WEIGHTS if row_weights is None else row_weights)

    def mm(self, B):
        """``S @ B`` (``B`` C-contiguous)."""
        if not self.sparse:
            return self.a @ B
        out = np.empty((self.shape[0], B.shape[1]))
        csr_matmul_into(*self.csr, B, out)
        return out

    def tmm(self, B):
        """``S.T @ B`` (``B`` C-contiguous)."""
        if not self.sparse:
            return self.a.T @ B
        if self._csrt is None:
            m = self.shape[1]
            self._csrt = (np.empty(m + 1, dtype=np.int64), np.empty(self.nnz, dtype=np.int64),
                          np.empty(self.nnz))
            csr_transpose(*self.csr, *self._csrt)
        out = np.empty((self.shape[1], B.shape[1]))
        csr_matmul_into(*self._csrt, B, out)
        return out
