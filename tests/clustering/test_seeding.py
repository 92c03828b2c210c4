"""The seedings (qkm.clustering._seeding): D^2-seeding, k-means||, sampled k-means++, parallel runs."""

import numba
import numpy as np
import pytest
from sklearn.cluster import KMeans as SKKMeans
from sklearn.exceptions import ConvergenceWarning

import naive
from conftest import CONTAINERS
from qkm import KMeans, LowRankKMeans, QKMeans, seed_centers
from qkm._data import KMeansData
from qkm.clustering._seeding_kmpar import KMParChunk, kmeans_parallel
from qkm.clustering._seeding import Seeding, d2_seeding, geometric_sample, run_seeding
from qkm._validation import check_data

SEEDINGS = ["k-means++", "d2-seeding", "k-means||", "random"]
two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba allows one thread only")


def _data(blobs, sparse_text_like, container, dtype):
    X = blobs[0] if container == "dense" else sparse_text_like
    return CONTAINERS[container](X.astype(dtype)) if container == "dense" else X.astype(dtype)


def _distinct(C):
    return np.unique(C, axis=0).shape[0]


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("init", SEEDINGS)
def test_seeding_gives_distinct_centres_and_its_true_potential(blobs, sparse_text_like, container, dtype, init):
    X = _data(blobs, sparse_text_like, container, dtype)
    K = 9
    centers, cost = seed_centers(X, K, init=init, random_state=3)
    assert centers.shape == (K, X.shape[1]) and centers.dtype == dtype
    assert _distinct(centers) == K
    # float32 data: distances of the dot-product kernels carry float32 rounding
    np.testing.assert_allclose(cost, naive.potential(X, centers), rtol=1e-9 if dtype == np.float64 else 2e-4)
    if init in ("k-means++", "random"):  # these pick rows of X
        rows = naive.dense(X)
        assert all((rows == c).all(axis=1).any() for c in centers)


@pytest.mark.parametrize("init", ["k-means++", "d2-seeding", "k-means||"])
def test_sampled_seeding_runs_on_about_k_samp_rows(blobs, init):
    X = np.vstack([blobs[0]] * 5)  # 3000 rows
    K, samp = 6, 20
    km = KMeans(K, init=init, init_sample=samp, random_state=0, max_iter=3).fit(X)
    first = km.history_[0]
    assert 0.5 * K * samp < first["seeding_rows"] < 1.5 * K * samp
    seeds = run_seeding(Seeding(init, init_sample=samp), KMeansData(check_data(X)), K, np.random.RandomState(0))
    np.testing.assert_allclose(seeds.cost, naive.potential(X, seeds.centers), rtol=1e-9)
    assert first["seeding_cost"] == seeds.cost
    full = KMeans(K, init=init, random_state=0, max_iter=3).fit(X).history_[0]
    assert full["seeding_rows"] == X.shape[0]


def test_geometric_skips_sample_like_independent_coins():
    sizes = [geometric_sample(1000, 50, np.random.RandomState(s)) for s in range(300)]
    coins = [naive.bernoulli_rows(1000, 0.05, np.random.RandomState(s)) for s in range(300)]
    for rows in sizes[:20]:
        assert np.all(np.diff(rows) > 0) and rows[0] >= 0 and rows[-1] < 1000
    # same mean size (50) and spread (sqrt(n p (1 - p)) = 6.9) as one coin per row
    for draws in (sizes, coins):
        counts = np.array([len(r) for r in draws])
        assert abs(counts.mean() - 50) < 3 * 6.9 / np.sqrt(len(counts))
        assert 5 < counts.std() < 9
    # every row equally likely
    hits = np.bincount(np.concatenate(sizes), minlength=1000)
    assert abs(hits[:500].sum() - hits[500:].sum()) < 4 * np.sqrt(hits.sum())
    np.testing.assert_array_equal(geometric_sample(10, 20, np.random.RandomState(0)), np.arange(10))


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
@pytest.mark.parametrize("init", ["d2-seeding", "k-means||"])
def test_seeded_fit_matches_sklearn_from_the_same_centres(blobs, sparse_text_like, container, init):
    X = blobs[0] if container == "dense" else sparse_text_like
    K = 6
    centers, cost = seed_centers(X, K, init=init, random_state=5)
    km = KMeans(K, init=init, random_state=5).fit(X)  # one run: the same draws as seed_centers
    ref = SKKMeans(K, init=centers, n_init=1).fit(X)
    np.testing.assert_array_equal(km.labels_, ref.labels_)
    np.testing.assert_allclose(km.inertia_, naive.potential(X, ref.cluster_centers_), rtol=1e-6)
    assert km.history_[0]["seeding"] == init and km.history_[0]["seeding_cost"] == cost
    assert km.history_[0]["seeding_seconds"] >= 0


