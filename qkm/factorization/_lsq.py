"""Exact least squares of one factor on a support, and support-updating sweeps (private).

Same problem as :mod:`qkm.factorization._palm`: ``min f = ||WT - lam W S_1 .. S_Q||_F^2``. For
one factor ``q`` with the others fixed, write ``X = lam S_q``, ``L = W S_1 ..
S_{q-1}``, ``R = S_{q+1} .. S_Q``; then ``f`` is the quadratic

    f(X) = ||WT||^2 - 2 <g, X> + <X, (L^T L) X (R R^T)>,    g = L^T WT R^T,

and its minimum over the matrices supported on a set ``Omega`` solves a linear
system in the values on ``Omega`` (the normal matrix has entries
``(L^T L)[i, i'] (R R^T)[j, j']``). The system splits by column for the last
factor (``R = I``), by row for the first (``L = W`` is diagonal), and is one
small dense system (a few hundred unknowns) for an inner factor. Each is
solved exactly with a tiny proximal term ``eps ||X - X_old||^2``, which keeps it
positive definite where ``L`` or ``R`` is rank-deficient and guarantees
``f(X_new) <= f(X_old)``.

A sweep visits the factors right to left with the bookkeeping of
:class:`qkm.factorization._palm._Sweeper` (prefix Grams rebuilt per sweep, right side carried).
With ``update_support`` every factor first gets a candidate support: for a
factor whose columns (the last) or rows (the first) are independent and whose
constraint is a global budget (``("sp", k)``), the greedy orthogonal least
squares of :mod:`qkm.factorization._ols`, which spends the budget where it pays; for the
others, the support a projection of a gradient step picks (hard thresholding
pursuit, Foucart 2011). The factor is solved on the candidate and keeps that
solution only if ``f`` went down (else it is solved on its current support),
so ``f`` never increases.

Why least-squares sweeps instead of PALM steps, and greedy supports for the
first and last factors: docs/decisions.md, 'Least-squares sweeps'.
"""

import math

import numpy as np
import scipy.linalg
from numba import njit

from .._config import _JIT
from ._ols import ols_support
from ._palm import LIPSCHITZ_MARGIN, PalmState, _Sweeper, _sq
from ._palm_products import SweepMatrix
from ._projections import is_feasible, project

__all__ = ["LsqSweeper", "lsq_palm", "normalise_start", "run_sweeps"]

#: Proximal weight relative to the largest diagonal entry of the normal matrix.
PROX_REL = 1e-10

#: Inner factors with more values than this take a few conjugate-gradient steps instead of a solve.
DIRECT_MAX_VALUES = 2000

#: Conjugate-gradient iterations per factor when the direct solve is too large.
CG_ITER = 10


# --------------------------------------------------------------------------- #
# Small dense solves, one per row or column of the support
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def _chol_solve(A, b, n):
    """Solve ``A[:n, :n] x = b[:n]`` in place (A symmetric positive definite, overwritten)."""
    for j in range(n):
        d = A[j, j]
        for k in range(j):
            d -= A[j, k] * A[j, k]
        if d <= 0.0:
            d = 1e-300
        d = math.sqrt(d)
        A[j, j] = d
        for i in range(j + 1, n):
            v = A[i, j]
            for k in range(j):
                v -= A[i, k] * A[j, k]
            A[i, j] = v / d
    for i in range(n):                      # L y = b
        v = b[i]
        for k in range(i):
            v -= A[i, k] * b[k]
        b[i] = v / A[i, i]
    for i in range(n - 1, -1, -1):          # L^T x = y
        v = b[i]
        for k in range(i + 1, n):
            v -= A[k, i] * b[k]
        b[i] = v / A[i, i]


