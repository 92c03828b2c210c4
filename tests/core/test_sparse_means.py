"""QK-means on wide sparse data keeps the cluster means as CSR: no dense K x D buffer in the Lloyd loop.

Oracles: the dense update (:meth:`KMeansData.update`, same bits), a dense
hard-thresholding step (``tests/naive.py``), and the memory the loop allocates
(tracemalloc, numba's allocations included), which must stay below one
``K x D`` float64 buffer where the dense means took about four.
"""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import naive
from qkm import QKMeans, _config
from qkm._data import KMeansData
from qkm.factorization._lsq_sparse import gradient_step_support


def _docs(n, d, w, topics, seed=0, dtype=np.float64):
    """``n`` documents of ``w`` words, each from its topic's share of the ``d`` words."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), w)
    cols = rng.integers(0, d // topics, size=n * w) + (rows % topics) * (d // topics)
    X = sp.csr_matrix((rng.random(n * w) + 0.2, (rows, cols)), shape=(n, d), dtype=dtype)
    X.sum_duplicates()
    return X


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("repair", [True, False])
def test_csr_update_equals_dense_update(dtype, repair):
    """Means, counts and the empty-cluster repair as CSR: the same bits as the dense update."""
    X = _docs(80, 3000, 12, 4, dtype=dtype)
    data = KMeansData(X)
    rng = np.random.RandomState(0)
    k = 7
    labels = rng.randint(0, 5, size=80).astype(np.int32)          # clusters 5 and 6 empty
    labels[:3] = 2                                                 # a donor of size >= 2
    sq = rng.random_sample(80)
    prev = (rng.random_sample((k, 3000)) * (rng.random_sample((k, 3000)) < 0.01)).astype(dtype)
    counts_d, counts_s = np.zeros(k, np.int64), np.zeros(k, np.int64)
    C_d, _, _, rel_d = data.update(labels, prev.copy(), lambda: sq, counts=counts_d, repair=repair)
    C_s, rel_s = data.update_csr(labels, sp.csr_matrix(prev, dtype=np.float64), lambda: sq, counts=counts_s,
                                 repair=repair)
    assert sp.isspmatrix_csr(C_s) and C_s.dtype == np.float64 and C_s.has_sorted_indices
    assert rel_s == rel_d == (2 if repair else 0)
    np.testing.assert_array_equal(counts_s, counts_d)
    np.testing.assert_array_equal(C_s.toarray(), C_d.astype(np.float64))


def test_streamed_gradient_support_equals_dense_threshold():
    """The last factor's support without an A x D buffer: the k largest |X0 - grad / c| (ties included)."""
    rng = np.random.default_rng(1)
    for trial in range(12):
        D, K = int(rng.integers(20, 200)), int(rng.integers(2, 10))
        WTt = sp.random(D, K, density=0.2, random_state=trial, format="csr")
        L = rng.standard_normal((K, K))
        if trial % 2:                                  # many ties
            WTt.data = np.round(WTt.data * 2) / 2
            L = np.round(L)
        X0 = sp.random(D, K, density=0.05, random_state=trial + 50, format="csr")
        G = L.T @ L
        inv_c = 1.0 / (1.001 * np.linalg.norm(G, 2))
        Z = np.abs(X0.toarray() - ((X0.toarray() @ G) - WTt @ L) * inv_c)
        k = int(rng.integers(1, 3 * D))
        ptr, rows = np.empty(D + 1, np.int64), np.empty(k, np.int64)
        n = gradient_step_support(WTt.indptr, WTt.indices, WTt.data, L, X0.indptr, X0.indices, X0.data, G, inv_c,
                                  k, k + K, ptr, rows)
        ref_ptr, ref_rows = naive.hard_threshold_support(Z, k)
        if trial % 2 == 0:                             # no exact ties: the reference's rounding cannot matter
            np.testing.assert_array_equal(ptr, ref_ptr)
            np.testing.assert_array_equal(rows[:n], ref_rows)
        else:                                          # ties: the same count, above-threshold entries all in
            assert n == ref_rows.size


def _given(k, d, dtype, order):
    """A user's init array: dense, mostly zeros (as tf-idf seeds are), of its own dtype and memory order."""
    rng = np.random.default_rng(5)
    C = np.zeros((k, d), dtype=dtype, order=order)
    for j in range(k):
        C[j, rng.choice(d, 150, replace=False)] = rng.random(150) + 0.2
    return C


_SEEDINGS = {"k-means++": {}, "d2-seeding": dict(init="d2-seeding", d2_samples=200),
             "k-means||": dict(init="k-means||"), "random": dict(init="random"), "init_sample": dict(init_sample=2.0)}


@pytest.mark.parametrize("seeding", [pytest.param(s, marks=pytest.mark.slow) if s == "d2-seeding" else s
                                     for s in _SEEDINGS] + ["array float64", "array float32 (F order)",
                                                            "default chain"])
