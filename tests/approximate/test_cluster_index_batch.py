"""qkm.ClusterIndex's batch paths (grouped, pre-filtered): oracles are the per-query path and brute force over all rows."""

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from qkm import ClusterIndex, KMeans
from qkm._threads import numba_threads
from qkm.operator import DenseOperator

import naive


@pytest.fixture(scope="module")
def wide():
    """200 features on a decaying spectrum, and 80 queries from the same mixture."""
    X = naive.decaying_mixture(5, 10, 680)
    return X[:600], X[600:]


@pytest.fixture(scope="module")
def km(wide):
    return KMeans(n_clusters=6, random_state=0).fit(wide[0])


PATHS = ("grouped", "prefiltered")


def _both(lists, Q, k, nprobe, given=None, n_threads=1, path="grouped"):
    per = lists.search(Q, k, nprobe, given, n_threads, path="per-query")
    assert lists.last_path == "per-query"
    other = lists.search(Q, k, nprobe, given, n_threads, path=path)
    assert lists.last_path == path
    return per, other


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("partition, store, rows_dtype", [
    ("auto", "float32", np.float64), ("auto", "int8", np.float64), ("auto", "float32", np.float32),
    ("model", "float32", np.float64), ("model", "int8", np.float32), ("model", "float32", np.float32)])
def test_batch_path_equals_per_query_and_brute_force(wide, km, partition, store, rows_dtype, path):
    X, Xq = wide[0].astype(rows_dtype), wide[1]
    index = ClusterIndex(km, nprobe=1, partition=partition, n_lists=14 if partition == "auto" else None, store=store,
                         random_state=0).fit(X)
    lists = index._lists
    given = None if lists.own else km.operator_.sq_distances(Xq)
    if path == "prefiltered" and store == "int8":  # bounds by matrix products need the float32 coordinates
        with pytest.raises(ValueError, match="float32"):
            lists.search(Xq, 1, 1, given, path=path)
        assert lists.batch_path(10 ** 6, 1, 1) != "prefiltered"
        return
    for nprobe in sorted({1, 3, index.n_lists_}):
        for k in (1, 4, 9):
            (d1, i1), (d2, i2) = _both(lists, Xq, k, nprobe, given, path=path)
            np.testing.assert_array_equal(i1, i2)
            np.testing.assert_array_equal(d1, d2)
            if nprobe == index.n_lists_:  # every list: the exact neighbours (row ids in the fitted order)
                ref_d, ref_i = naive.knn(Xq, X.astype(np.float64), k)
                np.testing.assert_array_equal(i2, ref_i)
                np.testing.assert_allclose(d2, ref_d, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("store, path", [("float32", "prefiltered"), ("int8", "grouped")])
def test_query_picks_a_batch_path_for_large_batches_and_stays_exact(wide, km, store, path):
    X, Xq = wide
    index = ClusterIndex(km, nprobe=2, n_lists=4, store=store, random_state=0).fit(X)
    assert index.query_path(len(Xq), k=9, nprobe=index.n_lists_) == path
    dist, ind = index.query(Xq, k=9, nprobe=index.n_lists_)  # 80 queries on 4 lists, k = 9
    assert index._lists.last_path == path
    ref_d, ref_i = naive.knn(Xq, X, 9)
    np.testing.assert_array_equal(ind, ref_i)
    np.testing.assert_allclose(dist, ref_d, rtol=1e-10, atol=1e-10)
    assert index.query_path(3, k=1) == "per-query"
    index.query(Xq[:3], k=1)  # a few rows, k = 1: per query
    assert index._lists.last_path == "per-query"
    info = index.describe()["batch_path"]
    assert info["path"] == path and index.query_path(info["from_queries"], k=info["k"]) == path
    assert index.query_path(info["from_queries"] - 1, k=info["k"]) == "per-query"
    with pytest.raises(ValueError, match="n_queries"):
        index.query_path(-1)


@pytest.mark.parametrize("path", PATHS)
def test_batch_paths_break_ties_by_index(path):
    X = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [0.0, 0.0]])
    op = DenseOperator(np.array([[0.0, 0.0], [5.0, 5.0]]))
    index = ClusterIndex(op, nprobe=2, n_lists=2, random_state=0).fit(X)
    Q = np.array([[0.1, 0.0], [4.9, 5.0], [0.0, 0.0]])
    (d1, i1), (d2, i2) = _both(index._lists, Q, 3, 2, path=path)
    assert i2.tolist() == [[0, 2, 4], [1, 3, 0], [0, 2, 4]] == i1.tolist()
    np.testing.assert_array_equal(d1, d2)


