"""qkm.ClusterIndex: oracles are brute-force k-NN over all rows, or over the rows of the probed clusters."""

import json
import types

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs
from threadpoolctl import threadpool_limits

from conftest import CONTAINERS, through_npy
from qkm import ClusterIndex, KMeans, QKMeans
from qkm._threads import numba_threads
from qkm.operator import DenseOperator

import naive


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n_samples=700, n_features=8, centers=6, cluster_std=3.0, random_state=7)
    return X[:600], y[:600], X[600:], y[600:]


@pytest.fixture(scope="module")
def qk(data):
    return QKMeans(n_clusters=10, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=0).fit(data[0])


def _restricted_knn(Xq, X, labels, centroids, nprobe, k):
    """Brute force over the rows whose cluster is among the nprobe nearest centroids (naive oracle)."""
    order = np.argsort(naive.sq_distances(Xq, centroids), axis=1, kind="stable")[:, :nprobe]
    dist, idx = [], []
    for i in range(Xq.shape[0]):
        rows = np.flatnonzero(np.isin(labels, order[i]))
        d, j = naive.knn(Xq[i:i + 1], X[rows], k)
        dist.append(d[0])
        idx.append(rows[j[0]])
    return np.array(dist), np.array(idx)


@pytest.mark.parametrize("fit_container", list(CONTAINERS))
@pytest.mark.parametrize("query_container", ["dense", "csr_matrix"])
def test_nprobe_k_is_exact_brute_force(data, qk, fit_container, query_container):
    X, y, Xq, _ = data
    index = ClusterIndex(qk, nprobe=qk.n_clusters_).fit(CONTAINERS[fit_container](X), y)
    dist, ind = index.query(CONTAINERS[query_container](Xq), k=5)
    ref_dist, ref_ind = naive.knn(Xq, X, 5)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-10, atol=1e-10)
    assert dist.dtype == np.float64 and ind.shape == (Xq.shape[0], 5)


@pytest.mark.parametrize("nprobe", [1, 3])
def test_query_searches_exactly_the_nprobe_nearest_lists(data, qk, nprobe):
    X, y, Xq, _ = data
    index = ClusterIndex(qk, nprobe=nprobe).fit(X)
    labels, _ = naive.assign(X, qk.cluster_centers_)
    np.testing.assert_array_equal(index.labels_, labels)
    np.testing.assert_array_equal(index.list_sizes_, np.bincount(labels, minlength=10))
    dist, ind = index.query(Xq, k=3)
    ref_dist, ref_ind = _restricted_knn(Xq, X, labels, qk.cluster_centers_, nprobe, 3)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-10, atol=1e-10)


def test_recall_rises_with_nprobe(data, qk):
    X, y, Xq, _ = data
    index = ClusterIndex(qk).fit(X)
    truth = naive.knn(Xq, X, 1)[1][:, 0]
    recall = [np.mean(index.query(Xq, nprobe=p)[1][:, 0] == truth) for p in range(1, qk.n_clusters_ + 1)]
    assert np.all(np.diff(recall) >= 0), recall
    assert recall[0] < 0.95 and recall[-1] == 1.0, recall


def test_probes_widen_until_k_candidates(data, qk):
    X, _, Xq, _ = data
    index = ClusterIndex(qk, nprobe=1).fit(X)
    k = int(index.list_sizes_.max()) + 1  # more than any single list holds
    dist, ind = index.query(Xq[:20], k=k)
    assert ind.shape == (20, k) and np.all(ind >= 0)
    assert all(len(set(row)) == k for row in ind.tolist())
    labels = index.labels_
    order = np.argsort(naive.sq_distances(Xq[:20], qk.cluster_centers_), axis=1, kind="stable")
    for i in range(20):  # the widened probe set: nearest lists until they hold k rows
        n_lists = np.searchsorted(np.cumsum(index.list_sizes_[order[i]]), k) + 1
        rows = np.flatnonzero(np.isin(labels, order[i, :n_lists]))
        d, j = naive.knn(Xq[i:i + 1], X[rows], k)
        np.testing.assert_array_equal(ind[i], rows[j[0]])
    everything = index.query(Xq[:5], k=X.shape[0])[1]
    np.testing.assert_array_equal(everything, naive.knn(Xq[:5], X, X.shape[0])[1])


