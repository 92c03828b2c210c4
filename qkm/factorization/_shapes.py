"""The factor chain's shapes and value budgets: how many factors, of what shapes, holding how many values.

A chain ``V = S_1 ... S_Q`` of a ``K x D`` centroid matrix has the shapes of
:func:`chain_shapes`; QK-means' default number of factors is
:func:`default_n_factors`; each factor's number of nonzeros is its budget
(:func:`factor_budgets`, split by one of :data:`BUDGET_SPLITS`), and the
hierarchical start keeps :func:`residual_budget` values in its residual.
"""

import math

import numpy as np

from .._validation import check_int

__all__ = ["BUDGET_SPLITS", "MANY_CLUSTERS", "chain_shapes", "chain_total", "default_n_factors", "factor_budgets", "paper_n_factors",
           "paper_total", "residual_budget"]

#: How :func:`factor_budgets` splits the values of a chain: "even", "wide" or "total" (QKMeans' default).
BUDGET_SPLITS = ("even", "wide", "total")

#: From this many clusters (rows of the chain) on, the "total" split shares the values evenly between the
#: factors, also when ``K <= D`` (docs/decisions.md, 'Many clusters').
MANY_CLUSTERS = 256


def chain_shapes(n_rows, n_cols, n_factors):
    """Shapes of the factors of an ``n_rows x n_cols`` matrix.

    ``K x A``, then ``n_factors - 2`` times ``A x A``, then ``A x D``, with
    ``A = min(K, D)``.

    Parameters
    ----------
    n_rows, n_cols : int
        ``K`` and ``D``.
    n_factors : int
        ``Q >= 1``; ``Q = 1`` gives ``[(K, D)]``.

    Returns
    -------
    list of tuple of int

    Examples
    --------
    >>> chain_shapes(64, 784, 4)
    [(64, 64), (64, 64), (64, 64), (64, 784)]
    >>> chain_shapes(10, 3, 2)
    [(10, 3), (3, 3)]
    >>> chain_shapes(5, 7, 1)
    [(5, 7)]
    """
    n_rows, n_cols = check_int("n_rows", n_rows, 1), check_int("n_cols", n_cols, 1)
    n_factors = check_int("n_factors", n_factors, 1)
    if n_factors == 1:
        return [(n_rows, n_cols)]
    a = min(n_rows, n_cols)
    return [(n_rows, a)] + [(a, a)] * (n_factors - 2) + [(a, n_cols)]


def paper_n_factors(n_rows, n_cols):
    """``floor(log2(max(K, D)))`` (at least 1): the number of factors of the paper's chain.

    >>> paper_n_factors(64, 784)
    9
    """
    return max(1, int(math.floor(math.log2(max(n_rows, n_cols, 1)))))


def paper_total(n_rows, n_cols, s):
    """``sum s * max(r, c)`` over the paper's chain of :func:`paper_n_factors` factors (capped by size).

    >>> paper_total(64, 784, 3)
    3888
    """
    return sum(min(s * max(r, c), r * c) for r, c in chain_shapes(n_rows, n_cols, paper_n_factors(n_rows, n_cols)))


def chain_total(n_rows, n_cols, s):
    """Values of QK-means' default chain (``budget_split="total"``) for a ``K x D`` centroid matrix.

    ``K <= D``: the paper chain's total (:func:`paper_total`). ``K > D``:
    ``s * floor(log2(K))`` values per centroid, ``s * P * K`` in all (the
    paper's ``P`` factors of ``s * K`` values each), capped by the size of
    the 2-factor chain ``K x D``, ``D x D``. At ``K = D`` both rules give
    ``s * P * K``. Why not the paper chain's total at ``K > D`` (``s K + (P -
    1) s D``: 3 values per centroid row at s = 3): docs/decisions.md, 'Many
    clusters'.

    Examples
    --------
    >>> chain_total(64, 784, 3)
    3888
    >>> chain_total(1024, 784, 3)
    30720
    """
    if n_rows <= n_cols:
        return paper_total(n_rows, n_cols, s)
    return min(s * paper_n_factors(n_rows, n_cols) * n_rows, n_rows * n_cols + n_cols * n_cols)


def default_n_factors(n_clusters, n_features):
    """The default chain: 2 factors (1 when ``max(K, D) < 4``, as the paper's).

    ``K x A`` and ``A x D`` with ``A = min(K, D)``. With :class:`qkm.QKMeans`'
    default ``budget_split="total"`` they hold :func:`chain_total` values:
    the paper chain's (:func:`paper_n_factors` factors) when ``K <= D``,
    ``s floor(log2 K)`` per centroid when ``K > D`` (see docs/decisions.md,
    'Chain length' and 'Many clusters').

    Examples
    --------
    >>> default_n_factors(64, 784)
    2
    >>> default_n_factors(256, 118)
    2
    >>> default_n_factors(2, 3)
    1
    """
    return min(2, paper_n_factors(n_clusters, n_features))


