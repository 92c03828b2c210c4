"""numba kernels of :class:`qkm.ClusterIndex` that decide which lists a query probes (see :mod:`qkm.approximate._search_kernels`).

The query's head coordinates, its distances to the lists and the choice of
the ``nprobe`` nearest lists are computed here by IEEE-exact code (no
fastmath), shared by the search kernel and by :func:`probe_distances` (the
calibration of ``nprobe="auto"`` and diagnostics), so both see the same lists.
"""

import numpy as np
from numba import njit, prange

from .._config import _JIT

#: Queries per work unit of :func:`probe_distances`.
QUERY_CHUNK = 16


# --------------------------------------------------------------------------- #
# Projection and probe (IEEE-exact: they decide the probed lists)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _project(q, mean, basis, shift, j1, z, xq, nz):  # IN q (D,), mean, basis (D, m), shift (m,); OUT z, xq, nz
    """``z[:j1] = basis[:, :j1].T q - shift[:j1]`` in float64 over the nonzero entries of ``q``, four at a time.

    ``shift = basis.T mean``. Also copies ``q`` to ``xq`` (float64) and
    returns ``||q - mean||^2`` (NaN or infinite when ``q`` is not finite).
    """
    D = basis.shape[0]
    nq = 0.0
    cnt = 0
    for i in range(D):
        v = np.float64(q[i])
        xq[i] = v
        a = v - mean[i]
        nq += a * a
        nz[cnt] = i  # branch-free: kept only when nonzero (image rows are half zeros, in no order a branch predicts)
        cnt += v != 0.0
    zz = z[:j1]
    for j in range(j1):
        zz[j] = -shift[j]
    t = 0
    while t + 4 <= cnt:
        i0 = nz[t]
        i1 = nz[t + 1]
        i2 = nz[t + 2]
        i3 = nz[t + 3]
        a0 = xq[i0]
        a1 = xq[i1]
        a2 = xq[i2]
        a3 = xq[i3]
        b0 = basis[i0, :j1]
        b1 = basis[i1, :j1]
        b2 = basis[i2, :j1]
        b3 = basis[i3, :j1]
        for j in range(j1):
            zz[j] += (a0 * b0[j] + a1 * b1[j]) + (a2 * b2[j] + a3 * b3[j])
        t += 4
    while t < cnt:
        a0 = xq[nz[t]]
        b0 = basis[nz[t], :j1]
        for j in range(j1):
            zz[j] += a0 * b0[j]
        t += 1
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
def _codes(z, codec, j1, u):  # IN z (>= j1,) float64, codec (m, 4); OUT u[:j1] float32
    """The query's coordinates in the stored units: ``u = (z - lo) / step`` (float32)."""
    for j in range(j1):
        u[j] = np.float32((z[j] - codec[j, 0]) * codec[j, 1])


@njit(**_JIT)
def _center_distances(u, codec, centers_t, pd32, pd):  # IN u (>= h,), centers_t (h, L); OUT pd32, pd (L,)
    """Squared distances of the head ``u[:h]`` to the list centroids (float32, stored in ``pd`` as float64)."""
    h, L = centers_t.shape
    for c in range(L):
        pd32[c] = 0.0
    j = 0
    while j + 2 <= h:  # two coordinates per pass over the lists (the same additions, in the same order)
        u0 = u[j]
        u1 = u[j + 1]
        w0 = codec[j, 2]
        w1 = codec[j + 1, 2]
        col0 = centers_t[j]
        col1 = centers_t[j + 1]
        for c in range(L):
            t0 = u0 - np.float32(col0[c])
            t1 = u1 - np.float32(col1[c])
            pd32[c] = (pd32[c] + w0 * (t0 * t0)) + w1 * (t1 * t1)
        j += 2
    while j < h:
        uj = u[j]
        wj = codec[j, 2]
        col = centers_t[j]
        for c in range(L):
            t = uj - np.float32(col[c])
            pd32[c] += wj * (t * t)
        j += 1
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
    worst = np.inf  # the distance of the last kept list once nprobe are kept (lists come in increasing index)
    for c in range(L):
        d = pd[c]
        if p == nprobe and not d < worst or sizes[c] == 0:  # a later list ties after the kept ones
            continue
        t = p if p < nprobe else nprobe - 1
        while t > 0 and _before(d, c, pd[probe[t - 1]], probe[t - 1]):
            probe[t] = probe[t - 1]
            t -= 1
        probe[t] = c
        if p < nprobe:
            p += 1
        if p == nprobe:
            worst = pd[probe[p - 1]]
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
def probe_distances(Q, qdata, qind, qptr, sparse, ix, out):  # OUT out (n_q, L) float64
    """The kernels' own list distances of every query (for calibration and diagnostics)."""
    mean, basis, shift, codec, centers_t = ix[:5]
    h, L = centers_t.shape
    D = basis.shape[0]
    n_q = out.shape[0]
    for ch in prange((n_q + QUERY_CHUNK - 1) // QUERY_CHUNK):
        z = np.empty(h)
        u = np.empty(h, dtype=np.float32)
        xq = np.empty(D)
        nz = np.empty(D, dtype=np.int64)
        pd32 = np.empty(L, dtype=np.float32)
        for i in range(ch * QUERY_CHUNK, min((ch + 1) * QUERY_CHUNK, n_q)):
            if sparse:
                _project_csr(qdata, qind, qptr[i], qptr[i + 1], basis, h, z)
            else:
                _project(Q[i], mean, basis, shift, h, z, xq, nz)
            _codes(z, codec, h, u)
            _center_distances(u, codec, centers_t, pd32, out[i])


@njit(**_JIT)
def _choice_buffers(h, D, L):
    """Buffers of one query's list choice: ``(z, xq, nz, u, pd32, pd, probe)``."""
    return (np.empty(h), np.empty(D), np.empty(D, dtype=np.int64), np.empty(h, dtype=np.float32),
            np.empty(L, dtype=np.float32), np.empty(L), np.empty(L, dtype=np.int64))


@njit(**_JIT)
def probe_batch(i0, i1, Q, ix, given, own, nprobe, k, zh, nq, chosen, n_chosen):
    """Lists probed by the dense queries ``i0 <= i < i1`` of a batch, chosen as :func:`_select_lists` does for one.

    IN ``Q`` (n_q, D) float64; ``given`` (n_q, L): the lists' distances
    when not ``own``. OUT ``zh`` (n_q, h): the head coordinates (as the
    search kernel projects them), ``nq``: ``||q - mean||^2``, ``chosen``
    (n_q, >= the most lists probed) and ``n_chosen``: the probed lists,
    nearest first (none for a query that is not finite).
    """
    mean, basis, shift, codec, centers_t, sizes = ix[:6]
    h = zh.shape[1]
    L = sizes.shape[0]
    D = basis.shape[0]
    z, xq, nz, u, pd32, pd, probe = _choice_buffers(h, D, L)
    for i in range(i0, i1):
        nq[i] = _project(Q[i], mean, basis, shift, h, z, xq, nz)
        zh[i] = z
        if not np.isfinite(nq[i]):
            n_chosen[i] = 0
            continue
        if own:
            _codes(z, codec, h, u)
            _center_distances(u, codec, centers_t, pd32, pd)
            p = _select_lists(pd, sizes, nprobe, k, probe)
        else:
            p = _select_lists(given[i], sizes, nprobe, k, probe)
        n_chosen[i] = p
        chosen[i, :p] = probe[:p]
