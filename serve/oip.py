"""Open Inference Protocol (KServe v2) REST payloads, with the binary tensor data extension.

The model is described as one input ``X`` (``[-1, D]``, sent in any numeric
datatype, FP32 preferred) and two outputs, ``label`` (INT64, ``[-1]``) and
``distance`` (the squared Euclidean distance to the nearest centroid,
``[-1]``), like the ONNX export.

Tensors travel as JSON (``"data": [...]``, checked against their datatype:
``INT8`` holds -128 to 127, ``FP32`` values within float32's range) or, with
the binary tensor data extension that ``tritonclient.http`` uses by default,
as raw little-endian bytes after the JSON header: the request then carries an
``Inference-Header-Content-Length`` header (the JSON's length) and the tensor
``"parameters": {"binary_data_size": n}`` instead of ``data``. Outputs are
returned the same way when the request asks for it (``"parameters":
{"binary_data_output": true}`` for all, or ``{"binary_data": true}`` per output).
"""

import json

import numpy as np

from .decode import check_batch, decode_json, numeric_array
from .encode import check_finite
from .errors import RequestError

__all__ = ["parse_infer_request", "encode_infer_response", "model_metadata", "model_config", "OUTPUTS",
           "HEADER_LENGTH", "EXTENSIONS"]

#: Request and response header giving the length of the JSON part of a body with binary tensors.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: Protocol extensions this server implements (``GET /v2``).
EXTENSIONS = ["binary_tensor_data", "model_configuration"]

#: Wire dtype of each numeric v2 datatype (binary data is little-endian, row-major).
DATATYPES = {"FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4",
             "INT64": "<i8", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8"}

#: Output tensors in the order they are returned.
OUTPUTS = ("label", "distance")


def _datatype(dtype):
    dtype = np.dtype(dtype)
    return {"f": "FP", "i": "INT", "u": "UINT"}[dtype.kind] + str(8 * dtype.itemsize)


def model_metadata(name, n_features, distance_dtype, parameters):
    """``GET /v2/models/{name}`` body."""
    return {
        "name": name,
        "versions": ["1"],
        "platform": "qkm",
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, int(n_features)]}],
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]},
                    {"name": "distance", "datatype": _datatype(distance_dtype), "shape": [-1]}],
        "parameters": parameters,
    }


def model_config(name, n_features, distance_dtype, max_batch_rows):
    """``GET /v2/models/{name}/config`` body, in the layout of Triton's model configuration.

    The batch dimension is implicit (``max_batch_size``); each row gives one
    label and one distance (``dims [1]`` reshaped to scalars).
    """
    scalar = {"dims": [1], "reshape": {"shape": []}}
    return {
        "name": name,
        "platform": "qkm",
        "backend": "qkm",
        "max_batch_size": int(max_batch_rows),
        "input": [{"name": "X", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [int(n_features)]}],
        "output": [{"name": "label", "data_type": "TYPE_INT64", **scalar},
                   {"name": "distance", "data_type": "TYPE_" + _datatype(distance_dtype), **scalar}],
    }


def _split_body(body, header_length):
    """``(JSON part, binary part)`` of a request body, per its ``Inference-Header-Content-Length`` header."""
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise RequestError(400, f"{HEADER_LENGTH} must be the length of the JSON part of the body (0 to "
                                f"{len(body)}); got {str(header_length)[:30]!r}.")
    return body[:n], body[n:]


