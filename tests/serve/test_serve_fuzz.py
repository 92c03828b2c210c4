"""Property-based fuzz of the HTTP API from its own OpenAPI schema (schemathesis, in process over ASGI).

Every operation the schema documents gets generated requests, valid and invalid (with a fixed seed and a
bounded number of examples, so CI is fast and a failure replays): no answer is a 5xx, every status, content
type, header and JSON body is the one the schema documents, and schema-invalid requests are refused with a
4xx. The model is small (D = 3) so that generated rows often have the right width and reach the kernels,
the overflow rule included.
"""

import warnings

import numpy as np
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import qkm
from qkm.export import Model
from qkm.serve import create_app

schemathesis.serializer.alias("application/x-npy", "application/octet-stream")  # npy bodies: bytes as generated



@schemathesis.check
def negative_data_rejected(ctx, response, case):
    """schemathesis' ``negative_data_rejection``, where 413 also counts as rejected: a request both invalid and
    over ``max_batch_rows`` / ``max_body_bytes`` is refused for its size first (413 is documented on every
    inference route, which ``status_code_conformance`` checks)."""
    if response.status_code == 413:
        return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejected]


def _app():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 1.0, (40, 3)) for c in (0.0, 10.0, -10.0)])
    y = np.repeat([0, 1, 2], 40)
    km = qkm.KMeans(3, random_state=0).fit(X)
    model = Model.from_estimator(km, index=qkm.ClusterIndex(km).fit(X, y),
                                 nystroem=qkm.Nystroem(n_components=3, landmarks=km).fit(X))
    app = create_app(model, model_name="m", max_batch_rows=64, max_body_bytes=64 * 1024)
    app.state.service.warm_up()  # ready, as after the ASGI lifespan
    return app


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    schema = schemathesis.openapi.from_asgi("/openapi.json", _app())  # at import: parametrize needs it


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_answers_conform_to_the_schema(case):
    case.call_and_validate(checks=CHECKS)
