"""Bad input, limits, overload and API keys: the right 4xx/503 with ``{"error": ...}``, never a 500, and the
service keeps answering afterwards."""

import logging
import threading
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette asks for "httpx2"; the httpx TestClient still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.export import Model
from qkm.serve import create_app
from support import npy_bytes

D = 12
ROW = [0.5] * D
GOOD = {"instances": [ROW, ROW]}
OCTET = "application/octet-stream"


@pytest.fixture(scope="module")
def model(blobs):
    km = qkm.QKMeans(4, sparsity_level=2, n_factors=2, max_iter=5, random_state=0).fit(blobs[0])
    index = qkm.ClusterIndex(km, partition="model").fit(blobs[0], blobs[1])  # nprobe in [1, K]
    return Model.from_estimator(km, index=index)


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(model, model_name="m", max_batch_rows=10, max_body_bytes=4096)) as c:
        yield c




def assert_error(response, status, *words):
    assert response.status_code == status, response.text
    message = response.json()["error"]
    for word in words:
        assert word in message, message


def assert_still_serving(client):
    r = client.post("/assign", json=GOOD)
    assert r.status_code == 200 and len(r.json()["labels"]) == 2


JSON_CASES = {
    "wrong feature count": (b'{"instances": [[1, 2, 3]]}', "3 features", "expecting 12"),
    "NaN": (b'{"instances": [[NaN' + b", 1" * (D - 1) + b"]]}", "1 NaN"),
    "infinity": (b'{"instances": [[1e999' + b", 1" * (D - 1) + b"]]}", "infinite"),
    "ragged rows": (b'{"instances": [[1, 2], [1, 2, 3]]}', "ragged", "2, 3"),
    "strings": (b'{"instances": [["a", "b"]]}', "numbers", "strings"),
    "booleans": (b'{"instances": [[true, false]]}', "booleans"),
    "null": (b'{"instances": [[null, 1]]}', "list of rows"),
    "huge integer": (b'{"instances": [[' + b"9" * 400 + b"]]}", "too large"),
    "one flat row": (b'{"instances": [1, 2, 3]}', "2-D", "[[x1, x2, ...]]"),
    "3-D": (b'{"instances": [[[1, 2]]]}', "2-D"),
    "empty batch": (b'{"instances": []}', "empty batch"),
    "empty row": (b'{"instances": [[]]}', "0 feature"),
    "instances not a list": (b'{"instances": 5}', "list of rows"),
    "no rows key": (b'{"rows": [[1]]}', "'instances'", "'indices'"),
    "truncated JSON": (b'{"instances": [[1, 2', "malformed JSON"),
    "not UTF-8": (b'{"instances": [[\xff]]}', "malformed JSON", "UTF-8"),
    "top-level array": (b"[[1, 2]]", "must be an object"),
    "deep nesting": (b"[" * 2000 + b"]" * 2000, "malformed JSON", "nested too deeply"),
    "sparse negative index": (b'{"indices": [[-1]], "values": [[1.0]]}', "index -1", "row 0", "out of range"),
    "sparse index out of range": (b'{"indices": [[0], [12]], "values": [[1], [2]]}', "index 12", "row 1"),
    "sparse repeated index": (b'{"indices": [[3, 3]], "values": [[1, 2]]}', "repeats column index 3"),
    "sparse length mismatch": (b'{"indices": [[1, 2]], "values": [[1]]}', "2 indices but 1 values"),
    "sparse row count mismatch": (b'{"indices": [[1], [2]], "values": [[1]]}', "2 rows", "1"),
    "sparse float indices": (b'{"indices": [[1.5]], "values": [[1]]}', "integer column indices"),
    "sparse values only": (b'{"values": [[1]]}', "both 'indices' and 'values'"),
    "sparse NaN value": (b'{"indices": [[1]], "values": [[NaN]]}', "NaN"),
    "sparse empty batch": (b'{"indices": [], "values": []}', "empty batch"),
}


