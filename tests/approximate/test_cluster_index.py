"""qkm.ClusterIndex: oracles are brute-force k-NN over all rows, or over the rows of the probed lists."""

import json
import types

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score
from threadpoolctl import threadpool_limits

from conftest import CONTAINERS, through_npy
from qkm import ClusterIndex, KMeans, QKMeans
from qkm._threads import numba_threads
from qkm.approximate._index_build import QUANTIZER_SEED_ROWS, fit_quantizer
from qkm.export import load_model, save_model
from qkm.operator import DenseOperator

import naive


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n_samples=700, n_features=8, centers=6, cluster_std=3.0, random_state=7)
    return X[:600], y[:600], X[600:], y[600:]


@pytest.fixture(scope="module")
def wide():
    """200 features on a decaying spectrum: the bounds use head, tail blocks and a residual beyond them."""
    X = naive.decaying_mixture(3, 12, 760)
    return X[:700], X[700:]


@pytest.fixture(scope="module")
def qk(data):
    return QKMeans(n_clusters=10, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=0).fit(data[0])


@pytest.fixture(scope="module")
def km_wide(wide):
    return KMeans(n_clusters=6, random_state=0).fit(wide[0])


def _own(model, nprobe=4, n_lists=16, **kw):
    return ClusterIndex(model, nprobe=nprobe, n_lists=n_lists, random_state=0, **kw)


def _restricted_knn(Xq, X, list_of_row, probe, k):
    """Brute force over the rows of each query's probed lists (naive oracle)."""
    dist, idx = [], []
    for i in range(Xq.shape[0]):
        rows = np.flatnonzero(np.isin(list_of_row, probe[i][probe[i] >= 0]))
        d, j = naive.knn(naive.dense(Xq[i:i + 1]), naive.dense(X[rows]), k)
        dist.append(d[0])
        idx.append(rows[j[0]])
    return np.array(dist), np.array(idx)


@pytest.mark.parametrize("partition, store, fit_container, query_container, which", [
    ("auto", "float32", "dense", "dense", "wide"), ("auto", "float32", "dense", "csr_matrix", "wide"),
    ("auto", "float32", "csr_matrix", "dense", "wide"), ("auto", "float32", "csr_matrix", "csr_matrix", "wide"),
    ("auto", "float32", "csr_array", "dense", "narrow"), ("auto", "float32", "dense", "dense", "narrow"),
    ("model", "float32", "dense", "dense", "wide"), ("model", "float32", "csr_matrix", "csr_matrix", "wide"),
    ("model", "float32", "dense", "csr_matrix", "narrow"), ("auto", "int8", "dense", "dense", "wide"),
    ("auto", "int8", "csr_matrix", "dense", "wide"), ("auto", "int8", "dense", "csr_matrix", "narrow"),
])
def test_all_lists_is_exact_brute_force(data, wide, qk, km_wide, partition, store, fit_container, query_container,
                                        which):
    X, Xq, model = (data[0], data[2], qk) if which == "narrow" else (wide[0], wide[1], km_wide)
    index = ClusterIndex(model, nprobe=1, partition=partition, n_lists=12, store=store, random_state=0)
    index.fit(CONTAINERS[fit_container](X))
    for rows in (slice(0, 1), slice(1, 6), slice(None)):  # the one-row path, a few rows, a batch (BLAS, chunks)
        for k in (1, 5):
            dist, ind = index.query(CONTAINERS[query_container](Xq[rows]), k=k, nprobe=index.n_lists_)
            ref_dist, ref_ind = naive.knn(Xq[rows], X, k)
            np.testing.assert_array_equal(ind, ref_ind)
            np.testing.assert_allclose(dist, ref_dist, rtol=1e-10, atol=1e-10)
            assert dist.dtype == np.float64 and ind.dtype == np.int64 and ind.shape == (Xq[rows].shape[0], k)


