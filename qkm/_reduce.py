"""Sums over rows in one fixed order, whatever the rows are split into (private).

Floating-point addition is not associative, so a sum depends on the order of
its terms. Every sum over rows that decides a result (cluster sums, WCSS,
column variances) follows one rule here, so that the single-machine fit and a
fit over shards (:mod:`qkm.distributed`) give bit-identical numbers:

* rows are cut into blocks of ``block_rows`` consecutive rows, counted from
  global row 0 (``_config.REDUCE_BLOCK_ROWS``);
* the terms of one block are added in row order, from ``0.0``;
* the block sums are combined along the aligned binary tree over block ids:
  node ``(level l, index i)`` covers blocks ``[i 2^l, (i + 1) 2^l)`` and is
  the sum of its two halves; a half without terms is skipped (``0.0 + x = x``
  exactly, so skipping and adding a zero agree).

A shard whose rows are exactly one node of that tree (``qkm shard`` writes
such shards) computes the node value alone, and combining the shard values
along the same tree (:func:`merge_plan`) gives the same bits as one pass over
all rows. With at most one block the rule is the plain sequential sum.

The tree is evaluated from left to right with a stack (operator precedence):
two neighbouring groups are joined at the level ``bit_length(b XOR b')`` of
their last and first blocks; lower levels bind first.
"""

import numpy as np
import numba
from numba import njit, prange

from . import _config
from ._config import _JIT
from ._kernels import _store_mean, _store_mean_from

__all__ = ["merge_plan", "n_levels", "tree_sum_rows", "column_variances", "column_sums_node",
           "column_sq_deviations_node", "cluster_sums_sparse", "cluster_sums_dense"]


def n_levels(n_rows, block_rows, row0=0):
    """Stack depth that evaluates the tree over rows ``[0, row0 + n_rows)``."""
    last_block = max(row0 + n_rows - 1, 0) // block_rows
    return int(last_block).bit_length() + 2


@njit(inline="always", **_JIT)
def _gap(a, b):
    """Tree level at which blocks ``a`` and ``b`` meet: ``bit_length(a XOR b)``."""
    x = a ^ b
    level = 0
    while x:
        x >>= 1
        level += 1
    return level


def merge_plan(first_blocks):
    """Order in which per-group values are added so the sum follows the block tree.

    Parameters
    ----------
    first_blocks : sequence of int
        First block id of each group (nonempty groups in row order; each an
        aligned node of the tree).

    Returns
    -------
    plan : list of (int, int)
        ``(a, b)``: add the value of group ``b`` into group ``a``, in this
        order; the total ends in group 0.

    Examples
    --------
    >>> merge_plan([0, 2, 4, 6])   # ((0 + 1) + (2 + 3))
    [(0, 1), (2, 3), (0, 2)]
    """
    plan, stack, gaps = [], [], []
    last = None
    for g, block in enumerate(first_blocks):
        gap = 0 if last is None else (int(last) ^ int(block)).bit_length()
        while len(stack) >= 2 and gaps[-1] < gap:
            right = stack.pop()
            gaps.pop()
            plan.append((stack[-1], right))
        stack.append(g)
        gaps.append(gap)
        last = block
    while len(stack) >= 2:
        right = stack.pop()
        gaps.pop()
        plan.append((stack[-1], right))
    return plan


# --------------------------------------------------------------------------- #
# Sums of per-row scalars (WCSS)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _tree_sum_rows(values, rows_lo, rows_hi, row0, block_rows, n_lev):
    stack = np.zeros(n_lev)
    gaps = np.zeros(n_lev, dtype=np.int64)
    top = -1
    last = -1
    start = rows_lo
    while start < rows_hi:
        b = (row0 + start) // block_rows
        stop = min(rows_hi, (b + 1) * block_rows - row0)
        s = 0.0
        for i in range(start, stop):
            s += values[i]
        g = 0 if last < 0 else _gap(last, b)
        while top >= 1 and gaps[top] < g:
            stack[top - 1] += stack[top]
            top -= 1
        top += 1
        stack[top] = s
        gaps[top] = g
        last = b
        start = stop
    while top >= 1:
        stack[top - 1] += stack[top]
        top -= 1
    return stack[0] if top == 0 else 0.0


