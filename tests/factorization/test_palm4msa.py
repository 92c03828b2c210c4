"""palm4MSA and hierarchical palm4MSA (qkm.palm4msa, qkm.factorization._palm)."""

import numpy as np
import pytest
from scipy.linalg import hadamard

from qkm.factorization import _palm, _projections
from qkm.factorization import PalmResult, chain_shapes, hierarchical_palm4msa, palm4msa, project_splincol

import naive


# --------------------------------------------------------------------------- #
# helpers: naive references
# --------------------------------------------------------------------------- #
def naive_splincol(Z, s):
    """s largest |Z| per row, union s largest per column (smaller index wins ties), unit norm."""
    return naive.rowcol_projection(Z, s, s)


def naive_splincol_feasible(S, s):
    """Every nonzero charged to its row or its column, at most s each (a max-flow problem)."""
    return naive.rowcol_feasible(S, s, s)


def naive_product(factors):
    out = np.asarray(factors[0], dtype=float)
    for f in factors[1:]:
        out = out @ f
    return out


def naive_objective(T, res, weights=None):
    w = np.ones(T.shape[0]) if weights is None else np.asarray(weights, dtype=float)
    R = w[:, None] * (T - res.lambda_ * naive_product(res.factors))
    return float(np.sum(R * R))


def rel_err(T, res):
    return np.linalg.norm(T - res.product()) / np.linalg.norm(T)


def identity_start(K, D, Q):
    """FAuST's init: identities, the last factor zero."""
    start = [np.eye(*shape) for shape in chain_shapes(K, D, Q)]
    start[-1] = np.zeros(start[-1].shape)
    return start


def permutation_factor(n, s, rng):
    """Exactly s nonzeros in every row and column (s disjoint shifted permutations)."""
    M = np.zeros((n, n))
    p = rng.permutation(n)
    for k in range(s):
        M[np.arange(n), p[(np.arange(n) + k) % n]] = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 1.5, n)
    return M


def smooth_matrix(K, D):
    x = np.linspace(0.0, 1.0, K)[:, None]
    y = np.linspace(0.0, 1.0, D)[None, :]
    return np.exp(-8.0 * (x - y) ** 2) + 0.5 * np.cos(6.0 * x * y)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def warm(rng):
    """A target and a warm start (a hierarchical factorisation of it)."""
    T = rng.standard_normal((16, 40))
    first = hierarchical_palm4msa(T, 4, sparsity_level=2, max_iter_split=10, max_iter_global=10,
                                  max_iter_final=10)
    return T, first


# --------------------------------------------------------------------------- #
# shapes and projection
# --------------------------------------------------------------------------- #
def test_chain_shapes():
    assert chain_shapes(64, 784, 9) == [(64, 64)] + [(64, 64)] * 7 + [(64, 784)]
    assert chain_shapes(40, 12, 3) == [(40, 12), (12, 12), (12, 12)]
    assert chain_shapes(5, 7, 2) == [(5, 5), (5, 7)]
    assert chain_shapes(5, 7, 1) == [(5, 7)]


@pytest.mark.parametrize("shape", [(1, 6), (6, 1), (7, 9), (9, 7), (12, 30)])
@pytest.mark.parametrize("s", [1, 2, 3, 10])
def test_splincol_matches_naive_with_ties(shape, s):
    rng = np.random.default_rng(sum(shape) * 10 + s)
    Z = rng.integers(-3, 4, size=shape).astype(float)  # many exact ties and zeros
    P = project_splincol(Z, s)
    np.testing.assert_allclose(P, naive_splincol(Z, s), rtol=1e-14, atol=0)
    np.testing.assert_array_equal(P, project_splincol(Z.copy(), s))  # deterministic


@pytest.mark.parametrize("s", [1, 2, 3, 5])
def test_splincol_keeps_enough_per_row_and_column(rng, s):
    Z = rng.standard_normal((20, 33))
    P = project_splincol(Z, s)
    nz = P != 0
    assert (nz.sum(axis=1) >= min(s, 33)).all()
    assert (nz.sum(axis=0) >= min(s, 20)).all()
    assert nz.sum() <= s * (20 + 33)
    assert np.isclose(np.linalg.norm(P), 1.0, rtol=1e-14)
    np.testing.assert_allclose(P[nz] * np.linalg.norm(Z[nz]), Z[nz], rtol=1e-13)