def test_float32_rows_are_searched_exactly(wide, km_wide):
    X32 = wide[0].astype(np.float32)
    index = _own(km_wide, store="int8").fit(X32)
    assert index.describe()["rows_dtype"] == "float32"
    for Xq in (wide[1], wide[1].astype(np.float32)):  # queries keep their precision
        dist, ind = index.query(Xq, k=3, nprobe=index.n_lists_)
        ref_dist, ref_ind = naive.knn(Xq.astype(np.float64), X32.astype(np.float64), 3)
        np.testing.assert_array_equal(ind, ref_ind)
        np.testing.assert_allclose(dist, ref_dist, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("container, store, partition", [
    ("dense", "float32", "auto"), ("csr_matrix", "float32", "auto"), ("dense", "int8", "auto"),
    ("dense", "float32", "model")])
def test_one_query_and_batch_paths_agree(wide, km_wide, container, store, partition):
    X, Xq = wide
    index = _own(km_wide, store=store, partition=partition, n_lists=None if partition == "model" else 16)
    index.fit(CONTAINERS[container](X))
    Q = CONTAINERS[container](Xq)
    for nprobe in sorted({min(p, index.n_lists_) for p in (1, 3, 9)}):
        for k in (1, 4):
            batch = index.query(Q, k=k, nprobe=nprobe)  # 60 rows: BLAS coordinates, parallel kernel
            one = [index.query(Q[i:i + 1], k=k, nprobe=nprobe) for i in range(Xq.shape[0])]  # all compiled
            np.testing.assert_array_equal(np.vstack([o[0] for o in one]), batch[0])
            np.testing.assert_array_equal(np.vstack([o[1] for o in one]), batch[1])


@pytest.mark.parametrize("store", ["float32", "int8"])
def test_one_float32_row_is_answered_as_its_float64_copy(wide, km_wide, store):
    X, Xq = wide
    index = _own(km_wide, store=store, n_lists=16).fit(X)
    Q32 = Xq.astype(np.float32)
    for k in (1, 4):
        batch = index.query(Q32.astype(np.float64), k=k, nprobe=3)  # the batch path, float64 rows
        for i in range(Q32.shape[0]):
            one = index.query(Q32[i:i + 1], k=k, nprobe=3)  # the one-row kernel reads the float32 row itself
            np.testing.assert_array_equal(one[0], batch[0][i:i + 1])
            np.testing.assert_array_equal(one[1], batch[1][i:i + 1])


@pytest.mark.parametrize("partition, store", [("auto", "float32"), ("model", "float32"), ("auto", "int8")])
def test_query_searches_exactly_the_probed_lists(wide, km_wide, partition, store):
    X, Xq = wide  # int8 coordinates: the bounds are coarser, the answers exact all the same
    index = ClusterIndex(km_wide, nprobe=3, partition=partition, n_lists=12, store=store, random_state=0).fit(X)
    if partition == "model":  # the lists are the model's clusters, ranked by the true centroid distances
        labels, _ = naive.assign(X, km_wide.cluster_centers_)
        np.testing.assert_array_equal(index.list_of_row_, labels)
        order = np.argsort(naive.sq_distances(Xq, km_wide.cluster_centers_), axis=1, kind="stable")
        probe = order[:, :3]
    else:
        probe = index._probe(Xq, 3, 3)
    np.testing.assert_array_equal(index.list_sizes_, np.bincount(index.list_of_row_, minlength=index.n_lists_))
    dist, ind = index.query(Xq, k=3)
    ref_dist, ref_ind = _restricted_knn(Xq, X, index.list_of_row_, probe, 3)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-10, atol=1e-10)


def test_more_lists_never_give_a_farther_neighbour(wide, km_wide):
    X, Xq = wide
    index = _own(km_wide).fit(X)
    truth = naive.knn(Xq, X, 1)[1][:, 0]
    runs = [index.query(Xq, k=3, nprobe=p) for p in range(1, index.n_lists_ + 1)]
    dists = np.stack([d for d, _ in runs])  # the probed sets are nested: every k-th distance can only shrink
    assert np.all(np.diff(dists, axis=0) <= 0)
    recall = [np.mean(i[:, 0] == truth) for _, i in runs]
    assert np.all(np.diff(recall) >= 0), recall
    assert recall[0] < 1.0 and recall[-1] == 1.0, recall


