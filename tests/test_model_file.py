"""The safe model format: round trip, corruption, versions, atomic writes."""

import json
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

import qkm
from qkm.export import FORMAT_VERSION, ModelFormatError, load_model, save_model


@pytest.fixture(scope="module")
def fitted(blobs):
    return qkm.KMeans(5, random_state=0).fit(blobs[0])


def test_round_trip_is_bit_identical(fitted, blobs, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    model = load_model(path)
    assert model.arrays["cluster_centers"].tobytes() == fitted.cluster_centers_.tobytes()
    np.testing.assert_array_equal(model.predict(blobs[0]), fitted.predict(blobs[0]))
    np.testing.assert_array_equal(model.predict(sp.csr_matrix(blobs[0])), fitted.labels_)
    assert model.metadata["n_clusters"] == 5 and model.header["format_version"] == FORMAT_VERSION


def test_truncated_file_rejected(fitted, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="m.qkm"):
        load_model(path)


def test_corrupted_array_rejected(fitted, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    data = bytearray(path.read_bytes())
    blob = fitted.cluster_centers_.tobytes()
    at = bytes(data).find(blob[:16])
    data[at + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="corrupted"):
        load_model(path)


def test_newer_version_and_other_files_rejected(fitted, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    with zipfile.ZipFile(path) as zf:
        header = json.loads(zf.read("header.json"))
        entries = {n: zf.read(n) for n in zf.namelist() if n != "header.json"}
    header["format_version"] = FORMAT_VERSION + 1
    newer = tmp_path / "newer.qkm"
    with zipfile.ZipFile(newer, "w") as zf:
        zf.writestr("header.json", json.dumps(header))
        for n, b in entries.items():
            zf.writestr(n, b)
    with pytest.raises(ModelFormatError, match="newer"):
        load_model(newer)
    np.save(tmp_path / "c.npy", fitted.cluster_centers_)
    with pytest.raises(ModelFormatError, match="not a qkm model"):
        load_model(tmp_path / "c.npy")


def test_failed_write_keeps_the_old_file(fitted, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        save_model(object(), path)
    with pytest.raises(TypeError):
        save_model(fitted, path, extra_metadata={"bad": object()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.qkm"]
