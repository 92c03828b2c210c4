"""The centroid operator: the one object every use of a fitted model goes through.

A k-means model is a centroid matrix ``V`` of shape ``(n_clusters, n_features)``.
Assignment, approximate nearest-neighbour search, Nyström features, export
and serving only ever need three things from it: ``X @ V.T`` for a batch, the
squared row norms ``||v_k||^2``, and its size. :class:`CentroidOperator` is
that interface; :class:`DenseOperator` stores ``V`` as a matrix and
:class:`FactorChainOperator` as a product of sparse factors
``V = S_1 S_2 ... S_Q`` (QK-means).

Examples
--------
>>> import numpy as np
>>> from qkm.operator import DenseOperator
>>> op = DenseOperator(np.array([[0.0, 0.0], [10.0, 0.0]]))
>>> labels, sq_dist = op.assign(np.array([[1.0, 0.0], [9.0, 1.0]]))
>>> labels.tolist(), sq_dist.tolist()
([0, 1], [1.0, 2.0])
>>> op.nnz, op.flops, op.compression
(4, 8, 1.0)
"""

import numpy as np

from ._chain import FactorChainOperator
from ._base import CentroidOperator, DenseOperator

__all__ = ["CentroidOperator", "DenseOperator", "FactorChainOperator", "make_operator"]


def make_operator(centroids_or_factors, dtype=None):
    """A :class:`CentroidOperator` from a dense matrix or a list of factors.

    Parameters
    ----------
    centroids_or_factors : ndarray of shape (K, D), or list of matrices
        A list ``[S_1, ..., S_Q]`` (dense or scipy sparse) gives a
        :class:`FactorChainOperator`; an array gives a :class:`DenseOperator`.
    dtype : {np.float32, np.float64}, default=None
        Storage precision (default: the input's, float64 for integers).

    Examples
    --------
    >>> import numpy as np
    >>> make_operator(np.eye(2)).describe()["kind"]
    'DenseOperator'
    """
    if isinstance(centroids_or_factors, CentroidOperator):
        return centroids_or_factors
    if isinstance(centroids_or_factors, (list, tuple)):
        return FactorChainOperator(list(centroids_or_factors), dtype=dtype)
    C = np.asarray(centroids_or_factors)
    if dtype is None:
        dtype = C.dtype if C.dtype in (np.float32, np.float64) else np.float64
    return DenseOperator(np.ascontiguousarray(C, dtype=dtype))