def _binary_size(tensor):
    """The tensor's ``binary_data_size`` parameter, or None when its values are in ``data``."""
    params = tensor.get("parameters")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise RequestError(400, "tensor 'parameters' must be an object.")
    size = params.get("binary_data_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise RequestError(400, f"binary_data_size must be a non-negative integer; got {str(size)[:30]!r}.")
    return size


def _typed_json_data(data, datatype, where):
    """JSON values as an array of ``datatype``, every value checked to fit it."""
    arr = numeric_array(data, where)
    dtype = np.dtype(DATATYPES[datatype])
    if arr.size == 0:
        return arr.astype(dtype)
    if dtype.kind in "iu":
        if arr.dtype.kind == "f":
            raise RequestError(400, f"{where} of datatype {datatype} must hold integers; found fractional numbers.")
        info = np.iinfo(dtype)
        low, high = arr.min(), arr.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise RequestError(400, f"{where}: {int(bad)} is out of range for {datatype} "
                                    f"[{info.min}, {info.max}].")
    elif dtype.itemsize < 8:
        biggest = np.abs(arr).max()
        if biggest > np.finfo(dtype).max:
            raise RequestError(400, f"{where}: {float(biggest):g} is out of range for {datatype} "
                                    f"(largest {float(np.finfo(dtype).max):g}).")
    return arr.astype(dtype)


def parse_infer_request(body, header_length, n_features, max_rows):
    """``(rows, [(output name, binary?)], request id)`` of a v2 infer request body.

    Parameters
    ----------
    body : bytes
        The request body: JSON, or JSON followed by binary tensor data.
    header_length : str or None
        The ``Inference-Header-Content-Length`` header (None: the body is all JSON).

    Examples
    --------
    >>> body = b'{"id": "7", "inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'
    >>> X, outputs, rid = parse_infer_request(body, None, 2, 10)
    >>> X.tolist(), outputs, rid
    ([[1.0, 2.0], [3.0, 4.0]], [('label', False), ('distance', False)], '7')
    >>> import numpy as np
    >>> raw = np.array([[1, 2], [3, 4]], "<f4").tobytes()
    >>> head = (b'{"inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP32", '
    ...         b'"parameters": {"binary_data_size": 16}}]}')
    >>> parse_infer_request(head + raw, str(len(head)), 2, 10)[0].tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    """
    head, binary = _split_body(body, header_length)
    obj = decode_json(head)
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, dict) for t in inputs):
        raise RequestError(400, "'inputs' must be a non-empty list of tensors {name, shape, datatype, data}.")
    sizes = [_binary_size(t) for t in inputs]
    if sum(s or 0 for s in sizes) != len(binary):
        raise RequestError(400, f"the binary part of the body has {len(binary)} bytes, but the inputs' "
                                f"binary_data_size add up to {sum(s or 0 for s in sizes)}.")
    if len(inputs) > 1:
        named = [i for i, t in enumerate(inputs) if t.get("name") == "X"]
        if len(named) != 1:
            raise RequestError(400, f"the model has one input, 'X'; got {len(inputs)} tensors.")
        at = named[0]
    else:
        at = 0
    tensor, size = inputs[at], sizes[at]
    shape, datatype = tensor.get("shape"), tensor.get("datatype")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)):
        raise RequestError(400, f"input shape must be [rows, {n_features}]; got {str(shape)[:60]}.")
    if datatype not in DATATYPES:
        raise RequestError(400, f"input datatype must be one of {sorted(DATATYPES)}; got {str(datatype)[:20]!r}.")
    if shape[1] != n_features:
        raise RequestError(400, f"input shape {shape} has {shape[1]} features per row, but the model expects "
                                f"{n_features}.")
    check_batch(shape[0], max_rows, "the input tensor")
    n_values = shape[0] * shape[1]
    if size is not None:
        if "data" in tensor:
            raise RequestError(400, "an input has both 'data' and binary_data_size; send one of them.")
        dtype = np.dtype(DATATYPES[datatype])
        if size != n_values * dtype.itemsize:
            raise RequestError(400, f"binary_data_size is {size} bytes, but shape {shape} of {datatype} needs "
                                    f"{n_values * dtype.itemsize}.")
        offset = sum(s or 0 for s in sizes[:at])
        arr = np.frombuffer(binary, dtype=dtype, count=n_values, offset=offset)
    else:
        data = tensor.get("data")
        if not isinstance(data, list):
            raise RequestError(400, "input 'data' must be a list of numbers (flat or nested, row-major), or the "
                                    "values sent as binary data (parameters.binary_data_size).")
        arr = _typed_json_data(data, datatype, "input 'data'")
        if arr.size != n_values:
            raise RequestError(400, f"input 'data' holds {arr.size} values, but shape {shape} needs {n_values}.")
    return arr.reshape(shape), _requested_outputs(obj), _request_id(obj)


def _flag(params, name, where):
    if params is None:
        return False
    value = params.get(name, False) if isinstance(params, dict) else None
    if not isinstance(value, bool):
        raise RequestError(400, f"{where} 'parameters' must be an object and {name} a boolean.")
    return value


def _requested_outputs(obj):
    """``[(name, binary?)]`` in the order of :data:`OUTPUTS`."""
    binary_default = _flag(obj.get("parameters", {}), "binary_data_output", "the request's")
    wanted = obj.get("outputs")
    if wanted is None:
        return [(name, binary_default) for name in OUTPUTS]
    if not isinstance(wanted, list) or not wanted or not all(isinstance(o, dict) for o in wanted):
        raise RequestError(400, f"'outputs' must list tensors named {' or '.join(OUTPUTS)}.")
    binary = {}
    for o in wanted:
        if o.get("name") not in OUTPUTS:
            raise RequestError(400, f"'outputs' must list tensors named {' or '.join(OUTPUTS)}; "
                                    f"got {str(o.get('name'))[:40]!r}.")
        params = o.get("parameters", {})
        if isinstance(params, dict) and params.get("classification"):
            raise RequestError(400, "the classification extension is not supported; ask for 'label'.")
        binary[o["name"]] = _flag(params, "binary_data", "an output's") or binary_default
    return [(name, binary[name]) for name in OUTPUTS if name in binary]


def _request_id(obj):
    request_id = obj.get("id")
    return str(request_id) if request_id is not None else None


def encode_infer_response(model_name, request_id, outputs, labels, sq_distances):
    """``(body, media type, headers)`` of a v2 infer response.

    Outputs asked for as binary follow the JSON header as raw little-endian
    bytes (``Inference-Header-Content-Length`` gives the JSON's length).
    Non-finite values are refused like on every route
    (:func:`qkm.serve.encode.check_finite`).
    """
    arrays = {"label": np.asarray(labels, dtype="<i8"), "distance": np.asarray(sq_distances)}
    check_finite([("distance", arrays["distance"])])
    tensors, blobs = [], []
    for name, binary in outputs:
        arr = arrays[name]
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        tensor = {"name": name, "shape": list(arr.shape), "datatype": _datatype(arr.dtype)}
        if binary:
            blobs.append(np.ascontiguousarray(arr).tobytes())
            tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            tensor["data"] = arr.tolist()
        tensors.append(tensor)
    out = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if request_id is not None:
        out["id"] = request_id
    head = json.dumps(out, allow_nan=False).encode()
    if not blobs:
        return head, "application/json", {}
    return b"".join([head, *blobs]), "application/octet-stream", {HEADER_LENGTH: str(len(head))}
