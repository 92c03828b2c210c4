"""Request bodies to validated row matrices, with a 400/413/415 :class:`~qkm.serve.errors.RequestError` for bad input.

Three families of bodies carry rows:

``application/json``
    dense ``{"instances": [[x11, x12, ...], ...]}`` or sparse
    ``{"indices": [[j, ...], ...], "values": [[v, ...], ...]}`` (column
    indices and values of the non-zeros of each row), plus endpoint
    parameters (``k``, ``nprobe``) in the same object.
``application/octet-stream``
    raw little-endian float32, row-major, with an ``X-Shape: B,D`` header.
``application/x-npy``
    one ``.npy`` array of shape (B, D), any integer or float dtype; read
    without pickle, its header checked against the body size before use.

Everything ends in :func:`validate_rows`: C-contiguous float (or canonical
CSR) rows with the model's feature count, finite values and at most
``max_rows`` rows.
"""

import functools
import io
import json
import math
from itertools import chain

import numpy as np
import orjson
import scipy.sparse as sp

from qkm._validation import as_float_dtype, check_data, check_feature_count, row_norm_bound
from qkm._validation import check_row_norms as _check_row_norms

from .errors import RequestError

__all__ = [
    "JSON", "OCTET", "NPY", "media_kind", "parse_shape_header", "decode_json", "rows_from_json",
    "rows_from_octet", "rows_from_npy", "validate_rows", "check_row_norms", "int_param", "check_batch",
    "numeric_array",
]

JSON, OCTET, NPY = "json", "octet-stream", "npy"

_MEDIA_TYPES = {
    "application/json": JSON,
    "application/octet-stream": OCTET,
    "application/x-npy": NPY,
    "application/npy": NPY,
}


def media_kind(content_type):
    """``"json"``, ``"octet-stream"`` or ``"npy"`` from a Content-Type header (no header: JSON).

    Examples
    --------
    >>> media_kind("application/json; charset=utf-8"), media_kind(None), media_kind("application/x-npy")
    ('json', 'json', 'npy')
    """
    if not content_type:
        return JSON
    kind = _MEDIA_TYPES.get(content_type.split(";", 1)[0].strip().lower())
    if kind is None:
        raise RequestError(415, f"unsupported Content-Type {content_type[:100]!r}; send application/json, "
                                "application/octet-stream (float32 rows with an X-Shape: B,D header) "
                                "or application/x-npy.")
    return kind


def check_batch(n_rows, max_rows, where):
    """400 for an empty batch, 413 for more than ``max_rows`` rows (``where`` names the part of the request)."""
    if n_rows == 0:
        raise RequestError(400, f"empty batch: {where} has no rows.")
    if n_rows > max_rows:
        raise RequestError(413, f"{n_rows} rows in one request exceed max_batch_rows={max_rows}; split the batch.")


