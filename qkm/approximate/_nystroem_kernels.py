"""Numerics behind :class:`qkm.Nystroem`: the RBF kernel through a centroid operator, ``W^{-1/2}``, the default gamma.

Everything here works on validated input (see :func:`qkm._validation.check_data`):
a C-contiguous float ndarray or a canonical CSR matrix.
"""

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from sklearn.utils.sparsefuncs import mean_variance_axis

from .. import _config

__all__ = ["mean_sq_pairwise_distance", "heuristic_gamma", "rbf_to_landmarks", "inverse_sqrt_psd", "row_sq_norms"]


def row_sq_norms(X):
    """``||x_i||^2`` of every row in float64, dense or CSR."""
    if sp.issparse(X):
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        return np.bincount(rows, weights=X.data.astype(np.float64) ** 2, minlength=X.shape[0])
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def mean_sq_pairwise_distance(X):
    """Mean of ``||x_i - x_j||^2`` over all ordered pairs (``i = j`` included).

    Equal to twice the total (population) variance ``2 * sum_j Var(X[:, j])``,
    so it costs one pass over the data instead of ``n^2`` distances.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [3.0, 4.0]])
    >>> float(mean_sq_pairwise_distance(X))   # pairs (0,0), (0,1), (1,0), (1,1): (0 + 25 + 25 + 0) / 4
    12.5
    """
    n = X.shape[0]
    if sp.issparse(X):
        _, variances = mean_variance_axis(sp.csr_matrix(X, dtype=np.float64), axis=0)
        return 2.0 * float(np.sum(variances))
    mean = X.mean(axis=0, dtype=np.float64)
    total = 0.0
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, n, step):
        diff = X[start:start + step] - mean
        total += float(np.einsum("ij,ij->", diff, diff))
    return 2.0 * total / n


def heuristic_gamma(X):
    """The QK-means paper's RBF bandwidth: ``1 / mean_{i,j} ||x_i - x_j||^2``.

    Falls back to ``1 / n_features`` when every row is the same point.
    """
    m = mean_sq_pairwise_distance(X)
    if not (np.isfinite(m) and m > 0):
        return 1.0 / X.shape[1]
    return 1.0 / m


def rbf_to_landmarks(operator, X, gamma, out=None):
    """``exp(-gamma ||x_i - v_k||^2)`` for every row of ``X`` and landmark ``v_k``, shape (n, K), float64.

    The squared distances are ``||x||^2 - 2 (V x) + ||v_k||^2`` clipped at 0,
    with ``V x`` applied by ``operator`` (so a factor chain costs its nnz, not
    ``K * D``), in blocks of ``_config.DENSE_BLOCK_ROWS`` rows.
    """
    n = X.shape[0]
    if out is None:
        out = np.empty((n, operator.n_clusters), dtype=np.float64)
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, n, step):
        block = operator.sq_distances(X[start:start + step])
        np.multiply(block, -gamma, out=block)
        np.exp(block, out=out[start:start + step])
    return out


def inverse_sqrt_psd(W):
    """``W^{-1/2}`` of a symmetric PSD matrix as a pseudo-inverse square root.

    SVD ``W = U S V^T``; singular values at most ``S.max() * K * eps`` are
    treated as zero (``numpy.linalg.pinv``'s rule) instead of being clipped up
    to a floor as scikit-learn's ``Nystroem`` does, so a rank-deficient ``W``
    (duplicate landmarks) gives bounded features.

    Returns
    -------
    normalization : ndarray of shape (K, K)
        ``U[:, r] S[r]^{-1/2} V[r]^T`` over the kept singular values ``r``.
    rank : int
        Singular values kept.

    Examples
    --------
    >>> import numpy as np
    >>> M, rank = inverse_sqrt_psd(np.diag([4.0, 1.0, 0.0]))
    >>> np.round(M, 12).tolist(), rank
    ([[0.5, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], 2)
    """
    U, S, Vt = scipy.linalg.svd(W)
    tol = S.max() * W.shape[0] * np.finfo(np.float64).eps if S.size else 0.0
    keep = S > tol
    return (U[:, keep] / np.sqrt(S[keep])) @ Vt[keep], int(keep.sum())
