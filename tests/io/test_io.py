"""Tests for qkm.io: loading every format, error messages, atomic saving."""

import bz2
import doctest
import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

import qkm.io._files
from qkm.io import DataFormatError, load_data, load_labels, save_centroids, save_labels

COMPRESSIONS = ["", ".gz", ".bz2"]


def write(path, data):
    """Write bytes or str to ``path``, compressing by its .gz / .bz2 suffix."""
    data = data.encode() if isinstance(data, str) else data
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(os.path.splitext(str(path))[1], open)
    with opener(path, "wb") as f:
        f.write(data)
    return path


def idx_bytes(a, code=0x08):
    """Hand-written IDX file: 0x00 0x00, dtype code, ndim, big-endian sizes, big-endian data."""
    big_endian = {0x08: ">u1", 0x0B: ">i2", 0x0D: ">f4", 0x0E: ">f8"}[code]
    header = bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    return header + a.astype(big_endian).tobytes()


def assert_canonical_csr(X, dtype=np.float64):
    assert isinstance(X, sp.csr_matrix)
    assert X.dtype == dtype
    assert X.indices.dtype == np.int32 and X.indptr.dtype == np.int32
    for start, stop in zip(X.indptr[:-1], X.indptr[1:]):
        assert np.all(np.diff(X.indices[start:stop]) > 0)  # sorted, no duplicates


def load_error(path, **kwargs):
    with pytest.raises(DataFormatError) as info:
        load_data(path, **kwargs)
    assert os.path.basename(str(path)) in str(info.value)
    assert info.value.path == str(path)
    return info.value


@pytest.fixture
def dense():
    return np.random.default_rng(0).normal(size=(7, 4))


@pytest.fixture
def sparse():
    X = sp.random(9, 6, density=0.4, format="csr", random_state=0)
    X.data = np.round(X.data * 10, 3) + 1
    return X


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_npy_round_trip(tmp_path, dense, dtype):
    np.save(tmp_path / "X.npy", np.asfortranarray(dense))
    X, y = load_data(tmp_path / "X.npy", dtype=dtype)
    assert y is None and X.dtype == dtype and X.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(X, dense.astype(dtype))


@pytest.mark.parametrize("comp", COMPRESSIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csv_round_trip(tmp_path, dense, comp, dtype):
    text = "a,b,c,d\n" + "".join(",".join(map(repr, row.tolist())) + "\n" for row in dense)
    X, y = load_data(write(tmp_path / f"X.csv{comp}", text), dtype=dtype)
    assert y is None and X.dtype == dtype and X.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(X, dense.astype(dtype))


def test_csv_without_header_single_column_and_blank_lines(tmp_path):
    X, _ = load_data(write(tmp_path / "c.csv", "1\n\n2.5\r\n-3\n"))
    np.testing.assert_array_equal(X, [[1], [2.5], [-3]])


def test_nan_and_inf_are_loaded_faithfully(tmp_path):
    X, _ = load_data(write(tmp_path / "n.csv", "nan,1\ninf,-inf\n"))
    assert np.isnan(X[0, 0]) and np.isposinf(X[1, 0]) and np.isneginf(X[1, 1])
    np.save(tmp_path / "n.npy", X)
    assert np.isnan(load_data(tmp_path / "n.npy")[0][0, 0])


@pytest.mark.parametrize("comp", COMPRESSIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_svmlight_round_trip(tmp_path, sparse, comp, dtype):
    y_true = np.arange(9) % 3
    plain = tmp_path / "d.svm"
    dump_svmlight_file(sparse, y_true, str(plain), zero_based=False)
    path = write(tmp_path / f"d.svm{comp}", plain.read_bytes())
    X, y = load_data(path, dtype=dtype, n_features=6)
    assert_canonical_csr(X, dtype)
    np.testing.assert_allclose(X.toarray(), sparse.toarray(), rtol=1e-6)
    np.testing.assert_array_equal(y, y_true)
    assert y.dtype == np.int64


def test_svmlight_without_suffix_zero_based_and_n_features(tmp_path):
    path = write(tmp_path / "news20.bz2", "# comment\n1.5 0:1 2:3 # tail\n\n-1 qid:4 1:2\n")
    X, y = load_data(path)  # no recognised suffix: svmlight; index 0 present: 0-based
    np.testing.assert_array_equal(X.toarray(), [[1, 0, 3], [0, 2, 0]])
    np.testing.assert_array_equal(y, [1.5, -1])
    X, _ = load_data(path, n_features=10)
    assert X.shape == (2, 10)
    X, _ = load_data(write(tmp_path / "one.txt", "1 1:1 3:2\n"), format="svmlight")
    np.testing.assert_array_equal(X.toarray(), [[1, 0, 2]])


def test_npz_scipy_format_is_canonicalised(tmp_path):
    unsorted = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3])),
                             shape=(1, 4))  # unsorted, with a duplicate
    sp.save_npz(tmp_path / "X.npz", unsorted, compressed=False)
    X, y = load_data(tmp_path / "X.npz", dtype=np.float32)
    assert y is None
    assert_canonical_csr(X, np.float32)
    np.testing.assert_array_equal(X.toarray(), [[2, 0, 4, 0]])


