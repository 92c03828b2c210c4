"""Bounded work: body size (413), in-flight requests (503 + ``Retry-After``) and the inference thread pool.

The service never queues without bound: a request that would exceed
``max_in_flight`` is refused at once with 503, and the requests admitted share
``inference_threads`` worker threads through an anyio capacity limiter, so at
most ``max_in_flight - inference_threads`` of them wait for a thread.
"""

import contextlib

import anyio
import anyio.to_thread

from .errors import RequestError

__all__ = ["read_body", "receive_body", "check_declared_length", "InFlightLimit", "InferencePool", "RETRY_AFTER_SECONDS"]

#: Seconds a refused client is told to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1


async def read_body(request, max_bytes):
    """The request body, refused with 413 as soon as it is known to exceed ``max_bytes``.

    ``Content-Length`` is checked before anything is read; a body without
    one (chunked) is counted while it streams and dropped once past the limit.
    A client that hangs up mid-body gets status 499 in the metrics.
    """
    return await receive_body(request.receive, request.headers.get("content-length"), max_bytes)


def check_declared_length(declared, max_bytes):
    """413 if a ``Content-Length`` header (str or None) exceeds ``max_bytes``; 400 if it is not an integer."""
    if declared is not None:
        try:
            declared = int(declared)
        except ValueError:
            raise RequestError(400, "Content-Length is not an integer.") from None
        if declared > max_bytes:
            raise RequestError(413, f"the body has {declared} bytes, more than max_body_bytes={max_bytes}.")


async def receive_body(receive, declared, max_bytes):
    """The body of an ASGI request read from ``receive``, as :func:`read_body` reads it.

    ``declared``: its ``Content-Length`` header (str or None). A body that
    comes in one message (the usual case) is returned as it is.
    """
    check_declared_length(declared, max_bytes)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(413, f"the body exceeds max_body_bytes={max_bytes}.")
            if not message.get("more_body", False):
                if not chunks:
                    return chunk
                chunks.append(chunk)
                return b"".join(chunks)
            chunks.append(chunk)
        elif message["type"] == "http.disconnect":  # nobody to answer; 499 (nginx's "client closed request")
            raise RequestError(499, "the client closed the connection before sending the whole body.")


class InFlightLimit:
    """At most ``limit`` requests inside :meth:`slot` at once; the next one gets 503.

    Only used from the event loop thread, so a plain counter is enough;
    ``gauge`` (the ``qkm_in_flight_requests`` metric) follows it.

    Examples
    --------
    >>> gate = InFlightLimit(1)
    >>> with gate.slot():
    ...     try:
    ...         with gate.slot():
    ...             pass
    ...     except RequestError as exc:
    ...         print(exc.status, exc.headers)
    503 {'Retry-After': '1'}
    >>> gate.count
    0
    """

    def __init__(self, limit, gauge=None):
        self.limit = int(limit)
        self.count = 0
        self.gauge = gauge  # a prometheus_client Gauge following the count, if given

    @contextlib.contextmanager
    def slot(self):
        if self.count >= self.limit:
            raise RequestError(503, f"server busy: {self.count} requests in flight (max_in_flight={self.limit}); "
                                    f"retry after {RETRY_AFTER_SECONDS} s.",
                               headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.count += 1
        if self.gauge is not None:
            self.gauge.inc()
        try:
            yield
        finally:
            self.count -= 1
            if self.gauge is not None:
                self.gauge.dec()


class InferencePool:
    """Runs blocking inference calls in at most ``n_threads`` worker threads (anyio's pool, own limiter)."""

    def __init__(self, n_threads):
        self.n_threads = int(n_threads)
        self._limiter = None

    async def run(self, func, *args):
        if self._limiter is None:  # created inside the event loop that uses it
            self._limiter = anyio.CapacityLimiter(self.n_threads)
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)
