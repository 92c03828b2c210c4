"""numba kernels of :class:`qkm.ClusterIndex`: a query probed, scanned and re-ranked in one ``nogil`` call.

Layout of a fitted index (built by :mod:`qkm.approximate._index`; ``n`` rows stored list
by list, list ``c`` is rows ``offsets[c]:offsets[c + 1]``), passed as the
tuple ``ix = (mean, basis, shift, codec, centers_t, sizes, offsets, coords_t,
tail, resid, rows, data, indices, indptr, row_ids)``:

``basis`` (D, m) float32, ``mean`` (D,) float64, ``shift = basis.T mean``
    Orthonormal columns (principal axes of the data): a row ``x`` has the
    coordinates ``z = basis.T (x - mean)``, the first ``h`` are its *head*.
``codec`` (m, 4) float32
    How coordinates are stored (float32 or int8): per coordinate ``lo``,
    ``1 / step``, ``step^2`` and the slack, in steps, of a stored value.
``centers_t`` (h, L), stored like the coordinates
    The index's own lists: centroids of the heads, transposed.
``coords_t`` (n * m,)
    All ``m`` coordinates list by list, each list transposed (``m`` runs of
    its rows, the head first), so one query's head distances to a whole list
    vectorise and a batch bounds a list with one matrix product.
``tail`` (n, m - h)
    Coordinates ``h..m`` again, row by row: refined ``block`` at a time, read
    only for candidates (one query).
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
``k``-th best). Bounds are float32, widened by the storage slack and compared
with a margin covering their rounding, so the answer is exactly the ``k``
nearest rows of the probed lists by (distance, index), whatever the order of
evaluation or the pruning.

Every query, alone or in a batch, goes through the one compiled
:func:`search` (a batch is split into fixed chunks of queries, run by threads
as the kernel releases the GIL), so one query, a batch and any thread count
give bit-identical answers. The head coordinates and list distances are
IEEE-exact code (no fastmath) shared with :mod:`qkm.approximate._search_probe`; the exact
distances add in a fixed order over ``LANES`` lanes (vectorised without
reassociation); only the deeper bounds may be reassociated (``_JIT_DOT``), and
a batch's deeper coordinates come from BLAS: they only tighten bounds.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import _JIT, _JIT_DOT
from ._search_probe import _before, _center_distances, _codes, _project, _project_csr, _select_lists

#: Relative margin of the float32 bounds: a row is pruned only when its bound
#: exceeds ``kth + MARGIN * (kth + ||q - mean||^2 + max ||y - mean||^2)``.
MARGIN = 2.0 ** -12

#: Candidates looked ahead when prefetching the rows' deeper coordinates.
PREFETCH_AHEAD = 8

#: Rows whose exact distance waits (prefetched) while later candidates are bounded.
EXACT_QUEUE = 4

#: Rows the head scan handles at a time (one vector): lists are read in whole multiples of it.
HEAD_PAD = 8

#: Lanes of the exact float64 distance (a runtime trip count: the loop vectorises without reassociation).
LANES = 16


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Hint the CPU to fetch ``arr[i, j]``'s cache line (``llvm.prefetch``; no effect on results)."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], args[2]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, i, j), codegen


# --------------------------------------------------------------------------- #
# Bounds (float32; they only prune) and exact distances (IEEE float64)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _levels(z, nq, h, block, n_levels, codec, u, rq):  # IN z (m,), nq; OUT u (m,) float32, rq (n_levels,)
    """The query in the stored units, and its residual norm beyond each level."""
    m = z.shape[0]
    acc = 0.0
    for j in range(h):
        acc += z[j] * z[j]
    rq[0] = np.sqrt(max(nq - acc, 0.0))
    for b in range(1, n_levels):
        for j in range(h + (b - 1) * block, min(h + b * block, m)):
            acc += z[j] * z[j]
        rq[b] = np.sqrt(max(nq - acc, 0.0))
    _codes(z, codec, m, u)


@njit(**_JIT)
def _scan_heads(u, rq0, probe, n_probe, offsets, coords_t, h, codec, resid, s_buf, lb_buf, pos_buf):
    """Head bounds of every row of the probed lists, in probe order; returns how many.

    Per coordinate ``step^2 max(|u - y| - slack, 0)^2``: the stored ``y`` is
    within ``slack`` steps of the row's coordinate (0 for float32, 1/2 for int8;
    float32 coordinates take the plain ``(u - y)^2``). The inner loops run over
    whole ``HEAD_PAD`` rows (``coords_t`` has ``HEAD_PAD`` spare entries at its
    end, ``s_buf`` as many beyond the rows): what they add past a list's rows
    is never read.
    """
    m = codec.shape[0]  # coordinates per row: a list's block is (m, n_c), the head its first h rows
    cnt = 0
    r0 = np.float32(rq0)
    plain = codec.shape[0] > 0 and codec[0, 3] == 0.0 and codec[0, 1] == 1.0  # float32 coordinates (one codec)
    for t in range(n_probe):
        c = probe[t]
        lo = offsets[c]
        n_c = offsets[c + 1] - lo
        n_p = (n_c + HEAD_PAD - 1) // HEAD_PAD * HEAD_PAD
        acc = s_buf[cnt:cnt + n_p]
        for r in range(n_p):
            acc[r] = 0.0
        base = m * lo
        if plain:  # four coordinates per pass over the rows (the same additions, in the same order)
            j = 0
            while j + 4 <= h:
                u0 = u[j]
                u1 = u[j + 1]
                u2 = u[j + 2]
                u3 = u[j + 3]
                b0 = base + j * n_c
                col0 = coords_t[b0:b0 + n_p]
                col1 = coords_t[b0 + n_c:b0 + n_c + n_p]
                col2 = coords_t[b0 + 2 * n_c:b0 + 2 * n_c + n_p]
                col3 = coords_t[b0 + 3 * n_c:b0 + 3 * n_c + n_p]
                for r in range(n_p):
                    d0 = u0 - np.float32(col0[r])
                    d1 = u1 - np.float32(col1[r])
                    d2 = u2 - np.float32(col2[r])
                    d3 = u3 - np.float32(col3[r])
                    acc[r] = (((acc[r] + d0 * d0) + d1 * d1) + d2 * d2) + d3 * d3
                j += 4
            while j < h:
                uj = u[j]
                col = coords_t[base + j * n_c:base + j * n_c + n_p]
                for r in range(n_p):
                    d = uj - np.float32(col[r])
                    acc[r] += d * d
                j += 1
        else:
            for j in range(h):
                uj = u[j]
                wj = codec[j, 2]
                slack = codec[j, 3]
                col = coords_t[base + j * n_c:base + j * n_c + n_p]
                for r in range(n_p):
                    d = max(abs(uj - np.float32(col[r])) - slack, np.float32(0.0))
                    acc[r] += wj * (d * d)
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
def _tail_block(u, j0, row, t0, t1, codec):
    """The bound over the stored coordinates ``t0 <= t < t1`` of ``row``, query ``u[j0 + t - t0]`` (any order)."""
    uu = u[j0:j0 + t1 - t0]
    rr = row[t0:t1]
    cc = codec[j0:j0 + t1 - t0]
    s = np.float32(0.0)
    for t in range(t1 - t0):
        d = max(abs(uu[t] - np.float32(rr[t])) - cc[t, 3], np.float32(0.0))
        s += cc[t, 2] * (d * d)
    return s


@njit(**_JIT)
def _exact_dense(xq, row, acc, limit):
    """``||xq - row||^2`` in float64, or -1 once the sum over the first half exceeds ``limit``.

    IEEE-exact, in a fixed order that vectorises: ``acc`` (``LANES``) holds
    the sums over the columns ``j = t mod LANES``, added up in turn at the end.
    """
    D = xq.shape[0]
    lanes = acc.shape[0]
    nb = D // lanes
    for t in range(lanes):
        acc[t] = 0.0
    for b in range(nb):
        if b == nb // 2:
            s = 0.0
            for t in range(lanes):
                s += acc[t]
            if s > limit:
                return -1.0
        x = xq[b * lanes:(b + 1) * lanes]
        y = row[b * lanes:(b + 1) * lanes]
        for t in range(lanes):
            d = x[t] - y[t]
            acc[t] += d * d
    s = 0.0
    for t in range(lanes):
        s += acc[t]
    for j in range(nb * lanes, D):
        d = xq[j] - row[j]
        s += d * d
    return s


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


@njit(**_JIT)
def _k_smallest(vals, cnt, first):  # IN vals (>= cnt,); OUT first (k,) positions, by value (ties: first seen)
    """Positions of the ``k = len(first)`` smallest of ``vals[:cnt]``, smallest first; returns how many (<= k)."""
    k = first.shape[0]
    n = 0
    for i in range(cnt):
        v = vals[i]
        if n == k and not v < vals[first[k - 1]]:
            continue
        t = n if n < k else k - 1
        while t > 0 and v < vals[first[t - 1]]:
            first[t] = first[t - 1]
            t -= 1
        first[t] = i
        if n < k:
            n += 1
    return n


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
    codec = ix[3]
    sizes, offsets, coords_t, tail, resid, rows, data, indices, indptr, row_ids = ix[5:]
    u, rq, probe, s_buf, lb_buf, pos_buf, first, qpos, qlb, acc, cand = buf
    k = out_d.shape[0]
    n_levels = resid.shape[1]
    m_tail = tail.shape[1]
    _levels(z, nq, h, block, n_levels, codec, u, rq)
    n_probe = _select_lists(pd, sizes, nprobe, k, probe)
    cnt = _scan_heads(u, rq[0], probe, n_probe, offsets, coords_t, h, codec, resid, s_buf, lb_buf, pos_buf)
    for t in range(k):
        out_d[t] = np.inf
        out_i[t] = row_ids.shape[0]
    n_first = _k_smallest(lb_buf, cnt, first)  # the k smallest head bounds first (a good k-th distance early)
    line = 64 // rows.itemsize
    if sparse:  # xq is all zeros between sparse queries
        for t in range(qlo, qhi):
            xq[qind[t]] = qdata[t]
    else:  # the first k rows get their exact distance soon: fetch them while their deeper bounds are computed
        for t in range(n_first):
            for j in range(0, rows.shape[1], line):
                _prefetch(rows, pos_buf[first[t]], j)
    if m_tail > 0:
        for t in range(n_first):
            for j in range(0, min(block, m_tail), 64 // tail.itemsize):
                _prefetch(tail, pos_buf[first[t]], j)
            _prefetch(resid, pos_buf[first[t]], 1)
    queued = 0
    n_steps = n_first  # the first k rows; then the rows still in reach once they are done
    gathered = False
    step = 0
    while step < n_steps + EXACT_QUEUE:
        kth = out_d[k - 1]
        thr = kth + MARGIN * (kth + nq + nmax)
        if step == n_first and not gathered:  # gather the candidates, so that they can be prefetched in turn
            gathered = True
            for t in range(cnt):
                if 0.0 <= lb_buf[t] <= thr:
                    cand[n_steps - n_first] = t
                    n_steps += 1
        if step >= n_steps or queued == EXACT_QUEUE:  # exact distance of the oldest queued row
            if queued > 0:
                p = qpos[0]
                if qlb[0] <= thr:
                    d = _exact_dense(xq, rows[p], acc, kth)
                    if d >= 0.0:
                        _insert(d, row_ids[p], out_d, out_i)
                queued -= 1
                for t in range(queued):
                    qpos[t] = qpos[t + 1]
                    qlb[t] = qlb[t + 1]
                kth = out_d[k - 1]
                thr = kth + MARGIN * (kth + nq + nmax)
            if step >= n_steps:
                step += 1
                continue
        early = step < n_first
        i = first[step] if early else cand[step - n_first]
        ahead = step + PREFETCH_AHEAD
        if m_tail > 0 and n_first <= ahead < n_steps:
            pa = pos_buf[cand[ahead - n_first]]
            for t in range(0, min(block, m_tail), 64 // tail.itemsize):  # a coming candidate's first block
                _prefetch(tail, pa, t)
            _prefetch(resid, pa, 1)  # and its residual there (a line of its own: resid is stored by columns)
        step += 1
        v = lb_buf[i]
        if v < 0.0 or v > thr:  # done already, or out of reach
            continue
        lb_buf[i] = -1.0
        p = pos_buf[i]
        s = s_buf[i]
        pruned = False
        for b in range(1, n_levels):
            t0 = (b - 1) * block
            t1 = min(b * block, m_tail)
            s += _tail_block(u, h + t0, tail[p], t0, t1, codec)
            e = np.float32(rq[b]) - resid[p, b]
            if s + e * e > thr:
                pruned = True
                break
        if pruned:
            continue
        if sparse:  # a cheap expansion against the scattered query rules out most rows, then the exact merge
            dot = 0.0
            ny = 0.0
            for t in range(indptr[p], indptr[p + 1]):
                v = np.float64(data[t])
                ny += v * v
                dot += v * xq[indices[t]]
            if nq + ny - 2.0 * dot <= thr:
                _insert(_exact_csr(qdata, qind, qlo, qhi, data, indices, indptr[p], indptr[p + 1]), row_ids[p],
                        out_d, out_i)
        elif early:
            d = _exact_dense(xq, rows[p], acc, kth)
            if d >= 0.0:
                _insert(d, row_ids[p], out_d, out_i)
        else:
            for t in range(0, rows.shape[1], line):
                _prefetch(rows, p, t)
            qpos[queued] = p
            qlb[queued] = s
            queued += 1
    if sparse:
        for t in range(qlo, qhi):
            xq[qind[t]] = 0.0
    for t in range(k):
        out_d[t] = np.sqrt(out_d[t])


@njit(**_JIT)
def _workspace(cap, ix, k, sparse):
    """Per-thread buffers: (z, xq, nz, pd32, pd), and the search buffers of :func:`_search_query`.

    ``xq`` holds a dense query (dense index) or the scattered sparse query (CSR index: zeros in between).
    """
    D, m = ix[1].shape
    L = ix[5].shape[0]
    search_buf = (np.empty(m, dtype=np.float32), np.empty(ix[9].shape[1]), np.empty(L, dtype=np.int64),
                  np.empty(cap + HEAD_PAD, dtype=np.float32), np.empty(cap, dtype=np.float32),
                  np.empty(cap, dtype=np.int64),
                  np.empty(k, dtype=np.int64), np.empty(EXACT_QUEUE, dtype=np.int64),
                  np.empty(EXACT_QUEUE, dtype=np.float32), np.empty(LANES), np.empty(cap, dtype=np.int64))
    return (np.empty(m), np.zeros(D) if sparse else np.empty(D), np.empty(D, dtype=np.int64),
            np.empty(L, dtype=np.float32), np.empty(L)), search_buf


@njit(**_JIT)
def _one(i, Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, ztail, work, buf, out_d, out_i):
    """Query ``i``: project (the head only when ``ztail`` holds its deeper coordinates), rank the lists, search.

    A query that is not finite gets NaN distances and -1 indices.
    """
    mean, basis, shift, codec, centers_t = ix[:5]
    z, xq, nz, pd32, pd = work
    u = buf[0]
    m = basis.shape[1]
    j1 = h if ztail.shape[0] > 0 else m
    if sparse:
        nq = _project_csr(qdata, qind, qptr[i], qptr[i + 1], basis, j1, z)
    else:
        nq = _project(Q[i], mean, basis, shift, j1, z, xq, nz)
    if not np.isfinite(nq):
        out_d[i, :] = np.nan
        out_i[i, :] = -1
        return
    if j1 < m:
        z[h:] = ztail[i]
    if own:
        _codes(z, codec, h, u)
        _center_distances(u, codec, centers_t, pd32, pd)
    else:
        pd[:] = given[i]
    _search_query(z, nq, xq, qdata, qind, qptr[i], qptr[i + 1], sparse, pd, nprobe, ix, h, block, nmax, buf,
                  out_d[i], out_i[i])


@njit(**_JIT)
def search(Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, cap, ztail, out_d, out_i):
    """Every query in turn, in the calling thread (which it releases: batches run in threads).

    Queries: dense ``Q`` (n_q, D) float64, or CSR ``qdata`` / ``qind`` /
    ``qptr`` when ``sparse`` (sorted indices). Lists are ranked by the
    index's centroids (``own``) or by the rows of ``given`` (n_q, L).
    ``cap``: most rows the probed lists can hold. ``ztail`` (n_q, m - h):
    the queries' coordinates beyond the head when computed outside (BLAS),
    or empty. OUT ``out_d``, ``out_i`` (n_q, k): Euclidean distances and row
    ids, sorted by (distance, id).
    """
    work, buf = _workspace(cap, ix, out_d.shape[1], sparse)
    for i in range(out_d.shape[0]):
        _one(i, Q, qdata, qind, qptr, sparse, given, own, nprobe, ix, h, block, nmax, ztail, work, buf,
             out_d, out_i)


_ROW_NO_DATA = np.zeros(0, dtype=np.float64)
_ROW_NO_INDICES = np.zeros(0, dtype=np.int32)
_ROW_NO_PTR = np.zeros(2, dtype=np.int64)
_ROW_NO_GIVEN = np.zeros((1, 1), dtype=np.float64)
_ROW_NO_TAIL = np.zeros((0, 0), dtype=np.float64)


@njit(**_JIT)
def search_row(x, ix, nprobe, h, block, nmax, cap, k):
    """One dense query ``x`` (1, D) float32 or float64 in the index's own lists: :func:`search` in one lean call.

    The buffers and the answer are allocated here (fewer arguments to pass
    than :func:`search` takes, no copy of ``x``: it is read as float64
    exactly as a float64 copy would be). Returns ``(out_d, out_i)`` (1, k).
    """
    out_d = np.empty((1, k))
    out_i = np.empty((1, k), dtype=np.int64)
    work, buf = _workspace(cap, ix, k, False)
    _one(0, x, _ROW_NO_DATA, _ROW_NO_INDICES, _ROW_NO_PTR, False, _ROW_NO_GIVEN, True, nprobe, ix, h, block, nmax,
         _ROW_NO_TAIL, work, buf, out_d, out_i)
    return out_d, out_i