@pytest.mark.parametrize("init", SEEDINGS)
@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
def test_fewer_distinct_points_than_clusters(container, init):
    X = CONTAINERS[container](np.repeat(np.array([[0.0, 1.0], [2.0, 0.0], [5.0, 5.0]]), 40, axis=0))
    for samp in (None, 1):
        with pytest.warns(ConvergenceWarning, match="3 distinct point"):
            km = KMeans(5, init=init, init_sample=samp, random_state=0).fit(X)
        assert km.n_clusters_ == 3 and km.inertia_ == 0.0 and km.history_[0]["seeding_cost"] == 0.0
    with pytest.raises(ValueError, match="fewer than n_clusters=5 distinct"):
        seed_centers(X, 5, init=init)


@two_threads
@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
@pytest.mark.parametrize("init", SEEDINGS)
def test_same_seeds_for_1_and_2_threads(blobs, sparse_text_like, container, init):
    X = _data(blobs, sparse_text_like, container, np.float64)
    a = seed_centers(X, 12, init=init, random_state=1, n_jobs=1)
    b = seed_centers(X, 12, init=init, random_state=1, n_jobs=2)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]


@two_threads
@pytest.mark.parametrize("init", ["random", "d2-seeding", "k-means||"])
def test_parallel_runs_same_for_1_and_2_threads_and_keep_the_best(blobs, init):
    X = blobs[0]
    fits = [KMeans(6, init=init, n_init=4, random_state=7, n_jobs=n).fit(X) for n in (1, 2)]
    np.testing.assert_array_equal(fits[0].labels_, fits[1].labels_)
    np.testing.assert_array_equal(fits[0].cluster_centers_, fits[1].cluster_centers_)
    untimed = [[{k: v for k, v in r.items() if not k.endswith("seconds")} for r in f.history_] for f in fits]
    assert untimed[0] == untimed[1]
    # run i draws from RandomState(seed_i), seed_i from the estimator's random_state
    run_seeds = np.random.RandomState(7).randint(2**31 - 1, size=4)
    singles = [KMeans(6, init=init, n_init=1, random_state=np.random.RandomState(s)).fit(X).inertia_
               for s in run_seeds]
    assert fits[1].inertia_ == min(singles)


def test_a_run_with_empty_clusters_is_repaired(blobs, monkeypatch):
    import qkm.clustering._kmeans as K_

    real = K_.initial_centers

    def duplicated(*args):
        seeds = real(*args)
        seeds.centers[1] = seeds.centers[0]  # cluster 1 starts empty
        return seeds

    monkeypatch.setattr(K_, "initial_centers", duplicated)
    km = KMeans(5, init="d2-seeding", n_init=3, random_state=0, n_jobs=2).fit(blobs[0])
    assert np.bincount(km.labels_, minlength=5).min() >= 1
    assert km.history_[0]["relocated"] == 1


@pytest.mark.parametrize("estimator", [QKMeans(4, sparsity_level=2, max_iter=5, palm_max_iter=10),
                                       LowRankKMeans(4, rank=2, max_iter=5)])
@pytest.mark.parametrize("init", ["d2-seeding", "k-means||"])
def test_factored_estimators_take_the_seedings(blobs, estimator, init):
    est = estimator.set_params(init=init, init_sample=30, random_state=0).fit(blobs[0])
    first = est.history_[0]
    assert first["seeding"] == init and first["seeding_rows"] < blobs[0].shape[0]
    assert first["seeding_cost"] > 0 and np.isfinite(est.inertia_)


@pytest.mark.parametrize("params, match", [
    (dict(init="kmeans||"), "init must be one of"),
    (dict(init="d2-seeding", d2_samples=0), "d2_samples must be None or an integer >= 1"),
    (dict(init="k-means||", oversampling_factor=0), "oversampling_factor must be a float > 0"),
    (dict(init="k-means||", init_rounds=0), "init_rounds must be an integer >= 1"),
    (dict(init_sample=-1.0), "init_sample must be None or a float > 0"),
    (dict(init_sample=float("nan")), "init_sample must be None or a float > 0"),
])
def test_bad_seeding_parameters(blobs, params, match):
    for est in (KMeans(3, **params), QKMeans(3, **params), LowRankKMeans(3, **params)):
        with pytest.raises(ValueError, match=match):
            est.fit(blobs[0])


def _one_d_example(k):
    """The supplement's example: 2^k points at 0, 10 k points at each of 1, k, k^2, ..., k^(k-2).

    The points of a location are spread by a jitter of 1e-3 so that the data
    hold more than k distinct points: qkm's k-means|| keeps drawing rounds
    until it has k distinct candidates, which on exactly co-located points
    would be every location.
    """
    locations = np.array([0.0] + [float(k) ** j for j in range(k - 1)])
    counts = [2 ** k] + [10 * k] * (k - 1)
    X = np.repeat(locations, counts) + 1e-3 * np.random.RandomState(0).uniform(-1, 1, size=sum(counts))
    return X[:, None], locations


