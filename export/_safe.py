"""The safe model format: a zip of ``.npy`` arrays plus a JSON header, no pickle.

Layout of a model file::

    header.json        {"format": "qkm-model", "format_version": 1, "kind": ...,
                        "arrays": {name: {"sha256": ..., "dtype": ..., "shape": ...}},
                        "metadata": {...}}
    arrays/<name>.npy  one entry per array, read with allow_pickle=False

Loading checks the magic, the version and every checksum and says which one
failed. Writing goes through a temporary file and a rename, so a failure
never leaves a half-written model nor touches an existing one.
"""

import hashlib
import io
import json
import zipfile

import numpy as np

from qkm import __version__
from qkm._atomic import atomic_open

__all__ = ["FORMAT_VERSION", "ModelFormatError", "LoadedModel", "save_model", "load_model"]

FORMAT_NAME = "qkm-model"
FORMAT_VERSION = 1


class ModelFormatError(ValueError):
    """A model file is truncated, corrupted, of another kind or of a newer format."""


def _array_bytes(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def _json_params(estimator):
    return {k: v for k, v in estimator.get_params().items() if isinstance(v, (int, float, str, type(None)))}


def _fitted_arrays(estimator):
    """The arrays and metadata that define a fitted estimator."""
    from qkm import KMeans, LowRankKMeans, QKMeans

    if not isinstance(estimator, (KMeans, QKMeans, LowRankKMeans)) or not hasattr(estimator, "operator_"):
        raise TypeError(f"save_model needs a fitted qkm.KMeans, QKMeans or LowRankKMeans; got {type(estimator).__name__}.")
    metadata = {
        "estimator": type(estimator).__name__,
        "n_clusters": int(estimator.n_clusters_),
        "n_features": int(estimator.n_features_in_),
        "dtype": str(estimator.operator_.dtype),
        "inertia": float(estimator.inertia_),
        "n_iter": int(estimator.n_iter_),
        "nnz": int(estimator.operator_.nnz),
        "compression": float(estimator.operator_.compression),
        "params": _json_params(estimator),
    }
    if isinstance(estimator, KMeans):
        metadata["algorithm"] = estimator.algorithm
        return "kmeans", {"cluster_centers": estimator.cluster_centers_}, metadata
    metadata["algorithm"] = "qkmeans" if isinstance(estimator, QKMeans) else "lowrank"
    arrays = {}
    for i, factor in enumerate(estimator.operator_.factors):
        csr = factor.tocsr()
        arrays[f"factor{i}_indptr"] = csr.indptr.astype(np.int64)
        arrays[f"factor{i}_indices"] = csr.indices.astype(np.int64)
        arrays[f"factor{i}_data"] = csr.data
        arrays[f"factor{i}_shape"] = np.asarray(csr.shape, dtype=np.int64)
    metadata["n_factors"] = len(estimator.operator_.factors)
    return "factor-chain", arrays, metadata


def _factors_from_arrays(arrays, n_factors, path):
    """CSR factors from their arrays, with every index checked before scipy sees it."""
    import scipy.sparse as sp

    factors = []
    for i in range(n_factors):
        try:
            indptr, indices, data, shape = (arrays[f"factor{i}_{part}"] for part in ("indptr", "indices", "data", "shape"))
        except KeyError as exc:
            raise ModelFormatError(f"{path}: factor {i} is incomplete (missing {exc.args[0]!r}).") from None
        ok = (shape.shape == (2,) and indptr.ndim == indices.ndim == data.ndim == 1 and np.all(shape >= 0)
              and indptr.shape[0] == shape[0] + 1 and indptr[0] == 0 and np.all(np.diff(indptr) >= 0)
              and indptr[-1] == indices.shape[0] == data.shape[0]
              and (indices.size == 0 or (indices.min() >= 0 and indices.max() < shape[1])))
        if not ok:
            raise ModelFormatError(f"{path}: factor {i} is not a valid CSR matrix.")
        factors.append(sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=tuple(int(v) for v in shape)))
    return factors


