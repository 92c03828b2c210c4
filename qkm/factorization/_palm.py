"""palm4MSA, the PALM sweeper: private implementation (public API in :mod:`qkm.factorization`).

Problem (Le Magoarou & Gribonval 2016; QuickK-means appendix, Algorithm 2)::

    min  f = ||W (T - lam S_1 ... S_Q)||_F^2     s.t.  S_q in E_q,  ||S_q||_F = 1
    W = diag(w)  (a fixed left factor, never stored in S_1)

PALM updates the factors right to left, one projected gradient step each, then
sets ``lam`` to its closed form ``<WT, WP> / <WP, WP>``.

Cost of a sweep. Nothing of size ``K x D`` is formed per factor:

* the left products ``L_q = W S_1..S_{q-1}`` and their Grams ``L_q^T L_q`` are
  rebuilt once per sweep (``Lt`` stores ``L_q^T``);
* the right side is carried as the sweep moves left: ``N = WT R^T`` and
  ``G = R R^T`` (``N <- N S^T``, ``G <- S G S^T``), so an inner factor's gradient
  ``lam^2 (L^T L) S G - lam L^T N`` needs two dense ``r x r x r`` BLAS products;
* every product with a factor (or with a step ``S_new - S``) is a CSR x dense
  product streaming contiguous rows (:class:`qkm.factorization._palm_products.SweepMatrix`; factors hold about
  ``s`` nonzeros per row), so the one ``K x A x D`` BLAS product left per sweep is
  the last factor's gradient. Arrays with a ``D`` dimension are kept transposed.

Step size. ``1/c`` with ``c = 1.001 lam^2 ||L||_2^2 ||R||_2^2``. The norms come
from power iterations on the ``r x r`` Grams warm-started from the previous
sweep's vectors (2 matrix-vector products, not an ``O(r^3)`` eigensolver). A
power iteration gives a *lower* bound, so each step is verified: ``f`` is
quadratic in one factor, hence for ``Delta = S_new - S``, exactly,

    f(S_new) - f(S) = <grad, Delta> + kappa / 2,    kappa = lam^2 ||L Delta R||_F^2,

and the descent lemma that PALM's decrease argument uses (Bolte et al. 2014,
applied at the pair (S, S_new) only) holds with constant ``c`` iff
``kappa <= c ||Delta||^2``. ``kappa`` costs two sparse products. When the check
fails, ``c`` is replaced by the certified ``1.001 lam^2 eigvalsh(L^T L)[-1]
eigvalsh(G)[-1]`` (a true upper bound of the Lipschitz constant, up to rounding)
and the step is redone; this is rare (``n_certified``).

Monotonicity. ``splincol`` (the union of the ``s`` largest entries of each row
and of each column) is not an exact Euclidean projection onto its set ``E``
(matrices whose nonzeros can each be charged to their row or their column, at
most ``s`` per row and per column): the greedy union can capture less of the
gradient step than the current support, and then ``f`` can go up. Such a step
is redone on the current support (the exact projection onto ``{supp <= supp(S),
unit norm}``, a subset of ``E``: a descent step), and if even that fails the
factor is kept (see docs/decisions.md, 'palm4MSA'). Hence ``f`` never increases in :func:`palm`. A start factor in ``E``
(checked exactly by :func:`qkm.factorization._projections.splincol_feasible`) is only normalised, so a warm
start from a previous result continues from it; anything else is projected.

Target. The sweeper touches the target only through ``WTt`` (``(W T)^T``, dense
``D x K``): its product with the last factor (``N``), ``<WT, WP>`` for ``lam``
and the residual ``Et = WTt - lam (WP)^T`` that gives the last factor's
gradient. A sparse or very wide target replaces these three uses (and keeps
the last factor's products sparse); the inner factors only ever see ``r x r``
Grams and ``r x K`` products.

Hierarchical palm4MSA (the first factorisation) is in :mod:`qkm.factorization._hierarchical`,
the projections in :mod:`qkm.factorization._projections`.
"""

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from .._config import _JIT
from ._palm_products import SweepMatrix
from ._projections import is_feasible, project

