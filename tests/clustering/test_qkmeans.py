"""QK-means and low-rank k-means: oracles are brute force on the dense V, Lloyd, and exact identities."""

import numpy as np
import pytest
import scipy.sparse as sp

import qkm
from qkm import KMeans, LowRankKMeans, QKMeans
from qkm._data import KMeansData
from qkm.clustering._factored_lloyd import factored_lloyd
from qkm.clustering._qkmeans import _LowRankFitter
from qkm.factorization._shapes import default_n_factors
from qkm._threads import numba_threads
from qkm.export import load_model, save_model
from qkm.factorization._shapes import factor_budgets, paper_n_factors
from qkm.factorization import chain_shapes

import naive


def _brute_force(X, V):
    X = X.toarray() if sp.issparse(X) else X
    d = naive.sq_distances(np.asarray(X, dtype=np.float64), np.asarray(V, dtype=np.float64))
    return d.argmin(axis=1), d.min(axis=1)


@pytest.fixture(scope="module")
def fitted(blobs):
    X = blobs[0]
    return X, QKMeans(n_clusters=8, sparsity_level=2, max_iter=15, palm_max_iter=50, random_state=0).fit(X)


def test_objective_never_increases(fitted):
    _, qk = fitted
    h = qk.objective_history_
    assert h.size >= 3
    assert np.all(np.diff(h) <= 1e-10 * h[:-1]), h


def test_labels_and_inertia_are_brute_force_on_the_dense_product(fitted):
    X, qk = fitted
    labels, dist = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)
    np.testing.assert_allclose(qk.inertia_, dist.sum(), rtol=1e-10)
    np.testing.assert_array_equal(qk.predict(X), labels)
    np.testing.assert_allclose(qk.transform(X) ** 2, naive.sq_distances(X, qk.cluster_centers_), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(qk.score(X), -dist.sum(), rtol=1e-10)


def test_factors_multiply_to_the_centres(fitted):
    X, qk = fitted
    K, D = qk.cluster_centers_.shape
    Q = default_n_factors(K, D)
    assert len(qk.factors_) == Q
    assert all(sp.issparse(f) for f in qk.factors_)
    product = qk.factors_[0].toarray()
    for f in qk.factors_[1:]:
        product = product @ f.toarray()
    assert qk.mean_ is None  # not centred by default
    np.testing.assert_allclose(product, qk.cluster_centers_, rtol=1e-10, atol=1e-12)
    assert qk.nnz_ == sum(f.nnz for f in qk.factors_)
    assert qk.flops_ == 2 * qk.nnz_
    assert qk.compression_ == pytest.approx(K * D / qk.nnz_)


def test_every_factor_keeps_its_budget(fitted):
    _, qk = fitted
    s = 2
    K, D = qk.cluster_centers_.shape
    budgets = factor_budgets(chain_shapes(K, D, len(qk.factors_)), s, "total")
    for f, (_, k) in zip(qk.factors_, budgets):
        assert f.nnz <= k
    # in all at most the paper chain's s * max(r, c) per factor (naive sum)
    assert qk.nnz_ <= sum(s * max(r, c) for r, c in chain_shapes(K, D, paper_n_factors(K, D)))
    assert qk.nnz_ == qk.nnz_with_mean_


def test_default_chain_is_two_factors_with_the_total_split(blobs):
    """K <= D: the default is ``n_factors=2, budget_split="total"``; a given ``n_factors`` splits evenly (as
    before), and on the paper's chain "total" is the even split."""
    X = blobs[0]
    kw = dict(n_clusters=8, sparsity_level=2, max_iter=6, palm_max_iter=20, random_state=0)
    default, explicit = QKMeans(**kw).fit(X), QKMeans(n_factors=2, budget_split="total", **kw).fit(X)
    assert len(default.factors_) == 2
    np.testing.assert_array_equal(default.labels_, explicit.labels_)
    for a, b in zip(default.factors_, explicit.factors_):
        assert (a != b).nnz == 0
    given, even = QKMeans(n_factors=2, **kw).fit(X), QKMeans(n_factors=2, budget_split="even", **kw).fit(X)
    np.testing.assert_array_equal(given.labels_, even.labels_)
    assert given.inertia_ == even.inertia_
    Q = paper_n_factors(8, X.shape[1])
    paper, total = QKMeans(n_factors=Q, **kw).fit(X), QKMeans(n_factors=Q, budget_split="total", **kw).fit(X)
    assert len(paper.factors_) == Q == 3
    np.testing.assert_array_equal(paper.labels_, total.labels_)
    assert paper.inertia_ == total.inertia_


def test_more_clusters_than_features_fit_two_factors_with_s_log2_k_values_per_centroid():
    """K > D: the default chain is K x D times D x D holding s floor(log2 K) values per centroid; warm refits
    move the supports in their first sweep only; the labels are brute force's on the folded centroids."""
    X = np.random.RandomState(3).rand(400, 10)
    K, s = 48, 2
    qk = QKMeans(K, sparsity_level=s, max_iter=6, palm_max_iter=10, random_state=0).fit(X)
    assert [f.shape for f in qk.factors_] == [(K, 10), (10, 10)]
    budgets = factor_budgets(chain_shapes(K, 10, 2), s, "total")
    assert sum(k for _, k in budgets) == min(s * paper_n_factors(K, 10) * K, K * 10 + 100)
    assert all(f.nnz <= k for f, (_, k) in zip(qk.factors_, budgets))
    init = qk.history_[1] if qk.history_[1]["step"] == "init" else next(r for r in qk.history_ if r["step"] == "init")
    assert init["shapes"] == [[K, 10], [10, 10]] and init["budgets"] == [k for _, k in budgets]
    refits = [r for r in qk.history_ if r["step"] == "refit"]
    assert refits and all(r["support_sweeps"] == 1 for r in refits)
    labels, dist = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)
    np.testing.assert_allclose(qk.inertia_, dist.sum(), rtol=1e-10)
    h = qk.objective_history_
    assert np.all(np.diff(h) <= 1e-10 * h[:-1])
    given = QKMeans(16, sparsity_level=2, n_factors=4, max_iter=4, palm_max_iter=10, random_state=0).fit(X)
    assert len(given.factors_) == 4 == paper_n_factors(16, 10)      # a given n_factors: the paper's chain
    assert all(f.nnz <= k for f, (_, k) in zip(given.factors_, factor_budgets(chain_shapes(16, 10, 4), 2)))