def save_model(estimator, path, *, extra_metadata=None):
    """Write a fitted estimator in the safe format, atomically.

    Parameters
    ----------
    estimator : qkm.KMeans, qkm.QKMeans or qkm.LowRankKMeans
        A fitted estimator.
    path : str or os.PathLike
        Destination; an existing file is replaced only once the new one is complete.
    extra_metadata : dict, default=None
        JSON-serialisable facts to keep with the model (data fingerprint, command, ...).

    Examples
    --------
    >>> import numpy as np, os, tempfile, qkm
    >>> from qkm.export import save_model, load_model
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0], [1.0], [10.0], [11.0]]))
    >>> path = os.path.join(tempfile.mkdtemp(), "m.qkm")
    >>> save_model(km, path)
    >>> load_model(path).predict(np.array([[0.2], [10.5]])).tolist() == km.predict([[0.2], [10.5]]).tolist()
    True
    """
    kind, arrays, metadata = _fitted_arrays(estimator)
    if extra_metadata:
        metadata.update(extra_metadata)
    payload = {name: _array_bytes(arr) for name, arr in arrays.items()}
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "qkm_version": __version__,
        "kind": kind,
        "arrays": {
            name: {
                "sha256": hashlib.sha256(blob).hexdigest(),
                "dtype": str(arrays[name].dtype),
                "shape": list(arrays[name].shape),
            }
            for name, blob in payload.items()
        },
        "metadata": metadata,
    }
    with atomic_open(path, "wb") as f:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr("header.json", json.dumps(header, indent=1, sort_keys=True))
            for name, blob in payload.items():
                zf.writestr(f"arrays/{name}.npy", blob)


class LoadedModel:
    """A model read from the safe format; it predicts through its centroid operator.

    Attributes
    ----------
    kind : {"kmeans", "factor-chain"}
    metadata : dict
    arrays : dict of name -> ndarray
    operator : qkm.operator.CentroidOperator
        The centroids (dense matrix or sparse factor chain).
    """

    def __init__(self, kind, arrays, metadata, header, operator):
        self.kind = kind
        self.arrays = arrays
        self.metadata = metadata
        self.header = header
        self.operator = operator

    @property
    def n_clusters(self):
        return self.operator.n_clusters

    @property
    def n_features(self):
        return self.operator.n_features

    def _check(self, X):
        from qkm._validation import check_data, check_feature_count

        X = check_data(X, dtype=self.operator.dtype)
        check_feature_count(X, self.n_features, estimator="the model")
        return X

    def predict(self, X):
        """Closest centre of each row."""
        return self.operator.assign(self._check(X))[0]

    def transform(self, X):
        """Euclidean distances to every centre."""
        return np.sqrt(self.operator.sq_distances(self._check(X)))


def load_model(path):
    """Read a model written by :func:`save_model`, verifying format and checksums.

    Raises
    ------
    ModelFormatError
        Not a qkm model, truncated or corrupted, or written by a newer format.
    """
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise ModelFormatError(f"{path}: not a qkm model file (not a zip archive; truncated or another kind of file).") from exc
    with zf:
        try:
            header = json.loads(zf.read("header.json"))
        except KeyError as exc:
            raise ModelFormatError(f"{path}: not a qkm model file (no header.json).") from exc
        except (ValueError, zipfile.BadZipFile) as exc:
            raise ModelFormatError(f"{path}: unreadable header ({exc}).") from exc
        if header.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{path}: not a qkm model file (format {header.get('format')!r}).")
        version = header.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ModelFormatError(
                f"{path}: model format version {version!r} is newer than this qkm reads "
                f"({FORMAT_VERSION}); upgrade qkm (file written by qkm {header.get('qkm_version')})."
            )
        arrays = {}
        for name, info in header.get("arrays", {}).items():
            try:
                blob = zf.read(f"arrays/{name}.npy")
            except (KeyError, zipfile.BadZipFile, OSError) as exc:
                raise ModelFormatError(f"{path}: array {name!r} is missing, truncated or corrupted ({exc}).") from exc
            if hashlib.sha256(blob).hexdigest() != info.get("sha256"):
                raise ModelFormatError(f"{path}: checksum mismatch for array {name!r}: the file is corrupted.")
            arrays[name] = np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
    from qkm.operator import DenseOperator, FactorChainOperator

    kind = header.get("kind")
    metadata = header.get("metadata", {})
    if kind == "kmeans" and "cluster_centers" in arrays and arrays["cluster_centers"].ndim == 2:
        operator = DenseOperator(np.ascontiguousarray(arrays["cluster_centers"]))
    elif kind == "factor-chain" and isinstance(metadata.get("n_factors"), int) and metadata["n_factors"] >= 1:
        factors = _factors_from_arrays(arrays, metadata["n_factors"], path)
        try:
            operator = FactorChainOperator(factors, dtype=factors[0].dtype)
        except ValueError as exc:
            raise ModelFormatError(f"{path}: the factors do not form a valid chain ({exc}).") from exc
    else:
        raise ModelFormatError(f"{path}: model kind {kind!r} is not supported by this qkm.")
    return LoadedModel(kind, arrays, metadata, header, operator)