def tree_sum_rows(values, row0=0, block_rows=None):
    """Sum of ``values`` (one per row, rows ``row0 ...``) in the block-tree order.

    Examples
    --------
    >>> float(tree_sum_rows(np.array([1.0, 2.0, 3.0]), block_rows=2))
    6.0
    """
    block_rows = _config.REDUCE_BLOCK_ROWS if block_rows is None else int(block_rows)
    values = np.ascontiguousarray(values, dtype=np.float64)
    return float(_tree_sum_rows(values, 0, values.shape[0], int(row0), block_rows,
                                n_levels(values.shape[0], block_rows, row0)))


# --------------------------------------------------------------------------- #
# Column sums and squared deviations (the tolerance's feature variances)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _push_dense(stack, gaps, top, last, b, block_vals):
    """Push one block's vector, first joining the groups that bind tighter."""
    g = 0 if last < 0 else _gap(last, b)
    while top >= 1 and gaps[top] < g:
        stack[top - 1] += stack[top]
        top -= 1
    top += 1
    stack[top] = block_vals
    gaps[top] = g
    return top


@njit(**_JIT)
def _finish_dense(stack, top, out):
    while top >= 1:
        stack[top - 1] += stack[top]
        top -= 1
    if top == 0:
        out[:] = stack[0]
    else:
        out[:] = 0.0


