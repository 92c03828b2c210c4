"""The FastAPI application: :func:`create_app`, the routes and the error handlers.

Inference routes go through :meth:`qkm.serve.service.Service.answer` (bounded
in-flight slots, body size limit, work in the inference thread pool). Client errors are :class:`~qkm.serve.errors.RequestError`
and become ``{"error": ...}`` with their status; so do FastAPI's own 404/405/422
(422 is answered as 400). Anything else is a bug: 500 ``{"error": "internal
error"}``, logged with its traceback but never with the request body.
"""

import contextlib
import functools
import os

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from qkm._version import __version__

from . import openapi as docs
from .backend import load_model_file
from .decode import JSON, OCTET
from .errors import RequestError
from .limits import RETRY_AFTER_SECONDS
from .direct import INTERNAL_ERROR, DirectRoute
from .middleware import ServiceMiddleware
from .oip import EXTENSIONS, HEADER_LENGTH, model_config, model_metadata
from .service import Service
from .settings import ServeSettings, demo_model_path

__all__ = ["create_app"]

_DESCRIPTION = """\
Cluster assignment, approximate nearest-neighbour search and Nyström features of one qkm model.

**Bodies.** Rows go in as JSON (`{"instances": [[...], ...]}` dense, or `{"indices": [[...]], "values": [[...]]}`
sparse), as raw little-endian float32 (`Content-Type: application/octet-stream` with `X-Shape: B,D`), or as
one `.npy` array (`application/x-npy`). Answers come back in the same family: JSON, raw arrays one after the
other (described by the `X-Shape` and `X-Fields` headers), or one `.npy` (structured when it has several fields).

**Errors** are `{"error": "..."}`: 400 bad input (also finite values whose arithmetic overflows: answers are
always finite), 401 API key, 404 unknown model or missing part, 413 too big, 415 content type, 503 overloaded
(with `Retry-After`). KServe and Triton clients (`tritonclient.http`) can use the Open Inference Protocol v2
routes under `/v2`, with JSON or binary tensor data.
"""

_NO_INDEX = "this model has no search index; train it with 'qkm train --with-index'."
_NO_FEATURES = "this model has no Nyström features; train it with 'qkm train --with-features'."


def _error(status, message, headers=None):
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _install_error_handlers(app):
    @app.exception_handler(RequestError)
    async def request_error(request, exc):
        return _error(exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors())
        return _error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request, exc):  # logged by the server with its traceback; never the body
        return _error(500, INTERNAL_ERROR)


def create_app(model=None, *, settings=None, **options):
    """The FastAPI application serving one qkm model.

    The model is loaded when the application is created (in each uvicorn
    worker, after it starts); start-up (the ASGI lifespan) runs every inference
    path once, and ``/readyz`` answers 200 only after that.

    Parameters
    ----------
    model : str, os.PathLike or qkm.export.Model, default=None
        Model file (safe format; a joblib artefact only with
        ``trust_pickle=True``) or an already loaded model. ``None`` serves the
        demo model shipped in ``models/`` (:func:`qkm.serve.demo_model_path`).
    settings : qkm.serve.ServeSettings, optional
        All settings at once (then ``model`` must be None or a loaded model).
    **options
        Any :class:`~qkm.serve.ServeSettings` field: ``backend``
        (``"numba"`` or ``"onnx"``), ``model_name``, ``max_batch_rows``,
        ``max_body_bytes``, ``max_in_flight``, ``inference_threads``,
        ``numba_threads``, ``api_key``, ``trust_pickle``.

    Returns
    -------
    app : fastapi.FastAPI
        ``app.state.service`` is its :class:`~qkm.serve.service.Service`.

    Examples
    --------
    >>> import numpy as np, qkm
    >>> from fastapi.testclient import TestClient
    >>> from qkm.export import Model
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0, 0.0], [0.0, 1.0], [9.0, 9.0], [9.0, 10.0]]))
    >>> with TestClient(create_app(Model.from_estimator(km))) as client:
    ...     client.post("/assign", json={"instances": [[0.0, 0.5], [9.0, 9.0]]}).json()
    {'labels': [1, 0], 'sq_distances': [0.0, 0.25]}
    """
    if settings is None:
        is_path = model is None or isinstance(model, (str, os.PathLike))
        path = (demo_model_path() if model is None else model) if is_path else "model"
        settings = ServeSettings(model_path=path, **options)
        loaded = load_model_file(settings.model_path, settings.trust_pickle) if is_path else model
    elif options or isinstance(model, (str, os.PathLike)):
        raise TypeError("with settings=, the model file is settings.model_path: pass no path and no options.")
    else:
        loaded = load_model_file(settings.model_path, settings.trust_pickle) if model is None else model
    service = Service(settings, loaded)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.pin_threads()
        await anyio.to_thread.run_sync(service.warm_up)
        yield
        service.ready = False
        service.metrics.close()

    app = _ServiceApp(title="qkm inference service", version=__version__, description=_DESCRIPTION,
                      lifespan=lifespan)
    app.state.service = service
    _install_error_handlers(app)
    _add_routes(app, service)
    app.service_middleware = functools.partial(
        ServiceMiddleware, metrics=service.metrics, api_key=settings.api_key, router=app.router, direct_routes={
            "/assign": DirectRoute(service, "/assign", service.assign_answer, inline_ok=True),
            "/search": DirectRoute(service, "/search", service.search_answer, inline_ok=True,
                                   missing=None if service.backend.has_index else _NO_INDEX),
            "/features": DirectRoute(service, "/features", service.features_answer,
                                     missing=None if service.backend.has_features else _NO_FEATURES)})
    return app


