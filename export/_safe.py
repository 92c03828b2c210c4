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


def _fitted_arrays(estimator):
    """The arrays and metadata that define a fitted estimator."""
    from qkm import KMeans

    if not isinstance(estimator, KMeans) or not hasattr(estimator, "cluster_centers_"):
        raise TypeError(f"save_model needs a fitted qkm.KMeans; got {type(estimator).__name__}.")
    arrays = {"cluster_centers": estimator.cluster_centers_}
    metadata = {
        "algorithm": estimator.algorithm,
        "n_clusters": int(estimator.n_clusters_),
        "n_features": int(estimator.n_features_in_),
        "dtype": str(estimator.cluster_centers_.dtype),
        "inertia": float(estimator.inertia_),
        "n_iter": int(estimator.n_iter_),
        "params": {k: v for k, v in estimator.get_params().items() if isinstance(v, (int, float, str, type(None)))},
    }
    return "kmeans", arrays, metadata


def save_model(estimator, path, *, extra_metadata=None):
    """Write a fitted estimator in the safe format, atomically.

    Parameters
    ----------
    estimator : qkm.KMeans
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
    """A model read from the safe format.

    Attributes
    ----------
    kind : str
    metadata : dict
    arrays : dict of name -> ndarray
    estimator : qkm.KMeans
        A fitted estimator rebuilt from the arrays; ``predict`` and
        ``transform`` delegate to it.
    """

    def __init__(self, kind, arrays, metadata, header):
        from qkm import KMeans

        self.kind = kind
        self.arrays = arrays
        self.metadata = metadata
        self.header = header
        centers = arrays["cluster_centers"]
        est = KMeans(n_clusters=centers.shape[0])
        est.cluster_centers_ = centers
        est.n_clusters_ = centers.shape[0]
        est.n_features_in_ = centers.shape[1]
        est._n_features_out = centers.shape[0]
        self.estimator = est

    @property
    def n_clusters(self):
        return self.estimator.n_clusters_

    @property
    def n_features(self):
        return self.estimator.n_features_in_

    def predict(self, X):
        """Closest centre of each row (see :meth:`qkm.KMeans.predict`)."""
        return self.estimator.predict(X)

    def transform(self, X):
        """Distances to every centre (see :meth:`qkm.KMeans.transform`)."""
        return self.estimator.transform(X)


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
    if header.get("kind") != "kmeans" or "cluster_centers" not in arrays:
        raise ModelFormatError(f"{path}: model kind {header.get('kind')!r} is not supported by this qkm.")
    return LoadedModel(header["kind"], arrays, header.get("metadata", {}), header)
