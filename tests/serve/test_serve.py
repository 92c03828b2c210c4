"""The HTTP service through FastAPI's TestClient: every endpoint, parity with in-process calls, metrics, docs.

The main fixture serves the demo model shipped in ``models/`` (QK-means with a
search index and Nyström features); bad input, limits and keys are in
``test_serve_errors.py``, the real ``qkm serve`` process in ``test_serve_process.py``.
"""

import io
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

with warnings.catch_warnings():  # starlette asks for "httpx2"; the httpx TestClient still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.export import Model, load_model, save_joblib, save_model
from qkm.serve import ServeSettings, create_app, demo_model_path
from qkm.serve.metrics import CONTENT_TYPE

OCTET = {"Content-Type": "application/octet-stream"}
# The demo model is float32: two loads of it may time different execution paths fastest (BLAS or fused
# kernels), which round ||x||^2 - 2 x.v + ||v||^2 differently (pixels up to 255: |x|^2 ~ 1e7).
F32_RTOL = 1e-4
NPY = {"Content-Type": "application/x-npy"}


@pytest.fixture(scope="module")
def model():
    return load_model(demo_model_path())


@pytest.fixture(scope="module")
def rows():
    data = np.load(demo_model_path().parents[1] / "qkm" / "datasets" / "fashion_mnist_2000.npz")
    return data["X"][-40:].astype(np.float32), data["y"][-40:]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app()) as c:  # no model: the demo model
        yield c


def npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def sparse_json(X):
    X = sp.csr_matrix(X)
    return {"indices": [X.indices[a:b].tolist() for a, b in zip(X.indptr[:-1], X.indptr[1:])],
            "values": [X.data[a:b].tolist() for a, b in zip(X.indptr[:-1], X.indptr[1:])]}


def split_octet(response):
    """Named arrays of a binary answer, from its X-Shape and X-Fields headers."""
    shape = tuple(int(v) for v in response.headers["x-shape"].split(","))
    out, offset = {}, 0
    for field in response.headers["x-fields"].split(","):
        name, dtype = field.split(":")
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        out[name] = np.frombuffer(response.content[offset:offset + n], dtype=dtype).reshape(shape)
        offset += n
    assert offset == len(response.content)
    return out


# -- health, model, docs -------------------------------------------------------- #
def test_health_and_readiness(client):
    for path in ("/healthz", "/v2/health/live"):
        assert client.get(path).json() == {"live": True}
    for path in ("/readyz", "/v2/health/ready", "/v2/models/fashion_mnist_qkmeans/ready"):
        r = client.get(path)
        assert r.status_code == 200 and r.json() == {"ready": True}


def test_not_ready_before_warm_up(model):
    client = TestClient(create_app(model))  # no `with`: the lifespan (warm-up) has not run
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False and r.headers["retry-after"] == "1"
    assert client.get("/healthz").status_code == 200


def test_model_metadata(client, model):
    info = client.get("/model").json()
    assert info["name"] == "fashion_mnist_qkmeans"
    assert (info["kind"], info["n_clusters"], info["n_features"], info["nnz"]) == (
        "factor-chain", model.n_clusters, model.n_features, model.operator.nnz)
    assert info["checksum"] == model.checksum and info["qkm_version"] == qkm.__version__
    assert info["compression"] == pytest.approx(model.operator.compression)
    assert info["has_index"] and info["has_features"]
    assert info["serving"]["backend"] == "numba" and info["serving"]["max_batch_rows"] == 4096


def test_oip_metadata(client, model):
    assert client.get("/v2").json()["name"] == "qkm"
    meta = client.get("/v2/models/fashion_mnist_qkmeans").json()
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 784]}]
    assert [o["name"] for o in meta["outputs"]] == ["label", "distance"]
    assert meta["parameters"]["checksum"] == model.checksum
    r = client.get("/v2/models/other")
    assert r.status_code == 404 and "fashion_mnist_qkmeans" in r.json()["error"]