def test_splincol_zero_input_float32_and_idempotence(rng):
    np.testing.assert_array_equal(project_splincol(np.zeros((4, 5)), 2), np.zeros((4, 5)))
    Z = rng.standard_normal((6, 8)).astype(np.float32)
    P = project_splincol(Z, 2)
    assert P.dtype == np.float64 and P.flags.c_contiguous
    np.testing.assert_allclose(P, naive_splincol(Z.astype(np.float64), 2), rtol=1e-14)
    np.testing.assert_allclose(project_splincol(P, 2), P, rtol=1e-15)  # a projected matrix is feasible


def test_feasibility_check_matches_max_flow():
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(300):
        n, m = rng.integers(1, 9, size=2)
        s = int(rng.integers(1, 4))
        S = (rng.random((n, m)) < rng.uniform(0.2, 1.0)) * rng.standard_normal((n, m))
        expected = naive_splincol_feasible(S, s)
        assert _projections.splincol_feasible(S, s) == expected
        seen.add(expected)
        assert _projections.splincol_feasible(project_splincol(S, s), s)  # a projection is feasible
    assert seen == {True, False}


def test_sp_projection_matches_naive(rng):
    Z = rng.integers(-3, 4, size=(9, 11)).astype(float)
    for k in (1, 7, 50, 99, 200):
        out = np.empty_like(Z)
        _projections.sp_into(Z, k, out)
        a = np.abs(Z).ravel()
        keep = np.zeros(a.size, dtype=bool)
        keep[np.lexsort((np.arange(a.size), -a))[:k]] = True
        ref = np.where(keep.reshape(Z.shape), Z, 0.0)
        np.testing.assert_allclose(out, ref / np.linalg.norm(ref), rtol=1e-14)


# --------------------------------------------------------------------------- #
# palm4msa
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(16, 40), (40, 12)])
def test_objective_never_increases(rng, weighted, shape):
    K, D = shape
    T = rng.standard_normal(shape)
    w = rng.uniform(0.0, 3.0, K) if weighted else None
    if weighted:
        w[[1, 5]] = 0.0
    start = [project_splincol(rng.standard_normal(sh), 2) for sh in chain_shapes(K, D, 4)]
    res = palm4msa(T, start, sparsity_level=2, weights=w, max_iter=150, tol=0.0)
    h = np.array(res.history)
    assert res.n_iter == len(h) == 150
    assert np.all(h[1:] <= h[:-1] * (1 + 1e-12))
    first_objective = naive_objective(T, PalmResult(start, 1.0, 0.0, 0), w)
    assert h[0] <= first_objective
    assert np.isclose(res.objective, naive_objective(T, res, w), rtol=1e-10)
    assert res.objective == h[-1]


def test_step_safeguard_keeps_descent_with_underestimated_lipschitz(rng, monkeypatch):
    # A power iteration only gives a lower bound of ||L||_2^2 ||R||_2^2; every step is checked
    # against the exact curvature and redone with the certified constant when it was too low.
    true_power = _palm._power
    monkeypatch.setattr(_palm, "_power", lambda G, v, n: (0.05 * true_power(G, v, n)[0], v))
    T = rng.standard_normal((12, 30))
    S = [project_splincol(rng.standard_normal(sh), 2) for sh in chain_shapes(12, 30, 3)]
    state = _palm.palm(T, None, S, 1.0, [("splincol", 2)] * 3, 60, 0.0)
    h = np.array(state.history)
    assert state.n_certified > 0
    assert np.all(h[1:] <= h[:-1] * (1 + 1e-12))


def test_lambda_is_the_closed_form(warm, rng):
    T, first = warm
    w = rng.uniform(0.5, 2.0, T.shape[0])
    for weights in (None, w):
        res = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, weights=weights, max_iter=7)
        ww = np.ones(T.shape[0]) if weights is None else weights
        WP = ww[:, None] * naive_product(res.factors)
        WT = ww[:, None] * T
        assert np.isclose(res.lambda_, np.sum(WT * WP) / np.sum(WP * WP), rtol=1e-10)


def test_result_format(warm):
    T, first = warm
    res = palm4msa(T.astype(np.float32), first.factors, lambda_=first.lambda_, sparsity_level=2, max_iter=5)
    assert isinstance(res, PalmResult) and isinstance(res.lambda_, float) and isinstance(res.n_iter, int)
    for f, shape in zip(res.factors, chain_shapes(16, 40, 4)):
        assert f.shape == shape and f.dtype == np.float64 and f.flags.c_contiguous
        assert np.isclose(np.linalg.norm(f), 1.0, rtol=1e-12)
        nz = f != 0
        assert (nz.sum(axis=1) >= min(2, f.shape[1])).all()
        assert naive_splincol_feasible(f, 2)
    np.testing.assert_allclose(res.product(), res.lambda_ * naive_product(res.factors), rtol=1e-12)
    # float32 target = the same values in float64
    same = palm4msa(T.astype(np.float32).astype(np.float64), first.factors, lambda_=first.lambda_,
                    sparsity_level=2, max_iter=5)
    np.testing.assert_array_equal(res.product(), same.product())


