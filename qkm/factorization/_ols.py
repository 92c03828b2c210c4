"""Greedy support selection under one global budget: orthogonal least squares over many columns (private).

The problem (one factor of the chain with the others fixed, when its columns are
independent, as for the last factor ``R = I``, or its rows, as for the first
``L = W``)::

    min  sum_j scale_j ||t_j - A x_j||^2     s.t.  sum_j nnz(x_j) <= budget

is given in Gram form: ``G = A^T A`` (``a x a``) and the correlations
``g[:, j] = A^T t_j``. Orthogonal least squares (Chen, Billings & Luo 1989)
adds one atom at a time, the one whose exact decrease of the residual is
largest; here the choice runs over every (atom, column) pair at once, so the
budget goes to the columns where it pays most (a column of a wide factor may
get no value, another many). Each column keeps its residual correlations
``c`` and the squared norms ``s`` of the atoms projected off its support, and
adding atom ``p`` is one Gram-Schmidt step in that space::

    u = (G[:, p] - sum_k U_k U_k[p]) / sqrt(s_p),   c -= u c_p / sqrt(s_p),   s -= u^2,

``O(a * nnz(x_j))`` per step; the best pair is kept in a max-tree over the
columns. The values on the chosen support are then solved exactly by the
caller (:mod:`qkm.factorization._lsq`). Why greedy selection for the wide
factor: docs/decisions.md, 'Least-squares sweeps'.
"""

import math

import numpy as np
from numba import njit

from .._config import _JIT

__all__ = ["ols_support"]

#: An atom whose projected squared norm falls below this fraction of its own is dependent: skipped.
DEPENDENT_REL = 1e-10


@njit(inline="always", **_JIT)
def _tree_set(tree_v, tree_i, P, j, gain):
    """Max-tree over the columns (ties: the lower column wins)."""
    pos = P + j
    tree_v[pos] = gain
    tree_i[pos] = j
    pos //= 2
    while pos >= 1:
        l, r = 2 * pos, 2 * pos + 1
        if tree_v[r] > tree_v[l]:
            tree_v[pos] = tree_v[r]
            tree_i[pos] = tree_i[r]
        else:
            tree_v[pos] = tree_v[l]
            tree_i[pos] = tree_i[l]
        pos //= 2


@njit(inline="always", **_JIT)
def _best_atom(G, c, s, taken, scale):
    """(gain, atom) of the best atom to add to one column (gain 0, atom -1 if none).

    ``c``, ``s``, ``taken`` are that column's contiguous rows of the transposed state.
    """
    best = 0.0
    atom = -1
    for i in range(c.shape[0]):
        if taken[i]:
            continue
        d = G[i, i]
        si = s[i]
        if d <= 0.0 or si <= DEPENDENT_REL * d:
            continue
        gain = scale * c[i] * c[i] / si
        if gain > best:
            best = gain
            atom = i
    return best, atom


@njit(**_JIT)
def ols_support(
    G,                              # IN  (a, a) Gram of the atoms
    g,                              # IN  (a, n) correlations of the atoms with each column's target
    scale,                          # IN  (n,) weight of each column's residual (0: the column is left empty)
    budget,                         # IN  total number of values to select
    mask,                           # OUT (a, n) bool, the selected support
):
    """Greedy OLS with one budget over all columns; returns the number of values selected."""
    a, n = g.shape
    # per-column state stored transposed, (n, a): a column's atoms are contiguous (the greedy steps visit
    # one column at a time; the (a, n) layout cost a cache miss per atom and step on wide factors)
    c = np.zeros((n, a))
    s = np.empty((n, a))
    taken = np.zeros((n, a), dtype=np.bool_)
    for i in range(a):
        for j in range(n):
            mask[i, j] = False
    for i in range(a):
        gi = G[i, i]
        for j in range(n):
            inv = 1.0 / scale[j] if scale[j] > 0.0 else 0.0
            c[j, i] = g[i, j] * inv
            s[j, i] = gi
    budget = max(0, min(budget, a * n))
    pool = np.empty((max(budget, 1), a))          # the Gram-Schmidt directions, in "atom" coordinates
    nxt = np.full(max(budget, 1), -1, dtype=np.int64)
    head = np.full(n, -1, dtype=np.int64)
    P = 1
    while P < n:
        P *= 2
    tree_v = np.full(2 * P, -1.0)
    tree_i = np.zeros(2 * P, dtype=np.int64)
    atom_of = np.full(n, -1, dtype=np.int64)
    for j in range(n):
        gain, atom = _best_atom(G, c[j], s[j], taken[j], scale[j])
        atom_of[j] = atom
        _tree_set(tree_v, tree_i, P, j, gain if atom >= 0 else -1.0)
    n_taken = 0
    for step in range(budget):
        if tree_v[1] <= 0.0:
            break
        j = tree_i[1]
        p = atom_of[j]
        cj = c[j]
        sj = s[j]
        r = math.sqrt(sj[p])
        u = pool[step]
        for i in range(a):
            u[i] = G[i, p]
        k = head[j]
        while k >= 0:
            up = pool[k, p]
            for i in range(a):
                u[i] -= pool[k, i] * up
            k = nxt[k]
        cp = cj[p] / r
        for i in range(a):
            u[i] /= r
            cj[i] -= u[i] * cp
            sj[i] -= u[i] * u[i]
        taken[j, p] = True
        mask[p, j] = True
        nxt[step] = head[j]
        head[j] = step
        n_taken += 1
        gain, atom = _best_atom(G, cj, sj, taken[j], scale[j])
        atom_of[j] = atom
        _tree_set(tree_v, tree_i, P, j, gain if atom >= 0 else -1.0)
    return n_taken