def test_empty_lists_are_never_probed(data):
    X, _, _, _ = data
    C = KMeans(n_clusters=4, random_state=0).fit(X).cluster_centers_
    with_empty = np.vstack([C, np.full((1, X.shape[1]), 1e3), np.full((1, X.shape[1]), -1e3)])
    index = ClusterIndex(DenseOperator(with_empty), nprobe=1).fit(X)
    assert index.list_sizes_[4] == index.list_sizes_[5] == 0
    query = np.full((1, X.shape[1]), 900.0)  # nearest centroid: the empty list 4
    dist, ind = index.query(query, k=1)
    ref = _restricted_knn(query, X, index.labels_, C, 1, 1)  # the nearest non-empty list is searched
    np.testing.assert_array_equal(ind, ref[1])


def test_ties_go_to_the_lowest_index():
    X = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [5.0, 5.0], [0.0, 0.0]])
    index = ClusterIndex(DenseOperator(np.array([[0.0, 0.0], [5.0, 5.0]])), nprobe=2).fit(X)
    dist, ind = index.query([[0.1, 0.0], [4.9, 5.0]], k=2)
    assert ind.tolist() == [[0, 2], [1, 3]]


def test_predict_kneighbors_score(data, qk):
    X, y, Xq, yq = data
    index = ClusterIndex(qk, nprobe=2).fit(X, y)
    dist, ind = index.query(Xq, k=1)
    np.testing.assert_array_equal(index.predict(Xq), y[ind[:, 0]])
    assert index.score(Xq, yq) == pytest.approx(np.mean(y[ind[:, 0]] == yq))
    d2, i2 = index.kneighbors(Xq, n_neighbors=1)
    np.testing.assert_array_equal(i2, ind)
    np.testing.assert_array_equal(d2, dist)
    np.testing.assert_array_equal(index.kneighbors(Xq, 2, return_distance=False), index.query(Xq, 2)[1])
    names = np.array(["a", "b", "c", "d", "e", "f"])[y]
    assert set(ClusterIndex(qk).fit(X, names).predict(Xq)) <= set(names)


def test_loaded_model_and_operator_work_like_the_estimator(data, qk):
    X, y, Xq, _ = data
    ref = ClusterIndex(qk, nprobe=2).fit(X).query(Xq, k=2)
    for source in (types.SimpleNamespace(operator=qk.operator_), qk.operator_):
        got = ClusterIndex(source, nprobe=2).fit(X).query(Xq, k=2)
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[0], ref[0])
    template = KMeans(n_clusters=5, random_state=0)
    index = ClusterIndex(template).fit(X)
    assert not hasattr(template, "operator_") and index.operator_.n_clusters == 5


def test_bad_inputs_raise_clear_errors(data, qk):
    X, y, Xq, _ = data
    index = ClusterIndex(qk).fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, but ClusterIndex is expecting 8"):
        index.query(Xq[:, :7])
    with pytest.raises(ValueError, match="k=601 is larger than the number of indexed rows"):
        index.query(Xq, k=601)
    with pytest.raises(ValueError, match="k must be an integer"):
        index.query(Xq, k=0)
    for nprobe in (0, 11, 1.5):
        with pytest.raises(ValueError, match="nprobe must be an integer in"):
            index.query(Xq, nprobe=nprobe)
    with pytest.raises(ValueError, match="nprobe must be an integer in"):
        ClusterIndex(qk, nprobe=11).fit(X)
    bad = Xq.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        index.query(bad)
    with pytest.raises(ValueError, match="NaN"):
        ClusterIndex(qk).fit(bad)
    with pytest.raises(ValueError, match="features"):
        ClusterIndex(qk).fit(X[:, :7])
    with pytest.raises(ValueError, match="y must be 1-D"):
        ClusterIndex(qk).fit(X, y[:10])
    with pytest.raises(ValueError, match="fit the index with y"):
        ClusterIndex(qk).fit(X).predict(Xq)
    with pytest.raises(ValueError, match="estimator must be"):
        ClusterIndex(object()).fit(X)