@pytest.mark.parametrize("case", JSON_CASES)
def test_bad_json_rows_give_400_naming_the_problem(client, case):
    body, *words = JSON_CASES[case]
    for path in ("/assign", "/search"):
        assert_error(client.post(path, content=body, headers={"Content-Type": "application/json"}), 400, *words)
    assert_still_serving(client)


OCTET_CASES = {
    "no X-Shape": ({}, np.zeros((2, D), "<f4"), "X-Shape: B,D"),
    "bad X-Shape": ({"X-Shape": "two,12"}, np.zeros((2, D), "<f4"), "two non-negative integers"),
    "X-Shape with 3 parts": ({"X-Shape": "2,3,2"}, np.zeros((2, D), "<f4"), "two non-negative integers"),
    "wrong feature count": ({"X-Shape": "2,11"}, np.zeros((2, 11), "<f4"), "11 features", "expects 12"),
    "size does not match": ({"X-Shape": "3,12"}, np.zeros((2, D), "<f4"), "needs 144"),
    "empty batch": ({"X-Shape": "0,12"}, np.zeros((0, D), "<f4"), "empty batch"),
    "NaN": ({"X-Shape": "2,12"}, np.full((2, D), np.nan, "<f4"), "24 NaN"),
}


@pytest.mark.parametrize("case", OCTET_CASES)
def test_bad_binary_rows_give_400(client, case):
    headers, X, *words = OCTET_CASES[case]
    r = client.post("/assign", content=X.tobytes(), headers={"Content-Type": OCTET, **headers})
    assert_error(r, 400, *words)
    assert_still_serving(client)


NPY_CASES = {
    "garbage": (b"not an npy file at all", "malformed npy"),
    "truncated": (npy_bytes(np.zeros((2, D)))[:-8], "malformed npy", "bytes of data follow"),
    "object array (pickle)": (npy_bytes(np.array([[object()] * D], dtype=object), allow_pickle=True),
                              "integers or floats"),
    "structured array": (npy_bytes(np.zeros(2, dtype=[("a", "f8")])), "integers or floats"),
    "strings": (npy_bytes(np.array([["a"] * D])), "integers or floats"),
    "1-D": (npy_bytes(np.zeros(D)), "2-D", "reshape(1, -1)"),
    "3-D": (npy_bytes(np.zeros((1, 2, D))), "2-D"),
    "wrong feature count": (npy_bytes(np.zeros((2, 5))), "5 features"),
    "inf": (npy_bytes(np.full((1, D), np.inf)), "infinite"),
    "header lies about the size": (npy_bytes(np.zeros((2, D)))[:128].replace(b"(2, 12)", b"(9, 12)")
                                   + np.zeros((2, D)).tobytes(), "malformed npy"),
}


@pytest.mark.parametrize("case", NPY_CASES)
def test_bad_npy_gives_400(client, case):
    body, *words = NPY_CASES[case]
    assert_error(client.post("/assign", content=body, headers={"Content-Type": "application/x-npy"}), 400, *words)
    assert_still_serving(client)


@pytest.mark.parametrize("query, words", [
    ("k=0", ["k=0", "out of range"]), ("k=abc", ["k must be an integer"]), ("k=100000", ["out of range"]),
    ("nprobe=0", ["nprobe=0"]), ("nprobe=5", ["nprobe=5", "[1, 4]"]), ("k=2.5", ["integer"]),
])
def test_bad_search_parameters_give_400(client, query, words):
    assert_error(client.post(f"/search?{query}", json=GOOD), 400, *words)
    assert_error(client.post("/search", json={**GOOD, "k": True}), 400, "k must be an integer")
    assert client.post("/search?k=3&nprobe=4", json=GOOD).status_code == 200


