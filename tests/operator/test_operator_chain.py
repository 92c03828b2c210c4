"""FactorChainOperator: every execution path against the folded dense V."""

import numpy as np
import pytest
import scipy.sparse as sp

from qkm.operator._chain_calibration import PATHS, ChainCalibration
from qkm.operator._chain_layout import random_chain
from qkm._threads import numba_threads
from qkm.operator import DenseOperator, FactorChainOperator, make_operator

# (K, D, number of factors): K < D, K > D, K = D, one factor, two factors
SHAPES = [(8, 40, 3), (40, 8, 3), (16, 16, 2), (12, 30, 1), (24, 70, 4)]


def irregular_chain(shapes, seed, dtype=np.float64):
    """Random sparse factors with uneven rows (some empty, some long), not the QK-means supports."""
    rng = np.random.default_rng(seed)
    out = []
    for r, c in shapes:
        M = sp.random(r, c, density=0.3, format="csr", random_state=rng, dtype=np.float64)
        M.data = rng.standard_normal(M.nnz)
        M = M.tolil()
        M[0, :] = 0            # an empty row
        M[r - 1, :] = rng.standard_normal(c)  # a full row
        out.append(sp.csr_matrix(M, dtype=dtype))
    return out


def chains():
    for K, D, Q in SHAPES:
        yield f"random-{K}x{D}-Q{Q}", random_chain(K, D, s=3, n_factors=Q, dtype=np.float64, seed=K + D + Q)
    yield "irregular", irregular_chain([(9, 13), (13, 7), (7, 31)], seed=1)
    yield "s5", random_chain(20, 50, s=5, dtype=np.float64, seed=7)
    rng = np.random.default_rng(4)  # rows of 1 and 2 entries: too short to pad
    yield "short-rows", [sp.csr_matrix((rng.standard_normal(10), (np.arange(10), rng.integers(0, 6, 10))),
                                       shape=(10, 6)),
                         sp.csr_matrix((rng.standard_normal(12), (np.repeat(np.arange(6), 2),
                                                                 rng.choice(9, 12))), shape=(6, 9))]
    yield "dense-factors", [np.random.default_rng(2).standard_normal((6, 5)),
                            np.random.default_rng(3).standard_normal((5, 11))]


CHAINS = dict(chains())


def brute_force(V64, c_sq, X):
    """Labels and partials from the folded V in float64, plus the gap to the runner-up."""
    X64 = X.toarray() if sp.issparse(X) else X
    P = c_sq[None, :] - 2.0 * (np.asarray(X64, dtype=np.float64) @ V64.T)
    order = np.argsort(P, axis=1, kind="stable")
    rows = np.arange(P.shape[0])
    gap = P[rows, order[:, 1]] - P[rows, order[:, 0]] if P.shape[1] > 1 else np.full(P.shape[0], np.inf)
    return order[:, 0], P[rows, order[:, 0]], gap


def samples(op, n, seed, sparse):
    """Rows near randomly chosen centroids (clear winners), dense or CSR."""
    rng = np.random.default_rng(seed)
    V = op.to_dense().astype(np.float64)
    X = V[rng.integers(0, op.n_clusters, n)] + 0.05 * rng.standard_normal((n, op.n_features))
    if sparse:
        X[rng.random(X.shape) < 0.3] = 0.0
        return sp.csr_matrix(X.astype(op.dtype))
    return X.astype(op.dtype)


