"""numba kernels shared by Lloyd and Elkan (private; no input validation here).

Conventions (scikit-learn's ``_k_means_common.pyx``): arrays in, preallocated
buffers out, every argument marked ``# IN`` or ``# OUT``. Work is split into
fixed chunks of rows or clusters, never by thread, and every reduction runs in
a fixed order, so results are bit-identical for any thread count.

"Partial" distances are ``||c_j||^2 - 2 x.c_j``; adding ``||x||^2`` gives the
squared distance. Lloyd and Elkan compare partials computed by the same
operation sequence, so they pick the same labels.
"""

import numpy as np
from numba import njit, prange

from . import _config
from ._config import _JIT, _JIT_DOT


# --------------------------------------------------------------------------- #
# Plain numpy primitive shared by every centre update
# --------------------------------------------------------------------------- #
def centroid_sq_norms(C):
    """Squared row norms of the centroids, float64.

    Computed with ``np.einsum`` exactly as scikit-learn's ``row_norms`` does,
    so that points at (rounding-level) equal distance from several centroids
    break the tie the same way scikit-learn does on float64 data.
    """
    if C.dtype == np.float64:
        return np.einsum("ij,ij->i", C, C)
    return np.einsum("ij,ij->i", C, C, dtype=np.float64)


# --------------------------------------------------------------------------- #
# Assignment (E-step)
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT)
def assign_sparse(
    data, indices, indptr,          # IN  CSR arrays of X
    x_sq,                           # IN  (n,) float64 squared row norms
    rows,                           # IN  (m,) rows to assign
    CT,                             # IN  (D, K) dense C^T (unused if use_sparse_ct)
    ct_ptr, ct_idx, ct_val,         # IN  CSR of C^T (used if use_sparse_ct)
    use_sparse_ct,                  # IN  bool
    c_sq,                           # IN  (K,) float64 squared centroid norms
    err_rel,                        # IN  relative rounding slack for bounds
    labels,                         # OUT (n,) int32, written at `rows`
    partial_best,                   # OUT (n,) float64, best partial at `rows`
    lb, write_lb,                   # OUT (n, K) lower bounds on distances (if write_lb)
):
    """Fused sparse-X x dense-or-sparse C^T product with argmin: no N x K buffer."""
    K = c_sq.shape[0]
    m = rows.shape[0]
    chunk = _config.CHUNK_SIZE
    n_chunks = (m + chunk - 1) // chunk
    for ch in prange(n_chunks):
        acc = np.empty(K, dtype=np.float64)
        for t in range(ch * chunk, min(m, (ch + 1) * chunk)):
            i = rows[t]
            acc[:] = 0.0
            if use_sparse_ct:
                for p in range(indptr[i], indptr[i + 1]):
                    v = np.float64(data[p])
                    k = indices[p]
                    for q in range(ct_ptr[k], ct_ptr[k + 1]):
                        acc[ct_idx[q]] += v * ct_val[q]
            else:
                for p in range(indptr[i], indptr[i + 1]):
                    v = np.float64(data[p])
                    row = CT[indices[p]]
                    for j in range(K):
                        acc[j] += v * row[j]
            _finish_row(i, acc, c_sq, x_sq[i], err_rel, labels, partial_best, lb, write_lb)


@njit(**_JIT)
def assign_dense_small(
    G,                              # IN  (b, K) X @ C^T from BLAS
    X,                              # IN  (b, D) the rows
    err_rel,                        # IN
    c_sq,                           # IN  (K,) float64
    labels, partial_best,           # OUT (b,)
):
    """:func:`assign_dense_block` for a few rows on the calling thread (``x_sq`` computed here, the same sums)."""
    b, K = G.shape
    acc = np.empty(K, dtype=np.float64)
    x_sq = np.empty(b, dtype=np.float64)
    lb = np.zeros((0, 0), dtype=np.float64)
    for t in range(b):
        s = 0.0
        for k in range(X.shape[1]):
            v = np.float64(X[t, k])
            s += v * v
        x_sq[t] = s
    for t in range(b):
        for j in range(K):
            acc[j] = G[t, j]
        _finish_row(t, acc, c_sq, x_sq[t], err_rel, labels, partial_best, lb, False)


@njit(parallel=True, **_JIT)
def assign_dense_block(
    G,                              # IN  (b, K) X_block @ C^T from BLAS
    block_rows,                     # IN  (b,) row ids of the block in X
    x_sq,                           # IN  (n,) float64
    c_sq,                           # IN  (K,) float64
    err_rel,                        # IN
    labels, partial_best,           # OUT (n,)
    lb, write_lb,                   # OUT (n, K) if write_lb
):
    """Argmin over one BLAS block of dot products."""
    b, K = G.shape
    chunk = _config.CHUNK_SIZE
    n_chunks = (b + chunk - 1) // chunk
    for ch in prange(n_chunks):
        acc = np.empty(K, dtype=np.float64)
        for t in range(ch * chunk, min(b, (ch + 1) * chunk)):
            for j in range(K):
                acc[j] = G[t, j]
            i = block_rows[t]
            _finish_row(i, acc, c_sq, x_sq[i], err_rel, labels, partial_best, lb, write_lb)