__all__ = ["PalmState", "palm"]

#: Safety factor on the Lipschitz constant (FAuST's and qkmeans' value).
LIPSCHITZ_MARGIN = 1.001

#: Warm power iterations per Gram matrix and sweep (more the first time).
POWER_ITER_WARM = 2
POWER_ITER_COLD = 8


@dataclass
class PalmState:
    """Outcome of :func:`palm` (``factors`` is the list passed in, updated)."""
    factors: list
    lam: float
    objective: float
    history: list = field(default_factory=list)
    n_iter: int = 0
    n_certified: int = 0      # steps that needed the exact (eigvalsh) Lipschitz constant
    n_restricted: int = 0     # splincol steps that did not decrease f, redone on the old support
    n_rejected: int = 0       # steps where even that did not decrease f (factor kept)
    start_objective: float = float("nan")   # f at the start (least-squares sweeps)
    path: str = "dense"       # "columns": run on the active columns only (qkm.factorization._columns)
    n_columns: int = 0        # columns the sweeps ran on
    target: str = "dense"     # "sparse": the target and the last factor kept sparse (qkm.factorization._lsq_sparse)
    start: str = ""           # first factorisation: "hierarchical" (palm4MSA) or "exact" (identities + target)
    support_iter: object = None  # sweeps of a refit that moved the supports (QK-means records it; None: not set)


@functools.lru_cache(maxsize=64)
def _seed(n):
    # deterministic, positive, and not orthogonal to structured (e.g. Hadamard) eigenvectors
    v = np.sin(np.arange(1, n + 1) * 1.2345) + 1.5
    v /= np.linalg.norm(v)
    v.flags.writeable = False
    return v


@njit(**_JIT)
def power_iterate(
    G,                              # IN  (n, n) symmetric positive semi-definite
    v,                              # IN/OUT (n,) unit start vector -> last iterate
    n_it,                           # IN  iterations
):
    """Power iteration; returns ``||G v||`` for the last unit ``v``: a lower bound of ``lambda_max``."""
    n = G.shape[0]
    u = np.empty(n)
    mu = 0.0
    for _ in range(n_it):
        for i in range(n):
            u[i] = 0.0
        for j in range(n):                  # u = G v as row additions (G symmetric): vectorisable
            vj = v[j]
            for i in range(n):
                u[i] += vj * G[j, i]
        ss = 0.0
        for i in range(n):
            ss += u[i] * u[i]
        mu = math.sqrt(ss)
        if mu == 0.0:
            return 0.0
        for i in range(n):
            v[i] = u[i] / mu
    return mu


def _power(G, v, n_it):
    """``(mu, v)``: power iterations on ``G`` from ``v`` (a copy is updated)."""
    v = v.copy()
    return power_iterate(G, v, n_it), v


def _top_eig(G):
    return max(float(np.linalg.eigvalsh(G)[-1]), 0.0)


