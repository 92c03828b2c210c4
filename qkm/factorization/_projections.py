"""Projections onto the factor constraint sets of palm4MSA (private; see :mod:`qkm.factorization._palm`).

A projection spec is a tuple:

* ``("splincol", s)``: the union of the ``s`` largest ``|Z|`` of every row and
  of every column (FAuST's ``splincol``);
* ``("rowcol", r, c)``: the union of the ``r`` largest of every row and the
  ``c`` largest of every column (the QuickK-means reference code's budget for a
  wide factor: ``s D / A`` per row and ``s`` per column);
* ``("sp", k)``: the ``k`` largest ``|Z|`` overall.

Every projection normalises its output to unit Frobenius norm (an all-zero
result stays zero). :func:`is_feasible` tells whether a matrix already lies in
a constraint set (so a warm start is only normalised, not projected).
"""

import math

import numpy as np
from numba import njit

from .._config import _JIT

__all__ = ["is_feasible", "project", "rowcol_feasible", "rowcol_into", "sp_into", "splincol_feasible",
           "splincol_into"]


@njit(inline="always", **_JIT)
def _scale_to_unit_norm(out, ss):
    """Divide ``out`` by ``sqrt(ss)``, its Frobenius norm (an all-zero ``out`` stays zero)."""
    if ss > 0.0:
        inv = 1.0 / math.sqrt(ss)
        n, m = out.shape
        for i in range(n):
            for j in range(m):
                out[i, j] *= inv


@njit(**_JIT)
def rowcol_into(
    Z,                              # IN  (n, m) float64
    r,                              # IN  entries kept per row (>= 1)
    c,                              # IN  entries kept per column (>= 1)
    out,                            # OUT (n, m) Z on the union mask, unit Frobenius norm (or 0)
):
    """Keep the ``r`` largest ``|Z|`` of every row and the ``c`` largest of every column (union), normalise.

    One pass keeps a small sorted buffer per row and per column (insertion:
    the counts are small); among equal magnitudes the smaller index wins, so
    the result is deterministic.
    """
    n, m = Z.shape
    sr = min(r, m)
    sc = min(c, n)
    rv = np.empty(sr)
    ri = np.empty(sr, dtype=np.int64)
    cv = np.empty((m, sc))
    ci = np.empty((m, sc), dtype=np.int64)
    cc = np.zeros(m, dtype=np.int64)
    for i in range(n):
        for j in range(m):
            out[i, j] = 0.0
    ss = 0.0
    for i in range(n):
        cnt = 0
        for j in range(m):
            a = abs(Z[i, j])
            if cnt < sr or a > rv[sr - 1]:             # row buffer
                if cnt < sr:
                    p = cnt
                    cnt += 1
                else:
                    p = sr - 1
                while p > 0 and rv[p - 1] < a:          # strict: an equal, earlier entry stays ahead
                    rv[p] = rv[p - 1]
                    ri[p] = ri[p - 1]
                    p -= 1
                rv[p] = a
                ri[p] = j
            k = cc[j]
            if k < sc or a > cv[j, sc - 1]:             # column buffer
                if k < sc:
                    p = k
                    cc[j] = k + 1
                else:
                    p = sc - 1
                while p > 0 and cv[j, p - 1] < a:
                    cv[j, p] = cv[j, p - 1]
                    ci[j, p] = ci[j, p - 1]
                    p -= 1
                cv[j, p] = a
                ci[j, p] = i
        for t in range(cnt):
            v = Z[i, ri[t]]
            out[i, ri[t]] = v
            ss += v * v
    for j in range(m):
        for t in range(cc[j]):
            i = ci[j, t]
            if out[i, j] == 0.0:                        # not a row pick (or zero anyway)
                v = Z[i, j]
                out[i, j] = v
                ss += v * v
    _scale_to_unit_norm(out, ss)


@njit(**_JIT)
def splincol_into(
    Z,                              # IN  (n, m) float64
    s,                              # IN  entries kept per row and per column
    out,                            # OUT (n, m) Z on the union mask, unit Frobenius norm (or 0)
):
    """FAuST's ``splincol(s)``: :func:`rowcol_into` with ``s`` per row and per column."""
    rowcol_into(Z, s, s, out)


@njit(**_JIT)
def keep_above_into(
    Z,                              # IN  (n, m) float64
    thr,                            # IN  threshold on |Z|
    n_ties,                         # IN  how many entries with |Z| == thr to keep (first in C order)
    out,                            # OUT (n, m) Z on the kept entries, unit Frobenius norm (or 0)
):
    """Keep ``|Z| > thr`` and the first ``n_ties`` entries equal to ``thr``; normalise."""
    n, m = Z.shape
    ss = 0.0
    for i in range(n):
        for j in range(m):
            a = abs(Z[i, j])
            keep = a > thr
            if not keep and a == thr and n_ties > 0:
                keep = True
                n_ties -= 1
            v = Z[i, j] if keep else 0.0
            out[i, j] = v
            ss += v * v
    _scale_to_unit_norm(out, ss)


@njit(**_JIT)
def band_select(
    a,                              # IN  (N,) values
    lo, hi,                         # IN  band [lo, hi]
    band,                           # OUT (N,) values inside the band, first n_band filled
):
    """One pass: ``(number of values < lo, number inside [lo, hi])``."""
    below = 0
    nb = 0
    for t in range(a.shape[0]):
        v = a[t]
        if v < lo:
            below += 1
        elif v <= hi:
            band[nb] = v
            nb += 1
    return below, nb