OIP_CASES = {
    "no inputs": ({"inputs": []}, "non-empty list"),
    "shape of 1 dim": ({"inputs": [{"name": "X", "shape": [D], "datatype": "FP32", "data": ROW}]}, "shape"),
    "negative shape": ({"inputs": [{"name": "X", "shape": [-1, D], "datatype": "FP32", "data": ROW}]}, "shape"),
    "wrong feature count": ({"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]},
                            "3 features"),
    "data size": ({"inputs": [{"name": "X", "shape": [2, D], "datatype": "FP32", "data": ROW}]}, "holds 12 values"),
    "BYTES": ({"inputs": [{"name": "X", "shape": [1, D], "datatype": "BYTES", "data": ROW}]}, "datatype"),
    "two inputs, none named X": ({"inputs": [{"name": "a"}, {"name": "b"}]}, "one input, 'X'"),
    "unknown output": ({"inputs": [{"name": "X", "shape": [1, D], "datatype": "FP32", "data": ROW}],
                        "outputs": [{"name": "scores"}]}, "'outputs'"),
    "NaN data": ({"inputs": [{"name": "X", "shape": [1, D], "datatype": "FP64", "data": [float("nan")] * D}]},
                 "NaN"),
}


@pytest.mark.parametrize("case", OIP_CASES)
def test_bad_oip_requests_give_400(client, case):
    import json

    body, *words = OIP_CASES[case]
    r = client.post("/v2/models/m/infer", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert_error(r, 400, *words)
    assert_still_serving(client)


def test_oip_unknown_model_and_content_type(client):
    assert_error(client.post("/v2/models/other/infer", json={"inputs": []}), 404, "unknown model")
    r = client.post("/v2/models/m/infer", content=b"x", headers={"Content-Type": OCTET, "X-Shape": "1,12"})
    assert_error(r, 400, "Inference-Header-Content-Length")  # binary tensor data needs its JSON's length
    r = client.post("/v2/models/m/infer", content=b"x", headers={"Content-Type": "application/x-npy"})
    assert_error(r, 415, "application/json")


def test_unsupported_content_type_gives_415(client):
    r = client.post("/assign", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert_error(r, 415, "application/json", "application/x-npy")
    assert_still_serving(client)


def test_routing_errors_are_json(client):
    assert_error(client.get("/assign"), 405, "Method Not Allowed")
    assert_error(client.get("/no/such/route"), 404, "Not Found")


# -- size limits ------------------------------------------------------------------------ #
def test_body_over_the_limit_gives_413_from_content_length(client):
    body = b'{"instances": [' + b",".join([b"[" + b", ".join([b"0.25"] * D) + b"]"] * 200) + b"]}"
    assert len(body) > 4096
    assert_error(client.post("/assign", content=body, headers={"Content-Type": "application/json"}),
                 413, f"{len(body)} bytes", "max_body_bytes=4096")
    assert_still_serving(client)


def test_streamed_body_over_the_limit_gives_413(client):
    sent = []

    def chunks():  # no Content-Length: chunked transfer encoding
        for _ in range(100):
            sent.append(1)
            yield b" " * 1000

    r = client.post("/assign", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "exceeds max_body_bytes=4096")
    assert_still_serving(client)


def test_streamed_body_under_the_limit_is_accepted(client):
    import json

    body = json.dumps(GOOD).encode()
    r = client.post("/assign", content=(body[i:i + 10] for i in range(0, len(body), 10)),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and len(r.json()["labels"]) == 2


async def asgi_post(app, path, chunks, disconnect=False, query=b""):
    """POST to the ASGI ``app`` with a body sent in ``chunks`` (then a disconnect, if asked), no server between:
    ``(status, sorted headers, body)`` of the answer."""
    messages = [{"type": "http.request", "body": c, "more_body": i + 1 < len(chunks) or disconnect}
                for i, c in enumerate(chunks)]
    if disconnect:
        messages.append({"type": "http.disconnect"})
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query,
             "headers": [(b"host", b"t"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await app(scope, receive, send)
    return sent[0]["status"], sorted(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_client_hanging_up_mid_body_is_counted_as_499(model):
    import asyncio

    app = create_app(model)
    assert asyncio.run(asgi_post(app, "/assign", [b'{"instances": [[1,'], disconnect=True))[0] == 499
    assert 'qkm_requests_total{endpoint="/assign",status="499"} 1.0' in app.state.service.metrics.render()[0].decode()


def test_too_many_rows_gives_413(client):
    assert_error(client.post("/assign", json={"instances": [ROW] * 11}), 413, "11 rows", "max_batch_rows=10")
    assert_error(client.post("/assign", json={"indices": [[0]] * 11, "values": [[1]] * 11}), 413, "11 rows")
    # binary: refused from the X-Shape header alone
    r = client.post("/assign", content=b"", headers={"Content-Type": OCTET, "X-Shape": "11,12"})
    assert_error(r, 413, "11 rows")
    r = client.post("/assign", content=npy_bytes(np.zeros((11, D), np.float32)),
                    headers={"Content-Type": "application/x-npy"})
    assert_error(r, 413, "11 rows")
    assert_still_serving(client)


# -- overload ---------------------------------------------------------------------------- #
def test_overload_gives_503_with_retry_after(model):
    app = create_app(model, max_in_flight=2, inference_threads=1, inline_body_bytes=0)  # slow work: in the pool
    service = app.state.service
    release, entered = threading.Event(), threading.Semaphore(0)
    assign = service.backend.assign

    def slow_assign(X):
        entered.release()
        assert release.wait(30)
        return assign(X)

    with TestClient(app) as client:
        service.backend.assign = slow_assign
        results = []
        workers = [threading.Thread(target=lambda: results.append(client.post("/assign", json=GOOD)))
                   for _ in range(2)]
        for w in workers:
            w.start()
        assert entered.acquire(timeout=30)  # one computing, the other admitted and waiting for the thread
        for _ in range(200):
            if service.in_flight.count == 2:
                break
            threading.Event().wait(0.01)
        assert service.in_flight.count == 2
        r = client.post("/assign", json=GOOD)
        assert_error(r, 503, "server busy", "max_in_flight=2")
        assert r.headers["retry-after"] == "1"
        assert client.get("/healthz").status_code == 200  # probes are not gated
        release.set()
        for w in workers:
            w.join(30)
        assert [x.status_code for x in results] == [200, 200]
        assert service.in_flight.count == 0
        assert_still_serving(client)
        metrics = client.get("/metrics").text
        assert 'qkm_requests_total{endpoint="/assign",status="503"} 1.0' in metrics


def test_unexpected_failure_gives_500_json_and_the_server_recovers(model):
    app = create_app(model)
    with TestClient(app, raise_server_exceptions=False) as client:
        service = app.state.service
        assign = service.backend.assign
        service.backend.assign = lambda X: 1 / 0
        r = client.post("/assign", json=GOOD)
        assert r.status_code == 500 and r.json() == {"error": "internal error; see the server log."}
        service.backend.assign = assign
        assert_still_serving(client)


# -- API key ------------------------------------------------------------------------------ #
def test_api_key(model, caplog):
    secret = "s3cret-key-123"
    marker = 0.123456789
    with TestClient(create_app(model, api_key=secret)) as client, caplog.at_level(logging.DEBUG):
        body = {"instances": [[marker] * D]}
        assert_error(client.post("/assign", json=body), 401, "API key")
        r = client.post("/assign", json=body, headers={"Authorization": "Bearer wrong"})
        assert_error(r, 401, "API key")
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert_error(client.get("/model"), 401)
        assert_error(client.get("/metrics"), 401)
        assert client.post("/assign", json=body, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        assert client.post("/assign", json=body, headers={"X-API-Key": secret}).status_code == 200
        bad = client.post("/assign", json={"instances": [[marker]]}, headers={"X-API-Key": secret})
        assert_error(bad, 400, "1 features")
        assert str(marker) not in bad.text
        for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/openapi.json", "/docs"):
            assert client.get(path).status_code == 200, path
        metrics = client.get("/metrics", headers={"X-API-Key": secret}).text
        assert 'qkm_requests_total{endpoint="/assign",status="401"} 2' in metrics
        assert 'qkm_requests_total{endpoint="/model",status="401"} 1' in metrics
    assert secret not in caplog.text and str(marker) not in caplog.text
