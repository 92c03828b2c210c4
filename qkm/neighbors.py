"""Old path of the cluster index: :mod:`qkm.approximate` (kept so that existing imports go on working)."""

from .approximate import ClusterIndex

__all__ = ["ClusterIndex"]
