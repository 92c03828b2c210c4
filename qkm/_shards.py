"""Data sets cut into shards on disk: ``qkm shard`` writes them, everything else reads them.

A shard directory holds ``manifest.json`` (format version, n_rows, n_features,
nnz, dtype, layout, and per shard its rows, nnz and the sha256 of its files)
plus one shard per group of files: a dense shard is one ``.npy``; a CSR shard
is three (``indptr``, ``indices``, ``data``), all loadable with
``mmap_mode="r"``. Labels found in the input (svmlight, ``np.savez(X, y)``)
go to one more ``.npy`` per shard.

Shards are whole nodes of the fixed summation tree of :mod:`qkm._reduce`
(``rows_per_shard`` is ``REDUCE_BLOCK_ROWS`` times a power of two), so a fit
over shards adds numbers in the same order as a fit in memory.

Writing streams the input (one shard in memory at a time) into a temporary
directory that is renamed into place at the end; loading checks every file
against the manifest (a changed or missing shard is a :class:`ShardError`).
"""

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import scipy.sparse as sp

from . import _config
from ._shard_readers import guess_format, iter_blocks

__all__ = ["ShardError", "write_shards", "read_manifest", "load_shard", "load_sharded", "is_sharded",
           "shard_fingerprint", "check_fingerprint", "default_rows_per_shard", "aligned_rows_per_shard"]

MANIFEST = "manifest.json"
FORMAT = "qkm-shards"
FORMAT_VERSION = 1
_TARGET_SHARD_BYTES = 128 << 20


class ShardError(ValueError):
    """A shard directory that does not match its manifest (changed, missing or malformed)."""


