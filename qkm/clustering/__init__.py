"""Clustering: the k-means estimators, their Lloyd / Elkan / factored loops and seedings (private modules)."""
