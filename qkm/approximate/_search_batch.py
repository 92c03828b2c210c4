"""numba kernels of the grouped batch path of :class:`qkm.ClusterIndex` (dense rows).

The per-query path (:mod:`qkm.approximate._search_kernels`) scans the lists a
query probes, one query after the other. For a batch, a list is probed by
many queries: here every query's lists are chosen first (the same choice, by
the same IEEE-exact code, :func:`qkm.approximate._search_probe._select_lists`),
the queries are grouped by list, and each list is read once for all the
queries that probe it (:func:`scan_lists`: the group's queries gathered into a
small block, dot products with the list's rows in the rows' dtype, any
summation order). That gives every probed row an *approximate* squared
distance ``||q||^2 + ||y||^2 - 2 q.y`` whose error is at most
``err = gamma * (||q||^2 + max ||y||^2)`` (``gamma``: the rounding of a dot
product of ``D`` terms in that dtype, any order, plus the rounding of the
query to it). :func:`finish` then takes, per query, the ``k``-th smallest
approximate distance ``a_k`` and computes the exact float64 distance (the one
the per-query path computes, :func:`qkm.approximate._search_kernels._exact_dense`)
of every probed row with an approximate distance ``<= a_k + 2 err``: every
row of the exact top ``k`` is among them, so the answer is exactly the ``k``
nearest probed rows by (distance, row id), identical to the per-query path.
"""

import numpy as np
from numba import njit

from .._config import _JIT, _JIT_DOT
from ._search_kernels import LANES, _exact_dense, _insert
from ._search_probe import _select_lists


@njit(**_JIT)
def plan(pd, sizes, nprobe, k):
    """Choose every query's lists and group the queries by list.

    IN ``pd`` (n_q, L) distances of the queries to the lists. Returns
    :func:`group` of the lists :func:`qkm.approximate._search_probe._select_lists`
    chooses for every query.
    """
    n_q, L = pd.shape
    probe = np.empty(L, dtype=np.int64)
    chosen = np.empty((n_q, min(L, nprobe + 8)), dtype=np.int64)
    n_chosen = np.empty(n_q, dtype=np.int64)
    for i in range(n_q):
        p = _select_lists(pd[i], sizes, nprobe, k, probe)
        if p > chosen.shape[1]:  # widened beyond the guess: grow
            wider = np.empty((n_q, p), dtype=np.int64)
            wider[:i, :chosen.shape[1]] = chosen[:i]
            chosen = wider
        n_chosen[i] = p
        chosen[i, :p] = probe[:p]
    return group(chosen, n_chosen, sizes)


@njit(**_JIT)
def group(chosen, n_chosen, sizes):
    """Group the queries by the lists they probe.

    IN ``chosen[i, :n_chosen[i]]``: query ``i``'s lists, nearest first.
    Returns ``(base, grp_ptr, grp_q, grp_slot)``: query ``i``'s probed rows
    are slots ``base[i]:base[i + 1]`` of the bounds; list ``c`` is probed by
    queries ``grp_q[grp_ptr[c]:grp_ptr[c + 1]]`` (ascending), whose rows of
    ``c`` start at slot ``grp_slot[...]``.
    """
    n_q = n_chosen.shape[0]
    L = sizes.shape[0]
    counts = np.zeros(L, dtype=np.int64)
    base = np.empty(n_q + 1, dtype=np.int64)
    total = 0
    used = 0
    for i in range(n_q):
        base[i] = total
        for t in range(n_chosen[i]):
            c = chosen[i, t]
            counts[c] += 1
            total += sizes[c]
        used += n_chosen[i]
    base[n_q] = total
    grp_ptr = np.zeros(L + 1, dtype=np.int64)
    for c in range(L):
        grp_ptr[c + 1] = grp_ptr[c] + counts[c]
    grp_q = np.empty(used, dtype=np.int64)
    grp_slot = np.empty(used, dtype=np.int64)
    fill = grp_ptr[:L].copy()
    for i in range(n_q):
        slot = base[i]
        for t in range(n_chosen[i]):
            c = chosen[i, t]
            grp_q[fill[c]] = i
            grp_slot[fill[c]] = slot
            fill[c] += 1
            slot += sizes[c]
    return base, grp_ptr, grp_q, grp_slot


