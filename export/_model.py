"""The ``Model`` record: what a fitted qkm estimator is, independent of any file format.

A model is one centroid operator (dense centroids or a sparse factor chain),
its squared row norms, and the facts about how it was trained. Optionally it
carries a :class:`qkm.ClusterIndex` (approximate 1-NN search) and a
:class:`qkm.Nystroem` feature map built on the same operator. The safe format
(:mod:`qkm.export._safe`), ONNX export and the HTTP service all read this
record, never the estimator classes directly.
"""

import hashlib

import numpy as np
import scipy.sparse as sp

from qkm._version import __version__

__all__ = ["Model", "as_model", "data_fingerprint", "operator_arrays"]


def data_fingerprint(X):
    """SHA-256 of a data matrix's shape, dtype and values (dense or CSR).

    Two matrices with the same fingerprint hold the same numbers in the same
    layout; stored with a model, it tells which data trained it.

    Examples
    --------
    >>> import numpy as np
    >>> a = data_fingerprint(np.eye(2))
    >>> a == data_fingerprint(np.eye(2)), a == data_fingerprint(2 * np.eye(2))
    (True, False)
    """
    h = hashlib.sha256()
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        X.sort_indices()
        h.update(f"csr{X.shape}{X.dtype.str}".encode())
        for part in (X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data):
            h.update(np.ascontiguousarray(part).tobytes())
    else:
        X = np.ascontiguousarray(X)
        h.update(f"dense{X.shape}{X.dtype.str}".encode())
        h.update(X.tobytes())
    return "sha256:" + h.hexdigest()


def operator_arrays(operator):
    """The kind and the arrays that define a centroid operator.

    Returns ``("kmeans", {"cluster_centers": V})`` for a dense operator and
    ``("factor-chain", {"factor{i}_indptr": ..., ...})`` for a factor chain
    (CSR parts with int64 indices, and ``"mean"`` when the chain keeps one).
    """
    from qkm.operator import DenseOperator

    if isinstance(operator, DenseOperator):
        return "kmeans", {"cluster_centers": np.ascontiguousarray(operator.to_dense())}
    arrays = {}
    for i, factor in enumerate(operator.factors):
        csr = sp.csr_matrix(factor)
        arrays[f"factor{i}_indptr"] = csr.indptr.astype(np.int64)
        arrays[f"factor{i}_indices"] = csr.indices.astype(np.int64)
        arrays[f"factor{i}_data"] = csr.data
        arrays[f"factor{i}_shape"] = np.asarray(csr.shape, dtype=np.int64)
    if operator.mean is not None:
        arrays["mean"] = np.ascontiguousarray(operator.mean)
    return "factor-chain", arrays


def _json_params(estimator):
    return {k: v for k, v in estimator.get_params().items() if isinstance(v, (bool, int, float, str, type(None)))}


def _estimator_metadata(estimator):
    """Training facts of a fitted KMeans / QKMeans / LowRankKMeans."""
    from qkm.clustering import KMeans, QKMeans

    if isinstance(estimator, KMeans):
        algorithm = estimator.algorithm
    else:
        algorithm = "qkmeans" if isinstance(estimator, QKMeans) else "lowrank"
    metadata = {
        "estimator": type(estimator).__name__,
        "algorithm": algorithm,
        "objective": float(estimator.inertia_),
        "inertia": float(estimator.inertia_),
        "n_iter": int(estimator.n_iter_),
        "params": _json_params(estimator),
    }
    for name in ("sparsity_level", "rank"):
        if name in metadata["params"]:
            metadata[name] = metadata["params"][name]
    return metadata