def run(op, X):
    labels = np.full(X.shape[0], -1, dtype=np.int32)
    best = np.full(X.shape[0], np.nan)
    op.partials(X, labels, best)
    return labels, best


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_to_dense_apply_and_norms_match_the_product(name, dtype):
    factors = CHAINS[name]
    V64 = factors[0].toarray() if sp.issparse(factors[0]) else np.asarray(factors[0], dtype=np.float64)
    for f in factors[1:]:
        V64 = V64 @ (f.toarray() if sp.issparse(f) else f)
    op = FactorChainOperator(factors, dtype=dtype)
    rtol = 1e-6 if dtype == np.float64 else 1e-4
    assert op.to_dense().dtype == dtype and op.to_dense().shape == V64.shape
    scale = np.abs(V64).max()
    np.testing.assert_allclose(op.to_dense(), V64, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(op.c_sq, np.einsum("ij,ij->i", V64, V64), rtol=10 * rtol)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((37, op.n_features)).astype(dtype)
    ref = X.astype(np.float64) @ op.to_dense().astype(np.float64).T
    for Xin in (X, sp.csr_matrix(X), sp.csr_array(X)):
        out = op.apply(Xin)
        assert out.shape == (37, op.n_clusters) and out.dtype == dtype
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max())


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sparse", [False, True])
def test_every_path_gives_the_brute_force_labels(name, dtype, sparse):
    op = FactorChainOperator(CHAINS[name], dtype=dtype)
    V64 = op.to_dense().astype(np.float64)
    results = {}
    for n in (1, 5, 300):  # per-sample sizes, one block, several blocks and chunks
        X = samples(op, n, seed=n, sparse=sparse)
        ref_labels, ref_best, gap = brute_force(V64, op.c_sq, X)
        clear = gap > 1e-3 * (1.0 + np.abs(ref_best))
        assert n < 300 or clear.mean() > 0.5
        for path in PATHS + ("fused",):
            op.force_path(path)
            assert op.execution_path(n, sparse=sparse) in PATHS
            labels, best = run(op, X)
            np.testing.assert_array_equal(labels[clear], ref_labels[clear])
            tol = 1e-9 if dtype == np.float64 else 1e-4
            np.testing.assert_allclose(best, ref_best, rtol=tol, atol=tol * (1.0 + np.abs(op.c_sq).max()))
            results[path, n] = (labels, best)
        # the fused kernels and the scipy products add the same terms in the same order
        for path in ("fused-block", "fused", "scipy"):
            np.testing.assert_array_equal(results[path, n][0], results["fused-sample", n][0])
        np.testing.assert_array_equal(results["fused-block", n][1], results["fused-sample", n][1])


@pytest.mark.parametrize("sparse", [False, True])
def test_auto_path_matches_forced_paths_and_reports_its_choice(sparse):
    op = FactorChainOperator(random_chain(32, 90, dtype=np.float32, seed=5))
    for n in (1, 7, 40, 600):
        X = samples(op, n, seed=n, sparse=sparse)
        labels, best = run(op, X)
        path = op.execution_path(n, sparse=sparse)
        assert path in PATHS
        entry = op.timings_[op._key(_bucket_name(n), sparse)]
        assert entry["path"] == path and path in entry["seconds_per_row"]
        assert all(t > 0 for t in entry["seconds_per_row"].values())
        op.force_path(path)
        forced = run(op, X)
        op.force_path("auto")
        np.testing.assert_array_equal(labels, forced[0])
        np.testing.assert_array_equal(best, forced[1])
    assert "| input / batch | chosen |" in op.calibration.report()
    assert set(op.describe()["execution_paths"].values()) <= set(PATHS)


def _bucket_name(n):
    from qkm.operator._chain_calibration import bucket_of as _bucket

    return _bucket(n)[0]


@pytest.mark.needs_threads(2)
@pytest.mark.parametrize("path", ["auto", "fused-block", "fused-sample", "scipy", "dense"])
@pytest.mark.parametrize("sparse", [False, True])
def test_results_do_not_depend_on_the_thread_count(path, sparse):
    op = FactorChainOperator(random_chain(24, 70, dtype=np.float32, seed=9), path=path)
    X = samples(op, 900, seed=3, sparse=sparse)  # several chunks: the parallel kernels run
    with numba_threads(1):
        one = run(op, X)
    with numba_threads(2):
        two = run(op, X)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])


