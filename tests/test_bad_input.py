"""The bad-input catalogue: what a new user or a hostile client tries, and the clear answer each one gets.

Every case asserts the status (HTTP) or the exit status and one-line message (command line) or the exception
(model files), that nothing escapes as a 5xx or a traceback, and, for the service, that it still answers
afterwards. The rows of the table in issue 15 are the ``test_row_*`` functions (row 1, the wheel, is
``test_wheel.py``; row 2, the shipped model, ``test_model_file.py``; row 6 with the real client,
``test_oip_client.py``; the schema-driven fuzz, ``test_serve_fuzz.py``).
"""

import asyncio
import io
import json
import os
import signal
import stat
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.cli import main
from qkm.export import Model, ModelFormatError, load_model, save_model
from qkm.export._model import content_checksum
from qkm.export._safe import header_checksum
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


# -- command line ---------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    X = np.random.default_rng(0).random((30, 4))
    np.save(d / "X.npy", X)
    (d / "empty.npy").write_bytes(b"")
    (d / "empty.csv").write_text("")
    np.savetxt(d / "nan.csv", np.where(np.arange(120).reshape(30, 4) == 5, np.nan, X), delimiter=",")
    np.save(d / "inf.npy", np.where(np.arange(120).reshape(30, 4) == 7, np.inf, X))
    np.save(d / "oned.npy", X[:, 0])
    data = (d / "X.npy").read_bytes()
    (d / "truncated.npy").write_bytes(data[:len(data) // 2])
    (d / "malformed.csv").write_text("1,2,3,4\n5,6,x,8\n")
    (d / "garbage.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(d / "object.npy", np.array([[object()]] * 3, dtype=object), allow_pickle=True)
    np.save(d / "strings.npy", np.array([["a"] * 4] * 3))
    np.save(d / "no_rows.npy", np.zeros((0, 4)))
    np.save(d / "no_columns.npy", np.zeros((5, 0)))
    np.save(d / "same_rows.npy", np.ones((5, 4)))
    np.savez(d / "no_X.npz", Z=X)
    (d / "a_dir").mkdir()
    save_model(qkm.KMeans(2, random_state=0).fit(X), d / "m.qkm")
    return d


CLI_CASES = {
    "missing file": (["train", "missing.npy", "-k", "2", "-o", "o.qkm"], "No such file"),
    "empty npy": (["train", "empty.npy", "-k", "2", "-o", "o.qkm"], "empty.npy", "cannot be read"),
    "empty csv": (["train", "empty.csv", "-k", "2", "-o", "o.qkm"], "empty.csv", "no rows"),
    "NaN": (["train", "nan.csv", "-k", "2", "-o", "o.qkm"], "1 NaN"),
    "inf": (["train", "inf.npy", "-k", "2", "-o", "o.qkm"], "1 infinite"),
    "1-D": (["train", "oned.npy", "-k", "2", "-o", "o.qkm"], "1-D", "2-D"),
    "truncated": (["train", "truncated.npy", "-k", "2", "-o", "o.qkm"], "truncated.npy", "cannot be read"),
    "malformed csv": (["train", "malformed.csv", "-k", "2", "-o", "o.qkm"], "line 2", "'x' is not a number"),
    "garbage npy": (["train", "garbage.npy", "-k", "2", "-o", "o.qkm"], "garbage.npy"),
    "object npy": (["train", "object.npy", "-k", "2", "-o", "o.qkm"], "object.npy"),
    "strings": (["train", "strings.npy", "-k", "2", "-o", "o.qkm"], "non-numeric"),
    "no rows": (["train", "no_rows.npy", "-k", "2", "-o", "o.qkm"], "no rows"),
    "no columns": (["train", "no_columns.npy", "-k", "2", "-o", "o.qkm"], "0 feature"),
    "npz without X": (["train", "no_X.npz", "-k", "2", "-o", "o.qkm"], "'X'"),
    "data is a directory": (["train", "a_dir", "-k", "2", "-o", "o.qkm"], "a_dir"),
    "K = 0": (["train", "X.npy", "-k", "0", "-o", "o.qkm"], "n_clusters=0"),
    "K < 0": (["train", "X.npy", "-k", "-3", "-o", "o.qkm"], "n_clusters=-3"),
    "K > rows": (["train", "X.npy", "-k", "31", "-o", "o.qkm"], "30 distinct", "-k 30"),
    "K > distinct rows": (["train", "same_rows.npy", "-k", "3", "-o", "o.qkm"], "1 distinct"),
    "output is a directory": (["train", "X.npy", "-k", "2", "-o", "a_dir"], "a_dir is a directory"),
    "output in a missing directory": (["train", "X.npy", "-k", "2", "-o", "nowhere/o.qkm"], "does not exist"),
    "init of the wrong shape": (["train", "X.npy", "-k", "2", "--init", "oned.npy", "-o", "o.qkm"], "2-D"),
    "sparsity level 0": (["train", "X.npy", "-k", "2", "--algorithm", "qkmeans", "--sparsity-level", "0",
                          "-o", "o.qkm"], "sparsity_level"),
    "predict: missing model": (["predict", "missing.qkm", "X.npy"], "No such file"),
    "predict: model is a directory": (["predict", "a_dir", "X.npy"], "a_dir"),
    "predict: data as model": (["predict", "X.npy", "X.npy"], "not a qkm model file"),
    "predict: wrong width": (["predict", "m.qkm", "oned.npy"], "oned.npy"),
    "export: missing model": (["export", "missing.qkm", "-o", "x.onnx"], "No such file"),
    "serve: model is a directory": (["serve", "a_dir", "--port", "0"], "a_dir"),
}


def run_cli(argv, cwd, monkeypatch, capsys):
    monkeypatch.chdir(cwd)
    status = main(argv)
    return status, capsys.readouterr().err


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_catalogue(cli_dir, case, monkeypatch, capsys):
    argv, *words = CLI_CASES[case]
    before = (cli_dir / "m.qkm").read_bytes()
    status, err = run_cli(argv, cli_dir, monkeypatch, capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qkm {argv[0]}: error: "), err
    for word in words:
        assert word in err, err
    assert not (cli_dir / "o.qkm").exists() and (cli_dir / "m.qkm").read_bytes() == before
    assert not [p for p in os.listdir(cli_dir) if p.endswith(".tmp")]


def test_cli_bad_option_value_is_argparse_usage(cli_dir, monkeypatch, capsys):
    monkeypatch.chdir(cli_dir)
    with pytest.raises(SystemExit) as exc:
        main(["train", "X.npy", "-k", "abc", "-o", "o.qkm"])
    assert exc.value.code == 2 and "invalid int value: 'abc'" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_row_11_written_files_follow_the_umask(cli_dir, umask, monkeypatch, capsys):
    previous = os.umask(umask)
    try:
        status, err = run_cli(["train", "X.npy", "-k", "2", "--seed", "0", "-q", "-o", "u.qkm", "--labels",
                               "u.txt"], cli_dir, monkeypatch, capsys)
        assert status == 0, err
        for name in ("u.qkm", "u.txt"):
            assert stat.S_IMODE(os.stat(cli_dir / name).st_mode) == 0o666 & ~umask
        os.chmod(cli_dir / "u.qkm", 0o600)  # a file the user restricted keeps its mode when replaced
        assert run_cli(["train", "X.npy", "-k", "3", "-q", "-o", "u.qkm"], cli_dir, monkeypatch, capsys)[0] == 0
        assert stat.S_IMODE(os.stat(cli_dir / "u.qkm").st_mode) == 0o600
    finally:
        os.umask(previous)
        for name in ("u.qkm", "u.txt"):
            (cli_dir / name).unlink(missing_ok=True)


def test_row_13_thread_tests_skip_when_numba_has_fewer_threads(monkeypatch):
    import numba

    import conftest

    class Item:
        def get_closest_marker(self, name):
            return pytest.mark.needs_threads(2).mark if name == "needs_threads" else None

    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    with pytest.raises(pytest.skip.Exception, match="needs 2 numba threads; NUMBA_NUM_THREADS=1"):
        conftest.pytest_runtest_setup(Item())
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    conftest.pytest_runtest_setup(Item())  # runs


@pytest.mark.slow
def test_row_15_ctrl_c_during_train_is_one_line_and_status_130(tmp_path):
    X = np.random.default_rng(0).random((20000, 40))
    np.save(tmp_path / "X.npy", X)
    save_model(qkm.KMeans(2, random_state=0).fit(X[:50]), tmp_path / "keep.qkm")
    before = (tmp_path / "keep.qkm").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "qkm.cli", "train", "X.npy", "-k", "60", "--max-iter", "1000",
                             "--tol", "0", "-v", "-o", "keep.qkm"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a user's Ctrl-C meets SIGINT at its default; a test run started in the background
                            # (`make test &`) would hand down SIG_IGN, and python keeps an ignored SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = []
        for line in proc.stderr:  # training has started once an iteration is reported
            seen.append(line)
            if "iteration=" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "qkm train: interrupted, nothing written"
    assert (tmp_path / "keep.qkm").read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# -- model files ----------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def model_file(tmp_path_factory, blobs):
    path = tmp_path_factory.mktemp("model") / "m.qkm"
    save_model(qkm.KMeans(3, random_state=0).fit(blobs[0][:60, :4]), path)
    return path


def _entries(path):
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def _zip(entries, **kwargs):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", **kwargs) as zf:
        for name, blob in entries.items():
            zf.writestr(name, blob)
    return buf.getvalue()


def _edit_header(data, edit, reseal=False):
    entries = _entries(io.BytesIO(data))
    header = json.loads(entries["header.json"])
    edit(header)
    if reseal:
        header["checksum"] = header_checksum(header)
    entries["header.json"] = json.dumps(header).encode()
    return _zip(entries)


def _set(path, value):
    def edit(header):
        *keys, last = path
        target = header
        for key in keys:
            target = target[key]
        target[last] = value
    return edit


CORRUPTIONS = {  # name -> (bytes of the good file -> damaged bytes, words of the error)
    "empty file": (lambda b: b"", "not a zip"),
    "truncated": (lambda b: b[:len(b) // 2], "not a zip"),
    "zip directory cut": (lambda b: b[:-10], "not a zip"),
    "an npy file": (lambda b: npy_bytes(np.eye(2)), "not a zip"),
    "zip without header": (lambda b: _zip({"x.txt": b"x"}), "no header.json"),
    "header not JSON": (lambda b: _zip({**_entries(io.BytesIO(b)), "header.json": b"{not json"}), "damaged"),
    "header a list": (lambda b: _zip({**_entries(io.BytesIO(b)), "header.json": b"[1, 2]"}), "not a qkm model"),
    "other format": (lambda b: _edit_header(b, _set(["format"], "other")), "not a qkm model"),
    "newer version": (lambda b: _edit_header(b, _set(["format_version"], 99)), "upgrade qkm"),
    "version as text": (lambda b: _edit_header(b, _set(["format_version"], "3")), "format version"),
    "row 9: objective edited": (lambda b: _edit_header(b, _set(["metadata", "objective"], 0.0)), "checksum"),
    "row 9: kind edited": (lambda b: _edit_header(b, _set(["kind"], "factor-chain")), "checksum"),
    "checksum removed": (lambda b: _edit_header(b, lambda h: h.pop("checksum")), "checksum"),
    "array missing": (lambda b: _zip({k: v for k, v in _entries(io.BytesIO(b)).items() if "sq_norms" not in k}),
                      "missing"),
    "array bytes changed": (lambda b: _zip({k: (v[:-1] + bytes([v[-1] ^ 1]) if "centers" in k else v)
                                            for k, v in _entries(io.BytesIO(b)).items()}), "checksum mismatch"),
    "resealed: centroids NaN": (lambda b: _forge_array(b, "cluster_centers", lambda a: a * np.nan), "NaN"),
    "resealed: centroids 1-D": (lambda b: _forge_array(b, "cluster_centers", lambda a: a.ravel()), "2-D"),
    "resealed: norms wrong": (lambda b: _forge_array(b, "sq_norms", lambda a: a + 1), "squared norms"),
    "resealed: unknown kind": (lambda b: _edit_header(b, _set(["kind"], "tree"), reseal=True), "kind 'tree'"),
    "resealed: unknown part": (lambda b: _edit_header(b, _set(["parts", "forest"], {}), reseal=True),
                               "unknown model part"),
    "resealed: metadata not an object": (lambda b: _edit_header(b, _set(["metadata"], [1]), reseal=True),
                                         "metadata"),
    "bzip2 entries": (lambda b: _zip(_entries(io.BytesIO(b)), compression=zipfile.ZIP_BZIP2),
                      "compression method 12"),
}


def _forge_array(data, name, change):
    """A file whose array ``name`` is changed and whose checksums are recomputed: only the content checks catch it."""
    import hashlib

    entries = _entries(io.BytesIO(data))
    header = json.loads(entries["header.json"])
    arr = change(np.load(io.BytesIO(entries[f"arrays/{name}.npy"])))
    entries[f"arrays/{name}.npy"] = npy_bytes(arr)
    header["arrays"][name]["sha256"] = hashlib.sha256(entries[f"arrays/{name}.npy"]).hexdigest()
    header["checksum"] = header_checksum(header)
    entries["header.json"] = json.dumps(header).encode()
    return _zip(entries)


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_model_file_corruption_catalogue(model_file, tmp_path, case, monkeypatch, capsys):
    damage, *words = CORRUPTIONS[case]
    bad = tmp_path / "bad.qkm"
    bad.write_bytes(damage(model_file.read_bytes()))
    with pytest.raises(ModelFormatError) as exc:
        load_model(bad)
    for word in words:
        assert word in str(exc.value), str(exc.value)
    assert "bad.qkm" in str(exc.value)
    with pytest.raises(ModelFormatError):
        create_app(bad)  # what qkm serve builds
    for argv in (["predict", "bad.qkm", "X.npy"], ["serve", "bad.qkm", "--port", "0"]):
        np.save(tmp_path / "X.npy", np.zeros((2, 4)))
        status, err = run_cli(argv, tmp_path, monkeypatch, capsys)
        assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.slow
def test_row_8_every_flipped_bit_is_a_model_format_error_or_harmless(model_file, tmp_path):
    """Each bit of the zip's fixed-size fields (local headers, central directory, end record) and one bit of
    every entry name, flipped alone: loading raises ModelFormatError, or gives the same model (timestamps,
    attributes: fields no reader uses). One bit of every other byte (the header's JSON, the arrays): always
    ModelFormatError, the checksums cover them all."""
    data = model_file.read_bytes()
    good = load_model(model_file)
    with zipfile.ZipFile(model_file) as zf:
        infos = zf.infolist()
    directory = int.from_bytes(data[-6:-2], "little")  # central directory offset, from the end record
    assert data[directory:directory + 4] == b"PK\x01\x02"
    fields, names = set(range(len(data) - 22, len(data))), set()  # fixed-size fields: every bit; names: one
    for info in infos:
        fields.update(range(info.header_offset, info.header_offset + 30))  # local file header
        names.update(range(info.header_offset + 30, info.header_offset + 30 + len(info.filename)))
    at = directory
    for info in infos:  # central directory records, in order
        fields.update(range(at, at + 46))
        names.update(range(at + 46, at + 46 + len(info.filename)))
        at += 46 + len(info.filename) + len(info.extra) + len(info.comment)
    structure = fields | names
    bits = [(i, bit) for i in sorted(fields) for bit in range(8)]
    bits += [(i, i % 8) for i in range(len(data)) if i not in fields]
    path, outcomes = tmp_path / "flipped.qkm", {"error": 0, "same": 0}
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)  # flip in place: rewriting a whole file per flip costs more than loading it
    try:
        for i, bit in bits:
            os.pwrite(fd, bytes([data[i] ^ (1 << bit)]), i)
            try:
                loaded = load_model(path)
            except ModelFormatError as exc:
                assert "flipped.qkm" in str(exc)
                outcomes["error"] += 1
            else:  # the flip hit bytes no reader uses: the model is the one written
                assert i in structure, f"flipped bit {bit} of byte {i} (content) was not detected"
                assert loaded.checksum == good.checksum
                np.testing.assert_array_equal(loaded.operator.to_dense(), good.operator.to_dense())
                outcomes["same"] += 1
            os.pwrite(fd, data[i:i + 1], i)
    finally:
        os.close(fd)
    assert outcomes["error"] >= len(bits) - 8 * len(fields) - len(names), outcomes


def test_row_9_older_format_versions_still_load(model_file, tmp_path):
    """Version 3 (before means), 2 (checksum over the arrays only) and 1 (no checksum) files load as before."""
    entries = _entries(model_file)
    header = json.loads(entries["header.json"])
    hashes = {name: info["sha256"] for name, info in header["arrays"].items()}
    v3 = header_checksum(dict(header, format_version=3))
    for version, checksum in ((3, v3), (2, content_checksum(hashes)), (1, None)):
        old = dict(header, format_version=version)
        old.pop("checksum")
        if checksum is not None:
            old["checksum"] = checksum
        path = tmp_path / f"v{version}.qkm"
        path.write_bytes(_zip({**entries, "header.json": json.dumps(old).encode()}))
        loaded = load_model(path)
        assert loaded.format_version == version
        np.testing.assert_array_equal(loaded.operator.to_dense(), load_model(model_file).operator.to_dense())
    # in version 2 the checksum covers the arrays only: an edited objective passes, as it always did
    old = dict(header, format_version=2, checksum=content_checksum(hashes))
    old["metadata"] = dict(old["metadata"], objective=0.0)
    path = tmp_path / "v2-edited.qkm"
    path.write_bytes(_zip({**entries, "header.json": json.dumps(old).encode()}))
    assert load_model(path).metadata["objective"] == 0.0


def test_row_1_demo_model_is_package_data():
    """The demo model is in the qkm.models package, so the wheel ships it (installed and served: test_wheel.py)."""
    from importlib.resources import files

    assert files("qkm.models").joinpath("fashion_mnist_qkmeans.qkm").is_file()
    assert demo_model_path() == files("qkm.models").joinpath("fashion_mnist_qkmeans.qkm")



@pytest.mark.parametrize("sparse", [False, True])
def test_row_3_in_process_overflowing_rows_are_refused_not_labelled(sparse):
    """In process too: a finite row whose distances would overflow is a ValueError at fit and at predict,
    not label 0 (the service's bound is the same function of the centres and dtypes)."""
    from qkm import KMeans, QKMeans
    from qkm._validation import row_norm_bound

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    wrap = sp.csr_matrix if sparse else np.asarray
    huge = np.full((2, 5), 1e200)
    for est in (KMeans(3, n_init=1, random_state=0), QKMeans(3, n_factors=2, random_state=0)):
        with pytest.raises(ValueError, match="numeric overflow"):
            est.fit(wrap(np.vstack([X, huge])))
        est.fit(wrap(X))
        with pytest.raises(ValueError, match="numeric overflow: row 1 "):
            est.predict(wrap(np.vstack([X[:1], huge[:1]])))
        for method in (est.transform, est.score):
            with pytest.raises(ValueError, match="numeric overflow"):
                method(wrap(huge))
        # rows just below the bound still get the brute-force labels
        bound = row_norm_bound(np.float64, est.operator_.row_sq_norms())
        big = rng.standard_normal((4, 5))
        big *= 0.5 * bound / np.linalg.norm(big, axis=1, keepdims=True)
        V = est.operator_.to_dense()
        np.testing.assert_array_equal(est.predict(wrap(big)), np.argmin(-2 * big @ V.T + (V**2).sum(axis=1), axis=1))
