"""Streaming readers for ``qkm shard``: every input format qkm reads, in row blocks (private).

Each reader yields ``(X_block, y_block)`` pairs whose concatenation equals what
:func:`qkm.io.load_data` returns for the whole file (same dtype, same CSR
canonical form, same labels), while holding only one block in memory. Errors
are the loader's :class:`qkm.io.DataFormatError`, with line numbers counted
from the start of the file.

Matrix Market files are the exception: their entries may come in any order,
so they are read whole (as :func:`qkm.io.load_data` does) and then cut.
"""

import io as _bytes_io
import itertools
import math
import os
import zipfile

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from . import _readers as rd
from ._files import load_data

__all__ = ["iter_blocks", "BLOCK_LINES"]

#: Lines (or rows) read per block.
BLOCK_LINES = 65536


def _relined(path, exc, first_line):
    """``exc`` raised on a block of lines starting at ``first_line``, with file-level line numbers."""
    line = None if exc.line is None else exc.line + first_line - 1
    return rd.DataFormatError(path, exc.problem, line=line)


def _line_blocks(f, n_lines):
    """Yield ``(first line number, bytes)`` of ``n_lines`` lines at a time."""
    first = 1
    while True:
        lines = list(itertools.islice(f, n_lines))
        if not lines:
            return
        yield first, b"".join(lines)
        first += len(lines)


def _dense_rows(path, a, dtype, block):
    """Blocks of rows of a 2-D (possibly memory-mapped) array."""
    if a.ndim != 2 or a.shape[0] == 0 or a.dtype.kind not in "biuf":
        rd._dense(path, a[:0] if a.ndim == 2 and a.shape[0] else a, dtype)  # raises the loader's error
    for start in range(0, a.shape[0], block):
        yield np.ascontiguousarray(a[start:start + block], dtype=dtype), None


def _npy_blocks(path, dtype, block):
    a = np.load(path, mmap_mode="r", allow_pickle=False)
    if not isinstance(a, np.ndarray):
        raise rd.DataFormatError(path, "is an .npz archive, not an .npy file")
    yield from _dense_rows(path, a, dtype, block)


