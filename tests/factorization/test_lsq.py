"""Budgeted projections, least squares on a support, greedy OLS and the least-squares sweeps (qkm.factorization._lsq, qkm.factorization._ols)."""

import numpy as np
import pytest

from qkm.factorization import _projections
from qkm.factorization._lsq import _Sides, _solve_on, lsq_palm
from qkm.factorization._shapes import factor_budgets
from qkm.factorization._ols import ols_support
from qkm.factorization import chain_shapes, factorize, hierarchical_palm4msa

import naive


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# --------------------------------------------------------------------------- #
# per-row / per-column budgets
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", [(1, 6), (6, 1), (7, 9), (9, 30), (30, 9)])
@pytest.mark.parametrize("r, c", [(1, 1), (4, 1), (1, 3), (6, 2), (40, 40)])
def test_rowcol_projection_matches_naive_with_ties(shape, r, c):
    rng = np.random.default_rng(sum(shape) + 7 * r + c)
    Z = rng.integers(-3, 4, size=shape).astype(float)  # many exact ties and zeros
    out = _projections.project(("rowcol", r, c), Z)
    np.testing.assert_allclose(out, naive.rowcol_projection(Z, r, c), rtol=1e-14, atol=0)


@pytest.mark.parametrize("r, c", [(36, 3), (3, 36), (5, 5), (1, 8)])
def test_rowcol_projection_keeps_at_least_its_budget_per_row_and_column(rng, r, c):
    Z = rng.standard_normal((16, 90))
    nz = _projections.project(("rowcol", r, c), Z) != 0
    assert (nz.sum(axis=1) >= min(r, 90)).all()
    assert (nz.sum(axis=0) >= min(c, 16)).all()
    assert nz.sum() <= r * 16 + c * 90
    assert _projections.is_feasible(("rowcol", r, c), nz * Z)


def test_rowcol_feasibility_is_a_max_flow():
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(200):
        n, m = rng.integers(1, 8, size=2)
        r, c = (int(v) for v in rng.integers(1, 4, size=2))
        S = (rng.random((n, m)) < rng.uniform(0.2, 1.0)) * rng.standard_normal((n, m))
        expected = naive.rowcol_feasible(S, r, c)
        assert _projections.rowcol_feasible(S, r, c) == expected
        seen.add(expected)
    assert seen == {True, False}


def test_default_budgets_are_the_reference_nominal_counts():
    assert factor_budgets(chain_shapes(64, 784, 9), 3) == [("sp", 192)] * 8 + [("sp", 2352)]
    assert factor_budgets([(40, 12), (12, 12)], 2) == [("sp", 80), ("sp", 24)]
    assert factor_budgets([(40, 12), (12, 12)], 2, "even") == factor_budgets([(40, 12), (12, 12)], 2)


def test_wide_budgets_move_a_value_per_row_to_the_widest_factor():
    assert factor_budgets(chain_shapes(64, 784, 9), 3, "wide") == [("sp", 128)] * 8 + [("sp", 2864)]   # K < D: last
    assert factor_budgets(chain_shapes(64, 784, 9), 5, "wide") == [("sp", 256)] * 8 + [("sp", 4432)]
    assert factor_budgets(chain_shapes(256, 118, 8), 3, "wide") == [("sp", 1594)] + [("sp", 236)] * 7  # K > D: first
    assert factor_budgets(chain_shapes(64, 784, 2), 3, "wide") == [("sp", 128), ("sp", 2416)]         # a chain of two
    assert factor_budgets(chain_shapes(784, 64, 2), 3, "wide") == [("sp", 2416), ("sp", 128)]