class _Sweeper:
    """One PALM run on ``||WT - lam W S_1..S_Q||^2``.

    Left side, rebuilt once per sweep: ``Lt[q] = (W S_1..S_{q-1})^T`` (``r_q x K``,
    ``Lt[0]`` is ``W`` and stored as ``None``) and ``Gl[q] = Lt[q] Lt[q]^T``.
    Right side, carried right to left inside the sweep: ``Nt = (WT R^T)^T``
    (``r x K``) and ``Gr = R R^T``. Everything with a target dimension ``D`` is
    stored transposed (``D x K``) so that sparse products stream rows.
    """

    def __init__(self, WT, w, S, projs, monotone=True):
        self.monotone = monotone
        self.WTt = np.ascontiguousarray(WT.T)
        self.w = w
        self.w2 = None if w is None else w * w
        self.S = S
        self.M = [SweepMatrix(a) for a in S]
        self.projs = projs
        self.vl = {}
        self.vr = {}
        self.n_certified = self.n_restricted = self.n_rejected = 0

    def _wl(self, X):                   # W X
        return X if self.w is None else self.w[:, None] * X

    def _w2l(self, X):                  # W^2 X
        return X if self.w2 is None else self.w2[:, None] * X

    def _w2max(self):
        return 1.0 if self.w2 is None else float(self.w2.max())

    def left_products(self):
        """Rebuild ``Lt``, ``Gl``; return ``(W S_1)^T``."""
        Q = len(self.S)
        self.Lt = Lt = [None] * Q
        self.Gl = Gl = [None] * Q
        first = np.ascontiguousarray(self.S[0].T)
        if self.w is not None:
            first *= self.w[None, :]
        if Q > 1:
            Lt[1] = first
        for q in range(1, Q):
            if q > 1:
                Lt[q] = self.M[q - 1].tmm(Lt[q - 1])
            Gl[q] = Lt[q] @ Lt[q].T
        return first

    def prefix(self):
        """Rebuild ``Lt``, ``Gl``; return ``(W P)^T`` (``D x K``) for the current factors."""
        first = self.left_products()
        Q = len(self.S)
        return first if Q == 1 else self.M[Q - 1].tmm(self.Lt[Q - 1])

    def _sigma_l(self, q):
        G = self.Gl[q]
        if G is None:
            return self._w2max(), self._w2max
        v = self.vl.get(q)
        mu, self.vl[q] = _power(G, _seed(G.shape[0]) if v is None else v,
                                POWER_ITER_COLD if v is None else POWER_ITER_WARM)
        return mu, lambda: _top_eig(G)

    def _sigma_r(self, q, Gr):
        v = self.vr.get(q)
        mu, self.vr[q] = _power(Gr, _seed(Gr.shape[0]) if v is None else v,
                                POWER_ITER_COLD if v is None else POWER_ITER_WARM)
        return mu, lambda: _top_eig(Gr)

    def _step(self, q, grad, lam2, sl, sr, curvature):
        """One verified projected gradient step on factor ``q``; returns ``Delta`` (a SweepMatrix) or None."""
        S, M = self.S[q], self.M[q]
        (mu_l, exact_l), (mu_r, exact_r) = sl, sr
        c_est = lam2 * mu_l * mu_r
        certified = False
        if c_est <= 0.0:
            c_est, certified = lam2 * exact_l() * exact_r(), True
            self.n_certified += 1
            if c_est <= 0.0:                # L or R is zero: so is the gradient
                return None
        for restrict in (False, True):
            while True:
                Z = S - grad * (1.0 / (LIPSCHITZ_MARGIN * c_est))
                if restrict:                # exact projection onto {supp(S), unit norm}
                    Z *= S != 0.0
                    nz = math.sqrt(float(np.vdot(Z, Z)))
                    if nz == 0.0:
                        break
                    S_new = Z * (1.0 / nz)
                else:
                    S_new = project(self.projs[q], Z)
                M_new = SweepMatrix(S_new)
                Dm = M_new.sub(M)
                dd = Dm.sq()
                if dd == 0.0:
                    return None
                kappa = lam2 * curvature(Dm)
                if certified or kappa <= c_est * dd:
                    break
                # the power-iteration estimate was too low for this step: certified c, redo
                c_est, certified = lam2 * exact_l() * exact_r(), True
                self.n_certified += 1
            if restrict and nz == 0.0:
                break
            # f(S_new) - f(S), exactly (f is quadratic in S). From S = 0 (the usual init of
            # one factor) any step is taken: the descent argument needs a feasible start.
            if not self.monotone or Dm.inner(grad) + 0.5 * kappa <= 0.0 or M.nnz == 0:
                self.S[q], self.M[q] = S_new, M_new
                return Dm
            self.n_restricted += not restrict
        self.n_rejected += 1
        return None

    def sweep(self, lam, Et):
        """Update the factors right to left. ``Et = (WT - lam W P)^T`` for the current ones."""
        S, M, Lt, Gl = self.S, self.M, self.Lt, self.Gl
        Q = len(S)
        lam2 = lam * lam
        q = Q - 1
        if q == 0:
            grad = -lam * self._wl(Et.T)
            curv = lambda Dm: float(np.vdot(Dm.a, self._w2l(Dm.a)))         # Q = 1 only
        else:
            grad = -lam * (Lt[q] @ Et.T)
            curv = lambda Dm: _sq(Dm.tmm(Lt[q]))            # ||L Delta||^2
        self._step(q, grad, lam2, self._sigma_l(q), (1.0, lambda: 1.0), curv)
        if Q == 1:
            return
        Nt = M[q].mm(self.WTt)                              # (WT S_Q^T)^T
        Gr = M[q].mm(np.ascontiguousarray(S[q].T))          # S_Q S_Q^T
        for q in range(Q - 2, -1, -1):
            SG = M[q].mm(Gr)
            if q == 0:
                grad = lam2 * self._w2l(SG) - lam * self._wl(Nt.T)
            else:
                grad = lam2 * (Gl[q] @ SG) - lam * (Lt[q] @ Nt.T)
            box = []

            def curv(Dm, q=q, Gr=Gr, box=box):             # ||L Delta R||^2 = tr(D^T Gl D Gr)
                Y = Dm.mm(Gr)
                box.append(Y)
                if q == 0:
                    return Dm.inner(Y, self.w2)
                return float(np.einsum("ij,ji->", Dm.tmm(Gl[q]), Y))

            Dm = self._step(q, grad, lam2, self._sigma_l(q), self._sigma_r(q, Gr), curv)
            if q > 0:
                SG = SG if Dm is None else SG + box[-1]     # S_new Gr
                Gr = M[q].mm(np.ascontiguousarray(SG.T))    # S_new Gr S_new^T
                Gr += Gr.T
                Gr *= 0.5
                Nt = M[q].mm(Nt)


