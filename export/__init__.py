"""Model artefacts for qkm estimators (installed as :mod:`qkm.export`).

- :class:`Model`: the record every artefact is made from (operator, squared
  norms, metadata, optional search index and Nyström map).
- Safe format, no pickle: :func:`save_model` / :func:`load_model` (the default
  of ``qkm train -o`` and what ``qkm serve`` loads).
- joblib artefact of the estimator itself: :func:`save_joblib` /
  :func:`load_joblib` (pickle: load only from trusted sources).
- ONNX graph of the operator: :func:`to_onnx`.
"""

from ._joblib import load_joblib, save_joblib
from ._model import Model, as_model, data_fingerprint
from ._safe import FORMAT_VERSION, LoadedModel, ModelFormatError, load_model, save_model
from .onnx import to_onnx

__all__ = [
    "FORMAT_VERSION",
    "LoadedModel",
    "Model",
    "ModelFormatError",
    "as_model",
    "data_fingerprint",
    "load_joblib",
    "load_model",
    "save_joblib",
    "save_model",
    "to_onnx",
]
