"""HTTP serving of qkm models (installed as :mod:`qkm.serve`).

The FastAPI application arrives with the serving issue; this package only
reserves the import path ``qkm.serve`` today.
"""

__all__: list = []