@njit(**_JIT)
def lsq_by_columns(
    G,                              # IN  (a, a) Gram L^T L
    g,                              # IN  (a, D) right-hand side L^T WT
    mask,                           # IN  (a, D) bool support
    x0,                             # IN  (a, D) current values
    eps,                            # IN  proximal weight
    out,                            # OUT (a, D) solution (zero off the support)
):
    """Column ``j``: ``(G[O, O] + eps I) x = g[O, j] + eps x0[O, j]`` with ``O`` its support rows."""
    a, D = mask.shape
    A = np.empty((a, a))
    b = np.empty(a)
    rows = np.empty(a, dtype=np.int64)
    for i in range(a):
        for j in range(D):
            out[i, j] = 0.0
    for j in range(D):
        n = 0
        for i in range(a):
            if mask[i, j]:
                rows[n] = i
                n += 1
        for u in range(n):
            for v in range(n):
                A[u, v] = G[rows[u], rows[v]]
            A[u, u] += eps
            b[u] = g[rows[u], j] + eps * x0[rows[u], j]
        _chol_solve(A, b, n)
        for u in range(n):
            out[rows[u], j] = b[u]


@njit(**_JIT)
def lsq_by_rows(
    w2,                             # IN  (K,) squared row weights (the diagonal L^T L)
    G,                              # IN  (b, b) Gram R R^T
    g,                              # IN  (K, b) right-hand side W WT R^T
    mask,                           # IN  (K, b) bool support
    x0,                             # IN  (K, b) current values
    eps,                            # IN  proximal weight
    out,                            # OUT (K, b)
):
    """Row ``i``: ``(w_i^2 G[O, O] + eps I) x = g[i, O] + eps x0[i, O]`` with ``O`` its support columns."""
    K, m = mask.shape
    A = np.empty((m, m))
    b = np.empty(m)
    cols = np.empty(m, dtype=np.int64)
    for i in range(K):
        n = 0
        for j in range(m):
            out[i, j] = 0.0
            if mask[i, j]:
                cols[n] = j
                n += 1
        for u in range(n):
            for v in range(n):
                A[u, v] = w2[i] * G[cols[u], cols[v]]
            A[u, u] += eps
            b[u] = g[i, cols[u]] + eps * x0[i, cols[u]]
        _chol_solve(A, b, n)
        for u in range(n):
            out[i, cols[u]] = b[u]


# --------------------------------------------------------------------------- #
# One factor
# --------------------------------------------------------------------------- #
class _Sides:
    """``L^T L`` (``Gl``, or the diagonal ``w2`` when ``L = W``) and ``R R^T`` (``Gr``, or None for ``I``)."""

    __slots__ = ("Gl", "w2", "Gr")

    def __init__(self, Gl, w2, Gr):
        self.Gl, self.w2, self.Gr = Gl, w2, Gr

    def apply(self, X):
        """``(L^T L) X (R R^T)``."""
        Y = (X if self.w2 is None else self.w2[:, None] * X) if self.Gl is None else self.Gl @ X
        return Y if self.Gr is None else Y @ self.Gr

    def diag_max(self):
        left = (1.0 if self.w2 is None else float(self.w2.max())) if self.Gl is None else float(np.diag(self.Gl).max())
        right = 1.0 if self.Gr is None else float(np.diag(self.Gr).max())
        return max(left * right, 1e-300)


def _solve_on(sides, g, mask, X0):
    """``argmin_{supp X <= mask} f(X) + eps ||X - X0||^2`` (exact, or CG for very large inner factors)."""
    eps = PROX_REL * sides.diag_max()
    out = np.zeros(X0.shape)
    if sides.Gr is None and sides.Gl is None:           # Q = 1: diagonal system
        w2 = np.ones(X0.shape[0]) if sides.w2 is None else sides.w2
        return np.where(mask, (g + eps * X0) / (w2[:, None] + eps), 0.0)
    if sides.Gr is None:
        lsq_by_columns(sides.Gl, g, mask, X0, eps, out)
        return out
    if sides.Gl is None:
        w2 = np.ones(X0.shape[0]) if sides.w2 is None else sides.w2
        lsq_by_rows(w2, sides.Gr, g, mask, X0, eps, out)
        return out
    ii, jj = np.nonzero(mask)
    rhs = g[ii, jj] + eps * X0[ii, jj]
    if ii.size <= DIRECT_MAX_VALUES:
        N = sides.Gl[np.ix_(ii, ii)] * sides.Gr[np.ix_(jj, jj)]
        N[np.diag_indices_from(N)] += eps
        out[ii, jj] = scipy.linalg.cho_solve(scipy.linalg.cho_factor(N, lower=True, check_finite=False), rhs,
                                             check_finite=False)
        return out
    x = X0[ii, jj].copy()                               # conjugate gradient from the current values
    P = np.zeros(X0.shape)

    def normal(v):
        P[ii, jj] = v
        return sides.apply(P)[ii, jj] + eps * v

    r = rhs - normal(x)
    d = r.copy()
    rr = float(r @ r)
    for _ in range(CG_ITER):
        if rr == 0.0:
            break
        Nd = normal(d)
        alpha = rr / float(d @ Nd)
        x += alpha * d
        r -= alpha * Nd
        rr, rr_old = float(r @ r), rr
        d = r + (rr / rr_old) * d
    out[ii, jj] = x
    return out