def _split_fitted(obj):
    """(operator, training metadata, index, nystroem) of a fitted estimator, index, Nyström map or Model."""
    from qkm.approximate import ClusterIndex, Nystroem
    from qkm.clustering import KMeans, LowRankKMeans, QKMeans

    if isinstance(obj, Model):
        return obj.operator, dict(obj.metadata), obj.index, obj.nystroem
    if isinstance(obj, ClusterIndex) and hasattr(obj, "operator_"):
        source = getattr(obj, "estimator", None)
        operator, metadata, _, nystroem = _split_fitted(source) if source is not None else (obj.operator_, {}, None, None)
        return obj.operator_, metadata, obj, nystroem
    if isinstance(obj, Nystroem) and hasattr(obj, "operator_"):
        metadata = {"estimator": "Nystroem", "params": _json_params(obj)}
        return obj.operator_, metadata, None, obj
    if isinstance(obj, (KMeans, QKMeans, LowRankKMeans)) and hasattr(obj, "operator_"):
        return obj.operator_, _estimator_metadata(obj), None, None
    hint = " (is it fitted?)" if hasattr(obj, "get_params") else ""
    raise TypeError(
        "expected a fitted qkm.KMeans, QKMeans, LowRankKMeans, ClusterIndex or Nystroem, or a qkm.export.Model; "
        f"got {type(obj).__name__}{hint}."
    )


def _same_operator(a, b):
    if a is b:
        return True
    return a.shape == b.shape and np.array_equal(a.to_dense(), b.to_dense())


def content_checksum(array_hashes):
    """One SHA-256 over the sorted ``name -> sha256`` pairs of a model's arrays."""
    h = hashlib.sha256()
    for name in sorted(array_hashes):
        h.update(f"{name}={array_hashes[name]}\n".encode())
    return "sha256:" + h.hexdigest()


