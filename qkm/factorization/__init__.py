"""Factorisation and the centroid operator: dense and factor-chain operators, their kernels, palm4MSA, projections, least-squares sweeps (private modules)."""
