"""Search routines of :class:`qkm.ClusterIndex`: probing through the operator, exact search inside lists.

Layout of a fitted index: the training rows sorted by cluster (stable, so
rows keep their original order inside a list), ``offsets[c]:offsets[c + 1]``
is list ``c``, ``row_ids[p]`` the original index of stored row ``p``.

A query batch is searched list by list (IVF style): every (query, probed
list) pair is grouped by list, the distances of a block of queries to all
rows of the list come from one BLAS / sparse product
``||x||^2 - 2 X_q X_c^T + ||y||^2``, and each list contributes its best
``k`` candidates; the final ``k`` are re-scored exactly in float64 and
sorted by (distance, index).
"""

import numpy as np
import scipy.sparse as sp

from . import _config
from ._nystroem import row_sq_norms

__all__ = ["cluster_sq_distances", "nearest_clusters", "probe_lists", "search_lists", "select_neighbors"]

#: Entries of one (queries x list rows) distance block (about 32 MB in float64).
BLOCK_ELEMENTS = 1 << 22


def cluster_sq_distances(operator, X):
    """Squared distances of every row of ``X`` to every centroid, (n, K) float64, in row blocks."""
    n = X.shape[0]
    out = np.empty((n, operator.n_clusters), dtype=np.float64)
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, n, step):
        out[start:start + step] = operator.sq_distances(X[start:start + step])
    return out


def nearest_clusters(operator, X):
    """Nearest centroid of every row (lowest index on ties), int64, from ``operator.sq_distances``."""
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int64)
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, n, step):
        labels[start:start + step] = np.argmin(operator.sq_distances(X[start:start + step]), axis=1)
    return labels


def _sorted_by_value_then_index(values, columns):
    """``columns`` reordered by (value, column) along axis 1."""
    order = np.lexsort((columns, values), axis=1)
    return np.take_along_axis(columns, order, axis=1)


def probe_lists(sq, sizes, nprobe, k):
    """Lists to probe for every query: the ``nprobe`` nearest non-empty ones, widened to hold ``k`` rows.

    Parameters
    ----------
    sq : ndarray of shape (n, K)
        Squared distances of the queries to the centroids.
    sizes : ndarray of shape (K,)
        Rows per list; empty lists are never probed.
    nprobe, k : int
        ``1 <= k <= sizes.sum()``.

    Returns
    -------
    probe : ndarray of shape (n, p_max), int64
        Probed lists of each query, nearest first (ties: lowest index),
        padded with -1. A query whose ``nprobe`` nearest lists hold fewer
        than ``k`` rows probes the next nearest until they do.
    """
    n, K = sq.shape
    nonempty = sizes > 0
    sq = np.where(nonempty[None, :], sq, np.inf)
    p = min(int(nprobe), int(nonempty.sum()))
    if p == 1:  # argmin: lowest index on ties
        probe = np.argmin(sq, axis=1)[:, None]
        if k == 1:
            return probe
        cols = probe
    elif p < K:
        cols = np.argpartition(sq, p - 1, axis=1)[:, :p]
    else:
        cols = np.broadcast_to(np.arange(K), (n, K)).copy()
    probe = _sorted_by_value_then_index(np.take_along_axis(sq, cols, axis=1), cols).astype(np.int64)
    short = np.flatnonzero(sizes[probe].sum(axis=1) < k)
    if short.size == 0:
        return probe
    full = _sorted_by_value_then_index(sq[short], np.broadcast_to(np.arange(K), (short.size, K)).copy())
    cumulative = np.cumsum(sizes[full], axis=1)
    need = (cumulative < k).sum(axis=1) + 1
    p_max = max(p, int(need.max()))
    out = np.full((n, p_max), -1, dtype=np.int64)
    out[:, :p] = probe
    out[short] = np.where(np.arange(p_max)[None, :] < need[:, None], full[:, :p_max], -1)
    return out


def _dot_t(A, B):
    """``A @ B.T`` as a dense float64 ndarray, for dense or CSR ``A`` and ``B``."""
    if sp.issparse(B):
        out = (A @ B.T).toarray() if sp.issparse(A) else (B @ A.T).T
    else:
        out = A @ B.T
    return np.asarray(out, dtype=np.float64)