def factor_budgets(shapes, s, split="even"):
    """One ``("sp", k)`` budget per factor of ``shapes``; in all ``sum s * max(rows, cols)`` values (capped by size).

    ``split="even"`` gives every factor ``s * max(rows, cols)``: the nominal
    budget of the QuickK-means reference code. The reference turns that count
    into ``s max(rows, cols) / cols`` values per column and ``/ rows`` per row
    and keeps their union (more values than the budget); here the budget is a hard cap and the
    least-squares sweeps choose where the values go (a wide factor gives none
    to pixels that never vary, several to those that separate the clusters).

    ``split="wide"`` keeps the same total but gives every factor except the
    widest (largest ``max(rows, cols)``: the last when ``K < D``, the first
    when ``K > D``) ``max(s - 1, 1) * max(rows, cols)`` and the widest the rest
    (at K = 64, D = 784, s = 3: 128 values per inner factor, 2,864 for the wide
    one). Not the default (see docs/decisions.md, 'Budget splits'). When no factor is strictly the widest
    (``K == D``, or one factor) the split is the even one. No budget exceeds
    its factor's size; what the widest cannot hold goes back to the others (up
    to their even budget).

    ``split="total"`` keeps the total of the paper's chain (:func:`paper_total`:
    ``floor(log2(max(K, D)))`` factors, 3,888 values at K = 64, D = 784,
    s = 3) whatever the number of factors: the widest factor keeps
    ``s * max(rows, cols)`` and the others share the rest evenly (each capped
    by its size), so a short chain has denser inner factors (3 factors at
    K = 64, D = 784, s = 3: 768, 768 and 2,352). On the paper's chain it is the
    even split. With 2 factors it is :class:`qkm.QKMeans`' default chain (K <= D;
    K = 64, D = 784, s = 3: 1,536 and 2,352 values; see docs/decisions.md,
    'Chain length'). From :data:`MANY_CLUSTERS` rows on, and whenever
    ``K > D``, the total is :func:`chain_total` and every factor gets an even
    share (K = 256, D = 784, s = 3: 4,248 and 4,248).

    Examples
    --------
    >>> factor_budgets([(64, 64), (64, 64), (64, 784)], 3, split="total")
    [('sp', 768), ('sp', 768), ('sp', 2352)]
    >>> factor_budgets([(256, 256), (256, 784)], 3, split="total")     # many clusters: an even share
    [('sp', 4248), ('sp', 4248)]
    >>> factor_budgets([(64, 64), (64, 64), (64, 784)], 3)
    [('sp', 192), ('sp', 192), ('sp', 2352)]
    >>> factor_budgets([(64, 64), (64, 64), (64, 784)], 3, split="wide")
    [('sp', 128), ('sp', 128), ('sp', 2480)]
    >>> factor_budgets([(300, 40), (40, 40)], 2, split="wide")
    [('sp', 640), ('sp', 40)]
    """
    if split not in BUDGET_SPLITS:
        raise ValueError(f"budget split must be one of {BUDGET_SPLITS}; got {split!r}.")
    s = int(s)
    shapes = [(int(r), int(c)) for r, c in shapes]
    sizes = [r * c for r, c in shapes]
    even = [min(s * max(r, c), n) for (r, c), n in zip(shapes, sizes)]
    widths = [max(r, c) for r, c in shapes]
    widest = int(np.argmax(widths))
    if split == "total":
        K, D = shapes[0][0], shapes[-1][1]
        total = chain_total(K, D, s)
        out = [0] * len(shapes)
        # K <= D below MANY_CLUSTERS: the widest (A x D) keeps its even budget; else every factor an even
        # share (docs/decisions.md, 'Many clusters')
        if K <= D and K < MANY_CLUSTERS and sum(w == widths[widest] for w in widths) == 1:
            out[widest] = even[widest]
        others = [q for q in range(len(shapes)) if out[q] == 0]
        others.sort(key=lambda q: sizes[q])         # the smallest first: what one cannot hold goes to the next
        for i, q in enumerate(others):          # the rest shared evenly, each capped by its size
            out[q] = min((total - sum(out)) // (len(others) - i), sizes[q])
        return [("sp", v) for v in out]
    if split == "even" or sum(w == widths[widest] for w in widths) > 1:
        return [("sp", v) for v in even]
    out = [min(max(s - 1, 1) * w, n) for w, n in zip(widths, sizes)]
    out[widest] = min(sum(even) - sum(out) + out[widest], sizes[widest])
    spare = sum(even) - sum(out)
    for q in range(len(out)):                    # what the widest cannot hold, back to the others
        give = min(spare, max(even[q] - out[q], 0))
        out[q] += give
        spare -= give
    return [("sp", v) for v in out]


def residual_budget(level, s, n_inner, n_cols):
    """Global nnz kept in the residual after split ``level`` (1-based) at intermediate levels."""
    return max(s * n_cols, (n_inner * n_cols) >> level)
