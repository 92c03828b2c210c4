"""Factorise a (weighted) target under QK-means' budgets: the entry points of QK-means' fitter (private).

:func:`factorize_weighted` gives the first factors (of the seeds), :func:`lsq_refit` the
warm refits (of the cluster means). Both pick where the sweeps run:

* ``columns``: on the active columns only, or all of them
  (:mod:`qkm.factorization._columns`);
* ``target``: the dense sweeps (:func:`qkm.factorization._lsq.lsq_palm`) or,
  for a sparse and wide target (at most :data:`SPARSE_TARGET_MAX_DENSITY`
  nonzero, at least :data:`SPARSE_TARGET_MIN_COLUMNS` columns: the cluster
  means of tf-idf data), the sweeps that keep the target and the wide
  last factor sparse (:func:`qkm.factorization._lsq_sparse.sparse_lsq_palm`):
  a sweep on fixed supports costs about ``nnz(T) s`` instead of ``K A D``
  (see docs/decisions.md, 'Wide sparse targets').

The returned :class:`~qkm.factorization._palm.PalmState` records both
(``path``, ``n_columns``, ``target``) and, for :func:`factorize_weighted`, ``start``.
"""

import numpy as np
import scipy.sparse as sp

from ._columns import ColumnMap
from ._hierarchical import hierarchical
from ._shapes import factor_budgets
from ._lsq import lsq_palm
from ._lsq_sparse import sparse_lsq_palm
from ._shapes import chain_shapes

__all__ = ["SPARSE_TARGET_MAX_DENSITY", "SPARSE_TARGET_MIN_COLUMNS", "exact_start", "factorize_weighted",
           "lsq_refit", "sparse_target", "wide_target"]

#: Sweeps of the hierarchical palm4MSA that gives the first supports (split, global, final).
HIERARCHICAL_SWEEPS = (30, 30, 100)

#: Targets with at most this fraction of nonzeros (over all ``K x D`` entries) and at least
#: ``SPARSE_TARGET_MIN_COLUMNS`` columns run the sparse sweeps (image data, D <= 784, keep the dense ones).
SPARSE_TARGET_MAX_DENSITY = 0.3
SPARSE_TARGET_MIN_COLUMNS = 2048


def _nnz(M):
    return int(M.count_nonzero()) if sp.issparse(M) else int(np.count_nonzero(M))


def wide_target(n_features, n_factors):
    """Whether a target of ``n_features`` columns is wide enough for the sparse sweeps (density aside).

    QK-means then keeps the cluster means of sparse data as CSR through the
    whole Lloyd loop (:mod:`qkm.clustering._factored_lloyd`); :func:`sparse_target`
    decides on the means themselves.
    """
    return n_factors >= 2 and n_features >= SPARSE_TARGET_MIN_COLUMNS


def sparse_target(T, n_factors, mode="auto"):
    """Whether the sweeps keep ``T`` sparse: ``mode`` "sparse"/"dense" forces it; "auto" decides by width and density."""
    if n_factors < 2 or mode == "dense":
        return False
    K, D = T.shape
    return mode == "sparse" or (wide_target(D, n_factors) and _nnz(T) <= SPARSE_TARGET_MAX_DENSITY * K * D)


def _take(cmap, M, sparse):
    """``M`` on the active columns, CSR when ``sparse`` else dense."""
    if not sparse:
        return cmap.take(M)
    M = sp.csr_matrix(M, dtype=np.float64)
    return M if cmap.cols is None else M[:, cmap.cols]


def _weighted(T, w):
    if w is None:
        return T
    return sp.csr_matrix(sp.diags(w) @ T) if sp.issparse(T) else w[:, None] * T


def _sweeps(WT, w, S, lam, projs, max_iter, tol, support_iter, sparse, last_support):
    if last_support not in ("auto", "ols", "gradient") or (sparse and last_support == "ols"):
        raise ValueError(f"last_support must be 'auto', 'gradient' or (dense target) 'ols'; got {last_support!r}.")
    if sparse:
        state = sparse_lsq_palm(WT, w, S, lam, projs, max_iter, tol, support_iter)
    else:
        state = lsq_palm(WT, w, S, lam, projs, max_iter, tol, support_iter, ols_last=last_support != "gradient")
    state.target = "sparse" if sparse else "dense"
    return state