class _ServiceApp(FastAPI):
    """FastAPI with :class:`~qkm.serve.middleware.ServiceMiddleware` outside all of its own layers.

    The middleware answers the row routes itself (:mod:`qkm.serve.direct`),
    so they skip FastAPI's error, telemetry and body-limit layers too; every
    other request goes through them as before.
    """

    service_middleware = None  # set by create_app: ServiceMiddleware(app) with its options

    def build_middleware_stack(self):
        stack = super().build_middleware_stack()
        return stack if self.service_middleware is None else self.service_middleware(stack)

    async def __call__(self, scope, receive, send):
        """Row routes straight to the middleware (FastAPI's own ``__call__`` asks its telemetry first: ~20 us)."""
        if scope["type"] == "http" and scope["method"] == "POST" and not self.root_path \
                and not scope.get("root_path"):
            stack = self.middleware_stack
            if stack is None:
                stack = self.middleware_stack = self.build_middleware_stack()
            if scope["path"] in getattr(stack, "direct_routes", ()):
                scope["app"] = self
                await stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _add_routes(app, service):
    """Add every route (the row routes are answered directly by the service middleware, through FastAPI's
    routing only under a ``root_path``)."""
    s = service.settings
    name = s.model_name
    n_features = service.backend.n_features  # the examples of the API docs are valid requests for this model

    # -- inference --------------------------------------------------------- #
    @app.post("/assign", tags=["inference"], summary="Nearest centroid of each row",
              openapi_extra=docs.rows_request_body(n_features),
              responses=docs.result_responses(docs.AssignResult, "labels as int64 then sq_distances as float64, "
                                                                  "little-endian; headers X-Shape: B and X-Fields."))
    async def assign(request: Request):
        """Label (nearest centroid) and squared Euclidean distance to it, for every row."""
        return await service.answer(request, "/assign", service.assign_answer, inline_ok=True)

    @app.post("/search", tags=["inference"], summary="Approximate k nearest training rows",
              openapi_extra={**docs.rows_request_body(n_features, {"k": {"type": "integer", "minimum": 1},
                                                                   "nprobe": {"type": "integer", "minimum": 1}},
                                                      {"k": 2, "nprobe": min(3, int(service.model.n_clusters))}),
                             "parameters": docs.rows_request_body(n_features)["parameters"]
                             + docs.search_parameters()},
              responses={**docs.result_responses(docs.SearchResult, "indices int64, distances float64 and (if "
                                                                    "present) labels int64, each B x k; headers "
                                                                    "X-Shape: B,k and X-Fields."),
                         404: {"model": docs.ErrorBody, "description": "The model has no search index."}})
    async def search(request: Request):
        """Approximate k-NN among the indexed training rows: each query searches the rows of its ``nprobe``
        nearest lists (default: the index's calibrated ``nprobe``). Returns row numbers, Euclidean distances
        and, if the index holds them, labels. ``k`` and ``nprobe`` come from the query string or the JSON body."""
        if not service.backend.has_index:
            raise RequestError(404, _NO_INDEX)
        return await service.answer(request, "/search", service.search_answer, inline_ok=True)

    @app.post("/features", tags=["inference"], summary="Nyström RBF features of each row",
              openapi_extra=docs.rows_request_body(n_features),
              responses={**docs.result_responses(docs.FeaturesResult, "features float64, B x n_components; "
                                                                      "headers X-Shape and X-Fields."),
                         404: {"model": docs.ErrorBody, "description": "The model has no Nyström map."}})
    async def features(request: Request):
        """Nyström approximation of the RBF kernel feature map, with the centroids as landmarks."""
        if not service.backend.has_features:
            raise RequestError(404, _NO_FEATURES)
        return await service.answer(request, "/features", service.features_answer)

    # -- health, model, metrics -------------------------------------------- #
    @app.get("/healthz", tags=["health"], summary="Liveness",
             responses={200: {"content": {"application/json": {"example": {"live": True}}}}})
    async def healthz():
        """200 while the process runs."""
        return {"live": True}

    @app.get("/readyz", tags=["health"], summary="Readiness",
             responses={200: {"content": {"application/json": {"example": {"ready": True}}}}, **docs.NOT_READY})
    async def readyz():
        """200 once the model is loaded and every inference path ran once; 503 before and during shutdown."""
        return _readiness(service)

    @app.get("/model", tags=["model"], summary="Model metadata",
             responses={200: {"content": {"application/json": {"example": {
                 "name": "fashion_mnist_qkmeans", "kind": "factor-chain", "n_clusters": 10, "n_features": 784,
                 "nnz": 2648, "compression": 2.96, "flops": 5296, "qkm_version": "0.1.0",
                 "checksum": "sha256:...", "has_index": True, "has_features": True, "metadata": {},
                 "serving": {}}}}}, **docs.COMMON_RESPONSES})
    async def model_info():
        """Kind, K, D, nnz, compression, FLOPs, qkm version, content checksum, parts, training metadata, limits."""
        return service.describe()

    @app.get("/metrics", tags=["model"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"example": 'qkm_requests_total{endpoint="/assign",'
                                                                    'status="200"} 12.0\n'},
                                          "application/openmetrics-text": {"schema": {"type": "string"}}}},
                        **docs.COMMON_RESPONSES})
    async def metrics(request: Request):
        """Requests by endpoint and status, latency and rows-per-request histograms, rows answered, in-flight
        requests, live workers (prometheus_client: Prometheus text format, or OpenMetrics when the Accept header
        asks for it; with several workers, the sum over all of them)."""
        body, content_type = service.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    # -- Open Inference Protocol v2 ------------------------------------------ #
    oip = ["Open Inference Protocol v2"]

    def check_name(model_name):
        if model_name != name:
            raise RequestError(404, f"unknown model {model_name[:100]!r}; this server serves {name!r}.")

    @app.get("/v2", tags=oip, summary="Server metadata", responses=docs.COMMON_RESPONSES)
    async def v2_server():
        return {"name": "qkm", "version": __version__, "extensions": EXTENSIONS}

    @app.get("/v2/health/live", tags=oip, summary="Liveness")
    async def v2_live():
        return {"live": True}

    @app.get("/v2/health/ready", tags=oip, summary="Readiness", responses=docs.NOT_READY)
    async def v2_ready():
        return _readiness(service)

    distance_dtype = "float32" if s.backend == "onnx" else "float64"

    @app.get("/v2/models/{model_name}", tags=oip, summary="Model metadata",
             responses={**docs.UNKNOWN_MODEL, **docs.COMMON_RESPONSES})
    async def v2_model(model_name: str):
        """Input ``X`` FP32 ``[-1, D]``; outputs ``label`` INT64 and ``distance`` (squared) ``[-1]``."""
        check_name(model_name)
        desc = service.model.describe()
        params = {k: desc.get(k) for k in ("kind", "n_clusters", "n_features", "nnz", "compression", "checksum")}
        params.update(backend=s.backend, distance="squared euclidean")
        return model_metadata(name, n_features, distance_dtype, params)

    @app.get("/v2/models/{model_name}/ready", tags=oip, summary="Model readiness",
             responses={**docs.UNKNOWN_MODEL, **docs.NOT_READY, **docs.COMMON_RESPONSES})
    async def v2_model_ready(model_name: str):
        check_name(model_name)
        return _readiness(service)

    @app.get("/v2/models/{model_name}/config", tags=oip, summary="Model configuration",
             responses={**docs.UNKNOWN_MODEL, **docs.COMMON_RESPONSES})
    async def v2_model_config(model_name: str):
        """The model's configuration in Triton's layout (what ``tritonclient`` ``get_model_config`` reads)."""
        check_name(model_name)
        return model_config(name, n_features, distance_dtype, s.max_batch_rows)

    @app.post("/v2/models/{model_name}/infer", tags=oip, summary="Assign rows (v2 tensors)",
              openapi_extra=docs.oip_infer_body(n_features), responses=docs.oip_infer_responses())
    async def v2_infer(model_name: str, request: Request):
        """The v2 REST infer call: input tensor ``X`` [B, D] in, ``label`` and ``distance`` out, as JSON or as
        binary tensor data (the extension ``tritonclient.http`` uses by default)."""
        check_name(model_name)
        handler = functools.partial(service.infer_answer, header_length=request.headers.get(HEADER_LENGTH))
        return await service.answer(request, "/v2/models/{model_name}/infer", handler, kinds=(JSON, OCTET),
                                    inline_ok=True, x_shape=False)


def _readiness(service):
    if service.ready:
        return {"ready": True}
    return JSONResponse({"ready": False, "error": "the model is warming up or the server is shutting down."},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
