"""qkm.KMeans against scikit-learn, the naive references and itself."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SKKMeans
from sklearn.exceptions import ConvergenceWarning

import naive
from conftest import CONTAINERS
import qkm
from qkm import KMeans
from qkm._data import KMeansData
from qkm._empty import relocate_empty_clusters
from qkm.clustering._init import greedy_kmeanspp as kmeans_plusplus, n_local_trials_for
from qkm._validation import check_data


def _init_rows(X, K, seed):
    rows = np.random.RandomState(seed).choice(X.shape[0], K, replace=False)
    C0 = X[rows]
    return np.asarray(C0.toarray() if sp.issparse(C0) else C0)


@pytest.mark.parametrize("container", list(CONTAINERS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_same_result_as_sklearn_from_same_init(blobs, container, dtype, algorithm):
    X = CONTAINERS[container](blobs[0].astype(dtype))
    C0 = _init_rows(X, 6, seed=1)
    ref = SKKMeans(6, init=C0, n_init=1, algorithm=algorithm).fit(X)
    got = KMeans(6, init=C0, n_init=1, algorithm=algorithm).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    # reference WCSS of scikit-learn's own result, recomputed exactly in float64
    ref_wcss = naive.assign(X, ref.cluster_centers_)[1].sum()
    np.testing.assert_allclose(got.inertia_, ref_wcss, rtol=1e-6)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-5, atol=1e-6)
    assert got.n_iter_ == ref.n_iter_
    assert got.cluster_centers_.dtype == dtype


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_truly_sparse_data_matches_sklearn(sparse_text_like, algorithm):
    X = sparse_text_like
    C0 = _init_rows(X, 15, seed=3)
    ref = SKKMeans(15, init=C0, n_init=1, algorithm="lloyd").fit(X)
    got = KMeans(15, init=C0, n_init=1, algorithm=algorithm).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.inertia_, ref.inertia_, rtol=1e-6)


def test_hand_computed_toy_case():
    # scikit-learn's test_kmeans_results without sample weights, worked out by hand:
    # iteration 1 assigns {0, 1} -> (0, 0) and {2, 3} -> (0.5, 0.5) (ties go to the
    # lower index), the means are (0.25, 0) and (0.75, 1); iteration 2 keeps the
    # labels; each point is 0.25 away from its centre: inertia 4 * 0.0625.
    X = np.array([[0, 0], [0.5, 0], [0.5, 1], [1, 1]], dtype=np.float64)
    init = np.array([[0, 0], [0.5, 0.5]])
    km = KMeans(2, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(km.labels_, [0, 0, 1, 1])
    assert km.inertia_ == pytest.approx(0.25)
    np.testing.assert_allclose(km.cluster_centers_, [[0.25, 0], [0.75, 1]])
    assert km.n_iter_ == 2


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_lloyd_and_elkan_agree_with_naive_lloyd(blobs, container):
    X = CONTAINERS[container](blobs[0])
    C0 = _init_rows(X, 8, seed=5)
    ref_labels, ref_wcss, ref_centers = naive.lloyd(X, C0)
    for algorithm in ("lloyd", "elkan"):
        km = KMeans(8, init=C0, n_init=1, tol=0, algorithm=algorithm).fit(X)
        if algorithm == "elkan":
            assert "pairs" in {r["mode"] for r in km.history_}
        np.testing.assert_array_equal(km.labels_, ref_labels)
        np.testing.assert_allclose(km.inertia_, ref_wcss, rtol=1e-10)
        np.testing.assert_allclose(km.cluster_centers_, ref_centers, rtol=1e-10, atol=1e-12)


def test_lloyd_and_elkan_identical_on_sparse(sparse_text_like):
    X = sparse_text_like
    a = KMeans(20, random_state=0, algorithm="lloyd").fit(X)
    b = KMeans(20, random_state=0, algorithm="elkan").fit(X)
    # both Elkan paths ran: fused full passes early, pruned pair batches later
    assert {r["mode"] for r in b.history_} == {"full", "pairs"}
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.inertia_ == b.inertia_ and a.n_iter_ == b.n_iter_


@pytest.mark.needs_threads(2)
@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_one_and_two_threads_identical(blobs, sparse_text_like, algorithm, container):
    import numba

    from qkm._threads import effective_n_threads

    assert numba.config.NUMBA_NUM_THREADS >= 2 and effective_n_threads(2) == 2  # really two threads
    X = CONTAINERS[container](blobs[0]) if container == "dense" else sparse_text_like
    fits = [KMeans(7, random_state=3, algorithm=algorithm, n_jobs=n).fit(X) for n in (1, 2)]
    np.testing.assert_array_equal(fits[0].labels_, fits[1].labels_)
    np.testing.assert_array_equal(fits[0].cluster_centers_, fits[1].cluster_centers_)
    assert fits[0].inertia_ == fits[1].inertia_


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_reproducible_from_random_state(blobs, container):
    X = CONTAINERS[container](blobs[0])
    a = KMeans(5, random_state=11, n_init=3).fit(X)
    b = KMeans(5, random_state=11, n_init=3).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_kmeans_plusplus_matches_naive(blobs, sparse_text_like, container):
    X = check_data(blobs[0] if container == "dense" else sparse_text_like)
    K = 9
    L = n_local_trials_for(K)
    assert L == 2 + 3
    centers, idx = kmeans_plusplus(KMeansData(X), K, np.random.RandomState(7))
    ref_idx = naive.kmeans_plusplus(X, K, np.random.RandomState(7), L)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(centers, naive.dense(X[idx]))


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_kmeans_plusplus_picks_sklearns_rows(blobs, container):
    from sklearn.cluster import kmeans_plusplus as sk_kmeans_plusplus

    import qkm

    X = CONTAINERS[container](blobs[0])
    for K, trials in ((6, None), (11, 4)):
        L = trials if trials is not None else n_local_trials_for(K)
        _, ref = sk_kmeans_plusplus(X, K, random_state=3, n_local_trials=L)
        centers, idx = qkm.kmeans_plusplus(X, K, random_state=3, n_local_trials=trials)
        np.testing.assert_array_equal(idx, ref)
        np.testing.assert_array_equal(centers, naive.dense(X[idx]))
    with pytest.raises(ValueError, match="n_samples=600 should be >= n_clusters=601"):
        qkm.kmeans_plusplus(X, 601)


def test_predict_and_transform_match_brute_force(blobs, sparse_text_like):
    for X in (blobs[0], sparse_text_like):
        km = KMeans(6, random_state=0).fit(X)
        labels, d = naive.assign(X, km.cluster_centers_)
        np.testing.assert_array_equal(km.predict(X), labels)
        np.testing.assert_allclose(km.transform(X), np.sqrt(naive.sq_distances(X, km.cluster_centers_)), atol=1e-9)
        np.testing.assert_allclose(-km.score(X), d.sum(), rtol=1e-10)


def test_empty_cluster_repair_never_empties_another():
    # points: a singleton far away (cluster 0) and a pair (cluster 1); cluster 2 empty
    X = check_data(np.array([[100.0, 0.0], [0.0, 0.0], [0.0, 3.0]]))
    data = KMeansData(X)
    labels = np.array([0, 1, 1], dtype=np.int32)
    C_old = np.array([[100.0, 0.0], [0.0, 1.5], [50.0, 50.0]])
    C_new = np.array([[100.0, 0.0], [0.0, 1.5], [50.0, 50.0]])
    counts = np.array([1, 2, 0])
    sq_dist = np.array([0.0, 2.25, 2.25])  # farthest is row 1 (ties broken by order)
    shift_sq = np.zeros(3)
    c_sq = (C_new ** 2).sum(1)
    # make the singleton the farthest point: it must be skipped
    sq_dist[0] = 1e6
    moved = relocate_empty_clusters(data, labels, sq_dist, counts, C_new, shift_sq, c_sq, C_old)
    assert moved == 1
    np.testing.assert_array_equal(counts, [1, 1, 1])
    np.testing.assert_array_equal(C_new[0], [100.0, 0.0])  # the singleton stayed
    np.testing.assert_array_equal(C_new[2], [0.0, 0.0])    # took row 1
    np.testing.assert_array_equal(C_new[1], [0.0, 3.0])    # donor mean without row 1
    np.testing.assert_allclose(c_sq, (C_new ** 2).sum(1))
    np.testing.assert_allclose(shift_sq, ((C_new - C_old) ** 2).sum(1))


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_duplicate_initial_centres_give_no_empty_cluster(blobs, algorithm):
    X = blobs[0]
    C0 = np.vstack([X[:3], X[:3]])  # every centre twice: three clusters start empty
    km = KMeans(6, init=C0, n_init=1, algorithm=algorithm).fit(X)
    assert np.bincount(km.labels_, minlength=6).min() >= 1
    assert km.history_[0]["relocated"] == 3


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_fewer_distinct_points_than_clusters(container):
    X = CONTAINERS[container](np.repeat(np.array([[0.0, 1.0], [2.0, 0.0], [5.0, 5.0]]), 4, axis=0))
    with pytest.warns(ConvergenceWarning, match="3 distinct point"):
        km = KMeans(5, random_state=0).fit(X)
    assert km.n_clusters_ == 3
    assert km.cluster_centers_.shape == (3, 2)
    assert km.inertia_ == 0.0
    with pytest.warns(ConvergenceWarning):
        assert KMeans(4, init="random", random_state=0).fit(X).n_clusters_ == 3


def test_tol_wcss_stops_earlier(sparse_text_like):
    strict = KMeans(10, random_state=0, tol=0).fit(sparse_text_like)
    loose = KMeans(10, random_state=0, tol=0, tol_wcss=0.05).fit(sparse_text_like)
    assert loose.n_iter_ < strict.n_iter_


def test_n_init_keeps_best_run(blobs):
    X = blobs[0]
    single = [KMeans(6, init="random", n_init=1, random_state=s).fit(X).inertia_ for s in range(4)]
    best = KMeans(6, init="random", n_init=10, random_state=0).fit(X).inertia_
    assert best <= min(single) + 1e-9 or best <= np.median(single)


def test_sparse_centroid_storage_is_exact(sparse_text_like, monkeypatch):
    from qkm import _config

    X = sparse_text_like
    monkeypatch.setattr(_config, "SPARSE_CENTROID_COST_FACTOR", 1e-9)  # always sparse C^T
    a = KMeans(12, random_state=1).fit(X)
    assert {r["storage"] for r in a.history_} == {"sparse"}
    monkeypatch.setattr(_config, "SPARSE_CENTROID_COST_FACTOR", 1e9)   # always dense C^T
    b = KMeans(12, random_state=1).fit(X)
    assert {r["storage"] for r in b.history_} == {"dense"}
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tolerance_scaling_matches_sklearn_rule(blobs, dtype):
    from qkm.clustering._kmeans import _scaled_tolerance

    X = blobs[0].astype(dtype)
    expected = np.mean(np.var(X.astype(np.float64), axis=0)) * 1e-4
    np.testing.assert_allclose(_scaled_tolerance(X, 1e-4), expected, rtol=1e-10)
    np.testing.assert_allclose(_scaled_tolerance(sp.csr_matrix(X), 1e-4), expected, rtol=1e-5)
    assert _scaled_tolerance(X, 0) == 0.0


def test_unchanged_clusters_keep_bit_identical_means(sparse_text_like):
    # the update skips clusters whose members did not change; recomputing all must agree exactly
    from qkm._data import KMeansData

    data = KMeansData(check_data(sparse_text_like))
    rng = np.random.RandomState(0)
    labels_old = rng.randint(0, 6, size=data.n_samples).astype(np.int32)
    C = np.zeros((6, data.n_features))
    C, _, _, _ = data.update(labels_old, C, None)          # C = exact means of labels_old
    labels = labels_old.copy()
    labels[np.flatnonzero(labels_old == 0)[:3]] = 1          # three points move from cluster 0 to 1
    partial, shift_sq, _, _ = data.update(labels, C.copy(), None, labels_old)
    full, _, _, _ = data.update(labels, C.copy(), None)
    np.testing.assert_array_equal(partial, full)
    assert shift_sq[0] > 0 and shift_sq[1] > 0 and not shift_sq[2:].any()


def test_storage_chooser_follows_measured_time():
    from qkm._data import StorageChooser

    chooser = StorageChooser(explore=2.0)
    # nothing measured: the prior cost factor decides (dense here: 100 < 50 * factor)
    assert chooser.choose(dense_work=100, sparse_work=50) == "dense"
    chooser.record("dense", 100, 1.0)
    # sparse predicted at most 2x slower and never timed: try it once
    assert chooser.choose(dense_work=100, sparse_work=50) == "sparse"
    chooser.record("sparse", 50, 0.2)  # measured: sparse is 2.5x cheaper per unit than assumed
    assert chooser.choose(dense_work=100, sparse_work=50) == "sparse"
    assert chooser.choose(dense_work=100, sparse_work=300) == "dense"


def test_history_says_which_storage_ran(sparse_text_like):
    km = KMeans(10, random_state=0, algorithm="lloyd").fit(sparse_text_like)
    assert all(r["storage"] in ("dense", "sparse") for r in km.history_)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "X, match",
    [
        (np.array([[np.nan, 1.0], [0.0, 1.0]]), "1 NaN"),
        (np.array([[np.inf, 1.0], [0.0, 1.0]]), "1 infinite"),
        (np.zeros((0, 3)), "0 sample"),
        (np.zeros((3, 0)), "0 feature"),
        (np.array([1.0, 2.0, 3.0]), "must be 2-D"),
        (sp.csr_matrix(np.array([[np.nan, 0.0], [0.0, 1.0]])), "1 NaN"),
    ],
)
def test_bad_training_data(X, match):
    with pytest.raises(ValueError, match=match):
        KMeans(2).fit(X)


def test_out_of_range_sparse_indices():
    X = sp.csr_matrix((np.array([1.0, 2.0]), np.array([0, 7]), np.array([0, 1, 2])), shape=(2, 3), copy=False)
    with pytest.raises(ValueError, match=r"indices span \[0, 7\] but the matrix has 3 columns"):
        KMeans(1).fit(X)


def test_wrong_feature_count_on_predict(blobs):
    km = KMeans(3, random_state=0).fit(blobs[0])
    with pytest.raises(ValueError, match="X has 5 features, but KMeans is expecting 12 features"):
        km.predict(np.zeros((2, 5)))
    with pytest.raises(ValueError, match="X has 5 features"):
        km.transform(sp.csr_matrix(np.zeros((2, 5))))


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_clusters": 0}, "n_clusters=0 must be >= 1"),
        ({"n_clusters": -3}, "n_clusters=-3 must be >= 1"),
        ({"algorithm": "full"}, "algorithm must be one of"),
        ({"init": "kmeans"}, "init must be"),
        ({"max_iter": 0}, "max_iter must be"),
        ({"tol": -1.0}, "tol must be"),
        ({"n_init": 0}, "n_init must be"),
        ({"init": np.zeros((2, 12))}, r"init array has shape \(2, 12\), expected .* \(3, 12\)"),
    ],
)
def test_bad_parameters(blobs, params, match):
    params = {"n_clusters": 3, **params}
    with pytest.raises(ValueError, match=match):
        KMeans(**params).fit(blobs[0])


def test_no_warning_on_normal_fit(blobs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KMeans(4, random_state=0).fit(blobs[0])


@pytest.mark.parametrize("make", [lambda: KMeans(6, random_state=0),
                                  lambda: qkm.QKMeans(6, sparsity_level=2, max_iter=5, random_state=0),
                                  lambda: qkm.QKMeans(40, sparsity_level=2, max_iter=3, random_state=0)])
def test_small_batch_predict_path_equals_assign_and_checks_its_input(make):
    """predict on a few C-contiguous rows skips the data view: the same labels as assign, the same errors."""
    rng = np.random.RandomState(0)
    X = rng.rand(300, 7)
    est = make().fit(X)
    op = est.operator_
    for rows in (X[:1], X[5:9], X[:16], X[:17]):
        rows = np.ascontiguousarray(rows)
        np.testing.assert_array_equal(est.predict(rows), op.assign(rows)[0])
        np.testing.assert_array_equal(est.predict(rows), naive.assign(rows, est.cluster_centers_)[0])
    assert op.labels_small(np.ascontiguousarray(X[:17])) is None                   # past the small-batch size
    assert op.labels_small(np.asfortranarray(X[:4])) is None                       # not C-contiguous
    assert op.labels_small(X[:4].astype(np.float32)) is None                       # another dtype
    bad = X[:2].copy()
    bad[1, 3] = np.nan
    assert op.labels_small(bad) is None
    with pytest.raises(ValueError, match="NaN"):
        est.predict(bad)
    huge = X[:1] * 1e200
    with pytest.raises(ValueError, match="overflow"):
        est.predict(huge)
    with pytest.raises(ValueError):
        est.predict(X[:2, :5])