def search_lists(Xq, xq_sq, probe, store, store_sq, offsets, k):
    """Best ``k`` rows of every probed list for every query (squared distances by the expansion).

    Returns
    -------
    cand_sq : ndarray of shape (n, p_max * k), float64
        Candidate squared distances; ``inf`` for unused slots.
    cand_pos : ndarray of shape (n, p_max * k), int64
        Stored-row positions of the candidates; -1 for unused slots.
    """
    n, p_max = probe.shape
    width = p_max * k
    cand_sq = np.full(n * width, np.inf)
    cand_pos = np.full(n * width, -1, dtype=np.int64)
    q, rank = np.nonzero(probe >= 0)
    lists = probe[q, rank]
    order = np.argsort(lists, kind="stable")
    q, lists = q[order], lists[order]
    first_slot = q * width + rank[order] * k  # flat index of the pair's first candidate slot
    bounds = (np.flatnonzero(np.diff(lists)) + 1).tolist()
    starts, ends = [0] + bounds, bounds + [int(lists.size)]
    bounds_of = offsets.tolist()
    dense = not sp.issparse(Xq) and not sp.issparse(store)
    for s, e in zip(starts, ends):
        c = int(lists[s])
        lo, hi = bounds_of[c], bounds_of[c + 1]
        rows, rows_sq = store[lo:hi], store_sq[lo:hi]
        n_c = hi - lo
        step = max(1, BLOCK_ELEMENTS // n_c)
        for b in range(s, e, step):
            stop = min(b + step, e)
            qb = q[b:stop]
            d = Xq[qb] @ rows.T if dense else _dot_t(Xq[qb], rows)
            if d.dtype != np.float64:
                d = d.astype(np.float64)
            d *= -2.0
            d += rows_sq
            slots = first_slot[b:stop]
            if k == 1:
                j = np.argmin(d, axis=1)
                cand_sq[slots] = d[np.arange(stop - b), j] + xq_sq[qb]
                cand_pos[slots] = lo + j
                continue
            if n_c <= k:
                j = np.broadcast_to(np.arange(n_c), (stop - b, n_c))
            else:
                j = np.argpartition(d, k - 1, axis=1)[:, :k]
            slots = slots[:, None] + np.arange(j.shape[1])[None, :]
            cand_sq[slots] = np.take_along_axis(d, j, axis=1) + xq_sq[qb, None]
            cand_pos[slots] = lo + j
    return cand_sq.reshape(n, width), cand_pos.reshape(n, width)


def _pair_sq_distances(Xq, xq_sq, store, store_sq, pos):
    """Exact ``||x_i - y_pos[i, j]||^2`` in float64, (n, k)."""
    n, k = pos.shape
    out = np.empty((n, k), dtype=np.float64)
    if not sp.issparse(Xq) and not sp.issparse(store):
        step = max(1, _config.DENSE_BLOCK_ROWS // 4)
        for start in range(0, n, step):
            xq = np.asarray(Xq[start:start + step], dtype=np.float64)
            for j in range(k):
                diff = xq - store[pos[start:start + step, j]]
                out[start:start + step, j] = np.einsum("ij,ij->i", diff, diff)
        return out
    Xq = sp.csr_matrix(Xq, dtype=np.float64) if sp.issparse(Xq) else np.asarray(Xq, dtype=np.float64)
    for j in range(k):
        rows = store[pos[:, j]]
        rows = sp.csr_matrix(rows, dtype=np.float64) if sp.issparse(rows) else np.asarray(rows, dtype=np.float64)
        prod = Xq.multiply(rows) if sp.issparse(Xq) else rows.multiply(Xq)
        dots = np.asarray(sp.csr_matrix(prod).sum(axis=1)).ravel()
        out[:, j] = xq_sq + store_sq[pos[:, j]] - 2.0 * dots
    return np.maximum(out, 0.0, out=out)


def select_neighbors(Xq, xq_sq, cand_sq, cand_pos, store, store_sq, row_ids, k):
    """The ``k`` nearest candidates, re-scored exactly: (distances, original indices), sorted by (distance, index)."""
    n_rows = row_ids.shape[0]
    if cand_pos.shape[1] == k:  # one list probed, holding at least k rows: every slot is used
        pos = cand_pos
    else:
        ids = np.where(cand_pos >= 0, row_ids[np.maximum(cand_pos, 0)], n_rows)
        order = np.lexsort((ids, cand_sq), axis=1)[:, :k]
        pos = np.take_along_axis(cand_pos, order, axis=1)
    dist = np.sqrt(_pair_sq_distances(Xq, xq_sq, store, store_sq, pos))
    ids = row_ids[pos]
    if k == 1:
        return dist, ids
    final = np.lexsort((ids, dist), axis=1)
    return np.take_along_axis(dist, final, axis=1), np.take_along_axis(ids, final, axis=1)


def stored_row_sq_norms(store):
    """``||y||^2`` of the stored rows, float64."""
    return row_sq_norms(store)
