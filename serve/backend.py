"""The loaded model and the calls that answer requests (run in the inference threads, never on the event loop).

:class:`InferenceBackend` wraps a :class:`qkm.export.Model`. ``/assign`` goes
through the model's centroid operator (numba kernels / BLAS; ``backend="numba"``)
or through onnxruntime running :func:`qkm.export.to_onnx` of the same model
(``backend="onnx"``); ``/search`` and ``/features`` always use the model's
index and Nyström map. :meth:`InferenceBackend.warm_up` runs every path once
so that no request pays for compilation or the operator's path calibration.
"""

import contextlib
import logging
import threading

import numba
import numpy as np
import scipy.sparse as sp

from qkm._threads import numba_threads, pin_numba_threads
from qkm._validation import row_norm_bound

__all__ = ["InferenceBackend", "load_model_file"]

log = logging.getLogger("qkm.serve")

#: Warm-up batch sizes: one in each batch-size bucket that the factor-chain operator calibrates.
WARM_UP_ROWS = (1, 16, 256, 512)


def load_model_file(path, trust_pickle=False):
    """A :class:`qkm.export.Model` from a safe-format file, or from a joblib artefact if ``trust_pickle``.

    Raises :class:`qkm.export.ModelFormatError` (a ``ValueError``) for a file
    that is neither, and ``FileNotFoundError`` for a missing one.
    """
    import os

    from qkm.export import ModelFormatError, as_model, load_joblib, load_model

    from .settings import demo_model_path

    if not os.path.exists(path):
        demo = os.path.abspath(path) == str(demo_model_path())
        raise FileNotFoundError(f"model file not found: {path}" + (" (the demo model: rebuild it with 'make models')"
                                                                   if demo else ""))
    try:
        return load_model(path)
    except ModelFormatError:
        if not trust_pickle:
            raise
    log.warning("loading %s as a joblib artefact (pickle): only do this for files you trust", path)
    return as_model(load_joblib(path))


class InferenceBackend:
    """Answers ``assign``, ``search`` and ``features`` for validated rows.

    Parameters
    ----------
    model : qkm.export.Model
    backend : {"numba", "onnx"}, default="numba"
    numba_threads : int, default=1
        numba threads per call (set in the calling thread; numba's count is
        thread-local). The model's index and Nyström map get it as ``n_jobs``.

    Examples
    --------
    >>> import numpy as np, qkm
    >>> from qkm.export import Model
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0], [1.0], [10.0], [11.0]]))
    >>> backend = InferenceBackend(Model.from_estimator(km))
    >>> labels, sq_dist = backend.assign(np.array([[0.5], [10.0]]))
    >>> labels.tolist(), sq_dist.tolist()
    ([1, 0], [0.0, 0.25])
    """

    def __init__(self, model, backend="numba", numba_threads=1):
        self.model = model
        self.name = backend
        self.numba_threads = numba_threads
        self._pinned_thread = None  # the thread pin_threads pinned to numba_threads (the event loop's)
        for part in (getattr(model, "index", None), getattr(model, "nystroem", None)):
            if part is not None and "n_jobs" in part.get_params():  # they set numba's thread count per call
                part.set_params(n_jobs=numba_threads)
        self.onnx_info = {}
        self._session = None
        if backend == "onnx":
            from qkm.export import to_onnx
            from qkm.export.onnx import onnx_session

            proto = to_onnx(model)
            self.onnx_info = {p.key: p.value for p in proto.metadata_props if p.key != "qkm.auto_timings"}
            self._session = onnx_session(proto, n_threads=1)
        elif backend != "numba":
            raise ValueError(f"backend={backend!r}; expected 'numba' or 'onnx'.")

    @property
    def n_features(self):
        return int(self.model.n_features)

    @property
    def dtype(self):
        """dtype the rows are converted to (float32 for onnxruntime, the operator's otherwise)."""
        return np.dtype(np.float32) if self._session is not None else np.dtype(self.model.operator.dtype)

    @property
    def max_row_norm(self):
        """Largest Euclidean norm of a request row that the distance arithmetic takes without overflow.

        ``||x||^2 - 2 x.v + ||v||^2`` is accumulated in float64 by the
        operator (float32 in onnxruntime) with the products ``x.v`` in the
        model's dtype: ``||x||^2`` and ``||x|| max_k ||v_k||`` must stay well
        inside those ranges (a margin of 64 covers the sums and the indexed
        training rows, which lie near their centroids). Realistic data is
        orders of magnitude below it.
        """
        accumulate = np.float32 if self._session is not None else np.float64
        return row_norm_bound(self.dtype, self.model.sq_norms, accumulate)

    @property
    def has_index(self):
        return getattr(self.model, "index", None) is not None

    @property
    def has_features(self):
        return getattr(self.model, "nystroem", None) is not None

    def pin_threads(self):
        """Set the calling thread's numba thread count to ``numba_threads`` for good (numba's count is per thread)."""
        pin_numba_threads(self.numba_threads)  # a count numba refuses is left to each call to refuse, as before
        if numba.get_num_threads() == self.numba_threads:
            self._pinned_thread = threading.get_ident()

    def _threads(self):
        """``numba_threads(n)`` around a call, or nothing when this thread already runs with ``n`` (pinned)."""
        if threading.get_ident() == self._pinned_thread or numba.get_num_threads() == self.numba_threads:
            return contextlib.nullcontext()
        return numba_threads(self.numba_threads)

    def assign(self, X):
        """``(labels, squared distances)`` of the nearest centroid of every row of validated ``X``.

        ``X`` as :func:`qkm.serve.decode.validate_rows` returns it (the operator's dtype, the model's
        feature count, finite).
        """
        if self._session is not None:
            X = X.toarray() if sp.issparse(X) else X
            labels, sq_dist = self._session.run(["label", "distance"], {"X": np.ascontiguousarray(X, np.float32)})
            return labels, sq_dist
        with self._threads():
            return self.model.operator.assign(X)  # validated rows: not checked again (~20 us)

    def search(self, X, k=1, nprobe=None):
        """``(distances, indices, labels or None)`` of the ``k`` approximate nearest indexed rows."""
        with self._threads():
            distances, indices = self.model.search(X, k=k, nprobe=nprobe)
        y = getattr(self.model.index, "y_", None)
        labels = np.asarray(y)[indices] if y is not None else None
        return distances, indices, labels

    def features(self, X):
        """Nyström RBF features of the rows, shape (n_rows, n_components)."""
        with self._threads():
            return self.model.features(X)

    def warm_up(self):
        """Run every path once (dense and CSR rows, each batch-size bucket, search, features)."""
        rng = np.random.default_rng(0)
        dtype = np.dtype(self.model.operator.dtype)
        for n_rows in WARM_UP_ROWS:
            X = rng.random((n_rows, self.n_features)).astype(dtype)
            self.assign(X)
            self.assign(sp.csr_matrix(X * (X > 0.9)))
        if self.has_index:
            self.search(X[:1], k=1)
            self.search(X[:16], k=2)
        if self.has_features:
            self.features(X[:1])
            self.features(X[:16])

    def describe(self):
        """Backend facts for ``GET /model``."""
        out = {"backend": self.name, "input_dtype": self.dtype.name}
        if self.onnx_info:
            out["onnx"] = self.onnx_info
        return out
