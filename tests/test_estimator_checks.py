"""scikit-learn's API compliance checks for every qkm estimator."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from qkm import KMeans


@parametrize_with_checks([KMeans(n_clusters=3, random_state=0), KMeans(n_clusters=3, algorithm="elkan", random_state=0)])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