def test_calibration_is_reused_by_a_similar_chain(monkeypatch):
    first = FactorChainOperator(random_chain(16, 50, dtype=np.float32, seed=0))
    for n in (1, 10, 300):
        run(first, samples(first, n, seed=n, sparse=False))
    measured = dict(first.timings_)
    assert len(measured) == 3
    # next Lloyd iteration: same shapes, new values and supports
    second = FactorChainOperator(random_chain(16, 50, dtype=np.float32, seed=1), calibration=first)
    assert second.calibration is first.calibration
    monkeypatch.setattr(second, "calibrate", lambda *a, **k: pytest.fail("re-timed a calibrated bucket"))
    for n in (1, 10, 300):
        X = samples(second, n, seed=n, sparse=False)
        labels, _ = run(second, X)
        np.testing.assert_array_equal(labels, brute_force(second.to_dense().astype(np.float64), second.c_sq, X)[0])
        assert second.execution_path(n) == measured[second._key(_bucket_name(n), False)]["path"]
    # a chain of another shape or dtype starts afresh
    other = FactorChainOperator(random_chain(16, 60, dtype=np.float32), calibration=first.calibration)
    assert other.calibration is not first.calibration and other.timings_ == {}
    other64 = FactorChainOperator(random_chain(16, 50, dtype=np.float64), calibration=first.calibration)
    assert other64.calibration is not first.calibration
    fresh = ChainCalibration()
    assert FactorChainOperator(random_chain(16, 50), calibration=fresh).calibration is fresh


def test_execution_path_uses_the_kind_of_the_last_batch():
    op = FactorChainOperator(random_chain(8, 40, dtype=np.float32), path="auto")
    run(op, samples(op, 20, seed=0, sparse=True))
    keys = set(op.timings_)
    assert op.execution_path(20) == op.timings_[op._key("17-256", True)]["path"]
    assert set(op.timings_) == keys  # nothing new was timed
    assert op.execution_path(0) == "none"


def test_empty_batch():
    op = FactorChainOperator(random_chain(8, 40, dtype=np.float32))
    for X in (np.zeros((0, 40), dtype=np.float32), sp.csr_matrix((0, 40), dtype=np.float32)):
        labels = np.zeros(0, dtype=np.int32)
        best = np.zeros(0)
        op.partials(X, labels, best)
        assert op.apply(X).shape == (0, 8)
    assert op.timings_ == {}


def test_inputs_of_other_layouts_and_dtypes():
    op = FactorChainOperator(random_chain(10, 30, dtype=np.float32, seed=4), path="fused")
    X = samples(op, 50, seed=0, sparse=False)
    ref = run(op, X)
    # float64 input, a Fortran-ordered copy, CSR with unsorted indices, a CSC matrix
    unsorted = sp.csr_matrix(X)
    unsorted.indices = unsorted.indices.copy()
    for i in range(unsorted.shape[0]):
        a, b = unsorted.indptr[i], unsorted.indptr[i + 1]
        unsorted.indices[a:b] = unsorted.indices[a:b][::-1]
        unsorted.data[a:b] = unsorted.data[a:b][::-1]
    unsorted.has_sorted_indices = False
    for Xin in (X.astype(np.float64), np.asfortranarray(X), unsorted, sp.csc_matrix(X)):
        np.testing.assert_array_equal(run(op, Xin)[0], ref[0])
    # non-contiguous output views
    labels = np.zeros(100, dtype=np.int32)
    best = np.zeros(100)
    op.partials(X, labels[::2], best[::2])
    np.testing.assert_array_equal(labels[::2], ref[0])
    with pytest.raises(ValueError):
        op.partials(np.zeros((3, 31), dtype=np.float32), labels[:3], best[:3])


@pytest.mark.parametrize("bad", [
    [],
    "not a list",
    [np.ones(3)],                                   # 1-D
    [np.ones((2, 3)), np.ones((4, 5))],             # inner dimensions differ
    [np.ones((2, 3)), np.array([[1.0], [np.nan], [1.0]])],
    [np.ones((2, 3)) * np.inf],
    [sp.csr_matrix(np.array([[1.0, np.inf]]))],
    [np.ones((0, 3))],
    [np.array([["a", "b"]])],
])
def test_bad_factor_lists_raise(bad):
    with pytest.raises(ValueError):
        FactorChainOperator(bad)


