"""OpenAPI documentation of the routes: request bodies in every accepted content type, responses, examples.

The inference routes read their bodies themselves (JSON parsing through
pydantic would cost more than the model), so their request bodies are
described here rather than inferred by FastAPI from type hints. Response
bodies are documented with the pydantic models below; handlers return
pre-encoded responses, so these models are never used to validate.
"""

from typing import Optional

from pydantic import BaseModel, Field

__all__ = ["rows_request_body", "result_responses", "ERROR_RESPONSES", "OIP_INFER_BODY", "search_parameters"]


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
    datatype: str = Field(description="FP32, FP64, INT8 ... INT64, UINT8 ... UINT64 (BOOL and BYTES are refused).")
    data: list = Field(description="Row-major values, flat or nested.")


class InferResponse(BaseModel):
    model_name: str
    model_version: Optional[str] = None
    id: Optional[str] = None
    outputs: list[Tensor]

    model_config = {"json_schema_extra": {"example": {
        "model_name": "fashion_mnist_qkmeans", "id": "42",
        "outputs": [{"name": "label", "shape": [2], "datatype": "INT64", "data": [3, 7]},
                    {"name": "distance", "shape": [2], "datatype": "FP64", "data": [1523.5, 2210.25]}]}}}


ERROR_RESPONSES = {
    400: {"model": ErrorBody, "description": "Bad input: malformed JSON or npy, wrong feature count, NaN/inf, ragged "
                                             "rows, bad sparse indices, empty batch, bad parameters."},
    401: {"model": ErrorBody, "description": "Missing or wrong API key (only when the server has one)."},
    413: {"model": ErrorBody, "description": "Body larger than max_body_bytes, or more rows than max_batch_rows."},
    415: {"model": ErrorBody, "description": "Unsupported Content-Type."},
    503: {"model": ErrorBody, "description": "Overloaded (max_in_flight requests already admitted); "
                                             "retry after the Retry-After header's seconds."},
}

_DENSE_EXAMPLE = {"instances": [[0.0, 12.0, 255.0, 3.0], [7.5, 0.0, 0.0, 1.0]]}
_SPARSE_EXAMPLE = {"indices": [[1, 2], [0, 3]], "values": [[12.0, 255.0], [7.5, 1.0]]}

_ROWS_SCHEMA = {
    "oneOf": [
        {"title": "Dense rows", "type": "object", "required": ["instances"],
         "properties": {"instances": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                                      "description": "B rows of D numbers (D = the model's n_features)."}}},
        {"title": "Sparse rows", "type": "object", "required": ["indices", "values"],
         "properties": {"indices": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}},
                                    "description": "Column indices (0 to D-1, no repeats) of the non-zeros of "
                                                   "each row."},
                        "values": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                                   "description": "The matching values."}}},
    ],
}

_BINARY = {"schema": {"type": "string", "format": "binary"}}


def rows_request_body(extra_properties=None, json_extra=None):
    """``openapi_extra`` for a route taking rows as JSON (dense or sparse), raw float32 or npy."""
    schema = _ROWS_SCHEMA
    dense, sparse = dict(_DENSE_EXAMPLE), dict(_SPARSE_EXAMPLE)
    if extra_properties:
        schema = {"allOf": [_ROWS_SCHEMA, {"type": "object", "properties": extra_properties}]}
        dense.update(json_extra or {})
        sparse.update(json_extra or {})
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema, "examples": {
                    "dense": {"summary": "Dense rows (shortened: real rows have the model's n_features values)",
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
                        "example": "256,784",
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


OIP_INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {
            "schema": {"type": "object", "required": ["inputs"], "properties": {
                "id": {"type": "string"},
                "parameters": {"type": "object"},
                "inputs": {"type": "array", "items": Tensor.model_json_schema()},
                "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                            "description": "Outputs to return: label and/or distance (default: both)."}}},
            "example": {"id": "42", "inputs": [{"name": "X", "shape": [2, 4], "datatype": "FP32",
                                                "data": [0.0, 12.0, 255.0, 3.0, 7.5, 0.0, 0.0, 1.0]}]},
        }},
    },
}
