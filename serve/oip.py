"""Open Inference Protocol (KServe v2) REST payloads: tensor JSON in, tensor JSON out.

The model is described as one input ``X`` (FP32, ``[-1, D]``) and two outputs,
``label`` (INT64, ``[-1]``) and ``distance`` (the squared Euclidean distance to
the nearest centroid, ``[-1]``), like the ONNX export. Only the JSON form of
the protocol is implemented (not its binary-data extension).
"""

import numpy as np

from .decode import check_batch, numeric_array
from .errors import RequestError

__all__ = ["rows_from_infer_request", "infer_response", "model_metadata", "OUTPUTS"]

_DATATYPES = {"FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}

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


def rows_from_infer_request(obj, n_features, max_rows):
    """``(rows, requested outputs, request id)`` of a decoded v2 infer request.

    Examples
    --------
    >>> X, outputs, rid = rows_from_infer_request(
    ...     {"id": "7", "inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}, 2, 10)
    >>> X.tolist(), outputs, rid
    ([[1, 2], [3, 4]], ('label', 'distance'), '7')
    """
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, dict) for t in inputs):
        raise RequestError(400, "'inputs' must be a non-empty list of tensors {name, shape, datatype, data}.")
    if len(inputs) > 1:
        tensors = [t for t in inputs if t.get("name") == "X"]
        if len(tensors) != 1:
            raise RequestError(400, f"the model has one input, 'X'; got {len(inputs)} tensors.")
        inputs = tensors
    tensor = inputs[0]
    shape, datatype, data = tensor.get("shape"), tensor.get("datatype"), tensor.get("data")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)):
        raise RequestError(400, f"input shape must be [rows, {n_features}]; got {str(shape)[:60]}.")
    if datatype not in _DATATYPES:
        raise RequestError(400, f"input datatype must be one of {sorted(_DATATYPES)}; got {str(datatype)[:20]!r}.")
    if shape[1] != n_features:
        raise RequestError(400, f"input shape {shape} has {shape[1]} features per row, but the model expects "
                                f"{n_features}.")
    check_batch(shape[0], max_rows, "the input tensor")
    if not isinstance(data, list):
        raise RequestError(400, "input 'data' must be a list of numbers (flat or nested, row-major).")
    arr = numeric_array(data, "input 'data'")
    if arr.size != shape[0] * shape[1]:
        raise RequestError(400, f"input 'data' holds {arr.size} values, but shape {shape} needs "
                                f"{shape[0] * shape[1]}.")
    wanted = obj.get("outputs")
    if wanted is None:
        outputs = OUTPUTS
    else:
        names = [o.get("name") if isinstance(o, dict) else None for o in wanted] if isinstance(wanted, list) else None
        if not names or any(n not in OUTPUTS for n in names):
            raise RequestError(400, f"'outputs' must list tensors named {' or '.join(OUTPUTS)}.")
        outputs = tuple(n for n in OUTPUTS if n in names)
    request_id = obj.get("id")
    return arr.reshape(shape), outputs, (str(request_id) if request_id is not None else None)


def infer_response(model_name, request_id, outputs, labels, sq_distances):
    """v2 infer response body (a dict, JSON-ready)."""
    arrays = {"label": np.asarray(labels, dtype=np.int64), "distance": np.asarray(sq_distances)}
    out = {"model_name": model_name, "model_version": "1",
           "outputs": [{"name": name, "shape": list(arrays[name].shape), "datatype": _datatype(arrays[name].dtype),
                        "data": arrays[name].tolist()} for name in outputs]}
    if request_id is not None:
        out["id"] = request_id
    return out
