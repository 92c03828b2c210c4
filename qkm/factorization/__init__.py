"""Factorisation (palm4MSA): a matrix as a scaled product of sparse factors.

``T ~ lambda_ * S_1 @ S_2 @ ... @ S_Q`` where every ``S_q`` keeps at most
``sparsity_level`` largest entries per row and per column (FAuST's
``splincol``) and has unit Frobenius norm (Le Magoarou & Gribonval 2016; the
QuickK-means appendix, Giffon et al. 2021). QK-means keeps its centroids in
this form.

* :func:`palm4msa` improves given factors (a warm start) with PALM sweeps;
  the objective never increases.
* :func:`hierarchical_palm4msa` builds factors from scratch by splitting off
  one factor at a time. Use it (not :func:`palm4msa` from an identity start,
  which stalls at the best rank-one fit) for a first factorisation.
* :func:`project_splincol` is the projection; :func:`chain_shapes` the
  default factor shapes, :func:`chain_total` the values QK-means' default chain holds.

Implementation notes (step sizes, the cost of a sweep, why the objective is
non-increasing) are in :mod:`qkm.factorization._palm`. Private modules: the
PALM sweeper (``_palm``, ``_palm_products``), projections (``_projections``),
the least-squares sweeps QK-means refits with (``_lsq``, ``_lsq_sparse``,
``_ols``), the hierarchical start (``_hierarchical``), the seeds'
factorisation and refits (``_factorize``, ``_columns``) and the chain's
shapes and value budgets (``_shapes``). Also at the old path
:mod:`qkm.palm4msa`.
"""

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import _hierarchical
from . import _factorize
from . import _palm
from . import _projections
from ._shapes import BUDGET_SPLITS, chain_shapes, chain_total
from .._threads import single_threaded_blas
from .._validation import check_choice, check_float, check_int, check_matrix, check_weights

__all__ = ["PalmResult", "chain_shapes", "chain_total", "factorize", "hierarchical_palm4msa", "palm4msa", "project_splincol"]


@dataclass
class PalmResult:
    """A factorisation ``lambda_ * factors[0] @ ... @ factors[-1]``.

    Attributes
    ----------
    factors : list of ndarray
        Dense float64 C-contiguous factors, each of unit Frobenius norm
        (a factor that was all zero on input and never updated stays zero).
    lambda_ : float
        The scale.
    objective : float
        ``||diag(w) (T - lambda_ * prod(factors))||_F^2`` (``w = 1`` without weights).
    n_iter : int
        PALM sweeps run (for the hierarchical factorisation: global sweeps over all levels).
    history : list of float
        The objective after each of those sweeps.

    Examples
    --------
    >>> import numpy as np
    >>> res = PalmResult([np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]])], 0.5, 0.0, 0)
    >>> res.product()
    array([[0.5, 1. ],
           [1.5, 2. ]])
    """

    factors: list
    lambda_: float
    objective: float
    n_iter: int
    history: list = field(default_factory=list)

    def product(self):
        """Dense ``lambda_ * S_1 @ ... @ S_Q`` (float64)."""
        out = self.factors[-1]
        for f in reversed(self.factors[:-1]):
            out = f @ out
        return self.lambda_ * out


def project_splincol(Z, s):
    """Keep the ``s`` largest ``|Z|`` of every row and of every column, then normalise.

    The kept set is the union of the per-row and the per-column choices
    (FAuST's ``splincol``), so every row keeps at least ``min(s, n_cols)`` and
    every column at least ``min(s, n_rows)`` entries (of those that are
    nonzero). Among equal magnitudes the smaller index wins. The result has
    unit Frobenius norm; an all-zero input stays zero.

    Parameters
    ----------
    Z : array-like of shape (n_rows, n_cols)
    s : int
        Entries per row and per column, ``>= 1``.

    Returns
    -------
    ndarray of shape (n_rows, n_cols), float64

    Examples
    --------
    >>> import numpy as np
    >>> Z = np.array([[4.0, 3.0, 1.0], [1.0, 0.0, 2.0], [0.0, 2.0, 1.0]])
    >>> P = project_splincol(Z, 1)
    >>> P * np.sqrt(33.0)
    array([[4., 3., 0.],
           [0., 0., 2.],
           [0., 2., 0.]])
    """
    Z = check_matrix("Z", Z)
    s = check_int("s", s, 1)
    out = np.empty_like(Z)
    _projections.splincol_into(Z, s, out)
    return out


def _result(state):
    return PalmResult([f.toarray() if sp.issparse(f) else np.ascontiguousarray(f) for f in state.factors], float(state.lam), float(state.objective),
                      int(state.n_iter), [float(h) for h in state.history])


