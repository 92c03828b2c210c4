"""Old path of palm4MSA: :mod:`qkm.factorization` (kept so that existing imports go on working)."""

from .factorization import PalmResult, chain_shapes, factorize, hierarchical_palm4msa, palm4msa, project_splincol

__all__ = ["PalmResult", "chain_shapes", "factorize", "hierarchical_palm4msa", "palm4msa", "project_splincol"]
