"""qkm.Nystroem and kernel_approximation_error: oracles are scikit-learn's Nystroem and explicit kernels."""

import json
import types

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs, make_circles
from sklearn.kernel_approximation import Nystroem as SkNystroem
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC

from qkm import KMeans, Nystroem, QKMeans, kernel_approximation_error
from qkm._threads import numba_threads
from qkm.operator import CentroidOperator, DenseOperator

import naive
from conftest import through_npy

FAST_QK = {"max_iter": 5, "palm_max_iter": 20}


@pytest.fixture(scope="module")
def data():
    X, _ = make_blobs(n_samples=400, n_features=6, centers=5, cluster_std=2.0, random_state=3)
    return X[:300], X[300:]


@pytest.fixture(scope="module")
def qk(data):
    return QKMeans(n_clusters=12, sparsity_level=2, random_state=0, **FAST_QK).fit(data[0])


def _gram(ny, X):
    phi = ny.transform(X)
    return phi @ phi.T


def _sklearn_gram(landmark_rows, gamma, X):
    sk = SkNystroem(kernel="rbf", gamma=gamma, n_components=landmark_rows.shape[0], random_state=0)
    phi = sk.fit(landmark_rows).transform(X)
    return phi @ phi.T


@pytest.mark.parametrize("container", [np.asarray, sp.csr_matrix])
def test_uniform_landmarks_match_sklearn_nystroem(data, container):
    X, Xt = data
    ours = Nystroem(n_components=20, landmarks="uniform", random_state=0).fit(container(X))
    sk = SkNystroem(kernel="rbf", gamma=ours.gamma_, n_components=20, random_state=0).fit(X)
    np.testing.assert_array_equal(ours.component_indices_, sk.component_indices_)  # the same draw
    phi_sk = sk.transform(Xt)
    np.testing.assert_allclose(_gram(ours, container(Xt)), phi_sk @ phi_sk.T, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("kind", ["qkmeans", "kmeans"])
def test_clustered_landmarks_match_sklearn_on_the_centroid_rows(data, kind):
    X, Xt = data
    ours = Nystroem(n_components=12, landmarks=kind, sparsity_level=2, landmark_params=FAST_QK if kind == "qkmeans"
                    else None, random_state=0).fit(X)
    assert ours.rank_ == ours.n_components_ == 12
    rows = ours.operator_.to_dense()
    np.testing.assert_allclose(_gram(ours, Xt), _sklearn_gram(rows, ours.gamma_, Xt), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("center", [None, False])
def test_qkmeans_landmarks_keep_the_mean_unless_told(data, center):
    X, Xt = data
    params = dict(FAST_QK) if center is None else dict(FAST_QK, center=center)
    ours = Nystroem(n_components=12, landmarks="qkmeans", sparsity_level=2, landmark_params=params,
                    random_state=0).fit(X)
    mean = ours.landmark_estimator_.mean_
    if center is None:  # the default: the mean beside the factors, as QKMeans(center=True)
        np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-12)
        from qkm.factorization._shapes import paper_n_factors
        same = QKMeans(n_clusters=12, sparsity_level=2, n_factors=paper_n_factors(12, X.shape[1]), center=True,
                       random_state=0, **FAST_QK).fit(X)       # Nystroem's chain: the paper's factors
        np.testing.assert_array_equal(ours.operator_.to_dense(), same.cluster_centers_)
    else:
        assert mean is None
    # features: scikit-learn's Nystroem on the dense landmark rows (mean included)
    rows = ours.operator_.to_dense()
    np.testing.assert_allclose(_gram(ours, Xt), _sklearn_gram(rows, ours.gamma_, Xt), rtol=1e-6, atol=1e-12)


def test_fitted_estimator_is_used_not_refitted(data, qk):
    X, Xt = data
    labels_before = qk.labels_.copy()
    ny = Nystroem(n_components=3, landmarks=qk).fit(X)  # n_components is ignored: the model has 12 centroids
    assert ny.operator_ is qk.operator_ and ny.landmark_estimator_ is qk
    assert ny.n_components_ == 12
    np.testing.assert_array_equal(qk.labels_, labels_before)
    loaded = types.SimpleNamespace(operator=qk.operator_)  # what qkm.export.load_model returns
    np.testing.assert_array_equal(Nystroem(landmarks=loaded).fit(X).transform(Xt), ny.transform(Xt))


def test_unfitted_estimator_is_cloned_then_fitted(data):
    X, _ = data
    template = KMeans(n_clusters=4, random_state=0)
    ny = Nystroem(landmarks=template).fit(X)
    assert not hasattr(template, "operator_")
    np.testing.assert_allclose(ny.operator_.to_dense(), KMeans(n_clusters=4, random_state=0).fit(X).cluster_centers_)


class _SpyOperator(CentroidOperator):
    """Delegates to a real operator, counts the rows it is applied to, can forbid densifying."""

    def __init__(self, inner):
        self.inner = inner
        self.n_clusters, self.n_features, self.dtype, self.c_sq = inner.n_clusters, inner.n_features, inner.dtype, inner.c_sq
        self.rows_applied = 0
        self.allow_dense = True

    def apply(self, X):
        self.rows_applied += X.shape[0]
        return self.inner.apply(X)

    def to_dense(self):
        assert self.allow_dense, "transform densified the landmarks instead of applying the operator"
        return self.inner.to_dense()

    @property
    def nnz(self):
        return self.inner.nnz


def test_transform_goes_through_the_operator(data, qk):
    X, Xt = data
    spy = _SpyOperator(qk.operator_)
    ny = Nystroem(landmarks=types.SimpleNamespace(operator_=spy)).fit(X)
    spy.allow_dense, spy.rows_applied = False, 0
    phi = ny.transform(Xt)
    assert spy.rows_applied == Xt.shape[0]
    kernel = naive.rbf_kernel(Xt, qk.cluster_centers_, ny.gamma_)
    np.testing.assert_allclose(phi, kernel @ ny.normalization_.T, rtol=1e-9, atol=1e-12)


def test_default_gamma_is_the_papers_heuristic(data):
    X, _ = data
    expected = 1.0 / naive.mean_sq_pairwise_distance(X)
    for container in (np.asarray, sp.csr_matrix):
        ny = Nystroem(n_components=5, landmarks="uniform", random_state=0).fit(container(X))
        assert ny.gamma_ == pytest.approx(expected, rel=1e-10)
    assert Nystroem(n_components=5, gamma=0.25, landmarks="uniform").fit(X).gamma_ == 0.25


def test_error_is_eq15_and_falls_as_k_grows(data):
    X, Xt = data
    errors = []
    for k in (2, 8, 32):
        ny = Nystroem(n_components=k, landmarks="kmeans", random_state=0).fit(X)
        err = kernel_approximation_error(ny, Xt)
        exact = naive.rbf_kernel(Xt, Xt, ny.gamma_)
        phi = ny.transform(Xt)
        assert err == pytest.approx(np.linalg.norm(exact - phi @ phi.T) / np.linalg.norm(exact), rel=1e-9)
        errors.append(err)
    assert errors[0] > errors[1] > errors[2], errors
    every_row = Nystroem(n_components=Xt.shape[0], landmarks="uniform", random_state=0).fit(Xt)
    assert kernel_approximation_error(every_row, Xt) < 1e-6
    ny = Nystroem(n_components=8, landmarks="kmeans", random_state=0).fit(X)
    assert kernel_approximation_error(ny, sp.csr_matrix(Xt)) == pytest.approx(kernel_approximation_error(ny, Xt))
    assert kernel_approximation_error(ny, Xt, gamma=2 * ny.gamma_) != pytest.approx(kernel_approximation_error(ny, Xt))


def test_duplicate_landmarks_are_handled_by_the_pseudo_inverse(data):
    X, Xt = data
    C = KMeans(n_clusters=6, random_state=0).fit(X).cluster_centers_
    unique = Nystroem(landmarks=DenseOperator(C)).fit(X)
    doubled = Nystroem(landmarks=DenseOperator(np.vstack([C, C[:3]]))).fit(X)
    assert doubled.rank_ == 6 and doubled.n_components_ == 9
    assert np.all(np.isfinite(doubled.transform(Xt)))
    np.testing.assert_allclose(_gram(doubled, Xt), _gram(unique, Xt), rtol=1e-8, atol=1e-10)


def test_pipeline_with_linear_svc_learns_a_nonlinear_boundary():
    X, y = make_circles(n_samples=400, noise=0.05, factor=0.5, random_state=0)
    linear = LinearSVC().fit(X[:300], y[:300]).score(X[300:], y[300:])
    pipe = make_pipeline(Nystroem(n_components=30, landmarks="kmeans", random_state=0), LinearSVC())
    score = pipe.fit(X[:300], y[:300]).score(X[300:], y[300:])
    assert linear < 0.75 < 0.95 <= score, (linear, score)


def test_bad_inputs_raise_clear_errors(data):
    X, Xt = data
    ny = Nystroem(n_components=4, landmarks="uniform", random_state=0).fit(X)
    with pytest.raises(ValueError, match="X has 5 features, but Nystroem is expecting 6"):
        ny.transform(Xt[:, :5])
    bad = Xt.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ny.transform(bad)
    with pytest.raises(ValueError, match="NaN"):
        Nystroem(n_components=4).fit(bad)
    for params, match in (({"n_components": 0}, "n_components"), ({"gamma": -1.0}, "gamma"),
                          ({"landmarks": "random"}, "landmarks"), ({"landmarks": object()}, "landmarks"),
                          ({"sparsity_level": 0}, "sparsity_level"), ({"landmark_params": [1]}, "landmark_params")):
        with pytest.raises(ValueError, match=match):
            Nystroem(**params).fit(X)
    with pytest.raises(ValueError, match="landmarks"):
        Nystroem(landmarks=DenseOperator(np.zeros((3, 4)))).fit(X)
    with pytest.raises(ValueError, match="gamma"):
        kernel_approximation_error(ny, Xt, gamma=0.0)


def test_more_components_than_samples_warns_and_uses_all(data):
    X, _ = data
    with pytest.warns(UserWarning, match="n_components=50 > n_samples=20"):
        ny = Nystroem(n_components=50, landmarks="uniform", random_state=0).fit(X[:20])
    assert ny.n_components_ == 20 and ny.transform(X).shape == (300, 20)


@pytest.mark.needs_threads(2)
def test_identical_for_one_and_two_threads(data):
    X, Xt = data
    runs = []
    for threads in (1, 2):
        with numba_threads(threads):
            ny = Nystroem(n_components=10, sparsity_level=2, landmark_params=FAST_QK, random_state=5,
                          n_jobs=threads).fit(X)
            runs.append((ny.normalization_, ny.transform(Xt)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_export_state_round_trip(data, qk, tmp_path):
    X, Xt = data
    ny = Nystroem(landmarks=qk).fit(X)
    arrays, metadata = ny._export_state()
    assert all(a.dtype.kind in "biuf" for a in arrays.values())
    metadata = json.loads(json.dumps(metadata))
    arrays = through_npy(arrays, tmp_path)
    back = Nystroem._from_export_state(qk.operator_, arrays, metadata)
    np.testing.assert_array_equal(back.transform(Xt), ny.transform(Xt))
    assert back.gamma_ == ny.gamma_ and back.n_features_in_ == 6
    assert kernel_approximation_error(back, Xt) == kernel_approximation_error(ny, Xt)


@pytest.mark.parametrize("corrupt, match", [
    (lambda a, m: a.update(normalization=a["normalization"][:-1]), "normalization"),
    (lambda a, m: a["normalization"].__setitem__((0, 0), np.nan), "NaN"),
    (lambda a, m: a.pop("normalization"), "missing"),
    (lambda a, m: m.update(gamma=-1.0), "gamma"),
    (lambda a, m: m.update(n_features=7), "n_features"),
    (lambda a, m: m.update(state_version=99), "version"),
])
def test_export_state_rejects_inconsistent_arrays(data, qk, corrupt, match):
    ny = Nystroem(landmarks=qk).fit(data[0])
    arrays, metadata = ny._export_state()
    arrays = {k: v.copy() for k, v in arrays.items()}
    corrupt(arrays, metadata)
    with pytest.raises(ValueError, match=match):
        Nystroem._from_export_state(qk.operator_, arrays, metadata)
    with pytest.raises(ValueError, match="n_components"):
        Nystroem._from_export_state(DenseOperator(np.zeros((5, 6))), *ny._export_state())


def test_qkmeans_landmarks_keep_the_papers_chain():
    """K <= D: the landmarks are fitted on the paper's chain (not QKMeans' 2-factor default), as before."""
    from qkm.factorization._shapes import paper_n_factors

    X, _ = make_blobs(n_samples=240, n_features=40, centers=6, random_state=5)
    ours = Nystroem(n_components=8, landmarks="qkmeans", sparsity_level=2, landmark_params=FAST_QK,
                    random_state=0).fit(X)
    assert len(ours.landmark_estimator_.factors_) == paper_n_factors(8, 40) == 5
    same = QKMeans(n_clusters=8, sparsity_level=2, n_factors=5, budget_split="even", center=True, random_state=0,
                   **FAST_QK).fit(X)
    np.testing.assert_array_equal(ours.operator_.to_dense(), same.cluster_centers_)
