"""Model artefacts for qkm estimators (installed as :mod:`qkm.export`).

The safe, pickle-free model format lives in :mod:`qkm.export._safe`:
``save_model(estimator, path)`` / ``load_model(path)``.
"""

from ._safe import FORMAT_VERSION, LoadedModel, ModelFormatError, load_model, save_model

__all__ = ["FORMAT_VERSION", "LoadedModel", "ModelFormatError", "load_model", "save_model"]