@pytest.mark.parametrize("K, D", [(64, 784), (784, 64), (5, 7), (7, 5), (1, 9), (9, 1), (2, 3), (12, 12), (1, 1)])
@pytest.mark.parametrize("Q", [1, 2, 3, 6])
@pytest.mark.parametrize("s", [1, 2, 3, 5])
def test_wide_budgets_keep_the_even_total_and_fit_their_factors(K, D, Q, s):
    shapes = chain_shapes(K, D, Q)
    even = [k for _, k in factor_budgets(shapes, s, "even")]
    wide = [k for _, k in factor_budgets(shapes, s, "wide")]
    assert even == [min(s * max(r, c), r * c) for r, c in shapes]
    assert sum(wide) == sum(even)
    assert all(1 <= k <= r * c for k, (r, c) in zip(wide, shapes))
    widths = [max(r, c) for r, c in shapes]
    if s == 1 or Q == 1 or widths.count(max(widths)) > 1:   # nothing to move, or no widest factor (K == D)
        assert wide == even
        return
    widest = widths.index(max(widths))
    assert widest == (0 if K > D else Q - 1)
    full = shapes[widest][0] * shapes[widest][1]
    assert wide[widest] > even[widest] or wide[widest] == full
    others = [q for q in range(Q) if q != widest]
    if wide[widest] < full:                                  # the widest not full: the others keep (s - 1) per row
        assert all(wide[q] == min((s - 1) * widths[q], even[q]) for q in others)


@pytest.mark.parametrize("K, D, s", [(64, 784, 3), (20, 1024, 5), (8, 8, 2), (5, 40, 1)])
@pytest.mark.parametrize("Q", [2, 3, 4])
def test_total_budget_split_keeps_the_paper_chains_total(K, D, s, Q):
    """K <= D. Naive reference: the paper chain's sum of s * max(r, c); the widest keeps its even budget, the
    rest even."""
    import math
    paper_q = max(1, int(math.floor(math.log2(max(K, D)))))
    total = sum(min(s * max(r, c), r * c) for r, c in chain_shapes(K, D, paper_q))
    shapes = chain_shapes(K, D, Q)
    got = [k for _, k in factor_budgets(shapes, s, "total")]
    sizes = [r * c for r, c in shapes]
    assert all(0 < k <= n for k, n in zip(got, sizes))
    widths = [max(r, c) for r, c in shapes]
    widest = widths.index(max(widths)) if widths.count(max(widths)) == 1 else None
    others = [q for q in range(Q) if q != widest]
    assert sum(got) == total or all(got[q] == sizes[q] for q in others)     # only the sizes cap the total
    if widest is not None:
        assert got[widest] == min(s * widths[widest], sizes[widest])
    rest = [got[q] for q in others if got[q] < sizes[q]]
    assert max(rest, default=0) - min(rest, default=0) <= 1
    if Q == paper_q:
        assert factor_budgets(shapes, s, "total") == factor_budgets(shapes, s)


@pytest.mark.parametrize("K, D, s", [(256, 118, 3), (1024, 784, 3), (4096, 784, 3), (40, 12, 2), (9, 3, 5)])
@pytest.mark.parametrize("Q", [2, 3])
def test_total_budget_split_above_d_gives_s_log2_k_values_per_centroid(K, D, s, Q):
    """K > D. Naive reference: s * floor(log2 K) values per centroid, shared evenly by the factors, each capped
    by its size (what a small factor cannot hold goes to the others)."""
    import math
    per_centroid = s * int(math.floor(math.log2(K)))
    shapes = chain_shapes(K, D, Q)
    sizes = [r * c for r, c in shapes]
    got = [k for _, k in factor_budgets(shapes, s, "total")]
    assert all(0 < k <= n for k, n in zip(got, sizes))
    if Q == 2:
        total = min(per_centroid * K, K * D + D * D)
        assert sum(got) == total
    uncapped = [k for k, n in zip(got, sizes) if k < n]
    assert max(uncapped, default=0) - min(uncapped, default=0) <= 1
    if (K, D, s, Q) == (1024, 784, 3, 2):
        assert got == [15360, 15360]                 # 30 values per centroid: 26.1x fewer than K x D


