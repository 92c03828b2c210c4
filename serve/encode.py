"""Results to response bodies, in the content-type family of the request.

A result is an ordered list of named arrays of one shape (``labels`` and
``sq_distances`` for ``/assign``; ``indices``, ``distances`` and maybe
``labels`` for ``/search``; ``features`` for ``/features``):

``json``
    ``{"labels": [...], "sq_distances": [...]}``.
``octet-stream``
    the arrays one after the other, each little-endian and C-ordered, with
    headers ``X-Shape: <shape of one array>`` and ``X-Fields: name:<dtype>,...``
    (e.g. ``labels:<i8,sq_distances:<f8``) that say how to split the body.
``npy``
    one ``.npy`` array: the array itself when there is one field, else a
    structured array with one field per name (``np.load(..)["labels"]``).

One rule holds for every family and for the Open Inference Protocol routes
(:func:`check_finite`): an answer is finite. Inputs are checked finite on the
way in, but finite inputs can still overflow (squared norms of values near
1e200 exceed float64's 1.8e308): such a request gets a 400 that names the
overflow, never ``inf``/``NaN`` in a 200 body nor a 500.
"""

import io
import json

import numpy as np

from .decode import JSON, NPY, OCTET
from .errors import RequestError

__all__ = ["encode_result", "check_finite", "MEDIA_TYPE"]

MEDIA_TYPE = {JSON: "application/json", OCTET: "application/octet-stream", NPY: "application/x-npy"}

#: Wire dtype of each kind of value: int64 labels/indices, float64 distances and features.
_WIRE = {"i": np.dtype("<i8"), "u": np.dtype("<i8"), "f": np.dtype("<f8")}


def _wire(arr):
    arr = np.asarray(arr)
    return np.ascontiguousarray(arr, dtype=_WIRE[arr.dtype.kind])


def check_finite(fields):
    """400 if a float result is not finite (the rows' values overflowed the arithmetic).

    Examples
    --------
    >>> import numpy as np
    >>> check_finite([("sq_distances", np.array([1.0, 2.0]))])
    >>> try:
    ...     check_finite([("sq_distances", np.array([1.0, np.inf]))])
    ... except RequestError as exc:
    ...     print(exc.status, str(exc)[:46])
    400 numeric overflow: sq_distances of row 1 is inf
    """
    for name, arr in fields:
        arr = np.asarray(arr)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            at = np.argwhere(~np.isfinite(arr))[0]
            raise RequestError(400, f"numeric overflow: {name} of row {int(at[0])} is {arr[tuple(at)]}: the row's "
                                    f"values are finite but too large to compute with (their squares exceed the "
                                    f"largest {arr.dtype} number, {float(np.finfo(arr.dtype).max):.3g}); scale "
                                    f"the data down.")


def _plain_json(fields):
    """The JSON body of finite float and ordinary integer arrays without their wire copies, else None.

    ``tolist`` gives the same Python numbers as the int64 / float64 wire
    arrays would (float32 values are exact in float64), so the bytes are
    those of the full path, which handles everything else (and names a
    non-finite value).
    """
    out = {}
    for name, arr in fields:
        if type(arr) is not np.ndarray:
            return None
        dt = arr.dtype
        if dt.kind == "f":
            if dt.itemsize not in (4, 8) or not np.isfinite(arr).all():
                return None
        elif not (dt.kind == "i" or dt.kind == "u" and dt.itemsize < 8):
            return None
        out[name] = arr.tolist()
    return json.dumps(out, allow_nan=False).encode()


def encode_result(kind, fields):
    """``(body bytes, media type, extra headers)`` of named result arrays.

    Parameters
    ----------
    kind : {"json", "octet-stream", "npy"}
    fields : list of (str, ndarray)
        Arrays of the same shape.

    Examples
    --------
    >>> import numpy as np
    >>> body, media, headers = encode_result("octet-stream", [("labels", np.array([1, 0]))])
    >>> len(body), media, headers
    (16, 'application/octet-stream', {'X-Shape': '2', 'X-Fields': 'labels:<i8'})
    >>> encode_result("json", [("labels", np.array([1, 0]))])[0]
    b'{"labels": [1, 0]}'
    """
    if kind == JSON:
        body = _plain_json(fields)
        if body is not None:
            return body, MEDIA_TYPE[JSON], {}
    arrays = [(name, _wire(arr)) for name, arr in fields]
    check_finite(arrays)
    if kind == JSON:
        body = json.dumps({name: arr.tolist() for name, arr in arrays}, allow_nan=False).encode()
        return body, MEDIA_TYPE[JSON], {}
    shape = arrays[0][1].shape
    if kind == OCTET:
        headers = {"X-Shape": ",".join(map(str, shape)),
                   "X-Fields": ",".join(f"{name}:{arr.dtype.str}" for name, arr in arrays)}
        return b"".join(arr.tobytes() for _, arr in arrays), MEDIA_TYPE[OCTET], headers
    if len(arrays) == 1:
        out = arrays[0][1]
    else:
        out = np.empty(shape, dtype=[(name, arr.dtype) for name, arr in arrays])
        for name, arr in arrays:
            out[name] = arr
    buf = io.BytesIO()
    np.lib.format.write_array(buf, out, allow_pickle=False)
    return buf.getvalue(), MEDIA_TYPE[NPY], {}
