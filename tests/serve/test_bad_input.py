"""The bad-input catalogue: what a new user or a hostile client tries, and the clear answer each one gets.

Every case asserts the status (HTTP) or the exit status and one-line message (command line) or the exception
(model files), that nothing escapes as a 5xx or a traceback, and, for the service, that it still answers
afterwards. The rows of the bad-input table are the ``test_row_*`` functions (row 1, the wheel, is
``test_wheel.py``; row 2, the shipped model, ``test_model_file.py``; row 6 with the real client,
``test_oip_client.py``; the schema-driven fuzz, ``test_serve_fuzz.py``). This file holds the HTTP cases; the
command line is in ``test_bad_input_cli.py``, the model files and in-process rows in ``test_bad_input_files.py``.
"""

import asyncio
import io
import json
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.export import Model, load_model
from qkm.serve import create_app, demo_model_path
from test_serve_errors import D, JSON_CASES, NPY_CASES, OCTET_CASES, OIP_CASES, assert_error, npy_bytes

ROWS_ROUTES = ("/assign", "/search", "/features")
INFER = "/v2/models/m/infer"
ROW = [0.5] * D


@pytest.fixture(scope="module")
def model(blobs):
    km = qkm.QKMeans(4, sparsity_level=2, n_factors=2, max_iter=5, random_state=0).fit(blobs[0])
    return Model.from_estimator(km, index=qkm.ClusterIndex(km).fit(blobs[0], blobs[1]),
                                nystroem=qkm.Nystroem(n_components=4, landmarks=km).fit(blobs[0]))


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(model, model_name="m", max_batch_rows=10, max_body_bytes=64 * 1024),
                    raise_server_exceptions=False) as c:
        yield c


def assert_still_serving(client):
    for path in ROWS_ROUTES:
        r = client.post(path, json={"instances": [ROW, ROW]})
        assert r.status_code == 200, (path, r.text)
    body = {"inputs": [{"name": "X", "shape": [1, D], "datatype": "FP64", "data": ROW}]}
    assert client.post(INFER, json=body).status_code == 200


def assert_refused(response, status, *words):
    """A 4xx ``{"error": ...}`` naming the problem: never a 5xx, never a traceback or a non-standard JSON body."""
    assert 400 <= response.status_code < 500, response.text
    json.loads(response.content, parse_constant=lambda name: pytest.fail(f"{name} in a JSON body"))
    assert "Traceback" not in response.text and "internal error" not in response.text
    assert_error(response, status, *words)


# -- HTTP: rows on /assign, /search and /features ---------------------------------------------------------- #
#: Cases beyond those of test_serve_errors.py (rows 3, 4 and 5 of the issue and more): name -> (content type,
#: body, headers, status, words).
HUGE = 1e200
MORE_CASES = {
    "row 3: dense 1e308": ("application/json", json.dumps({"instances": [[1e308] * D]}), {}, 400, "numeric overflow"),
    "row 3: dense 1e200": ("application/json", json.dumps({"instances": [[HUGE] * D]}), {}, 400, "numeric overflow"),
    "row 3: sparse 1e308": ("application/json", json.dumps({"indices": [[0, 1]], "values": [[1e308, 1e308]]}), {},
                            400, "numeric overflow"),
    "row 3: sparse 1e200": ("application/json", json.dumps({"indices": [[3]], "values": [[HUGE]]}), {}, 400,
                            "numeric overflow"),
    "row 4: npy 1e308": ("application/x-npy", npy_bytes(np.full((1, D), 1e308)), {}, 400, "numeric overflow"),
    "row 4: npy 1e200, second row": ("application/x-npy", npy_bytes(np.array([ROW, [HUGE] * D])), {}, 400,
                                     "row 1"),
    "row 4: float32 max as npy": ("application/x-npy", npy_bytes(np.full((1, D), 3.4e38, np.float32)), {}, 200),
    "row 5: nested sparse indices": ("application/json", b'{"indices": [[[1]]], "values": [[1.0]]}', {}, 400,
                                     "flat list"),
    "row 5: nested sparse values": ("application/json", b'{"indices": [[1]], "values": [[[1.0]]]}', {}, 400,
                                    "flat list"),
    "booleans among numbers": ("application/json", json.dumps({"instances": [[True] + [0] * (D - 1)]}), {}, 400,
                               "booleans"),
    "sparse boolean value": ("application/json", b'{"indices": [[1]], "values": [[true]]}', {}, 400, "booleans"),
    "sparse index as string": ("application/json", b'{"indices": [["1"]], "values": [[1.0]]}', {}, 400,
                               "found strings"),
    "sparse huge index": ("application/json", b'{"indices": [[99999999999999999999999]], "values": [[1.0]]}', {},
                          400, "too large"),
    "content-length lies": ("application/json", json.dumps({"instances": [ROW]}), {"Content-Length": "x"}, 400,
                            "Content-Length"),
    "npy float16": ("application/x-npy", npy_bytes(np.ones((1, D), np.float16)), {}, 200),
    "npy complex": ("application/x-npy", npy_bytes(np.ones((1, D), np.complex128)), {}, 400, "integers or floats"),
    "npy version 3": ("application/x-npy", b"\x93NUMPY\x03\x00" + npy_bytes(np.ones((1, D)))[8:], {}, 400,
                      "malformed npy"),
    "binary -1 rows": ("application/octet-stream", b"", {"X-Shape": "-1,12"}, 400,
                       "non-negative"),
    "binary float32 max": ("application/octet-stream", np.full((1, D), 3.4e38, "<f4").tobytes(),
                           {"X-Shape": f"1,{D}"}, 200),
    "text/plain": ("text/plain", b"1,2,3", {}, 415, "Content-Type"),
}


