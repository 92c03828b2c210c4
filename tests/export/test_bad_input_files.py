"""The bad-input catalogue, model files and in-process rows: a damaged file is a ModelFormatError, never a crash
or silent garbage (split from ``test_bad_input.py``, whose docstring tells the whole catalogue)."""

import io
import json
import os
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

import qkm
from qkm.export import ModelFormatError, load_model, save_model
from qkm.export._model import content_checksum
from qkm.export._safe import header_checksum
from qkm.serve import create_app, demo_model_path
from support import run_cli
from support import npy_bytes

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
