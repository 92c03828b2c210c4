"""Format readers behind :func:`qkm.io.load_data`: one loader per format (npy, csv, npz,
svmlight, mtx, idx), name-based format guessing, compressed opening, and the
:class:`DataFormatError` every loader raises on malformed contents.

Private: the public entry points are in :mod:`qkm.io`; the shard readers reuse the
per-format checks from here.
"""

import bz2
import contextlib
import gzip
import io
import math
import os
import re
import struct
import warnings

import numpy as np
import scipy.io
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

FORMATS = ("npy", "csv", "npz", "svmlight", "mtx", "idx")
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open}
_SUFFIXES = {".npy": "npy", ".csv": "csv", ".npz": "npz", ".mtx": "mtx", ".idx": "idx",
             ".svm": "svmlight", ".svmlight": "svmlight", ".libsvm": "svmlight"}
_IDX_NAME = re.compile(r"[-_.]idx\d(-ubyte)?$")  # e.g. train-images-idx3-ubyte
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataFormatError(ValueError):
    """A data file could not be read because its contents are malformed.

    Parameters
    ----------
    path : str or os.PathLike
        The offending file.
    problem : str
        What is wrong, e.g. ``"feature index 0 is out of range"``.
    line : int or None, default=None
        1-based line number of the problem in a text file, if known.

    Attributes
    ----------
    path : str
    problem : str
    line : int or None

    Examples
    --------
    >>> err = DataFormatError("news.svm", "token 'abc' has no ':'", line=17)
    >>> str(err)
    "news.svm: line 17: token 'abc' has no ':'"
    >>> err.line
    17
    """

    def __init__(self, path, problem, line=None):
        self.path, self.problem, self.line = os.fspath(path), problem, line
        where = f"{self.path}: line {line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # keep the error picklable (joblib, multiprocessing)
        return type(self), (self.path, self.problem, self.line)


def _split_name(path):
    """Return ``(lower-case name without .gz/.bz2, compression suffix or "")``."""
    name = os.path.basename(os.fspath(path)).lower()
    for suffix in _OPENERS:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def _guess_format(name):
    if _IDX_NAME.search(name):
        return "idx"
    return _SUFFIXES.get(os.path.splitext(name)[1], "svmlight")


# ---------------------------------------------------------------- finishing

def _dense(path, a, dtype):
    """Check that ``a`` is a non-empty 2-D numeric array; return it C-contiguous."""
    if a.dtype.kind not in "biuf":
        raise DataFormatError(path, f"holds non-numeric data (dtype {a.dtype})")
    if a.ndim != 2:
        hint = " (use load_labels for a labels file)" if a.ndim == 1 else ""
        raise DataFormatError(path, f"holds a {a.ndim}-D array of shape {a.shape}; a 2-D array "
                                    f"(n_samples, n_features) is expected{hint}")
    if a.shape[0] == 0:
        raise DataFormatError(path, "holds no rows")
    return np.ascontiguousarray(a, dtype=dtype)


def _sparse(path, m, dtype):
    """Return ``m`` as a non-empty CSR matrix with sorted, unique int32 indices."""
    if m.dtype.kind not in "biuf":
        raise DataFormatError(path, f"holds non-numeric data (dtype {m.dtype})")
    X = sp.csr_matrix(m, dtype=dtype)
    if X.shape[0] == 0:
        raise DataFormatError(path, "holds no rows")
    X.sum_duplicates()  # also sorts the indices
    X.indices = X.indices.astype(np.int32, copy=False)
    if X.nnz <= np.iinfo(np.int32).max:
        X.indptr = X.indptr.astype(np.int32, copy=False)
    return X


