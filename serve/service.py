"""One worker's serving state and the work behind each inference route.

:class:`Service` holds the model's :class:`~qkm.serve.backend.InferenceBackend`,
the limits, the metrics and the readiness flag. :meth:`Service.answer` is the
body shared by the inference routes: it admits the request into a bounded
number of in-flight slots (503 beyond it), reads the body with a size limit
(413), then runs decode, validation, computation and encoding in the inference
thread pool, so the event loop only moves bytes. Assignment bodies of a few
rows (``inline_body_bytes``) are answered on the event loop, where their
short GIL-holding work costs less than the hand-off to a thread; so
are search bodies of that size (one compiled kernel call per row at the
index's default ``nprobe``); features always go to the pool (see
docs/decisions.md, 'Inline answers').

The limit holds for inline answers too: an admitted request yields to the event
loop once before any work, so every request already received is admitted or
refused before one of them computes (without it, inline requests would run one
at a time, each alone in flight, and the rest would queue unseen).
"""

import asyncio
import logging
import os
from urllib.parse import parse_qsl

import anyio.lowlevel
from fastapi.responses import Response

from qkm._version import __version__

from .backend import InferenceBackend
from .decode import (
    JSON,
    NPY,
    OCTET,
    decode_json,
    int_param,
    media_kind,
    parse_shape_header,
    rows_from_json,
    rows_from_npy,
    rows_from_octet,
    validate_rows,
)
from .encode import MEDIA_TYPE, encode_result
from .errors import RequestError
from .limits import InferencePool, InFlightLimit, receive_body
from .metrics import Metrics
from .oip import HEADER_LENGTH, encode_infer_response, parse_infer_request

__all__ = ["Service", "MAX_K"]

log = logging.getLogger("qkm.serve")

#: Largest ``k`` accepted by ``/search``.
MAX_K = 1024