def test_openapi_documents_every_route_with_examples(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/assign", "/search", "/features", "/healthz", "/readyz", "/model", "/metrics", "/v2",
                 "/v2/health/live", "/v2/health/ready", "/v2/models/{model_name}", "/v2/models/{model_name}/ready",
                 "/v2/models/{model_name}/infer"):
        assert path in paths, path
    for path in ("/assign", "/search", "/features"):
        op = paths[path]["post"]
        content = op["requestBody"]["content"]
        assert set(content) == {"application/json", "application/octet-stream", "application/x-npy"}
        assert {"dense", "sparse"} <= set(content["application/json"]["examples"])
        assert {"200", "400", "413", "415", "503"} <= set(op["responses"])
        ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert "example" in spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert any(p["name"] == "X-Shape" for p in op["parameters"])
    assert {"k", "nprobe"} <= {p["name"] for p in paths["/search"]["post"]["parameters"]}
    assert "example" in paths["/v2/models/{model_name}/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert client.get("/docs").status_code == 200


# -- /assign parity ------------------------------------------------------------------ #
def test_assign_json_matches_predict(client, model, rows):
    X, _ = rows
    r = client.post("/assign", json={"instances": X.tolist()})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    labels, sq_dist = model.assign(X)
    np.testing.assert_array_equal(r.json()["labels"], labels)
    np.testing.assert_allclose(r.json()["sq_distances"], sq_dist, rtol=F32_RTOL)
    np.testing.assert_array_equal(r.json()["labels"], model.predict(X))


def test_answers_are_the_served_models_numbers_exactly(client, rows):
    # the transport itself changes nothing: JSON floats round-trip, binary is the float64 bits
    X, _ = rows
    labels, sq_dist = client.app.state.service.model.assign(X)
    out = client.post("/assign", json={"instances": X.tolist()}).json()
    assert out == {"labels": labels.tolist(), "sq_distances": sq_dist.tolist()}
    binary = split_octet(client.post("/assign", content=X.tobytes(), headers={**OCTET, "X-Shape": f"{len(X)},784"}))
    assert binary["sq_distances"].tobytes() == sq_dist.astype("<f8").tobytes()


def test_assign_sparse_json_matches_predict(client, model, rows):
    X, _ = rows
    body = sparse_json(X)
    assert sum(map(len, body["indices"])) < X.size  # really sparse
    r = client.post("/assign", json=body)
    assert r.status_code == 200
    labels, sq_dist = model.assign(sp.csr_matrix(X))
    np.testing.assert_array_equal(r.json()["labels"], labels)
    np.testing.assert_allclose(r.json()["sq_distances"], sq_dist, rtol=F32_RTOL)
    np.testing.assert_array_equal(r.json()["labels"], model.predict(X))


def test_assign_binary_matches_predict(client, model, rows):
    X, _ = rows
    r = client.post("/assign", content=X.astype("<f4").tobytes(), headers={**OCTET, "X-Shape": f"{len(X)},784"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-fields"] == "labels:<i8,sq_distances:<f8"
    out = split_octet(r)
    labels, sq_dist = model.assign(X)
    np.testing.assert_array_equal(out["labels"], labels)
    np.testing.assert_allclose(out["sq_distances"], sq_dist, rtol=F32_RTOL)


@pytest.mark.parametrize("dtype", [np.uint8, np.float64])
def test_assign_npy_matches_predict(client, model, rows, dtype):
    X = rows[0].astype(dtype)
    r = client.post("/assign", content=npy_bytes(X), headers=NPY)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    out = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert out.dtype.names == ("labels", "sq_distances")
    labels, sq_dist = model.assign(X)
    np.testing.assert_array_equal(out["labels"], labels)
    np.testing.assert_allclose(out["sq_distances"], sq_dist, rtol=F32_RTOL)


def test_assign_fortran_ordered_npy(client, model, rows):
    X = np.asfortranarray(rows[0][:5])
    out = np.load(io.BytesIO(client.post("/assign", content=npy_bytes(X), headers=NPY).content))
    np.testing.assert_array_equal(out["labels"], model.predict(np.ascontiguousarray(X)))


# -- /search and /features ---------------------------------------------------------- #
def test_search_json_matches_index(client, model, rows):
    X, y = rows
    r = client.post("/search", json={"instances": X[:8].tolist(), "k": 3, "nprobe": 2})
    assert r.status_code == 200
    distances, indices = model.search(X[:8], k=3, nprobe=2)
    out = r.json()
    np.testing.assert_array_equal(out["indices"], indices)
    np.testing.assert_allclose(out["distances"], distances, rtol=1e-6)
    np.testing.assert_array_equal(out["labels"], model.index.y_[indices])
    # 1-NN labels agree with the true class most of the time on this sample
    assert np.mean(np.array(out["labels"])[:, 0] == y[:8]) >= 0.5


def test_search_one_row_matches_index(client, model, rows):
    X, _ = rows  # one row per request: answered on the event loop, no thread hand-off
    for i in range(3):
        for body in ({"instances": X[i:i + 1].tolist()}, {"instances": X[i:i + 1].tolist(), "k": 4}):
            out = client.post("/search", json=body).json()
            distances, indices = model.search(X[i:i + 1], k=body.get("k", 1))
            np.testing.assert_array_equal(out["indices"], indices)
            np.testing.assert_allclose(out["distances"], distances, rtol=1e-6)
    n_lists = model.index.n_lists_
    assert client.post(f"/search?nprobe={n_lists}", json={"instances": X[:1].tolist()}).status_code == 200
    assert client.post(f"/search?nprobe={n_lists + 1}", json={"instances": X[:1].tolist()}).status_code == 400


def test_search_parameters_from_query_string_and_binary(client, model, rows):
    X, _ = rows
    r = client.post("/search?k=2", content=X[:4].astype("<f4").tobytes(), headers={**OCTET, "X-Shape": "4,784"})
    assert r.status_code == 200 and r.headers["x-shape"] == "4,2"
    out = split_octet(r)
    distances, indices = model.search(X[:4], k=2)
    np.testing.assert_array_equal(out["indices"], indices)
    np.testing.assert_allclose(out["distances"], distances, rtol=1e-6)
    default = client.post("/search", json={"instances": X[:4].tolist()}).json()
    assert np.shape(default["indices"]) == (4, 1)  # k defaults to 1
    structured = np.load(io.BytesIO(client.post("/search?k=2", content=npy_bytes(X[:4]), headers=NPY).content))
    assert structured.dtype.names == ("indices", "distances", "labels") and structured.shape == (4, 2)


def test_features_match_nystroem(client, model, rows):
    X, _ = rows
    # The float32 operator times its paths (chain or folded V) per batch size and keeps the faster, so the
    # service and the in-process model may round differently: float32 rounding, not a different answer.
    r = client.post("/features", json={"instances": X[:5].tolist()})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["features"], model.features(X[:5]), rtol=F32_RTOL, atol=1e-7)
    out = np.load(io.BytesIO(client.post("/features", content=npy_bytes(X[:5]), headers=NPY).content))
    assert out.shape == (5, model.n_clusters)
    np.testing.assert_allclose(out, model.features(X[:5]), rtol=F32_RTOL, atol=1e-7)
    sparse = client.post("/features", json=sparse_json(X[:5])).json()["features"]
    np.testing.assert_allclose(sparse, model.features(sp.csr_matrix(X[:5])), rtol=F32_RTOL, atol=1e-7)
    np.testing.assert_allclose(sparse, model.features(X[:5]), rtol=F32_RTOL, atol=1e-7)


def test_search_and_features_need_their_parts(tmp_path, blobs):
    km = qkm.KMeans(4, random_state=0).fit(blobs[0])
    with TestClient(create_app(Model.from_estimator(km))) as c:
        for path in ("/search", "/features"):
            r = c.post(path, json={"instances": blobs[0][:2].tolist()})
            assert r.status_code == 404 and "--with-" in r.json()["error"]
        assert c.post("/assign", json={"instances": blobs[0][:2].tolist()}).status_code == 200


# -- Open Inference Protocol v2 --------------------------------------------------------- #
def test_oip_infer_matches_predict(client, model, rows):
    X, _ = rows
    body = {"id": "req-1", "inputs": [{"name": "X", "shape": list(X[:3].shape), "datatype": "FP32",
                                       "data": X[:3].ravel().tolist()}]}
    out = client.post("/v2/models/fashion_mnist_qkmeans/infer", json=body).json()
    labels, sq_dist = model.assign(X[:3])
    assert out["model_name"] == "fashion_mnist_qkmeans" and out["id"] == "req-1"
    by_name = {o["name"]: o for o in out["outputs"]}
    assert by_name["label"]["datatype"] == "INT64" and by_name["label"]["shape"] == [3]
    np.testing.assert_array_equal(by_name["label"]["data"], labels)
    np.testing.assert_allclose(by_name["distance"]["data"], sq_dist, rtol=F32_RTOL)
    nested = dict(body, inputs=[dict(body["inputs"][0], data=X[:3].tolist())], outputs=[{"name": "label"}])
    out = client.post("/v2/models/fashion_mnist_qkmeans/infer", json=nested).json()
    assert [o["name"] for o in out["outputs"]] == ["label"] and out["outputs"][0]["data"] == labels.tolist()


# -- metrics -------------------------------------------------------------------- #
def parse_metrics(text):
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_count_requests_rows_and_latency(model, rows):
    X, _ = rows
    with TestClient(create_app(model, model_name="m")) as c:
        for n in (1, 3, 5):
            assert c.post("/assign", json={"instances": X[:n].tolist()}).status_code == 200
        assert c.post("/assign", json={"instances": X[:2, :10].tolist()}).status_code == 400
        assert c.post("/search", json={"instances": X[:2].tolist()}).status_code == 200
        assert c.get("/nowhere").status_code == 404
        r = c.get("/metrics")
    assert r.headers["content-type"] == CONTENT_TYPE
    s = parse_metrics(r.text)
    assert s['qkm_requests_total{endpoint="/assign",status="200"}'] == 3
    assert s['qkm_requests_total{endpoint="/assign",status="400"}'] == 1
    assert s['qkm_requests_total{endpoint="/search",status="200"}'] == 1
    assert s['qkm_requests_total{endpoint="other",status="404"}'] == 1
    assert s['qkm_rows_total{endpoint="/assign"}'] == 9 and s['qkm_rows_total{endpoint="/search"}'] == 2
    buckets = [v for k, v in s.items() if k.startswith('qkm_request_duration_seconds_bucket{endpoint="/assign"')]
    assert buckets == sorted(buckets) and buckets[-1] == 4  # cumulative, +Inf bucket = count
    assert s['qkm_request_duration_seconds_count{endpoint="/assign"}'] == 4
    assert s['qkm_batch_rows_bucket{endpoint="/assign",le="4.0"}'] == 2  # batches of 1 and 3 rows
    assert s["qkm_in_flight_requests"] == 0
    assert any(k.startswith("qkm_model_info{") and 'name="m"' in k for k in s)


# -- onnxruntime backend ------------------------------------------------------------ #
def test_onnx_backend_matches_predict(model, rows):
    X, _ = rows
    with TestClient(create_app(model, backend="onnx")) as c:
        labels, sq_dist = model.assign(X)
        for body in ({"instances": X.tolist()}, sparse_json(X)):
            out = c.post("/assign", json=body).json()
            np.testing.assert_array_equal(out["labels"], labels)
            np.testing.assert_allclose(out["sq_distances"], sq_dist, rtol=1e-3)  # float32 graph
        binary = split_octet(c.post("/assign", content=X.tobytes(), headers={**OCTET, "X-Shape": f"{len(X)},784"}))
        np.testing.assert_array_equal(binary["labels"], labels)
        serving = c.get("/model").json()["serving"]
        assert serving["backend"] == "onnx" and serving["onnx"]["qkm.n_clusters"] == str(model.n_clusters)
        assert c.get("/v2/models/model").json()["outputs"][1]["datatype"] == "FP32"  # default name of a Model object
        search = c.post("/search", json={"instances": X[:2].tolist(), "k": 2}).json()  # search stays in numba
        np.testing.assert_array_equal(search["indices"], model.search(X[:2], k=2)[1])


# -- construction ------------------------------------------------------------------ #
def test_settings_are_checked():
    with pytest.raises(ValueError, match="backend"):
        ServeSettings("m.qkm", backend="torch")
    with pytest.raises(ValueError, match="max_in_flight"):
        ServeSettings("m.qkm", max_in_flight=0)
    with pytest.raises(FileNotFoundError, match="not found"):
        create_app("no/such/model.qkm")


def test_joblib_artefact_needs_trust_pickle(tmp_path, blobs):
    km = qkm.KMeans(3, random_state=0).fit(blobs[0])
    path = tmp_path / "m.joblib"
    save_joblib(km, path)
    with pytest.raises(ValueError, match="not a qkm model file"):
        create_app(path)
    with TestClient(create_app(path, trust_pickle=True)) as c:
        r = c.post("/assign", json={"instances": blobs[0][:4].tolist()})
        assert r.json()["labels"] == km.predict(blobs[0][:4]).tolist()


def test_float64_kmeans_model(tmp_path, blobs):
    X = blobs[0]
    km = qkm.KMeans(5, random_state=0).fit(X)
    save_model(km, tmp_path / "km.qkm")
    with TestClient(create_app(tmp_path / "km.qkm")) as c:
        out = c.post("/assign", json={"instances": X[:50].tolist()}).json()
        np.testing.assert_array_equal(out["labels"], km.predict(X[:50]))
        binary = split_octet(c.post("/assign", content=X[:50].astype("<f4").tobytes(),
                                    headers={**OCTET, "X-Shape": "50,12"}))
        np.testing.assert_array_equal(binary["labels"], km.predict(X[:50].astype(np.float32)))


def test_small_bodies_inline_large_bodies_in_the_pool_same_answers(model, rows, monkeypatch):
    X = rows[0]
    answers = {}
    for inline in (0, 16 * 2**10):
        app = create_app(model, inline_body_bytes=inline)
        service = app.state.service
        pooled = []
        original = service.pool.run

        async def counting_run(func, *args, _original=original, _pooled=pooled):
            _pooled.append(len(args[0]))
            return await _original(func, *args)

        monkeypatch.setattr(service.pool, "run", counting_run)
        with TestClient(app) as c:
            one = c.post("/assign", json={"instances": X[:1].tolist()}).json()
            many = split_octet(c.post("/assign", content=X.tobytes(), headers={**OCTET, "X-Shape": "%d,%d" % X.shape}))
        answers[inline] = (one, many)
        # 0: every request goes to the pool; 16 KiB: the 1-row JSON body is answered inline, the binary batch is not
        assert len(pooled) == (2 if inline == 0 else 1)
        assert inline == 0 or pooled == [X.nbytes]
    assert answers[0][0] == answers[16 * 2**10][0]
    for name in ("labels", "sq_distances"):
        np.testing.assert_array_equal(answers[0][1][name], answers[16 * 2**10][1][name])
    np.testing.assert_array_equal(answers[0][1]["labels"].ravel(), model.predict(X))
    with pytest.raises(ValueError, match="inline_body_bytes"):
        ServeSettings("m.qkm", inline_body_bytes=-1)