def test_warm_start_does_not_modify_inputs_and_is_deterministic(warm):
    T, first = warm
    before = [f.copy() for f in first.factors]
    a = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, max_iter=10)
    b = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, max_iter=10)
    for f, g in zip(before, first.factors):
        np.testing.assert_array_equal(f, g)
    for f, g in zip(a.factors, b.factors):
        np.testing.assert_array_equal(f, g)
    assert a.objective <= first.objective * (1 + 1e-12)


def test_max_iter_zero_returns_the_normalised_start(rng):
    T = rng.standard_normal((6, 10))
    start = [3.0 * project_splincol(rng.standard_normal(sh), 2) for sh in chain_shapes(6, 10, 3)]
    res = palm4msa(T, start, lambda_=2.0, sparsity_level=2, max_iter=0)
    assert res.n_iter == 0 and res.history == []
    np.testing.assert_allclose(res.product(), 2.0 * naive_product(start), rtol=1e-12)
    assert np.isclose(res.objective, naive_objective(T, res), rtol=1e-12)


def test_lambda_zero_starts_from_the_closed_form(warm):
    T, first = warm
    res = palm4msa(T, first.factors, lambda_=0.0, sparsity_level=2, max_iter=3)
    assert res.lambda_ != 0.0 and res.objective < np.sum(T * T)


def test_constant_weights_change_only_the_scale_of_the_objective(warm):
    T, first = warm
    kw = dict(lambda_=first.lambda_, sparsity_level=2, max_iter=20, tol=0.0)
    plain = palm4msa(T, first.factors, **kw)
    scaled = palm4msa(T, first.factors, weights=np.full(T.shape[0], 3.0), **kw)
    for f, g in zip(plain.factors, scaled.factors):
        np.testing.assert_allclose(f, g, rtol=1e-8, atol=1e-12)
    assert np.isclose(scaled.lambda_, plain.lambda_, rtol=1e-8)
    assert np.isclose(scaled.objective, 9.0 * plain.objective, rtol=1e-8)


def test_zero_weight_rows_are_ignored(warm, rng):
    T, first = warm
    w = rng.uniform(0.5, 2.0, T.shape[0])
    w[[0, 7]] = 0.0
    T2 = T.copy()
    T2[[0, 7]] = 1e6 * rng.standard_normal((2, T.shape[1]))  # rows that do not count
    kw = dict(lambda_=first.lambda_, sparsity_level=2, weights=w, max_iter=15)
    a, b = palm4msa(T, first.factors, **kw), palm4msa(T2, first.factors, **kw)
    for f, g in zip(a.factors, b.factors):
        np.testing.assert_array_equal(f, g)
    assert all(np.isfinite(f).all() for f in a.factors)
    assert np.isclose(a.objective, naive_objective(T, a, w), rtol=1e-10)
    # the weights really weigh: a very heavy row is fitted better than without weights
    heavy = np.ones(T.shape[0])
    heavy[3] = 30.0
    c = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, weights=heavy, max_iter=50)
    d = palm4msa(T, first.factors, lambda_=first.lambda_, sparsity_level=2, max_iter=50)
    assert np.linalg.norm((T - c.product())[3]) < np.linalg.norm((T - d.product())[3])


def test_single_factor(rng):
    T = rng.standard_normal((5, 9))
    res = palm4msa(T, [rng.standard_normal((5, 9))], sparsity_level=2, max_iter=50)
    assert (np.count_nonzero(res.factors[0], axis=1) >= 2).all()
    assert np.all(np.diff(res.history) <= 1e-12 * np.array(res.history[:-1]))
    h = hierarchical_palm4msa(T, 1, sparsity_level=2)
    assert len(h.factors) == 1 and h.objective <= np.sum(T * T)


# --------------------------------------------------------------------------- #
# exact recovery
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("n", [5, 6])
def test_hierarchical_recovers_hadamard_butterflies(n):
    H = hadamard(2 ** n).astype(float)
    res = hierarchical_palm4msa(H, n, sparsity_level=2, residual="splincol")
    assert rel_err(H, res) < 1e-6
    for f in res.factors:  # n butterfly factors: 2 nonzeros in every row and column
        assert (np.count_nonzero(f, axis=0) == 2).all() and (np.count_nonzero(f, axis=1) == 2).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_palm_recovers_a_sparse_chain_from_a_nearby_start(seed):
    # No method recovers a random sparse chain from scratch (the splits are not identifiable);
    # PALM converges to it from a perturbed truth, including its supports.
    rng = np.random.default_rng(seed)
    truth = [permutation_factor(16, 2, rng) for _ in range(3)]
    T = naive_product(truth)
    start = [f + 1e-3 * rng.standard_normal(f.shape) for f in truth]  # dense: the support is found again
    res = palm4msa(T, start, sparsity_level=2, max_iter=1500, tol=0.0)
    assert rel_err(T, res) < 1e-6
    for f, g in zip(res.factors, truth):
        np.testing.assert_array_equal(f != 0, g != 0)