def test_more_clusters_than_features_reproducible_and_thread_count_free():
    X = np.random.RandomState(4).rand(300, 8)
    kw = dict(n_clusters=40, sparsity_level=3, max_iter=5, palm_max_iter=10, random_state=7)
    a, b = QKMeans(n_jobs=1, **kw).fit(X), QKMeans(n_jobs=1, **kw).fit(X)
    c = QKMeans(n_jobs=2, **kw).fit(X)
    for other in (b, c):
        np.testing.assert_array_equal(a.labels_, other.labels_)
        np.testing.assert_array_equal(a.objective_history_, other.objective_history_)
        for f, g in zip(a.factors_, other.factors_):
            np.testing.assert_array_equal(f.toarray(), g.toarray())


@pytest.mark.parametrize("shape", [(120, 30), (120, 5)])          # K < D: the last factor is the widest; K > D: the first
def test_wide_budget_split_keeps_its_budgets_and_brute_force_labels(blobs, shape):
    rng = np.random.RandomState(1)
    X = rng.rand(*shape)
    K = 8
    qk = QKMeans(K, sparsity_level=3, budget_split="wide", max_iter=6, palm_max_iter=20, random_state=0).fit(X)
    budgets = factor_budgets(chain_shapes(K, shape[1], len(qk.factors_)), 3, "wide")
    assert budgets != factor_budgets(chain_shapes(K, shape[1], len(qk.factors_)), 3)
    for f, (_, k) in zip(qk.factors_, budgets):
        assert f.nnz <= k
    labels, _ = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)
    h = qk.objective_history_
    assert np.all(np.diff(h) <= 1e-10 * h[:-1])


