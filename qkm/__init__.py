"""qkm: fast-transform k-means.

Sparse-aware Lloyd and Elkan k-means for dense and CSR data, and QK-means:
k-means whose centroid matrix is a product of sparse factors, applied through
a centroid operator (:mod:`qkm.operator`) that runs whichever execution path
is measured fastest.

Examples
--------
>>> import numpy as np, qkm
>>> X = np.array([[0.0, 0.0], [0.0, 1.0], [9.0, 9.0], [9.0, 10.0]])
>>> qkm.KMeans(n_clusters=2, random_state=0).fit(X).inertia_
1.0
"""

from ._version import __version__
from .clustering import KMeans, LowRankKMeans, QKMeans, kmeans_plusplus, seed_centers
from .approximate import ClusterIndex, Nystroem, kernel_approximation_error

__all__ = [
    "ClusterIndex",
    "KMeans",
    "LowRankKMeans",
    "Nystroem",
    "QKMeans",
    "kernel_approximation_error",
    "kmeans_plusplus",
    "seed_centers",
    "__version__",
]
