"""``floor_app``: the least an HTTP service can do for one JSON row of ``/search`` (served by uvicorn as ``serve_floor:floor_app``).

Used by ``serve_search_overhead.py`` (a server beside ``qkm serve`` and the bare app) and
``_asgi_in_process.py`` (in-process, the same rounds): the floor under ``qkm serve``'s one-row ``/search``.
"""

import os

import numpy as np

#: Environment variable naming the model file ``floor_app`` answers from (a ``.qkm`` with an index).
FLOOR_MODEL_ENV = "QKM_FLOOR_MODEL"
_floor = {}


def floor_load():
    """Load the model named by ``QKM_FLOOR_MODEL`` and run its index's query once (numba's compiled code)."""
    from qkm.export import load_model

    index = load_model(os.environ[FLOOR_MODEL_ENV]).index
    index.query(np.zeros((1, index.n_features_in_), dtype=np.float32))
    _floor["query"] = index.query


async def floor_app(scope, receive, send):
    """The least an HTTP service can do for one JSON row of ``/search``, on the same uvicorn as ``qkm serve``.

    A ``POST`` body ``{"instances": [[...]]}`` is read, parsed by ``orjson.loads``, turned into a float32
    array by ``np.asarray`` and answered by the index's single-query call (``index.query``) as
    ``orjson.dumps({"indices": ..., "distances": ...})``: no validation, no limits, no metrics, no error
    handling. Any other request gets ``{}`` (the readiness probe). The model is loaded at start-up (ASGI
    lifespan) from the file named by ``QKM_FLOOR_MODEL``.
    """
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                floor_load()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    import orjson

    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        distances, indices = _floor["query"](np.asarray(orjson.loads(body)["instances"], dtype=np.float32))
        body = orjson.dumps({"indices": indices, "distances": distances}, option=orjson.OPT_SERIALIZE_NUMPY)
    else:
        body = b"{}"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