@njit(**_JIT_DOT)
def _dots(G, g, y, out):  # IN G (>= g, D), y (D,); OUT out (>= g,): G[j] . y in any order
    D = y.shape[0]
    zero = y[0] * 0
    j = 0
    while j + 4 <= g:  # four queries per pass over the row
        r0 = G[j]
        r1 = G[j + 1]
        r2 = G[j + 2]
        r3 = G[j + 3]
        s0 = zero
        s1 = zero
        s2 = zero
        s3 = zero
        for t in range(D):
            v = y[t]
            s0 += r0[t] * v
            s1 += r1[t] * v
            s2 += r2[t] * v
            s3 += r3[t] * v
        out[j] = s0
        out[j + 1] = s1
        out[j + 2] = s2
        out[j + 3] = s3
        j += 4
    while j < g:
        r0 = G[j]
        s0 = zero
        for t in range(D):
            s0 += r0[t] * y[t]
        out[j] = s0
        j += 1


@njit(**_JIT)
def scan_lists(c0, c1, Qc, qn, rows, yn, offsets, grp_ptr, grp_q, grp_slot, approx, pos):
    """Approximate squared distances of the grouped queries to the rows of lists ``c0 <= c < c1``.

    ``Qc`` (n_q, D): the queries in the rows' dtype; ``qn`` (n_q,), ``yn``
    (n,): squared norms (float64). OUT ``approx`` (float64), ``pos`` (row
    positions), at the slots of :func:`plan`.
    """
    D = Qc.shape[1]
    most = 0
    for c in range(c0, c1):
        most = max(most, grp_ptr[c + 1] - grp_ptr[c])
    G = np.empty((max(most, 1), D), dtype=Qc.dtype)
    dots = np.empty(max(most, 1), dtype=Qc.dtype)
    for c in range(c0, c1):
        g0 = grp_ptr[c]
        g = grp_ptr[c + 1] - g0
        if g == 0:
            continue
        for j in range(g):
            G[j] = Qc[grp_q[g0 + j]]
        lo = offsets[c]
        for r in range(offsets[c + 1] - lo):
            _dots(G, g, rows[lo + r], dots)
            for j in range(g):
                s = grp_slot[g0 + j] + r
                approx[s] = qn[grp_q[g0 + j]] + yn[lo + r] - 2.0 * np.float64(dots[j])
                pos[s] = lo + r


@njit(**_JIT)
def finish(i0, i1, Q, qn, gamma, ynmax, base, approx, pos, rows, row_ids, out_d, out_i):
    """Exact top ``k`` of queries ``i0 <= i < i1`` from their approximate distances (see the module doc).

    ``Q`` (n_q, D) float64 queries. OUT ``out_d`` (Euclidean, float64),
    ``out_i`` (row ids), sorted by (distance, row id); NaN / -1 for a query
    that is not finite.
    """
    k = out_d.shape[1]
    top = np.empty(k)
    acc = np.empty(LANES)
    for i in range(i0, i1):
        if not np.isfinite(qn[i]):
            out_d[i, :] = np.nan
            out_i[i, :] = -1
            continue
        a = approx[base[i]:base[i + 1]]
        for t in range(k):
            top[t] = np.inf
        for s in range(a.shape[0]):  # the k smallest approximate distances
            v = a[s]
            if v < top[k - 1]:
                t = k - 1
                while t > 0 and v < top[t - 1]:
                    top[t] = top[t - 1]
                    t -= 1
                top[t] = v
        thr = top[k - 1] + 2.0 * gamma * (qn[i] + ynmax)
        od = out_d[i]
        oi = out_i[i]
        for t in range(k):
            od[t] = np.inf
            oi[t] = row_ids.shape[0]
        xq = Q[i]
        for s in range(a.shape[0]):
            if a[s] <= thr:
                p = pos[base[i] + s]
                d = _exact_dense(xq, rows[p], acc, od[k - 1])
                if d >= 0.0:
                    _insert(d, row_ids[p], od, oi)
        for t in range(k):
            od[t] = np.sqrt(od[t])

