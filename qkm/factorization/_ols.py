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

``O(a * nnz(x_j))`` per step (the directions kept as coefficients on the Gram's columns); the best pair is kept in a max-tree over the
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
def _grow(buf, need):
    """``buf`` or a copy at least ``need`` long (doubling)."""
    if need <= buf.shape[0]:
        return buf
    out = np.empty(max(need, 2 * buf.shape[0]))
    out[:buf.shape[0]] = buf
    return out


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
    GT = np.ascontiguousarray(G.T)                 # GT[m] = G[:, m], contiguous
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
    # The Gram-Schmidt direction of a column's k-th atom is kept as its coefficients on the Gram columns of
    # the column's first k atoms (u_k = sum_l R_k[l] G[:, m_l]): sum_j t_j (t_j + 1) / 2 values instead of
    # budget * a (462 MB at K = 4,096, D = 784, s = 3), and the same O(a t) work per step.
    n_steps = max(budget, 1)
    step_atom = np.empty(n_steps, dtype=np.int64)
    step_pos = np.empty(n_steps, dtype=np.int64)
    step_off = np.empty(n_steps, dtype=np.int64)
    nxt = np.full(n_steps, -1, dtype=np.int64)
    head = np.full(n, -1, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    coef = np.empty(4 * n_steps + a)
    used = 0
    col_atoms = np.empty(a, dtype=np.int64)
    col_steps = np.empty(a, dtype=np.int64)
    new_coef = np.empty(a)
    u = np.empty(a)
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
        t = count[j]
        k = head[j]
        while k >= 0:                                  # the column's atoms and steps by position
            col_atoms[step_pos[k]] = step_atom[k]
            col_steps[step_pos[k]] = k
            k = nxt[k]
        col_atoms[t] = p
        for l in range(t):
            new_coef[l] = 0.0
        new_coef[t] = 1.0
        gp = GT[p]
        for kk in range(t):                            # minus u_k u_k[p], in coefficients
            off = step_off[col_steps[kk]]
            up = 0.0
            for l in range(kk + 1):
                up += coef[off + l] * gp[col_atoms[l]]
            for l in range(kk + 1):
                new_coef[l] -= coef[off + l] * up
        for l in range(t + 1):
            new_coef[l] /= r
        for i in range(a):
            u[i] = 0.0
        for l in range(t + 1):
            w = new_coef[l]
            gl = GT[col_atoms[l]]
            for i in range(a):
                u[i] += w * gl[i]
        coef = _grow(coef, used + t + 1)
        for l in range(t + 1):
            coef[used + l] = new_coef[l]
        step_off[step] = used
        used += t + 1
        step_atom[step] = p
        step_pos[step] = t
        count[j] = t + 1
        cp = cj[p] / r
        for i in range(a):
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