def _catalogue():
    cases = {f"json {name}": ("application/json", body, {}, 400, *words)
             for name, (body, *words) in JSON_CASES.items()}
    cases.update({f"binary {name}": ("application/octet-stream", X.tobytes(), headers, 400, *words)
                  for name, (headers, X, *words) in OCTET_CASES.items()})
    cases.update({f"npy {name}": ("application/x-npy", body, {}, 400, *words) for name, (body, *words)
                  in NPY_CASES.items()})
    cases.update(MORE_CASES)
    return cases


CATALOGUE = _catalogue()


@pytest.mark.parametrize("route", ROWS_ROUTES)
@pytest.mark.parametrize("case", CATALOGUE)
def test_rows_catalogue(client, case, route):
    content_type, body, headers, status, *words = CATALOGUE[case]
    r = client.post(route, content=body, headers={"Content-Type": content_type, **headers})
    if status == 200:  # finite answers, or none
        assert r.status_code == 200, r.text
        if content_type == "application/x-npy":
            answer = np.load(io.BytesIO(r.content))
            for name in answer.dtype.names or [None]:
                values = answer[name] if name else answer
                assert np.isfinite(values).all() if values.dtype.kind == "f" else True
    else:
        assert_refused(r, status, *words)
    assert_still_serving(client)


def test_row_3_finite_answers_below_the_overflow_bound_are_right(client, model):
    """Values up to the bound (model-dependent) get exact answers: labels as a brute-force oracle gives them."""
    bound = client.app.state.service.max_row_norm
    rng = np.random.default_rng(1)
    V = model.operator.to_dense()
    for scale in (1e3, 1e50, 0.5 * bound / np.sqrt(D)):
        X = rng.standard_normal((8, D)) * scale
        out = client.post("/assign", json={"instances": X.tolist()}).json()
        np.testing.assert_array_equal(out["labels"], np.argmin(-2 * X @ V.T + (V**2).sum(axis=1), axis=1))
        assert np.isfinite(out["sq_distances"]).all()
        search = client.post("/search", json={"instances": X.tolist(), "k": 2}).json()
        assert np.isfinite(search["distances"]).all()


def test_row_4_float32_demo_model_refuses_rows_it_cannot_compute():
    """The demo model computes in float32: float32-representable rows can still overflow its products."""
    model = load_model(demo_model_path())
    with TestClient(create_app(model)) as c:
        X = np.full((1, 784), 3e38, "<f4")
        for route in ROWS_ROUTES:
            r = c.post(route, content=X.tobytes(), headers={"Content-Type": "application/octet-stream",
                                                           "X-Shape": "1,784"})
            assert_refused(r, 400, "numeric overflow", "float32")
            r = c.post(route, content=npy_bytes(X), headers={"Content-Type": "application/x-npy"})
            assert_refused(r, 400, "numeric overflow")
        assert c.post("/assign", json={"instances": [[1.0] * 784]}).status_code == 200


# -- HTTP: Open Inference Protocol v2 -------------------------------------------------------------------------- #
def tensor(data=None, datatype="FP64", shape=(1, D), **extra):
    out = {"name": "X", "shape": list(shape), "datatype": datatype, **extra}
    if data is not None:
        out["data"] = data
    return out


