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

Writing (:mod:`qkm.io._shard_writer`, ``qkm shard``) streams the input, one shard
in memory at a time, into a temporary directory renamed into place at the end;
loading (here) checks every file against the manifest (a changed or missing
shard is a :class:`ShardError`).
"""

import hashlib
import json
import os

import numpy as np
import scipy.sparse as sp

from .. import _config

__all__ = ["ShardError", "read_manifest", "load_shard", "load_sharded", "is_sharded", "shard_fingerprint",
           "check_fingerprint", "default_rows_per_shard", "aligned_rows_per_shard", "check_layout"]

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


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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
    """All shards concatenated in memory (``load_data`` on a shard directory or manifest).

    Returns ``(X, y)``; ``y`` as stored (``load_data`` turns integral labels into int64).
    """
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
    y = np.concatenate([p[1] for p in parts]) if m["has_labels"] else None
    return X, y

