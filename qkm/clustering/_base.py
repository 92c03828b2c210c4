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

from ._init import distinct_row_indices
from ..operator._base import CentroidOperator
from ._seeding import SEEDINGS, Seeding, Seeds, potential, run_seeding
from .._threads import effective_n_threads, numba_threads
from .._validation import check_data, check_fitted_data, check_row_norms, row_norm_bound, check_init_array, check_n_clusters

__all__ = ["OperatorClusterMixin", "resolve_n_clusters", "run_random_states", "is_int", "check_nonnegative_float", "check_init",
           "check_seeding", "seeding_of", "check_verbose", "initial_centers"]


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


_INIT_CHOICES = ", ".join(repr(name) for name in SEEDINGS)


def check_init(init):
    """``init`` is one of :data:`qkm.clustering._seeding.SEEDINGS` or an array (checked against the data later)."""
    if isinstance(init, str):
        if init not in SEEDINGS:
            raise ValueError(f"init must be one of {_INIT_CHOICES} or an array; got {init!r}.")
    elif callable(init):
        raise ValueError(f"init must be one of {_INIT_CHOICES} or an array; callables are not supported.")


def seeding_of(est):
    """The validated :class:`qkm.clustering._seeding.Seeding` of an estimator's init parameters.

    Raises ValueError on a bad ``init``, ``d2_samples`` (int >= 1 or None),
    ``oversampling_factor`` (float > 0), ``init_rounds`` (int >= 1) or
    ``init_sample`` (float > 0 or None).
    """
    check_init(est.init)
    d2_samples, factor, rounds, sample = est.d2_samples, est.oversampling_factor, est.init_rounds, est.init_sample
    if d2_samples is not None and not (is_int(d2_samples) and d2_samples >= 1):
        raise ValueError(f"d2_samples must be None or an integer >= 1; got {d2_samples!r}.")
    if not (isinstance(factor, numbers.Real) and not isinstance(factor, bool) and factor > 0 and np.isfinite(factor)):
        raise ValueError(f"oversampling_factor must be a float > 0; got {factor!r}.")
    if not (is_int(rounds) and rounds >= 1):
        raise ValueError(f"init_rounds must be an integer >= 1; got {rounds!r}.")
    if sample is not None and not (isinstance(sample, numbers.Real) and not isinstance(sample, bool)
                                   and sample > 0 and np.isfinite(sample)):
        raise ValueError(f"init_sample must be None or a float > 0; got {sample!r}.")
    return Seeding(init=est.init, d2_samples=d2_samples, oversampling_factor=float(factor), init_rounds=int(rounds),
                   init_sample=None if sample is None else float(sample))


def check_seeding(est):
    """Validate an estimator's init parameters (see :func:`seeding_of`)."""
    seeding_of(est)


def check_verbose(verbose):
    if not (is_int(verbose) and verbose >= 0):
        raise ValueError(f"verbose must be an integer >= 0; got {verbose!r}.")


def initial_centers(est, data, n_clusters, rng, sparse_centers=False):
    """Seeds of one run (:class:`qkm.clustering._seeding.Seeds`: centres, cost, seconds) for an estimator.

    ``est`` is an estimator with the init parameters or a
    :class:`qkm.clustering._seeding.Seeding`. A given array is checked against the data;
    its cost comes from one assignment pass. ``sparse_centers``: the centres as CSR
    (see :func:`qkm.clustering._seeding.run_seeding`).
    """
    seeding = est if isinstance(est, Seeding) else seeding_of(est)
    if isinstance(seeding.init, str):
        return run_seeding(seeding, data, n_clusters, rng, sparse_centers)
    # CSR centres: the given array read once into CSR, no dense copy of it (check_init_array)
    centers = check_init_array(seeding.init, n_clusters, data.n_features, data.dtype,
                               sparse=sparse_centers and data.sparse)
    return Seeds(centers, potential(data, centers), 0.0, "array", data.n_samples)


def run_random_states(rng, n_runs):
    """One RandomState per run, drawn up front from ``rng`` (``[rng]`` for one run): a run's draws never
    depend on thread timing or on where the run executes (in memory or over shards)."""
    if n_runs == 1:
        return [rng]
    return [np.random.RandomState(s) for s in rng.randint(2**31 - 1, size=n_runs)]


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
        X = check_fitted_data(self, X, "operator_", dtype=self.operator_.dtype)
        # the fitted centres bound the rows whose distances stay finite (a row of 1e300s would give label 0)
        check_row_norms(X, row_norm_bound(X.dtype, self.operator_.row_sq_norms()), X.dtype)
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
        operator = self.__dict__.get("operator_")
        if operator is not None and getattr(self, "n_features_in_", None) == operator.n_features:
            labels = operator.labels_small(X)    # a few dense rows: one checked pass, no data view
            if labels is not None:
                return labels
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
