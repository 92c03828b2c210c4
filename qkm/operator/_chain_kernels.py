"""numba kernels of :class:`qkm.operator._chain.FactorChainOperator` (private; no validation here).

The chain ``V = S_1 S_2 ... S_Q`` is applied to a sample ``x`` right to left,
``V x = S_1 (S_2 (... (S_Q x)))``, and the argmin over the centroids is fused
into the last product, so no (n, K) buffer is ever built.

Packed chain (built by ``qkm.operator._chain_layout.pack``)
------------------------------------------
``meta`` : int64 (Q + 1, 4)
    Row ``q < Q`` describes the q-th factor *in the order of application*
    (row 0 is ``S_Q``, row Q-1 is ``S_1``): ``[n_rows, n_cols, ptr_offset,
    w]``; its CSR row ``i`` owns ``idx/val[ptr[ptr_offset + i] : ptr[ptr_offset
    + i + 1]]``; ``w`` is 3 or 5 when every row has that many entries
    (branch-free loops), -3 when every row has a nonzero multiple of 3
    entries (rows padded with zeros by ``qkm.operator._chain_layout._lane_rows``), else -1.
    Row ``Q`` is the CSC of ``S_Q`` (for CSR samples): ``[n_cols, n_rows,
    ptr_offset, -1]``, column ``j`` owns ``idx/val[ptr[ptr_offset + j] : ...]``.
``ptr`` : uint64, absolute offsets into ``idx``/``val``.
``idx`` : uint32 column (CSR) or row (CSC) ids; unsigned, so numba needs no
    negative-index wrap-around and the gathers stay cheap.
``val`` : float32 or float64, the precision of every accumulator.

Every output is a sum taken in the order of the factor's column ids,
starting from the first term, in every kernel (per-sample, blocked, dense or
CSR samples, any block width, any thread count), so all of them return
bit-identical results (fastmath stays off: no contraction, no reassociation).

Two ways through the chain
--------------------------
* per sample (``chain_sample_*``, this module): scalar gathers, for batches of a few rows;
* blocked (``chain_block_*``, :mod:`qkm.operator._chain_block_kernels`): a block of ``width`` samples is transposed into
  a (D, width) buffer and every factor row becomes ``width``-lane axpys over
  (n, width) buffers (loop-vectorised). Work is split into fixed chunks of
  whole blocks (``chunk_rows``), so results never depend on the thread count.
"""

import numpy as np
from numba import njit

from .._config import _JIT

# Offsets into idx/val are uint64: numba then emits no negative-index
# wrap-around for them (that costs a compare and a select per access). Adding
# a signed int to a uint64 gives a float64 in numba, hence these constants.
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U4 = np.uint64(4)
_U5 = np.uint64(5)


@njit(**_JIT)
def _max_rows(meta):
    m = 1
    for q in range(meta.shape[0] - 1):
        m = max(m, meta[q, 0])
    return m


# --------------------------------------------------------------------------- #
# Per-sample kernels (latency: a handful of rows, one call does everything)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _factor_vec(
    ptr, p0, n_rows, w, idx, val,   # IN  one factor, as in _chain_block_kernels._factor_lanes
    cur,                            # IN  (n_cols,) input vector
    nxt,                            # OUT (>= n_rows,) output vector
):
    rows = ptr[p0:p0 + n_rows + 1]
    if w == 3:
        a = rows[0]
        for i in range(n_rows):
            nxt[i] = (val[a] * cur[idx[a]] + val[a + _U1] * cur[idx[a + _U1]]
                      + val[a + _U2] * cur[idx[a + _U2]])
            a += _U3
        return
    if w == 5:
        a = rows[0]
        for i in range(n_rows):
            nxt[i] = (val[a] * cur[idx[a]] + val[a + _U1] * cur[idx[a + _U1]]
                      + val[a + _U2] * cur[idx[a + _U2]] + val[a + _U3] * cur[idx[a + _U3]]
                      + val[a + _U4] * cur[idx[a + _U4]])
            a += _U5
        return
    for i in range(n_rows):
        a = rows[i]
        e = rows[i + 1]
        if e == a:
            nxt[i] = 0
        else:
            acc = val[a] * cur[idx[a]]
            for p in range(a + _U1, e):
                acc += val[p] * cur[idx[p]]
            nxt[i] = acc


@njit(**_JIT)
def _scatter_vec_csr(data, indices, indptr, r, meta, ptr, idx, val, out):
    """out = S_Q x for CSR sample r (CSC columns of S_Q hit by x, in column order)."""
    Q = meta.shape[0] - 1
    c0 = meta[Q, 2]
    for i in range(meta[0, 0]):
        out[i] = 0
    cols = ptr[c0:c0 + meta[Q, 0] + 1]
    for p in range(indptr[r], indptr[r + 1]):
        j = np.uint64(indices[p])
        x = data[p]
        for q in range(cols[j], cols[j + _U1]):
            out[idx[q]] += val[q] * x


