"""Nyström RBF features whose landmarks are a centroid operator (QK-means by default).

The Nyström map of the RBF kernel ``k(x, y) = exp(-gamma ||x - y||^2)`` on
landmarks ``v_1..v_K`` is ``phi(x) = W^{-1/2} [k(x, v_1), ..., k(x, v_K)]``
with ``W = k(V, V)``, so that ``phi(x).phi(y)`` approximates ``k(x, y)``.
Here the landmarks are the rows of a :class:`qkm.operator.CentroidOperator`:
the distances ``||x||^2 - 2 (V x) + ||v_k||^2`` cost one application of the
operator, i.e. a QK-means factor chain costs its nnz instead of ``K * D``
(Giffon et al., 2021, Section 5).
"""

import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, clone
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .. import _config
from ..clustering._base import check_export_header, is_int, operator_of
from ._nystroem_kernels import heuristic_gamma, inverse_sqrt_psd, rbf_to_landmarks, row_sq_norms
from .._threads import effective_n_threads, numba_threads
from .._validation import check_data, check_feature_count, check_fitted_data
from ..operator._base import DenseOperator

__all__ = ["Nystroem", "kernel_approximation_error"]

_LANDMARK_KINDS = ("qkmeans", "kmeans", "uniform")

#: Version of the state written by :meth:`Nystroem._export_state`.
_STATE_VERSION = 1


def _check_gamma(gamma, name="gamma"):
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not (np.isfinite(gamma) and gamma > 0):
        raise ValueError(f"{name} must be None or a finite float > 0; got {gamma!r}.")
    return float(gamma)


