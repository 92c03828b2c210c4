"""The real ``qkm serve`` process on 127.0.0.1: start, wait for /readyz, query with httpx, stop with a signal."""

import signal
import time

import httpx
import numpy as np
import pytest

from qkm.export import load_model
from qkm.serve import demo_model_path
from support import Server, free_port

@pytest.fixture
def rows():
    data = np.load(demo_model_path().parents[1] / "qkm" / "datasets" / "fashion_mnist_2000.npz")
    return data["X"][:64].astype(np.float32)


def test_serve_demo_model_and_stop_with_sigint(tmp_path, rows):
    server = Server(["--no-access-log"], tmp_path / "serve.log")  # no MODEL: the demo model
    try:
        server.wait_ready()
        model = load_model(demo_model_path())
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/model").json()["checksum"] == model.checksum
            labels, sq_dist = model.assign(rows)
            out = client.post("/assign", json={"instances": rows[:8].tolist()}).json()
            np.testing.assert_array_equal(out["labels"], labels[:8])
            r = client.post("/assign", content=rows.tobytes(),
                            headers={"Content-Type": "application/octet-stream", "X-Shape": "64,784"})
            assert r.status_code == 200
            np.testing.assert_array_equal(np.frombuffer(r.content[:64 * 8], "<i8"), labels)
            np.testing.assert_allclose(np.frombuffer(r.content[64 * 8:], "<f8"), sq_dist, rtol=1e-4)
            search = client.post("/search", json={"instances": rows[:2].tolist(), "k": 2}).json()
            assert np.shape(search["indices"]) == (2, 2)
            assert client.post("/assign", json={"instances": [[1.0]]}).status_code == 400
            assert client.get("/healthz").status_code == 200  # still serving after the 400
    except BaseException:
        server.close()
        raise
    assert server.stop(signal.SIGINT) == 0, server.output()
    log = server.output()
    assert "warmed up" in log and "Shutting down" in log and "Traceback" not in log


def test_two_workers_with_api_key_stop_with_sigterm(tmp_path, rows):
    (tmp_path / "tmp").mkdir()
    server = Server([str(demo_model_path()), "--workers", "2", "--model-name", "demo"], tmp_path / "serve.log",
                    env={"QKM_API_KEY": "k3y-for-test", "TMPDIR": str(tmp_path / "tmp")})
    try:
        server.wait_ready()
        deadline = time.monotonic() + 90
        while server.output().count("warmed up") < 2 and time.monotonic() < deadline:  # /readyz: one of them
            time.sleep(0.1)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/assign", json={"instances": rows[:2].tolist()}).status_code == 401
            body = {"inputs": [{"name": "X", "shape": [2, 784], "datatype": "FP32",
                                "data": rows[:2].ravel().tolist()}]}
            for _ in range(4):  # spread over both workers
                r = client.post("/v2/models/demo/infer", json=body, headers={"X-API-Key": "k3y-for-test"})
                assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2]
            # prometheus_client's multiprocess mode: whichever worker takes the scrape answers for both
            for _ in range(3):
                metrics = client.get("/metrics", headers={"X-API-Key": "k3y-for-test"}).text
                assert 'qkm_requests_total{endpoint="/v2/models/{model_name}/infer",status="200"} 4.0' in metrics
                assert "qkm_workers 2.0" in metrics
    except BaseException:
        server.close()
        raise
    assert server.stop(signal.SIGTERM) == 0, server.output()
    log = server.output()
    assert log.count("warmed up") == 2  # each worker loaded and warmed its own model
    assert "k3y-for-test" not in log and "Traceback" not in log
    assert not list((tmp_path / "tmp").iterdir())  # the metrics directory of the workers is removed


@pytest.mark.parametrize("content, message", [(None, "model file not found"), (b"junk", "not a qkm model file")])
def test_bad_model_file_fails_at_once(tmp_path, capsys, content, message):
    from qkm.cli import main

    path = tmp_path / "m.qkm"
    if content is not None:
        path.write_bytes(content)
    assert main(["serve", str(path), "--port", str(free_port())]) == 2
    assert message in capsys.readouterr().err