def test_hierarchical_beats_plain_palm_from_identity():
    H = hadamard(32).astype(float)
    plain = palm4msa(H, identity_start(32, 32, 5), sparsity_level=2, max_iter=100)
    hier = hierarchical_palm4msa(H, 5, sparsity_level=2, residual="splincol")
    assert rel_err(H, plain) > 0.5 > 1e-6 > rel_err(H, hier)
    # and on a smooth matrix that is not exactly factorisable (default residual constraint)
    T = smooth_matrix(32, 96)
    plain = palm4msa(T, identity_start(32, 96, 5), sparsity_level=3, max_iter=200)
    hier = hierarchical_palm4msa(T, 5, sparsity_level=3)
    assert rel_err(T, hier) < 0.8 * rel_err(T, plain)


def test_hierarchical_weighted_and_tall(rng):
    T = smooth_matrix(40, 12)
    w = rng.uniform(0.0, 2.0, 40)
    res = hierarchical_palm4msa(T, 3, sparsity_level=2, weights=w)
    assert [f.shape for f in res.factors] == chain_shapes(40, 12, 3)
    assert np.isclose(res.objective, naive_objective(T, res, w), rtol=1e-10)
    assert res.n_iter == len(res.history) > 0
    again = hierarchical_palm4msa(T, 3, sparsity_level=2, weights=w)
    for f, g in zip(res.factors, again.factors):
        np.testing.assert_array_equal(f, g)


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("kwargs, match", [
    ({"sparsity_level": 0}, "sparsity_level"),
    ({"sparsity_level": 1.5}, "sparsity_level"),
    ({"sparsity_level": True}, "sparsity_level"),
    ({"max_iter": -1}, "max_iter"),
    ({"tol": -1.0}, "tol"),
    ({"lambda_": np.nan}, "lambda_"),
    ({"weights": [1.0, 2.0]}, r"weights must have shape \(4,\)"),
    ({"weights": [1.0, -1.0, 1.0, 1.0]}, "non-negative"),
    ({"weights": [1.0, np.nan, 1.0, 1.0]}, "NaN"),
    ({"weights": np.zeros(4)}, "all be zero"),
])
def test_palm4msa_rejects_bad_parameters(kwargs, match):
    T = np.ones((4, 6))
    start = [np.eye(4), np.ones((4, 6))]
    with pytest.raises(ValueError, match=match):
        palm4msa(T, start, **kwargs)


def test_bad_arrays_are_rejected():
    T = np.ones((4, 6))
    with pytest.raises(ValueError, match="do not chain"):
        palm4msa(T, [np.eye(4), np.ones((5, 6))])
    with pytest.raises(ValueError, match="do not chain"):
        palm4msa(T, [np.eye(3), np.ones((3, 6))])
    with pytest.raises(ValueError, match="at least one"):
        palm4msa(T, [])
    bad = T.copy()
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="target contains NaN or infinite"):
        palm4msa(bad, [np.eye(4), np.ones((4, 6))])
    with pytest.raises(ValueError, match=r"factors\[1\] contains NaN"):
        palm4msa(T, [np.eye(4), np.full((4, 6), np.nan)])
    with pytest.raises(ValueError, match="2-D"):
        palm4msa(np.ones(5), [np.ones((5, 1))])
    with pytest.raises(ValueError, match="s must be"):
        project_splincol(T, 0)
    with pytest.raises(ValueError, match="NaN"):
        project_splincol(bad, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_factors": 0}, "n_factors"),
    ({"sparsity_level": 0}, "sparsity_level"),
    ({"max_iter_split": 0}, "max_iter_split"),
    ({"max_iter_global": -1}, "max_iter_global"),
    ({"weights": [1.0]}, "weights"),
    ({"residual": "dense"}, "residual"),
])
def test_hierarchical_rejects_bad_parameters(kwargs, match):
    args = {"n_factors": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        hierarchical_palm4msa(np.ones((4, 6)), **args)
    with pytest.raises(ValueError, match="n_factors"):
        chain_shapes(4, 6, 0)