def parse_shape_header(value, n_features, max_rows):
    """``(B, D)`` from an ``X-Shape: B,D`` header, checked before the body is read.

    Examples
    --------
    >>> parse_shape_header("2, 3", 3, 10)
    (2, 3)
    >>> try:
    ...     parse_shape_header("2,4", 3, 10)
    ... except RequestError as exc:
    ...     print(exc.status, exc)
    400 X-Shape says 4 features per row, but the model expects 3.
    """
    if value is None:
        raise RequestError(400, "application/octet-stream needs an X-Shape: B,D header (rows, features).")
    try:
        shape = tuple(int(part) for part in value.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 0:
        raise RequestError(400, f"X-Shape must be two non-negative integers 'B,D'; got {value[:60]!r}.")
    if shape[1] != n_features:
        raise RequestError(400, f"X-Shape says {shape[1]} features per row, but the model expects {n_features}.")
    check_batch(shape[0], max_rows, "X-Shape")
    return shape


def _reject_booleans(obj, where="the body"):
    """400 if a JSON list holds ``true``/``false``: numpy would read them as 1 and 0 (flags in objects are fine)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            _reject_booleans(value, f"'{key}'")
    elif isinstance(obj, list):
        for value in obj:
            if isinstance(value, bool):
                raise RequestError(400, f"{where} must hold numbers; found booleans (true/false).")
            if isinstance(value, (list, dict)):
                _reject_booleans(value, where)


#: Integers at least this large come out of orjson as floats but out of ``json`` as ints (a 400 later).
_ORJSON_INT_LIMIT = float(2**63)


def _fast_loads(body):
    """``orjson.loads(body)`` when it gives what ``json.loads`` gives, else None (then ``json`` decides).

    orjson parses numbers faster than ``json`` (docs/decisions.md, 'JSON
    parsing'), correctly rounded like it; the two differ only where orjson refuses a body (NaN, Infinity, a UTF-8
    BOM, UTF-16, numbers beyond float64) or turns an integer beyond 64 bits
    into a float; bodies that may hold booleans (numpy would read them as 1
    and 0) or null are left to the json path too. Those bodies return None and take the ``json`` path, with
    its answers and error messages. Only bodies with ``instances`` (dense
    rows) take this path; their rows come back as one ndarray.
    """
    if b"u" in body or b"l" in body:  # true, false, null, or a string with them: the json path (a memchr each)
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("instances"), list):
        return None
    for key, value in obj.items():  # a top-level float this large may have been a huge integer
        if isinstance(value, float) and abs(value) >= _ORJSON_INT_LIMIT:
            return None
    try:
        rows = np.asarray(obj["instances"])
    except ValueError:  # ragged: let json's path name it
        return None
    if rows.dtype.kind not in "iuf" or rows.ndim != 2 or rows.shape[0] == 0:
        return None  # the json path answers these with its messages
    if rows.dtype.kind == "f" and rows.size and not -_ORJSON_INT_LIMIT < rows.min() <= rows.max() < _ORJSON_INT_LIMIT:
        return None  # (orjson gives no NaN)
    obj["instances"] = rows
    return obj


def decode_json(body):
    """The JSON object of a request body (400 if it is not one, or if its lists hold booleans).

    Dense rows (``instances``) come back as an ndarray when the fast decoder
    (orjson) read them, as nested lists otherwise; :func:`rows_from_json`
    takes both.

    Examples
    --------
    >>> obj = decode_json(b'{"instances": [[1.5, 2]], "k": 3}')
    >>> obj["instances"].tolist(), obj["k"]
    ([[1.5, 2.0]], 3)
    """
    obj = _fast_loads(body)
    if obj is not None:
        return obj
    try:
        obj = json.loads(body)
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply.") from None
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"malformed JSON: not UTF-8 ({exc.reason} at byte {exc.start}).") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise RequestError(400, f"malformed JSON: {exc}.") from None
    if not isinstance(obj, dict):
        raise RequestError(400, f"the JSON body must be an object such as {{\"instances\": [[...]]}}; "
                                f"got a {type(obj).__name__}.")
    if b"true" in body or b"false" in body:  # rare: only then walk the lists (a scan of bytes is cheap)
        _reject_booleans(obj)
    return obj


def numeric_array(values, where):
    """``values`` (nested lists from JSON) as an int or float array, or a 400 naming the problem."""
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nesting
        arr = None
    if arr is None or arr.dtype == object:
        if isinstance(values, list) and values and all(isinstance(row, list) for row in values):
            lengths = sorted({len(row) for row in values})
            if len(lengths) > 1:
                raise RequestError(400, f"ragged rows in {where}: rows have {', '.join(map(str, lengths[:5]))}"
                                        f"{' ...' if len(lengths) > 5 else ''} values; all need the same length.")
        raise RequestError(400, f"{where} must be a list of rows, each a list of numbers (found nested lists of "
                                "uneven depth, null, or numbers too large for float64).")
    if arr.dtype.kind not in "iuf":
        what = {"b": "booleans", "U": "strings"}.get(arr.dtype.kind, f"values of type {arr.dtype}")
        raise RequestError(400, f"{where} must hold numbers; found {what}.")
    return arr


def _rows_2d(arr, where):
    if arr.ndim != 2:
        hint = " Wrap a single row as [[x1, x2, ...]]." if arr.ndim == 1 else ""
        raise RequestError(400, f"{where} must be a list of rows (2-D); got {arr.ndim}-D data "
                                f"of shape {arr.shape}.{hint}")
    return arr


def rows_from_json(obj, n_features, max_rows):
    """Dense (``instances``) or sparse (``indices`` + ``values``) rows of a decoded JSON body.

    Examples
    --------
    >>> rows_from_json({"instances": [[1, 2], [3, 4]]}, 2, 10).tolist()
    [[1, 2], [3, 4]]
    >>> rows_from_json({"indices": [[1], []], "values": [[5.0], []]}, 2, 10).toarray().tolist()
    [[0.0, 5.0], [0.0, 0.0]]
    """
    if "instances" in obj:
        rows = obj["instances"]
        if isinstance(rows, np.ndarray):  # decoded by the fast path: numeric, 2-D, not empty
            check_batch(rows.shape[0], max_rows, "'instances'")
            return rows
        if not isinstance(rows, list):
            raise RequestError(400, "'instances' must be a list of rows, each a list of numbers.")
        check_batch(len(rows), max_rows, "'instances'")
        return _rows_2d(numeric_array(rows, "'instances'"), "'instances'")
    if "indices" in obj or "values" in obj:
        return _sparse_rows(obj.get("indices"), obj.get("values"), n_features, max_rows)
    raise RequestError(400, "the JSON body needs 'instances' (dense rows) or 'indices' and 'values' (sparse rows).")


def _sparse_rows(indices, values, n_features, max_rows):
    if not isinstance(indices, list) or not isinstance(values, list):
        raise RequestError(400, "sparse rows need both 'indices' and 'values': lists with one list per row.")
    if len(indices) != len(values):
        raise RequestError(400, f"'indices' has {len(indices)} rows but 'values' has {len(values)}.")
    check_batch(len(indices), max_rows, "'indices'")
    lengths = []
    for i, (idx_row, val_row) in enumerate(zip(indices, values)):
        if not isinstance(idx_row, list) or not isinstance(val_row, list):
            raise RequestError(400, f"row {i} of 'indices' / 'values' is not a list.")
        if len(idx_row) != len(val_row):
            raise RequestError(400, f"row {i} has {len(idx_row)} indices but {len(val_row)} values.")
        lengths.append(len(idx_row))
    indptr = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    flat_idx = numeric_array(list(chain.from_iterable(indices)), "'indices'")
    flat_val = numeric_array(list(chain.from_iterable(values)), "'values'")
    if flat_idx.ndim != 1 or flat_val.ndim != 1:
        raise RequestError(400, "each row of 'indices' and 'values' must be a flat list of numbers "
                                "(found nested lists).")
    if flat_idx.size and flat_idx.dtype.kind not in "iu":
        raise RequestError(400, "'indices' must hold integer column indices.")
    if flat_idx.size:
        bad = np.flatnonzero((flat_idx < 0) | (flat_idx >= n_features))
        if bad.size:
            row = int(np.searchsorted(indptr, bad[0], side="right") - 1)
            raise RequestError(400, f"column index {int(flat_idx[bad[0]])} in row {row} is out of range: "
                                    f"the model has {n_features} features (indices 0 to {n_features - 1}).")
    X = sp.csr_matrix((flat_val.astype(np.float64, copy=False), flat_idx.astype(np.int32), indptr),
                      shape=(len(indices), n_features))
    X.sort_indices()
    row_of = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    dup = np.flatnonzero((np.diff(X.indices) == 0) & (np.diff(row_of) == 0))
    if dup.size:
        raise RequestError(400, f"row {int(row_of[dup[0]])} repeats column index {int(X.indices[dup[0]])}.")
    return X


def rows_from_octet(body, shape):
    """Rows of a raw little-endian float32 body of ``shape = (B, D)`` (from :func:`parse_shape_header`)."""
    expected = shape[0] * shape[1] * 4
    if len(body) != expected:
        raise RequestError(400, f"the body has {len(body)} bytes, but X-Shape {shape[0]},{shape[1]} of float32 "
                                f"needs {expected}.")
    return np.frombuffer(body, dtype="<f4").reshape(shape)


def rows_from_npy(body, n_features, max_rows):
    """Rows of a ``.npy`` body; its header is checked (2-D, numeric, size) before the data are touched."""
    f = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy format version {version} is not supported (1.0 and 2.0 are)")
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise RequestError(400, f"malformed npy: {exc}.") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "iuf":
        raise RequestError(400, f"the npy array must hold integers or floats; got dtype {dtype}.")
    if len(shape) != 2:
        hint = " Reshape a single row with x.reshape(1, -1)." if len(shape) == 1 else ""
        raise RequestError(400, f"the npy array must be 2-D (rows, features); got shape {shape}.{hint}")
    check_batch(shape[0], max_rows, "the npy array")
    data = memoryview(body)[f.tell():]
    expected = shape[0] * shape[1] * dtype.itemsize
    if len(data) != expected:
        raise RequestError(400, f"malformed npy: the header says shape {shape} of {dtype} ({expected} bytes) "
                                f"but {len(data)} bytes of data follow.")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


def validate_rows(X, n_features, max_rows, dtype, max_norm=None):
    """``X`` checked and converted for the model: finite, ``n_features`` columns, at most ``max_rows`` rows.

    Returns a C-contiguous ``dtype`` array or a canonical CSR matrix
    (:func:`qkm._validation.check_data`); any problem is a 400 naming it.
    ``max_norm``: the largest Euclidean row norm the model's arithmetic takes
    without overflow (:attr:`qkm.serve.backend.InferenceBackend.max_row_norm`);
    a finite row above it would give an infinite, NaN or clamped distance.
    """
    fast = _plainly_valid(X, n_features, max_rows, dtype, max_norm)
    if fast is not None:
        return fast
    check_batch(X.shape[0], max_rows, "the request")
    try:
        # arrays over the request bytes are read-only: copy them, or numba would compile read-only variants
        X = check_data(X, dtype=dtype, what="X", copy=isinstance(X, np.ndarray) and not X.flags.writeable)
        check_feature_count(X, n_features, what="X", estimator="the model")
    except (ValueError, TypeError) as exc:
        raise RequestError(400, str(exc)) from None
    if max_norm is not None:
        check_row_norms(X, max_norm, dtype)
    return X


#: :func:`qkm._validation.as_float_dtype`, cached (called per request with the backend's dtype).
_float_dtype = functools.lru_cache(maxsize=None)(as_float_dtype)


@functools.lru_cache(maxsize=None)
def _dtype_bound(dtype):
    """The row-norm bound :func:`qkm._validation.check_data` applies to rows of ``dtype``."""
    return row_norm_bound(dtype)


def _plainly_valid(X, n_features, max_rows, dtype, max_norm):
    """Dense ``X`` converted as :func:`validate_rows` converts it, when it plainly passes every check; else None.

    Two reductions (largest and smallest value: NaN and inf fail them) stand for
    the finiteness and row-norm checks of the full path, which runs whenever this
    one says None and names the problem.
    """
    if type(X) is not np.ndarray or X.ndim != 2 or X.dtype.kind not in "iuf" or X.shape[1] != n_features \
            or not 0 < X.shape[0] <= max_rows or n_features < 1:
        return None
    target = _float_dtype(dtype)
    if X.flags.writeable:
        Y = np.ascontiguousarray(X, dtype=target)
    else:  # arrays over the request bytes: copied, as check_data(copy=True) does
        Y = np.array(X, dtype=target, order="C", copy=True)
    bound = _dtype_bound(target) if max_norm is None else min(max_norm, _dtype_bound(target))
    if max(float(Y.max()), -float(Y.min())) * math.sqrt(n_features) <= bound:  # False for NaN
        return Y
    return None


def check_row_norms(X, max_norm, dtype):
    """400 naming the overflow if a row's Euclidean norm exceeds ``max_norm``.

    Examples
    --------
    >>> import numpy as np
    >>> check_row_norms(np.array([[3.0, 4.0]]), 10.0, np.float64)
    >>> try:
    ...     check_row_norms(np.array([[3.0, 4.0], [1e200, 0.0]]), 10.0, np.float64)
    ... except RequestError as exc:
    ...     print(exc.status, str(exc)[:60])
    400 numeric overflow: row 1 has Euclidean norm 1e+200, too large
    """
    try:
        _check_row_norms(X, max_norm, dtype)
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


def int_param(value, name, *, low, high, default=None, text=True):
    """An integer parameter (query string or JSON) in ``[low, high]``, or ``default`` when absent.

    ``text=False`` (a JSON value) refuses strings: ``"k": "3"`` is not an integer.

    Examples
    --------
    >>> int_param("5", "k", low=1, high=100), int_param(None, "k", low=1, high=100, default=1)
    (5, 1)
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not text):
        raise RequestError(400, f"{name} must be an integer; got {type(value).__name__}.")
    try:
        value = int(value)
    except ValueError:
        raise RequestError(400, f"{name} must be an integer; got {str(value)[:40]!r}.") from None
    if not low <= value <= high:
        raise RequestError(400, f"{name}={value} is out of range [{low}, {high}].")
    return value
