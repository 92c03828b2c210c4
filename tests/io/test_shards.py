"""qkm shard: every input format round-trips, shards are checked on load, writing is atomic."""

import bz2
import gzip
import json
import mmap
import os
import struct

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from qkm import _config
from qkm.io._shard_writer import write_shards
from qkm.io._shards import ShardError, load_shard, read_manifest
from qkm.cli import main
from qkm.io import DataFormatError, load_data


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 16 rows, so that tiny files give several tree-aligned shards."""
    monkeypatch.setattr(_config, "REDUCE_BLOCK_ROWS", 16)


@pytest.fixture(scope="module")
def matrices():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 6)) * (rng.random((150, 6)) < 0.4)
    X[:, -1] = 0.0  # a last column with no entry: svmlight cannot know it exists
    X[7] = 0.0  # an empty row
    return X, rng.integers(0, 3, 150)


def _files(tmp, X, y):
    S = sp.csr_matrix(X)
    out = {}
    np.save(tmp / "a.npy", X)
    out["npy"] = tmp / "a.npy"
    np.savetxt(tmp / "a.csv", X, delimiter=",", header=",".join("abcdef"), comments="")
    out["csv"] = tmp / "a.csv"
    np.savetxt(tmp / "b.csv.gz", X, delimiter=",")
    out["csv.gz"] = tmp / "b.csv.gz"
    sp.save_npz(tmp / "a.npz", S)
    out["npz"] = tmp / "a.npz"
    np.savez(tmp / "b.npz", X=X, y=y)
    out["npz-dense"] = tmp / "b.npz"
    dump_svmlight_file(S, y, str(tmp / "a.svm"))
    raw = (tmp / "a.svm").read_bytes()
    out["svmlight"] = tmp / "a.svm"
    with bz2.open(tmp / "a.svm.bz2", "wb") as f:
        f.write(raw)
    out["svmlight.bz2"] = tmp / "a.svm.bz2"
    with gzip.open(tmp / "a.svm.gz", "wb") as f:
        f.write(raw)
    out["svmlight.gz"] = tmp / "a.svm.gz"
    dump_svmlight_file(S, y, str(tmp / "z.svm"), zero_based=True)
    out["svmlight-0"] = tmp / "z.svm"
    scipy.io.mmwrite(tmp / "a.mtx", S)
    out["mtx"] = tmp / "a.mtx"
    img = (np.abs(X[:, :4]) * 40).astype(np.uint8).reshape(150, 2, 2)
    with gzip.open(tmp / "t-images-idx3-ubyte.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + struct.pack(">3I", *img.shape) + img.tobytes())
    out["idx"] = tmp / "t-images-idx3-ubyte.gz"
    return out


FORMATS = ["npy", "csv", "csv.gz", "npz", "npz-dense", "svmlight", "svmlight.bz2", "svmlight.gz", "svmlight-0",
           "mtx", "idx"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format(tmp_path, matrices, fmt):
    path = _files(tmp_path, *matrices)[fmt]
    X_ref, y_ref = load_data(path)
    m = write_shards(path, tmp_path / "sh", rows_per_shard=20, block_lines=7)  # 20 -> 32 rows per shard
    assert [e["n_rows"] for e in m["shards"]] == [32] * 4 + [22]
    X, y = load_data(tmp_path / "sh")
    assert type(X) is type(X_ref) and X.dtype == X_ref.dtype and X.shape == X_ref.shape
    np.testing.assert_array_equal(X.toarray() if sp.issparse(X) else X, X_ref.toarray() if sp.issparse(X_ref) else X_ref)
    assert (y is None) == (y_ref is None)
    if y is not None:
        np.testing.assert_array_equal(y, y_ref)
    assert load_data(tmp_path / "sh" / "manifest.json")[0].shape == X_ref.shape
    # a shard opens memory-mapped (a CSR one from three .npy files), without a copy
    m = read_manifest(tmp_path / "sh")
    X0, _ = load_shard(m, 0)
    arrays = (X0.data, X0.indices, X0.indptr) if sp.issparse(X0) else (X0,)
    assert all(_mapped(a) for a in arrays)


def _mapped(a):
    """Whether an array's memory is a file mapping (its base chain ends in an mmap)."""
    while a is not None:
        if isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


def test_changed_or_missing_shard_is_rejected(tmp_path, matrices):
    write_shards(matrices[0], tmp_path / "sh", rows_per_shard=32)
    path = tmp_path / "sh" / "shard-00001.npy"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40  # same size, other content
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="shard-00001.*changed on disk"):
        load_data(tmp_path / "sh")
    os.unlink(path)
    with pytest.raises(ShardError, match="missing"):
        load_data(tmp_path / "sh")


def test_manifest_checks(tmp_path, matrices):
    write_shards(matrices[0], tmp_path / "sh", rows_per_shard=32)
    mpath = tmp_path / "sh" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["format_version"] = 99
    mpath.write_text(json.dumps(m))
    with pytest.raises(ShardError, match="version 99"):
        read_manifest(tmp_path / "sh")
    mpath.write_text("{not json")
    with pytest.raises(ShardError, match="unreadable"):
        read_manifest(tmp_path / "sh")


def test_writing_is_atomic_and_never_replaces_silently(tmp_path, matrices):
    X = matrices[0]
    write_shards(X, tmp_path / "sh", rows_per_shard=32)
    with pytest.raises(FileExistsError):
        write_shards(X, tmp_path / "sh")
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5\n2 3:x\n")
    with pytest.raises(DataFormatError, match="line 2"):
        write_shards(bad, tmp_path / "sh", overwrite=True)
    assert load_data(tmp_path / "sh")[0].shape == X.shape  # the old directory is intact
    assert sorted(os.listdir(tmp_path)) == ["bad.svm", "sh"]  # no temporary left behind
    write_shards(2 * X, tmp_path / "sh", rows_per_shard=64, overwrite=True)
    np.testing.assert_array_equal(load_data(tmp_path / "sh")[0], 2 * X)


def test_layout_rules(tmp_path, matrices):
    X = matrices[0]
    m = write_shards(X, tmp_path / "a", sizes=[32, 0, 32, 64, 22])  # whole tree nodes, an empty shard
    assert [e["row_start"] for e in m["shards"]] == [0, 32, 32, 64, 128]
    with pytest.raises(ValueError, match="not a whole node"):
        write_shards(X, tmp_path / "b", sizes=[48, 102])
    with pytest.raises(ValueError, match="sizes add up"):
        write_shards(X, tmp_path / "c", sizes=[64, 64])


def test_cli_shard_then_train_in_process(tmp_path, matrices, capsys):
    X, y = matrices
    dump_svmlight_file(sp.csr_matrix(X), y, str(tmp_path / "d.svm"))
    assert main(["shard", str(tmp_path / "d.svm"), "-o", str(tmp_path / "sh"), "--rows-per-shard", "40",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shards"] == 3 and summary["n_rows"] == 150
    assert main(["train", str(tmp_path / "sh"), "-k", "3", "--seed", "0", "-o", str(tmp_path / "m.qkm"), "-q",
                 "--json"]) == 0
    on_shards = json.loads(capsys.readouterr().out)
    assert main(["train", str(tmp_path / "d.svm"), "-k", "3", "--seed", "0", "-o", str(tmp_path / "n.qkm"), "-q",
                 "--json"]) == 0
    on_file = json.loads(capsys.readouterr().out)
    assert on_shards["inertia"] == on_file["inertia"]