def _labels(path, y, n_rows=None):
    """Return ``y`` as a 1-D array; integral numbers become int64."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.ravel()
    if y.ndim != 1:
        raise DataFormatError(path, f"labels must be 1-D, got shape {y.shape}")
    if len(y) == 0:
        raise DataFormatError(path, "holds no labels")
    if n_rows is not None and len(y) != n_rows:
        raise DataFormatError(path, f"holds {len(y)} labels for {n_rows} rows")
    if y.dtype.kind in "biu" or (y.dtype.kind == "f" and np.all(np.isfinite(y))
                                 and np.array_equal(y, np.round(y))):
        return y.astype(np.int64)
    return y


# ---------------------------------------------------------------- per format

def _read_npy(f, path):
    a = np.load(f, allow_pickle=False)
    if not isinstance(a, np.ndarray):
        raise DataFormatError(path, "is an .npz archive, not an .npy file")
    return a


def _load_npy(f, path, dtype):
    return _dense(path, _read_npy(f, path), dtype), None


def _load_npz(f, path, dtype):
    z = np.load(f, allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataFormatError(path, "is an .npy file, not an .npz archive")
    with z:
        if "format" in z.files:  # written by scipy.sparse.save_npz
            X, y = None, None
        elif "X" in z.files:  # written by np.savez(X=..., y=...)
            X = _dense(path, z["X"], dtype)
            y = z["y"] if "y" in z.files else None
        else:
            raise DataFormatError(path, "holds neither a scipy.sparse matrix (save_npz) nor an "
                                        f"array named 'X' (found {sorted(z.files)})")
    if X is None:  # a dense array saved with np.savez stays dense
        f.seek(0)
        X = _sparse(path, sp.load_npz(f), dtype)
    return X, (None if y is None else _labels(path, y, X.shape[0]))


def _load_mtx(f, path, dtype):
    # scipy's C++ reader (fast_matrix_market) can crash the interpreter on a NUL byte or a
    # malformed last line without a newline, and aborts on some errors in a real file
    # object: screen the text and hand it an in-memory copy.
    buf = f.read()
    if b"\0" in buf:
        line = buf.count(b"\n", 0, buf.index(b"\0")) + 1
        raise DataFormatError(path, "contains a NUL byte (not a text file)", line=line)
    try:
        m = scipy.io.mmread(io.BytesIO(buf if buf.endswith(b"\n") else buf + b"\n"))
    except ValueError as exc:  # e.g. "Line 4: Invalid floating-point value."
        found = re.match(r"Line (\d+): (.*)", str(exc))
        if not found:
            raise
        raise DataFormatError(path, found[2], line=int(found[1])) from exc
    return _sparse(path, m, dtype), None


def _read_idx(f, path):
    """Parse an IDX file: 0x00 0x00, dtype code, ndim, ndim big-endian uint32 sizes, data."""
    buf = f.read()
    if len(buf) < 4 or buf[0] or buf[1] or buf[2] not in _IDX_DTYPES or buf[3] == 0:
        raise DataFormatError(path, f"bad magic number 0x{buf[:4].hex()} (not an IDX file)")
    ndim, dt = buf[3], np.dtype(_IDX_DTYPES[buf[2]])
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise DataFormatError(path, "truncated IDX header")
    shape = struct.unpack(f">{ndim}I", buf[4:header])
    expected = header + math.prod(shape) * dt.itemsize
    if len(buf) != expected:
        raise DataFormatError(path, f"header announces shape {shape} ({expected} bytes) "
                                    f"but the file holds {len(buf)} bytes")
    return np.frombuffer(buf, dt, offset=header).reshape(shape)


def _load_idx(f, path, dtype):
    a = _read_idx(f, path)
    if a.ndim == 1:
        raise DataFormatError(path, "holds a 1-D IDX array (labels), not images; use load_labels")
    return _dense(path, a.reshape(a.shape[0], math.prod(a.shape[1:])), dtype), None


def _parse_or_diagnose(path, fast, diagnose):
    """Run the fast parser; on failure re-scan with ``diagnose`` for ``(line, problem)``."""
    try:
        return fast()
    except ValueError as exc:
        line, problem = diagnose() or (None, str(exc))
        raise DataFormatError(path, problem, line=line) from exc


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_csv(f, path, dtype):
    first = f.readline().decode("utf-8", errors="replace")
    skip = int(bool(first.strip()) and not any(map(_is_number, first.split(","))))

    def fast():
        f.seek(0)
        with warnings.catch_warnings():  # "input contained no data": reported below
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2, skiprows=skip,
                              comments=None, encoding="utf-8")

    def diagnose():
        f.seek(0)
        n_cols = None
        for lineno, raw in enumerate(f, 1):
            try:
                cells = [c.strip() for c in raw.decode("utf-8").split(",")]
            except UnicodeDecodeError:
                return lineno, "not UTF-8 text"
            if lineno <= skip or cells == [""]:
                continue
            if n_cols is None:
                n_cols, first_line = len(cells), lineno
            elif len(cells) != n_cols:
                return lineno, (f"has {len(cells)} columns, expected {n_cols} "
                                f"(as on line {first_line})")
            for col, cell in enumerate(cells, 1):
                if not cell:
                    return lineno, f"column {col} is empty"
                if not _is_number(cell):
                    return lineno, f"column {col}: {cell!r} is not a number"
        return None

    return _dense(path, _parse_or_diagnose(path, fast, diagnose), dtype), None


def _svmlight_line(raw, zero_based):
    """Return the feature indices on one svmlight line; raise ValueError(problem) if malformed."""
    label, *pairs = raw.split(b"#", 1)[0].split() or [None]
    if label is None:  # blank or comment-only line
        return []
    if not _is_number(label):
        hint = " (is the label missing?)" if b":" in label else ""
        raise ValueError(f"label {label.decode(errors='replace')!r} is not a number{hint}")
    indices = []
    for token in pairs:
        text = token.decode(errors="replace")
        name, colon, value = token.partition(b":")
        if not colon:
            raise ValueError(f"token {text!r} has no ':' (expected index:value)")
        if name == b"qid":
            continue
        if not re.fullmatch(rb"[-+]?\d+", name):
            raise ValueError(f"feature index in {text!r} is not an integer")
        if not _is_number(value):
            raise ValueError(f"value in {text!r} is not a number")
        index = int(name)
        if index < 0 or (index == 0 and zero_based is False):
            raise ValueError(f"feature index {index} is out of range (indices are "
                             f"{'1' if index == 0 else '0 or 1'}-based)")
        if indices and index <= indices[-1]:
            raise ValueError(f"feature indices must be strictly increasing "
                             f"({index} after {indices[-1]})")
        indices.append(index)
    return indices


def _load_svmlight(f, path, dtype, n_features=None, zero_based="auto"):
    def fast():
        f.seek(0)
        return load_svmlight_file(f, dtype=dtype, n_features=n_features, zero_based=zero_based)

    def diagnose():
        f.seek(0)
        spans = []  # (line, smallest index, largest index) of non-empty lines
        for lineno, raw in enumerate(f, 1):
            try:
                indices = _svmlight_line(raw, zero_based)
            except ValueError as exc:
                return lineno, str(exc)
            if indices:
                spans.append((lineno, indices[0], indices[-1]))
        if n_features is not None and spans:
            one_based = (not zero_based if zero_based != "auto"
                         else min(low for _, low, _ in spans) > 0)
            for lineno, _, index in spans:
                if index - one_based >= n_features:
                    return lineno, (f"feature index {index} is beyond n_features={n_features} "
                                    f"(indices are {int(one_based)}-based)")
        return None

    X, y = _parse_or_diagnose(path, fast, diagnose)
    X = _sparse(path, X, dtype)
    return X, _labels(path, y, X.shape[0])


_LOADERS = {"npy": _load_npy, "csv": _load_csv, "npz": _load_npz,
            "svmlight": _load_svmlight, "mtx": _load_mtx, "idx": _load_idx}


@contextlib.contextmanager
def _reading(path, fmt):
    """Open ``path``; turn library errors raised while parsing it into DataFormatError."""
    compression = _split_name(path)[1]
    if compression and fmt in ("npy", "npz"):
        raise DataFormatError(path, f"{fmt} files cannot be read {compression}-compressed; "
                                    "decompress the file first")
    with _OPENERS.get(compression, open)(path, "rb") as f:  # FileNotFoundError passes
        try:
            yield f
        except (DataFormatError, MemoryError):
            raise
        except Exception as exc:  # numpy, scipy, zipfile, gzip, ... raise many kinds on bad input
            raise DataFormatError(path, f"cannot be read as {fmt}: {exc}") from exc
