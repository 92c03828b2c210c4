"""QK-means on wide sparse data: factorisations on the active columns only (qkm.factorization._columns) equal the dense ones."""

import numpy as np
import pytest
import scipy.sparse as sp

from qkm import QKMeans
from qkm.factorization._columns import ColumnMap
from qkm.factorization._factorize import factorize_weighted as factorize, lsq_refit
from qkm.factorization._shapes import factor_budgets
from qkm.factorization import chain_shapes


def _wide_sparse_target(rng, k=10, d=400, words=60):
    """Rows touching a few random columns (most columns all zero), like cluster means of tf-idf data.

    With ``s = 1`` the budgets (``s * max(rows, cols)``) are below ``nnz``: no exact fit, so the
    supports are decided by the data, not by rounding."""
    T = np.zeros((k, d))
    for i in range(k):
        cols = rng.choice(d // 3, size=words, replace=False)     # the last two thirds of the columns stay zero
        T[i, cols] = rng.random(words) + 0.1
    return T


def _assert_same_factors(a, b, paths=("columns", "dense")):
    assert (a.path, b.path) == paths
    assert len(a.factors) == len(b.factors)
    for fa, fb in zip(a.factors, b.factors):
        fa = fa.toarray() if sp.issparse(fa) else fa
        fb = fb.toarray() if sp.issparse(fb) else fb
        np.testing.assert_array_equal(fa != 0.0, fb != 0.0)                  # same supports
        np.testing.assert_allclose(fa * a.lam, fb * b.lam, rtol=0, atol=1e-10 * np.abs(fb * b.lam).max())
    assert a.objective == pytest.approx(b.objective, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("target", ["dense", "sparse"])
@pytest.mark.parametrize("n_factors", [1, 2, 3])
def test_factorize_on_active_columns_equals_dense(n_factors, target):
    rng = np.random.default_rng(n_factors)
    T = _wide_sparse_target(rng)
    w = np.sqrt(rng.integers(1, 9, size=T.shape[0]).astype(float))
    a = factorize(sp.csr_matrix(T), w, n_factors, 1, 5, 1e-6, columns="columns", target=target)
    b = factorize(T, w, n_factors, 1, 5, 1e-6, columns="dense", target=target)
    assert a.n_columns == int(np.count_nonzero(T.any(axis=0))) < T.shape[1]
    assert a.factors[-1].shape[1] == T.shape[1]
    _assert_same_factors(a, b)


@pytest.mark.parametrize("target", ["dense", "sparse"])
def test_refit_on_active_columns_equals_dense(target):
    """Warm refit to new means: the last factor has values in columns where the new target is zero."""
    rng = np.random.default_rng(5)
    K, D, Q, s = 10, 400, 3, 1
    first = factorize(_wide_sparse_target(rng), None, Q, s, 3, 1e-6, columns="dense", target="dense")
    T = _wide_sparse_target(rng)
    old_cols = np.flatnonzero(first.factors[-1].any(axis=0))
    assert not np.all(T[:, old_cols].any(axis=0))      # some supported columns lose their target
    w = np.sqrt(rng.integers(0, 9, size=K).astype(float))   # an empty cluster: weight 0
    budgets = factor_budgets(chain_shapes(K, D, Q), s)
    a = lsq_refit(sp.csr_matrix(T), w, [f.copy() for f in first.factors], first.lam, budgets, 8, 1e-6, 8,
                  columns="columns", target=target)
    b = lsq_refit(T, w, [f.copy() for f in first.factors], first.lam, budgets, 8, 1e-6, 8, columns="dense",
                  target=target)
    assert a.start_objective == pytest.approx(b.start_objective, rel=1e-10)
    _assert_same_factors(a, b)


@pytest.mark.parametrize("n_factors", [2, 3])
def test_sparse_target_sweeps_equal_dense_sweeps(n_factors):
    """The sparse sweeper (CSR target and last factor, Gram-form objective) against the dense one with the same
    support rule (a gradient step for the last factor): same supports,
    same values to 1e-10, for the first factorisation (hierarchical start) and a warm refit with support updates.
    (Positive weights: with an empty cluster the least-squares systems are singular up to the proximal term,
    which amplifies the different rounding of the two paths beyond 1e-10.)"""
    rng = np.random.default_rng(10 + n_factors)
    K, D, s = 10, 400, 1
    T0, T1 = _wide_sparse_target(rng), _wide_sparse_target(rng)
    w = np.sqrt(rng.integers(1, 9, size=K).astype(float))
    first = factorize(T0, w, n_factors, s, 4, 1e-6, columns="dense", target="dense", last_support="gradient")
    a = factorize(sp.csr_matrix(T0), w, n_factors, s, 4, 1e-6, columns="dense", target="sparse")
    assert (a.target, first.target, a.start, first.start) == ("sparse", "dense", "hierarchical", "hierarchical")
    _assert_same_factors(a, first, ("dense", "dense"))
    budgets = factor_budgets(chain_shapes(K, D, n_factors), s)
    b = lsq_refit(sp.csr_matrix(T1), w, [f.copy() for f in first.factors], first.lam, budgets, 8, 1e-6, 8,
                  columns="dense", target="sparse")
    c = lsq_refit(T1, w, [f.copy() for f in first.factors], first.lam, budgets, 8, 1e-6, 8, columns="dense",
                  target="dense", last_support="gradient")
    assert b.n_restricted > 0                      # supports moved (n_restricted counts support changes here)
    assert b.start_objective == pytest.approx(c.start_objective, rel=1e-10)
    _assert_same_factors(b, c, ("dense", "dense"))


def test_exact_start_on_sparse_seeds():
    """Seeds within the last factor's budget: identities and the seeds themselves, no hierarchical sweeps."""
    rng = np.random.default_rng(3)
    T = _wide_sparse_target(rng, k=6, d=600, words=20)          # 120 values <= s * D
    st = factorize(sp.csr_matrix(T), None, 4, 1, 0, 1e-6, target="sparse")
    assert (st.start, st.target) == ("exact", "sparse")
    P = st.lam * np.linalg.multi_dot([f.toarray() if sp.issparse(f) else f for f in st.factors])
    np.testing.assert_allclose(P, T, rtol=0, atol=1e-12)
    assert factorize(np.ones((6, 600)), None, 4, 1, 0, 1e-6, target="sparse").start == "hierarchical"
    # the wide split keeps room for the identities (s - 1 >= 1 values per row) and gives the last factor more
    wide = factorize(sp.csr_matrix(T), None, 4, 2, 0, 1e-6, target="sparse", budget_split="wide")
    assert wide.start == "exact" and wide.objective == 0.0
    assert factorize(sp.csr_matrix(T), None, 4, 1, 0, 1e-6).target == "dense"          # auto: too narrow


def test_column_map_auto_chooses_by_active_fraction():
    few = np.zeros((3, 100))
    few[:, :10] = 1.0
    assert ColumnMap.of(sp.csr_matrix(few)).path == "columns"
    assert ColumnMap.of(np.ones((3, 100))).path == "dense"
    cm = ColumnMap.of(few, None)
    np.testing.assert_array_equal(cm.put(cm.take(few)).toarray(), few)


def _wide_docs(seed=0, n=120, d=3000, k=4):
    """Documents drawing words from their topic's own vocabulary: most columns of every mean are zero."""
    rng = np.random.default_rng(seed)
    rows, cols, vals = [], [], []
    for i in range(n):
        topic = i % k
        words = rng.choice(150, size=8, replace=False) + topic * 150
        rows += [i] * 8
        cols += list(words)
        vals += list(rng.random(8) + 0.2)
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    return X


def test_qkmeans_on_csr_equals_dense_fit_and_records_the_columns_path():
    X = _wide_docs()
    kw = dict(n_clusters=4, n_factors=3, sparsity_level=2, max_iter=8, palm_max_iter=20, random_state=0)
    a = QKMeans(**kw).fit(X)
    b = QKMeans(**kw).fit(X.toarray())
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-10)
    ran = [r for r in a.history_ if r["step"] in ("init", "refit", "polish")]
    assert ran and all(r["columns"] == "columns" and r["n_columns"] <= 600 for r in ran)   # 4 topics x 150 words
    assert all(r["target"] == "sparse" for r in ran) and ran[0]["start"] == "exact"
    assert a.factors_[-1].shape == (a.factors_[-1].shape[0], X.shape[1])
    # the model is the brute-force nearest centroid of its own (dense) centres
    d2 = ((X.toarray()[:, None, :] - a.cluster_centers_[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(a.predict(X), d2.argmin(1))


@pytest.mark.needs_threads(2)
def test_qkmeans_on_csr_same_with_1_and_2_threads():
    X = _wide_docs(seed=1)
    kw = dict(n_clusters=4, n_factors=3, sparsity_level=2, max_iter=6, palm_max_iter=10, random_state=0)
    a = QKMeans(n_jobs=1, **kw).fit(X)
    b = QKMeans(n_jobs=2, **kw).fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == b.inertia_
    for fa, fb in zip(a.factors_, b.factors_):
        np.testing.assert_array_equal(fa.toarray(), fb.toarray())