def _idx_blocks(f, path, dtype, block):
    head = f.read(4)
    if len(head) < 4 or head[0] or head[1] or head[2] not in rd._IDX_DTYPES or head[3] == 0:
        raise rd.DataFormatError(path, f"bad magic number 0x{head.hex()} (not an IDX file)")
    ndim, dt = head[3], np.dtype(rd._IDX_DTYPES[head[2]])
    raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise rd.DataFormatError(path, "truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in range(ndim))
    if ndim == 1:
        raise rd.DataFormatError(path, "holds a 1-D IDX array (labels), not images; use load_labels")
    if shape[0] == 0:
        raise rd.DataFormatError(path, "holds no rows")
    row_bytes = math.prod(shape[1:]) * dt.itemsize
    expected = 4 + 4 * ndim + shape[0] * row_bytes
    for start in range(0, shape[0], block):
        rows = min(block, shape[0] - start)
        buf = f.read(rows * row_bytes)
        if len(buf) < rows * row_bytes:
            got = 4 + 4 * ndim + start * row_bytes + len(buf)
            raise rd.DataFormatError(path, f"header announces shape {shape} ({expected} bytes) "
                                            f"but the file holds {got} bytes")
        yield np.frombuffer(buf, dt).reshape(rows, -1).astype(dtype), None
    if f.read(1):
        raise rd.DataFormatError(path, f"header announces shape {shape} ({expected} bytes) "
                                        "but the file holds more bytes")


def _csv_blocks(f, path, dtype, block):
    header = f.readline()
    first_line = 1
    cells = header.decode("utf-8", "replace").split(",")
    if not header.strip() or any(map(rd._is_number, cells)):  # no header line (load_data's rule)
        blocks = itertools.chain([(1, header)], ((a + 1, b) for a, b in _line_blocks(f, block)))
    else:
        first_line = 2
        blocks = ((a + 1, b) for a, b in _line_blocks(f, block))
    n_cols = None
    any_rows = False
    for first, buf in blocks:
        try:
            X, _ = rd._load_csv(_bytes_io.BytesIO(buf), path, dtype)
        except rd.DataFormatError as exc:
            if exc.problem == "holds no rows":
                continue
            raise _relined(path, exc, first) from None
        if n_cols is not None and X.shape[1] != n_cols:
            raise rd.DataFormatError(path, f"has {X.shape[1]} columns, expected {n_cols} (as on line "
                                            f"{first_line})", line=first)
        n_cols = X.shape[1]
        any_rows = True
        yield X, None
    if not any_rows:
        raise rd.DataFormatError(path, "holds no rows")


def _svmlight_blocks(f, path, dtype, block, zero_based):
    """Raw indices as in the file (0-based parse); the caller shifts 1-based files afterwards."""
    any_rows = False
    for first, buf in _line_blocks(f, block):
        try:
            X, y = load_svmlight_file(_bytes_io.BytesIO(buf), dtype=dtype, zero_based=True)
        except ValueError as exc:
            for offset, raw in enumerate(buf.splitlines(keepends=True)):
                try:
                    rd._svmlight_line(raw, zero_based)
                except ValueError as bad:
                    raise rd.DataFormatError(path, str(bad), line=first + offset) from exc
            raise rd.DataFormatError(path, str(exc)) from exc
        if X.shape[0] == 0:
            continue
        if zero_based is False and X.nnz and X.indices.min() == 0:
            line = first + _first_line_with_index_zero(buf)
            raise rd.DataFormatError(path, "feature index 0 is out of range (indices are 1-based)", line=line)
        any_rows = True
        yield rd._sparse(path, X, dtype), np.asarray(y, dtype=np.float64)
    if not any_rows:
        raise rd.DataFormatError(path, "holds no rows")


def _first_line_with_index_zero(buf):
    for offset, raw in enumerate(buf.splitlines()):
        tokens = raw.split(b"#", 1)[0].split()[1:]
        if any(t.partition(b":")[0] in (b"0", b"+0", b"-0") for t in tokens):
            return offset
    return 0


def _npz_member(z, name):
    """``(file object positioned at the data, shape, dtype, fortran)`` of one array in an npz archive."""
    f = z.open(name + ".npy")
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dt = read_header(f)
    return f, shape, dt, fortran


def _read_exact(f, dt, count):
    buf = f.read(count * dt.itemsize)
    return np.frombuffer(bytearray(buf), dt, count=len(buf) // dt.itemsize)  # writable: canonicalised in place


def _npz_blocks(path, dtype, block):
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise rd.DataFormatError(path, f"cannot be read as npz: {exc}") from exc
    with z:
        names = {n[:-4] for n in z.namelist() if n.endswith(".npy")}
        if "format" in names:
            fmt = np.load(z.open("format.npy"), allow_pickle=False).item()
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            if fmt != "csr" or not {"indptr", "indices", "data", "shape"} <= names:
                # other sparse layouts have no row order on disk: read whole, then cut
                X, y = load_data(path, format="npz", dtype=dtype)
                yield from _cut(X, y, block)
                return
            shape = tuple(int(v) for v in np.load(z.open("shape.npy"), allow_pickle=False))
            indptr = np.load(z.open("indptr.npy"), allow_pickle=False).astype(np.int64)
            if shape[0] == 0:
                raise rd.DataFormatError(path, "holds no rows")
            if indptr.shape[0] != shape[0] + 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
                raise rd.DataFormatError(path, "malformed CSR indptr")
            fi, _, dt_i, _ = _npz_member(z, "indices")
            fd, _, dt_d, _ = _npz_member(z, "data")
            with fi, fd:
                for start in range(0, shape[0], block):
                    stop = min(shape[0], start + block)
                    count = int(indptr[stop] - indptr[start])
                    ind, dat = _read_exact(fi, dt_i, count), _read_exact(fd, dt_d, count)
                    if ind.shape[0] < count or dat.shape[0] < count:
                        raise rd.DataFormatError(path, "CSR arrays are shorter than indptr announces")
                    if count and (ind.min() < 0 or ind.max() >= shape[1]):
                        raise rd.DataFormatError(path, f"column index out of range [0, {shape[1]})")
                    m = sp.csr_matrix((dat, ind, indptr[start:stop + 1] - indptr[start]), shape=(stop - start, shape[1]))
                    yield rd._sparse(path, m, dtype), None
            return
        if "X" not in names:
            raise rd.DataFormatError(path, "holds neither a scipy.sparse matrix (save_npz) nor an "
                                            f"array named 'X' (found {sorted(names)})")
        y = np.load(z.open("y.npy"), allow_pickle=False) if "y" in names else None
        f, shape, dt, fortran = _npz_member(z, "X")
        with f:
            if fortran or len(shape) != 2:
                X = np.load(z.open("X.npy"), allow_pickle=False)
                yield from _dense_rows(path, X, dtype, block)
                return
            if shape[0] == 0:
                raise rd.DataFormatError(path, "holds no rows")
            if dt.kind not in "biuf":
                raise rd.DataFormatError(path, f"holds non-numeric data (dtype {dt})")
            for start in range(0, shape[0], block):
                rows = min(block, shape[0] - start)
                a = _read_exact(f, dt, rows * shape[1])
                if a.shape[0] < rows * shape[1]:
                    raise rd.DataFormatError(path, "array X is shorter than its header announces")
                yield a.reshape(rows, shape[1]).astype(dtype), (None if y is None else y[start:start + rows])


def _cut(X, y, block):
    for start in range(0, X.shape[0], block):
        yield X[start:start + block], (None if y is None else y[start:start + block])


def iter_blocks(path, fmt, dtype, block=BLOCK_LINES, zero_based="auto"):
    """Yield ``(X_block, y_block or None)`` from a data file, in row order.

    For svmlight, indices are as written in the file (parsed 0-based); the
    caller subtracts 1 at the end when the file turns out to be 1-based.
    """
    if fmt == "npy":
        if rd._split_name(path)[1]:
            raise rd.DataFormatError(path, "npy files cannot be read compressed; decompress the file first")
        yield from _npy_blocks(path, dtype, block)
        return
    if fmt == "npz":
        yield from _npz_blocks(path, dtype, block)
        return
    if fmt == "mtx":
        X, y = load_data(path, format="mtx", dtype=dtype)
        yield from _cut(X, y, block)
        return
    with rd._reading(path, fmt) as f:
        if fmt == "idx":
            yield from _idx_blocks(f, path, dtype, block)
        elif fmt == "csv":
            yield from _csv_blocks(f, path, dtype, block)
        else:
            yield from _svmlight_blocks(f, path, dtype, block, zero_based)


def guess_format(path, fmt=None):
    """The format ``load_data`` would use for ``path``."""
    fmt = rd._guess_format(rd._split_name(path)[0]) if fmt is None else fmt
    if fmt not in rd.FORMATS:
        raise ValueError(f"format must be one of {rd.FORMATS} or None, got {fmt!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No such file: {os.fspath(path)!r}")
    return fmt