HEAD = json.dumps({"inputs": [tensor(datatype="FP32", parameters={"binary_data_size": 4 * D})]}).encode()
RAW = np.ones(D, "<f4").tobytes()
OIP_MORE = {
    "row 7: INT8 1000": ({"inputs": [tensor([1000] + [0] * (D - 1), "INT8")]}, None, 400, "1000", "INT8"),
    "row 7: UINT8 -1": ({"inputs": [tensor([-1] + [0] * (D - 1), "UINT8")]}, None, 400, "-1", "UINT8"),
    "row 7: INT32 with fractions": ({"inputs": [tensor([0.5] * D, "INT32")]}, None, 400, "integers"),
    "row 7: FP32 1e300": ({"inputs": [tensor([1e300] + [0] * (D - 1), "FP32")]}, None, 400, "FP32"),
    "row 7: FP16 1e5": ({"inputs": [tensor([1e5] + [0] * (D - 1), "FP16")]}, None, 400, "FP16"),
    "row 7: FP64 overflow": ({"inputs": [tensor([1e200] * D)]}, None, 400, "numeric overflow"),
    "BOOL": ({"inputs": [tensor([1] * D, "BOOL")]}, None, 400, "datatype"),
    "booleans in FP32 data": ({"inputs": [tensor([True] * D, "FP32")]}, None, 400, "booleans"),
    "string data": ({"inputs": [tensor(["1"] * D, "FP32")]}, None, 400, "strings"),
    "classification": ({"inputs": [tensor(ROW)], "outputs": [{"name": "label", "parameters": {
        "classification": 3}}]}, None, 400, "classification"),
    "binary_data_output not a boolean": ({"inputs": [tensor(ROW)], "parameters": {"binary_data_output": "yes"}},
                                         None, 400, "binary_data_output"),
    "parameters not an object": ({"inputs": [tensor(ROW, parameters=[1])]}, None, 400, "parameters"),
    "binary size not an integer": ({"inputs": [tensor(parameters={"binary_data_size": "4"})]}, None, 400,
                                   "binary_data_size"),
    "binary data missing": ({"inputs": [tensor(datatype="FP32", parameters={"binary_data_size": 4 * D})]}, None,
                            400, "binary part"),
    # raw bodies: (body bytes, Inference-Header-Content-Length)
    "binary: header length beyond the body": (HEAD + RAW, str(len(HEAD + RAW) + 1), 400, "Inference-Header"),
    "binary: header length not a number": (HEAD + RAW, "abc", 400, "Inference-Header"),
    "binary: header length cuts the JSON": (HEAD + RAW, str(len(HEAD) - 3), 400, "malformed JSON"),
    "binary: too few bytes": (HEAD + RAW[:-4], str(len(HEAD)), 400, "binary part"),
    "binary: size does not match the shape": (
        json.dumps({"inputs": [tensor(datatype="FP32", parameters={"binary_data_size": 8})]}).encode() + RAW[:8],
        None, 400, "needs 48"),
    "binary: data and binary": (json.dumps({"inputs": [tensor(ROW, "FP32", parameters={
        "binary_data_size": 4 * D})]}).encode() + RAW, None, 400, "both"),
    "binary: NaN": (HEAD + np.full(D, np.nan, "<f4").tobytes(), str(len(HEAD)), 400, "NaN"),
}


def _oip_request(body, header_length):
    if isinstance(body, dict):
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is None:  # the JSON is the first line
        header_length = str(body.index(b"}]}") + 3)
    headers["Inference-Header-Content-Length"] = header_length
    return body, headers


@pytest.mark.parametrize("case", [*OIP_CASES, *OIP_MORE])
def test_oip_infer_catalogue(client, case):
    if case in OIP_CASES:
        (body, *words), header_length, status = OIP_CASES[case], None, 400
    else:
        body, header_length, status, *words = OIP_MORE[case]
    content, headers = _oip_request(body, header_length)
    assert_refused(client.post(INFER, content=content, headers=headers), status, *words)
    assert_still_serving(client)