class Service:
    """One worker's model, limits, metrics and readiness; its ``*_answer`` methods run in the inference pool.

    Parameters
    ----------
    settings : ServeSettings
    model : qkm.export.Model
    """

    def __init__(self, settings, model):
        self.settings = settings
        self.backend = InferenceBackend(model, settings.backend, settings.numba_threads)
        self.model = model
        self.ready = False
        self.metrics = Metrics({
            "name": settings.model_name, "kind": getattr(model, "kind", "unknown"), "backend": settings.backend,
            "n_clusters": int(model.n_clusters), "n_features": int(model.n_features),
            "checksum": getattr(model, "checksum", None) or "",
        })
        self.in_flight = InFlightLimit(settings.max_in_flight)
        self.in_flight.gauge = self.metrics.follow_in_flight(lambda: self.in_flight.count)
        self.max_row_norm = self.backend.max_row_norm  # larger rows overflow the distances: 400
        self.pool = InferencePool(settings.inference_threads)

    # -- start-up ---------------------------------------------------------- #
    def pin_threads(self):
        """Give the calling thread (the event loop's, which answers small bodies inline) the numba thread count
        of the inference calls once, so that they need not set and restore it per request."""
        self.backend.pin_threads()

    def warm_up(self):
        """Run every inference path once (blocking), then report ready."""
        self.backend.warm_up()
        self.ready = True
        log.info("qkm serve: model %r (%s backend) loaded and warmed up in worker %d",
                 self.settings.model_name, self.settings.backend, os.getpid())

    # -- facts ------------------------------------------------------------- #
    def describe(self):
        s = self.settings
        return {
            "name": s.model_name,
            **self.model.describe(),
            "serving": {**self.backend.describe(), "qkm_version": __version__, "ready": self.ready,
                        "max_batch_rows": s.max_batch_rows, "max_body_bytes": s.max_body_bytes,
                        "max_in_flight": s.max_in_flight, "inference_threads": s.inference_threads,
                        "distance": "squared Euclidean (/assign); Euclidean (/search)"},
        }

    # -- request handling, in the inference pool ------------------------------ #
    def rows(self, body, kind, shape):
        """Validated rows of a request body, and the JSON object when the body is JSON."""
        s, n_features = self.settings, self.backend.n_features
        obj = None
        if kind == JSON:
            obj = decode_json(body)
            X = rows_from_json(obj, n_features, s.max_batch_rows)
        elif kind == OCTET:
            X = rows_from_octet(body, shape)
        else:
            X = rows_from_npy(body, n_features, s.max_batch_rows)
        return validate_rows(X, n_features, s.max_batch_rows, self.backend.dtype, self.max_row_norm), obj

    def assign_answer(self, body, kind, shape, query):
        X, _ = self.rows(body, kind, shape)
        labels, sq_dist = _client_errors(self.backend.assign, X)
        return (*encode_result(kind, [("labels", labels), ("sq_distances", sq_dist)]), X.shape[0])

    def search_answer(self, body, kind, shape, query):
        X, obj = self.rows(body, kind, shape)
        body = {k: v for k, v in (obj or {}).items() if k in ("k", "nprobe")}
        if set(body) & set(query):
            raise RequestError(400, f"{' and '.join(sorted(set(body) & set(query)))} given both in the query "
                                    "string and in the body; give each once.")
        k = int_param(body.get("k", query.get("k")), "k", low=1, high=MAX_K, default=1, text="k" in query)
        nprobe = int_param(body.get("nprobe", query.get("nprobe")), "nprobe", low=1,
                           high=int(self.model.index.n_lists_), text="nprobe" in query)
        distances, indices, labels = _client_errors(self.backend.search, X, k, nprobe)
        fields = [("indices", indices), ("distances", distances)]
        if labels is not None:
            fields.append(("labels", labels))
        return (*encode_result(kind, fields), X.shape[0])

    def features_answer(self, body, kind, shape, query):
        X, _ = self.rows(body, kind, shape)
        features = _client_errors(self.backend.features, X)
        return (*encode_result(kind, [("features", features)]), X.shape[0])

    def infer_answer(self, body, kind, shape, query, header_length=None):
        """Open Inference Protocol v2 infer: JSON or binary tensors in, the same out (``header_length``: the
        ``Inference-Header-Content-Length`` header of a body with binary tensors)."""
        s, n_features = self.settings, self.backend.n_features
        if kind == OCTET and header_length is None:
            raise RequestError(400, "an application/octet-stream infer request is JSON then binary tensor data: "
                                    f"it needs the {HEADER_LENGTH} header (the JSON's length).")
        X, outputs, request_id = parse_infer_request(body, header_length, n_features, s.max_batch_rows)
        X = validate_rows(X, n_features, s.max_batch_rows, self.backend.dtype, self.max_row_norm)
        labels, sq_dist = _client_errors(self.backend.assign, X)
        return (*encode_infer_response(s.model_name, request_id, outputs, labels, sq_dist), X.shape[0])

    # -- the route body shared by every inference endpoint ------------------- #
    async def answer(self, request, endpoint, handler, kinds=(JSON, OCTET, NPY), inline_ok=False, x_shape=True):
        """Admit, read and answer one inference request with ``handler(body, kind, shape, query)``.

        ``x_shape``: an octet-stream body is rows described by an ``X-Shape``
        header, checked before the body is read (False: the handler parses it).
        """
        headers = request.headers
        content, media_type, extra, _ = await self.compute(
            endpoint, handler, request.receive, headers.get("content-type"), headers.get("content-length"),
            headers.get("x-shape"), request.scope["query_string"], kinds, inline_ok, x_shape)
        return Response(content, media_type=media_type, headers=extra)

    async def compute(self, endpoint, handler, receive, content_type, content_length, x_shape_header, query_string,
                      kinds=(JSON, OCTET, NPY), inline_ok=False, x_shape=True):
        """``(body, media type, extra headers, rows)`` of the answer to one inference request (its ASGI
        ``receive`` and the values of its headers), or a :class:`~qkm.serve.errors.RequestError`.

        The work of :meth:`answer`, shared with the direct routes of
        :mod:`qkm.serve.direct` that call it without a ``Request`` object.
        """
        with self.in_flight.slot():
            await _checkpoint()  # let every request already received be admitted before work
            kind = media_kind(content_type)
            if kind not in kinds:
                raise RequestError(415, f"{endpoint} takes {' or '.join(MEDIA_TYPE[k] for k in kinds)}.")
            shape = None
            if kind == OCTET and x_shape:
                shape = parse_shape_header(x_shape_header, self.backend.n_features, self.settings.max_batch_rows)
            body = await receive_body(receive, content_length, self.settings.max_body_bytes)
            args = (body, kind, shape, query_dict(query_string) if query_string else {})
            if inline_ok and len(body) <= self.settings.inline_body_bytes:  # a few rows: cheaper than a hand-off
                content, media_type, headers, n_rows = handler(*args)
            else:
                content, media_type, headers, n_rows = await self.pool.run(handler, *args)
        self.metrics.observe_rows(endpoint, n_rows)
        return content, media_type, headers, n_rows


async def _checkpoint():
    """``anyio.lowlevel.checkpoint()``: on asyncio (uvicorn) its ``asyncio.sleep(0)`` without the backend lookup."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another event loop (trio)
        await anyio.lowlevel.checkpoint()
    else:
        await asyncio.sleep(0)


def query_dict(query_string):
    """``{name: value}`` of a raw query string, as ``dict(request.query_params)`` gives it (last value wins).

    Examples
    --------
    >>> query_dict(b"k=2&nprobe=3&k=4")
    {'k': '4', 'nprobe': '3'}
    """
    return dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))


def _client_errors(func, *args):
    """``func(*args)``, with the library's ValueError/TypeError (bad input) turned into 400."""
    try:
        return func(*args)
    except (ValueError, TypeError) as exc:
        raise RequestError(400, str(exc)) from None
