"""Hierarchical palm4MSA, residual on the right (private; public API in :mod:`qkm.factorization`).

Le Magoarou & Gribonval (2016): at level ``l = 1 .. Q-1`` the current residual
is split as ``lambda' S_l T'`` by a two-factor PALM started from ``(I, 0)``,
the scales multiply, and a global PALM over ``[S_1 .. S_l, T']`` refits
everything to the original target (warm). The last residual is ``S_Q``.

Hierarchical splits use plain projected steps (``monotone=False``, FAuST's
behaviour); the global refits are monotone (see docs/decisions.md,
'palm4MSA').
"""

import numpy as np

from ._palm import PalmState, palm
from ._shapes import chain_shapes, residual_budget
from ._projections import project

__all__ = ["hierarchical"]


def hierarchical(T, w, n_factors, s, max_iter_split, max_iter_global, max_iter_final, tol, residual="sp",
                 solver=None, factor_proj=None, last_proj=None, n_cols=None):
    """Le Magoarou & Gribonval's hierarchical factorisation; returns a :class:`PalmState`.

    ``solver(WT, w, S, lam, projs, max_iter, tol, monotone)`` runs the splits and
    the global refits (default :func:`qkm.factorization._palm.palm`); ``factor_proj`` is the
    constraint of the split-off factors (default ``("splincol", s)``) and
    ``last_proj`` that of the last residual, the last factor (default the same).
    ``n_cols`` is the width of the full problem when ``T`` holds only its active
    columns (:mod:`qkm.factorization._columns`): the inner size ``A`` and the residual budgets
    are those of the full shapes.
    """
    solver = palm if solver is None else solver
    fproj = ("splincol", s) if factor_proj is None else factor_proj
    lproj = fproj if last_proj is None else last_proj
    K, D = T.shape
    n_cols = D if n_cols is None else n_cols
    WT = T if w is None else w[:, None] * T
    shapes = chain_shapes(K, n_cols, n_factors)
    if n_factors == 1:
        S = [project(lproj, T)]
        return solver(WT, w, S, 1.0, [lproj], max(max_iter_global, max_iter_final), tol, True)
    A = shapes[0][1]
    left, lam, resid = [], 1.0, T
    history, n_iter, counts = [], 0, np.zeros(3, dtype=np.int64)
    for level in range(1, n_factors):
        last = level == n_factors - 1
        if last:
            rcons = lproj
        elif residual == "sp":
            rcons = ("sp", residual_budget(level, s, A, n_cols))
        else:
            rcons = ("splincol", max(s, A >> level))
        r0, r1 = shapes[level - 1]
        split = solver(WT if level == 1 else resid, w if level == 1 else None,
                       [np.eye(r0, r1), np.zeros((r1, D))], 1.0, [fproj, rcons], max_iter_split, tol, False)
        lam *= split.lam
        S = left + [split.factors[0], split.factors[1]]
        glob = solver(WT, w, S, lam, [fproj] * level + [rcons], max_iter_final if last else max_iter_global, tol,
                      True)
        history += glob.history
        n_iter += glob.n_iter
        for st in (split, glob):
            counts += (st.n_certified, st.n_restricted, st.n_rejected)
        lam = glob.lam
        left, resid = S[:-1], S[-1]
    return PalmState(left + [resid], lam, glob.objective, history, n_iter, *map(int, counts))
