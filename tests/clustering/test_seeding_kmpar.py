"""k-means|| arithmetic paths (qkm.clustering._seeding_kmpar): the hybrid block product and the Gram-matrix
recluster against naive numpy, the explicit paths and scikit-learn."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SKKMeans

import naive
from qkm import _config
from qkm._data import KMeansData
from qkm._validation import check_data
from qkm.clustering._init import greedy_kmeanspp as kmeans_plusplus
from qkm.clustering._seeding_kernels import CenterBlock
from qkm.clustering._seeding_kmpar import KMParChunk, block_dots, chunk_lower, recluster


def _zipf_text(n=240, d=400, seed=0, dtype=np.float64):
    """Text-like rows: term t in a row with probability ~ 1 / (t + 1), so a few terms are in most rows (the BLAS
    part of the block product) and most are rare (the term-major part); L2 normalised, no empty row."""
    rng = np.random.RandomState(seed)
    p = np.minimum(0.9, 3.0 / (np.arange(d) + 1.0) ** 0.9)
    mask = rng.uniform(size=(n, d)) < p
    mask[np.arange(n), rng.randint(d, size=n)] = True
    X = sp.csr_matrix(np.where(mask, rng.exponential(size=(n, d)), 0.0))
    X = sp.diags(1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())) @ X
    return check_data(sp.csr_matrix(X, dtype=dtype))


@pytest.mark.parametrize("fraction", [0.0, 0.1, 2.0])  # every term through BLAS / both parts / none
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_block_dots_is_the_naive_product_and_per_row(monkeypatch, fraction, dtype):
    monkeypatch.setattr(_config, "SEEDING_DENSE_TERM_FRACTION", fraction)
    X = _zipf_text(dtype=dtype)
    C = X[np.random.RandomState(1).choice(X.shape[0], 30, replace=False)]
    block = CenterBlock(C, 0)
    assert (block.dense_terms.size > 0) == (fraction < 1) and (block.r_val.size > 0) == (fraction > 0)
    GT = block_dots(X, 0, X.shape[0], block)
    np.testing.assert_allclose(GT, naive.dense(C).astype(np.float64) @ naive.dense(X).astype(np.float64).T,
                               rtol=1e-12, atol=1e-12)
    # a row's dots do not depend on the row block it is computed in (chunked k-means|| == whole)
    for a, b in ((0, 7), (7, 100), (100, X.shape[0])):
        np.testing.assert_array_equal(block_dots(X, a, b, block), GT[:, a:b])


def test_chunk_lower_row_blocks_give_the_whole_pass(monkeypatch):
    X = _zipf_text(n=3 * _config.CHUNK_SIZE + 5)
    block = CenterBlock(X[10:40], 0)
    whole = KMParChunk(KMeansData(X))
    cost = chunk_lower(whole, block)
    monkeypatch.setattr(_config, "SEEDING_DOTS_BLOCK", 1)  # CHUNK_SIZE rows per pass: 4 passes
    split = KMParChunk(KMeansData(X))
    assert chunk_lower(split, block) == cost
    np.testing.assert_array_equal(split.nearest, whole.nearest)
    labels, d = naive.assign(naive.dense(X), naive.dense(X[10:40]))
    np.testing.assert_allclose(whole.closest, d, rtol=1e-9, atol=1e-12)


def test_kmeans_plusplus_from_a_gram_matrix_draws_the_same_rows():
    X = _zipf_text()
    data = KMeansData(X)
    w = np.random.RandomState(2).randint(1, 5, size=X.shape[0]).astype(np.float64)
    gram = block_dots(X, 0, X.shape[0], CenterBlock(X, 0))
    a, pa = kmeans_plusplus(data, 9, np.random.RandomState(3), sample_weight=w, rows_only=True)
    b, pb = kmeans_plusplus(data, 9, np.random.RandomState(3), sample_weight=w, rows_only=True, dots=gram.__getitem__)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(pa, pb, rtol=1e-12)
    np.testing.assert_allclose(pb, (w * naive.assign(naive.dense(X), naive.dense(X[a]))[1]).sum(), rtol=1e-9)


def test_recluster_through_the_gram_matrix_equals_explicit_centres_and_sklearn(monkeypatch):
    X = _zipf_text(n=300)
    w = np.random.RandomState(1).randint(1, 9, size=X.shape[0]).astype(np.float64)
    K = 7
    seeds = recluster(X, w, K, np.random.RandomState(2), lloyd_iter=0, sparse_centers=True)
    ours = recluster(X, w, K, np.random.RandomState(2), lloyd_iter=50, sparse_centers=True)
    assert sp.issparse(ours)
    monkeypatch.setattr(_config, "SEEDING_GRAM_MAX_BYTES", 0)  # the explicit path: CSC k-means++, CSR centres
    np.testing.assert_array_equal(recluster(X, w, K, np.random.RandomState(2), lloyd_iter=0), seeds.toarray())
    explicit = recluster(X, w, K, np.random.RandomState(2), lloyd_iter=50)
    np.testing.assert_allclose(ours.toarray(), explicit, rtol=1e-10, atol=1e-12)
    ref = SKKMeans(K, init=seeds.toarray(), n_init=1, max_iter=50, tol=0, algorithm="lloyd").fit(
        X.toarray(), sample_weight=w)
    np.testing.assert_allclose(ours.toarray(), ref.cluster_centers_, rtol=1e-10, atol=1e-10)
    assert not np.allclose(ours.toarray(), seeds.toarray())  # Lloyd moved the centres
