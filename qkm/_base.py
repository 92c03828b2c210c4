"""What every qkm clustering estimator shares: prediction through its centroid operator.

A fitted estimator holds ``operator_`` (a :class:`qkm.operator.CentroidOperator`);
``predict``, ``transform`` and ``score`` all go through it, so a dense k-means
model and a sparse-factor QK-means model answer the same way.
"""

import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from ._init import distinct_row_indices, kmeans_plusplus, random_rows
from ._operator_base import CentroidOperator
from ._threads import effective_n_threads, numba_threads
from ._validation import check_data, check_feature_count, check_init_array, check_n_clusters

__all__ = ["OperatorClusterMixin", "resolve_n_clusters", "is_int", "check_nonnegative_float", "check_init",
           "check_verbose", "initial_centers"]


def operator_of(obj):
    """The centroid operator of a fitted qkm estimator (``operator_``), a loaded model (``operator``) or an operator; else None."""
    if isinstance(obj, CentroidOperator):
        return obj
    op = getattr(obj, "operator_", None)
    if op is None:
        op = getattr(obj, "operator", None)
    return op if isinstance(op, CentroidOperator) else None


def check_export_header(owner, operator, metadata, state_version):
    """Checks shared by the ``_from_export_state`` of saved parts; returns ``(n_clusters, n_features)``.

    ``owner`` names the part in the messages ("ClusterIndex", "Nystroem").
    """
    if not isinstance(operator, CentroidOperator):
        raise ValueError(f"operator must be a CentroidOperator; got {type(operator).__name__}.")
    if not isinstance(metadata, dict):
        raise ValueError(f"{owner} state: metadata must be a dict.")
    version = metadata.get("state_version", state_version)
    if version != state_version:
        raise ValueError(f"{owner} state version {version!r} is not supported (expected {state_version}).")
    return int(operator.n_clusters), int(operator.n_features)


def is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_nonnegative_float(name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"{name} must be a float >= 0; got {value!r}.")


def check_init(init):
    """``init`` is "k-means++", "random" or an array (checked against the data later)."""
    if isinstance(init, str):
        if init not in ("k-means++", "random"):
            raise ValueError(f"init must be 'k-means++', 'random' or an array; got {init!r}.")
    elif callable(init):
        raise ValueError("init must be 'k-means++', 'random' or an array; callables are not supported.")


def check_verbose(verbose):
    if not (is_int(verbose) and verbose >= 0):
        raise ValueError(f"verbose must be an integer >= 0; got {verbose!r}.")


def initial_centers(init, data, n_clusters, rng):
    """Seeds for one run: greedy k-means++, distinct random rows, or the given array."""
    if isinstance(init, str) and init == "k-means++":
        return kmeans_plusplus(data, n_clusters, rng)[0]
    if isinstance(init, str):
        return random_rows(data, n_clusters, rng)[0]
    return check_init_array(init, n_clusters, data.n_features, data.dtype)


def resolve_n_clusters(X, n_clusters, seeded_from_data, stacklevel=3):
    """Clusters to fit: ``n_clusters``, or fewer when the data hold fewer distinct points.

    ``seeded_from_data`` is False when the caller gave initial centres, in
    which case every requested cluster is kept.
    """
    n_clusters = check_n_clusters(n_clusters)
    if seeded_from_data:
        n_distinct = len(distinct_row_indices(X, stop_at=n_clusters))
        if n_distinct < n_clusters:
            warnings.warn(
                f"The data hold {n_distinct} distinct point(s), fewer than n_clusters={n_clusters}; "
                f"using n_clusters_={n_distinct}.",
                ConvergenceWarning,
                stacklevel=stacklevel,
            )
            return n_distinct
    return n_clusters


def warn_if_clusters_lost(labels, n_clusters, stacklevel=3):
    n_found = np.unique(labels).size
    if n_found < n_clusters:
        warnings.warn(
            f"Number of distinct clusters ({n_found}) found smaller than n_clusters ({n_clusters}).",
            ConvergenceWarning,
            stacklevel=stacklevel,
        )


class OperatorClusterMixin(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """``predict`` / ``transform`` / ``score`` through the fitted ``operator_``."""

    def _check_test_data(self, X):
        check_is_fitted(self, "operator_")
        X = check_data(X, dtype=self.operator_.dtype)
        check_feature_count(X, self.n_features_in_, estimator=type(self).__name__)
        return X

    def _assign(self, X):
        """Labels and squared distances for validated ``X``."""
        with numba_threads(effective_n_threads(self.n_jobs)):
            return self.operator_.assign(X)

    def predict(self, X):
        """Index of the closest centre for each sample.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self._assign(self._check_test_data(X))[0]

    def fit_predict(self, X, y=None):
        """Fit, then return ``labels_``."""
        return self.fit(X).labels_

    def transform(self, X):
        """Euclidean distances to every centre.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        distances : ndarray of shape (n_samples, n_clusters_)
        """
        return self._transform(self._check_test_data(X))

    def _transform(self, X):
        with numba_threads(effective_n_threads(self.n_jobs)):
            return np.sqrt(self.operator_.sq_distances(X))

    def fit_transform(self, X, y=None):
        """Fit, then return the distances of the training samples to the centres."""
        X = check_data(X)
        return self.fit(X)._transform(X.astype(self.operator_.dtype, copy=False))

    def score(self, X, y=None):
        """Opposite of the WCSS of ``X`` against the fitted centres."""
        return -float(self._assign(self._check_test_data(X))[1].sum())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