def test_auto_nprobe_reaches_its_target_on_held_out_rows():
    X, _ = make_blobs(n_samples=5000, n_features=16, centers=40, cluster_std=2.5, random_state=1)
    X_fit, X_new = X[:4000], X[4000:]
    model = KMeans(n_clusters=8, random_state=0).fit(X_fit)
    index = ClusterIndex(model, target_recall=0.95, random_state=0).fit(X_fit)
    cal = index.calibration_
    assert cal["held_out"] == 400 and cal["target_recall"] == 0.95 and cal["recall_lower_bound"] >= 0.95
    assert 1 < index.nprobe_ < index.n_lists_ == round(4 * np.sqrt(4000))
    truth = naive.knn(X_new, X_fit, 1)[1][:, 0]
    recall = np.mean(index.query(X_new)[1][:, 0] == truth)
    assert recall >= 0.95, (recall, index.nprobe_)
    info = index.describe()
    assert info["nprobe"] == index.nprobe_ and info["nprobe_param"] == "auto" and info["calibration"] == cal


def test_probes_widen_until_k_candidates(data, qk):
    X, _, Xq, _ = data
    index = ClusterIndex(qk, nprobe=1, partition="model").fit(X)
    k = int(index.list_sizes_.max()) + 1  # more than any single list holds
    dist, ind = index.query(Xq[:20], k=k)
    assert ind.shape == (20, k) and all(len(set(row)) == k for row in ind.tolist())
    order = np.argsort(naive.sq_distances(Xq[:20], qk.cluster_centers_), axis=1, kind="stable")
    n_lists = [np.searchsorted(np.cumsum(index.list_sizes_[order[i]]), k) + 1 for i in range(20)]
    probe = [order[i, :n_lists[i]] for i in range(20)]  # the nearest lists until they hold k rows
    np.testing.assert_array_equal(ind, _restricted_knn(Xq[:20], X, index.labels_, probe, k)[1])
    everything = index.query(Xq[:5], k=X.shape[0])[1]
    np.testing.assert_array_equal(everything, naive.knn(Xq[:5], X, X.shape[0])[1])


def test_empty_lists_are_never_probed(data):
    X, _, _, _ = data
    C = KMeans(n_clusters=4, random_state=0).fit(X).cluster_centers_
    with_empty = np.vstack([C, np.full((1, X.shape[1]), 1e3), np.full((1, X.shape[1]), -1e3)])
    index = ClusterIndex(DenseOperator(with_empty), nprobe=1, partition="model").fit(X)
    assert index.list_sizes_[4] == index.list_sizes_[5] == 0
    query = np.full((1, X.shape[1]), 900.0)  # nearest centroid: the empty list 4
    order = np.argsort(naive.sq_distances(query, C), axis=1, kind="stable")[:, :1]
    np.testing.assert_array_equal(index.query(query, k=1)[1], _restricted_knn(query, X, index.labels_, order, 1)[1])


@pytest.mark.parametrize("partition, store, container", [("auto", "float32", "dense"), ("model", "float32", "dense"),
                                                        ("auto", "int8", "dense"), ("auto", "float32", "csr_matrix"),
                                                        ("model", "int8", "csr_matrix")])
def test_ties_go_to_the_lowest_index(partition, store, container):
    X = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [0.0, 0.0]])
    op = DenseOperator(np.array([[0.0, 0.0], [5.0, 5.0]]))
    index = ClusterIndex(op, nprobe=2, partition=partition, n_lists=2, store=store, random_state=0)
    index.fit(CONTAINERS[container](X))
    Q = np.array([[0.1, 0.0], [4.9, 5.0], [0.0, 0.0]])
    dist, ind = index.query(CONTAINERS[container](Q), k=3)
    assert ind.tolist() == [[0, 2, 4], [1, 3, 0], [0, 2, 4]]  # equal distances: the lowest row first
    np.testing.assert_allclose(dist, naive.knn(Q, X, 3)[0], rtol=1e-12, atol=1e-12)
    for i in range(3):  # one row per call: the same answer
        assert index.query(CONTAINERS[container](Q[i:i + 1]), k=3)[1].tolist() == [ind[i].tolist()]