@pytest.mark.parametrize("shape", [(120, 30), (120, 5)])
def test_total_budget_split_keeps_the_paper_total_on_fewer_factors(shape):
    rng = np.random.RandomState(2)
    X = rng.rand(*shape)
    K = 8
    qk = QKMeans(K, sparsity_level=2, n_factors=2, budget_split="total", max_iter=6, palm_max_iter=20,
                 random_state=0).fit(X)
    assert len(qk.factors_) == 2
    budgets = factor_budgets(chain_shapes(K, shape[1], 2), 2, "total")
    paper = factor_budgets(chain_shapes(K, shape[1], paper_n_factors(K, shape[1])), 2)
    # K <= D: the paper chain's total; K > D: 2 floor(log2 K) values per centroid (naive counts)
    total = sum(k for _, k in paper) if K <= shape[1] else 2 * paper_n_factors(K, shape[1]) * K
    assert sum(k for _, k in budgets) == min(total, sum(r * c for r, c in chain_shapes(K, shape[1], 2)))
    for f, (_, k) in zip(qk.factors_, budgets):
        assert f.nnz <= k
    assert qk.nnz_ <= total
    labels, _ = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)
    h = qk.objective_history_
    assert np.all(np.diff(h) <= 1e-10 * h[:-1])


@pytest.mark.parametrize("estimator", [QKMeans(6, sparsity_level=2, max_iter=8, palm_max_iter=20, random_state=0),
                                       LowRankKMeans(6, rank=2, max_iter=8, random_state=0)])
@pytest.mark.parametrize("center", [False, True])
def test_centred_and_uncentred_models_assign_by_brute_force(blobs, estimator, center):
    X = blobs[0] + 50.0  # far from the origin: the mean matters
    est = estimator.set_params(center=center).fit(X)
    V = est.cluster_centers_
    if center:
        np.testing.assert_allclose(est.mean_, X.mean(axis=0), rtol=1e-12)
        product = est.factors_[0].toarray()
        for f in est.factors_[1:]:
            product = product @ f.toarray()
        np.testing.assert_allclose(est.mean_ + product, V, rtol=1e-10, atol=1e-10)
        assert est.nnz_with_mean_ == est.nnz_ + X.shape[1]
    else:
        assert est.mean_ is None and est.nnz_with_mean_ == est.nnz_
    labels, dist = _brute_force(X, V)
    np.testing.assert_array_equal(est.labels_, labels)
    np.testing.assert_array_equal(est.predict(X), labels)
    np.testing.assert_allclose(est.inertia_, dist.sum(), rtol=1e-9)
    np.testing.assert_allclose(est.transform(X) ** 2, naive.sq_distances(X, V), rtol=1e-7, atol=1e-6)
    assert np.all(np.diff(est.objective_history_) <= 1e-10 * est.objective_history_[:-1])
    Xs = sp.csr_matrix(X)
    np.testing.assert_array_equal(est.predict(Xs), labels)  # sparse rows stay sparse through the mean


def test_sparse_input_gives_the_same_model(blobs):
    X = blobs[0]
    a = QKMeans(6, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=1).fit(X)
    b = QKMeans(6, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=1).fit(sp.csr_matrix(X))
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-8, atol=1e-10)


@pytest.mark.needs_threads(2)
def test_reproducible_and_thread_invariant(blobs):
    from threadpoolctl import threadpool_limits

    X = blobs[0]
    runs = []
    for threads in (1, 2, 2):  # numba threads, and as many BLAS threads around the fit (pinned to 1 inside)
        with numba_threads(threads), threadpool_limits(limits=threads, user_api="blas"):
            est = QKMeans(5, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=3, n_jobs=threads).fit(X)
        runs.append(est)
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0].labels_, other.labels_)
        assert runs[0].cluster_centers_.tobytes() == other.cluster_centers_.tobytes()
        np.testing.assert_array_equal(runs[0].objective_history_, other.objective_history_)


