"""Pure ASGI middleware around every request: API-key check (401) and request metrics.

Written against raw ASGI (no ``BaseHTTPMiddleware``) because it runs on every
request and must cost microseconds. It never reads the body and never logs
headers, so neither request bodies nor keys reach a log.

It wraps the whole FastAPI application (its error, telemetry and body-limit
layers included) and dispatches ``POST`` to the row-answering routes
(``/assign``, ``/search``, ``/features``) straight to a
:class:`~qkm.serve.direct.DirectRoute` (``direct_routes``), past every
FastAPI layer: those routes take only the request's headers and body and
answer their own errors, and the framework's layers cost more than the rest of
a one-row request. Every other request, and those routes under a
``root_path``, go through FastAPI as usual.
"""

import hmac
import json
import time

__all__ = ["ServiceMiddleware", "OPEN_PATHS"]

#: Paths answered without an API key: health probes and the API documentation.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready",
                        "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def _route_template(scope, router=None):
    """Route path template of a request (``/v2/models/{name}/infer``), or ``"other"`` (bounded label set)."""
    route = scope.get("route")
    if route is None and router is not None:
        from starlette.routing import Match

        for candidate in router.routes:
            if candidate.matches(scope)[0] is not Match.NONE:
                route = candidate
                break
    return getattr(route, "path", None) or "other"


class ServiceMiddleware:
    """Checks the API key (if any) and records status, latency and endpoint of every HTTP request.

    Parameters
    ----------
    app : ASGI application
    metrics : qkm.serve.metrics.Metrics
    api_key : str or None
        Accepted as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``
        (compared in constant time); ``None`` disables the check.
    router : starlette.routing.Router, optional
        Used to name the route of a refused request in the metrics.
    direct_routes : dict, optional
        ``{path: route}``: ``POST`` requests to ``path`` (after the API-key
        check) go to ``await route(scope, receive, send)``, which answers and
        returns the status it sent, instead of ``app``; their metrics label is ``path``.
    """

    def __init__(self, app, metrics, api_key=None, router=None, direct_routes=None):
        self.app = app
        self.metrics = metrics
        self._key = api_key.encode() if api_key is not None else None
        self.router = router  # to label refused (401) requests with their route
        self.direct_routes = dict(direct_routes or {})

    def _authorized(self, scope):
        if self._key is None or scope["path"] in OPEN_PATHS:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                if hmac.compare_digest(value[7:].strip(), self._key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self._key):
                return True
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # if the application fails before answering
        direct = None
        if scope["method"] == "POST" and not scope.get("root_path"):
            direct = self.direct_routes.get(scope["path"])
        try:
            if not self._authorized(scope):
                status = 401
                await _send_json(send, 401, {"error": "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                                      "or 'X-API-Key: <key>'."},
                                 [(b"www-authenticate", b'Bearer realm="qkm"')])
            elif direct is not None:
                status = await direct(scope, receive, send)
            else:
                async def send_and_note_status(message):
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    await send(message)

                await self.app(scope, receive, send_and_note_status)
        finally:
            endpoint = scope["path"] if direct is not None else _route_template(scope, self.router)
            self.metrics.observe_request(endpoint, status, time.perf_counter() - start)


async def _send_json(send, status, obj, headers=()):
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