@pytest.mark.parametrize("K", [256, 300, 512, 784])
def test_total_budget_split_from_many_clusters_on_is_even(K):
    """K <= D from MANY_CLUSTERS on: the paper chain's total, shared evenly (naive reference)."""
    import math
    from qkm.factorization._shapes import MANY_CLUSTERS
    assert MANY_CLUSTERS <= K
    D, s = 784, 3
    paper_q = int(math.floor(math.log2(D)))
    total = sum(min(s * max(r, c), r * c) for r, c in chain_shapes(K, D, paper_q))
    got = [k for _, k in factor_budgets(chain_shapes(K, D, 2), s, "total")]
    assert sum(got) == total and abs(got[0] - got[1]) <= 1


def test_unknown_budget_split_raises():
    with pytest.raises(ValueError, match="budget split"):
        factor_budgets([(4, 8)], 2, "rows")
    with pytest.raises(ValueError, match="budget_split must be one of 'even', 'wide', 'total'"):
        factorize(np.ones((4, 8)), 2, budget_split="rows")


# --------------------------------------------------------------------------- #
# one factor: exact least squares on a support
# --------------------------------------------------------------------------- #
def _chain(rng, shapes, density=0.5):
    return [(rng.random(sh) < density) * rng.standard_normal(sh) for sh in shapes]


@pytest.mark.parametrize("q", [0, 1, 2])
def test_solve_on_a_support_is_the_least_squares_optimum(rng, q):
    K, D = 6, 11
    shapes = chain_shapes(K, D, 3)
    S = _chain(rng, shapes)
    T = rng.standard_normal((K, D))
    w = rng.uniform(0.5, 2.0, K)
    mask = rng.random(shapes[q]) < 0.6
    WT = w[:, None] * T
    L = np.diag(w) if q == 0 else w[:, None] * naive.chain_product(S[:q])
    R = np.eye(D) if q == 2 else naive.chain_product(S[q + 1:])
    g = L.T @ WT @ R.T
    sides = _Sides(None if q == 0 else L.T @ L, w * w if q == 0 else None, None if q == 2 else R @ R.T)
    X = _solve_on(sides, g, mask, np.zeros(shapes[q]))
    expected = naive.lsq_on_support(T, w, S, q, mask)
    assert not np.any(X[~mask])
    S_ours = S[:q] + [X] + S[q + 1:]
    S_ref = S[:q] + [expected] + S[q + 1:]
    err_ours, err_ref = naive.weighted_chain_error(T, w, S_ours), naive.weighted_chain_error(T, w, S_ref)
    assert err_ours <= err_ref * (1 + 1e-8) + 1e-10


def test_greedy_ols_matches_brute_force(rng):
    for trial in range(5):
        a, n, m = 5, 7, 9
        A = rng.standard_normal((m, a))
        T = rng.standard_normal((m, n))
        scale = rng.uniform(0.5, 2.0, n)
        budget = int(rng.integers(1, 14))
        mask = np.empty((a, n), dtype=np.bool_)
        taken = ols_support(A.T @ A, (A.T @ T) * scale, scale, budget, mask)
        expected = naive.greedy_ols(A, T, scale, budget)
        np.testing.assert_array_equal(mask, expected)
        assert taken == budget == mask.sum()


@pytest.mark.parametrize("a, n, budget", [(60, 1, 45), (40, 3, 100), (25, 2, 50)])
def test_greedy_ols_long_columns_match_naive(a, n, budget):
    """Many atoms per column: the directions kept as coefficients (their store grows past its first size)."""
    rng = np.random.default_rng(a + n)
    A = rng.standard_normal((80, a))
    T = rng.standard_normal((80, n))
    scale = np.ones(n)
    mask = np.empty((a, n), dtype=np.bool_)
    taken = ols_support(A.T @ A, A.T @ T, scale, budget, mask)
    np.testing.assert_array_equal(mask, naive.greedy_ols(A, T, scale, budget))
    assert taken == mask.sum() == min(budget, a * n)


def test_greedy_ols_skips_dependent_atoms_and_empty_columns():
    A = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 1.0]])  # atom 1 = 2 * atom 0
    T = np.array([[1.0, 3.0], [2.0, 1.0]])
    mask = np.empty((3, 2), dtype=np.bool_)
    taken = ols_support(A.T @ A, A.T @ T * np.array([1.0, 0.0]), np.array([1.0, 0.0]), 6, mask)
    assert taken == 2 and not mask[:, 1].any()  # column 1 has no weight; atoms 0 and 1 never both
    assert mask[2, 0] and mask[:2, 0].sum() == 1