@pytest.mark.parametrize("shape", [(40, 3), (60, 20)])
def test_more_clusters_than_features_and_float32(shape):
    rng = np.random.RandomState(0)
    X = rng.rand(*shape).astype(np.float32)
    qk = QKMeans(8, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=0).fit(X)
    assert qk.cluster_centers_.dtype == np.float32 and qk.operator_.dtype == np.float32
    assert qk.factors_[0].shape[0] == 8 and qk.factors_[-1].shape[1] == shape[1]
    labels, _ = _brute_force(X, qk.cluster_centers_)
    assert np.mean(labels == qk.labels_) > 0.99  # float32 operator vs float64 brute force: rounding-level ties only


@pytest.mark.parametrize("params, match", [
    ({"sparsity_level": 0}, "sparsity_level must be an integer >= 1"),
    ({"sparsity_level": 1.5}, "sparsity_level"),
    ({"n_factors": 0}, "n_factors must be None or an integer >= 1"),
    ({"palm_max_iter": -1}, "palm_max_iter"),
    ({"palm_warm_iter": 2.0}, "palm_warm_iter"),
    ({"palm_tol": -1.0}, "palm_tol"),
    ({"budget_split": "rows"}, "budget_split must be one of 'auto', 'even', 'wide', 'total'"),
    ({"budget_split": None}, "budget_split"),
    ({"max_iter": 0}, "max_iter"),
    ({"n_init": 0}, "n_init"),
    ({"init": "nope"}, "init must be"),
])
def test_bad_parameters_raise_clear_errors(blobs, params, match):
    with pytest.raises(ValueError, match=match):
        QKMeans(3, **params).fit(blobs[0][:50])


def test_lowrank_bad_rank(blobs):
    with pytest.raises(ValueError, match="rank must be an integer >= 1"):
        LowRankKMeans(3, rank=0).fit(blobs[0][:50])


def test_full_rank_lowrank_is_lloyd(blobs):
    X = blobs[0]
    init = X[[0, 100, 200, 300, 400, 500]]
    km = KMeans(6, init=init, n_init=1, tol=0.0, max_iter=100).fit(X)
    lr = LowRankKMeans(6, rank=6, init=init, tol=0.0, max_iter=100).fit(X)
    np.testing.assert_array_equal(km.labels_, lr.labels_)
    np.testing.assert_allclose(lr.inertia_, km.inertia_, rtol=1e-9)
    np.testing.assert_allclose(lr.cluster_centers_, km.cluster_centers_, rtol=1e-7, atol=1e-9)


def test_lowrank_rank_and_weighted_optimality(blobs):
    X = blobs[0]
    lr = LowRankKMeans(6, rank=2, random_state=0).fit(X)
    assert np.linalg.matrix_rank(lr.cluster_centers_, tol=1e-8) == 2
    assert lr.nnz_ == 2 * (6 + X.shape[1])
    # the SVD refit is the weighted least-squares optimum: no random rank-2 matrix does better
    rng = np.random.RandomState(0)
    U = rng.rand(6, 12)
    w = rng.rand(6) + 0.1
    (P, Q), err, _ = _LowRankFitter(2).refit(U, w, None, 1)
    for _ in range(20):
        V = (P + 0.01 * rng.randn(*P.shape)) @ (Q + 0.01 * rng.randn(*Q.shape))
        assert err <= float((((U - V) * w[:, None]) ** 2).sum()) + 1e-12


class _RecordingFitter(_LowRankFitter):
    """Full-rank fitter that records what each refit received."""

    def __init__(self):
        super().__init__(rank=100)
        self.calls = []

    def refit(self, U, weights, state, max_iter, polish=False):
        self.calls.append((U.copy(), weights.copy()))
        return super().refit(U, weights, state, max_iter, polish)


