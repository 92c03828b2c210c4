"""Seedings against oracles: sparse == dense, reproducible from random_state, the k-means|| pieces against brute
force and scikit-learn, D^2 weights against a naive recomputation."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SKKMeans

import naive
from qkm import seed_centers
from qkm._data import KMeansData
from qkm.clustering._seeding_kmpar import KMParChunk, chunk_counts, chunk_lower, recluster
from qkm.clustering._seeding import Seeding, d2_seeding, run_seeding
from qkm.clustering._seeding_kernels import CenterBlock
from qkm._validation import check_data

SEEDINGS = ["k-means++", "d2-seeding", "k-means||", "random"]


def _integer_sparse(n=300, d=40, seed=0):
    """Sparse non-negative integer rows: every squared distance is exact in float64 on both paths."""
    rng = np.random.RandomState(seed)
    X = sp.random(n, d, density=0.15, random_state=rng, format="csr")
    X.data = rng.randint(1, 6, size=X.nnz).astype(np.float64)
    return X


@pytest.mark.parametrize("samp", [None, 10])
@pytest.mark.parametrize("init", SEEDINGS)
def test_sparse_and_dense_give_the_same_seeds(init, samp):
    X = _integer_sparse()
    kw = dict(init=init, init_sample=samp, random_state=4)
    if init == "d2-seeding":
        kw["d2_samples"] = 40
    Cs, cost_s = seed_centers(X, 7, **kw)
    Cd, cost_d = seed_centers(X.toarray(), 7, **kw)
    # exact distances give the same draws; D^2 / k-means|| means differ in their last bits only
    np.testing.assert_allclose(Cs, Cd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cost_s, cost_d, rtol=1e-12)


@pytest.mark.parametrize("init", SEEDINGS)
def test_seeds_reproducible_from_random_state(blobs, sparse_text_like, init):
    for X in (blobs[0], sparse_text_like):
        a = seed_centers(X, 8, init=init, random_state=11)
        b = seed_centers(X, 8, init=init, random_state=np.random.RandomState(11))
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1] == b[1]
        c = seed_centers(X, 8, init=init, random_state=12)
        assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("container", ["dense", "csr"])
def test_chunk_lower_keeps_the_brute_force_nearest_candidate(blobs, sparse_text_like, container):
    X = check_data(blobs[0] if container == "dense" else sparse_text_like)
    Xd = naive.dense(X)
    rng = np.random.RandomState(0)
    chunk = KMParChunk(KMeansData(X))
    blocks = [rng.choice(X.shape[0], size=s, replace=False) for s in (1, 5, 12)]
    n_cand, seen = 0, []
    for rows in blocks:  # each call sees only the new block, as in a k-means|| round
        cost = chunk_lower(chunk, CenterBlock(X[rows], n_cand))
        n_cand += rows.shape[0]
        seen.extend(rows.tolist())
        all_d = naive.sq_distances(Xd, Xd[seen])
        labels, d = naive.assign(Xd, Xd[seen])
        np.testing.assert_allclose(chunk.closest, d, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cost, d.sum(), rtol=1e-9)
        # the nearest candidate where it is clearly nearest (sparse rows sharing no term with two candidates
        # tie up to rounding)
        second = np.sort(all_d, axis=1)[:, 1] if len(seen) > 1 else np.full(len(d), np.inf)
        clear = second - d > 1e-9
        assert clear.mean() > 0.5
        np.testing.assert_array_equal(chunk.nearest[clear], labels[clear])
    np.testing.assert_array_equal(chunk_counts(chunk, n_cand), np.bincount(chunk.nearest, minlength=n_cand))


def test_recluster_lloyd_matches_sklearn_weighted_lloyd(blobs):
    X = blobs[0][::3]
    w = np.random.RandomState(1).randint(1, 9, size=X.shape[0]).astype(np.float64)
    K = 6
    seeds = recluster(X, w, K, np.random.RandomState(2), lloyd_iter=0)  # the weighted k-means++ seeds
    ours = recluster(X, w, K, np.random.RandomState(2), lloyd_iter=50)
    ref = SKKMeans(K, init=seeds, n_init=1, max_iter=50, tol=0, algorithm="lloyd").fit(X, sample_weight=w)
    np.testing.assert_allclose(ours, ref.cluster_centers_, rtol=1e-10, atol=1e-10)


def test_d2_seeding_potential_is_the_naive_one_for_every_prefix(blobs):
    X = check_data(blobs[0])
    centers, cost = d2_seeding(KMeansData(X), 10, np.random.RandomState(3), 50)
    np.testing.assert_allclose(cost, naive.potential(X, centers), rtol=1e-9)
    # every step lowered the potential (a centre that helps no point is never kept)
    pots = [naive.potential(X, centers[:j]) for j in range(1, 11)]
    assert all(a > b for a, b in zip(pots, pots[1:]))


def test_sampled_seeding_cost_is_measured_on_all_rows(blobs):
    X = check_data(np.vstack([blobs[0]] * 4))
    seeds = run_seeding(Seeding("d2-seeding", init_sample=15), KMeansData(X), 5, np.random.RandomState(0))
    assert seeds.n_seeded_rows < X.shape[0]
    np.testing.assert_allclose(seeds.cost, naive.potential(X, seeds.centers), rtol=1e-9)
