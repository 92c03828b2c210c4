"""numba kernels of the pre-filtered batch path of :class:`qkm.ClusterIndex` (dense rows, float32 coordinates).

The per-query path (:mod:`qkm.approximate._search_kernels`) bounds the rows
of a query's lists on their head coordinates, one query after the other, and
refines the survivors one by one (random reads of their deeper coordinates).
Here every query's lists are the single-query path's choice: for the
index's own lists with float32 coordinates decided from two matrix products
(all the queries' coordinates, then their products with the centroids) where a
rounding bound settles them (:func:`choose_lists`; near ties take the
single-query code), else chosen by that code itself
(:func:`qkm.approximate._search_probe.probe_batch`, which also gives the head
coordinates and norms). The queries are grouped by list
(:func:`qkm.approximate._search_batch.group`), and every list is read once
for all the queries that probe it: one matrix product (BLAS) of the group's
coordinates with the list's stored coordinates, all ``m`` of them in one
(m, n_c) block per list (``coords_t``), gives every probed row its full lower bound
``||u - y||^2 + (r_q - r_y)^2`` (``u``, ``y``: the coordinates of the query
and of the row, ``r``: their norms beyond them) in the expanded form
``||u||^2 + ||y||^2 - 2 u.y``. Its rounding is at most
``err = gamma * (||u||^2 + max ||y||^2)`` (``gamma``: a float32 dot product of
``m`` terms in any order, plus the final additions, plus the rounding of the
bound to float32, in which it is kept: ``2^-24 |bound|`` with
``|bound| <= 2 (||u||^2 + max ||y||^2) + ||q - mean||^2 + max ||y - mean||^2``), so a row is dropped only
when its bound exceeds the current ``k``-th exact distance by more than the
per-query path's margin plus ``err``. :func:`finish` computes the exact float64
distance (:func:`qkm.approximate._search_kernels._exact_dense`, the per-query
path's) of the ``k`` rows with the smallest bounds, then of every row whose
bound is still in reach, so the answer is exactly the ``k`` nearest probed rows
by (distance, row id), identical to the per-query path.
"""

import numpy as np
from numba import njit

from .._config import _JIT
from ._search_kernels import LANES, MARGIN, _exact_dense, _insert, _k_smallest, _prefetch
from ._search_probe import _center_distances, _choice_buffers, _codes, _project, _select_lists

#: Candidates looked ahead when prefetching rows for their exact distance.
ROW_PREFETCH_AHEAD = 1

#: :func:`choose_lists` decides from the BLAS products up to this ``nprobe`` (its selection costs ``nprobe`` per
#: list at worst); beyond, every query takes the single-query path's choice.
CHOOSE_MAX_NPROBE = 64


@njit(**_JIT)
def bound_lists(c0, c1, U, un, rq, coords_t, yn, ry, offsets, grp_ptr, grp_q, grp_slot, bounds, pos):
    """Lower bounds of the grouped queries' distances to the rows of lists ``c0 <= c < c1`` (squared).

    IN ``U`` (n_q, m) float32: the queries' coordinates; ``un`` (n_q,):
    ``||u||^2``; ``rq`` (n_q,): the queries' norms beyond the ``m``
    coordinates; ``coords_t``: the rows' stored coordinates (layout of
    :mod:`qkm.approximate._search_kernels`: each list an (m, n_c) block);
    ``yn`` (n,): their ``||y||^2``; ``ry`` (n,) float32: the rows' norms
    beyond them. OUT ``bounds`` (float32), ``pos`` (row positions) at the
    slots of :func:`qkm.approximate._search_batch.group`. One BLAS product
    per list (run it with one BLAS thread: the products are small).
    """
    m = U.shape[1]
    most = 0
    for c in range(c0, c1):
        most = max(most, grp_ptr[c + 1] - grp_ptr[c])
    G = np.empty((max(most, 1), m), dtype=np.float32)
    for c in range(c0, c1):
        g0 = grp_ptr[c]
        g = grp_ptr[c + 1] - g0
        lo = offsets[c]
        n_c = offsets[c + 1] - lo
        if g == 0 or n_c == 0:
            continue
        for j in range(g):
            G[j] = U[grp_q[g0 + j]]
        dots = np.dot(G[:g], coords_t[m * lo:m * (lo + n_c)].reshape((m, n_c)))
        for j in range(g):
            q = grp_q[g0 + j]
            s0 = grp_slot[g0 + j]
            uq = un[q]
            rqq = rq[q]
            for r in range(n_c):
                e = rqq - np.float64(ry[lo + r])
                bounds[s0 + r] = np.float32(uq + yn[lo + r] - 2.0 * np.float64(dots[j, r]) + e * e)
                pos[s0 + r] = lo + r