def test_bad_dtype_and_path_raise():
    with pytest.raises(ValueError):
        FactorChainOperator([np.ones((2, 3))], dtype=np.int64)
    with pytest.raises(ValueError):
        FactorChainOperator([np.ones((2, 3))], path="fastest")
    with pytest.raises(ValueError):  # overflows float32
        FactorChainOperator([np.full((2, 3), 1e300)], dtype=np.float32)


def test_size_counts_and_storage():
    S1 = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    S2 = sp.csr_matrix(np.array([[0.0, 1.0, 0.0, 4.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 6.0, 7.0]]))
    S2.data[0] = 0.0  # an explicit zero is not counted
    op = FactorChainOperator([S1, S2])
    assert op.dtype == np.float64 and op.n_clusters == 2 and op.n_features == 4 and op.n_factors == 2
    assert op.nnz == 3 + 4 and op.flops == 14
    assert op.compression == pytest.approx(2 * 4 / 7)
    assert all(isinstance(f, sp.csr_matrix) and f.has_sorted_indices for f in op.factors)
    assert [f.nnz for f in op.factors] == [3, 4]
    np.testing.assert_array_equal(op.to_dense(), S1 @ S2.toarray())
    desc = op.describe()
    assert desc["kind"] == "FactorChainOperator" and desc["nnz"] == 7 and desc["factor_shapes"] == [[2, 3], [3, 4]]
    # dtype: float32 only if every factor is float32
    f32 = [np.ones((2, 3), dtype=np.float32), sp.csr_matrix(np.ones((3, 4), dtype=np.float32))]
    assert FactorChainOperator(f32).dtype == np.float32
    assert FactorChainOperator([f32[0], np.ones((3, 4))]).dtype == np.float64
    assert FactorChainOperator([np.ones((2, 3), dtype=np.int64)]).dtype == np.float64
    assert FactorChainOperator(f32, dtype=np.float64).factors[1].dtype == np.float64
    # the QK-means supports: s per row and column of square factors
    fs = random_chain(32, 100, s=3, dtype=np.float32)
    assert len(fs) == 7 and fs[0].shape == (32, 32) and fs[-1].shape == (32, 100)
    assert all((np.diff(f.indptr) == 3).all() and (np.bincount(f.indices, minlength=32) == 3).all() for f in fs[:-1])
    assert (np.bincount(fs[-1].indices, minlength=100) == 3).all()
    assert FactorChainOperator(fs).nnz == 6 * 32 * 3 + 300


def test_make_operator_and_dense_path_agree_with_dense_operator():
    fs = random_chain(12, 40, dtype=np.float64, seed=3)
    op = make_operator(fs)
    assert isinstance(op, FactorChainOperator)
    dense = DenseOperator(op.to_dense().copy())
    X = samples(op, 64, seed=1, sparse=False)
    want = np.empty(64, dtype=np.int32), np.empty(64)
    dense.partials(X, *want)
    op.force_path("dense")
    got = run(op, X)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_every_row_layout_of_the_kernels_is_exercised():
    # 3 / 5: uniform rows; -3: rows padded to multiples of 3; -1: rows kept as they are
    codes = set()
    for factors in CHAINS.values():
        codes |= set(FactorChainOperator(factors)._meta[:-1, 3].tolist())
    assert {3, 5, -3, -1} <= codes


def test_padding_rows_to_multiples_of_three_keeps_the_matrix():
    from qkm.operator._chain_layout import _lane_rows

    rng = np.random.default_rng(0)
    for _ in range(50):
        r, c = rng.integers(1, 12, 2)
        M = sp.random(r, c, density=rng.random(), format="csr", random_state=rng)
        M.sort_indices()
        ptr, idx, val, w = _lane_rows(M.indptr, M.indices, M.data, max_padding=10.0)
        np.testing.assert_array_equal(sp.csr_matrix((val, idx, ptr), shape=M.shape).toarray(), M.toarray())
        if w == -3:
            counts = np.diff(ptr)
            assert (counts % 3 == 0).all() and (counts >= 3).all()