def _delta_f(sides, g, X, X0):
    """``f(X) - f(X0)`` exactly."""
    D = X - X0
    return -2.0 * float(np.vdot(g, D)) + float(np.vdot(D, sides.apply(X + X0)))


class LsqSweeper(_Sweeper):
    """Right-to-left sweeps of exact least squares per factor (see the module docstring)."""

    def __init__(self, WT, w, S, projs):
        super().__init__(WT, w, S, projs, monotone=True)
        self.ols_last = True            # False: the last factor's supports by a gradient step (as the sparse sweeps)
        self.n_support_changes = 0      # factors whose support the projection changed and that kept it
        self.n_support_rejected = 0     # candidate supports that did not lower f

    def _support(self, q, sides, g, X0, sigma):
        """A candidate support: greedy OLS for a factor with independent columns (or rows) and a global
        budget, else the support of a projected gradient step (hard thresholding pursuit); None if none."""
        spec = self.projs[q]
        if spec[0] == "sp" and (sides.Gr is None) != (sides.Gl is None) and (self.ols_last or sides.Gl is None):
            if sides.Gr is None:                        # R = I: the atoms are the columns of L
                mask = np.empty(X0.shape, dtype=np.bool_)
                ols_support(sides.Gl, g, np.ones(X0.shape[1]), int(spec[1]), mask)
                return mask
            mask_t = np.empty(X0.shape[::-1], dtype=np.bool_)  # L = W: the atoms are the rows of R
            ols_support(sides.Gr, np.ascontiguousarray(g.T), sides.w2, int(spec[1]), mask_t)
            return mask_t.T
        grad = sides.apply(X0) - g
        c = LIPSCHITZ_MARGIN * sigma()
        if c <= 0.0:
            return None
        return project(spec, X0 - grad * (1.0 / c)) != 0.0

    def _factor(self, q, sides, g, lam, update_support, sigma):
        """New ``X = lam S_q``: on a candidate support if that lowers f, else on the current one."""
        X0 = lam * self.S[q]
        mask0 = X0 != 0.0
        if update_support:
            mask = self._support(q, sides, g, X0, sigma)
            if mask is not None:
                if not np.array_equal(mask, mask0):
                    X = _solve_on(sides, g, mask, X0)
                    if _delta_f(sides, g, X, X0) < 0.0:
                        self.n_support_changes += 1
                        return X
                    self.n_support_rejected += 1
        X = _solve_on(sides, g, mask0, X0)
        return X if _delta_f(sides, g, X, X0) <= 0.0 else X0

    def scale_and_error(self, lam, closed_form):
        """``(lam, f)`` for the current factors: ``lam`` replaced by its closed form when asked (and defined)."""
        WPt = self.prefix()
        if closed_form:
            pp = _sq(WPt)
            if pp > 0.0:
                lam = float(np.vdot(self.WTt, WPt)) / pp
        return lam, _sq(self.WTt - lam * WPt)

    def last_factor(self, q, lam, update_support):
        """Solve the last factor ``q = Q - 1 >= 1`` (``R = I``); returns ``(lam, Nt, Gr)`` for the next factor."""
        S, M = self.S, self.M
        g = self.Lt[q] @ self.WTt.T
        sides = _Sides(self.Gl[q], None, None)
        X = self._factor(q, sides, g, lam, update_support, lambda: self._sigma_l(q)[0])
        nrm = math.sqrt(_sq(X))
        if nrm > 0.0:
            lam = nrm
            S[q] = X * (1.0 / nrm)
            M[q] = SweepMatrix(S[q])
        Nt = M[q].mm(self.WTt)
        Gr = M[q].mm(np.ascontiguousarray(S[q].T))
        Gr += Gr.T
        Gr *= 0.5
        return lam, Nt, Gr

    def sweep(self, lam, update_support):
        """Update every factor right to left; returns the scale ``lam`` (norm of the last solved ``X``)."""
        S, M, Lt, Gl = self.S, self.M, self.Lt, self.Gl
        Q = len(S)
        Nt = Gr = None
        for q in range(Q - 1, -1, -1):
            R_is_I = q == Q - 1
            if R_is_I and q > 0:
                lam, Nt, Gr = self.last_factor(q, lam, update_support)
                continue
            if q == 0:
                g = self._wl(self.WTt.T if R_is_I else Nt.T)
                sides = _Sides(None, self.w2 if self.w2 is not None else np.ones(S[0].shape[0]),
                               None if R_is_I else Gr)
            else:
                g = Lt[q] @ Nt.T
                sides = _Sides(Gl[q], None, Gr)

            def sigma(q=q, Gr=Gr, R_is_I=R_is_I):
                return self._sigma_l(q)[0] * (1.0 if R_is_I else self._sigma_r(q, Gr)[0])

            X = self._factor(q, sides, g, lam, update_support, sigma)
            nrm = math.sqrt(_sq(X))
            if nrm > 0.0:
                lam = nrm
                S[q] = X * (1.0 / nrm)
                M[q] = SweepMatrix(S[q])
            if q > 0:
                SG = M[q].mm(Gr)
                Gr = M[q].mm(np.ascontiguousarray(SG.T))
                Nt = M[q].mm(Nt)
                Gr += Gr.T
                Gr *= 0.5
        return lam