class Model:
    """A fitted k-means model as a plain record: operator, norms, metadata, optional index and features.

    Build one with :meth:`from_estimator` (or :func:`as_model`), write it with
    :func:`qkm.export.save_model`, read it with :func:`qkm.export.load_model`.

    Parameters
    ----------
    operator : qkm.operator.CentroidOperator
        The centroids, dense or as a sparse factor chain.
    metadata : dict
        JSON-serialisable facts: estimator, algorithm, objective, ...
        ``n_clusters``, ``n_features``, ``dtype``, ``nnz``, ``compression``,
        ``flops`` and ``qkm_version`` are filled in from the operator.
    index : qkm.ClusterIndex, optional
        A fitted index over the training rows, built on ``operator``.
    nystroem : qkm.Nystroem, optional
        A fitted Nyström feature map whose landmarks are ``operator``.
    checksum : str, optional
        Content checksum of the arrays (set when read from or written to a file).
    format_version : int, optional
        Safe-format version of the file it was read from.

    Attributes
    ----------
    kind : {"kmeans", "factor-chain"}
    sq_norms : ndarray of shape (n_clusters,)
        ``||v_k||^2`` in float64.

    Examples
    --------
    >>> import numpy as np, qkm
    >>> from qkm.export import Model
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0], [1.0], [10.0], [11.0]]))
    >>> model = Model.from_estimator(km)
    >>> model.kind, model.n_clusters, model.n_features, model.predict([[0.2], [10.5]]).tolist()
    ('kmeans', 2, 1, [1, 0])
    """

    def __init__(self, operator, metadata=None, *, index=None, nystroem=None, checksum=None, format_version=None):
        self.operator = operator
        self.kind = "factor-chain" if hasattr(operator, "factors") else "kmeans"
        if index is not None and not _same_operator(index.operator_, operator):
            raise ValueError("the index was built on another centroid operator than the model's.")
        if nystroem is not None and not _same_operator(nystroem.operator_, operator):
            raise ValueError("the Nyström landmarks are not the model's centroids; build Nystroem(landmarks=estimator).")
        self.index = index
        self.nystroem = nystroem
        self.metadata = dict(metadata or {})
        self.metadata.update(
            n_clusters=int(operator.n_clusters),
            n_features=int(operator.n_features),
            dtype=str(np.dtype(operator.dtype)),
            nnz=int(operator.nnz),
            compression=float(operator.compression),
            flops=int(operator.flops),
            centered=operator.mean is not None,
        )
        if hasattr(operator, "factors"):
            self.metadata["n_factors"] = len(operator.factors)
        self.metadata.setdefault("qkm_version", __version__)
        self.checksum = checksum
        self.format_version = format_version

    @classmethod
    def from_estimator(cls, estimator, *, index=None, nystroem=None, extra_metadata=None):
        """A model record from a fitted estimator (or ClusterIndex / Nystroem / Model).

        Parameters
        ----------
        estimator : fitted qkm.KMeans, QKMeans, LowRankKMeans, ClusterIndex, Nystroem or Model
        index, nystroem : optional
            Extra parts to carry; they must be built on the same operator.
        extra_metadata : dict, optional
            JSON-serialisable facts to keep (data fingerprint, command, ...).
        """
        operator, metadata, own_index, own_nystroem = _split_fitted(estimator)
        metadata.update(extra_metadata or {})
        return cls(operator, metadata, index=index if index is not None else own_index,
                   nystroem=nystroem if nystroem is not None else own_nystroem)

    # -- facts ----------------------------------------------------------------- #
    @property
    def n_clusters(self):
        return self.operator.n_clusters

    @property
    def n_features(self):
        return self.operator.n_features

    @property
    def dtype(self):
        return np.dtype(self.operator.dtype)

    @property
    def sq_norms(self):
        return self.operator.row_sq_norms()

    def describe(self):
        """A JSON-serialisable summary (what ``GET /model`` returns)."""
        return {
            "kind": self.kind,
            "n_clusters": int(self.n_clusters),
            "n_features": int(self.n_features),
            "nnz": int(self.operator.nnz),
            "compression": float(self.operator.compression),
            "flops": int(self.operator.flops),
            "qkm_version": self.metadata.get("qkm_version"),
            "checksum": self.checksum,
            "format_version": self.format_version,
            "has_index": self.index is not None,
            "index": self.index.describe() if self.index is not None else None,
            "has_features": self.nystroem is not None,
            "metadata": self.metadata,
        }

    # -- use ------------------------------------------------------------------- #
    def _check(self, X):
        from qkm._validation import check_data, check_feature_count

        X = check_data(X, dtype=self.operator.dtype)
        check_feature_count(X, self.n_features, estimator="the model")
        return X

    def assign(self, X):
        """Closest centre and squared distance to it for each row: ``(labels, sq_dist)``."""
        return self.operator.assign(self._check(X))

    def predict(self, X):
        """Closest centre of each row."""
        return self.assign(X)[0]

    def transform(self, X):
        """Euclidean distances to every centre, shape (n_samples, n_clusters)."""
        return np.sqrt(self.operator.sq_distances(self._check(X)))

    def search(self, X, k=1, nprobe=None):
        """Approximate k-NN among the indexed training rows: ``(distances, indices)``; needs an index."""
        if self.index is None:
            raise ValueError("this model has no search index; save it with save_model(estimator, path, index=...).")
        return self.index.query(X, k=k, nprobe=nprobe)

    def features(self, X):
        """Nyström RBF features of the rows; needs a Nyström map."""
        if self.nystroem is None:
            raise ValueError("this model has no Nyström features; save it with save_model(estimator, path, nystroem=...).")
        return self.nystroem.transform(X)

    def __repr__(self):
        extras = [name for name, part in (("index", self.index), ("nystroem", self.nystroem)) if part is not None]
        return (f"Model(kind={self.kind!r}, n_clusters={self.n_clusters}, n_features={self.n_features}, "
                f"nnz={self.operator.nnz}" + (f", with {'+'.join(extras)}" if extras else "") + ")")


def as_model(obj):
    """``obj`` itself if it is a :class:`Model`, else :meth:`Model.from_estimator` of it."""
    return obj if isinstance(obj, Model) else Model.from_estimator(obj)