@njit(inline="always", **_JIT)
def _finish_row(i, acc, c_sq, xs, err_rel, labels, partial_best, lb, write_lb):
    K = c_sq.shape[0]
    best = np.inf
    best_j = 0
    for j in range(K):
        d = c_sq[j] - 2.0 * acc[j]
        if d < best:
            best = d
            best_j = j
    labels[i] = best_j
    partial_best[i] = best
    if write_lb:
        for j in range(K):
            sq = xs + c_sq[j] - 2.0 * acc[j]
            sq -= err_rel * (xs + c_sq[j])
            lb[i, j] = np.sqrt(sq) if sq > 0.0 else 0.0


@njit(parallel=True, **_JIT)
def sq_distances_from_partials(
    partial, rows, x_sq,            # IN
    out,                            # OUT (n,) squared distances (clipped at 0) at `rows`
):
    for t in prange(rows.shape[0]):
        i = rows[t]
        d = partial[i] + x_sq[i]
        out[i] = d if d > 0.0 else 0.0


# --------------------------------------------------------------------------- #
# Pairwise partials for Elkan and for exact distances to the own centroid
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT)
def pair_partials_sparse(
    data, indices, indptr,          # IN  CSR of X
    C,                              # IN  (K, D) centroids, row-major
    c_sq,                           # IN  (K,)
    pair_i, pair_j,                 # IN  (p,) point and centroid ids, ideally grouped by j
    out,                            # OUT (p,) partials ||c_j||^2 - 2 x_i.c_j
):
    p = pair_i.shape[0]
    chunk = _config.CHUNK_SIZE
    for ch in prange((p + chunk - 1) // chunk):
        for t in range(ch * chunk, min(p, (ch + 1) * chunk)):
            i = pair_i[t]
            j = pair_j[t]
            crow = C[j]
            s = 0.0
            for q in range(indptr[i], indptr[i + 1]):
                s += np.float64(data[q]) * crow[indices[q]]
            out[t] = c_sq[j] - 2.0 * s


@njit(parallel=True, **_JIT_DOT)
def pair_partials_dense(X, C, c_sq, pair_i, pair_j, out):
    """Dense twin of :func:`pair_partials_sparse` (same arguments, X dense).

    Dense partials are compared with BLAS ones, never bit for bit, so this
    dot product may be vectorised (``_config.FASTMATH_DENSE_DOT``); its
    rounding stays far inside the bounds' slack.
    """
    p = pair_i.shape[0]
    D = X.shape[1]
    chunk = _config.CHUNK_SIZE
    for ch in prange((p + chunk - 1) // chunk):
        for t in range(ch * chunk, min(p, (ch + 1) * chunk)):
            i = pair_i[t]
            j = pair_j[t]
            s = 0.0
            for k in range(D):
                s += np.float64(X[i, k]) * C[j, k]
            out[t] = c_sq[j] - 2.0 * s


# --------------------------------------------------------------------------- #
# M-step helpers (the sums themselves follow qkm._reduce's fixed order)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def group_by_label(labels, K, order, offsets):
    """Counting sort of the rows by label (stable).

    order   : OUT (n,) row ids grouped by cluster, ascending within a cluster
    offsets : OUT (K + 1,) cluster j owns order[offsets[j]:offsets[j + 1]]
    """
    n = labels.shape[0]
    offsets[:] = 0
    for i in range(n):
        offsets[labels[i] + 1] += 1
    for j in range(K):
        offsets[j + 1] += offsets[j]
    fill = offsets[:-1].copy()
    for i in range(n):
        j = labels[i]
        order[fill[j]] = i
        fill[j] += 1


@njit(inline="always", **_JIT)
def _store_mean(j, acc, inv, C, shift_sq):
    """C[j] <- acc * inv in C's dtype; shift_sq[j] <- squared move."""
    _store_mean_from(j, acc, inv, C, C, shift_sq)


@njit(inline="always", **_JIT)
def _store_mean_from(j, acc, inv, C_old, C, shift_sq):
    """C[j] <- acc * inv in C's dtype; shift_sq[j] <- squared move from C_old[j] (may be C itself)."""
    D = acc.shape[0]
    s = 0.0
    for k in range(D):
        old = np.float64(C_old[j, k])
        C[j, k] = acc[k] * inv
        dv = np.float64(C[j, k]) - old
        s += dv * dv
    shift_sq[j] = s


@njit(parallel=True, **_JIT)
def row_sq_norms_sparse(data, indptr, out):
    """OUT out[i] = ||x_i||^2 (float64) for CSR rows."""
    n = indptr.shape[0] - 1
    for i in prange(n):
        s = 0.0
        for q in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[q])
            s += v * v
        out[i] = s


@njit(parallel=True, **_JIT)
def row_sq_norms_dense(X, out):
    """OUT out[i] = ||x_i||^2 (float64) for dense rows."""
    n, D = X.shape
    for i in prange(n):
        s = 0.0
        for k in range(D):
            v = np.float64(X[i, k])
            s += v * v
        out[i] = s


@njit(**_JIT)
def max_abs_or_inf(X):
    """Largest ``|x|`` of a dense 2-D array, ``inf`` if any value is NaN or infinite (one serial pass)."""
    n, D = X.shape
    m = 0.0
    for i in range(n):
        for k in range(D):
            v = abs(np.float64(X[i, k]))
            if not v <= 1.7976931348623157e308:       # NaN or inf
                return np.inf
            if v > m:
                m = v
    return m


# --------------------------------------------------------------------------- #
# C^T in the layout the fused kernel wants
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT)
def transpose_into(C, CT):
    """OUT CT = C.T, tiled so both sides stay in cache."""
    K, D = C.shape
    tile = 64
    n_tiles = (D + tile - 1) // tile
    for b in prange(n_tiles):
        k0 = b * tile
        k1 = min(D, k0 + tile)
        for j0 in range(0, K, tile):
            j1 = min(K, j0 + tile)
            for k in range(k0, k1):
                for j in range(j0, j1):
                    CT[k, j] = C[j, k]