@njit(**_JIT)
def _argmin_vec(y, c_sq, r, labels, best):
    bd = np.inf
    bk = 0
    for k in range(c_sq.shape[0]):
        d = c_sq[k] - 2.0 * np.float64(y[k])
        if d < bd:
            bd = d
            bk = k
    labels[r] = bk
    best[r] = bd


@njit(**_JIT)
def _rest_of_chain_vec(meta, ptr, idx, val, first, other):
    """Factors 1 .. Q-1 (apply order) on `first` = S_Q x; returns the buffer holding V x."""
    Q = meta.shape[0] - 1
    cur = first
    nxt = other
    for q in range(1, Q):
        _factor_vec(ptr, meta[q, 2], meta[q, 0], meta[q, 3], idx, val, cur, nxt)
        cur, nxt = nxt, cur
    return cur


@njit(**_JIT)
def chain_sample_dense(
    X,                              # IN  (n, D) C-contiguous, dtype of val
    meta, ptr, idx, val, c_sq,      # IN  packed chain, (K,) float64 norms
    labels, best,                   # OUT (n,) int32 / float64
):
    m = _max_rows(meta)
    buf0 = np.empty(m, dtype=val.dtype)
    buf1 = np.empty(m, dtype=val.dtype)
    for r in range(X.shape[0]):
        _factor_vec(ptr, meta[0, 2], meta[0, 0], meta[0, 3], idx, val, X[r], buf0)
        y = _rest_of_chain_vec(meta, ptr, idx, val, buf0, buf1)
        _argmin_vec(y, c_sq, r, labels, best)


@njit(**_JIT)
def chain_sample_csr(
    data, indices, indptr,          # IN  CSR samples, data of the dtype of val
    meta, ptr, idx, val, c_sq,      # IN  packed chain, (K,) float64 norms
    labels, best,                   # OUT (n,)
):
    m = _max_rows(meta)
    buf0 = np.empty(m, dtype=val.dtype)
    buf1 = np.empty(m, dtype=val.dtype)
    for r in range(indptr.shape[0] - 1):
        _scatter_vec_csr(data, indices, indptr, r, meta, ptr, idx, val, buf0)
        y = _rest_of_chain_vec(meta, ptr, idx, val, buf0, buf1)
        _argmin_vec(y, c_sq, r, labels, best)


# --------------------------------------------------------------------------- #
# Argmin over dot products computed elsewhere (dense and scipy paths)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def argmin_rows(
    G,                              # IN  (m, K) dot products x_i . v_k (any float dtype)
    c_sq,                           # IN  (K,) float64
    r0,                             # IN  first output row
    labels, best,                   # OUT written at rows r0 .. r0 + m - 1
):
    for t in range(G.shape[0]):
        bd = np.inf
        bk = 0
        for k in range(G.shape[1]):
            d = c_sq[k] - 2.0 * np.float64(G[t, k])
            if d < bd:
                bd = d
                bk = k
        labels[r0 + t] = bk
        best[r0 + t] = bd


@njit(**_JIT)
def argmin_cols(
    Y,                              # IN  (K, m) dot products, one column per sample
    c_sq,                           # IN  (K,) float64
    labels, best,                   # OUT (m,)
):
    m = Y.shape[1]
    for t in range(m):
        best[t] = np.inf
        labels[t] = 0
    for k in range(Y.shape[0]):
        c = c_sq[k]
        for t in range(m):
            d = c - 2.0 * np.float64(Y[k, t])
            if d < best[t]:
                best[t] = d
                labels[t] = k


# --------------------------------------------------------------------------- #
# Dots with the mean of a centred chain (float64 accumulation, one row each)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def row_dots_dense(
    X,                              # IN  (n, D) C-contiguous
    v,                              # IN  (D,) float64
    out,                            # OUT (n,) float64 x_i . v
):
    for i in range(X.shape[0]):
        acc = 0.0
        for j in range(X.shape[1]):
            acc += np.float64(X[i, j]) * v[j]
        out[i] = acc


@njit(**_JIT)
def row_dots_csr(
    data, indices, indptr,          # IN  CSR rows
    v,                              # IN  (D,) float64
    out,                            # OUT (n,) float64 x_i . v
):
    for i in range(indptr.shape[0] - 1):
        acc = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            acc += np.float64(data[p]) * v[indices[p]]
        out[i] = acc
