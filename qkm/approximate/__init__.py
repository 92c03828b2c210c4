"""Approximate uses of the centroid operator: nearest-neighbour search and Nyström features.

Public: :class:`ClusterIndex` (an inverted-file index whose lists are its own
partition or the model's clusters) and :class:`Nystroem` with
:func:`kernel_approximation_error` (RBF features on the operator's rows).
Private modules: ``_cluster_index`` and ``_index*`` / ``_search_*`` (the index
and its kernels), ``_nystroem`` and ``_nystroem_kernels``.
"""

from ._cluster_index import ClusterIndex
from ._nystroem import Nystroem, kernel_approximation_error

__all__ = ["ClusterIndex", "Nystroem", "kernel_approximation_error"]