# --------------------------------------------------------------------------- #
# sweeps
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("split", ["wide", "even"])
@pytest.mark.parametrize("shape", [(12, 40), (40, 12)])
def test_sweeps_never_increase_the_objective_and_keep_the_budgets(rng, shape, split):
    K, D = shape
    T = rng.standard_normal(shape)
    w = rng.uniform(0.0, 2.0, K)
    w[3] = 0.0
    first = hierarchical_palm4msa(T, 4, sparsity_level=2, weights=w, max_iter_split=5, max_iter_global=5,
                                  max_iter_final=5)
    budgets = factor_budgets(chain_shapes(K, D, 4), 2, split)
    st = lsq_palm(w[:, None] * T, w, list(first.factors), first.lambda_, budgets, 25, 0.0, 25)
    h = np.array(st.history)
    assert np.all(h[1:] <= h[:-1] * (1 + 1e-12))
    # from the start projected on the budgets (splincol(2) keeps more than the wide split's inner budgets)
    assert h[0] <= st.start_objective * (1 + 1e-12)
    if split == "even":
        assert h[0] <= first.objective * (1 + 1e-12)
    for f, (_, k) in zip(st.factors, budgets):
        assert np.count_nonzero(f) <= k
    factors = [st.lam * st.factors[0]] + st.factors[1:]
    assert np.isclose(st.objective, naive.weighted_chain_error(T, w, factors), rtol=1e-9)


def test_factorize_beats_hierarchical_palm4msa_at_fewer_values(rng):
    x = np.linspace(0, 1, 24)[:, None]
    T = np.exp(-6 * (x - np.linspace(0, 1, 60)[None, :]) ** 2) + 0.1 * rng.standard_normal((24, 60))
    first = hierarchical_palm4msa(T, 4, sparsity_level=3)
    res = factorize(T, 4, sparsity_level=3, max_iter=30)
    assert sum(np.count_nonzero(f) for f in res.factors) <= sum(np.count_nonzero(f) for f in first.factors)
    assert res.objective < 0.9 * first.objective
    assert np.isclose(res.objective, np.sum((T - res.product()) ** 2), rtol=1e-9)


def test_factorize_is_deterministic(rng):
    T = rng.standard_normal((10, 30))
    a = factorize(T, 3, sparsity_level=2, max_iter=10)
    b = factorize(T, 3, sparsity_level=2, max_iter=10)
    for fa, fb in zip(a.factors, b.factors):
        assert fa.tobytes() == fb.tobytes()


def test_large_inner_factors_take_conjugate_gradient_steps(rng, monkeypatch):
    import qkm.factorization._lsq as lsq

    K, D = 6, 11
    shapes = chain_shapes(K, D, 3)
    S = _chain(rng, shapes, density=0.8)
    T = rng.standard_normal((K, D))
    w = rng.uniform(0.5, 2.0, K)
    L, R = w[:, None] * S[0], naive.chain_product(S[2:])
    sides = _Sides(L.T @ L, None, R @ R.T)
    g = L.T @ (w[:, None] * T) @ R.T
    mask = S[1] != 0
    X0 = S[1].copy()
    exact = _solve_on(sides, g, mask, X0)
    monkeypatch.setattr(lsq, "DIRECT_MAX_VALUES", 0)
    monkeypatch.setattr(lsq, "CG_ITER", 2)
    few = _solve_on(sides, g, mask, X0)
    monkeypatch.setattr(lsq, "CG_ITER", 200)
    many = _solve_on(sides, g, mask, X0)
    errors = [naive.weighted_chain_error(T, w, [S[0], X, S[2]]) for X in (X0, few, many, exact)]
    assert errors[0] > errors[1] > errors[2]
    assert np.isclose(errors[2], errors[3], rtol=1e-8)