class Nystroem(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Nyström approximation of the RBF kernel with k-means / QK-means landmarks.

    ``fit`` learns ``K`` landmarks (a QK-means factor chain by default), the
    kernel ``W = k(V, V)`` between them and its pseudo-inverse square root;
    ``transform`` maps ``x`` to ``W^{-1/2} k(V, x)``, computing
    ``||x - v_k||^2 = ||x||^2 - 2 (V x) + ||v_k||^2`` (clipped at 0) through
    the landmarks' centroid operator, so QK-means landmarks cost the
    factor chain instead of ``K * D`` per sample.

    Parameters
    ----------
    n_components : int, default=100
        Number of landmarks ``K`` (reduced to ``n_samples``, with a warning,
        when there are fewer samples; ignored when ``landmarks`` is an estimator).
    gamma : float or None, default=None
        RBF bandwidth of ``exp(-gamma ||x - y||^2)``. ``None`` uses the
        heuristic of the QK-means paper's experiments,
        ``gamma = 1 / mean_{i,j} ||x_i - x_j||^2`` over the training rows
        (computed exactly as ``1 / (2 * total variance)``; ``1 / n_features``
        if all rows are equal).
    landmarks : {"qkmeans", "kmeans", "uniform"} or qkm estimator, default="qkmeans"
        ``"qkmeans"``: the centroids of :class:`qkm.QKMeans` fitted with
        ``center=True`` (the training mean kept beside the factors, as the
        paper's code fits QK-means on centred data; see docs/decisions.md,
        'Nyström landmarks'; ``landmark_params={"center": False}`` turns it off);
        ``"kmeans"``: of
        :class:`qkm.KMeans`; ``"uniform"``: ``n_components`` training rows
        drawn without replacement (the same rows as scikit-learn's
        ``Nystroem`` for the same ``random_state``). A fitted
        :class:`qkm.KMeans`, :class:`qkm.QKMeans`, :class:`qkm.LowRankKMeans`
        or loaded model (anything with a centroid operator as ``operator_``
        or ``operator``), or a :class:`qkm.operator.CentroidOperator`, is
        used as is, never refitted; an unfitted
        estimator (for instance after :func:`sklearn.base.clone`) is cloned
        and fitted on ``X``.
    sparsity_level : int, default=3
        ``landmarks="qkmeans"``: :class:`qkm.QKMeans`' ``sparsity_level`` (the values of the paper's chain).
    n_factors : int or None, default=None
        ``landmarks="qkmeans"``: number of factors; None: the paper's
        ``floor(log2(max(K, D)))``, each of ``s * max(r, c)`` values (not
        :class:`qkm.QKMeans`' 2-factor default; see docs/decisions.md,
        'Nyström landmarks').
    landmark_params : dict or None, default=None
        Keyword arguments of the :class:`qkm.QKMeans` / :class:`qkm.KMeans`
        that learns the landmarks (e.g. ``{"max_iter": 20}``); they override
        the ones derived from the other parameters.
    random_state : int, RandomState instance or None, default=None
        Seeds the landmark estimator or the uniform draw.
    n_jobs : int or None, default=None
        numba threads for the landmark fit and the operator.

    Attributes
    ----------
    operator_ : qkm.operator.CentroidOperator
        The landmarks ``V`` (K x n_features).
    gamma_ : float
        Bandwidth actually used.
    normalization_ : ndarray of shape (n_components_, n_components_)
        ``W^{-1/2}`` (pseudo-inverse square root); features are
        ``k(x, V) @ normalization_.T``.
    rank_ : int
        Singular values of ``W`` kept (``< n_components_`` when ``W`` is rank deficient).
    n_components_ : int
        Number of landmarks, the output dimension.
    landmark_estimator_ : estimator or None
        The estimator whose operator gave the landmarks (None for "uniform").
    component_indices_ : ndarray of shape (n_components_,) or None
        Training rows used as landmarks ("uniform" only).
    n_features_in_ : int

    See Also
    --------
    kernel_approximation_error : ``||K - Phi Phi^T||_F / ||K||_F`` on a sample.
    sklearn.kernel_approximation.Nystroem : uniformly sampled landmarks.

    Notes
    -----
    ``normalization_`` is computed like scikit-learn's (SVD of ``W``) except
    that singular values below ``S.max() * K * eps`` are dropped instead of
    clipped, so duplicate landmarks do not blow up the features.

    References
    ----------
    Giffon, Emiya, Kadri, Ralaivola. "QuicK-means: accelerating inference for
    K-means by learning fast transforms". Machine Learning, 2021.

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import Nystroem
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(200, 8))
    >>> ny = Nystroem(n_components=16, landmarks="kmeans", random_state=0).fit(X)
    >>> ny.transform(X).shape, ny.normalization_.shape
    ((200, 16), (16, 16))
    >>> bool(np.isclose(ny.gamma_, 1 / (2 * X.var(axis=0).sum())))
    True
    """

    def __init__(self, n_components=100, *, gamma=None, landmarks="qkmeans", sparsity_level=3, n_factors=None,
                 landmark_params=None, random_state=None, n_jobs=None):
        self.n_components = n_components
        self.gamma = gamma
        self.landmarks = landmarks
        self.sparsity_level = sparsity_level
        self.n_factors = n_factors
        self.landmark_params = landmark_params
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------ #
    def _check_params(self):
        if not (is_int(self.n_components) and self.n_components >= 1):
            raise ValueError(f"n_components must be an integer >= 1; got {self.n_components!r}.")
        if self.gamma is not None:
            _check_gamma(self.gamma)
        if isinstance(self.landmarks, str):
            if self.landmarks not in _LANDMARK_KINDS:
                raise ValueError(f"landmarks must be one of {_LANDMARK_KINDS} or a qkm estimator; got {self.landmarks!r}.")
        elif operator_of(self.landmarks) is None and not hasattr(self.landmarks, "fit"):
            raise ValueError(
                "landmarks must be 'qkmeans', 'kmeans', 'uniform', a qkm estimator or a loaded model with a "
                f"centroid operator; got {type(self.landmarks).__name__}."
            )
        if not (is_int(self.sparsity_level) and self.sparsity_level >= 1):
            raise ValueError(f"sparsity_level must be an integer >= 1; got {self.sparsity_level!r}.")
        if self.n_factors is not None and not (is_int(self.n_factors) and self.n_factors >= 1):
            raise ValueError(f"n_factors must be None or an integer >= 1; got {self.n_factors!r}.")
        if self.landmark_params is not None and not isinstance(self.landmark_params, dict):
            raise ValueError(f"landmark_params must be None or a dict; got {type(self.landmark_params).__name__}.")
        effective_n_threads(self.n_jobs)

    def _n_landmarks(self, n_samples):
        if self.n_components > n_samples:
            warnings.warn(
                f"n_components={self.n_components} > n_samples={n_samples}: using n_components = n_samples.",
                UserWarning,
                stacklevel=3,
            )
            return n_samples
        return self.n_components

    def _fit_landmarks(self, X):
        """(operator, landmark estimator or None, row indices or None)."""
        n = X.shape[0]
        kind = self.landmarks
        if not isinstance(kind, str):
            operator = operator_of(kind)
            if operator is not None:
                return operator, kind, None
            est = clone(kind).fit(X)
            operator = operator_of(est)
            if operator is None:
                raise ValueError(f"{type(kind).__name__} has no centroid operator after fitting; "
                                 "landmarks must be a qkm estimator.")
            return operator, est, None
        K = self._n_landmarks(n)
        if kind == "uniform":
            rng = check_random_state(self.random_state)
            idx = rng.permutation(n)[:K]  # scikit-learn Nystroem's draw
            rows = X[idx]
            rows = rows.toarray() if hasattr(rows, "toarray") else rows
            return DenseOperator(np.ascontiguousarray(rows)), None, idx
        from ..clustering._kmeans import KMeans
        from ..clustering._qkmeans import QKMeans
        from ..factorization._shapes import paper_n_factors

        params = dict(n_clusters=K, random_state=self.random_state, n_jobs=self.n_jobs)
        if kind == "qkmeans":
            n_factors = self.n_factors if self.n_factors is not None else paper_n_factors(K, X.shape[1])
            params.update(sparsity_level=self.sparsity_level, n_factors=n_factors, center=True)
        params.update(self.landmark_params or {})
        est = (QKMeans if kind == "qkmeans" else KMeans)(**params).fit(X)
        return est.operator_, est, None

    def fit(self, X, y=None):
        """Learn the landmarks and the normalization ``W^{-1/2}``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : Ignored

        Returns
        -------
        self : Nystroem
        """
        self._check_params()
        X = check_data(X)
        with numba_threads(effective_n_threads(self.n_jobs)):
            operator, estimator, indices = self._fit_landmarks(X)
            check_feature_count(X, operator.n_features, estimator="the landmarks")
            gamma = heuristic_gamma(X) if self.gamma is None else float(self.gamma)
            W = rbf_to_landmarks(operator, np.ascontiguousarray(operator.to_dense()), gamma)
        W = 0.5 * (W + W.T)
        np.fill_diagonal(W, 1.0)  # k(v, v) = 1 exactly
        self.normalization_, self.rank_ = inverse_sqrt_psd(W)
        self.operator_ = operator
        self.gamma_ = gamma
        self.n_components_ = int(operator.n_clusters)
        self.landmark_estimator_ = estimator
        self.component_indices_ = indices
        self.n_features_in_ = int(X.shape[1])
        self._n_features_out = self.n_components_
        return self

    def transform(self, X):
        """Nyström features ``W^{-1/2} k(V, x)`` of every row.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        features : ndarray of shape (n_samples, n_components_), float64
        """
        X = check_fitted_data(self, X, "normalization_")
        return self._transform(X)

    def _transform(self, X):
        """Guts of :meth:`transform`; no input validation."""
        out = np.empty((X.shape[0], self.n_components_), dtype=np.float64)
        step = _config.DENSE_BLOCK_ROWS
        with numba_threads(effective_n_threads(self.n_jobs)):
            for start in range(0, X.shape[0], step):
                kernel = rbf_to_landmarks(self.operator_, X[start:start + step], self.gamma_)
                np.matmul(kernel, self.normalization_.T, out=out[start:start + step])
        return out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # -- serialization (the operator is stored separately) --------------- #
    def _export_state(self):
        """``(arrays, metadata)`` of the fitted map, without the operator (see ``qkm.export``).

        Returns
        -------
        arrays : dict of str to ndarray
            ``{"normalization": (K, K) float64}``.
        metadata : dict
            JSON-serialisable: gamma, sizes, rank, state version.
        """
        check_is_fitted(self, "normalization_")
        arrays = {"normalization": np.ascontiguousarray(self.normalization_, dtype=np.float64)}
        metadata = {
            "state_version": _STATE_VERSION,
            "gamma": float(self.gamma_),
            "n_components": int(self.n_components_),
            "n_features": int(self.n_features_in_),
            "rank": int(self.rank_),
        }
        return arrays, metadata

    @classmethod
    def _from_export_state(cls, operator, arrays, metadata):
        """A fitted :class:`Nystroem` from :meth:`_export_state` output and the landmark operator.

        Raises
        ------
        ValueError
            When the arrays or metadata are inconsistent with each other or with ``operator``.
        """
        K, D = check_export_header("Nystroem", operator, metadata, _STATE_VERSION)
        for key, expected in (("n_components", K), ("n_features", D)):
            if key in metadata and metadata[key] != expected:
                raise ValueError(f"Nystroem state: {key}={metadata[key]!r} but the operator has {expected}.")
        gamma = _check_gamma(metadata.get("gamma"), "Nystroem state: gamma")
        M = arrays.get("normalization")
        if M is None:
            raise ValueError("Nystroem state: array 'normalization' is missing.")
        M = np.asarray(M)
        if M.dtype.kind != "f" or M.shape != (K, K):
            raise ValueError(f"Nystroem state: 'normalization' must be a float ({K}, {K}) array; "
                             f"got {M.dtype} {M.shape}.")
        if not np.all(np.isfinite(M)):
            raise ValueError("Nystroem state: 'normalization' holds NaN or infinite values.")
        rank = metadata.get("rank", K)
        if not (is_int(rank) and 0 <= rank <= K):
            raise ValueError(f"Nystroem state: rank={rank!r} must be an integer in [0, {K}].")
        obj = cls(n_components=K, gamma=gamma)
        obj.operator_ = operator
        obj.gamma_ = gamma
        obj.normalization_ = np.ascontiguousarray(M, dtype=np.float64)
        obj.rank_ = int(rank)
        obj.n_components_ = K
        obj.landmark_estimator_ = None
        obj.component_indices_ = None
        obj.n_features_in_ = D
        obj._n_features_out = K
        return obj


def kernel_approximation_error(nystroem, X, gamma=None):
    """Relative Frobenius error of the Nyström kernel on ``X``: ``||K - Phi Phi^T||_F / ||K||_F``.

    ``K[i, j] = exp(-gamma ||x_i - x_j||^2)`` is the exact RBF kernel of the
    rows of ``X`` and ``Phi = nystroem.transform(X)`` (Eq. 15 of Giffon et
    al., 2021). Both ``n x n`` matrices are built in row blocks, never whole.

    Parameters
    ----------
    nystroem : fitted Nystroem
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        The sample (the paper uses 5000 training rows).
    gamma : float or None, default=None
        Bandwidth of the exact kernel; ``None`` is ``nystroem.gamma_``.

    Returns
    -------
    error : float

    Examples
    --------
    >>> import numpy as np
    >>> from qkm import Nystroem, kernel_approximation_error
    >>> X = np.random.RandomState(0).normal(size=(300, 5))
    >>> ny = Nystroem(n_components=300, landmarks="uniform", random_state=0).fit(X)
    >>> kernel_approximation_error(ny, X) < 1e-6   # every row is a landmark: exact
    True
    """
    X = check_fitted_data(nystroem, X, "normalization_", dtype=np.float64)
    gamma = nystroem.gamma_ if gamma is None else _check_gamma(gamma)
    phi = nystroem._transform(X)
    sq = row_sq_norms(X)
    n = X.shape[0]
    step = max(1, (1 << 22) // max(n, 1))
    num = den = 0.0
    for start in range(0, n, step):
        stop = min(start + step, n)
        G = X[start:stop] @ X.T
        G = G.toarray() if hasattr(G, "toarray") else np.asarray(G)
        d = sq[start:stop, None] - 2.0 * G + sq[None, :]
        np.maximum(d, 0.0, out=d)
        d[np.arange(stop - start), np.arange(start, stop)] = 0.0
        exact = np.exp(-gamma * d)
        diff = exact - phi[start:stop] @ phi.T
        num += float(np.einsum("ij,ij->", diff, diff))
        den += float(np.einsum("ij,ij->", exact, exact))
    return float(np.sqrt(num / den))