@pytest.mark.needs_threads(2)
def test_identical_for_one_and_two_threads(data, qk):
    X, y, Xq, _ = data
    runs = []
    for threads in (1, 2):
        with numba_threads(threads), threadpool_limits(threads, user_api="blas"):
            index = ClusterIndex(qk, nprobe=3, n_jobs=threads).fit(X, y)
            runs.append(index.query(Xq, k=4))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
@pytest.mark.parametrize("labels", ["int", "str", "none"])
def test_export_state_round_trip(data, qk, tmp_path, container, labels):
    X, y, Xq, _ = data
    y_fit = {"int": y, "str": np.array(["u", "v", "w", "x", "y", "z"])[y], "none": None}[labels]
    index = ClusterIndex(qk, nprobe=2).fit(CONTAINERS[container](X), y_fit)
    arrays, metadata = index._export_state()
    assert all(a.dtype.kind in "biuf" for a in arrays.values())
    metadata = json.loads(json.dumps(metadata))
    back = ClusterIndex._from_export_state(qk.operator_, through_npy(arrays, tmp_path), metadata)
    for k, nprobe in ((1, None), (3, 4)):
        a, b = index.query(Xq, k=k, nprobe=nprobe), back.query(Xq, k=k, nprobe=nprobe)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(back.labels_, index.labels_)
    assert back.nprobe == 2 and back.n_samples_fit_ == 600
    if y_fit is not None:
        np.testing.assert_array_equal(back.predict(Xq), index.predict(Xq))


@pytest.mark.parametrize("corrupt, match", [
    (lambda a, m: a.update(row_ids=np.zeros_like(a["row_ids"])), "permutation"),
    (lambda a, m: a.update(row_ids=a["row_ids"][:-1]), "row_ids"),
    (lambda a, m: a.update(list_offsets=a["list_offsets"][::-1].copy()), "list_offsets"),
    (lambda a, m: a.update(list_offsets=a["list_offsets"][:-1]), "list_offsets"),
    (lambda a, m: a.update(fit_X=a["fit_X"][:, :7]), "fit_X"),
    (lambda a, m: (a.update(fit_X=a["fit_X"][:-1]), m.pop("n_samples")), "list_offsets"),
    (lambda a, m: a["fit_X"].__setitem__((0, 0), np.inf), "infinite"),
    (lambda a, m: a.update(y=a["y"][:5]), "'y'"),
    (lambda a, m: a.pop("fit_X"), "missing"),
    (lambda a, m: m.update(nprobe=0), "nprobe"),
    (lambda a, m: m.update(n_samples=3), "n_samples"),
])
def test_export_state_rejects_inconsistent_arrays(data, qk, corrupt, match):
    X, y, _, _ = data
    arrays, metadata = ClusterIndex(qk).fit(X, y)._export_state()
    arrays = {k: v.copy() for k, v in arrays.items()}
    corrupt(arrays, metadata)
    with pytest.raises(ValueError, match=match):
        ClusterIndex._from_export_state(qk.operator_, arrays, metadata)


def test_export_state_rejects_bad_csr(data, qk):
    X, y, _, _ = data
    arrays, metadata = ClusterIndex(qk).fit(sp.csr_matrix(X), y)._export_state()
    bad = dict(arrays, fit_X_indices=arrays["fit_X_indices"].copy())
    bad["fit_X_indices"][0] = 8
    with pytest.raises(ValueError, match="column indices"):
        ClusterIndex._from_export_state(qk.operator_, bad, metadata)
    bad = dict(arrays, fit_X_indptr=arrays["fit_X_indptr"][:-1])
    with pytest.raises(ValueError, match="CSR"):
        ClusterIndex._from_export_state(qk.operator_, bad, metadata)
    with pytest.raises(ValueError, match="list_offsets"):
        ClusterIndex._from_export_state(DenseOperator(np.zeros((4, 8))), arrays, metadata)