@pytest.mark.parametrize("store, path", [("float32", "prefiltered"), ("int8", "grouped"), ("float32", "grouped")])
def test_batch_paths_exact_with_duplicated_and_nearly_equal_rows(wide, km, store, path):
    """Exact ties (duplicated rows, queries on them) and near ties (rows 1e-6 apart) in lists probed by groups of
    queries of every size (the pre-filtered path pads each group): the batch path equals the per-query path, and
    with every list probed the brute-force neighbours (ties to the lowest row id)."""
    X, Xq = wide
    rng = np.random.RandomState(1)
    X2 = np.vstack([X[:300], X[:60], X[60:120] + 1e-6 * rng.standard_normal((60, X.shape[1]))])
    Q = np.vstack([Xq, X[:20], X[60:70] + 5e-7])
    index = ClusterIndex(km, nprobe=1, n_lists=11, store=store, random_state=0).fit(X2)
    lists = index._lists
    diff = X2[None, :, :] - Q[:, None, :]
    brute = np.einsum("ijk,ijk->ij", diff, diff)
    for nprobe in (1, 3, index.n_lists_):
        for k in (1, 3, 7):
            (d1, i1), (d2, i2) = _both(lists, Q, k, nprobe, path=path)
            np.testing.assert_array_equal(i1, i2)
            np.testing.assert_array_equal(d1, d2)
            if nprobe == index.n_lists_:
                np.testing.assert_array_equal(i2, np.argsort(brute, axis=1, kind="stable")[:, :k])
                np.testing.assert_allclose(d2 ** 2, np.take_along_axis(brute, i2, axis=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_batch_paths_reject_csr_and_non_finite_queries(wide, km, path):
    import scipy.sparse as sp

    X, Xq = wide
    sparse = ClusterIndex(km, nprobe=2, n_lists=4, random_state=0).fit(sp.csr_matrix(X))
    assert sparse._lists.batch_path(10 ** 6, 10, 2) == "per-query"  # CSR rows: always per query
    with pytest.raises(ValueError, match="dense rows"):
        sparse._lists.search(Xq, 9, 2, path=path)
    dense = ClusterIndex(km, nprobe=2, n_lists=4, random_state=0).fit(X)
    bad = Xq.copy()
    bad[3, 5] = np.inf
    with pytest.raises(ValueError, match="NaN|infinit|finite"):
        dense._lists.search(bad, 9, 2, path=path)


@pytest.mark.needs_threads(2)
@pytest.mark.parametrize("path", PATHS)
def test_batch_paths_identical_for_one_and_two_threads(wide, km, path):
    X, Xq = wide
    index = ClusterIndex(km, nprobe=2, n_lists=14, random_state=0).fit(X)
    runs = []
    for threads in (1, 2):
        with numba_threads(threads), threadpool_limits(threads, user_api="blas"):
            runs.append(index._lists.search(Xq, 9, 5, n_threads=threads, path=path))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("partition", ["auto", "model"])
def test_batch_probe_chooses_the_lists_of_one_query(wide, km, partition):
    """The pre-filtered path's fused probe (lists, head coordinates, norms) against the numpy mirror of the rule,
    widened lists (k beyond what nprobe lists hold) included."""
    X, Xq = wide
    index = ClusterIndex(km, nprobe=1, partition=partition, n_lists=14 if partition == "auto" else None,
                         random_state=0).fit(X)
    lists = index._lists
    Q = np.ascontiguousarray(Xq, dtype=np.float64)
    given = None if lists.own else km.operator_.sq_distances(Q)
    sizes = lists.sizes
    for nprobe, k in [(1, 1), (3, 4), (1, int(sizes.max()) + 5), (2, 300)]:
        zh, nq, chosen, n_chosen = lists.batch_probe(Q, k, nprobe, given)
        ref = index._probe(Q, k, nprobe)
        for i in range(Q.shape[0]):
            want = ref[i][ref[i] >= 0]
            assert chosen[i, :n_chosen[i]].tolist() == want.tolist()
            assert sizes[want].sum() >= k and n_chosen[i] >= min(nprobe, int((sizes > 0).sum()))
        np.testing.assert_allclose(nq, ((Q - lists.mean) ** 2).sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(zh, (Q - lists.mean) @ lists.basis[:, :lists.head_dims].astype(np.float64),
                                   rtol=1e-9, atol=1e-9)


def test_batch_choose_is_the_lists_of_one_query(wide):
    """The pre-filtered path's lists chosen from BLAS products (own lists, float32 coordinates) against the
    kernels' own list distances and the numpy mirror of the rule: exact ties (duplicated centroids) and near ties
    (centroids 1e-6 apart) go through the single-query code; widened lists and all lists included."""
    from qkm.approximate._index import InvertedLists
    from qkm.approximate._index_build import coordinates, fit_basis
    from qkm.approximate._index_probe import probe_lists

    X, Xq = wide
    rng = np.random.RandomState(0)
    mean, basis = fit_basis(X, 96, rng)
    h = min(64, basis.shape[1])
    head = coordinates(X, mean, basis, 0, h).astype(np.float32)
    centers = head[rng.choice(X.shape[0], 12, replace=False)]
    centers = np.vstack([centers, centers[:3], centers[3:5] + np.float32(1e-6)])
    n_lists = centers.shape[0]
    lists = InvertedLists(X, rng.randint(0, n_lists, X.shape[0]), n_lists, mean, basis, centers)
    assert lists._plain_codec()
    Q = np.ascontiguousarray(np.vstack([Xq, X[:20]]), dtype=np.float64)
    pd = lists.list_distances(Q)
    for nprobe, k in [(1, 1), (2, 1), (3, 4), (6, 10), (1, int(lists.sizes.max()) + 5), (n_lists, 1)]:
        Z, nq, chosen, n_chosen = lists.batch_choose(Q, k, nprobe)
        ref = probe_lists(pd, lists.sizes, nprobe, k)
        for i in range(Q.shape[0]):
            assert sorted(chosen[i, :n_chosen[i]].tolist()) == sorted(ref[i][ref[i] >= 0].tolist())
        np.testing.assert_allclose(nq, lists.batch_probe(Q, k, nprobe)[1], rtol=1e-12)
        np.testing.assert_allclose(Z, coordinates(Q, lists.mean, lists.basis), rtol=1e-9, atol=1e-9)
    got = [lists.search(Q, 3, 2, path=path) for path in ("per-query", "prefiltered")]  # the answers of both paths
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])
