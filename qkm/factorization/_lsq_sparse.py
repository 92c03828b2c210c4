"""Least-squares sweeps with a sparse target and a sparse wide factor (private; wide sparse data).

Same problem and sweeps as :mod:`qkm.factorization._lsq`, ``min f = ||WT - lam
W S_1 .. S_Q||_F^2``, when the target ``WT`` (``K x D`` weighted cluster means
of tf-idf data) is sparse and ``D`` is large. Only the last factor ``S_Q``
(``A x D``) and the target have a ``D`` dimension; here they stay sparse:

* the target is kept as CSR ``WT^T`` (``D x K``), ``S_Q`` as CSR ``S_Q^T``
  (``D x A``: a row per column of ``S_Q``);
* the last factor's columns are independent (``R = I``): column ``j`` is solved
  on its support ``O_j`` from ``(L^T L)[O_j, O_j]`` and the correlations
  ``(L^T WT)[O_j, j]``, computed from the nonzeros of column ``j`` of the
  target only, and the exact change of ``f`` is accumulated per column on
  ``O_j`` union the old support (:func:`solve_columns`): a sweep on fixed
  supports costs about ``nnz(WT) s`` plus ``D s^3``, not ``K A D``;
* a support update of the last factor is a gradient step (hard thresholding
  pursuit: the ``s D`` largest ``|S_Q - grad / c|``): the correlations ``L^T
  WT`` are formed from the sparse target (``nnz(WT) A`` flops) one column at a
  time and only the running largest entries are kept (a pool of about
  ``1.5 s D``, never an ``A x D`` buffer: :func:`gradient_step_support`), then
  the values are solved on that support and kept if ``f`` went down. The
  dense sweeps use greedy OLS there (:mod:`qkm.factorization._ols`), whose
  Gram-Schmidt pool alone is ``s D A`` values (see docs/decisions.md,
  'Wide sparse targets');
* the inner factors see ``S_Q WT^T`` (``A x K``) and ``S_Q S_Q^T`` (``A x A``),
  sparse products, and are solved exactly as in the dense sweeps;
* ``lam`` and ``f`` come from Grams, never from a ``K x D`` residual:
  ``<WT, W P> = <L^T, S_Q WT^T>``, ``||W P||^2 = <L^T L, S_Q S_Q^T>`` and
  ``f = ||WT||^2 - 2 lam <WT, W P> + lam^2 ||W P||^2``.

The sweeps are those of the dense code (same supports, values to rounding;
``tests/factorization/test_wide_sparse.py`` compares them); :func:`qkm.factorization._factorize.lsq_refit`
chooses this path for sparse targets and records it (``target="sparse"``).
"""

import math

import numpy as np
import scipy.sparse as sp
from numba import njit

from .._config import _JIT
from ._lsq import PROX_REL, LsqSweeper, _chol_solve, normalise_start, run_sweeps
from ._palm import LIPSCHITZ_MARGIN, PalmState
from ._palm_products import SweepMatrix
from ._projections import project

__all__ = ["gradient_step_support", "right_products", "solve_columns", "sparse_lsq_palm"]