def _locations_found(centers, locations):
    gap = np.abs(centers[:, 0][:, None] - locations[None, :])
    return set(np.argmin(gap, axis=1)[gap.min(axis=1) < 0.01].tolist())


def test_one_d_example_k_means_parallel_misses_locations_the_others_find():
    k = 10
    X, locations = _one_d_example(k)
    for seed in range(3):
        plain = run_seeding(Seeding("k-means++", n_local_trials=1), KMeansData(X), k, np.random.RandomState(seed))
        for centers in [seed_centers(X, k, init=init, random_state=seed)[0] for init in ("k-means++", "d2-seeding")] \
                + [plain.centers]:
            assert _locations_found(centers, locations) == set(range(k))
        centers, cost = seed_centers(X, k, init="k-means||", oversampling_factor=2.0, init_rounds=5,
                                     random_state=seed)
        assert len(_locations_found(centers, locations)) < k
        assert cost > 1e6 * naive.potential(X, locations[:, None])


def test_k_means_parallel_does_not_depend_on_the_chunking():
    # integer data: every cost sum is exact, so the chunked and whole runs see the same numbers
    rng = np.random.RandomState(0)
    X = check_data(rng.randint(0, 20, size=(500, 4)).astype(np.float64))
    whole = kmeans_parallel([KMParChunk(KMeansData(X))], 8, np.random.RandomState(1))
    chunks = [KMParChunk(KMeansData(X[a:b]), a) for a, b in ((0, 170), (170, 171), (171, 500))]
    split = kmeans_parallel(chunks, 8, np.random.RandomState(1))
    np.testing.assert_array_equal(whole, split)
    # the driver touches the chunks only through map_chunks: here run last chunk first, results in chunk order
    calls = []

    def reversed_map(fn, chunk_list, *args):
        calls.append(fn.__name__)
        return [fn(c, *args) for c in chunk_list[::-1]][::-1]

    chunks = [KMParChunk(KMeansData(X[a:b]), a) for a, b in ((0, 170), (170, 171), (171, 500))]
    np.testing.assert_array_equal(kmeans_parallel(chunks, 8, np.random.RandomState(1), map_chunks=reversed_map),
                                  whole)
    assert set(calls) == {"chunk_rows", "chunk_lower", "chunk_sample", "chunk_counts"}


def test_d2_sample_clusterings_all_give_k_distinct_centres(blobs):
    data = KMeansData(check_data(blobs[0]))
    for groups in ("flat", "tree", "few", "k"):
        centers, cost = d2_seeding(data, 12, np.random.RandomState(0), None, groups)
        assert _distinct(centers) == 12
        np.testing.assert_allclose(cost, naive.potential(blobs[0], centers), rtol=1e-9)


def test_cli_train_seedings_and_verbose_seeding_line(tmp_path, blobs, capsys):
    from qkm.cli import main

    np.save(tmp_path / "X.npy", blobs[0])
    X, model = str(tmp_path / "X.npy"), str(tmp_path / "m.qkm")
    assert main(["train", X, "-k", "4", "--init", "d2-seeding", "--d2-samples", "30", "--seed", "0", "-v",
                 "-o", model]) == 0
    err = capsys.readouterr().err
    km = KMeans(4, init="d2-seeding", d2_samples=30, random_state=0).fit(blobs[0])
    assert f"seeding: d2-seeding cost={km.history_[0]['seeding_cost']:.10g} " in err
    assert "seeding_cost=" in err  # the first iteration's record carries it too
    args = ["train", X, "-k", "4", "--init", "k-means||", "--oversampling-factor", "1.5", "--init-rounds", "3",
            "--init-sample", "20", "--seed", "0", "-q", "--algorithm", "lowrank", "--rank", "2", "-o", model]
    assert main(args) == 0
    assert main(["train", X, "-k", "4", "--init", "k-means||", "--init-rounds", "0", "-q", "-o", model]) == 2
    assert "init_rounds must be an integer >= 1" in capsys.readouterr().err


def test_weighted_kmeans_plusplus_equals_repeated_rows():
    # integer data and weights: every potential is exact, so a row of weight w draws like w copies of it
    from qkm.clustering._init import greedy_kmeanspp as kmeans_plusplus

    rng = np.random.RandomState(0)
    U = rng.randint(0, 30, size=(40, 3)).astype(np.float64)
    U = U[np.unique(U, axis=0, return_index=True)[1]]
    w = rng.randint(1, 5, size=U.shape[0])
    expanded = np.repeat(np.arange(U.shape[0]), w)
    for trials in (1, 3):
        idx_w, pot_w = kmeans_plusplus(KMeansData(U), 6, np.random.RandomState(2), trials, sample_weight=w,
                                       rows_only=True)
        idx_r, pot_r = kmeans_plusplus(KMeansData(U[expanded]), 6, np.random.RandomState(2), trials, rows_only=True)
        np.testing.assert_array_equal(idx_w, expanded[idx_r])
        assert pot_w == pot_r == naive.potential(U[expanded], U[idx_w])