# --------------------------------------------------------------------------- #
# Layout rules
# --------------------------------------------------------------------------- #
def aligned_rows_per_shard(rows, block_rows=None):
    """``rows`` rounded up to ``block_rows`` times a power of two (a whole node of the summation tree).

    Examples
    --------
    >>> aligned_rows_per_shard(10000, block_rows=4096)
    16384
    """
    block_rows = _config.REDUCE_BLOCK_ROWS if block_rows is None else int(block_rows)
    if int(rows) < 1:
        raise ValueError(f"rows_per_shard must be >= 1; got {rows}.")
    blocks = -(-int(rows) // block_rows)
    return block_rows << max(0, (blocks - 1).bit_length())


def default_rows_per_shard(bytes_per_row, block_rows=None):
    """Rows per shard aiming at about 128 MB shards."""
    rows = max(1, int(_TARGET_SHARD_BYTES // max(float(bytes_per_row), 1.0)))
    aligned = aligned_rows_per_shard(rows, block_rows)
    return aligned if aligned <= 2 * rows else max(aligned // 2, aligned_rows_per_shard(1, block_rows))


def check_layout(sizes, block_rows):
    """Every nonempty shard must be one node of the block tree (or the truncated last one)."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    n = int(np.sum(sizes))
    for i, (start, rows) in enumerate(zip(starts.tolist(), list(sizes))):
        if rows == 0:
            continue
        span = aligned_rows_per_shard(rows, block_rows)
        if start % block_rows or start % span or (rows != span and start + rows != n):
            raise ValueError(
                f"shard {i} (rows {start}..{start + rows}) is not a whole node of the summation tree "
                f"(block_rows={block_rows}): shards must hold block_rows x 2^m rows starting at a multiple "
                "of that (only the last may be shorter). Write them with `qkm shard`.")


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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
    >>> load_sharded(d)[0].shape
    (6, 2)
    """
    from .io import FORMATS

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
        from ._validation import check_data

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
        from .io import DataFormatError

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
    from . import __version__

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


# --------------------------------------------------------------------------- #
# Reading
# --------------------------------------------------------------------------- #
def is_sharded(path):
    """Whether ``path`` is a shard directory or its ``manifest.json``."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MANIFEST))
    return os.path.basename(path) == MANIFEST and os.path.isfile(path)


def _directory(path):
    path = os.path.abspath(os.fspath(path))
    return os.path.dirname(path) if os.path.basename(path) == MANIFEST and not os.path.isdir(path) else path


def read_manifest(path):
    """The checked manifest of a shard directory (``path``: the directory or its manifest.json).

    Returns
    -------
    manifest : dict
        With ``"directory"`` added (absolute path).
    """
    directory = _directory(path)
    mpath = os.path.join(directory, MANIFEST)
    if not os.path.isfile(mpath):
        raise FileNotFoundError(f"{mpath} not found: not a shard directory (write one with `qkm shard`).")
    try:
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError) as exc:
        raise ShardError(f"{mpath}: unreadable manifest ({exc}).") from exc
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ShardError(f"{mpath}: not a qkm shard manifest.")
    if m.get("format_version") != FORMAT_VERSION:
        raise ShardError(f"{mpath}: shard format version {m.get('format_version')!r} is not supported "
                         f"(this qkm reads version {FORMAT_VERSION}).")
    try:
        sizes = [int(e["n_rows"]) for e in m["shards"]]
        starts = [int(e["row_start"]) for e in m["shards"]]
        ok = (m["layout"] in ("csr", "dense") and m["dtype"] in ("float32", "float64")
              and sum(sizes) == int(m["n_rows"]) and starts == [sum(sizes[:i]) for i in range(len(sizes))]
              and int(m["n_features"]) >= 1 and int(m["n_rows"]) >= 1)
    except (KeyError, TypeError, ValueError) as exc:
        raise ShardError(f"{mpath}: malformed manifest ({exc!r}).") from exc
    if not ok:
        raise ShardError(f"{mpath}: inconsistent manifest (rows, starts, layout or dtype).")
    m["directory"] = directory
    return m


def load_shard(manifest, index, *, verify=True, mmap=True):
    """One shard as ``(X, y)``: CSR or dense, memory-mapped, checked against the manifest.

    Raises
    ------
    ShardError
        A file is missing, has another size, or (``verify``) another sha256.
    """
    entry = manifest["shards"][index]
    directory = manifest["directory"]
    arrays = {}
    for role, spec in entry["files"].items():
        path = os.path.join(directory, spec["file"])
        if not os.path.isfile(path):
            raise ShardError(f"shard {entry['name']}: {path} is missing.")
        if os.path.getsize(path) != spec["bytes"] or (verify and _sha256(path) != spec["sha256"]):
            raise ShardError(f"shard {entry['name']}: {path} changed on disk since `qkm shard` wrote it "
                             "(size or sha256 differs from manifest.json); re-create the shard directory.")
        arrays[role] = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    n, D = int(entry["n_rows"]), int(manifest["n_features"])
    if manifest["layout"] == "csr":
        indptr, indices, data = arrays["indptr"], arrays["indices"], arrays["data"]
        if indptr.shape != (n + 1,) or int(indptr[-1]) != indices.shape[0] or data.shape != indices.shape:
            raise ShardError(f"shard {entry['name']}: arrays do not match the manifest.")
        X = sp.csr_matrix((data, indices, indptr), shape=(n, D), copy=False)
    else:
        X = arrays["X"]
        if X.shape != (n, D):
            raise ShardError(f"shard {entry['name']}: shape {X.shape} does not match the manifest ({n}, {D}).")
    if X.dtype != np.dtype(manifest["dtype"]):
        raise ShardError(f"shard {entry['name']}: dtype {X.dtype} does not match the manifest.")
    return X, arrays.get("y")


def shard_fingerprint(manifest, index):
    """(size, mtime_ns, inode) of every file of a shard: cheap to recheck during a fit."""
    entry = manifest["shards"][index]
    out = []
    for spec in entry["files"].values():
        st = os.stat(os.path.join(manifest["directory"], spec["file"]))
        out.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def check_fingerprint(manifest, index, fingerprint):
    """Raise :class:`ShardError` if a shard's files were replaced or modified since ``fingerprint``."""
    try:
        now = shard_fingerprint(manifest, index)
    except OSError as exc:
        raise ShardError(f"shard {manifest['shards'][index]['name']}: {exc}") from exc
    if now != fingerprint:
        raise ShardError(f"shard {manifest['shards'][index]['name']} changed on disk during the fit.")


def load_sharded(path, *, dtype=None, n_features=None, verify=True):
    """All shards concatenated in memory (``load_data`` on a shard directory or manifest)."""
    from .io import _labels

    m = read_manifest(path)
    if n_features is not None and int(n_features) != int(m["n_features"]):
        raise ShardError(f"{m['directory']} has {m['n_features']} features, n_features={n_features} was requested.")
    parts = [load_shard(m, i, verify=verify, mmap=False) for i in range(len(m["shards"]))]
    xs = [p[0] for p in parts]
    target = np.dtype(m["dtype"] if dtype is None else dtype)
    if m["layout"] == "csr":
        X = sp.vstack(xs, format="csr").astype(target, copy=False)
        X.indices = X.indices.astype(np.int32, copy=False)
        if X.nnz <= np.iinfo(np.int32).max:
            X.indptr = X.indptr.astype(np.int32, copy=False)
    else:
        X = np.ascontiguousarray(np.concatenate(xs), dtype=target)
    y = None
    if m["has_labels"]:
        y = _labels(os.path.join(m["directory"], MANIFEST), np.concatenate([p[1] for p in parts]))
    return X, y

