"""palm4MSA and hierarchical palm4MSA: private implementation (public API in :mod:`qkm.palm4msa`).

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
  product streaming contiguous rows (:func:`csr_matmul_into`; factors hold about
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
factor is kept. On K-means centroids about half the ``splincol`` steps take
that path. Hence ``f`` never increases in :func:`palm`. A start factor in ``E``
(checked exactly by :func:`splincol_feasible`) is only normalised, so a warm
start from a previous result continues from it; anything else is projected.

Hierarchical splits use plain projected steps (``monotone=False``, FAuST's
behaviour): monotone splits lock the supports in early (measured: Hadamard
matrices are then not recovered); the global refits are monotone.
"""

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ._kernels import _JIT

#: Safety factor on the Lipschitz constant (FAuST's and qkmeans' value).
LIPSCHITZ_MARGIN = 1.001

#: Warm power iterations per Gram matrix and sweep (more the first time).
POWER_ITER_WARM = 2
POWER_ITER_COLD = 8

#: Factors with at most this fraction of nonzeros use the sparse products.
SPARSE_MAX_DENSITY = 0.15


# --------------------------------------------------------------------------- #
# Projections
# --------------------------------------------------------------------------- #
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
def splincol_into(
    Z,                              # IN  (n, m) float64
    s,                              # IN  entries kept per row and per column
    out,                            # OUT (n, m) Z on the union mask, unit Frobenius norm (or 0)
):
    """Keep the ``s`` largest ``|Z|`` of every row and of every column (union), normalise.

    One pass keeps a small sorted buffer per row and per column (insertion:
    ``s`` is small); among equal magnitudes the smaller index wins, so the
    result is deterministic.
    """
    n, m = Z.shape
    sr = min(s, m)
    sc = min(s, n)
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
    """Apply a projection spec ``("splincol", s)`` or ``("sp", k)``; returns a new array."""
    out = np.empty(Z.shape)
    kind, k = spec
    if kind == "splincol":
        splincol_into(Z, k, out)
    elif kind == "sp":
        sp_into(Z, k, out)
    else:  # pragma: no cover - internal misuse
        raise ValueError(f"unknown projection {kind!r}")
    return out


