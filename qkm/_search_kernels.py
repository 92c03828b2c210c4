"""numba kernels of :class:`qkm.ClusterIndex`: a query probed, scanned and re-ranked in one ``nogil`` call.

Layout of a fitted index (built by :mod:`qkm._index`; ``n`` rows stored list
by list, list ``c`` is rows ``offsets[c]:offsets[c + 1]``), passed as the
tuple ``ix = (mean, basis, centers_t, sizes, offsets, head_t, tail, resid,
rows, data, indices, indptr, row_ids)``:

``basis`` (D, m) float32, ``mean`` (D,) float64
    Orthonormal columns (principal axes of the data): a row ``x`` has the
    coordinates ``z = basis.T (x - mean)``, the first ``h`` are its *head*.
``centers_t`` (h, L) float32
    The index's own lists: centroids of the heads, transposed.
``head_t`` (n * h,) float32
    Head coordinates list by list, each list transposed (``h`` runs of its
    rows), so one query's distances to a whole list vectorise.
``tail`` (n, m - h) float32
    Coordinates ``h..m``, refined ``block`` at a time, read only for candidates.
``resid`` (n, n_levels) float32
    ``||x - mean||`` beyond each level ``h, h + block, ..., m``.
``rows`` (n, D), or CSR ``data`` / ``indices`` / ``indptr``
    The rows, for the exact distances.

A query is projected once and its lists ranked (by ``centers_t``, or by
given distances for the model's clusters). Every row of the probed lists
gets the lower bound ``||z_q - z_y||^2 + (r_q - r_y)^2`` over the head; it is
refined block by block (more coordinates, smaller residuals) only while it
stays below the current ``k``-th best, and the survivors get the exact
squared distance in float64 (abandoned once a partial sum exceeds the
``k``-th best). Bounds are float32 and compared with a margin covering their
rounding, so the answer is exactly the ``k`` nearest rows of the probed lists
by (distance, index), whatever the order of evaluation or the pruning.

What decides the answer - the head coordinates, the list distances and the
exact distances - is computed by IEEE-exact code (no fastmath) that every
path shares; only the bounds, which merely prune, may be computed otherwise
(BLAS for a batch's deeper coordinates). So one query and a batch, and any
thread count, give bit-identical answers.
"""

import numpy as np
from numba import njit, prange

from ._kernels import _JIT, _JIT_DOT

#: Relative margin of the float32 bounds: a row is pruned only when its bound
#: exceeds ``kth + MARGIN * (kth + ||q - mean||^2 + max ||y - mean||^2)``.
MARGIN = 2.0 ** -12

#: Queries per work unit of the parallel batch kernel.
QUERY_CHUNK = 16


# --------------------------------------------------------------------------- #
# Projection and probe (IEEE-exact: they decide the probed lists)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _project(q, mean, basis, j1, z, xq):  # IN q (D,), mean, basis (D, m); OUT z[:j1], xq (D,) float64
    """``z[:j1] = basis[:, :j1].T (q - mean)`` in float64, rows four at a time; returns ``||q - mean||^2``."""
    D = basis.shape[0]
    zz = z[:j1]
    for j in range(j1):
        zz[j] = 0.0
    nq = 0.0
    i = 0
    while i < D:
        a0 = np.float64(q[i]) - mean[i]
        xq[i] = q[i]
        nq += a0 * a0
        if i + 4 <= D:
            a1 = np.float64(q[i + 1]) - mean[i + 1]
            a2 = np.float64(q[i + 2]) - mean[i + 2]
            a3 = np.float64(q[i + 3]) - mean[i + 3]
            xq[i + 1] = q[i + 1]
            xq[i + 2] = q[i + 2]
            xq[i + 3] = q[i + 3]
            nq += a1 * a1
            nq += a2 * a2
            nq += a3 * a3
            b0 = basis[i, :j1]
            b1 = basis[i + 1, :j1]
            b2 = basis[i + 2, :j1]
            b3 = basis[i + 3, :j1]
            for j in range(j1):
                zz[j] += (a0 * b0[j] + a1 * b1[j]) + (a2 * b2[j] + a3 * b3[j])
            i += 4
        else:
            b0 = basis[i, :j1]
            for j in range(j1):
                zz[j] += a0 * b0[j]
            i += 1
    return nq


