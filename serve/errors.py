"""The one exception a request handler raises for a client error (``{"error": ...}`` with a 4xx/503 status)."""

__all__ = ["RequestError"]


class RequestError(Exception):
    """A request the service refuses, with the HTTP status and the message returned as ``{"error": message}``.

    Parameters
    ----------
    status : int
        400 bad input, 401 no or wrong API key, 404 unknown model, 413 too large,
        415 unsupported content type, 503 overloaded / not ready.
    message : str
        What is wrong and, where it helps, how to fix it. Never echoes request bodies or keys.
    headers : dict, optional
        Extra response headers (``Retry-After``, ``WWW-Authenticate``).

    Examples
    --------
    >>> err = RequestError(413, "1000 rows exceed max_batch_rows=256.")
    >>> err.status, str(err)
    (413, '1000 rows exceed max_batch_rows=256.')
    """

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.headers = dict(headers or {})