def test_predict_kneighbors_score(data, qk):
    X, y, Xq, yq = data
    index = _own(qk).fit(X, y)
    dist, ind = index.query(Xq, k=1)
    np.testing.assert_array_equal(index.predict(Xq), y[ind[:, 0]])
    assert index.score(Xq, yq) == pytest.approx(np.mean(y[ind[:, 0]] == yq))
    d2, i2 = index.kneighbors(Xq, n_neighbors=1)
    np.testing.assert_array_equal(i2, ind)
    np.testing.assert_array_equal(d2, dist)
    np.testing.assert_array_equal(index.kneighbors(Xq, 2, return_distance=False), index.query(Xq, 2)[1])
    names = np.array(["a", "b", "c", "d", "e", "f"])[y]
    assert set(_own(qk).fit(X, names).predict(Xq)) <= set(names)
    np.testing.assert_array_equal(index.labels_, naive.assign(X, qk.cluster_centers_)[0])  # the model's clusters


def test_loaded_model_and_operator_work_like_the_estimator(data, qk):
    X, y, Xq, _ = data
    ref = _own(qk).fit(X).query(Xq, k=2)
    for source in (types.SimpleNamespace(operator=qk.operator_), qk.operator_):
        got = _own(source).fit(X).query(Xq, k=2)
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[0], ref[0])
    template = KMeans(n_clusters=5, random_state=0)
    index = _own(template).fit(X)
    assert not hasattr(template, "operator_") and index.operator_.n_clusters == 5


def test_bad_inputs_raise_clear_errors(data, qk):
    X, y, Xq, _ = data
    index = _own(qk).fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, but ClusterIndex is expecting 8"):
        index.query(Xq[:, :7])
    with pytest.raises(ValueError, match="k=601 is larger than the number of indexed rows"):
        index.query(Xq, k=601)
    with pytest.raises(ValueError, match="k must be an integer"):
        index.query(Xq, k=0)
    for nprobe in (0, 17, 1.5):
        with pytest.raises(ValueError, match=r"nprobe must be an integer in \[1, n_lists_=16\]"):
            index.query(Xq, nprobe=nprobe)
    for params, match in (({"nprobe": 17}, "nprobe must be an integer in"), ({"nprobe": "all"}, "nprobe must be"),
                          ({"partition": "x"}, "partition must be"), ({"n_lists": 0}, "n_lists must be"),
                          ({"store": "float16"}, "store must be"),
                          ({"target_recall": 1.5}, "target_recall must be")):
        with pytest.raises(ValueError, match=match):
            ClusterIndex(qk, **{"n_lists": 16, **params}).fit(X)
    for bad_rows in (Xq[:1].copy(), Xq.copy()):  # the one-row fast path and the batch path
        bad_rows[0, 2] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            index.query(bad_rows)
    bad = X.copy()
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        ClusterIndex(qk).fit(bad)
    with pytest.raises(ValueError, match="features"):
        ClusterIndex(qk).fit(X[:, :7])
    with pytest.raises(ValueError, match="y must be 1-D"):
        ClusterIndex(qk).fit(X, y[:10])
    with pytest.raises(ValueError, match="fit the index with y"):
        _own(qk).fit(X).predict(Xq)
    with pytest.raises(ValueError, match="estimator must be"):
        ClusterIndex(object()).fit(X)


