"""Approximate 1-NN search through the centroid operator (placeholder, being built for issue 5)."""

__all__ = ["ClusterIndex"]


class ClusterIndex:  # pragma: no cover - placeholder
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("qkm.ClusterIndex is being built (issue 5).")
