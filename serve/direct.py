"""The direct path of the row routes (``POST /assign``, ``/search``, ``/features``): ASGI in, bytes out.

:class:`~qkm.serve.middleware.ServiceMiddleware` wraps the whole FastAPI
application (outside its error, telemetry and body-limit layers) and hands
these requests to a :class:`DirectRoute`, which reads the three headers it
needs from the ASGI scope, runs :meth:`qkm.serve.service.Service.compute` (the
work of the FastAPI route, the same function) and sends the answer as two ASGI
messages with the headers starlette's ``Response`` would build, without a
``Request`` or ``Response`` object. Errors are answered as the application's
handlers answer them: ``{"error": ...}`` with their status, 500 for a bug
(then re-raised, so that the server logs its traceback).
"""

import json

from .errors import RequestError

__all__ = ["DirectRoute", "INTERNAL_ERROR"]

#: The message of a 500 (the application's handler of unexpected exceptions answers the same).
INTERNAL_ERROR = "internal error; see the server log."

_WANTED = (b"content-type", b"content-length", b"x-shape")
_CONTENT_TYPES = {}  # media type -> its header value, encoded once


class DirectRoute:
    """Answers one row route; ``await route(scope, receive, send)`` returns the status code it sent.

    Parameters
    ----------
    service : qkm.serve.service.Service
    endpoint : str
        The route's path (its metrics label).
    handler : callable
        ``handler(body, kind, shape, query)`` of the service (``search_answer`` ...).
    missing : str or None
        404 message when the model lacks the route's part (checked first, as the route does), else None.
    inline_ok : bool
        Small bodies answered on the event loop (see :meth:`~qkm.serve.service.Service.compute`).
    """

    def __init__(self, service, endpoint, handler, missing=None, inline_ok=False):
        self.service, self.endpoint, self.handler = service, endpoint, handler
        self.missing, self.inline_ok = missing, inline_ok

    async def __call__(self, scope, receive, send):
        try:
            if self.missing is not None:
                raise RequestError(404, self.missing)
            found = {}
            for name, value in scope["headers"]:
                if name in _WANTED and name not in found:  # the first of repeated headers, as starlette reads
                    found[name] = value.decode("latin-1")
            content, media_type, extra, _ = await self.service.compute(
                self.endpoint, self.handler, receive, found.get(b"content-type"), found.get(b"content-length"),
                found.get(b"x-shape"), scope["query_string"], inline_ok=self.inline_ok)
        except RequestError as exc:
            await send_error(send, exc.status, exc.message, exc.headers)
            return exc.status
        except Exception:  # nothing was sent yet
            await send_error(send, 500, INTERNAL_ERROR)
            raise
        await send_body(send, 200, content, media_type, extra)
        return 200


def _content_type(media_type):
    value = _CONTENT_TYPES.get(media_type)
    if value is None:
        value = _CONTENT_TYPES[media_type] = media_type.encode("latin-1")
    return value


async def send_body(send, status, body, media_type, headers=None):
    """Send one response with the headers, in the order, of starlette's ``Response(body, status, headers,
    media_type)``: the extra headers (names lower-cased), ``content-length``, ``content-type``."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()] if headers else []
    raw.append((b"content-length", str(len(body)).encode("latin-1")))
    raw.append((b"content-type", _content_type(media_type)))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, status, message, headers=None):
    """``{"error": message}`` with ``status``, byte for byte as starlette's ``JSONResponse`` renders it."""
    body = json.dumps({"error": message}, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")
    await send_body(send, status, body, "application/json", headers)