def test_wide_csr_fit_holds_no_dense_k_by_d_buffer(monkeypatch, seeding):
    """The whole fit (validation, seeds, assignments, CSR means, sparse sweeps, guard, polish) below one K x D
    float64 buffer, for every seeding and for a given init array; ``cluster_centers_`` is folded on first
    access only.

    The dense means (the code before) peaked at about 5 K x D here; the bound scales with nnz(X), s D, n A and
    A^2, never with K D. The chain is never folded (FOLD_MAX_BYTES 0), as on real wide data. A given array
    (allocated before the trace: the user's own) is read into CSR without a dense copy, even when its dtype
    or memory order is not the data's. The default chain (2 factors, the paper chain's values) as well.
    """
    monkeypatch.setattr(_config, "FOLD_MAX_BYTES", 0)
    n, d, k = 300, 16384, 96
    X = _docs(n, d, 150, 8)                                 # every word used: the full-width sweeps run
    kw = dict(n_factors=3, sparsity_level=2, max_iter=3, tol=0.0, palm_max_iter=2, random_state=0)
    if seeding.startswith("array"):
        kw["init"] = _given(k, d, *((np.float64, "C") if seeding == "array float64" else (np.float32, "F")))
    elif seeding == "default chain":                        # 2 factors holding the paper chain's values
        del kw["n_factors"]
    else:
        kw.update(_SEEDINGS[seeding])
    QKMeans(k, **kw).fit(X)                                 # compiled / cached kernels loaded outside the trace
    tracemalloc.start()
    try:
        est = QKMeans(k, **kw).fit(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ran = [r for r in est.history_ if r["step"] in ("refit", "polish")]
    assert ran and all((r["means"], r["target"], r["columns"]) == ("csr", "sparse", "dense") for r in ran)
    assert any(r["kept"] for r in ran) and est.n_iter_ == (3 if seeding == "k-means++" else est.n_iter_) >= 2
    assert peak < k * d * 8, f"the fit allocated {peak / 1e6:.1f} MB, a K x D buffer is {k * d * 8 / 1e6:.1f} MB"
    centers = est.cluster_centers_                          # folded now, and the same as the chain's product
    np.testing.assert_allclose(centers, naive.chain_product([f.toarray() for f in est.factors_]), rtol=1e-12,
                               atol=1e-15)


def test_csr_fit_with_an_empty_cluster_equals_dense_fit():
    """A seed far from every document empties its cluster: the CSR repair gives the dense fit's result."""
    X = _docs(120, 3000, 10, 4, seed=3)
    seeds = X[[0, 1, 2, 3]].toarray()
    seeds = np.vstack([seeds, np.full((1, 3000), 5.0)])     # no document comes near it
    kw = dict(n_clusters=5, n_factors=3, sparsity_level=2, max_iter=6, palm_max_iter=10, init=seeds)
    a = QKMeans(**kw).fit(X)
    b = QKMeans(**kw).fit(X.toarray())
    assert any(r.get("relocated") for r in a.history_)
    assert {r["means"] for r in a.history_ if "means" in r} == {"csr"}
    assert {r["means"] for r in b.history_ if "means" in r} == {"dense"}
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-10)
    np.testing.assert_allclose(a.objective_history_, b.objective_history_, rtol=1e-10)


@pytest.mark.parametrize("seeding", list(_SEEDINGS))
def test_csr_seeds_equal_dense_seeds(seeding):
    """Every seeding gives CSR centres of the same values (and cost to 1e-12) as its dense centres."""
    from qkm.clustering._seeding import Seeding, run_seeding

    data = KMeansData(_docs(200, 4000, 20, 5, seed=2, dtype=np.float32))
    request = Seeding(**_SEEDINGS[seeding])
    a = run_seeding(request, data, 9, np.random.RandomState(4), sparse_centers=True)
    b = run_seeding(request, data, 9, np.random.RandomState(4))
    assert sp.isspmatrix_csr(a.centers) and a.centers.dtype == np.float32 and isinstance(b.centers, np.ndarray)
    np.testing.assert_array_equal(a.centers.toarray(), b.centers)
    assert a.cost == pytest.approx(b.cost, rel=1e-12)


def test_given_init_as_csr_equals_dense_and_is_checked():
    """A given array on wide CSR data: the fit equals the densified fit; a NaN in it is refused as before."""
    X = _docs(120, 3000, 10, 4, seed=6)
    init = _given(5, 3000, np.float32, "F")
    kw = dict(n_clusters=5, n_factors=3, sparsity_level=2, max_iter=4, palm_max_iter=10, init=init)
    a = QKMeans(**kw).fit(X)
    b = QKMeans(**kw).fit(X.toarray())
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.objective_history_, b.objective_history_, rtol=1e-10)
    assert a.history_[0]["seeding_cost"] == pytest.approx(b.history_[0]["seeding_cost"], rel=1e-12)
    init[0, 0] = np.nan
    with pytest.raises(ValueError, match="init contains 1 NaN"):
        QKMeans(**kw).fit(X)


@pytest.mark.needs_threads(2)
@pytest.mark.parametrize("seeding", ["d2-seeding", "k-means||", "random"])
def test_wide_csr_fit_same_for_1_and_2_threads(seeding):
    X = _docs(150, 3000, 12, 5, seed=7)
    kw = dict(n_factors=3, sparsity_level=2, max_iter=4, palm_max_iter=5, random_state=2, **_SEEDINGS[seeding])
    a, b = (QKMeans(6, n_jobs=t, **kw).fit(X) for t in (1, 2))
    assert {r["means"] for r in a.history_ if "means" in r} == {"csr"}
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.objective_history_, b.objective_history_)
    assert a.history_[0]["seeding_cost"] == b.history_[0]["seeding_cost"]
