"""The one-row fast paths of the service give the answers of the normal paths, errors included.

* JSON bodies with dense rows are decoded by orjson (:func:`qkm.serve.decode._fast_loads`); the oracle is
  the ``json`` path it replaces (the decoder with the fast path switched off).
* ``POST /assign`` and ``/search`` go from the service middleware straight to their endpoint; the oracle
  is the same application with those direct routes switched off (FastAPI's router, dependency solving
  and exception handlers).
"""

import json
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette asks for "httpx2"; the httpx TestClient still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.export import Model
from qkm.serve import create_app
from qkm.serve import decode as decode_module
from qkm.serve.errors import RequestError
from qkm.serve.middleware import ServiceMiddleware
from test_serve_errors import D, asgi_post, npy_bytes


def outcome(body, fast):
    """Rows (dtype and values) or the (status, message) of the error, as the service's JSON decoding gives them."""
    original = decode_module._fast_loads
    if not fast:
        decode_module._fast_loads = lambda body: None
    try:
        obj = decode_module.decode_json(body)
        X = decode_module.rows_from_json(obj, D, 10)
        X = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
        return "rows", X.dtype.str, X.shape, X.tobytes(), obj.get("k")  # bit for bit: NaN, -0.0
    except RequestError as exc:
        return "error", exc.status, exc.message
    finally:
        decode_module._fast_loads = original