@njit(**_JIT)
def _project_csr(data, indices, lo, hi, basis, j1, z):  # IN a CSR row, basis; OUT z[:j1]
    """``z[:j1] = basis[:, :j1].T q`` for a CSR row (the mean of a sparse index is 0); returns ``||q||^2``."""
    zz = z[:j1]
    for j in range(j1):
        zz[j] = 0.0
    nq = 0.0
    for t in range(lo, hi):
        a = np.float64(data[t])
        nq += a * a
        b = basis[indices[t], :j1]
        for j in range(j1):
            zz[j] += a * b[j]
    return nq


@njit(**_JIT)
def _center_distances(z, centers_t, pd32, pd):  # IN z (>= h,), centers_t (h, L); OUT pd32, pd (L,)
    """Squared distances of the head ``z[:h]`` to the list centroids, float32 (stored in ``pd`` as float64)."""
    h, L = centers_t.shape
    for c in range(L):
        pd32[c] = 0.0
    for j in range(h):
        zj = np.float32(z[j])
        col = centers_t[j]
        for c in range(L):
            t = zj - col[c]
            pd32[c] += t * t
    for c in range(L):
        pd[c] = pd32[c]


@njit(inline="always", **_JIT)
def _before(d1, c1, d2, c2):
    return d1 < d2 or (d1 == d2 and c1 < c2)


@njit(**_JIT)
def _select_lists(pd, sizes, nprobe, k, probe):  # IN pd (L,), sizes (L,); OUT probe (L,) int64
    """The ``nprobe`` nearest non-empty lists (ties: lowest index), widened until they hold ``k`` rows.

    Returns how many lists were written to ``probe``, nearest first.
    """
    L = pd.shape[0]
    p = 0
    for c in range(L):
        if sizes[c] == 0:
            continue
        d = pd[c]
        if p == nprobe and not _before(d, c, pd[probe[p - 1]], probe[p - 1]):
            continue
        t = p if p < nprobe else nprobe - 1
        while t > 0 and _before(d, c, pd[probe[t - 1]], probe[t - 1]):
            probe[t] = probe[t - 1]
            t -= 1
        probe[t] = c
        if p < nprobe:
            p += 1
    total = 0
    for t in range(p):
        total += sizes[probe[t]]
    if total >= k:
        return p
    order = np.argsort(pd, kind="mergesort")  # stable: ties to the lowest index
    p = 0
    total = 0
    for c in order:
        if sizes[c] == 0:
            continue
        probe[p] = c
        p += 1
        total += sizes[c]
        if p >= nprobe and total >= k:
            break
    return p


@njit(**_JIT)
def list_ranks(pd, sizes, target, out):  # IN pd (n, L), sizes (L,), target (n,); OUT out (n,) int64
    """Position of list ``target[i]`` in query ``i``'s probe order (non-empty lists, ties to the lowest index)."""
    for i in range(pd.shape[0]):
        c0 = target[i]
        d0 = pd[i, c0]
        r = 0
        for c in range(pd.shape[1]):
            if sizes[c] > 0 and _before(pd[i, c], c, d0, c0):
                r += 1
        out[i] = r