def test_npz_savez_with_labels(tmp_path, dense):
    np.savez(tmp_path / "Xy.npz", X=dense, y=np.arange(7.0))
    X, y = load_data(tmp_path / "Xy.npz")
    assert isinstance(X, np.ndarray) and X.flags.c_contiguous  # dense stays dense
    np.testing.assert_array_equal(X, dense)
    np.testing.assert_array_equal(y, np.arange(7))
    np.savez(tmp_path / "X.npz", X=dense)
    assert load_data(tmp_path / "X.npz")[1] is None


@pytest.mark.parametrize("comp", COMPRESSIONS)
def test_mtx_round_trip(tmp_path, sparse, comp):
    scipy.io.mmwrite(tmp_path / "m.mtx", sparse)
    path = write(tmp_path / f"m.mtx{comp}", (tmp_path / "m.mtx").read_bytes())
    X, y = load_data(path)
    assert y is None
    assert_canonical_csr(X)
    np.testing.assert_allclose(X.toarray(), sparse.toarray())


def test_mtx_duplicates_are_summed(tmp_path):
    text = "%%MatrixMarket matrix coordinate real general\n2 3 3\n1 3 1.0\n1 1 2.0\n1 3 4.0\n"
    X, _ = load_data(write(tmp_path / "d.mtx", text))
    assert_canonical_csr(X)
    np.testing.assert_array_equal(X.toarray(), [[2, 0, 5], [0, 0, 0]])


@pytest.mark.parametrize("comp", COMPRESSIONS)
@pytest.mark.parametrize("name", ["train-images-idx3-ubyte", "images.idx"])
def test_idx_images_round_trip(tmp_path, comp, name):
    images = np.random.default_rng(1).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    X, y = load_data(write(tmp_path / (name + comp), idx_bytes(images)), dtype=np.float32)
    assert y is None and X.shape == (5, 784) and X.dtype == np.float32
    assert X.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(X, images.reshape(5, 784))


@pytest.mark.parametrize("code", [0x0B, 0x0D, 0x0E])
def test_idx_big_endian_dtypes(tmp_path, code):
    a = np.arange(-6, 6).reshape(3, 2, 2)
    X, _ = load_data(write(tmp_path / "a.idx", idx_bytes(a, code)))
    np.testing.assert_array_equal(X, a.reshape(3, 4))


def test_explicit_format_overrides_suffix(tmp_path, dense):
    np.save(tmp_path / "X.npy", dense)
    os.replace(tmp_path / "X.npy", tmp_path / "X.bin")
    np.testing.assert_array_equal(load_data(tmp_path / "X.bin", format="npy")[0], dense)
    with pytest.raises(ValueError, match="format must be one of"):
        load_data(tmp_path / "X.bin", format="parquet")