def test_row_6_binary_tensor_data_and_model_config(client, model):
    """What tritonclient.http sends by default: the JSON, then raw tensors; binary outputs back."""
    X = np.random.default_rng(0).random((3, D)).astype("<f4")
    head = json.dumps({"inputs": [{"name": "X", "shape": [3, D], "datatype": "FP32",
                                   "parameters": {"binary_data_size": X.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    r = client.post(INFER, content=head + X.tobytes(), headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    meta = json.loads(r.content[:n])
    sizes = [o["parameters"]["binary_data_size"] for o in meta["outputs"]]
    labels = np.frombuffer(r.content[n:n + sizes[0]], "<i8")
    distances = np.frombuffer(r.content[n + sizes[0]:], "<f8")
    expected = model.assign(X)
    np.testing.assert_array_equal(labels, expected[0])
    np.testing.assert_allclose(distances, expected[1], rtol=1e-6)
    config = client.get("/v2/models/m/config").json()
    assert config["input"][0]["dims"] == [D] and config["max_batch_size"] == 10
    assert "binary_tensor_data" in client.get("/v2").json()["extensions"]
    assert_refused(client.get("/v2/models/other/config"), 404, "unknown model")


def test_row_7_every_oip_answer_is_standard_json(client):
    body = {"inputs": [tensor([1e150] * D)]}  # large but computable: finite numbers in standard JSON
    r = client.post(INFER, json=body)
    assert r.status_code == 200
    out = json.loads(r.content, parse_constant=lambda name: pytest.fail(name))
    assert all(np.isfinite(o["data"]).all() for o in out["outputs"])


# -- HTTP: limits and routes --------------------------------------------------------------------------------- #
def test_row_12_in_flight_limit_holds_for_inline_answers(model):
    """10 one-row requests at once on max_in_flight=4: 4 answered, 6 refused with 503 + Retry-After."""
    app = create_app(model, max_in_flight=4)
    app.state.service.warm_up()
    body = json.dumps({"instances": [ROW]}).encode()
    assert len(body) <= app.state.service.settings.inline_body_bytes  # answered inline on the event loop

    async def one_request():
        sent, received = [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return received.pop(0) if received else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/assign", "raw_path": b"/assign", "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
        await app(scope, receive, send)
        return sent[0]["status"], dict(sent[0]["headers"])

    async def burst():
        return await asyncio.gather(*(one_request() for _ in range(10)))

    answers = asyncio.run(burst())
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 4 + [503] * 6
    assert all(headers[b"retry-after"] == b"1" for status, headers in answers if status == 503)
    assert app.state.service.in_flight.count == 0
    assert asyncio.run(one_request())[0] == 200  # and it answers afterwards


OPEN_ROUTES = {"/readyz", "/v2/health/ready"}  # no API key: no 401
EXPECTED_STATUSES = {  # route -> statuses it documents (beyond 200); 401 and 500 everywhere behind the key
    ("post", "/assign"): {"400", "413", "415", "503"},
    ("post", "/search"): {"400", "404", "413", "415", "503"},
    ("post", "/features"): {"400", "404", "413", "415", "503"},
    ("get", "/readyz"): {"503"},
    ("get", "/v2/health/ready"): {"503"},
    ("get", "/v2/models/{model_name}"): {"404"},
    ("get", "/v2/models/{model_name}/ready"): {"404", "503"},
    ("get", "/v2/models/{model_name}/config"): {"404"},
    ("post", "/v2/models/{model_name}/infer"): {"400", "404", "413", "415", "503"},
    ("get", "/model"): set(), ("get", "/metrics"): set(), ("get", "/v2"): set(),
}


def test_row_14_docs_examples_are_valid_requests_and_every_status_is_documented(client):
    spec = client.get("/openapi.json").json()
    for (method, path), statuses in EXPECTED_STATUSES.items():
        documented = set(spec["paths"][path][method]["responses"])
        assert {"200", *statuses, *(() if path in OPEN_ROUTES else ("401", "500"))} <= documented, (path, documented)
    for path in ROWS_ROUTES:
        content = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        for name, example in content["examples"].items():
            assert len(example["value"].get("instances", [ROW])[0]) == D
            r = client.post(path, json=example["value"])
            assert r.status_code == 200, (path, name, r.text)
    infer = spec["paths"]["/v2/models/{model_name}/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert client.post(INFER, json=infer["example"]).status_code == 200
    assert_refused(client.get("/v2/models/other/ready"), 404, "unknown model")


def test_row_10_metrics_come_from_prometheus_client(client):
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    assert isinstance(client.app.state.service.metrics.registry, CollectorRegistry)
    client.post("/assign", json={"instances": [ROW]})
    r = client.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {"qkm_requests", "qkm_request_duration_seconds", "qkm_rows", "qkm_batch_rows", "qkm_in_flight_requests",
            "qkm_model_info", "process_cpu_seconds"} <= set(families)
    assert families["qkm_request_duration_seconds"].type == "histogram"
    r = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text") and r.text.endswith("# EOF\n")
