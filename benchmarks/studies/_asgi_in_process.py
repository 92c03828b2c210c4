"""Server CPU of one-JSON-row requests with the ASGI app driven in-process (no sockets, no HTTP parser).

Run by ``serve_search_overhead.py --in-process N`` with the python of each checkout in turn (``new`` and
``ref``); prints one JSON line ``{endpoint: [CPU us per request of each round]}``, with ``"search call"``: the
model's own ``search`` of the same rows (float32, one at a time) in the same rounds, the part of ``/search``
that is the index and not the service (subtracted round by round, it takes out most of the machine's noise). Every request is a fresh
ASGI scope, a one-message body and a ``send`` that keeps the messages; the first answer of each endpoint
must be a 200. ``"floor /search"``: ``serve_floor.floor_app`` (parse, ``index.query``, encode; nothing
else) on the same bodies in the same rounds, the least any service does for them. The bare app of
``serve_load.py`` (``baseline``) costs a few microseconds this way: what is measured is the application's
own work, the HTTP stack left out.

    python benchmarks/studies/_asgi_in_process.py MODEL N ROUNDS DATA_DIR
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import serve_load as sl  # noqa: E402
from serve_floor import FLOOR_MODEL_ENV, floor_app, floor_load  # noqa: E402  (beside this file)

ENDPOINTS = ("/search", "/assign")


def _scope(path, body):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}


async def _request(app, path, body):
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        sent.append(message)

    await app(_scope(path, body), receive, send)
    return sent[0]["status"]


async def _lifespan(app, startup=True, queues=None):
    inbox, outbox = queues or (asyncio.Queue(), asyncio.Queue())
    await inbox.put({"type": "lifespan.startup" if startup else "lifespan.shutdown"})
    if startup:
        asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    message = await outbox.get()
    if not message["type"].endswith(".complete"):
        raise RuntimeError(f"lifespan: {message}")
    return inbox, outbox


def _search_calls(model, Q, n):
    t = time.process_time()
    for i in range(n):
        model.search(Q[i % len(Q):i % len(Q) + 1])
    return (time.process_time() - t) / n * 1e6


async def _timed(app, path, bodies, n):
    t = time.process_time()
    for i in range(n):
        await _request(app, path, bodies[i % len(bodies)])
    return (time.process_time() - t) / n * 1e6


async def measure(app, bodies, n, rounds, endpoints=ENDPOINTS, model=None, Q=None, floor=None):
    """``{endpoint: [CPU us per request of each round]}``; with ``floor`` (``serve_floor.floor_app``, loaded):
    also ``"floor /search"``, the least an HTTP service can do for the same bodies, in the same rounds."""
    queues = await _lifespan(app)
    apps = [(path, app, path) for path in endpoints] + ([("floor /search", floor, "/search")] if floor else [])
    for _, a, path in apps:
        status = await _request(a, path, bodies[0])
        if status != 200:
            raise RuntimeError(f"{path} answered {status}")
        for i in range(200):
            await _request(a, path, bodies[i % len(bodies)])
    out = {name: [] for name, _, _ in apps}
    if model is not None:
        out["search call"] = []
    for _ in range(rounds):
        for name, a, path in apps:
            out[name].append(await _timed(a, path, bodies, n))
        if model is not None:
            out["search call"].append(_search_calls(model, Q, n))
    await _lifespan(app, startup=False, queues=queues)
    return out


def main():
    model_path, n, rounds, data_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    from qkm.export import load_model
    from qkm.serve import create_app

    Q = sl.load_fashion(data_dir, "test")[:256]
    bodies = [json.dumps({"instances": Q[i:i + 1].tolist()}).encode() for i in range(256)]
    model = load_model(model_path)
    app = create_app(model, model_name="bench")
    os.environ[FLOOR_MODEL_ENV] = str(model_path)
    floor_load()
    print(json.dumps(asyncio.run(measure(app, bodies, n, rounds, model=model, Q=Q, floor=floor_app))))


if __name__ == "__main__":
    main()