@pytest.mark.needs_threads(2)
@pytest.mark.parametrize("partition", ["auto", "model"])
def test_identical_for_one_and_two_threads(wide, km_wide, partition):
    X, Xq = wide
    runs = []
    for threads in (1, 2):
        with numba_threads(threads), threadpool_limits(threads, user_api="blas"):
            index = ClusterIndex(km_wide, partition=partition, n_lists=12, random_state=0, n_jobs=threads).fit(X)
            runs.append((index.nprobe_, index.list_of_row_, *index.query(Xq, k=4, nprobe=3)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_quantizer_seeds_on_a_sample_and_recovers_separated_groups():
    """The own lists' k-means (k-means++ on ~QUANTIZER_SEED_ROWS rows per list, few Lloyd iterations) still finds
    well-separated groups exactly, and is reproducible from its random state."""
    n_lists = 20
    X, groups = make_blobs(n_samples=n_lists * QUANTIZER_SEED_ROWS * 5, n_features=6, centers=n_lists,
                           cluster_std=0.2, center_box=(-50, 50), random_state=3)
    assert X.shape[0] > n_lists * QUANTIZER_SEED_ROWS  # the seeding runs on a sample, not on every row
    runs = [fit_quantizer(X, n_lists, np.random.RandomState(5), 1) for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    lists = naive.knn(X, runs[0].astype(np.float64), 1)[1][:, 0]
    assert adjusted_rand_score(groups, lists) == 1.0


def test_default_build_is_reproducible_from_random_state():
    X, _ = make_blobs(n_samples=2500, n_features=12, centers=30, cluster_std=2.0, random_state=4)
    model = KMeans(n_clusters=6, random_state=0).fit(X)
    a, b = (ClusterIndex(model, random_state=7).fit(X) for _ in range(2))
    assert a.n_lists_ == round(4 * np.sqrt(2500)) and a.calibration_["held_out"] == 250
    np.testing.assert_array_equal(a.list_of_row_, b.list_of_row_)
    np.testing.assert_array_equal(a._lists.centers, b._lists.centers)
    assert a.nprobe_ == b.nprobe_ and a.calibration_ == b.calibration_


@pytest.mark.parametrize("partition, store", [("auto", "float32"), ("model", "float32"), ("auto", "int8")])
@pytest.mark.parametrize("container", ["dense", "csr_matrix"])
@pytest.mark.parametrize("labels", ["int", "str", "none"])
def test_export_state_round_trip(wide, km_wide, tmp_path, partition, store, container, labels):
    X, Xq = wide
    y = np.arange(X.shape[0]) % 3
    y_fit = {"int": y, "str": np.array(["u", "v", "w"])[y], "none": None}[labels]
    index = ClusterIndex(km_wide, nprobe=2, partition=partition, n_lists=12, store=store, random_state=0)
    index.fit(CONTAINERS[container](X), y_fit)
    arrays, metadata = index._export_state()
    assert all(a.dtype.kind in "biuf" for a in arrays.values())
    metadata = json.loads(json.dumps(metadata))
    back = ClusterIndex._from_export_state(km_wide.operator_, through_npy(arrays, tmp_path), metadata)
    for k, nprobe in ((1, None), (3, 4), (2, 1)):
        a, b = index.query(Xq, k=k, nprobe=nprobe), back.query(Xq, k=k, nprobe=nprobe)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    for name in ("labels_", "list_of_row_", "list_sizes_"):
        np.testing.assert_array_equal(getattr(back, name), getattr(index, name))
    assert back.nprobe == back.nprobe_ == 2 and back.n_samples_fit_ == 700 and back.describe() == index.describe()
    if y_fit is not None:
        np.testing.assert_array_equal(back.predict(Xq), index.predict(Xq))


@pytest.mark.parametrize("partition, store", [("auto", "float32"), ("auto", "int8"), ("model", "float32")])
def test_saved_with_the_model_and_loaded(wide, km_wide, tmp_path, partition, store):
    X, Xq = wide  # the safe model format: the index travels with the model, nprobe_ and describe() too
    index = ClusterIndex(km_wide, partition=partition, n_lists=12, store=store, random_state=0).fit(X)
    save_model(km_wide, tmp_path / "m.qkm", index=index)
    model = load_model(tmp_path / "m.qkm")
    assert model.index.nprobe_ == index.nprobe_ and model.describe()["index"] == index.describe()
    for k, nprobe in ((1, None), (4, 3)):
        got, expected = model.search(Xq, k=k, nprobe=nprobe), index.query(Xq, k=k, nprobe=nprobe)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_array_equal(got[0], expected[0])


def test_state_version_1_loads_as_the_model_partition(data, qk, tmp_path):
    X, y, Xq, _ = data
    labels = naive.assign(X, qk.cluster_centers_)[0]
    row_ids = np.argsort(labels, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=10))])
    arrays = {"fit_X": X[row_ids], "list_offsets": offsets, "row_ids": row_ids, "y": y}  # what qkm 0.1 wrote
    metadata = {"state_version": 1, "nprobe": 2, "n_samples": 600, "n_features": 8, "n_clusters": 10,
                "sparse": False, "dtype": "float64", "y": "values"}
    index = ClusterIndex._from_export_state(qk.operator_, through_npy(arrays, tmp_path), metadata)
    assert index.nprobe_ == 2 and index.describe()["partition"] == "model"
    order = np.argsort(naive.sq_distances(Xq, qk.cluster_centers_), axis=1, kind="stable")[:, :2]
    dist, ind = index.query(Xq, k=3)
    np.testing.assert_array_equal(ind, _restricted_knn(Xq, X, labels, order, 3)[1])
    np.testing.assert_array_equal(index.predict(Xq), y[ind[:, 0]])


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
    (lambda a, m: a.pop("list_centers"), "missing"),
    (lambda a, m: a.update(list_centers=a["list_centers"][:-1]), "list_centers"),
    (lambda a, m: a["basis"].__setitem__((0, 0), np.nan), "basis"),
    (lambda a, m: a.update(basis=a["basis"][:5]), "basis"),
    (lambda a, m: a.update(basis_mean=a["basis_mean"][:5]), "basis_mean"),
    (lambda a, m: m.update(nprobe=0), "nprobe"),
    (lambda a, m: m.update(nprobe_chosen=17), "nprobe_chosen"),
    (lambda a, m: m.update(n_lists=0), "n_lists"),
    (lambda a, m: m.update(partition="x"), "partition"),
    (lambda a, m: m.update(store="float16"), "store"),
    (lambda a, m: m.update(n_samples=3), "n_samples"),
    (lambda a, m: m.update(state_version=3), "version"),
])
def test_export_state_rejects_inconsistent_arrays(data, qk, corrupt, match):
    X, y, _, _ = data
    arrays, metadata = _own(qk).fit(X, y)._export_state()
    arrays = {k: v.copy() for k, v in arrays.items()}
    corrupt(arrays, metadata)
    with pytest.raises(ValueError, match=match):
        ClusterIndex._from_export_state(qk.operator_, arrays, metadata)


def test_export_state_rejects_bad_csr(data, qk):
    X, y, _, _ = data
    arrays, metadata = _own(qk).fit(sp.csr_matrix(X), y)._export_state()
    bad = dict(arrays, fit_X_indices=arrays["fit_X_indices"].copy())
    bad["fit_X_indices"][0] = 8
    with pytest.raises(ValueError, match="column indices"):
        ClusterIndex._from_export_state(qk.operator_, bad, metadata)
    bad = dict(arrays, fit_X_indptr=arrays["fit_X_indptr"][:-1])
    with pytest.raises(ValueError, match="CSR"):
        ClusterIndex._from_export_state(qk.operator_, bad, metadata)
    arrays, metadata = ClusterIndex(qk, nprobe=1, partition="model").fit(X, y)._export_state()
    with pytest.raises(ValueError, match="list_offsets"):
        ClusterIndex._from_export_state(DenseOperator(np.zeros((4, 8))), arrays, metadata)
