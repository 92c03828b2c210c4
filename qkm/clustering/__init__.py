"""Clustering: the k-means estimators, their Lloyd / Elkan / factored loops and seedings.

Public: :class:`KMeans`, :class:`QKMeans`, :class:`LowRankKMeans`,
:func:`kmeans_plusplus`, :func:`seed_centers` (also ``qkm.<name>``). The rest
are private modules: ``_base`` (the estimators' common part), ``_lloyd`` /
``_elkan`` (dense-centre drivers), ``_factored_lloyd`` and ``_fitters``
(QK-means' loop and factor refits), ``_init`` / ``_seeding`` /
``_seeding_kmpar`` / ``_seeding_kernels`` (seedings), ``_stopping``.
"""

from ._kmeans import KMeans, kmeans_plusplus, seed_centers
from ._qkmeans import LowRankKMeans, QKMeans

__all__ = ["KMeans", "LowRankKMeans", "QKMeans", "kmeans_plusplus", "seed_centers"]