@njit(**_JIT)
def solve_columns(
    G,                              # IN  (a, a) Gram L^T L
    L,                              # IN  (K, a) L = W S_1 .. S_{Q-1}
    tptr, tidx, tval,               # IN  CSR of WT^T (D x K): column j of the target
    ptr, rows,                      # IN  support: column j of the factor on rows[ptr[j]:ptr[j + 1]]
    optr, orows, ovals,             # IN  current values X0 (same layout)
    eps,                            # IN  proximal weight
    vals,                           # OUT (ptr[-1],) the solution on the support
):
    """Column ``j``: ``(G[O, O] + eps I) x = (L^T WT)[O, j] + eps x0[O]``; returns ``f(X) - f(X0)`` exactly."""
    a = G.shape[0]
    n = ptr.shape[0] - 1
    A = np.empty((a, a))
    b = np.empty(a)
    x0 = np.zeros(a)
    d = np.zeros(a)                         # X - X0 on the union of the supports
    s = np.zeros(a)                         # X + X0
    gc = np.zeros(a)                        # correlations of this column
    seen = np.zeros(a, dtype=np.bool_)
    union = np.empty(a, dtype=np.int64)
    delta = 0.0
    for j in range(n):
        nu = 0
        for p in range(optr[j], optr[j + 1]):
            r = orows[p]
            x0[r] = ovals[p]
            d[r] = -ovals[p]
            s[r] = ovals[p]
            seen[r] = True
            union[nu] = r
            nu += 1
        base = ptr[j]
        m = ptr[j + 1] - base
        for u in range(m):
            r = rows[base + u]
            if not seen[r]:
                seen[r] = True
                union[nu] = r
                nu += 1
        for p in range(tptr[j], tptr[j + 1]):       # (L^T WT)[union, j] from the nonzeros of column j
            k = tidx[p]
            v = tval[p]
            for t in range(nu):
                r = union[t]
                gc[r] += v * L[k, r]
        for u in range(m):
            ru = rows[base + u]
            for v in range(m):
                A[u, v] = G[ru, rows[base + v]]
            A[u, u] += eps
            b[u] = gc[ru] + eps * x0[ru]
        _chol_solve(A, b, m)
        for u in range(m):
            r = rows[base + u]
            vals[base + u] = b[u]
            d[r] += b[u]
            s[r] += b[u]
        for t in range(nu):                         # -2 <g, d> + d^T G s
            r = union[t]
            acc = -2.0 * gc[r]
            for t2 in range(nu):
                acc += G[r, union[t2]] * s[union[t2]]
            delta += d[r] * acc
        for t in range(nu):
            r = union[t]
            x0[r] = 0.0
            d[r] = 0.0
            s[r] = 0.0
            gc[r] = 0.0
            seen[r] = False
    return delta


@njit(**_JIT)
def right_products(
    tptr, tidx, tval,               # IN  CSR of WT^T (D x K)
    ptr, rows, vals,                # IN  CSR of S_Q^T (D x A)
    Nt,                             # OUT (A, K) S_Q WT^T
    Gr,                             # OUT (A, A) S_Q S_Q^T
):
    """Both products in one pass over the columns ``j`` of ``D``: ``sum_j |O_j| (nnz(WT[:, j]) + |O_j|)``."""
    Nt[:, :] = 0.0
    Gr[:, :] = 0.0
    for j in range(ptr.shape[0] - 1):
        for p in range(ptr[j], ptr[j + 1]):
            r = rows[p]
            v = vals[p]
            for t in range(tptr[j], tptr[j + 1]):
                Nt[r, tidx[t]] += v * tval[t]
            for p2 in range(ptr[j], ptr[j + 1]):
                Gr[r, rows[p2]] += v * vals[p2]


@njit(**_JIT)
def _keep_top(pv, pp, n, k):
    """Keep the pool entries ``>=`` its ``k``-th largest value (order kept); returns ``(count, that value)``."""
    thr = np.partition(pv[:n].copy(), n - k)[n - k]
    m = 0
    for u in range(n):
        if pv[u] >= thr:
            pv[m] = pv[u]
            pp[m] = pp[u]
            m += 1
    return m, thr