@njit(**_JIT)
def splincol_feasible(
    S,                              # IN  (n, m)
    s,                              # IN  entries per row and per column
):
    """Whether every nonzero of ``S`` can be charged to its row or its column, at most ``s`` each.

    That is membership of the constraint set of :func:`splincol_into` (a union of an
    ``s``-per-row and an ``s``-per-column pattern), which a projection's output and any
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
    left = np.empty(nnz, dtype=np.int64)
    n_left = 0
    for e in range(nnz):
        i, j = ei[e], n + ej[e]
        if load[i] < s:
            owner[e] = i
            load[i] += 1
        elif load[j] < s:
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
                if load[v] < s:
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
    kind, k = spec
    if kind == "sp":
        return np.count_nonzero(S) <= k
    return splincol_feasible(S, k)


# --------------------------------------------------------------------------- #
# Shapes and validation (the one place inputs are checked)
# --------------------------------------------------------------------------- #
def chain_shapes(n_rows, n_cols, n_factors):
    """``[(K, A), (A, A) * (Q - 2), (A, D)]`` with ``A = min(K, D)``; ``[(K, D)]`` for ``Q = 1``."""
    n_rows, n_cols = check_int("n_rows", n_rows, 1), check_int("n_cols", n_cols, 1)
    n_factors = check_int("n_factors", n_factors, 1)
    if n_factors == 1:
        return [(n_rows, n_cols)]
    a = min(n_rows, n_cols)
    return [(n_rows, a)] + [(a, a)] * (n_factors - 2) + [(a, n_cols)]


def check_int(name, value, minimum):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    return int(value)


def check_float(name, value, minimum=None):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number; got {value!r}.") from None
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be a finite number{bound}; got {value!r}.")
    return v


def check_matrix(name, a):
    """float64 C-contiguous copy of a finite 2-D array (float32 accepted)."""
    try:
        arr = np.array(a, dtype=np.float64, order="C", copy=True)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 2-D array of real numbers.") from None
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array; got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    return arr


def check_weights(weights, n_rows):
    """None, or a float64 (K,) vector of finite non-negative weights, not all zero."""
    if weights is None:
        return None
    try:
        w = np.array(weights, dtype=np.float64, copy=True)
    except (TypeError, ValueError):
        raise ValueError("weights must be a 1-D array of non-negative numbers.") from None
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"weights must have shape ({n_rows},) (one per row of target); got {w.shape}.")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or infinite values.")
    if (w < 0).any():
        raise ValueError("weights must be non-negative.")
    if not (w > 0).any():
        raise ValueError("weights must not all be zero.")
    return w


def check_palm_args(target, factors=None, *, sparsity_level=3, weights=None, n_factors=None,
                    max_iters=(), tol=1e-6, lambda_=1.0):
    """Validate and convert everything once. Returns ``(T, factors, weights)``."""
    T = check_matrix("target", target)
    check_int("sparsity_level", sparsity_level, 1)
    if n_factors is not None:
        check_int("n_factors", n_factors, 1)
    for name, value, minimum in max_iters:
        check_int(name, value, minimum)
    check_float("tol", tol, 0.0)
    check_float("lambda_", lambda_)
    w = check_weights(weights, T.shape[0])
    S = None
    if factors is not None:
        if isinstance(factors, np.ndarray) and factors.ndim != 1 or not hasattr(factors, "__len__"):
            raise ValueError("factors must be a list of 2-D arrays.")
        if len(factors) == 0:
            raise ValueError("factors must hold at least one 2-D array.")
        S = [check_matrix(f"factors[{i}]", f) for i, f in enumerate(factors)]
        shapes = [f.shape for f in S]
        ok = shapes[0][0] == T.shape[0] and shapes[-1][1] == T.shape[1] and all(
            a[1] == b[0] for a, b in zip(shapes[:-1], shapes[1:]))
        if not ok:
            raise ValueError(f"factor shapes {shapes} do not chain into the target shape {T.shape} "
                             f"(expected e.g. {chain_shapes(T.shape[0], T.shape[1], len(S))}).")
    return T, S, w


# --------------------------------------------------------------------------- #
# Sparse x dense products (factors hold about s nonzeros per row and column)
# --------------------------------------------------------------------------- #
@njit(**_JIT)
def csr_fill(
    S,                              # IN  (n, m) dense
    ptr,                            # OUT (n + 1,) row pointers
    idx, val,                       # OUT (>= nnz,) column indices (ascending per row), values
):
    """CSR of the nonzeros of ``S`` in one pass; returns nnz."""
    n, m = S.shape
    p = 0
    ptr[0] = 0
    for i in range(n):
        for j in range(m):
            v = S[i, j]
            if v != 0.0:
                idx[p] = j
                val[p] = v
                p += 1
        ptr[i + 1] = p
    return p


@njit(**_JIT)
def csr_transpose(
    ptr, idx, val,                  # IN  CSR of S (n, m)
    ptr_t, idx_t, val_t,            # OUT CSR of S.T: (m + 1,), (nnz,), (nnz,)
):
    """CSR of ``S.T`` from the CSR of ``S`` in ``O(nnz + m)``."""
    n = ptr.shape[0] - 1
    m = ptr_t.shape[0] - 1
    ptr_t[:] = 0
    for p in range(ptr[n]):
        ptr_t[idx[p] + 1] += 1
    for j in range(m):
        ptr_t[j + 1] += ptr_t[j]
    fill = ptr_t[:-1].copy()
    for i in range(n):
        for p in range(ptr[i], ptr[i + 1]):
            q = fill[idx[p]]
            idx_t[q] = i
            val_t[q] = val[p]
            fill[idx[p]] = q + 1


@njit(**_JIT)
def csr_sub(
    pa, ia, va,                     # IN  CSR of A (n rows, indices ascending)
    pb, ib, vb,                     # IN  CSR of B
    ptr, idx, val,                  # OUT CSR of A - B (capacity nnz(A) + nnz(B))
):
    """Row-by-row merge: ``A - B`` on the union of the supports; returns nnz."""
    n = pa.shape[0] - 1
    p = 0
    ptr[0] = 0
    for i in range(n):
        a, a1, b, b1 = pa[i], pa[i + 1], pb[i], pb[i + 1]
        while a < a1 or b < b1:
            if b >= b1 or (a < a1 and ia[a] < ib[b]):
                j, v = ia[a], va[a]
                a += 1
            elif a >= a1 or ib[b] < ia[a]:
                j, v = ib[b], -vb[b]
                b += 1
            else:
                j, v = ia[a], va[a] - vb[b]
                a += 1
                b += 1
            if v != 0.0:
                idx[p] = j
                val[p] = v
                p += 1
        ptr[i + 1] = p
    return p


@njit(**_JIT)
def csr_inner(
    ptr, idx, val,                  # IN  CSR of S (n, m)
    G,                              # IN  (n, m) dense
    row_weights,                    # IN  (n,) or (0,) for ones
):
    """``sum_ij w_i S_ij G_ij`` over the nonzeros of ``S``."""
    weighted = row_weights.shape[0] > 0
    total = 0.0
    for i in range(ptr.shape[0] - 1):
        acc = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            acc += val[p] * G[i, idx[p]]
        total += acc * row_weights[i] if weighted else acc
    return total


@njit(**_JIT)
def csr_matmul_into(
    ptr, idx, val,                  # IN  CSR of S (r, n)
    B,                              # IN  (n, m) dense, C-contiguous
    out,                            # OUT (r, m) S @ B
):
    """``S @ B`` as scaled row additions: contiguous, vectorisable inner loops."""
    m = B.shape[1]
    for i in range(ptr.shape[0] - 1):
        for k in range(m):
            out[i, k] = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            v = val[p]
            j = idx[p]
            for k in range(m):
                out[i, k] += v * B[j, k]


_NO_WEIGHTS = np.empty(0)


class _Mat:
    """A sparse-ish matrix with the products the sweep needs: ``S @ B``, ``S.T @ B``, ``<S, G>``.

    Held as CSR (built in one pass from the dense factor, or given: the step
    ``S_new - S`` is merged from two CSRs); its transpose is derived on first
    use. Matrices denser than ``SPARSE_MAX_DENSITY`` (the ``sp`` residual of
    the first hierarchical levels) use BLAS on the dense array instead.
    """

    __slots__ = ("shape", "_a", "csr", "nnz", "sparse", "_csrt")

    def __init__(self, a=None, csr=None, shape=None):
        self._a, self._csrt = a, None
        if csr is None:
            n, m = self.shape = a.shape
            ptr, idx, val = np.empty(n + 1, dtype=np.int64), np.empty(a.size, dtype=np.int64), np.empty(a.size)
            nnz = csr_fill(a, ptr, idx, val)
            csr = ptr, idx[:nnz], val[:nnz]
        else:
            self.shape = shape
        self.csr = csr
        self.nnz = csr[0][-1]
        self.sparse = self.nnz <= SPARSE_MAX_DENSITY * self.shape[0] * self.shape[1]

    @property
    def a(self):
        """Dense array."""
        if self._a is None:
            ptr, idx, val = self.csr
            a = np.zeros(self.shape)
            rows = np.repeat(np.arange(self.shape[0]), np.diff(ptr))
            a[rows, idx] = val
            self._a = a
        return self._a

    def sub(self, other):
        """``self - other`` (same shape) as a new :class:`_Mat`."""
        cap = self.nnz + other.nnz
        ptr, idx, val = np.empty(self.shape[0] + 1, dtype=np.int64), np.empty(cap, dtype=np.int64), np.empty(cap)
        nnz = csr_sub(*self.csr, *other.csr, ptr, idx, val)
        return _Mat(csr=(ptr, idx[:nnz], val[:nnz]), shape=self.shape)

    def sq(self):
        """``||S||_F^2``."""
        v = self.csr[2]
        return float(np.dot(v, v))

    def inner(self, G, row_weights=None):
        """``<S, diag(row_weights) G>``."""
        return csr_inner(*self.csr, G, _NO_WEIGHTS if row_weights is None else row_weights)

    def mm(self, B):
        """``S @ B`` (``B`` C-contiguous)."""
        if not self.sparse:
            return self.a @ B
        out = np.empty((self.shape[0], B.shape[1]))
        csr_matmul_into(*self.csr, B, out)
        return out

    def tmm(self, B):
        """``S.T @ B`` (``B`` C-contiguous)."""
        if not self.sparse:
            return self.a.T @ B
        if self._csrt is None:
            m = self.shape[1]
            self._csrt = (np.empty(m + 1, dtype=np.int64), np.empty(self.nnz, dtype=np.int64),
                          np.empty(self.nnz))
            csr_transpose(*self.csr, *self._csrt)
        out = np.empty((self.shape[1], B.shape[1]))
        csr_matmul_into(*self._csrt, B, out)
        return out


# --------------------------------------------------------------------------- #
# PALM core
# --------------------------------------------------------------------------- #
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
        self.M = [_Mat(a) for a in S]
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

    def prefix(self):
        """Rebuild ``Lt``, ``Gl``; return ``(W P)^T`` (``D x K``) for the current factors."""
        Q = len(self.S)
        self.Lt = Lt = [None] * Q
        self.Gl = Gl = [None] * Q
        first = np.ascontiguousarray(self.S[0].T)
        if self.w is not None:
            first *= self.w[None, :]
        if Q == 1:
            return first
        Lt[1] = first
        for q in range(1, Q):
            if q > 1:
                Lt[q] = self.M[q - 1].tmm(Lt[q - 1])
            Gl[q] = Lt[q] @ Lt[q].T
        return self.M[Q - 1].tmm(Lt[Q - 1])

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
        """One verified projected gradient step on factor ``q``; returns ``Delta`` (a _Mat) or None."""
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
                M_new = _Mat(S_new)
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


# --------------------------------------------------------------------------- #
# Hierarchical palm4MSA (residual on the right)
# --------------------------------------------------------------------------- #
def residual_budget(level, s, n_inner, n_cols):
    """Global nnz kept in the residual after split ``level`` (1-based) at intermediate levels."""
    return max(s * n_cols, (n_inner * n_cols) >> level)


def hierarchical(T, w, n_factors, s, max_iter_split, max_iter_global, max_iter_final, tol, residual="sp"):
    """Le Magoarou & Gribonval's hierarchical factorisation; returns a :class:`PalmState`."""
    K, D = T.shape
    WT = T if w is None else w[:, None] * T
    shapes = chain_shapes(K, D, n_factors)
    if n_factors == 1:
        S = [project(("splincol", s), T)]
        return palm(WT, w, S, 1.0, [("splincol", s)], max(max_iter_global, max_iter_final), tol)
    A = shapes[0][1]
    left, lam, resid = [], 1.0, T
    history, n_iter, counts = [], 0, np.zeros(3, dtype=np.int64)
    for level in range(1, n_factors):
        last = level == n_factors - 1
        if last:
            rcons = ("splincol", s)
        elif residual == "sp":
            rcons = ("sp", residual_budget(level, s, A, D))
        else:
            rcons = ("splincol", max(s, A >> level))
        r0, r1 = shapes[level - 1]
        split = palm(WT if level == 1 else resid, w if level == 1 else None,
                     [np.eye(r0, r1), np.zeros((r1, D))], 1.0, [("splincol", s), rcons],
                     max_iter_split, tol, monotone=False)
        lam *= split.lam
        S = left + [split.factors[0], split.factors[1]]
        glob = palm(WT, w, S, lam, [("splincol", s)] * level + [rcons],
                    max_iter_final if last else max_iter_global, tol)
        history += glob.history
        n_iter += glob.n_iter
        for st in (split, glob):
            counts += (st.n_certified, st.n_restricted, st.n_rejected)
        lam = glob.lam
        left, resid = S[:-1], S[-1]
    return PalmState(left + [resid], lam, glob.objective, history, n_iter, *map(int, counts))