@njit(**_JIT)
def finish(i0, i1, Q, nq, err, nmax, base, bounds, pos, cand, rows, row_ids, out_d, out_i):
    """Exact top ``k`` of queries ``i0 <= i < i1`` from their bounds (see the module doc).

    ``Q`` (n_q, D) float64 queries, ``nq`` (n_q,): ``||q - mean||^2``,
    ``err`` (n_q,): the rounding allowance of their bounds; ``cand``: scratch
    of at least the most slots of one query. OUT ``out_d`` (Euclidean,
    float64), ``out_i`` (row ids), sorted by (distance, row id); NaN / -1 for
    a query that is not finite.
    """
    k = out_d.shape[1]
    first = np.empty(k, dtype=np.int64)
    acc = np.empty(LANES)
    for i in range(i0, i1):
        od = out_d[i]
        oi = out_i[i]
        if not np.isfinite(nq[i]):
            od[:] = np.nan
            oi[:] = -1
            continue
        b = bounds[base[i]:base[i + 1]]
        p_of = pos[base[i]:base[i + 1]]
        n_s = b.shape[0]
        for t in range(k):
            od[t] = np.inf
            oi[t] = row_ids.shape[0]
        n_first = _k_smallest(b, n_s, first)  # the k smallest bounds first: a good k-th distance early
        xq = Q[i]
        for t in range(n_first):
            for j in range(0, rows.shape[1], 64 // rows.itemsize):
                _prefetch(rows, np.int64(p_of[first[t]]), j)
        for t in range(n_first):
            s = first[t]
            d = _exact_dense(xq, rows[p_of[s]], acc, od[k - 1])
            if d >= 0.0:
                _insert(d, row_ids[p_of[s]], od, oi)
            b[s] = np.inf
        kth = od[k - 1]
        thr = kth + MARGIN * (kth + nq[i] + nmax) + err[i]
        n_c = 0
        for s in range(n_s):
            if b[s] <= thr:
                cand[n_c] = s
                n_c += 1
        for t in range(min(n_c, ROW_PREFETCH_AHEAD)):
            for j in range(0, rows.shape[1], 64 // rows.itemsize):
                _prefetch(rows, np.int64(p_of[cand[t]]), j)
        for t in range(n_c):
            if t + ROW_PREFETCH_AHEAD < n_c:
                row = np.int64(p_of[cand[t + ROW_PREFETCH_AHEAD]])
                for j in range(0, rows.shape[1], 64 // rows.itemsize):
                    _prefetch(rows, row, j)
            kth = od[k - 1]
            s = cand[t]
            if b[s] <= kth + MARGIN * (kth + nq[i] + nmax) + err[i]:
                d = _exact_dense(xq, rows[p_of[s]], acc, kth)
                if d >= 0.0:
                    _insert(d, row_ids[p_of[s]], od, oi)
        for t in range(k):
            od[t] = np.sqrt(od[t])


@njit(**_JIT)
def _gamma(n, unit):  # the rounding of n operations in a precision of unit roundoff ``unit`` (Higham's gamma_n)
    return n * unit / (1.0 - n * unit)


@njit(**_JIT)
def choose_lists(i0, i1, Q, ix, Z, V, nq, dots, n_listed, cmax, mnorm, nprobe, k, chosen, n_chosen):
    """Lists probed by the dense queries ``i0 <= i < i1`` of a batch (own lists, float32 coordinates), from BLAS.

    The single-query path ranks the lists by ``P_c``: the float32 sum of
    ``(u_j - c_j)^2`` over the head, ``u = float32(z)``, ``z`` its IEEE-exact
    projection (:func:`qkm.approximate._search_probe._project`). Here a batch
    has its coordinates ``Z`` (n_q, >= h) and ``nq = ||q - mean||^2`` from
    float64 matrix products, ``V = float32(Z[:, :h])``, and ``dots = [-2 V, 1]
    @ [centers_t; float32(||c||^2)]`` from one float32 product, so that
    ``a_c = ||v||^2 + dots[c]`` satisfies ``|a_c - P_c| <= E`` (``E`` below:
    the float64 error of ``Z``, the float32 roundings of ``u``, ``v``, the
    product and of ``P_c``; ``dots`` is infinite for an empty list). When the
    ``nprobe + 1``-th smallest ``dots[c]`` exceeds the ``nprobe``-th by more
    than ``2E`` (and the ``nprobe`` smallest hold ``k`` rows), each of the
    ``nprobe`` lists has a smaller ``P`` than any other list: they are the
    single-query path's choice (``n_listed``: the non-empty lists; there must
    be more than ``nprobe``). Otherwise (near or exact ties,
    widening, ``nprobe > CHOOSE_MAX_NPROBE``) the query takes the single-query
    path's own code. OUT ``chosen[i, :n_chosen[i]]``: the lists (as a set: by
    ``dots`` when decided here), none for a query that is not finite.
    """
    mean, basis, shift, codec, centers_t, sizes = ix[:6]
    h, L = centers_t.shape
    D = basis.shape[0]
    z, xq, nz, u, pd32, pd, probe = _choice_buffers(h, D, L)
    top = np.empty(nprobe + 1, dtype=np.float32)
    ids = np.empty(nprobe + 1, dtype=np.int64)
    u32 = 2.0 ** -24
    g_dot = _gamma(h + 1, u32)
    g_sum = _gamma(h + 2, u32)
    g_proj = _gamma(D + 2, 2.0 ** -53)
    n_ne = n_listed
    for i in range(i0, i1):
        if not np.isfinite(nq[i]):
            n_chosen[i] = 0
            continue
        vi = V[i]
        zi = Z[i]
        nv = 0.0
        nzb = 0.0
        for j in range(h):
            vj = np.float64(vi[j])
            nv += vj * vj
            nzb += zi[j] * zi[j]
        vn = np.sqrt(nv)
        qn = np.sqrt(nq[i])
        # |Z - z| per coordinate: two float64 dot products of D terms (columns of norm <= 1.001), ||q|| <= qn + mnorm
        delta = 4.0 * g_proj * (2.0 * qn + 3.0 * mnorm) * 1.01
        eta = 2.0 * u32 * np.sqrt(nzb) * 1.01 + 1.01 * np.sqrt(h) * delta  # >= ||v - u||
        err = 1.01 * ((g_dot * (1.0 + u32) + u32) * (2.0 * vn * cmax + cmax * cmax)
                      + eta * (2.0 * (vn + cmax) + eta) + g_sum * (vn + eta + cmax) ** 2)
        decided = False
        if nprobe < n_ne and nprobe <= CHOOSE_MAX_NPROBE and nv + cmax * cmax < 1e30:  # no float32 overflow
            drow = dots[i]
            for t in range(nprobe + 1):
                top[t] = np.inf
            last = np.float32(np.inf)
            # the nprobe + 1 smallest (an empty list is infinite), values kept beside their ids rather than the
            # package's _k_smallest (ids only, values re-read through them): see docs/decisions.md
            for c in range(L):
                a = drow[c]
                if a < last:
                    r = nprobe
                    while r > 0 and a < top[r - 1]:
                        top[r] = top[r - 1]
                        ids[r] = ids[r - 1]
                        r -= 1
                    top[r] = a
                    ids[r] = c
                    last = top[nprobe]
            if np.float64(top[nprobe]) > np.float64(top[nprobe - 1]) + 2.0 * err:  # a gap: the nprobe are settled
                total = 0
                for t in range(nprobe):
                    chosen[i, t] = ids[t]
                    total += sizes[ids[t]]
                n_chosen[i] = nprobe
                decided = total >= k
        if not decided:  # near ties, widening or many lists: the single-query path's own choice
            _project(Q[i], mean, basis, shift, h, z, xq, nz)
            _codes(z, codec, h, u)
            _center_distances(u, codec, centers_t, pd32, pd)
            p = _select_lists(pd, sizes, nprobe, k, probe)
            n_chosen[i] = p
            chosen[i, :p] = probe[:p]
