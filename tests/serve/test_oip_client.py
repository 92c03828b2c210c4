"""The Open Inference Protocol v2 routes with a real client: ``tritonclient.http`` against ``qkm serve``.

tritonclient sends tensors as binary data by default (the binary tensor data extension) and asks for binary
outputs; with ``binary_data=False`` both travel as JSON. Labels must equal in-process ``predict``.
"""

import signal

import numpy as np
import pytest

from qkm.export import load_model
from qkm.serve import demo_model_path
from support import Server

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

NAME = "demo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(["--model-name", NAME, "--no-access-log"], tmp_path_factory.mktemp("oip") / "serve.log")
    try:
        server.wait_ready()
        yield server
    except BaseException:
        server.close()
        raise
    assert server.stop(signal.SIGTERM) == 0, server.output()
    assert "Traceback" not in server.output()


@pytest.fixture(scope="module")
def client(server):
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def model():
    return load_model(demo_model_path())


@pytest.fixture(scope="module")
def rows():
    from qkm.datasets import load_fashion_mnist_sample

    return load_fashion_mnist_sample(np.float32)[0][-37:]


def test_health_metadata_and_config(client, model):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(NAME) and not client.is_model_ready("other")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata(NAME)
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, model.n_features]}]
    assert [o["name"] for o in meta["outputs"]] == ["label", "distance"]
    config = client.get_model_config(NAME)
    assert config["name"] == NAME and config["input"][0]["dims"] == [model.n_features]
    assert [o["name"] for o in config["output"]] == ["label", "distance"]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_config("other")


@pytest.mark.parametrize("binary_in, binary_out", [(True, None), (False, False), (True, False), (False, True)])
def test_infer_labels_equal_predict(client, model, rows, binary_in, binary_out):
    """None: tritonclient's defaults (binary input, every output as binary data)."""
    X = httpclient.InferInput("X", list(rows.shape), "FP32")
    X.set_data_from_numpy(rows, binary_data=binary_in)
    outputs = None if binary_out is None else [httpclient.InferRequestedOutput(name, binary_data=binary_out)
                                               for name in ("label", "distance")]
    result = client.infer(NAME, [X], outputs=outputs, request_id="r-1")
    labels, sq_dist = model.assign(rows)
    np.testing.assert_array_equal(result.as_numpy("label"), labels)
    np.testing.assert_allclose(result.as_numpy("distance"), sq_dist, rtol=1e-4)
    assert result.get_response()["id"] == "r-1"


def test_infer_one_output_and_other_datatypes(client, model, rows):
    X = httpclient.InferInput("X", list(rows.shape), "FP64")
    X.set_data_from_numpy(rows.astype(np.float64))
    result = client.infer(NAME, [X], outputs=[httpclient.InferRequestedOutput("label")])
    np.testing.assert_array_equal(result.as_numpy("label"), model.predict(rows))
    assert result.as_numpy("distance") is None
    X = httpclient.InferInput("X", list(rows.shape), "UINT8")  # pixels as sent by an image pipeline
    X.set_data_from_numpy(rows.astype(np.uint8), binary_data=False)
    np.testing.assert_array_equal(client.infer(NAME, [X]).as_numpy("label"), model.predict(rows))


def test_errors_reach_the_client_as_messages(client, rows):
    X = httpclient.InferInput("X", [rows.shape[0], 10], "FP32")
    X.set_data_from_numpy(rows[:, :10].copy())
    with pytest.raises(InferenceServerException, match="10 features per row"):
        client.infer(NAME, [X])
    X = httpclient.InferInput("X", [1, rows.shape[1]], "INT16")
    X.set_data_from_numpy(np.full((1, rows.shape[1]), 1000, np.int16), binary_data=False)
    assert client.infer(NAME, [X]).as_numpy("label").shape == (1,)  # in range: accepted
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("other", [X])
    assert client.is_server_ready()  # still serving