@njit(**_JIT)
def gradient_step_support(
    tptr, tidx, tval,               # IN  CSR of WT^T (D x K)
    L,                              # IN  (K, A) L = W S_1 .. S_{Q-1}
    xptr, xrows, xvals,             # IN  CSR of X0^T (D x A)
    G,                              # IN  (A, A) L^T L
    inv_c,                          # IN  step 1 / c
    k,                              # IN  budget (>= 1)
    pool_cap,                       # IN  initial room of the candidate pool (>= A)
    ptr,                            # OUT (D + 1,) support of row j of S_Q^T: rows[ptr[j]:ptr[j + 1]]
    rows,                           # OUT (>= k,)
):
    """The ``k`` largest ``|X0 - grad / c|``, ``grad = (L^T L) X0 - L^T WT``, as row lists; returns how many.

    Column ``j`` (a row of ``S_Q^T``) at a time: ``(L^T WT)[:, j]`` from the
    nonzeros of column ``j`` of the target, then the step; only the entries
    at or above the running ``k``-th largest value are kept in a pool (about
    ``1.5 k`` entries), never an ``A x D`` buffer. Ties at the threshold: the
    first in row-major order of ``S_Q^T``; zeros are never kept.
    """
    n_cols = xptr.shape[0] - 1
    a = L.shape[1]
    z = np.empty(a)
    pv = np.empty(pool_cap)
    pp = np.empty(pool_cap, dtype=np.int64)
    n = 0
    floor = 0.0
    for j in range(n_cols):
        for i in range(a):
            z[i] = 0.0
        for t in range(tptr[j], tptr[j + 1]):
            v = tval[t]
            kk = tidx[t]
            for i in range(a):
                z[i] += v * L[kk, i]
        for i in range(a):
            z[i] *= inv_c
        for p in range(xptr[j], xptr[j + 1]):
            r = xrows[p]
            v = xvals[p]
            z[r] += v
            for i in range(a):
                z[i] -= inv_c * v * G[r, i]
        if n + a > pv.shape[0]:
            if n > k:
                n, floor = _keep_top(pv, pp, n, k)
            if n + a > pv.shape[0]:                  # many ties: more room
                pv2 = np.empty(2 * pv.shape[0] + a)
                pp2 = np.empty(2 * pv.shape[0] + a, dtype=np.int64)
                pv2[:n] = pv[:n]
                pp2[:n] = pp[:n]
                pv, pp = pv2, pp2
        for i in range(a):
            zi = abs(z[i])
            if zi > 0.0 and zi >= floor:
                pv[n] = zi
                pp[n] = j * a + i
                n += 1
    thr = 0.0
    n_ties = 0
    if n > k:
        thr = np.partition(pv[:n].copy(), n - k)[n - k]
        n_ties = k
        for u in range(n):
            if pv[u] > thr:
                n_ties -= 1
    m = 0
    ptr[:] = 0
    for u in range(n):
        if pv[u] > thr or (pv[u] == thr and n_ties > 0):
            if pv[u] == thr:
                n_ties -= 1
            rows[m] = pp[u] % a
            ptr[pp[u] // a + 1] += 1
            m += 1
    for j in range(n_cols):
        ptr[j + 1] += ptr[j]
    return m


def _csr_t(M):
    """CSR of ``M^T`` (``M`` scipy sparse), indices sorted."""
    T = sp.csr_matrix(M.T)
    T.sort_indices()
    return T


class SparseLsqSweeper(LsqSweeper):
    """:class:`qkm.factorization._lsq.LsqSweeper` with a CSR target and a CSR last factor.

    ``S[-1]`` is a placeholder; the last factor is ``self.last``, a CSR matrix
    holding ``S_Q^T`` (unit Frobenius norm, like the other factors).
    """

    def __init__(self, WT, w, S, last, projs):           # noqa: D107 (no super(): no dense WT^T)
        self.monotone = True
        self.WTt = _csr_t(WT)
        self.wt_sq = float(np.dot(self.WTt.data, self.WTt.data))
        self.w = w
        self.w2 = None if w is None else w * w
        self.S = S
        self.M = [SweepMatrix(a) for a in S[:-1]] + [None]
        self.last = last
        self._right_now = None
        self.projs = projs
        self.vl, self.vr = {}, {}
        self.n_certified = self.n_restricted = self.n_rejected = 0
        self.n_support_changes = self.n_support_rejected = 0
        self.ols_last = True                              # the first factor (L = W) still uses OLS

    def _right(self):
        """``(S_Q WT^T, S_Q S_Q^T)`` (``A x K``, ``A x A``, dense)."""
        a = self.last.shape[1]
        Nt, Gr = np.empty((a, self.WTt.shape[1])), np.empty((a, a))
        right_products(self.WTt.indptr, self.WTt.indices, self.WTt.data, self.last.indptr, self.last.indices,
                       self.last.data, Nt, Gr)
        return Nt, Gr

    def scale_and_error(self, lam, closed_form):
        self.left_products()
        Q = len(self.S)
        Nt, Gr = self._right_now if self._right_now is not None else self._right()
        cross = float(np.vdot(self.Lt[Q - 1], Nt))
        pp = float(np.vdot(self.Gl[Q - 1], Gr))
        if closed_form and pp > 0.0:
            lam = cross / pp
        return lam, max(self.wt_sq - 2.0 * lam * cross + lam * lam * pp, 0.0)

    def _solve(self, G, L, ptr, rows, X0, eps):
        vals = np.empty(rows.shape[0])
        delta = solve_columns(G, L, self.WTt.indptr, self.WTt.indices, self.WTt.data, ptr, rows,
                              X0.indptr, X0.indices, X0.data, eps, vals)
        return sp.csr_matrix((vals, rows, ptr), shape=X0.shape), delta

    def _candidate(self, G, L, budget, X0, q):
        """Support of a projected gradient step on the last factor (hard thresholding pursuit): ``(ptr, rows)``.

        The ``budget`` largest ``|S_Q - grad / c|``, ``c = 1.001 ||L^T L||_2`` (ties: the first in
        ``S_Q^T``'s row-major order), streamed column by column (:func:`gradient_step_support`: no
        ``A x D`` buffer; ``L^T WT`` from the nonzeros of the target, ``nnz(WT) A`` flops).
        """
        c = LIPSCHITZ_MARGIN * self._sigma_l(q)[0]
        k = min(int(budget), X0.shape[0] * L.shape[1])
        if c <= 0.0 or k <= 0:
            return None
        ptr = np.empty(X0.shape[0] + 1, dtype=np.int64)
        rows = np.empty(k, dtype=np.int64)
        n = gradient_step_support(self.WTt.indptr, self.WTt.indices, self.WTt.data, L, X0.indptr, X0.indices,
                                  X0.data, G, 1.0 / c, k, k + max(k // 2, 4 * L.shape[1]), ptr, rows)
        return ptr, rows[:n]

    def last_factor(self, q, lam, update_support):
        G = self.Gl[q]
        L = np.ascontiguousarray(self.Lt[q].T)
        X0 = self.last * lam
        eps = PROX_REL * max(float(np.diag(G).max()), 1e-300)
        X = None
        if update_support:
            cand = self._candidate(G, L, self.projs[q][1], X0, q)
            if cand is not None and not (np.array_equal(cand[0], X0.indptr) and np.array_equal(cand[1], X0.indices)):
                ptr, rows = cand
                Xc, delta = self._solve(G, L, ptr, rows, X0, eps)
                if delta < 0.0:
                    self.n_support_changes += 1
                    X = Xc
                else:
                    self.n_support_rejected += 1
        if X is None:
            Xc, delta = self._solve(G, L, X0.indptr, X0.indices, X0, eps)
            X = Xc if delta <= 0.0 else X0
        nrm = math.sqrt(float(np.dot(X.data, X.data)))
        if nrm > 0.0:
            lam = nrm
            self.last = X * (1.0 / nrm)
            self.last.eliminate_zeros()
        Nt, Gr = self._right_now = self._right()        # the same for the scale after the sweep (S_Q is done)
        return lam, Nt, Gr


def sparse_lsq_palm(WT, w, S, lam, projs, max_iter, tol, support_iter):
    """:func:`qkm.factorization._lsq.lsq_palm` with ``WT`` and ``S[-1]`` scipy sparse (``len(S) >= 2``).

    Returns a :class:`PalmState` whose last factor is CSR (``A x D``).
    """
    head = list(S[:-1])
    lam = normalise_start(head, lam, projs[:-1])
    last = _csr_t(sp.csr_matrix(S[-1], dtype=np.float64))      # S_Q^T
    last.eliminate_zeros()
    budget = projs[-1][1]
    if last.nnz > budget:                                     # not feasible: keep the largest values
        kept = project(("sp", budget), last.data[None, :])[0]
        last = sp.csr_matrix((kept, last.indices, last.indptr), shape=last.shape)
        last.eliminate_zeros()
    nrm = math.sqrt(float(np.dot(last.data, last.data)))
    if nrm > 0.0:
        last = last * (1.0 / nrm)
        lam *= nrm
    sw = SparseLsqSweeper(sp.csr_matrix(WT), w, head + [None], last, projs)
    lam, f, f0, history = run_sweeps(sw, lam, max_iter, tol, support_iter)
    factors = sw.S[:-1] + [sp.csr_matrix(sw.last.T)]
    return PalmState(factors, lam, f, history, len(history), sw.n_certified, sw.n_support_changes,
                     sw.n_support_rejected, f0, "dense", WT.shape[1])