@njit(parallel=True, **_JIT)
def column_nnz(C, out):
    """OUT out[k] = number of nonzero C[:, k]."""
    K, D = C.shape
    tile = 256
    for b in prange((D + tile - 1) // tile):
        k0 = b * tile
        k1 = min(D, k0 + tile)
        for k in range(k0, k1):
            out[k] = 0
        for j in range(K):
            for k in range(k0, k1):
                if C[j, k] != 0:
                    out[k] += 1


@njit(parallel=True, **_JIT)
def fill_sparse_transpose(C, ct_ptr, ct_idx, ct_val):
    """OUT CSR of C^T given its row pointer ct_ptr (from :func:`column_nnz`)."""
    K, D = C.shape
    tile = 256
    for b in prange((D + tile - 1) // tile):
        k0 = b * tile
        k1 = min(D, k0 + tile)
        fill = ct_ptr[k0:k1].copy()
        for j in range(K):
            for k in range(k0, k1):
                v = C[j, k]
                if v != 0:
                    q = fill[k - k0]
                    ct_idx[q] = j
                    ct_val[q] = v
                    fill[k - k0] = q + 1


# --------------------------------------------------------------------------- #
# Elkan bookkeeping
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT)
def elkan_shift_bounds(labels, shift, upper, lb):
    """IN/OUT bounds after the centres moved by ``shift`` (distances, not squared)."""
    n, K = lb.shape
    for i in prange(n):
        upper[i] += shift[labels[i]]
        for j in range(K):
            v = lb[i, j] - shift[j]
            lb[i, j] = v if v > 0.0 else 0.0


@njit(parallel=True, **_JIT)
def elkan_count_candidates(
    labels, upper, lb, half_cc, s,  # IN
    counts,                         # OUT (n,) candidate centroids per point (0 = skip)
):
    """Candidates j != l_i with u_i > lb_ij and u_i > d(c_l, c_j) / 2."""
    n, K = lb.shape
    for i in prange(n):
        l = labels[i]
        u = upper[i]
        c = 0
        if u > s[l]:
            for j in range(K):
                if j != l and u > lb[i, j] and u > half_cc[l, j]:
                    c += 1
        counts[i] = c


@njit(parallel=True, **_JIT)
def elkan_fill_candidates(labels, upper, lb, half_cc, ptr, pair_j):
    """OUT pair_j[ptr[i]:ptr[i+1]] = candidate centroids of point i, ascending."""
    n, K = lb.shape
    for i in prange(n):
        if ptr[i + 1] == ptr[i]:
            continue
        l = labels[i]
        u = upper[i]
        t = ptr[i]
        for j in range(K):
            if j != l and u > lb[i, j] and u > half_cc[l, j]:
                pair_j[t] = j
                t += 1


@njit(parallel=True, **_JIT)
def elkan_pick(
    rows, ptr, pair_j, pair_partial,  # IN candidate pairs, point-major
    x_sq, c_sq, err_rel,              # IN
    labels, partial_best,             # IN/OUT own label and its partial
    upper, lb,                        # OUT tight upper bound, lower bounds at computed pairs
):
    """Choose the best of the own centroid and the computed candidates."""
    for t in prange(rows.shape[0]):
        i = rows[t]
        best = partial_best[i]
        best_j = labels[i]
        xs = x_sq[i]
        for q in range(ptr[i], ptr[i + 1]):
            j = pair_j[q]
            d = pair_partial[q]
            sq = xs + d - err_rel * (xs + c_sq[j])
            lb[i, j] = np.sqrt(sq) if sq > 0.0 else 0.0
            if d < best or (d == best and j < best_j):
                best = d
                best_j = j
        labels[i] = best_j
        partial_best[i] = best
        sq = xs + best + err_rel * (xs + c_sq[best_j])
        upper[i] = np.sqrt(sq) if sq > 0.0 else 0.0