def _sq(X):
    return float(np.vdot(X, X))


def palm(WT, w, S, lam, projs, max_iter, tol, monotone=True):
    """PALM on ``min ||WT - lam W S_1..S_Q||_F^2`` (``WT`` already weighted). ``S`` is updated in place."""
    for q, Sq in enumerate(S):  # feasible start (previous results are), the norms going into lam
        nrm = math.sqrt(float(np.vdot(Sq, Sq)))
        if nrm > 0.0:
            S[q] = Sq * (1.0 / nrm) if is_feasible(projs[q], Sq) else project(projs[q], Sq)
            lam *= nrm
    sw = _Sweeper(WT, w, S, projs, monotone)
    WTt = sw.WTt
    WPt = sw.prefix()
    if lam == 0.0:                      # no scale given: start from the closed form
        pp = _sq(WPt)
        lam = float(np.vdot(WTt, WPt)) / pp if pp > 0.0 else 0.0
    Et = WTt - lam * WPt
    f = _sq(Et)
    history = []
    for _ in range(max_iter):
        if lam == 0.0 or f == 0.0:      # stationary: zero gradient / exact fit
            break
        sw.sweep(lam, Et)
        WPt = sw.prefix()
        pp = _sq(WPt)
        if pp > 0.0:
            lam = float(np.vdot(WTt, WPt)) / pp
        Et = WTt - lam * WPt
        f_prev, f = f, _sq(Et)
        history.append(f)
        if abs(f_prev - f) < tol * f_prev:
            break
    return PalmState(S, lam, f, history, len(history), sw.n_certified, sw.n_restricted, sw.n_rejected)
