"""Approximate uses of the centroid operator: the cluster index (ANN search) and Nystroem landmarks (private modules)."""
