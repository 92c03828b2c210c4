"""scikit-learn's API compliance checks for every qkm estimator."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from qkm import ClusterIndex, KMeans, LowRankKMeans, Nystroem, QKMeans


@parametrize_with_checks([
    KMeans(n_clusters=3, random_state=0),
    KMeans(n_clusters=3, algorithm="elkan", random_state=0),
    KMeans(n_clusters=3, init="k-means||", n_init=2, random_state=0),
    QKMeans(n_clusters=3, sparsity_level=2, max_iter=10, palm_max_iter=30, random_state=0),
    LowRankKMeans(n_clusters=3, rank=2, random_state=0),
    Nystroem(n_components=5, sparsity_level=2, landmark_params={"max_iter": 5, "palm_max_iter": 20}, random_state=0),
    Nystroem(n_components=5, landmarks="uniform", random_state=0),
    ClusterIndex(KMeans(n_clusters=3, random_state=0), random_state=0),  # the template is cloned and fitted on X
])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