@njit(parallel=True, **_JIT)
def _column_node_dense(X, mean, deviations, row0, block_rows, n_lev, out):
    """OUT out[k] = tree sum over rows of X[i, k] (or (X[i, k] - mean[k])^2 if deviations)."""
    n, D = X.shape
    tile = 64
    for t in prange((D + tile - 1) // tile):
        k0 = t * tile
        k1 = min(D, k0 + tile)
        stack = np.zeros((n_lev, k1 - k0))
        gaps = np.zeros(n_lev, dtype=np.int64)
        acc = np.empty(k1 - k0)
        top = -1
        last = -1
        start = 0
        while start < n:
            b = (row0 + start) // block_rows
            stop = min(n, (b + 1) * block_rows - row0)
            acc[:] = 0.0
            for i in range(start, stop):
                for k in range(k0, k1):
                    v = np.float64(X[i, k])
                    if deviations:
                        d = v - mean[k]
                        acc[k - k0] += d * d
                    else:
                        acc[k - k0] += v
            top = _push_dense(stack, gaps, top, last, b, acc)
            last = b
            start = stop
        _finish_dense(stack, top, out[k0:k1])


@njit(**_JIT)
def _column_node_sparse(data, indices, indptr, D, mean, deviations, row0, block_rows, n_lev, out):
    """Sparse twin of :func:`_column_node_dense`; implicit zeros count as ``(0 - mean)^2``."""
    n = indptr.shape[0] - 1
    stack = np.zeros((n_lev, D))
    gaps = np.zeros(n_lev, dtype=np.int64)
    acc = np.empty(D)
    nnz_col = np.empty(D, dtype=np.int64)
    top = -1
    last = -1
    start = 0
    while start < n:
        b = (row0 + start) // block_rows
        stop = min(n, (b + 1) * block_rows - row0)
        acc[:] = 0.0
        nnz_col[:] = 0
        for i in range(start, stop):
            for q in range(indptr[i], indptr[i + 1]):
                k = indices[q]
                v = np.float64(data[q])
                if deviations:
                    d = v - mean[k]
                    acc[k] += d * d
                    nnz_col[k] += 1
                else:
                    acc[k] += v
        if deviations:
            for k in range(D):
                acc[k] += (stop - start - nnz_col[k]) * (mean[k] * mean[k])
        top = _push_dense(stack, gaps, top, last, b, acc)
        last = b
        start = stop
    _finish_dense(stack, top, out)


def _column_node(X, mean, row0, block_rows, n_lev):
    D = X.shape[1]
    out = np.zeros(D)
    deviations = mean is not None
    mean = np.zeros(D) if mean is None else np.asarray(mean, dtype=np.float64)
    if hasattr(X, "indptr"):
        _column_node_sparse(X.data, X.indices, X.indptr, D, mean, deviations, row0, block_rows, n_lev, out)
    else:
        _column_node_dense(X, mean, deviations, row0, block_rows, n_lev, out)
    return out


def column_sums_node(X, row0, block_rows, n_lev):
    """Column sums of the rows of ``X`` (global rows ``row0 ...``): one node of the block tree."""
    return _column_node(X, None, row0, block_rows, n_lev)


def column_sq_deviations_node(X, mean, row0, block_rows, n_lev):
    """Column sums of ``(x - mean)^2`` (implicit zeros included): one node of the block tree."""
    return _column_node(X, mean, row0, block_rows, n_lev)


def column_variances(X, block_rows=None):
    """Population variance of every column, two passes in the block-tree order.

    Parameters
    ----------
    X : ndarray or scipy.sparse.csr_matrix of shape (n_samples, n_features)

    Returns
    -------
    variances : ndarray of shape (n_features,), float64

    Examples
    --------
    >>> column_variances(np.array([[0.0, 1.0], [2.0, 1.0]])).tolist()
    [1.0, 0.0]
    """
    block_rows = _config.REDUCE_BLOCK_ROWS if block_rows is None else int(block_rows)
    n = X.shape[0]
    n_lev = n_levels(n, block_rows)
    mean = column_sums_node(X, 0, block_rows, n_lev) / n
    return column_sq_deviations_node(X, mean, 0, block_rows, n_lev) / n


# --------------------------------------------------------------------------- #
# Per-cluster sums of rows (the M-step)
# --------------------------------------------------------------------------- #
@njit(inline="always", **_JIT)
def _merge_sparse(vals, mark, tidx, tn, top):
    """vals[top - 1] += vals[top] over the touched entries of ``top``; ``top`` left clean."""
    lo = top - 1
    for u in range(tn[top]):
        f = tidx[top, u]
        if not mark[lo, f]:
            mark[lo, f] = True
            tidx[lo, tn[lo]] = f
            tn[lo] += 1
        vals[lo, f] += vals[top, f]
        vals[top, f] = 0.0
        mark[top, f] = False
    tn[top] = 0


@njit(parallel=True, **_JIT)
def cluster_sums_sparse(
    data, indices, indptr,          # IN  CSR of X
    order, offsets,                 # IN  rows grouped by cluster, ascending (group_by_label)
    changed,                        # IN  (K,) bool: clusters to compute
    row0, block_rows, n_lev,        # IN  global row of local row 0, block size, stack depth
    n_tasks,                        # IN  work units (any grouping of clusters gives the same numbers)
    store_means,                    # IN  True: C/shift_sq are the outputs; False: the CSR sums below
    C, shift_sq,                    # IN/OUT (K, D) centres -> means, (K,) squared moves (store_means)
    cap_ptr,                        # IN  (K + 1,) room for cluster j's sums: out_*[cap_ptr[j]:cap_ptr[j + 1]]
    out_idx, out_val, out_cnt,      # OUT sorted columns and float64 sums of cluster j, their count
):
    """Sum of each cluster's rows in the block-tree order; touched entries only."""
    K = offsets.shape[0] - 1
    D = C.shape[1]  # (0, D) when not store_means
    for task in prange(n_tasks):
        vals = np.zeros((n_lev, D))
        mark = np.zeros((n_lev, D), dtype=np.bool_)
        tidx = np.empty((n_lev, D), dtype=np.int32)
        tn = np.zeros(n_lev, dtype=np.int64)
        gaps = np.zeros(n_lev, dtype=np.int64)
        for j in range(task, K, n_tasks):
            n_j = offsets[j + 1] - offsets[j]
            if n_j == 0 or not changed[j]:
                if store_means:
                    shift_sq[j] = 0.0
                continue
            top = -1
            last = -1
            for t in range(offsets[j], offsets[j + 1]):
                i = order[t]
                b = (row0 + i) // block_rows
                if b != last:
                    g = 0 if last < 0 else _gap(last, b)
                    while top >= 1 and gaps[top] < g:
                        _merge_sparse(vals, mark, tidx, tn, top)
                        top -= 1
                    top += 1
                    gaps[top] = g
                    last = b
                for q in range(indptr[i], indptr[i + 1]):
                    f = indices[q]
                    if not mark[top, f]:
                        mark[top, f] = True
                        tidx[top, tn[top]] = f
                        tn[top] += 1
                    vals[top, f] += data[q]
            while top >= 1:
                _merge_sparse(vals, mark, tidx, tn, top)
                top -= 1
            if store_means:
                _store_mean(j, vals[0], 1.0 / n_j, C, shift_sq)
            else:
                cols = np.sort(tidx[0, :tn[0]])
                base = cap_ptr[j]
                for u in range(tn[0]):
                    out_idx[base + u] = cols[u]
                    out_val[base + u] = vals[0, cols[u]]
                out_cnt[j] = tn[0]
            for u in range(tn[0]):
                f = tidx[0, u]
                vals[0, f] = 0.0
                mark[0, f] = False
            tn[0] = 0


@njit(parallel=True, **_JIT)
def cluster_sums_dense(X, order, offsets, changed, row0, block_rows, n_lev, n_tasks, store_means, C, shift_sq,
                       sums):
    """Dense twin of :func:`cluster_sums_sparse` (same arguments, X dense)."""
    K = offsets.shape[0] - 1
    D = X.shape[1]
    for task in prange(n_tasks):
        vals = np.zeros((n_lev, D))
        gaps = np.zeros(n_lev, dtype=np.int64)
        for j in range(task, K, n_tasks):
            n_j = offsets[j + 1] - offsets[j]
            if n_j == 0 or not changed[j]:
                if store_means:
                    shift_sq[j] = 0.0
                continue
            top = -1
            last = -1
            for t in range(offsets[j], offsets[j + 1]):
                i = order[t]
                b = (row0 + i) // block_rows
                if b != last:
                    g = 0 if last < 0 else _gap(last, b)
                    while top >= 1 and gaps[top] < g:
                        for k in range(D):
                            vals[top - 1, k] += vals[top, k]
                        top -= 1
                    top += 1
                    gaps[top] = g
                    last = b
                    vals[top, :] = 0.0
                for k in range(D):
                    vals[top, k] += X[i, k]
            while top >= 1:
                for k in range(D):
                    vals[top - 1, k] += vals[top, k]
                top -= 1
            if store_means:
                _store_mean(j, vals[0], 1.0 / n_j, C, shift_sq)
            else:
                sums[j, :] = vals[0]


def n_tasks_for(n_clusters):
    """Work units of the cluster-sum kernels: a few per thread (each holds a small stack of vectors)."""
    return max(1, min(int(n_clusters), 4 * numba.get_num_threads()))


@njit(parallel=True, **_JIT)
def means_from_csr_sums(
    indptr, indices, data, counts,  # IN  (K, D) cluster sums as CSR (float64), (K,) sizes
    C_old,                          # IN  the centres the moves are measured from (may be C)
    C, shift_sq,                    # OUT means (empty clusters: their row of C_old), squared moves
):
    """:func:`means_from_sums` reading CSR sums (absent entries are 0.0, as in the dense sums), the means written
    into ``C`` (not a copy of ``C_old`` first: one pass over K x D less)."""
    K, D = C.shape
    for j in prange(K):
        if counts[j] == 0:
            shift_sq[j] = 0.0
            for k in range(D):
                C[j, k] = C_old[j, k]
            continue
        acc = np.zeros(D)
        for q in range(indptr[j], indptr[j + 1]):
            acc[indices[q]] = data[q]
        _store_mean_from(j, acc, 1.0 / counts[j], C_old, C, shift_sq)


@njit(parallel=True, **_JIT)
def means_from_sums(
    sums, counts,                   # IN  (K, D) float64 combined cluster sums, (K,) sizes
    C, shift_sq,                    # IN/OUT centres -> means (empty clusters kept), squared moves
):
    """The M-step's last step on combined sums: the same arithmetic as the fused update."""
    K = counts.shape[0]
    for j in prange(K):
        if counts[j] == 0:
            shift_sq[j] = 0.0
            continue
        _store_mean(j, sums[j], 1.0 / counts[j], C, shift_sq)