# ------------------------------------------------------------------ malformed files

@pytest.mark.parametrize("text, kwargs, line, fragment", [
    ("1 1:2\nabc 1:2\n", {}, 2, "label 'abc' is not a number"),
    ("1 1:2\n2 3:4\n1 5\n", {}, 3, "token '5' has no ':'"),
    ("1 1:2\n2 3:x\n", {}, 2, "value in '3:x' is not a number"),
    ("1 a:2\n", {}, 1, "feature index in 'a:2' is not an integer"),
    ("1 2:1\n\n# c\n2 0:1\n", {"zero_based": False}, 4,
     "feature index 0 is out of range (indices are 1-based)"),
    ("1 2:1\n2 -1:1\n", {}, 2, "feature index -1 is out of range"),
    ("1 1:1\n1 5:1 3:1\n", {}, 2, "strictly increasing (3 after 5)"),
    ("1 1:1\n1 3:1\n1 4:1\n", {"n_features": 3}, 3, "feature index 4 is beyond n_features=3"),
    ("1 0:1\n1 3:1\n", {"n_features": 3}, 2, "indices are 0-based"),
    ("1:2 3:4\n", {}, 1, "is the label missing?"),
])
def test_svmlight_errors_name_file_and_line(tmp_path, text, kwargs, line, fragment):
    for comp in COMPRESSIONS:
        err = load_error(write(tmp_path / f"news.svm{comp}", text), **kwargs)
        assert err.line == line
        assert f"news.svm{comp}: line {line}: " in str(err)
        assert fragment in str(err)


@pytest.mark.parametrize("text, line, fragment", [
    ("x,y,z\n1,2,3\n4,5,6\n7,8\n", 4, "has 2 columns, expected 3 (as on line 2)"),
    ("1,2\n3,abc\n", 2, "column 2: 'abc' is not a number"),
    ("1,2\n\n3,4\n5,,\n", 4, "has 3 columns"),
    ("1,2\n3, \n", 2, "column 2 is empty"),
    ("a,b\n1,2\nc,d\n", 3, "column 1: 'c' is not a number"),
    ("1,b\n", 1, "column 2: 'b' is not a number"),  # partly numeric: not a header
])
def test_csv_errors_name_file_and_line(tmp_path, text, line, fragment):
    for comp in COMPRESSIONS:
        err = load_error(write(tmp_path / f"data.csv{comp}", text))
        assert err.line == line
        assert f"data.csv{comp}: line {line}: {fragment}" in str(err)


MTX = b"%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.5\n"


@pytest.mark.parametrize("content, line, fragment", [
    (MTX + b"3 2 x\n", 4, "Invalid floating-point value"),
    (MTX + b"3 2 x", 4, "Invalid floating-point value"),  # no final newline
    (MTX.replace(b"1.5", b"1.5\x00"), 3, "contains a NUL byte"),  # crashed scipy 1.17
    (b"%%MatrixMarket matrix array real general\n2 1\n1\n2\x00", 4, "contains a NUL byte"),
    (b"%%NotMatrixMarket\n", 1, "Not a Matrix Market file"),
])
def test_mtx_errors_name_file_and_line(tmp_path, content, line, fragment):
    for comp in COMPRESSIONS:
        err = load_error(write(tmp_path / f"m.mtx{comp}", content))
        assert err.line == line
        assert f"m.mtx{comp}: line {line}: " in str(err) and fragment in str(err)


def test_mtx_without_final_newline(tmp_path):
    X, _ = load_data(write(tmp_path / "m.mtx", MTX + b"3 2 2"))
    np.testing.assert_array_equal(X.toarray(), [[1.5, 0, 0], [0, 0, 0], [0, 2, 0]])