BODIES = {
    "one float row": json.dumps({"instances": [[0.1 * i for i in range(D)]]}).encode(),
    "two rows, k": json.dumps({"instances": [[0.5] * D, [1e-300] * D], "k": 3}).encode(),
    "ints": json.dumps({"instances": [list(range(D))]}).encode(),
    "ints and floats": json.dumps({"instances": [[1, 2.5] * (D // 2)]}).encode(),
    "negative zeros": b'{"instances": [[-0, -0.0' + b", 1" * (D - 2) + b"]]}",
    "exponents, whitespace": b' {\n "instances" :[ [1E5,\t-2.5e-3, 1e+2' + b", 3" * (D - 3) + b' ] ] , "k":2}\r\n',
    "17 digits": json.dumps({"instances": [[0.12345678901234568, 9007199254740993.0] * (D // 2)]}).encode(),
    "more digits than a float64 holds": b'{"instances": [[1.00000000000000011102230246251565' + b", 1" * (D - 1)
                                        + b"]]}",
    "int64 max": b'{"instances": [[9223372036854775807' + b", 1" * (D - 1) + b"]]}",
    "uint64": b'{"instances": [[18446744073709551615' + b", 1" * (D - 1) + b"]]}",
    "beyond 64 bits": b'{"instances": [[' + b"9" * 25 + b", 1.5" * (D - 1) + b"]]}",
    "beyond 64 bits, alone": b'{"instances": [[' + b"9" * 25 + b"]]}",
    "k beyond 64 bits": b'{"instances": [[1' + b", 1" * (D - 1) + b"]], \"k\": " + b"9" * 30 + b"}",
    "1e999": b'{"instances": [[1e999' + b", 1" * (D - 1) + b"]]}",
    "NaN": b'{"instances": [[NaN' + b", 1" * (D - 1) + b"]]}",
    "booleans among numbers": b'{"instances": [[true' + b", 1.5" * (D - 1) + b"]]}",
    "false": b'{"instances": [[false' + b", 1" * (D - 1) + b"]]}",
    "null": b'{"instances": [[null' + b", 1" * (D - 1) + b"]]}",
    "a string": b'{"instances": [["1"' + b", 1" * (D - 1) + b"]]}",
    "ragged": b'{"instances": [[1, 2], [1, 2, 3]]}',
    "flat": b'{"instances": [1, 2, 3]}',
    "3-D": b'{"instances": [[[1, 2]]]}',
    "empty batch": b'{"instances": []}',
    "empty row": b'{"instances": [[]]}',
    "too many rows": json.dumps({"instances": [[1.0] * D] * 11}).encode(),
    "duplicate keys": b'{"instances": [[1' + b", 1" * (D - 1) + b"]], \"instances\": [[2" + b", 2" * (D - 1)
                      + b"]]}",
    "instances not a list": b'{"instances": 5}',
    "UTF-8 BOM": b"\xef\xbb\xbf" + json.dumps({"instances": [[1.0] * D]}).encode(),
    "UTF-16": json.dumps({"instances": [[1.0] * D]}).encode("utf-16"),
    "not UTF-8": b'{"instances": [[\xff]]}',
    "truncated": b'{"instances": [[1, 2',
    "top-level array": b"[[1, 2]]",
    "sparse": b'{"indices": [[0, 3]], "values": [[1.5, 2]]}',
}


@pytest.mark.parametrize("name", BODIES)
def test_fast_json_decoding_gives_what_json_gives(name):
    assert outcome(BODIES[name], fast=True) == outcome(BODIES[name], fast=False)


def test_fast_json_decoding_of_random_numbers_is_exact():
    rng = np.random.default_rng(0)
    for trial in range(50):
        x = rng.standard_normal(D) * 10.0 ** rng.integers(-300, 300, D)
        digits = rng.integers(1, 25, D)
        text = ", ".join(f"{v:.{d}g}" if trial % 2 else repr(float(v)) for v, d in zip(x, digits))
        body = b'{"instances": [[' + text.encode() + b"]]}"
        fast = outcome(body, fast=True)
        assert fast[0] == "rows" and fast == outcome(body, fast=False)
    body = json.dumps({"instances": [[0.25] * D]}).encode()
    assert isinstance(decode_module._fast_loads(body)["instances"], np.ndarray)  # the fast path did run


# -- the direct routes --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def model(blobs):
    km = qkm.QKMeans(4, sparsity_level=2, n_factors=2, max_iter=5, random_state=0).fit(blobs[0])
    index = qkm.ClusterIndex(km, partition="model").fit(blobs[0], blobs[1])
    return Model.from_estimator(km, index=index)


class Counting:
    """ASGI wrapper counting the requests that reach FastAPI's own stack."""

    def __init__(self, app):
        self.app, self.calls = app, 0

    async def __call__(self, scope, receive, send):
        self.calls += scope["type"] == "http"
        await self.app(scope, receive, send)


def service_middleware(app):
    layer = app.middleware_stack
    while not isinstance(layer, ServiceMiddleware):
        layer = layer.app
    return layer


def requests_to_compare(rows):
    one = {"instances": rows[:1].tolist()}
    yield "/assign", {"json": one}
    yield "/search", {"json": one}
    yield "/search", {"json": {**one, "k": 3, "nprobe": 2}}
    yield "/search?k=2", {"json": {"instances": rows[:4].tolist()}}
    yield "/assign", {"content": rows[:3].astype("<f4").tobytes(),
                      "headers": {"Content-Type": "application/octet-stream", "X-Shape": f"3,{D}"}}
    yield "/search", {"content": npy_bytes(rows[:2]), "headers": {"Content-Type": "application/x-npy"}}
    yield "/assign", {"content": b'{"instances": [[1, 2]]}', "headers": {"Content-Type": "application/json"}}
    yield "/features", {"json": one}  # this model has no Nyström map: 404
    yield "/search", {"content": b'{"instances": [[NaN' + b", 1" * (D - 1) + b"]]}"}
    yield "/search", {"json": {**one, "k": 0}}
    yield "/search?k=2", {"json": {**one, "k": 2}}
    yield "/assign", {"content": b"x" * 5000}  # over max_body_bytes: 413
    yield "/assign", {"json": {"instances": [[1.0] * D] * 11}}  # over max_batch_rows: 413
    yield "/assign", {"content": b"{}", "headers": {"Content-Type": "text/csv"}}  # 415
    yield "/assign", {"content": b'{"instances": [[1, 2', "headers": {"Content-Type": "application/json"}}


def test_direct_routes_answer_as_fastapi_routing_does(model, blobs):
    rows = blobs[0][:20]
    app = create_app(model, model_name="m", max_batch_rows=10, max_body_bytes=4096)
    with TestClient(app) as client:
        middleware = service_middleware(app)
        assert set(middleware.direct_routes) == {"/assign", "/search", "/features"}
        inner = middleware.app = Counting(middleware.app)
        answers = []
        for direct in (True, False):
            if not direct:
                middleware.direct_routes = {}
            calls = inner.calls
            answers.append([])
            for path, kwargs in requests_to_compare(rows):
                r = client.post(path, **kwargs)
                answers[-1].append((path, r.status_code, r.content, sorted(r.headers.items())))
            assert (inner.calls == calls) if direct else (inner.calls > calls)  # the direct path ran, or not
        assert answers[0] == answers[1]
        statuses = {status for _, status, _, _ in answers[0]}
        assert {200, 400, 404, 413, 415} <= statuses
        metrics = client.get("/metrics").text
        for line in ('qkm_requests_total{endpoint="/search",status="200"}',
                     'qkm_requests_total{endpoint="/assign",status="413"}'):
            count = next(float(v.split()[-1]) for v in metrics.splitlines() if v.startswith(line))
            assert count % 2 == 0 and count >= 2  # as many from the direct path as from the router


def test_direct_routes_keep_api_key_and_missing_parts(blobs):
    km = qkm.KMeans(3, random_state=0).fit(blobs[0])
    with TestClient(create_app(Model.from_estimator(km), api_key="s3cret")) as client:
        row = {"instances": blobs[0][:1].tolist()}
        assert client.post("/assign", json=row).status_code == 401
        r = client.post("/assign", json=row, headers={"X-API-Key": "s3cret"})
        assert r.status_code == 200 and r.json()["labels"] == km.predict(blobs[0][:1]).tolist()
        r = client.post("/search", json=row, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 404 and "no search index" in r.json()["error"]
        assert client.get("/assign", headers={"X-API-Key": "s3cret"}).status_code == 405


def validated(X, fast, dtype, max_norm=1e6):
    """validate_rows of ``X``: (dtype, writeable, bytes) of the rows, or (status, message) of the error."""
    original = decode_module._plainly_valid
    if not fast:
        decode_module._plainly_valid = lambda *args: None
    try:
        Y = decode_module.validate_rows(X, D, 10, dtype, max_norm)
        return "rows", Y.dtype.str, Y.flags.c_contiguous, Y.flags.writeable, Y.tobytes()
    except RequestError as exc:
        return "error", exc.status, exc.message
    finally:
        decode_module._plainly_valid = original


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 1e300 as float32, on both paths
def test_fast_row_validation_gives_what_the_full_checks_give():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((3, D))
    read_only = np.frombuffer(base.astype("<f4").tobytes(), dtype="<f4").reshape(3, D)
    cases = [base, base.astype(np.float32), np.asfortranarray(base), base[:, ::-1], read_only,
             rng.integers(-5, 5, (2, D)), np.full((1, D), 1e5), np.full((1, D), 1e300), base * np.nan,
             np.where(base > 1, np.inf, base), base[:, :5], np.zeros((0, D)), np.zeros((11, D)), base > 0]
    for dtype in (np.float32, np.float64):
        for X in cases:
            assert validated(X, True, dtype) == validated(X, False, dtype)
    assert decode_module._plainly_valid(base, D, 10, np.float64, 1e6) is not None  # the fast path did run


def test_direct_routes_answer_a_bug_with_500_as_fastapi_does(model, blobs, monkeypatch):
    app = create_app(model, model_name="m")
    with TestClient(app, raise_server_exceptions=False) as client:
        middleware = service_middleware(app)
        service = app.state.service

        def broken(*args, **kwargs):
            raise RuntimeError("a bug")

        monkeypatch.setattr(service.backend, "search", broken)
        answers = []
        for routes in (dict(middleware.direct_routes), {}):
            middleware.direct_routes = routes
            r = client.post("/search", json={"instances": blobs[0][:1].tolist()})
            answers.append((r.status_code, r.content, sorted(r.headers.items())))
        assert answers[0] == answers[1] and answers[0][0] == 500
        assert b"a bug" not in answers[0][1]
        metrics = client.get("/metrics").text
        assert 'qkm_requests_total{endpoint="/search",status="500"} 2.0' in metrics


def test_direct_routes_read_chunked_bodies_and_disconnects_as_fastapi_does(model, blobs):
    import anyio

    app = create_app(model, model_name="m", max_body_bytes=4096)
    body = json.dumps({"instances": blobs[0][:2].tolist()}).encode()
    cases = [("/search", [body], False, b"k=2"), ("/search", [body[:7], b"", body[7:50], body[50:]], False, b"k=2"),
             ("/assign", [body[:10]], True, b""), ("/assign", [body[:3000], body[3000:] + b" " * 4096], False, b""),
             ("/assign", [body[:5], body[5:]], False, b"k=1&k=2")]
    with TestClient(app) as client:
        middleware = service_middleware(app)
        routes = dict(middleware.direct_routes)
        answers = []
        for direct in (routes, {}):
            middleware.direct_routes = direct
            answers.append([anyio.run(asgi_post, app, path, chunks, disconnect, query)
                            for path, chunks, disconnect, query in cases])
        assert answers[0] == answers[1]
        assert [status for status, _, _ in answers[0]] == [200, 200, 499, 413, 200]
        assert answers[0][0] == answers[0][1]  # one chunk or several: the same answer
        metrics = client.get("/metrics").text
        assert 'qkm_requests_total{endpoint="/assign",status="499"} 2.0' in metrics


def encoded(fields, fast):
    """encode_result(JSON) of ``fields``, or (status, message) of its error, with the plain-array path on or off."""
    from qkm.serve import encode as encode_module

    original = encode_module._plain_json
    if not fast:
        encode_module._plain_json = lambda fields: None
    try:
        return encode_module.encode_result("json", fields)
    except RequestError as exc:
        return "error", exc.status, exc.message
    finally:
        encode_module._plain_json = original


def test_fast_json_encoding_gives_what_the_wire_arrays_give():
    rng = np.random.default_rng(2)
    d = rng.standard_normal((3, 2)) * 10.0 ** rng.integers(-300, 300, (3, 2))
    cases = [[("indices", np.array([[5, 7]])), ("distances", np.array([[0.1, 1e-300]])),
              ("labels", np.array([[3, 250]], dtype=np.uint8))],
             [("sq_distances", d), ("labels", np.arange(3, dtype=np.int32))],
             [("features", (d[:, :1] * 0 + 1e3 / 3).astype(np.float32))], [("features", (d / d).astype(np.float16))],
             [("labels", np.array([2**64 - 1], dtype=np.uint64))], [("labels", np.array([-(2**63)]))],
             [("d", np.array([1.0, np.inf]))], [("d", np.array([np.nan], dtype=np.float32))],
             [("d", np.array([-0.0, 5e-324]))], [("labels", [1, 2])]]
    for fields in cases:
        assert encoded(fields, True) == encoded(fields, False)
