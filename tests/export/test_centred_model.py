"""A model that keeps a mean beside its factors: the mean travels through save/load, ONNX and the service."""

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette asks for "httpx2"; the httpx TestClient still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import qkm
from qkm.export import FORMAT_VERSION, ModelFormatError, load_model, save_model, to_onnx
from qkm.export._safe import header_checksum
from qkm.export.onnx import onnx_session
from qkm.serve import create_app

import naive
from test_model_file import read_entries, write_entries


@pytest.fixture(scope="module")
def centred(blobs):
    X = (blobs[0] + 40.0).astype(np.float32)  # far from the origin: a model without its mean is wrong
    est = qkm.QKMeans(6, sparsity_level=2, max_iter=8, palm_max_iter=20, center=True, random_state=0).fit(X)
    assert est.mean_ is not None
    return X, est


def test_the_mean_survives_save_and_load(centred, tmp_path):
    X, est = centred
    path = tmp_path / "c.qkm"
    save_model(est, path)
    model = load_model(path)
    assert model.format_version == FORMAT_VERSION == 4 and model.metadata["centered"]
    np.testing.assert_array_equal(model.operator.mean, est.mean_)
    np.testing.assert_array_equal(model.operator.to_dense(), est.cluster_centers_)
    np.testing.assert_array_equal(model.predict(X), est.predict(X))
    labels, _ = naive.assign(X, est.cluster_centers_)
    np.testing.assert_array_equal(model.predict(X), labels)


def test_a_mean_in_a_file_older_than_version_4_is_refused(centred, tmp_path):
    """Means came with format version 4: a version-3 header (resealed) over a mean is a format error."""
    _, est = centred
    save_model(est, tmp_path / "c.qkm")
    header, entries = read_entries(tmp_path / "c.qkm")
    header["format_version"] = 3
    header["checksum"] = header_checksum(header)
    write_entries(tmp_path / "v3.qkm", header, entries)
    with pytest.raises(ModelFormatError, match="version-3 file"):
        load_model(tmp_path / "v3.qkm")


def test_onnx_labels_are_predict(centred):
    X, est = centred
    for encoding in ("dense", "sparse", "hybrid"):
        labels, dist = onnx_session(to_onnx(est, encoding=encoding)).run(None, {"X": X})
        np.testing.assert_array_equal(labels, est.predict(X))
        np.testing.assert_allclose(dist, est.transform(X).min(axis=1) ** 2, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("backend", ["numba", "onnx"])
def test_assign_endpoint_uses_the_mean(centred, tmp_path, backend):
    X, est = centred
    save_model(est, tmp_path / "c.qkm")
    with TestClient(create_app(tmp_path / "c.qkm", backend=backend)) as c:
        out = c.post("/assign", json={"instances": X[:60].tolist()}).json()
    np.testing.assert_array_equal(out["labels"], est.predict(X[:60]))