def palm4msa(target, factors, *, lambda_=1.0, sparsity_level=3, weights=None, max_iter=300, tol=1e-6):
    """Fit ``lambda_ * S_1 ... S_Q`` to ``target`` by PALM, starting from ``factors``.

    Minimises ``||diag(w) (T - lambda_ S_1 ... S_Q)||_F^2`` over factors with
    at most ``sparsity_level`` largest entries per row and per column and unit
    Frobenius norm (Algorithm 2 of the QuickK-means appendix). Each sweep takes
    one projected gradient step per factor, right to left, then sets
    ``lambda_`` to its closed form ``<WT, WP> / <WP, WP>``. The objective never
    increases from one sweep to the next.

    Parameters
    ----------
    target : array-like of shape (K, D)
        Finite; float32 is accepted (computations are float64).
    factors : list of array-like
        Initial factors whose shapes chain from ``K`` to ``D`` (e.g.
        :func:`chain_shapes`); typically the factors of a previous result.
        They are copied and their norms moved into ``lambda_``; a factor
        outside the constraint set (e.g. a dense one) is projected first.
    lambda_ : float, default=1.0
        Initial scale (0 means: start from the closed form).
    sparsity_level : int, default=3
        Entries kept per row and per column of each factor, ``>= 1``.
    weights : array-like of shape (K,), default=None
        Non-negative row weights ``w`` (not all zero); QK-means passes
        ``sqrt(cluster sizes)``. They act as a fixed left factor.
    max_iter : int, default=300
        Maximum number of sweeps (0 returns the start, normalised).
    tol : float, default=1e-6
        Stop when the objective changes by less than ``tol`` times its value.

    Returns
    -------
    PalmResult

    Raises
    ------
    ValueError
        Bad parameters, NaN/inf values, or factor shapes that do not chain into
        ``target``'s shape.

    See Also
    --------
    hierarchical_palm4msa : a first factorisation from scratch.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> T = rng.standard_normal((8, 16))
    >>> first = hierarchical_palm4msa(T, 3, sparsity_level=2)
    >>> res = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, max_iter=20)
    >>> res.objective <= first.objective
    True
    >>> [f.shape for f in res.factors]
    [(8, 8), (8, 8), (8, 16)]
    >>> bool(np.isclose(res.objective, np.sum((T - res.product()) ** 2)))
    True
    """
    T, S, w = _check_args(target, factors, sparsity_level=sparsity_level, weights=weights,
                                    max_iters=[("max_iter", max_iter, 0)], tol=tol, lambda_=lambda_)
    if S is None:
        raise ValueError("factors must be a list of 2-D arrays (use hierarchical_palm4msa to start "
                         "from scratch).")
    WT = T if w is None else w[:, None] * T
    state = _palm.palm(WT, w, S, float(lambda_), [("splincol", int(sparsity_level))] * len(S),
                       int(max_iter), float(tol))
    return _result(state)


def hierarchical_palm4msa(target, n_factors, *, sparsity_level=3, weights=None, max_iter_split=30,
                          max_iter_global=30, max_iter_final=100, tol=1e-6, residual="sp"):
    """Factorise ``target`` from scratch by splitting off one sparse factor at a time.

    Le Magoarou & Gribonval (2016), residual on the right. At level
    ``l = 1 .. Q-1`` the current residual is split as ``lambda' S_l T'`` by a
    two-factor PALM started from ``(I, 0)`` (plain projected steps, as in
    FAuST: this exploratory split is what lets the supports form), the scales
    multiply, and a global :func:`palm4msa` over ``[S_1 .. S_l, T']`` refits
    everything to the original target (warm). The last residual is ``S_Q``.

    Parameters
    ----------
    target : array-like of shape (K, D)
    n_factors : int
        ``Q >= 1``; shapes as :func:`chain_shapes`.
    sparsity_level : int, default=3
        Entries per row and per column of every factor, ``>= 1``.
    weights : array-like of shape (K,), default=None
        Row weights of the objective, as in :func:`palm4msa`.
    max_iter_split : int, default=30
        Sweeps of each two-factor split (``>= 1``).
    max_iter_global : int, default=30
        Sweeps of each global refit at levels ``1 .. Q-2``.
    max_iter_final : int, default=100
        Sweeps of the last global refit (all ``Q`` factors): the polish.
    tol : float, default=1e-6
        Relative objective change that stops any of these PALM runs.
    residual : {"sp", "splincol"}, default="sp"
        Constraint on the intermediate residual ``T'`` after level ``l``:
        ``"sp"`` keeps the ``max(s D, A D / 2^l)`` largest entries overall;
        ``"splincol"`` keeps ``max(s, A / 2^l)`` per row and column (FAuST's
        Hadamard preset). The last residual is always ``splincol(s)``.

    Returns
    -------
    PalmResult
        ``history`` holds the objective after every global sweep, all levels
        in turn (it jumps up when a level adds a factor).

    Raises
    ------
    ValueError
        Bad parameters or NaN/inf values.

    Examples
    --------
    A Hadamard matrix is a product of ``log2(n)`` butterfly factors with 2
    entries per row and column:

    >>> import numpy as np
    >>> from scipy.linalg import hadamard
    >>> H = hadamard(16).astype(float)
    >>> res = hierarchical_palm4msa(H, 4, sparsity_level=2, residual="splincol")
    >>> [int(np.count_nonzero(f)) for f in res.factors]
    [32, 32, 32, 32]
    >>> bool(np.linalg.norm(H - res.product()) < 1e-8 * np.linalg.norm(H))
    True
    """
    T, _, w = _check_args(target, None, sparsity_level=sparsity_level, weights=weights,
                                    n_factors=n_factors, tol=tol,
                                    max_iters=[("max_iter_split", max_iter_split, 1),
                                               ("max_iter_global", max_iter_global, 0),
                                               ("max_iter_final", max_iter_final, 0)])
    if residual not in ("sp", "splincol"):
        raise ValueError(f"residual must be 'sp' or 'splincol'; got {residual!r}.")
    state = _hierarchical.hierarchical(T, w, int(n_factors), int(sparsity_level), int(max_iter_split),
                               int(max_iter_global), int(max_iter_final), float(tol), residual)
    return _result(state)