def normalise_start(S, lam, projs):
    """Unit-norm feasible factors (a feasible one only scaled); returns ``lam`` times the norms taken out."""
    for q, Sq in enumerate(S):
        nrm = math.sqrt(float(np.vdot(Sq, Sq)))
        if nrm > 0.0:
            S[q] = Sq * (1.0 / nrm) if is_feasible(projs[q], Sq) else project(projs[q], Sq)
            lam *= nrm
    return lam


def run_sweeps(sw, lam, max_iter, tol, support_iter):
    """The sweep loop shared by the dense and the sparse-target sweepers; returns ``(lam, f, f0, history)``."""
    lam, f = sw.scale_and_error(lam, lam == 0.0)
    f0 = f
    history = []
    for it in range(max_iter):
        if lam == 0.0 or f == 0.0:
            break
        lam = sw.sweep(lam, it < support_iter)
        lam, f_new = sw.scale_and_error(lam, True)
        f_prev, f = f, f_new
        history.append(f)
        if abs(f_prev - f) < tol * f_prev:
            break
    return lam, f, f0, history


def lsq_palm(WT, w, S, lam, projs, max_iter, tol, support_iter, ols_last=True):
    """At most ``max_iter`` least-squares sweeps on ``min ||WT - lam W S_1..S_Q||_F^2``, the first
    ``support_iter`` of them updating the supports (within ``projs``); they stop when one changes ``f`` by
    less than ``tol`` times its value. ``S`` is updated in place; ``f`` never increases. ``ols_last=False``
    moves the last factor's support by a gradient step (hard thresholding pursuit) instead of greedy OLS."""
    lam = normalise_start(S, lam, projs)
    sw = LsqSweeper(WT, w, S, projs)
    sw.ols_last = ols_last
    lam, f, f0, history = run_sweeps(sw, lam, max_iter, tol, support_iter)
    return PalmState(S, lam, f, history, len(history), sw.n_certified, sw.n_support_changes, sw.n_support_rejected,
                     f0, "dense", WT.shape[1])

