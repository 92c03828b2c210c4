"""HTTP inference service for qkm models (installed as :mod:`qkm.serve`; FastAPI on uvicorn).

``qkm serve MODEL`` (or :func:`create_app` under any ASGI server) answers:

- ``POST /assign``: nearest centroid and squared distance of each row;
  ``POST /search``: approximate k nearest training rows; ``POST /features``:
  Nyström RBF features. Rows as JSON (dense or sparse), raw float32 with an
  ``X-Shape`` header, or ``.npy``; answers in the same family.
- ``GET /healthz``, ``/readyz``, ``/model``, ``/metrics`` (Prometheus text) and
  the Open Inference Protocol v2 routes under ``/v2``.

Modules: :mod:`~qkm.serve.app` (application and routes), :mod:`~qkm.serve.service`
(per-worker state, the work behind each route), :mod:`~qkm.serve.settings`,
:mod:`~qkm.serve.backend` (model, numba or onnxruntime, warm-up),
:mod:`~qkm.serve.decode` / :mod:`~qkm.serve.encode` (bodies), :mod:`~qkm.serve.oip`,
:mod:`~qkm.serve.limits`, :mod:`~qkm.serve.metrics`, :mod:`~qkm.serve.middleware`,
:mod:`~qkm.serve.runner` (uvicorn).
"""

from .app import create_app
from .errors import RequestError
from .runner import run
from .settings import ServeSettings, demo_model_path

__all__ = ["RequestError", "ServeSettings", "create_app", "demo_model_path", "run"]
