"""Model artefacts: the Model record, the safe format and the joblib artefact.

Round trips, corruption, versions, wrong kinds of file and atomic writes.
"""

import json
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

import qkm
from qkm.export import (
    FORMAT_VERSION,
    Model,
    ModelFormatError,
    data_fingerprint,
    load_joblib,
    load_model,
    save_joblib,
    save_model,
)
from qkm.export._safe import header_checksum


def read_entries(path):
    """The JSON header and the other zip entries of a model file."""
    with zipfile.ZipFile(path) as zf:
        header = json.loads(zf.read("header.json"))
        return header, {n: zf.read(n) for n in zf.namelist() if n != "header.json"}


def write_entries(path, header, entries):
    """A model file made of ``header`` and ``entries`` (to forge damaged files)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("header.json", json.dumps(header))
        for n, b in entries.items():
            zf.writestr(n, b)


@pytest.fixture(scope="module")
def fitted(blobs):
    return qkm.KMeans(5, random_state=0).fit(blobs[0])


def test_round_trip_is_bit_identical(fitted, blobs, tmp_path):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    model = load_model(path)
    assert model.operator.to_dense().tobytes() == fitted.cluster_centers_.tobytes()
    assert model.kind == "kmeans" and model.checksum.startswith("sha256:")
    np.testing.assert_array_equal(model.predict(blobs[0]), fitted.predict(blobs[0]))
    np.testing.assert_array_equal(model.predict(sp.csr_matrix(blobs[0])), fitted.labels_)
    assert model.metadata["n_clusters"] == 5 and model.format_version == FORMAT_VERSION


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
    header, entries = read_entries(path)
    header["format_version"] = FORMAT_VERSION + 1
    newer = tmp_path / "newer.qkm"
    write_entries(newer, header, entries)
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


@pytest.fixture(scope="module")
def fitted_chain(blobs):
    return qkm.QKMeans(6, sparsity_level=2, max_iter=5, palm_max_iter=20, random_state=0).fit(blobs[0])


def test_chain_round_trip_is_bit_identical(fitted_chain, blobs, tmp_path):
    path = tmp_path / "qk.qkm"
    written = save_model(fitted_chain, path, extra_metadata={"data_fingerprint": data_fingerprint(blobs[0])})
    model = load_model(path)
    assert model.kind == "factor-chain" and model.checksum == written.checksum
    assert len(model.operator.factors) == len(fitted_chain.factors_)
    for mine, theirs in zip(model.operator.factors, fitted_chain.factors_):
        for part in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(mine, part), getattr(theirs, part))
        assert mine.data.dtype == theirs.data.dtype
    np.testing.assert_array_equal(model.predict(blobs[0]), fitted_chain.predict(blobs[0]))
    np.testing.assert_array_equal(model.sq_norms, fitted_chain.operator_.row_sq_norms())


def test_metadata_records_how_the_model_was_trained(fitted_chain, blobs, tmp_path):
    path = tmp_path / "qk.qkm"
    save_model(fitted_chain, path, extra_metadata={"data_fingerprint": data_fingerprint(blobs[0])})
    meta = load_model(path).metadata
    assert meta["algorithm"] == "qkmeans" and meta["estimator"] == "QKMeans"
    assert meta["sparsity_level"] == 2 and meta["n_factors"] == len(fitted_chain.factors_)
    assert meta["objective"] == fitted_chain.inertia_
    assert (meta["n_clusters"], meta["n_features"]) == (6, blobs[0].shape[1])
    assert meta["nnz"] == sum(f.nnz for f in fitted_chain.factors_) and meta["qkm_version"] == qkm.__version__
    assert meta["data_fingerprint"] == data_fingerprint(blobs[0]) != data_fingerprint(blobs[0][:-1])
    assert data_fingerprint(sp.csr_matrix(blobs[0])) != data_fingerprint(blobs[0])


def test_model_record_predicts_like_the_estimator(fitted, blobs):
    model = Model.from_estimator(fitted)
    np.testing.assert_array_equal(model.predict(blobs[0]), fitted.labels_)
    np.testing.assert_allclose(model.transform(blobs[0][:7]), fitted.transform(blobs[0][:7]))
    assert model.describe()["n_clusters"] == 5 and not model.describe()["has_index"]
    with pytest.raises(ValueError, match="features"):
        model.predict(blobs[0][:, :2])
    with pytest.raises(ValueError, match="no search index"):
        model.search(blobs[0][:2])
    with pytest.raises(TypeError, match="fitted"):
        Model.from_estimator(qkm.KMeans(3))


def test_interrupted_write_leaves_the_old_file(fitted, fitted_chain, tmp_path, monkeypatch):
    path = tmp_path / "m.qkm"
    save_model(fitted, path)
    before = path.read_bytes()
    calls = []

    def failing_writestr(self, name, data, *args, **kwargs):
        calls.append(name)
        if len(calls) == 3:  # header and one array are already in the temporary file
            raise OSError("disk full")
        return original(self, name, data, *args, **kwargs)

    original = zipfile.ZipFile.writestr
    monkeypatch.setattr(zipfile.ZipFile, "writestr", failing_writestr)
    with pytest.raises(OSError, match="disk full"):
        save_model(fitted_chain, path)
    monkeypatch.undo()
    assert len(calls) == 3
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.qkm"]
    np.testing.assert_array_equal(load_model(path).operator.to_dense(), fitted.cluster_centers_)


def test_out_of_range_factor_index_rejected(fitted_chain, tmp_path):
    path = tmp_path / "qk.qkm"
    save_model(fitted_chain, path)
    header, entries = read_entries(path)
    import hashlib
    import io

    indices = np.load(io.BytesIO(entries["arrays/factor0_indices.npy"]))
    indices[0] = 10**6
    buf = io.BytesIO()
    np.save(buf, indices)
    entries["arrays/factor0_indices.npy"] = buf.getvalue()
    header["arrays"]["factor0_indices"]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    header["checksum"] = header_checksum(header)  # forged, but consistent
    bad = tmp_path / "bad.qkm"
    write_entries(bad, header, entries)
    with pytest.raises(ModelFormatError, match="factor 0 is not a valid CSR"):
        load_model(bad)


def test_joblib_round_trip(fitted_chain, blobs, tmp_path):
    path = tmp_path / "qk.joblib"
    save_joblib(fitted_chain, path)
    again = load_joblib(path)
    assert type(again) is qkm.QKMeans
    np.testing.assert_array_equal(again.predict(blobs[0]), fitted_chain.labels_)
    np.testing.assert_array_equal(again.cluster_centers_, fitted_chain.cluster_centers_)


def test_joblib_rejects_wrong_files(fitted, tmp_path):
    import joblib

    path = tmp_path / "m.joblib"
    save_joblib(fitted, path)
    data = path.read_bytes()
    truncated = tmp_path / "t.joblib"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="t.joblib"):
        load_joblib(truncated)
    joblib.dump({"some": "dict"}, tmp_path / "other.joblib")
    with pytest.raises(ModelFormatError, match="not a qkm artefact"):
        load_joblib(tmp_path / "other.joblib")
    save_model(fitted, tmp_path / "m.qkm")
    with pytest.raises(ModelFormatError):
        load_joblib(tmp_path / "m.qkm")
    with pytest.raises(ModelFormatError, match="joblib"):
        load_model(path)
    with pytest.raises(TypeError, match="fitted"):
        save_joblib(qkm.KMeans(2), tmp_path / "x.joblib")


def test_index_and_nystroem_parts_round_trip(fitted_chain, blobs, tmp_path):
    X, y = blobs[0], blobs[1]
    index = qkm.ClusterIndex(fitted_chain).fit(X, y)
    nystroem = qkm.Nystroem(n_components=fitted_chain.n_clusters_, landmarks=fitted_chain).fit(X)
    path = tmp_path / "full.qkm"
    save_model(fitted_chain, path, index=index, nystroem=nystroem)
    model = load_model(path)
    assert model.describe()["has_index"] and model.describe()["has_features"]
    for k, nprobe in ((1, 1), (3, 2)):
        expected = index.query(X[:25], k=k, nprobe=nprobe)
        got = model.search(X[:25], k=k, nprobe=nprobe)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(model.index.predict(X[:25]), index.predict(X[:25]))
    np.testing.assert_allclose(model.features(X[:25]), nystroem.transform(X[:25]), rtol=1e-12, atol=1e-15)
    # an index built on other centroids is refused
    other = qkm.KMeans(6, random_state=1).fit(X)
    with pytest.raises(ValueError, match="another centroid operator"):
        save_model(other, tmp_path / "bad.qkm", index=index)
    assert not (tmp_path / "bad.qkm").exists()


def test_inconsistent_part_rejected(fitted_chain, blobs, tmp_path):
    X, y = blobs[0], blobs[1]
    path = tmp_path / "full.qkm"
    save_model(qkm.ClusterIndex(fitted_chain).fit(X, y), path)
    header, entries = read_entries(path)
    index_arrays = sorted(n for n in header["arrays"] if n.startswith("index."))
    assert index_arrays  # the index travelled in the file
    victim = max(index_arrays, key=lambda n: int(np.prod(header["arrays"][n]["shape"]) or 0))
    del header["arrays"][victim]  # a part with a missing array (checksums still consistent)
    header["checksum"] = header_checksum(header)  # forged, but consistent
    bad = tmp_path / "bad.qkm"
    write_entries(bad, header, entries)
    with pytest.raises(ModelFormatError, match="ClusterIndex is inconsistent"):
        load_model(bad)


def test_shipped_demo_model_is_rebuilt_by_its_command(tmp_path):
    """models/ holds artefacts reproducible by a committed command: a rebuild computes what the shipped model does.

    Checked by what the models compute on the bundled sample (labels equal, objective and features within a
    tolerance), never by a checksum: floats rebuilt on another CPU or with another numpy/BLAS differ in their
    last bits."""
    import importlib.util

    from qkm.datasets import load_fashion_mnist_sample
    from qkm.serve import demo_model_path

    script = demo_model_path().parent / "build_demo_model.py"
    spec = importlib.util.spec_from_file_location("build_demo_model", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rebuilt = module.build(tmp_path / "demo.qkm")
    shipped = load_model(demo_model_path())
    X, _ = load_fashion_mnist_sample(np.float32)
    labels, sq_dist = shipped.assign(X)
    # the shipped file is consistent: its objective is what its centroids give on the data it was trained on
    np.testing.assert_allclose(sq_dist.sum(dtype=np.float64), shipped.metadata["objective"], rtol=1e-4)
    assert (rebuilt.kind, rebuilt.n_clusters, rebuilt.n_features) == (shipped.kind, shipped.n_clusters,
                                                                      shipped.n_features)
    np.testing.assert_array_equal(rebuilt.predict(X), labels)
    np.testing.assert_allclose(rebuilt.metadata["objective"], shipped.metadata["objective"], rtol=1e-4)
    queries = X[module.INDEXED_ROWS:module.INDEXED_ROWS + 50]  # rows the index does not hold
    np.testing.assert_array_equal(rebuilt.search(queries, k=3)[1], shipped.search(queries, k=3)[1])
    np.testing.assert_allclose(rebuilt.features(queries), shipped.features(queries), rtol=1e-4, atol=1e-6)
    assert load_model(tmp_path / "demo.qkm").format_version == shipped.format_version == FORMAT_VERSION
