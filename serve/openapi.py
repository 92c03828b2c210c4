"""OpenAPI documentation of the routes: request bodies in every accepted content type, responses, examples.

The inference routes read their bodies themselves (JSON parsing through
pydantic would cost more than the model), so their request bodies are
described here rather than inferred by FastAPI from type hints. Response
bodies are documented with the pydantic models below; handlers return
pre-encoded responses, so these models are never used to validate.
"""

from typing import Optional

from pydantic import BaseModel, Field

__all__ = ["rows_request_body", "result_responses", "ERROR_RESPONSES", "COMMON_RESPONSES", "NOT_READY",
           "UNKNOWN_MODEL", "oip_infer_body", "oip_infer_responses", "search_parameters", "example_rows"]


class ErrorBody(BaseModel):
    error: str = Field(description="What is wrong with the request (never echoes its body or keys).")

    model_config = {"json_schema_extra": {"example": {
        "error": "X has 783 features, but the model is expecting 784 features as input "
                 "(the number it was fitted with)."
    }}}


class AssignResult(BaseModel):
    labels: list[int] = Field(description="Index of the nearest centroid of each row.")
    sq_distances: list[float] = Field(description="Squared Euclidean distance of each row to that centroid.")

    model_config = {"json_schema_extra": {"example": {"labels": [3, 7], "sq_distances": [1523.5, 2210.25]}}}


class SearchResult(BaseModel):
    indices: list[list[int]] = Field(description="Row numbers (in the indexed training data) of the k nearest "
                                                 "neighbours of each query, nearest first.")
    distances: list[list[float]] = Field(description="Their Euclidean distances to the query.")
    labels: Optional[list[list[int]]] = Field(None, description="Their training labels, if the index holds labels.")

    model_config = {"json_schema_extra": {"example": {"indices": [[812, 77]], "distances": [[1103.2, 1150.9]],
                                                      "labels": [[9, 9]]}}}


class FeaturesResult(BaseModel):
    features: list[list[float]] = Field(description="Nyström RBF features, one row of n_components per input row.")

    model_config = {"json_schema_extra": {"example": {"features": [[0.12, -0.03, 0.51]]}}}


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str = Field(description="FP16, FP32, FP64, INT8 ... INT64, UINT8 ... UINT64 (BOOL and BYTES are "
                                      "refused); JSON values must fit it (INT8: -128 to 127).")
    data: Optional[list] = Field(None, description="Row-major values, flat or nested; absent when the values are "
                                                   "sent as binary data.")
    parameters: Optional[dict] = Field(None, description="{\"binary_data_size\": n}: the values are n raw "
                                                         "little-endian bytes after the JSON (binary tensor data "
                                                         "extension).")


class InferResponse(BaseModel):
    model_name: str
    model_version: Optional[str] = None
    id: Optional[str] = None
    outputs: list[Tensor]

    model_config = {"json_schema_extra": {"example": {
        "model_name": "fashion_mnist_qkmeans", "id": "42",
        "outputs": [{"name": "label", "shape": [2], "datatype": "INT64", "data": [3, 7]},
                    {"name": "distance", "shape": [2], "datatype": "FP64", "data": [1523.5, 2210.25]}]}}}


def _error(description, retry_after=False):
    out = {"model": ErrorBody, "description": description}
    if retry_after:
        out["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.", "required": True,
                                          "schema": {"type": "integer"}}}
    return out


#: 401 and 500: answered on every route behind the API key, and for a bug.
COMMON_RESPONSES = {
    401: _error("Missing or wrong API key (only when the server has one)."),
    500: _error("A bug in the server (logged with its traceback, never with the request); bad input never "
                "gives 500."),
}

#: 404 of the routes with a model name in the path.
UNKNOWN_MODEL = {404: _error("Unknown model name.")}

#: Every status an inference route answers besides 200 (and 404 for a missing part or model).
ERROR_RESPONSES = {
    400: _error("Bad input: malformed JSON or npy, wrong feature count, NaN/inf, ragged rows, bad sparse "
                "indices, empty batch, bad parameters, values whose arithmetic overflows."),
    413: _error("Body larger than max_body_bytes, or more rows than max_batch_rows."),
    415: _error("Unsupported Content-Type."),
    503: _error("Overloaded (max_in_flight requests already admitted); retry after the Retry-After header's "
                "seconds.", retry_after=True),
    **COMMON_RESPONSES,
}

#: 503 of the readiness routes.
NOT_READY = {503: {"description": "Not ready: the model is warming up or the server is shutting down.",
                   "content": {"application/json": {"example": {"ready": False, "error": "warming up"}}},
                   "headers": ERROR_RESPONSES[503]["headers"]}}


def example_rows(n_features, n_rows=2):
    """``n_rows`` example rows of ``n_features`` values (pixel-like: mostly 0, some up to 255).

    Examples
    --------
    >>> example_rows(4)
    [[0.0, 12.0, 255.0, 3.0], [7.5, 0.0, 0.0, 1.0]]
    """
    pattern = [0.0, 12.0, 255.0, 3.0, 7.5, 0.0, 0.0, 1.0]
    flat = [pattern[i % len(pattern)] for i in range(n_rows * n_features)]
    return [flat[r * n_features:(r + 1) * n_features] for r in range(n_rows)]


