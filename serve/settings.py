"""What one ``qkm serve`` process serves and within which limits (:class:`ServeSettings`).

The settings travel from the command line to every uvicorn worker through the
environment (workers are fresh processes: uvicorn spawns them, and each loads
the model itself). The API key never travels inside the JSON: it stays in
``QKM_API_KEY``, the variable users set anyway.
"""

import dataclasses
import json
import os
from pathlib import Path

__all__ = ["ServeSettings", "demo_model_path", "BACKENDS", "SETTINGS_ENV", "API_KEY_ENV"]

#: Backends computing ``/assign``: numba (the centroid operator) or onnxruntime (the exported graph).
BACKENDS = ("numba", "onnx")

#: Environment variable holding the JSON settings of the workers.
SETTINGS_ENV = "QKM_SERVE_SETTINGS"

#: Environment variable holding the API key (``qkm serve --api-key`` sets it for the workers).
API_KEY_ENV = "QKM_API_KEY"

#: The demo model shipped in ``models/`` (the :mod:`qkm.models` package; rebuilt by ``make models``).
DEMO_MODEL_NAME = "fashion_mnist_qkmeans.qkm"


def demo_model_path():
    """Path of the demo model shipped as :mod:`qkm.models` (the repository's ``models/`` directory).

    ``qkm serve`` with no model argument serves it. The wheel installs it as
    package data (``site-packages/qkm/models/``); in a clone installed with
    ``pip install -e .`` it is the repository's ``models/`` directory. Whether
    the file exists is not checked here.

    Examples
    --------
    >>> demo_model_path().name
    'fashion_mnist_qkmeans.qkm'
    """
    import qkm.models

    return Path(qkm.models.__file__).resolve().parent / DEMO_MODEL_NAME


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """Model, backend and limits of the inference service.

    Parameters
    ----------
    model_path : str
        Model file: qkm's safe format, or a joblib artefact when ``trust_pickle``.
    backend : {"numba", "onnx"}, default="numba"
        What computes ``/assign``: the centroid operator (numba kernels / BLAS)
        or onnxruntime running the model exported by :func:`qkm.export.to_onnx`
        (built in memory at start-up). ``/search`` and ``/features`` always run
        in numba/numpy.
    model_name : str, default=None
        Name in the Open Inference Protocol routes (``/v2/models/{name}``);
        default: the model file name without its suffix.
    max_batch_rows : int, default=4096
        More rows in one request give 413.
    max_body_bytes : int, default=32 MiB
        Larger bodies give 413, checked from ``Content-Length`` before reading
        and while streaming otherwise.
    max_in_flight : int, default=64
        Inference requests one worker holds at once (reading, queued or
        computing); one more gets 503 with ``Retry-After`` instead of waiting.
    inference_threads : int, default=2
        Inference calls running at once in one worker (a dedicated thread
        pool; the rest of ``max_in_flight`` waits for a thread).
    numba_threads : int, default=1
        numba threads per inference call (requests already run side by side).
    inline_body_bytes : int, default=16 KiB
        Assignment requests (``/assign``, v2 ``infer``) with a body at most this
        large (a few rows) are answered on the event loop instead of in the
        thread pool: their work is JSON
        parsing and a microsecond-scale kernel call, which hold the GIL anyway,
        so the hand-off to a thread would cost more than it frees (see
        docs/decisions.md, 'Inline answers').
        0 sends every request to the pool.
    api_key : str, default=None
        When set, every route except the health probes and the API docs needs
        ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``.
    trust_pickle : bool, default=False
        Allow a joblib artefact (pickle runs code: trusted files only).
    """

    model_path: str
    backend: str = "numba"
    model_name: str = None
    max_batch_rows: int = 4096
    max_body_bytes: int = 32 * 2**20
    max_in_flight: int = 64
    inference_threads: int = 2
    numba_threads: int = 1
    inline_body_bytes: int = 16 * 2**10
    api_key: str = dataclasses.field(default=None, repr=False)
    trust_pickle: bool = False

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}; expected one of {BACKENDS}.")
        for name in ("max_batch_rows", "max_body_bytes", "max_in_flight", "inference_threads", "numba_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1.")
        if isinstance(self.inline_body_bytes, bool) or not isinstance(self.inline_body_bytes, int) \
                or self.inline_body_bytes < 0:
            raise ValueError(f"inline_body_bytes={self.inline_body_bytes!r} must be an integer >= 0.")
        object.__setattr__(self, "model_path", os.fspath(self.model_path))
        if self.model_name is None:
            object.__setattr__(self, "model_name", Path(self.model_path).stem or "model")
        if self.api_key == "":
            raise ValueError("api_key is empty; pass None for no key.")

    def to_env(self):
        """The environment variables that carry these settings to the workers.

        Examples
        --------
        >>> env = ServeSettings("m.qkm", api_key="s3cret").to_env()
        >>> sorted(env), "s3cret" in env[SETTINGS_ENV]
        (['QKM_API_KEY', 'QKM_SERVE_SETTINGS'], False)
        >>> ServeSettings.from_env(env) == ServeSettings("m.qkm", api_key="s3cret")
        True
        """
        fields = dataclasses.asdict(self)
        key = fields.pop("api_key")
        env = {SETTINGS_ENV: json.dumps(fields)}
        if key is not None:
            env[API_KEY_ENV] = key
        return env

    @classmethod
    def from_env(cls, environ=None):
        """Settings written by :meth:`to_env` (``os.environ`` by default)."""
        environ = os.environ if environ is None else environ
        try:
            fields = json.loads(environ[SETTINGS_ENV])
        except KeyError:
            raise RuntimeError(f"{SETTINGS_ENV} is not set: start the service with 'qkm serve'.") from None
        return cls(**fields, api_key=environ.get(API_KEY_ENV) or None)
