"""One Elkan run, made sparse-aware the way SparseKmeans does it.

Bounds follow Elkan (2003) with the triangle inequality: an upper bound
``u_i >= d(x_i, c_{l_i})`` and lower bounds ``lb_ij <= d(x_i, c_j)``, moved by
the centre shifts after each update, plus the half inter-centroid distance
tests. The work is aggregated instead of point by point: first the exact
``x_i.c_{l_i}`` of every point that still has a candidate (one pass), then
all surviving (i, j) pairs grouped by centroid, so each ``c_j`` stays in
cache while its points are scored. When too many pairs survive (the first
iterations), one fused full pass is cheaper and is used instead.

Distances used for decisions are the same partials Lloyd computes, so
Lloyd and Elkan from the same init give the same labels; bounds carry a small
rounding slack so that pruning never rests on a rounding error.
"""

import time

import numpy as np

from .. import _config
from .. import _kernels as K_
from ..operator._base import DenseOperator
from ._lloyd import loop_state


def _half_center_distances(C, c_sq, err_rel):
    """Lower bounds of d(c_j, c_k) / 2 from one BLAS product; diagonal +inf."""
    G = C @ C.T
    G = np.asarray(G, dtype=np.float64)
    sq = c_sq[:, None] + c_sq[None, :] - 2.0 * G
    sq -= err_rel * (c_sq[:, None] + c_sq[None, :])
    half = 0.5 * np.sqrt(np.maximum(sq, 0.0))
    np.fill_diagonal(half, np.inf)
    return half


def kmeans_single_elkan(data, centers_init, *, max_iter, tol, tol_wcss=0.0, verbose=0, log=None):
    """Run Elkan's algorithm from ``centers_init``; same contract as Lloyd's.

    Returns
    -------
    labels, inertia, centers, n_iter
    """
    n = data.n_samples
    k = centers_init.shape[0]
    layouts, labels, labels_old, partial, rule, log = loop_state(data, centers_init, tol, tol_wcss, verbose, log)
    upper = np.empty(n, dtype=np.float64)
    lb = np.zeros((n, k), dtype=np.float64)
    counts_i = np.empty(n, dtype=np.int64)
    err = data.err_rel
    # exact centre-centre distances every iteration only while they are cheap
    # next to one pass over the data; otherwise keep them as drifting bounds
    cc_exact_every_iter = k * data.n_features <= 0.25 * data.nnz
    half_cc = None
    strict = False
    n_iter = 0
    means_of = None  # labels whose exact means C holds (None: C is not such a mean)
    for it in range(max_iter):
        n_iter = it + 1
        t0 = time.perf_counter()
        if it == 0:
            data.assign(layouts, labels, partial, lb=lb)
            _set_upper(data, partial, layouts.c_sq, labels, err, upper, None)
            mode, n_pairs = "full", n * k
        else:
            if half_cc is None or cc_exact_every_iter:
                half_cc = _half_center_distances(layouts.C, layouts.c_sq, err)
            s = half_cc.min(axis=1)
            K_.elkan_count_candidates(labels, upper, lb, half_cc, s, counts_i)
            active = np.flatnonzero(counts_i).astype(np.int64)
            n_pairs = int(counts_i.sum())
            if n_pairs > _config.ELKAN_FULL_PASS_FRACTION * n * k:
                mode = "full"
                data.assign(layouts, labels, partial, rows=active, lb=lb)
                _set_upper(data, partial, layouts.c_sq, labels, err, upper, active)
            else:
                mode = "pairs"
                n_pairs = _pairs_pass(data, layouts, labels, partial, upper, lb, counts_i, active, half_cc, s)
        storage = layouts.storage
        wcss = None
        if rule.tol_wcss > 0 or verbose:
            wcss = data.total(_own_sq_distances(data, layouts, labels))
        C, shift_sq, c_sq, relocated = data.update(labels, layouts.C, lambda: _own_sq_distances(data, layouts, labels),
                                                   means_of)
        layouts = DenseOperator(C, c_sq)
        log.record(it, wcss=wcss, shift=float(shift_sq.sum()), mode=mode, pairs=n_pairs,
                   storage=storage, relocated=relocated, seconds=time.perf_counter() - t0)
        shift = np.sqrt(shift_sq)
        K_.elkan_shift_bounds(labels, shift, upper, lb)
        if half_cc is not None and not cc_exact_every_iter:
            half_cc = np.maximum(half_cc - 0.5 * (shift[:, None] + shift[None, :]), 0.0)
            np.fill_diagonal(half_cc, np.inf)
        strict, stop = rule.check(labels, labels_old, float(shift_sq.sum()), wcss)
        if stop:
            break
        labels_old[:] = labels
        means_of = None if relocated else labels_old
    if strict:
        # bounds left some partials stale: recompute the own distances exactly
        partial[:] = data.pair_partials(layouts, data.all_rows, labels.astype(np.int64))
    else:
        data.assign(layouts, labels, partial)
    inertia = data.total(data.sq_distances(partial))
    return labels, inertia, layouts.C, n_iter


def _pairs_pass(data, layouts, labels, partial, upper, lb, counts_i, active, half_cc, s):
    """Exact own partials of the ``active`` points, then their surviving (point, centre) pairs grouped
    by centre (IN/OUT: labels, partial, upper, lb, counts_i). Returns the number of pairs computed."""
    n, err = data.n_samples, data.err_rel
    # exact distance to the own centre for every point still in play
    partial[active] = data.pair_partials(layouts, active, labels[active].astype(np.int64))
    _set_upper(data, partial, layouts.c_sq, labels, err, upper, active)
    K_.elkan_count_candidates(labels, upper, lb, half_cc, s, counts_i)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts_i, out=ptr[1:])
    n_pairs = int(ptr[-1])
    pair_j = np.empty(n_pairs, dtype=np.int64)
    K_.elkan_fill_candidates(labels, upper, lb, half_cc, ptr, pair_j)
    pair_i = np.repeat(np.arange(n, dtype=np.int64), counts_i)
    by_cluster = np.argsort(pair_j, kind="stable")
    pair_partial = np.empty(n_pairs, dtype=np.float64)
    pair_partial[by_cluster] = data.pair_partials(layouts, pair_i[by_cluster], pair_j[by_cluster])
    K_.elkan_pick(active, ptr, pair_j, pair_partial, data.x_sq, layouts.c_sq, err, labels, partial, upper, lb)
    return n_pairs


def _own_sq_distances(data, layouts, labels):
    """Exact squared distance of every point to its own centre."""
    own = data.pair_partials(layouts, data.all_rows, labels.astype(np.int64))
    return np.maximum(own + data.x_sq, 0.0)


def _set_upper(data, partial, c_sq, labels, err, upper, rows):
    """u_i = sqrt(d^2 + slack) for ``rows`` (all when None)."""
    idx = slice(None) if rows is None else rows
    xs = data.x_sq[idx]
    sq = xs + partial[idx] + err * (xs + c_sq[labels[idx]])
    upper[idx] = np.sqrt(np.maximum(sq, 0.0))