def _sparse_example(n_features):
    cols = sorted({0, n_features // 2, n_features - 1})
    return {"indices": [cols[1:] or cols, cols[:1]],
            "values": [[12.0, 255.0][:len(cols[1:] or cols)], [7.5]]}

def _rows_schema(n_features):
    """JSON schema of rows for a model of ``n_features`` features: dense rows of exactly that many numbers, or
    sparse rows with column indices in ``[0, n_features)``."""
    numbers = {"type": "array", "items": {"type": "number"}}
    return {
        "anyOf": [
            {"title": "Dense rows", "type": "object", "required": ["instances"],
             "properties": {"instances": {"type": "array", "minItems": 1, "items": {
                 **numbers, "minItems": n_features, "maxItems": n_features},
                 "description": f"B rows of {n_features} numbers (the model's n_features)."}}},
            {"title": "Sparse rows", "type": "object", "required": ["indices", "values"],
             "properties": {"indices": {"type": "array", "minItems": 1, "items": {"type": "array", "items": {
                 "type": "integer", "minimum": 0, "maximum": n_features - 1}},
                 "description": f"Column indices (0 to {n_features - 1}, no repeats) of the non-zeros of each "
                                "row."},
                 "values": {"type": "array", "minItems": 1, "items": numbers,
                            "description": "The matching values."}}},
        ],
    }


_BINARY = {"schema": {"type": "string", "format": "binary"}}


def rows_request_body(n_features, extra_properties=None, json_extra=None):
    """``openapi_extra`` for a route taking rows of ``n_features`` values as JSON (dense or sparse), raw float32
    or npy; the examples are valid requests for the served model."""
    schema = _rows_schema(n_features)
    dense, sparse = {"instances": example_rows(n_features)}, _sparse_example(n_features)
    if extra_properties:
        schema = {"allOf": [schema, {"type": "object", "properties": extra_properties}]}
        dense.update(json_extra or {})
        sparse.update(json_extra or {})
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema, "examples": {
                    "dense": {"summary": f"Dense rows ({n_features} values each, the model's n_features)",
                              "value": dense},
                    "sparse": {"summary": "Sparse rows: column indices and values of the non-zeros",
                               "value": sparse}}},
                "application/octet-stream": {**_BINARY, "description": "Raw little-endian float32 rows, row-major; "
                                                                       "needs the X-Shape: B,D header."},
                "application/x-npy": {**_BINARY, "description": "One .npy array of shape (B, D), integer or float "
                                                                "dtype (np.save output; never unpickled)."},
            },
        },
        "parameters": [{"name": "X-Shape", "in": "header", "required": False, "schema": {"type": "string"},
                        "example": f"256,{n_features}",
                        "description": "Rows,features of an application/octet-stream body (required for it)."}],
    }


def search_parameters():
    """Query parameters of ``/search`` (also accepted as JSON fields)."""
    return [
        {"name": "k", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "default": 1},
         "description": "Neighbours per query row."},
        {"name": "nprobe", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1},
         "description": "Clusters whose members are scanned per query (default: the index's own)."},
    ]


def result_responses(model, binary_description):
    """``responses`` for a route answering JSON, raw binary or npy (same family as the request)."""
    return {
        200: {"model": model, "description": "Same content-type family as the request.",
              "content": {"application/octet-stream": {**_BINARY, "description": binary_description},
                          "application/x-npy": {**_BINARY, "description": "One .npy array: a structured array "
                                                                          "with one field per JSON key (a plain "
                                                                          "array for /features)."}}},
        **ERROR_RESPONSES,
    }


def oip_infer_body(n_features):
    """``openapi_extra`` of the v2 infer route: tensors as JSON, or JSON then binary tensor data."""
    rows = example_rows(n_features)
    schema = {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object", "description": "{\"binary_data_output\": true}: every output as "
                                                       "binary data."},
        "inputs": {"type": "array", "items": Tensor.model_json_schema()},
        "outputs": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "parameters": {"type": "object"}}},
                    "description": "Outputs to return: label and/or distance (default: both); "
                                   "{\"parameters\": {\"binary_data\": true}} returns one as binary data."}}}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema, "example": {
                    "id": "42", "inputs": [{"name": "X", "shape": [2, n_features], "datatype": "FP32",
                                            "data": [v for row in rows for v in row]}]}},
                "application/octet-stream": {**_BINARY, "description": "Binary tensor data extension: the JSON "
                                             "request, then the raw little-endian tensor bytes; the "
                                             "Inference-Header-Content-Length header gives the JSON's length."},
            },
        },
        "parameters": [{"name": "Inference-Header-Content-Length", "in": "header", "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                        "description": "Length of the JSON part of a body with binary tensor data."}],
    }


def oip_infer_responses():
    """``responses`` of the v2 infer route."""
    return {
        200: {"model": InferResponse, "description": "JSON; with binary outputs, the JSON then their raw bytes.",
              "content": {"application/octet-stream": {**_BINARY, "description": "Binary tensor data extension: "
                                                       "the JSON response, then the outputs asked for as binary "
                                                       "data; the Inference-Header-Content-Length header gives "
                                                       "the JSON's length."}}},
        **ERROR_RESPONSES,
        **UNKNOWN_MODEL,
    }