def factorize(target, n_factors, *, sparsity_level=3, weights=None, max_iter=100, tol=1e-6, budget_split="even"):
    """Factorise ``target`` into sparse factors with a budget of values per factor (QK-means' factorisation).

    Minimises ``||diag(w) (T - S_1 ... S_Q)||_F^2`` where the chain (shapes as
    :func:`chain_shapes`) keeps at most ``sum sparsity_level * max(r, c)``
    nonzeros over its factors of shape ``(r, c)``, split per factor by
    ``budget_split`` (see below). :func:`hierarchical_palm4msa` gives a first chain,
    then ``max_iter`` least-squares sweeps improve it: each factor in turn is
    solved exactly on a support, and the support is chosen afresh every sweep
    (greedy orthogonal least squares under the factor's budget for the first
    and the last factor, whose rows or columns are independent; the support of
    a projected gradient step for the others). A new support is kept only if
    the objective goes down, so the objective never increases. Much lower than
    :func:`palm4msa` at the same number of values (PALM takes one gradient step
    per factor and rarely moves a support).

    Parameters
    ----------
    target : array-like of shape (K, D)
    n_factors : int
        ``Q >= 1``.
    sparsity_level : int, default=3
        ``s``: factor ``q`` keeps at most ``s * max(rows, cols)`` values.
    weights : array-like of shape (K,), default=None
        Row weights, as in :func:`palm4msa`.
    max_iter : int, default=100
        Least-squares sweeps after the hierarchical start (``>= 0``).
    tol : float, default=1e-6
        Relative objective change that stops the sweeps (and the PALM runs of the start).
    budget_split : {"even", "wide", "total"}, default="even"
        "even": factor ``q`` keeps at most ``sparsity_level * max(r, c)``
        nonzeros (the nominal budget of the QuickK-means reference code).
        "wide": the same total, but every factor except the widest (the last
        when ``K < D``, the first when ``K > D``) keeps at most
        ``(sparsity_level - 1) * max(r, c)`` (at least ``max(r, c)``) and the
        widest the rest; the even split when no factor is the widest
        (``K == D``). "total": :func:`chain_total` values on ``n_factors``
        factors: when ``K <= D`` the paper chain's total (``floor(log2(max(K,
        D)))`` factors), the widest keeping its even budget; when ``K > D``
        ``s * floor(log2(K))`` per row of the target, shared evenly. See
        :class:`qkm.QKMeans`.

    Returns
    -------
    PalmResult
        ``history`` holds the objective after every least-squares sweep.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> T = rng.standard_normal((8, 32))
    >>> res = factorize(T, 3, sparsity_level=2, max_iter=20)
    >>> [int(np.count_nonzero(f)) <= 2 * max(f.shape) for f in res.factors]
    [True, True, True]
    >>> first = hierarchical_palm4msa(T, 3, sparsity_level=2)
    >>> bool(res.objective < first.objective)
    True
    """
    T, _, w = _check_args(target, None, sparsity_level=sparsity_level, weights=weights, n_factors=n_factors, tol=tol,
                          max_iters=[("max_iter", max_iter, 0)])
    check_choice("budget_split", budget_split, BUDGET_SPLITS)
    with single_threaded_blas():  # BLAS's thread count must not change the greedy supports
        state = _factorize.factorize_weighted(T, w, int(n_factors), int(sparsity_level), int(max_iter), float(tol),
                                     target="dense", budget_split=budget_split)  # the documented algorithm
    return _result(state)


def _check_args(target, factors=None, *, sparsity_level=3, weights=None, n_factors=None,
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