@pytest.mark.parametrize("name, content", [
    ("e.csv", ""), ("h.csv", "a,b\n"), ("e.csv.gz", ""), ("e.svm", ""),
    ("c.svm", "# only a comment\n\n"), ("e.npy", np.zeros((0, 3))), ("e.idx", np.zeros((0, 4, 4))),
    ("e.npz", sp.csr_matrix((0, 3))),
])
def test_no_rows(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, str):
        write(path, content)
    elif sp.issparse(content):
        sp.save_npz(path, content)
    elif name.endswith(".npy"):
        np.save(path, content)
    else:
        write(path, idx_bytes(content.astype(np.uint8)))
    err = load_error(path)
    assert "holds no rows" in str(err) and err.line is None


@pytest.mark.parametrize("name, content, fragment", [
    ("text.npy", b"1,2,3\n", "cannot be read as npy"),
    ("truncated.npy", b"\x93NUMPY", "cannot be read as npy"),
    ("garbage.npz", b"not a zip", "cannot be read as npz"),
    ("garbage.mtx", b"\x1f\x8b\x08garbage", "line 1: Not a Matrix Market file"),
    ("plain.csv.gz", b"1,2\n", "cannot be read as csv"),
    ("plain.svm.bz2", b"1 1:2\n", "cannot be read as svmlight"),
    ("binary.csv", b"\xff\xfe\x00\x01\n", "line 1: not UTF-8 text"),
    ("bad-magic.idx", b"\x08\x03\x00\x00" + bytes(20), "bad magic number 0x08030000"),
    ("bad-type.idx", b"\x00\x00\x07\x01" + bytes(8), "bad magic number"),
    ("short-idx1-ubyte", b"\x00\x00\x08\x02\x00\x00", "truncated IDX header"),
    ("short.idx", b"\x00\x00\x08\x02\x00\x00\x00\x02\x00\x00\x00\x02\x01", "header announces"),
    ("x.npy.gz", gzip.compress(b"x"), "decompress the file first"),
])
def test_wrong_content_for_format(tmp_path, name, content, fragment):
    (tmp_path / name).write_bytes(content)
    err = load_error(tmp_path / name)
    assert fragment in str(err)
    if "cannot be read" in fragment:
        assert err.__cause__ is not None  # the library error is chained, not lost


def test_npy_and_npz_shape_and_dtype_errors(tmp_path):
    np.save(tmp_path / "v.npy", np.arange(3.0))
    assert "a 2-D array (n_samples, n_features) is expected" in str(load_error(tmp_path / "v.npy"))
    np.save(tmp_path / "s.npy", np.array([["a", "b"]]))
    assert "non-numeric" in str(load_error(tmp_path / "s.npy"))
    np.savez(tmp_path / "a.npz", data=np.ones((2, 2)))
    assert "array named 'X'" in str(load_error(tmp_path / "a.npz"))
    np.savez(tmp_path / "b.npz", X=np.ones((2, 2)), y=np.ones(3))
    assert "3 labels for 2 rows" in str(load_error(tmp_path / "b.npz"))
    np.save(tmp_path / "c.npy", np.ones((2, 2)))
    os.replace(tmp_path / "c.npy", tmp_path / "c.npz")
    assert "not an .npz archive" in str(load_error(tmp_path / "c.npz"))


def test_idx_labels_file_points_to_load_labels(tmp_path):
    path = write(tmp_path / "train-labels-idx1-ubyte.gz", idx_bytes(np.array([3, 1, 4])))
    assert "use load_labels" in str(load_error(path))
    np.testing.assert_array_equal(load_labels(path), [3, 1, 4])


def test_n_features_must_match_for_other_formats(tmp_path, dense):
    np.save(tmp_path / "X.npy", dense)
    assert "has 4 features, n_features=5" in str(load_error(tmp_path / "X.npy", n_features=5))
    assert load_data(tmp_path / "X.npy", n_features=4)[0].shape == (7, 4)


def test_missing_file_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_data(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match="nope.svm.bz2"):
        load_data(tmp_path / "nope.svm.bz2")
    with pytest.raises(ValueError, match="zero_based"):
        load_data(write(tmp_path / "a.svm", "1 1:1\n"), zero_based="yes")


