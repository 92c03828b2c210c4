"""qkm: fast-transform k-means.

Sparse-aware Lloyd and Elkan k-means for dense and CSR data, the building
block of QK-means (centroids as a product of sparse factors).

Examples
--------
>>> import numpy as np, qkm
>>> X = np.array([[0.0, 0.0], [0.0, 1.0], [9.0, 9.0], [9.0, 10.0]])
>>> qkm.KMeans(n_clusters=2, random_state=0).fit(X).inertia_
1.0
"""

__version__ = "0.1.0"

from ._kmeans import KMeans, kmeans_plusplus

__all__ = ["KMeans", "kmeans_plusplus", "__version__"]