@pytest.mark.parametrize("sparse", [False, True])
def test_full_product_path_is_measured_and_both_paths_agree(sparse):
    op = FactorChainOperator(random_chain(32, 90, dtype=np.float64, seed=6))
    for n in (1, 40, 600):
        X = samples(op, n, seed=n, sparse=sparse)
        ref = (X @ op.to_dense().T) if not sparse else X.toarray() @ op.to_dense().T
        auto = op.apply(X)
        entry = op.timings_["apply:" + op._key(_bucket_name(n), sparse)]
        assert entry["path"] in ("scipy", "dense") and set(entry["seconds_per_row"]) == {"scipy", "dense"}
        for path in ("scipy", "dense"):
            op.force_path(path)
            np.testing.assert_allclose(op.apply(X), ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
        op.force_path("auto")
        np.testing.assert_allclose(auto, ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
        assert op.describe()["execution_paths"]["apply:" + op._key(_bucket_name(n), sparse)] == entry["path"]
    # training operators only use the chain, whose results do not depend on a timing outcome
    frozen = FactorChainOperator(op.factors, calibration=ChainCalibration(bit_identical=True))
    X = samples(frozen, 5, seed=1, sparse=sparse)
    np.testing.assert_array_equal(frozen.apply(X), np.ascontiguousarray(frozen._scipy_dots(X).T))
    assert not any(k.startswith("apply:") for k in frozen.timings_)


@pytest.mark.parametrize("name", ["random-8x40-Q3", "random-40x8-Q3", "random-12x30-Q1", "irregular"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sparse", [False, True])
def test_a_kept_mean_is_added_to_every_centroid_on_every_path(name, dtype, sparse):
    factors = CHAINS[name]
    plain = FactorChainOperator(factors, dtype=dtype)
    rng = np.random.default_rng(11)
    on = rng.random(plain.n_features) < 0.5  # the mean is large on half of the features, zero elsewhere
    mean = np.where(on, 20.0 + rng.standard_normal(plain.n_features), 0.0).astype(dtype)
    op = FactorChainOperator(factors, dtype=dtype, mean=mean)
    V64 = plain.to_dense().astype(np.float64) + mean.astype(np.float64)
    assert op.mean.dtype == dtype and op.describe()["centered"] and op.nnz == plain.nnz
    assert op.mean_nnz == on.sum() and op.describe()["nnz_with_mean"] == op.nnz + on.sum()
    tol = 1e-9 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(op.to_dense(), V64, rtol=tol)
    np.testing.assert_allclose(op.c_sq, np.einsum("ij,ij->i", V64, V64), rtol=tol)
    X = V64[rng.integers(0, op.n_clusters, 300)] + 0.05 * rng.standard_normal((300, op.n_features))
    if sparse:  # zeros where the mean is zero: rows stay near their centroid
        X[(rng.random(X.shape) < 0.3) & ~on[None, :]] = 0.0
        X = sp.csr_matrix(X.astype(dtype))
    else:
        X = X.astype(dtype)
    ref_labels, ref_best, gap = brute_force(V64, np.einsum("ij,ij->i", V64, V64), X)
    clear = gap > 1e-5 * (1.0 + np.abs(ref_best))  # well above the float32 rounding of |x.v| ~ |best|
    assert clear.mean() > 0.5
    for path in PATHS + ("fused",):
        op.force_path(path)
        for n in (1, 5, 300):
            labels, best = run(op, X[:n])
            np.testing.assert_array_equal(labels[clear[:n]], ref_labels[:n][clear[:n]])
            np.testing.assert_allclose(best, ref_best[:n], rtol=tol, atol=tol * (1.0 + np.abs(op.c_sq).max()))
    op.force_path("auto")
    ref = (X.toarray() if sparse else X).astype(np.float64) @ V64.T
    np.testing.assert_allclose(op.apply(X), ref, rtol=tol, atol=tol * np.abs(ref).max())
    labels, d = op.assign(X)
    np.testing.assert_array_equal(labels[clear], ref_labels[clear])
    alone = op.without_mean()
    assert alone.mean is None and all((a != b).nnz == 0 for a, b in zip(alone.factors, op.factors))
    np.testing.assert_allclose(alone.to_dense(), plain.to_dense())
    with pytest.raises(ValueError, match="mean has shape"):
        FactorChainOperator(factors, mean=np.zeros(plain.n_features + 1))
    with pytest.raises(ValueError, match="non-finite"):
        FactorChainOperator(factors, mean=np.full(plain.n_features, np.nan))


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_a_large_v_is_folded_only_when_a_path_needs_it(monkeypatch, with_mean, sparse):
    from qkm import _config
    factors = CHAINS["random-24x70-Q4"]
    mean = np.random.default_rng(3).standard_normal(70) if with_mean else None
    eager = FactorChainOperator(factors, mean=mean)
    monkeypatch.setattr(_config, "FOLD_MAX_BYTES", 0)     # every V counts as large
    lazy = FactorChainOperator(factors, mean=mean)
    assert eager.holds_dense and not lazy.holds_dense and not lazy.describe()["holds_dense"]
    # norms from the streaming pass: same values as from the folded V up to rounding
    np.testing.assert_allclose(lazy.c_sq, eager.c_sq, rtol=1e-12)
    np.testing.assert_allclose(lazy._chain[-1], eager._chain[-1], rtol=1e-12, atol=1e-12 * eager.c_sq.max())
    X = samples(eager, 200, seed=5, sparse=sparse)
    ref_labels, ref_best, gap = brute_force(eager.to_dense(), eager.c_sq, X)
    clear = gap > 1e-9 * (1.0 + np.abs(ref_best))
    for path in ("fused", "scipy"):      # the chain paths never fold
        lazy.force_path(path)
        labels, best = run(lazy, X)
        np.testing.assert_array_equal(labels[clear], ref_labels[clear])
        np.testing.assert_allclose(best, ref_best, rtol=1e-10, atol=1e-10 * eager.c_sq.max())
        assert not lazy.holds_dense
    lazy.force_path("dense")             # the dense path folds V (bit-identical to the eager fold) and keeps it
    labels, _ = run(lazy, X)
    np.testing.assert_array_equal(labels[clear], ref_labels[clear])
    assert lazy.holds_dense
    np.testing.assert_array_equal(lazy.to_dense(), eager.to_dense())
    auto = FactorChainOperator(factors, mean=mean)       # measured: V kept only if "dense" won somewhere
    auto.calibrate(200, sparse=sparse, X=X)
    auto.apply(X)
    chosen = {e["path"] for e in auto.timings_.values()}
    assert auto.holds_dense == ("dense" in chosen)


@pytest.mark.parametrize("with_mean", [False, True])
def test_given_norms_are_used_as_they_are_and_nothing_is_folded(with_mean):
    factors = CHAINS["irregular"]
    mean = np.random.default_rng(8).standard_normal(31) if with_mean else None
    ref = FactorChainOperator(factors, mean=mean, path="fused")
    op = FactorChainOperator(factors, mean=mean, path="fused", norms=ref.norms)
    assert not op.holds_dense
    for a, b in zip(op.norms, ref.norms):
        np.testing.assert_array_equal(a, b)
    for sparse in (False, True):
        X = samples(ref, 100, seed=2, sparse=sparse)
        for got, want in zip(run(op, X), run(ref, X)):
            np.testing.assert_array_equal(got, want)      # the same bits as the operator that computed them
    np.testing.assert_array_equal(op.to_dense(), ref.to_dense())