def test_error_attributes_and_pickling():
    err = DataFormatError("news.svm", "feature index 0 is out of range (indices are 1-based)", 17)
    assert str(err) == "news.svm: line 17: feature index 0 is out of range (indices are 1-based)"
    assert isinstance(err, ValueError) and (err.path, err.line) == ("news.svm", 17)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.line == 17
    assert str(DataFormatError("a.npy", "holds no rows")) == "a.npy: holds no rows"


# ------------------------------------------------------------------ labels

@pytest.mark.parametrize("name", ["y.txt", "y.csv.gz", "y.labels.bz2", "y.npy"])
def test_labels_round_trip(tmp_path, name):
    save_labels(tmp_path / name, np.array([2, 0, 1, 1], dtype=np.int32))
    y = load_labels(tmp_path / name)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, [2, 0, 1, 1])


def test_save_labels_text_accepts_integral_floats(tmp_path):
    save_labels(tmp_path / "y.txt", [1.0, 2.0])
    assert (tmp_path / "y.txt").read_text() == "1\n2\n"


@pytest.mark.parametrize("text, line, fragment", [
    ("1\n2\nx\n", 3, "line 3: column 1: 'x' is not a number"),
    ("1\n2,3\n", 2, "line 2: has 2 columns"),
])
def test_bad_labels_text(tmp_path, text, line, fragment):
    with pytest.raises(DataFormatError) as info:
        load_labels(write(tmp_path / "y.txt", text))
    assert "y.txt" in str(info.value) and fragment in str(info.value)
    assert info.value.line == line


def test_labels_file_shape_errors(tmp_path):
    with pytest.raises(DataFormatError, match="2 columns; a labels file holds one label"):
        load_labels(write(tmp_path / "y.csv", "1,2\n3,4\n"))
    np.save(tmp_path / "y.npy", np.ones((2, 2)))
    with pytest.raises(DataFormatError, match="y.npy: labels must be 1-D"):
        load_labels(tmp_path / "y.npy")
    with pytest.raises(DataFormatError, match="e.txt: holds no rows"):
        load_labels(write(tmp_path / "e.txt", ""))


# ------------------------------------------------------------------ atomic saving

def assert_untouched(path, content):
    assert path.read_bytes() == content
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left


@pytest.mark.parametrize("name, labels", [
    ("y.txt", np.array(["1", "cat"])), ("y.txt", [1.5, 2.0]), ("y.npy", np.array([{}, 1]))])
def test_failed_save_labels_leaves_existing_file(tmp_path, name, labels):
    path = tmp_path / name
    path.write_bytes(b"old contents\n")
    with pytest.raises(ValueError):
        save_labels(path, labels)
    assert_untouched(path, b"old contents\n")


def test_save_labels_rejects_2d(tmp_path):
    with pytest.raises(ValueError, match="1-D"):
        save_labels(tmp_path / "y.txt", np.zeros((2, 2)))


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_centroids_round_trip_is_exact(tmp_path, suffix, dtype):
    centers = np.random.default_rng(2).normal(size=(3, 5)).astype(dtype) / 3
    save_centroids(tmp_path / f"c{suffix}", centers)
    X, _ = load_data(tmp_path / f"c{suffix}", dtype=dtype)
    np.testing.assert_array_equal(X, centers)


def test_save_centroids_accepts_sparse_and_checks_input(tmp_path):
    save_centroids(tmp_path / "c.npy", sp.csr_matrix(np.eye(2)))
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), np.eye(2))
    with pytest.raises(ValueError, match=".npy or .csv"):
        save_centroids(tmp_path / "c.txt", np.eye(2))
    with pytest.raises(ValueError, match="2-D"):
        save_centroids(tmp_path / "c.csv", np.ones(3))


def test_failed_save_centroids_leaves_existing_file(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(b"1,2\n")
    with pytest.raises((TypeError, ValueError)):
        save_centroids(path, np.array([[{}, 1]], dtype=object))
    assert_untouched(path, b"1,2\n")


def test_docstring_examples():
    result = doctest.testmod(qkm.io._files, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