def lsq_refit(T, w, S, lam, projs, max_iter, tol, support_iter, columns="auto", target="auto", last_support="auto"):
    """Least-squares sweeps on ``W T`` (``T`` unweighted, ndarray or CSR) run on the active columns.

    The active columns are those where ``T`` or the last factor ``S[-1]``
    (ndarray or CSR) is nonzero (:class:`qkm.factorization._columns.ColumnMap`;
    ``columns`` forces "columns" or "dense"); ``target`` forces the sparse or
    dense sweeps (see the module docstring); ``last_support`` how the last
    factor's support moves: "gradient" (a projected gradient step, the only
    choice of the sparse sweeps) or "ols" (greedy OLS, the dense sweeps'
    default). The returned state's last factor
    is CSR when the compressed or sparse path ran; ``path``, ``n_columns``,
    ``target`` and ``start_objective`` (``f`` of the start) say what ran.
    """
    sparse = sparse_target(T, len(S), target)
    cmap = ColumnMap.of(T, S[-1], mode=columns)
    WT = _weighted(_take(cmap, T, sparse), w)
    S = list(S)
    S[-1] = _take(cmap, S[-1], sparse)
    state = _sweeps(WT, w, S, lam, projs, max_iter, tol, support_iter, sparse, last_support)
    return _put_back(state, cmap)


def _put_back(state, cmap):
    state.factors[-1] = cmap.put(state.factors[-1])
    state.path, state.n_columns = cmap.path, cmap.n_active
    return state


def factorize_weighted(T, w, n_factors, s, max_iter, tol, columns="auto", target="auto", last_support="auto",
                       budget_split="even"):
    """The first factors of ``T``, then ``max_iter`` least-squares sweeps within :func:`factor_budgets`
    (split by ``budget_split``).

    The start is :func:`exact_start` when it applies (wide sparse data), else
    hierarchical palm4MSA (``splincol(s)``). ``T`` (ndarray or CSR) is
    factorised on its nonzero columns when they are few enough (see
    :func:`lsq_refit`, also for ``target`` and ``last_support``; the last factor is then CSR).
    """
    K, D = T.shape
    sparse = sparse_target(T, n_factors, target)
    cmap = ColumnMap.of(T, mode=columns)
    Tc = _take(cmap, T, sparse)
    budgets = factor_budgets(chain_shapes(K, D, n_factors), s, budget_split)
    exact = exact_start(Tc, n_factors, budgets) if sparse else None
    if exact is None:
        first = hierarchical(Tc.toarray() if sp.issparse(Tc) else Tc, w, n_factors, s, *HIERARCHICAL_SWEEPS, tol,
                             n_cols=D)
        factors, lam = list(first.factors), first.lam
    else:
        factors, lam = exact, 0.0
    state = _sweeps(_weighted(Tc, w), w, factors, lam, budgets, max_iter, tol, max_iter, sparse, last_support)
    state.start = "hierarchical" if exact is None else "exact"
    return _put_back(state, cmap)


def exact_start(T, n_factors, budgets):
    """``[I, ..., I, T]`` when that chain is feasible (``K <= D``, ``nnz(T)`` within the last budget), else None.

    On wide sparse data the seeds (``K`` documents) touch few of the ``D``
    words, and the last factor's budget ``s D`` holds them all: the chain of
    identities and the seeds themselves is an exact factorisation, which the
    hierarchical palm4MSA (hundreds of sweeps) would only approximate (see
    docs/decisions.md, 'Wide sparse targets').
    """
    K, D = T.shape
    if n_factors < 2 or K > D or _nnz(T) > budgets[-1][1]:
        return None
    return [np.eye(K) for _ in range(n_factors - 1)] + [T]
