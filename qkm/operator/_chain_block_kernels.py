"""Blocked numba kernels of the factor chain (private; layout and conventions in :mod:`qkm.operator._chain_kernels`).

A block of ``width`` samples is transposed into a (D, width) buffer and every
factor row becomes ``width``-lane axpys over (n, width) buffers
(loop-vectorised); the argmin is fused into the last factor. Work is split
into fixed chunks of whole blocks (:func:`chunk_rows`), so results never depend
on the thread count. :func:`fold_chain` multiplies the chain out the same way.
"""

import numpy as np
from numba import njit, prange

from .. import _config
from ._chain_kernels import _U1, _U2, _U3, _U4, _U5, _max_rows
from .._config import _JIT

#: Samples transposed together (a compile-time loop length).
_GROUP = 8


def chunk_rows(width):
    """Rows per parallel work unit: whole blocks, about ``_config.CHUNK_SIZE`` rows."""
    return max(width, (_config.CHUNK_SIZE // width) * width)


# --------------------------------------------------------------------------- #
# Lane helpers: one output row of a factor for `b` samples at once
# --------------------------------------------------------------------------- #
@njit(inline="always", **_JIT)
def _lanes3(out, o, cur, j0, j1, j2, v0, v1, v2, b):
    for l in range(b):
        out[o, l] = v0 * cur[j0, l] + v1 * cur[j1, l] + v2 * cur[j2, l]


@njit(inline="always", **_JIT)
def _lanes3_add(out, o, cur, j0, j1, j2, v0, v1, v2, b):
    for l in range(b):
        out[o, l] = out[o, l] + v0 * cur[j0, l] + v1 * cur[j1, l] + v2 * cur[j2, l]


@njit(inline="always", **_JIT)
def _lanes2(out, o, cur, j0, j1, v0, v1, b):
    for l in range(b):
        out[o, l] = v0 * cur[j0, l] + v1 * cur[j1, l]


@njit(inline="always", **_JIT)
def _lanes2_add(out, o, cur, j0, j1, v0, v1, b):
    for l in range(b):
        out[o, l] = out[o, l] + v0 * cur[j0, l] + v1 * cur[j1, l]


@njit(inline="always", **_JIT)
def _lanes1(out, o, cur, j0, v0, b):
    for l in range(b):
        out[o, l] = v0 * cur[j0, l]


@njit(inline="always", **_JIT)
def _lanes1_add(out, o, cur, j0, v0, b):
    for l in range(b):
        out[o, l] = out[o, l] + v0 * cur[j0, l]


@njit(inline="always", **_JIT)
def _row_lanes(a, e, idx, val, cur, out, o, b):
    """out[o, :b] = sum_{p in [a, e)} val[p] * cur[idx[p], :b], terms in order (a <= e, uint64)."""
    n = np.int64(e - a)
    if n >= 3:
        _lanes3(out, o, cur, idx[a], idx[a + _U1], idx[a + _U2], val[a], val[a + _U1], val[a + _U2], b)
        p = a + _U3
    elif n == 2:
        _lanes2(out, o, cur, idx[a], idx[a + _U1], val[a], val[a + _U1], b)
        p = e
    elif n == 1:
        _lanes1(out, o, cur, idx[a], val[a], b)
        p = e
    else:
        for l in range(b):
            out[o, l] = 0
        p = e
    while np.int64(e - p) >= 3:
        _lanes3_add(out, o, cur, idx[p], idx[p + _U1], idx[p + _U2], val[p], val[p + _U1], val[p + _U2], b)
        p += _U3
    rest = np.int64(e - p)
    if rest == 2:
        _lanes2_add(out, o, cur, idx[p], idx[p + _U1], val[p], val[p + _U1], b)
    elif rest == 1:
        _lanes1_add(out, o, cur, idx[p], val[p], b)


@njit(inline="always", **_JIT)
def _row_lanes_by3(a, e, idx, val, cur, out, o, b):
    """As _row_lanes for a row of 3, 6, 9, ... entries: no remainder code (much faster)."""
    _lanes3(out, o, cur, idx[a], idx[a + _U1], idx[a + _U2], val[a], val[a + _U1], val[a + _U2], b)
    p = a + _U3
    while p < e:
        _lanes3_add(out, o, cur, idx[p], idx[p + _U1], idx[p + _U2], val[p], val[p + _U1], val[p + _U2], b)
        p += _U3


@njit(**_JIT)
def _factor_lanes(
    ptr, p0, n_rows, w, idx, val,   # IN  one factor (CSR rows ptr[p0 : p0 + n_rows + 1]; w = nnz of
                                    #     every row if they all have the same count, else -1)
    cur,                            # IN  (n_cols, >= b) input lanes
    nxt,                            # OUT (>= n_rows, >= b) output lanes
    b,                              # IN  lanes in use
):
    rows = ptr[p0:p0 + n_rows + 1]
    if w == 3:
        a = rows[0]
        for i in range(n_rows):
            _lanes3(nxt, i, cur, idx[a], idx[a + _U1], idx[a + _U2], val[a], val[a + _U1], val[a + _U2], b)
            a += _U3
    elif w == 5:
        a = rows[0]
        for i in range(n_rows):
            _lanes3(nxt, i, cur, idx[a], idx[a + _U1], idx[a + _U2], val[a], val[a + _U1], val[a + _U2], b)
            _lanes2_add(nxt, i, cur, idx[a + _U3], idx[a + _U4], val[a + _U3], val[a + _U4], b)
            a += _U5
    elif w == -3:
        for i in range(n_rows):
            _row_lanes_by3(rows[i], rows[i + 1], idx, val, cur, nxt, i, b)
    else:
        for i in range(n_rows):
            _row_lanes(rows[i], rows[i + 1], idx, val, cur, nxt, i, b)


@njit(**_JIT)
def _last_lanes(
    ptr, p0, n_rows, w, idx, val,   # IN  the last factor S_1 (K rows), as in _factor_lanes
    cur,                            # IN  (n_cols, >= b) input lanes
    tmp,                            # --  (1, >= b) scratch
    c_sq,                           # IN  (K,) float64
    best_d, best_k,                 # OUT (>= b,) float64 running minimum and argmin (as float64)
    b,
):
    """S_1 applied row by row, each row folded straight into the argmin (lowest k on ties).

    The argmin is kept as a float64 so that both running values are selected
    with same-width vector blends (see docs/decisions.md, 'Operator kernels').
    """
    for l in range(b):
        best_d[l] = np.inf
        best_k[l] = 0.0
    rows = ptr[p0:p0 + n_rows + 1]
    a = rows[0]
    for k in range(n_rows):
        if w == 3:
            _lanes3(tmp, 0, cur, idx[a], idx[a + _U1], idx[a + _U2], val[a], val[a + _U1], val[a + _U2], b)
            a += _U3
        elif w == -3:
            _row_lanes_by3(rows[k], rows[k + 1], idx, val, cur, tmp, 0, b)
        else:
            _row_lanes(rows[k], rows[k + 1], idx, val, cur, tmp, 0, b)
        _argmin_lanes(tmp, 0, c_sq[k], np.float64(k), best_d, best_k, b)


@njit(inline="always", **_JIT)
def _argmin_lanes(y, o, c, kf, best_d, best_k, b):
    for l in range(b):
        d = c - 2.0 * np.float64(y[o, l])
        better = d < best_d[l]
        best_d[l] = d if better else best_d[l]
        best_k[l] = kf if better else best_k[l]


@njit(**_JIT)
def _transpose_block(
    X,                              # IN  (n, D) C-contiguous samples
    r0, b,                          # IN  block = rows r0 .. r0 + b - 1
    T,                              # OUT (D, >= b) the block transposed
):
    """Groups of 8 samples at a time: a fixed-length inner loop of 8 strided
    loads and one contiguous store per group (see docs/decisions.md, 'Operator kernels')."""
    D = X.shape[1]
    Xb = X[r0:r0 + b]  # indices from ranges only: no wrap-around selects
    full = b - b % _GROUP
    for l0 in range(0, full, _GROUP):
        for j in range(D):
            for l in range(_GROUP):
                T[j, l0 + l] = Xb[l0 + l, j]
    for l in range(full, b):
        for j in range(D):
            T[j, l] = Xb[l, j]


@njit(**_JIT)
def _scatter_block_csr(
    data, indices, indptr,          # IN  CSR samples
    r0, b,                          # IN  block = rows r0 .. r0 + b - 1
    meta, ptr, idx, val,            # IN  packed chain (its CSC of S_Q is used)
    out,                            # OUT (n_rows(S_Q), >= b) = S_Q x for every lane
):
    """First factor for CSR samples: scatter the CSC columns of S_Q hit by each sample."""
    Q = meta.shape[0] - 1
    n_out = meta[0, 0]
    c0 = meta[Q, 2]
    for i in range(n_out):
        for l in range(b):
            out[i, l] = 0
    cols = ptr[c0:c0 + meta[Q, 0] + 1]
    for l in range(b):
        for p in range(indptr[r0 + l], indptr[r0 + l + 1]):
            j = np.uint64(indices[p])
            x = data[p]
            for q in range(cols[j], cols[j + _U1]):
                out[idx[q], l] += val[q] * x


@njit(**_JIT)
def _rest_of_chain_lanes(meta, ptr, idx, val, c_sq, buf0, buf1, tmp, best_d, best_k, b):
    """Factors 1 .. Q-1 (apply order) on `buf0` = S_Q x, fused argmin on the last."""
    Q = meta.shape[0] - 1
    cur = buf0
    nxt = buf1
    for q in range(1, Q - 1):
        _factor_lanes(ptr, meta[q, 2], meta[q, 0], meta[q, 3], idx, val, cur, nxt, b)
        cur, nxt = nxt, cur
    _last_lanes(ptr, meta[Q - 1, 2], meta[Q - 1, 0], meta[Q - 1, 3], idx, val, cur, tmp, c_sq, best_d, best_k, b)


@njit(**_JIT)
def _block_dense(X, r0, b, meta, ptr, idx, val, c_sq, T, buf0, buf1, tmp, best_d, best_k, labels, best):
    """One block of dense samples through the whole chain."""
    Q = meta.shape[0] - 1
    _transpose_block(X, r0, b, T)
    if Q == 1:
        _last_lanes(ptr, meta[0, 2], meta[0, 0], meta[0, 3], idx, val, T, tmp, c_sq, best_d, best_k, b)
    else:
        _factor_lanes(ptr, meta[0, 2], meta[0, 0], meta[0, 3], idx, val, T, buf0, b)
        _rest_of_chain_lanes(meta, ptr, idx, val, c_sq, buf0, buf1, tmp, best_d, best_k, b)
    for l in range(b):
        labels[r0 + l] = np.int32(best_k[l])
        best[r0 + l] = best_d[l]


@njit(**_JIT)
def _block_csr(data, indices, indptr, r0, b, meta, ptr, idx, val, c_sq, buf0, buf1, tmp, best_d, best_k,
               labels, best):
    """One block of CSR samples through the whole chain."""
    Q = meta.shape[0] - 1
    _scatter_block_csr(data, indices, indptr, r0, b, meta, ptr, idx, val, buf0)
    if Q == 1:
        # S_1 = S_Q: the scattered block already holds V x; argmin over its rows
        for l in range(b):
            best_d[l] = np.inf
            best_k[l] = 0.0
        for k in range(meta[0, 0]):
            _argmin_lanes(buf0, k, c_sq[k], np.float64(k), best_d, best_k, b)
    else:
        _rest_of_chain_lanes(meta, ptr, idx, val, c_sq, buf0, buf1, tmp, best_d, best_k, b)
    for l in range(b):
        labels[r0 + l] = np.int32(best_k[l])
        best[r0 + l] = best_d[l]



@njit(inline="always", **_JIT)
def _block_buffers(meta, val, width):
    """Per-work-unit buffers of the blocked kernels: two ping-pong lanes, a spare row, the running argmin."""
    m = _max_rows(meta)
    buf0 = np.empty((m, width), dtype=val.dtype)
    buf1 = np.empty((m, width), dtype=val.dtype)
    tmp = np.empty((1, width), dtype=val.dtype)
    best_d = np.empty(width, dtype=np.float64)
    best_k = np.empty(width, dtype=np.float64)
    return buf0, buf1, tmp, best_d, best_k


@njit(**_JIT)
def _dense_chunk(X, start, stop, width, meta, ptr, idx, val, c_sq, labels, best):
    T = np.empty((X.shape[1], width), dtype=val.dtype)
    buf0, buf1, tmp, best_d, best_k = _block_buffers(meta, val, width)
    for r0 in range(start, stop, width):
        b = min(width, stop - r0)
        _block_dense(X, r0, b, meta, ptr, idx, val, c_sq, T, buf0, buf1, tmp, best_d, best_k, labels, best)


@njit(**_JIT)
def _csr_chunk(data, indices, indptr, start, stop, width, meta, ptr, idx, val, c_sq, labels, best):
    buf0, buf1, tmp, best_d, best_k = _block_buffers(meta, val, width)
    for r0 in range(start, stop, width):
        b = min(width, stop - r0)
        _block_csr(data, indices, indptr, r0, b, meta, ptr, idx, val, c_sq, buf0, buf1, tmp, best_d, best_k,
                   labels, best)


# --------------------------------------------------------------------------- #
# Blocked drivers (serial and parallel twins have their own names: the disk
# cache keys ignore the `parallel` flag)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def chain_block_dense(
    X,                              # IN  (n, D) C-contiguous, dtype of val
    width,                          # IN  samples per block
    chunk,                          # IN  rows per work unit (a multiple of width)
    meta, ptr, idx, val,            # IN  packed chain
    c_sq,                           # IN  (K,) float64
    labels,                         # OUT (n,) int32
    best,                           # OUT (n,) float64 min_k c_sq[k] - 2 x.v_k
):
    n = X.shape[0]
    for c in range((n + chunk - 1) // chunk):
        _dense_chunk(X, c * chunk, min(n, (c + 1) * chunk), width, meta, ptr, idx, val, c_sq, labels, best)


@njit(parallel=True, **_JIT)
def chain_block_dense_par(X, width, chunk, meta, ptr, idx, val, c_sq, labels, best):
    """Parallel twin of :func:`chain_block_dense` (same arguments)."""
    n = X.shape[0]
    for c in prange((n + chunk - 1) // chunk):
        _dense_chunk(X, c * chunk, min(n, (c + 1) * chunk), width, meta, ptr, idx, val, c_sq, labels, best)


@njit(**_JIT)
def chain_block_csr(
    data, indices, indptr,          # IN  CSR samples (n rows), data of the dtype of val
    width, chunk,                   # IN  as chain_block_dense
    meta, ptr, idx, val, c_sq,      # IN  packed chain
    labels, best,                   # OUT (n,)
):
    n = indptr.shape[0] - 1
    for c in range((n + chunk - 1) // chunk):
        _csr_chunk(data, indices, indptr, c * chunk, min(n, (c + 1) * chunk), width, meta, ptr, idx, val,
                   c_sq, labels, best)


@njit(parallel=True, **_JIT)
def chain_block_csr_par(data, indices, indptr, width, chunk, meta, ptr, idx, val, c_sq, labels, best):
    """Parallel twin of :func:`chain_block_csr` (same arguments)."""
    n = indptr.shape[0] - 1
    for c in prange((n + chunk - 1) // chunk):
        _csr_chunk(data, indices, indptr, c * chunk, min(n, (c + 1) * chunk), width, meta, ptr, idx, val,
                   c_sq, labels, best)


# --------------------------------------------------------------------------- #
# Folding the chain into the dense V
# --------------------------------------------------------------------------- #
@njit(inline="always", **_JIT)
def _fold_dims(meta, ptr):
    """``Q, D, K``, the longest factor (rows of the buffers) and the column pointers of S_Q's CSC."""
    Q = meta.shape[0] - 1
    D = meta[0, 1]
    return Q, D, meta[Q - 1, 0], _max_rows(meta), ptr[meta[Q, 2]:meta[Q, 2] + D + 1]


@njit(inline="always", **_JIT)
def _fold_block(meta, ptr, idx, val, cols, Q, m, width, c0, b):
    """Columns ``c0 .. c0+b`` of ``V``: the block of S_Q (from its CSC) pushed through the other factors; (m, width) buffer, rows 0..K-1 valid."""
    buf0 = np.zeros((m, width), dtype=val.dtype)
    buf1 = np.empty((m, width), dtype=val.dtype)
    for l in range(b):
        j = np.uint64(c0 + l)
        for q in range(cols[j], cols[j + _U1]):
            buf0[idx[q], l] = val[q]
    cur = buf0
    nxt = buf1
    for q in range(1, Q):
        _factor_lanes(ptr, meta[q, 2], meta[q, 0], meta[q, 3], idx, val, cur, nxt, b)
        cur, nxt = nxt, cur
    return cur


@njit(parallel=True, **_JIT)
def fold_chain(
    meta, ptr, idx, val,            # IN  packed chain, val in the precision of V
    width,                          # IN  columns of V per work unit
    V,                              # OUT (K, D) C-contiguous, V = S_1 ... S_Q
):
    """V in column blocks: the block of S_Q (from its CSC) pushed through the other factors.

    The (A, width) buffers stay in cache, unlike a right-to-left sparse @ dense
    fold whose (A, D) intermediates stream through memory (see docs/decisions.md,
    'Operator kernels'). Every column block is independent: no thread dependence.
    """
    Q, D, K, m, cols = _fold_dims(meta, ptr)
    for blk in prange((D + width - 1) // width):
        c0 = blk * width
        b = min(width, D - c0)
        cur = _fold_block(meta, ptr, idx, val, cols, Q, m, width, c0, b)
        for k in range(K):
            for l in range(b):
                V[k, c0 + l] = cur[k, l]


@njit(parallel=True, **_JIT)
def chain_norms(
    meta, ptr, idx, val,            # IN  packed chain, val in float64
    width,                          # IN  columns of V per work unit (fixed: the sums do not depend on threads)
    mu,                             # IN  (D,) float64 vector dotted with every row of V, or (0,) for none
    sq,                             # OUT (n_blocks, K) sum over the block's columns of V[k, c]^2
    dots,                           # OUT (n_blocks, K) sum over the block's columns of V[k, c] * mu[c]
):
    """Row norms (and dots with ``mu``) of ``V = S_1 ... S_Q`` per column block, without storing ``V``.

    The same column blocks as :func:`fold_chain`; the caller adds the block
    sums in block order, so the result is independent of the thread count.
    """
    Q, D, K, m, cols = _fold_dims(meta, ptr)
    with_mu = mu.shape[0] > 0
    for blk in prange((D + width - 1) // width):
        c0 = blk * width
        b = min(width, D - c0)
        cur = _fold_block(meta, ptr, idx, val, cols, Q, m, width, c0, b)
        for k in range(K):
            s = 0.0
            t = 0.0
            for l in range(b):
                v = cur[k, l]
                s += v * v
                if with_mu:
                    t += v * mu[c0 + l]
            sq[blk, k] = s
            dots[blk, k] = t
