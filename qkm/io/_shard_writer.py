"""``qkm shard``: cut a data file (or an in-memory matrix) into shards on disk (private).

See :mod:`qkm.io._shards` for the layout and the reading side. The input is
streamed in row blocks (:mod:`qkm.io._shard_readers`) into a temporary
directory, one shard in memory at a time, hashed, and renamed into place.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import scipy.sparse as sp

from .. import _config
from ._shard_readers import guess_format, iter_blocks
from ._shards import (FORMAT, FORMAT_VERSION, MANIFEST, _sha256, aligned_rows_per_shard, check_layout,
                      default_rows_per_shard)

__all__ = ["write_shards"]


def _save(directory, name, array):
    path = os.path.join(directory, name)
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    return {"file": name, "bytes": os.path.getsize(path)}


class _Writer:
    """Collects row blocks and writes whole shards."""

    def __init__(self, directory, sizes, rows_per_shard):
        self.directory = directory
        self.sizes = list(sizes) if sizes is not None else None
        self.rows_per_shard = rows_per_shard
        self.pending, self.pending_y, self.pending_rows = [], [], 0
        self.shards = []
        self.row = 0
        self.sparse = None
        self.n_features = None
        self.dtype = None

    def _next_size(self):
        if self.sizes is None:
            return self.rows_per_shard
        i = len(self.shards)
        return self.sizes[i] if i < len(self.sizes) else None

    def add(self, X, y):
        if self.sparse is None:
            self.sparse, self.dtype = sp.issparse(X), X.dtype
        if self.sparse:
            self.n_features = max(self.n_features or 0, X.shape[1])
        elif self.n_features is None:
            self.n_features = X.shape[1]
        self.pending.append(X)
        self.pending_y.append(y)
        self.pending_rows += X.shape[0]
        self._flush(final=False)

    def _take(self, rows):
        """Remove and return the first ``rows`` pending rows (X, y)."""
        xs, ys, got = [], [], 0
        while got < rows:
            X, y = self.pending[0], self.pending_y[0]
            need = rows - got
            if X.shape[0] <= need:
                xs.append(X)
                ys.append(y)
                self.pending.pop(0)
                self.pending_y.pop(0)
                got += X.shape[0]
            else:
                xs.append(X[:need])
                ys.append(None if y is None else y[:need])
                self.pending[0], self.pending_y[0] = X[need:], (None if y is None else y[need:])
                got += need
        self.pending_rows -= rows
        if self.sparse:
            X = sp.vstack([sp.csr_matrix(x, shape=(x.shape[0], self.n_features)) for x in xs], format="csr") \
                if xs else sp.csr_matrix((0, self.n_features or 0), dtype=self.dtype)
        else:
            X = np.concatenate(xs) if xs else np.zeros((0, self.n_features or 0), dtype=self.dtype)
        y = None if not ys or any(v is None for v in ys) else np.concatenate(ys)
        return X, y

    def _flush(self, final):
        while True:
            size = self._next_size()
            if size is None:
                if self.pending_rows and self.sizes is not None:
                    raise ValueError(f"sizes add up to {sum(self.sizes)} rows but the data hold more.")
                return
            if self.pending_rows < size and not final:
                return
            if final and self.pending_rows == 0 and (self.sizes is None or len(self.shards) >= len(self.sizes)):
                return
            if final and self.sizes is not None and self.pending_rows < size:
                raise ValueError(f"sizes add up to {sum(self.sizes)} rows but the data hold fewer.")
            X, y = self._take(min(size, self.pending_rows))
            self._write(X, y)

    def _write(self, X, y):
        name = f"shard-{len(self.shards):05d}"
        entry = {"name": name, "row_start": self.row, "n_rows": int(X.shape[0]), "files": {}}
        if self.sparse:
            entry["nnz"] = int(X.nnz)
            # one index dtype for both, so that scipy wraps the memory maps without a copy
            index = np.int32 if X.nnz <= np.iinfo(np.int32).max else np.int64
            entry["files"]["indptr"] = _save(self.directory, f"{name}.indptr.npy", X.indptr.astype(index))
            entry["files"]["indices"] = _save(self.directory, f"{name}.indices.npy", X.indices.astype(index))
            entry["files"]["data"] = _save(self.directory, f"{name}.data.npy", X.data)
        else:
            entry["nnz"] = int(X.size)
            entry["files"]["X"] = _save(self.directory, f"{name}.npy", X)
        if y is not None:
            entry["files"]["y"] = _save(self.directory, f"{name}.y.npy", y)
        self.shards.append(entry)
        self.row += X.shape[0]


def write_shards(data, directory, *, rows_per_shard=None, sizes=None, format=None, dtype=np.float64,
                 zero_based="auto", overwrite=False, block_lines=None):
    """Cut a data set into shards on disk (what ``qkm shard`` runs).

    Parameters
    ----------
    data : str, os.PathLike, ndarray or sparse matrix
        A data file in any format :func:`qkm.io.load_data` reads (streamed in
        row blocks), or an in-memory matrix.
    directory : str or os.PathLike
        Shard directory to create. It is written under a temporary name and
        renamed into place at the end.
    rows_per_shard : int, default=None
        Rounded up to ``REDUCE_BLOCK_ROWS`` times a power of two; ``None``
        aims at about 128 MB shards.
    sizes : sequence of int, default=None
        Explicit row count of every shard instead (zeros allowed); each
        nonempty shard must be a whole node of the summation tree.
    format : str, default=None
        Input format; ``None`` guesses from the file name as ``load_data`` does.
    dtype : {np.float64, np.float32}, default=np.float64
    zero_based : bool or "auto", default="auto"
        svmlight only, as in :func:`qkm.io.load_data`.
    overwrite : bool, default=False
        Replace an existing directory (only once the new one is complete).

    Returns
    -------
    manifest : dict

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> d = os.path.join(tempfile.mkdtemp(), "shards")
    >>> m = write_shards(np.arange(12.0).reshape(6, 2), d)
    >>> m["n_rows"], m["n_features"], len(m["shards"])
    (6, 2, 1)
    >>> from qkm.io._shards import load_sharded
    >>> load_sharded(d)[0].shape
    (6, 2)
    """
    from ._readers import FORMATS

    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not overwrite:
        raise FileExistsError(f"{directory} already exists; pass overwrite=True (--overwrite) to replace it.")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64; got {dtype}.")
    block_rows = _config.REDUCE_BLOCK_ROWS
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        if any(s < 0 for s in sizes):
            raise ValueError("shard sizes must be >= 0.")
        check_layout(sizes, block_rows)
    block = int(block_lines) if block_lines else None
    if isinstance(data, (str, os.PathLike)):
        fmt = guess_format(data, format)
        blocks = iter_blocks(data, fmt, dtype, **({"block": block} if block else {}), zero_based=zero_based)
        source = os.path.basename(os.fspath(data))
    else:
        from .._validation import check_data

        X = check_data(data, dtype=dtype)
        fmt, source = ("csr" if sp.issparse(X) else "dense"), None
        step = block or 65536
        blocks = ((X[i:i + step], None) for i in range(0, X.shape[0], step))
        if format is not None and format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".", suffix=".tmp", dir=parent)
    try:
        writer = None
        min_index = None
        for X, y in blocks:
            if writer is None:
                if rows_per_shard is None and sizes is None:
                    per_row = (X.data.nbytes + X.indices.nbytes + 8 * X.shape[0]) / max(X.shape[0], 1) \
                        if sp.issparse(X) else X.itemsize * X.shape[1]
                    rps = default_rows_per_shard(per_row, block_rows)
                else:
                    rps = aligned_rows_per_shard(rows_per_shard, block_rows) if sizes is None else None
                writer = _Writer(tmp, sizes, rps)
            if sp.issparse(X) and X.nnz:
                low = int(X.indices.min())
                min_index = low if min_index is None else min(min_index, low)
            writer.add(X, y)
        writer._flush(final=True)
        shift = 0
        if fmt == "svmlight":
            shift = _svmlight_shift(zero_based, min_index)
            n_features = _svmlight_n_features(data, writer, shift)
        else:
            n_features = writer.n_features
        manifest = _finish(tmp, writer, n_features, shift, block_rows, source, fmt)
        _install(tmp, directory, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _svmlight_shift(zero_based, min_index):
    if zero_based == "auto":
        return 1 if min_index is not None and min_index > 0 else 0  # scikit-learn's heuristic
    return 0 if zero_based else 1


def _svmlight_n_features(path, writer, shift):
    n = (writer.n_features or 0) - shift
    if n < 1:
        from ._readers import DataFormatError

        raise DataFormatError(path, "holds no features")
    return n


def _finish(tmp, writer, n_features, shift, block_rows, source, fmt):
    """Shift 1-based indices, hash every file, write the manifest."""
    for entry in writer.shards:
        if shift and "indices" in entry["files"]:
            path = os.path.join(tmp, entry["files"]["indices"]["file"])
            indices = np.load(path)
            np.save(path, indices - indices.dtype.type(shift), allow_pickle=False)
        for spec in entry["files"].values():
            spec["sha256"] = _sha256(os.path.join(tmp, spec["file"]))
            spec["bytes"] = os.path.getsize(os.path.join(tmp, spec["file"]))
    from .._version import __version__

    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "qkm_version": __version__,
        "layout": "csr" if writer.sparse else "dense",
        "dtype": np.dtype(writer.dtype).name,
        "n_rows": int(writer.row),
        "n_features": int(n_features),
        "nnz": int(sum(e["nnz"] for e in writer.shards)),
        "block_rows": int(block_rows),
        "has_labels": bool(writer.shards) and all("y" in e["files"] for e in writer.shards),
        "source": {"file": source, "format": fmt},
        "shards": writer.shards,
    }
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def _install(tmp, directory, overwrite):
    if not os.path.exists(directory):
        os.rename(tmp, directory)
        return
    if not overwrite:
        raise FileExistsError(f"{directory} already exists.")
    old = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".", suffix=".old",
                           dir=os.path.dirname(directory))
    os.rmdir(old)
    os.rename(directory, old)
    os.rename(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