def _kth_smallest(a, t):
    """``np.partition(a, t)[t]`` for large ``a``: bracket it from a regular sample, select in the band."""
    N = a.size
    if N > 16384:
        sample = np.sort(a[:: N // 4096])
        ns = sample.size
        pos = t * ns / N
        margin = 4.0 * math.sqrt(ns) + 8.0
        lo_r, hi_r = int(pos - margin), int(pos + margin)
        lo = sample[lo_r] if lo_r >= 0 else -np.inf
        hi = sample[hi_r] if hi_r < ns else np.inf
        band = np.empty(N)
        below, nb = band_select(a, lo, hi, band)
        r = t - below
        if 0 <= r < nb:                                 # the bracket held (it nearly always does)
            return np.partition(band[:nb], r)[r]
    return np.partition(a, t)[t]


def sp_into(Z, k, out):
    """Keep the ``k`` largest ``|Z|`` overall (smaller flat index wins ties), normalise."""
    total = Z.size
    if k <= 0:
        out[...] = 0.0
        return
    if k >= total:
        keep_above_into(Z, -1.0, 0, out)
        return
    a = np.abs(Z).ravel()
    thr = _kth_smallest(a, total - k)
    keep_above_into(Z, thr, k - int(np.count_nonzero(a > thr)), out)


def project(spec, Z):
    """Apply a projection spec ``("splincol", s)``, ``("rowcol", r, c)`` or ``("sp", k)``; returns a new array."""
    out = np.empty(Z.shape)
    kind = spec[0]
    if kind == "splincol":
        splincol_into(Z, spec[1], out)
    elif kind == "rowcol":
        rowcol_into(Z, spec[1], spec[2], out)
    elif kind == "sp":
        sp_into(Z, spec[1], out)
    else:  # pragma: no cover - internal misuse
        raise ValueError(f"unknown projection {kind!r}")
    return out


@njit(**_JIT)
def splincol_feasible(
    S,                              # IN  (n, m)
    s,                              # IN  entries per row and per column
):
    """:func:`rowcol_feasible` with ``s`` per row and per column."""
    return rowcol_feasible(S, s, s)


@njit(**_JIT)
def rowcol_feasible(
    S,                              # IN  (n, m)
    r,                              # IN  entries per row
    c,                              # IN  entries per column
):
    """Whether every nonzero of ``S`` can be charged to its row (at most ``r`` each) or its column (at most ``c``).

    That is membership of the constraint set of :func:`rowcol_into` (a union of an
    ``r``-per-row and a ``c``-per-column pattern), which a projection's output and any
    matrix with a smaller support satisfy. Greedy charging, then augmenting paths
    (breadth first) for the nonzeros left over: ``O(nnz)`` per augmentation.
    """
    n, m = S.shape
    nnz = 0
    for i in range(n):
        for j in range(m):
            if S[i, j] != 0.0:
                nnz += 1
    ei = np.empty(nnz, dtype=np.int64)
    ej = np.empty(nnz, dtype=np.int64)
    cptr = np.zeros(m + 1, dtype=np.int64)
    rptr = np.zeros(n + 1, dtype=np.int64)
    e = 0
    for i in range(n):
        for j in range(m):
            if S[i, j] != 0.0:
                ei[e] = i
                ej[e] = j
                cptr[j + 1] += 1
                e += 1
        rptr[i + 1] = e
    for j in range(m):
        cptr[j + 1] += cptr[j]
    cidx = np.empty(nnz, dtype=np.int64)      # edges of each column
    fill = cptr[:-1].copy()
    for e in range(nnz):
        cidx[fill[ej[e]]] = e
        fill[ej[e]] += 1
    owner = np.full(nnz, -1, dtype=np.int64)  # node charged: row i, or column n + j
    load = np.zeros(n + m, dtype=np.int64)
    cap = np.empty(n + m, dtype=np.int64)     # capacity of each node
    cap[:n] = r
    cap[n:] = c
    left = np.empty(nnz, dtype=np.int64)
    n_left = 0
    for e in range(nnz):
        i, j = ei[e], n + ej[e]
        if load[i] < cap[i]:
            owner[e] = i
            load[i] += 1
        elif load[j] < cap[j]:
            owner[e] = j
            load[j] += 1
        else:
            left[n_left] = e
            n_left += 1
    parent = np.empty(n + m, dtype=np.int64)  # edge through which a node was reached
    queue = np.empty(n + m, dtype=np.int64)
    for t in range(n_left):
        e0 = left[t]
        parent[:] = -2
        head = 0
        tail = 2
        queue[0] = ei[e0]
        queue[1] = n + ej[e0]
        parent[queue[0]] = -1
        parent[queue[1]] = -1
        found = -1
        while head < tail and found < 0:
            u = queue[head]
            head += 1
            lo, hi = (rptr[u], rptr[u + 1]) if u < n else (cptr[u - n], cptr[u - n + 1])
            for p in range(lo, hi):
                f = p if u < n else cidx[p]
                if owner[f] != u:
                    continue
                v = n + ej[f] if u < n else ei[f]
                if parent[v] != -2:
                    continue
                parent[v] = f
                if load[v] < cap[v]:
                    found = v
                    break
                queue[tail] = v
                tail += 1
        if found < 0:
            return False
        v = found                             # move each edge of the path one step forward
        load[v] += 1
        while parent[v] >= 0:
            f = parent[v]
            u = owner[f]
            owner[f] = v
            v = u
        owner[e0] = v                         # v, an end of e0, has one edge fewer now
    return True


def is_feasible(spec, S):
    """Whether ``S`` satisfies the constraint of ``spec`` (up to normalisation)."""
    kind = spec[0]
    if kind == "sp":
        return np.count_nonzero(S) <= spec[1]
    if kind == "rowcol":
        return rowcol_feasible(S, spec[1], spec[2])
    return splincol_feasible(S, spec[1])