def test_weights_follow_cluster_ids_after_an_empty_cluster():
    # the reference code shifts the sqrt(n_k) weights of every cluster after an empty one
    rng = np.random.RandomState(0)
    X = np.vstack([rng.normal(0, 0.1, (10, 2)), rng.normal(5, 0.1, (30, 2)), [[5.0, 9.0]]])
    init = np.array([[0.0, 0.0], [100.0, 100.0], [5.0, 5.0]])  # cluster 1 starts (and stays) empty
    fitter = _RecordingFitter()
    data = KMeansData(X)
    factored_lloyd(data, init, fitter, max_iter=1, tol=0.0, rng=rng, polish_iter=0)
    U, weights = fitter.calls[0]
    # cluster 1 took the point farthest from its centre (the outlier of cluster 2)
    np.testing.assert_allclose(U[1], [5.0, 9.0])
    np.testing.assert_allclose(weights ** 2, [10, 1, 30])
    np.testing.assert_allclose(U[0], X[:10].mean(axis=0))
    np.testing.assert_allclose(U[2], X[10:40].mean(axis=0))


def test_qkmeans_beats_the_seeds_and_is_close_to_kmeans(blobs):
    X = blobs[0]
    km = KMeans(6, random_state=0).fit(X)
    qk = QKMeans(6, sparsity_level=3, random_state=0).fit(X)
    assert qk.inertia_ < qk.objective_history_[0]
    assert qk.inertia_ <= 1.5 * km.inertia_


def test_save_and_load_round_trip(fitted, tmp_path):
    X, qk = fitted
    path = tmp_path / "q.qkm"
    save_model(qk, path)
    model = load_model(path)
    assert model.kind == "factor-chain" and model.metadata["algorithm"] == "qkmeans"
    assert model.operator.nnz == qk.nnz_
    for a, b in zip(model.operator.factors, qk.factors_):
        assert (a != b).nnz == 0
    np.testing.assert_array_equal(model.predict(X), qk.labels_)
    np.testing.assert_allclose(model.transform(X), qk.transform(X), rtol=1e-12)


@pytest.mark.parametrize("n_factors", [1, 2, 4])
def test_any_number_of_factors(blobs, n_factors):
    X = blobs[0]
    qk = QKMeans(6, sparsity_level=2, n_factors=n_factors, max_iter=5, palm_max_iter=20, random_state=0).fit(X)
    assert len(qk.factors_) == n_factors
    assert qk.factors_[0].shape[0] == 6 and qk.factors_[-1].shape[1] == X.shape[1]
    labels, _ = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)


def test_seed_assignment_fits_the_first_chain_to_the_seeds_clusters(monkeypatch):
    """From SEED_ASSIGN_MIN_CLUSTERS clusters on, the loop assigns with the dense seeds first and the first
    chain fits the means of those clusters; the labels stay brute force's and the history non-increasing."""
    from qkm.clustering import _fitters
    assert _fitters._ChainFitter.assigns_seeds(_fitters.SEED_ASSIGN_MIN_CLUSTERS)
    assert not _fitters._ChainFitter.assigns_seeds(_fitters.SEED_ASSIGN_MIN_CLUSTERS - 1)
    X = np.random.RandomState(5).rand(300, 12)
    kw = dict(n_clusters=20, sparsity_level=2, max_iter=6, palm_max_iter=10, random_state=0)
    before = QKMeans(**kw).fit(X)
    assert before.history_[0]["step"] == "init"
    monkeypatch.setattr(_fitters, "SEED_ASSIGN_MIN_CLUSTERS", 20)
    qk, again = QKMeans(**kw).fit(X), QKMeans(**kw).fit(X)
    steps = [r["step"] for r in qk.history_]
    assert steps[:3] == ["seed-assign", "init", "assign"]
    seeds = qkm.kmeans_plusplus(X, 20, random_state=0)
    seeds = seeds[0] if isinstance(seeds, tuple) else seeds
    np.testing.assert_allclose(qk.history_[0]["objective"], naive.assign(X, seeds)[1].sum(), rtol=1e-10)
    labels, dist = _brute_force(X, qk.cluster_centers_)
    np.testing.assert_array_equal(qk.labels_, labels)
    h = qk.objective_history_
    assert np.all(np.diff(h) <= 1e-10 * h[:-1])
    np.testing.assert_array_equal(qk.labels_, again.labels_)
    np.testing.assert_array_equal(qk.objective_history_, again.objective_history_)