@njit(parallel=True, **_JIT)
def probe_distances(Q, qdata, qind, qptr, sparse, mean, basis, centers_t, out):  # OUT out (n_q, L) float64
    """The kernels' own list distances of every query (for calibration and diagnostics)."""
    h, L = centers_t.shape
    D = basis.shape[0]
    n_q = out.shape[0]
    for ch in prange((n_q + QUERY_CHUNK - 1) // QUERY_CHUNK):
        z = np.empty(h)
        xq = np.empty(D)
        pd32 = np.empty(L, dtype=np.float32)
        for i in range(ch * QUERY_CHUNK, min((ch + 1) * QUERY_CHUNK, n_q)):
            if sparse:
                _project_csr(qdata, qind, qptr[i], qptr[i + 1], basis, h, z)
            else:
                _project(Q[i], mean, basis, h, z, xq)
            _center_distances(z, centers_t, pd32, out[i])


# --------------------------------------------------------------------------- #
# Bounds (float32; they only prune) and exact distances (IEEE float64)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _levels(z, nq, h, block, n_levels, z32, rq):  # IN z (m,), nq; OUT z32 (m,), rq (n_levels,)
    """float32 coordinates and the query's residual norm beyond each level."""
    m = z.shape[0]
    acc = 0.0
    for j in range(h):
        acc += z[j] * z[j]
    rq[0] = np.sqrt(max(nq - acc, 0.0))
    for b in range(1, n_levels):
        for j in range(h + (b - 1) * block, min(h + b * block, m)):
            acc += z[j] * z[j]
        rq[b] = np.sqrt(max(nq - acc, 0.0))
    for j in range(m):
        z32[j] = np.float32(z[j])


@njit(**_JIT)
def _scan_heads(z32, rq0, probe, n_probe, offsets, head_t, h, resid, s_buf, lb_buf, pos_buf):
    """Head bounds of every row of the probed lists, in probe order; returns how many."""
    cnt = 0
    r0 = np.float32(rq0)
    for t in range(n_probe):
        c = probe[t]
        lo = offsets[c]
        n_c = offsets[c + 1] - lo
        acc = s_buf[cnt:cnt + n_c]
        for r in range(n_c):
            acc[r] = 0.0
        base = h * lo
        for j in range(h):
            zj = z32[j]
            col = head_t[base + j * n_c:base + (j + 1) * n_c]
            for r in range(n_c):
                d = zj - col[r]
                acc[r] += d * d
        res = resid[lo:lo + n_c, 0]
        lbs = lb_buf[cnt:cnt + n_c]
        pos = pos_buf[cnt:cnt + n_c]
        for r in range(n_c):
            e = r0 - res[r]
            lbs[r] = acc[r] + e * e
            pos[r] = lo + r
        cnt += n_c
    return cnt


@njit(**_JIT_DOT)
def _tail_block(z32, j0, row, t0, t1):
    """``sum_t (z32[j0 + t - t0] - row[t])^2`` over ``t0 <= t < t1`` (float32, any order: a bound)."""
    zz = z32[j0:j0 + t1 - t0]
    rr = row[t0:t1]
    s = np.float32(0.0)
    for t in range(t1 - t0):
        d = zz[t] - rr[t]
        s += d * d
    return s


@njit(**_JIT)
def _exact_dense(xq, row, limit):
    """``||xq - row||^2`` in float64 (four fixed lanes), or -1 once a partial sum exceeds ``limit``."""
    D = xq.shape[0]
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    j = 0
    check = 256
    while j + 4 <= D:
        d0 = xq[j] - row[j]
        d1 = xq[j + 1] - row[j + 1]
        d2 = xq[j + 2] - row[j + 2]
        d3 = xq[j + 3] - row[j + 3]
        a0 += d0 * d0
        a1 += d1 * d1
        a2 += d2 * d2
        a3 += d3 * d3
        j += 4
        if j >= check:
            check += 256
            if (a0 + a1) + (a2 + a3) > limit:
                return -1.0
    while j < D:
        d0 = xq[j] - row[j]
        a0 += d0 * d0
        j += 1
    return (a0 + a1) + (a2 + a3)


@njit(**_JIT)
def _exact_csr(qdata, qind, qlo, qhi, data, indices, lo, hi):
    """``||q - y||^2`` in float64 for two CSR rows with sorted indices (a merge: no cancellation)."""
    a = qlo
    b = lo
    acc = 0.0
    while a < qhi and b < hi:
        ia = qind[a]
        ib = indices[b]
        if ia == ib:
            d = np.float64(qdata[a]) - np.float64(data[b])
            a += 1
            b += 1
        elif ia < ib:
            d = np.float64(qdata[a])
            a += 1
        else:
            d = np.float64(data[b])
            b += 1
        acc += d * d
    while a < qhi:
        d = np.float64(qdata[a])
        acc += d * d
        a += 1
    while b < hi:
        d = np.float64(data[b])
        acc += d * d
        b += 1
    return acc


@njit(inline="always", **_JIT)
def _insert(d, ident, out_d, out_i):
    """Put ``(d, ident)`` into the sorted top-k ``(out_d, out_i)`` if it belongs there."""
    k = out_d.shape[0]
    if not _before(d, ident, out_d[k - 1], out_i[k - 1]):
        return
    t = k - 1
    while t > 0 and _before(d, ident, out_d[t - 1], out_i[t - 1]):
        out_d[t] = out_d[t - 1]
        out_i[t] = out_i[t - 1]
        t -= 1
    out_d[t] = d
    out_i[t] = ident


# --------------------------------------------------------------------------- #
# One query, and the entry points
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _search_query(z, nq, xq, qdata, qind, qlo, qhi, sparse, pd, nprobe, ix, h, block, nmax, buf, out_d, out_i):
    """The ``k = len(out_d)`` nearest rows of the lists probed for one query, sorted by (distance, row id).

    ``z`` (m,), ``nq``: the query's coordinates and ``||q - mean||^2``; the
    query itself is ``xq`` (D,) float64 (dense index) or the CSR row
    ``qdata[qlo:qhi]`` / ``qind`` (CSR index); ``pd`` (L,): its distances
    to the lists. OUT ``out_d`` (k,) Euclidean distances, ``out_i`` (k,) row ids.
    """
    mean, basis, centers_t, sizes, offsets, head_t, tail, resid, rows, data, indices, indptr, row_ids = ix
    z32, rq, probe, s_buf, lb_buf, pos_buf, first = buf
    k = out_d.shape[0]
    n_levels = resid.shape[1]
    m_tail = tail.shape[1]
    _levels(z, nq, h, block, n_levels, z32, rq)
    n_probe = _select_lists(pd, sizes, nprobe, k, probe)
    cnt = _scan_heads(z32, rq[0], probe, n_probe, offsets, head_t, h, resid, s_buf, lb_buf, pos_buf)
    for t in range(k):
        out_d[t] = np.inf
        out_i[t] = row_ids.shape[0]
    # the k smallest head bounds first (a good k-th distance early), then every row in turn
    n_first = 0
    for i in range(cnt):
        v = lb_buf[i]
        if n_first == k and not v < lb_buf[first[k - 1]]:
            continue
        t = n_first if n_first < k else k - 1
        while t > 0 and v < lb_buf[first[t - 1]]:
            first[t] = first[t - 1]
            t -= 1
        first[t] = i
        if n_first < k:
            n_first += 1
    for step in range(n_first + cnt):
        if step < n_first:
            i = first[step]
        else:
            i = step - n_first
        v = lb_buf[i]
        if v < 0.0:  # done already
            continue
        kth = out_d[k - 1]
        thr = kth + MARGIN * (kth + nq + nmax)
        if v > thr:
            continue
        lb_buf[i] = -1.0
        p = pos_buf[i]
        s = s_buf[i]
        pruned = False
        for b in range(1, n_levels):
            t0 = (b - 1) * block
            t1 = min(b * block, m_tail)
            s += _tail_block(z32, h + t0, tail[p], t0, t1)
            e = np.float32(rq[b]) - resid[p, b]
            if s + e * e > thr:
                pruned = True
                break
        if pruned:
            continue
        if sparse:
            d = _exact_csr(qdata, qind, qlo, qhi, data, indices, indptr[p], indptr[p + 1])
        else:
            d = _exact_dense(xq, rows[p], kth)
            if d < 0.0:
                continue
        _insert(d, row_ids[p], out_d, out_i)
    for t in range(k):
        out_d[t] = np.sqrt(out_d[t])


@njit(**_JIT)
def _buffers(cap, L, m, n_levels, k):
    return (np.empty(m, dtype=np.float32), np.empty(n_levels), np.empty(L, dtype=np.int64),
            np.empty(cap, dtype=np.float32), np.empty(cap, dtype=np.float32), np.empty(cap, dtype=np.int64),
            np.empty(k, dtype=np.int64))


@njit(**_JIT)
def _one(i, Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, ztail, z, xq, pd32, pd, buf,
         out_d, out_i):
    """Query ``i``: project (head only when ``ztail`` has its deeper coordinates), probe, search."""
    basis = ix[1]
    m = basis.shape[1]
    j1 = h if ztail.shape[0] > 0 else m
    if sparse:
        nq = _project_csr(qdata, qind, qptr[i], qptr[i + 1], basis, j1, z)
    else:
        nq = _project(Q[i], ix[0], basis, j1, z, xq)
    if j1 < m:
        z[h:] = ztail[i]
    if own:
        _center_distances(z, ix[2], pd32, pd)
    else:
        pd[:] = given[i]
    _search_query(z, nq, xq, qdata, qind, qptr[i], qptr[i + 1], sparse, pd, nprobe, ix, h, block, nmax, buf,
                  out_d[i], out_i[i])


@njit(**_JIT)
def search(Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, cap, out_d, out_i):
    """Every query in turn in the calling thread, all of it compiled (the one-query path).

    Queries: dense ``Q`` (n_q, D), or CSR ``qdata`` / ``qind`` / ``qptr``
    when ``sparse`` (rows with sorted indices). Lists are ranked by the
    index's centroids (``own``) or by the rows of ``given`` (n_q, L).
    ``cap``: most rows the probed lists can hold. OUT ``out_d``, ``out_i``
    (n_q, k): Euclidean distances and row ids, sorted by (distance, id).
    """
    L = ix[3].shape[0]
    m = ix[1].shape[1]
    buf = _buffers(cap, L, m, ix[7].shape[1], out_d.shape[1])
    z = np.empty(m)
    xq = np.empty(ix[1].shape[0])
    pd32 = np.empty(L, dtype=np.float32)
    pd = np.empty(L)
    no_tail = np.empty((0, 0))
    for i in range(out_d.shape[0]):
        _one(i, Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, no_tail, z, xq, pd32, pd,
             buf, out_d, out_i)


@njit(parallel=True, **_JIT)
def search_batch(Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, cap, ztail, out_d, out_i):
    """:func:`search` for a batch, in parallel over fixed chunks of queries (same answers).

    ``ztail`` (n_q, m - h): the queries' coordinates beyond the head,
    computed outside (BLAS); they only tighten bounds.
    """
    L = ix[3].shape[0]
    m = ix[1].shape[1]
    n_q = out_d.shape[0]
    for ch in prange((n_q + QUERY_CHUNK - 1) // QUERY_CHUNK):
        buf = _buffers(cap, L, m, ix[7].shape[1], out_d.shape[1])
        z = np.empty(m)
        xq = np.empty(ix[1].shape[0])
        pd32 = np.empty(L, dtype=np.float32)
        pd = np.empty(L)
        for i in range(ch * QUERY_CHUNK, min((ch + 1) * QUERY_CHUNK, n_q)):
            _one(i, Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, ztail, z, xq, pd32, pd,
                 buf, out_d, out_i)
