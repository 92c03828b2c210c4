"""Export and import of a fitted :class:`qkm.ClusterIndex` (the ``index`` part of a saved model).

State version 2 (this version) stores the rows list by list, the lists
(``list_offsets``, ``row_ids``), the principal axes (``basis_mean``,
``basis``), the own lists' centroids (``list_centers``) and the labels; the
coordinates the bounds use are recomputed from them at load. Version 1 (the
model's clusters as lists, no axes) still loads, as ``partition="model"``
with axes fitted on the stored rows.
"""

import numbers

import numpy as np
import scipy.sparse as sp

from ..clustering._base import check_export_header
from ._index_build import BLOCK_DIMS, HEAD_DIMS, TAIL_BLOCKS, fit_basis
from ._index_probe import nearest_clusters
from .._validation import check_data

__all__ = ["STATE_VERSION", "export_state", "import_state"]

STATE_VERSION = 2


def export_state(index):
    """``(arrays, metadata)`` of a fitted index, without the operator (see ``qkm.export``).

    Arrays: ``fit_X`` (dense rows, list by list) or ``fit_X_indptr`` /
    ``fit_X_indices`` / ``fit_X_data`` / ``fit_X_shape`` (CSR),
    ``list_offsets``, ``row_ids``, ``basis_mean``, ``basis``,
    ``list_centers`` (own lists only) and ``y`` (numeric or boolean labels)
    or ``y_codes`` (string labels, with ``metadata["classes"]``).
    """
    lists = index._lists
    store = lists.rows
    arrays = {"list_offsets": lists.offsets.astype(np.int64), "row_ids": lists.row_ids.astype(np.int64),
              "basis_mean": lists.mean.astype(np.float64), "basis": lists.basis.astype(np.float32)}
    if lists.centers is not None:
        arrays["list_centers"] = lists.centers.astype(np.float32)
    if lists.sparse:
        arrays.update(fit_X_indptr=store.indptr.astype(np.int64), fit_X_indices=store.indices.astype(np.int32),
                      fit_X_data=store.data, fit_X_shape=np.asarray(store.shape, dtype=np.int64))
    else:
        arrays["fit_X"] = store
    metadata = {
        "state_version": STATE_VERSION,
        "partition": "model" if lists.centers is None else "own",
        "n_lists": int(index.n_lists_),
        "nprobe": index.nprobe if isinstance(index.nprobe, str) else int(index.nprobe),
        "nprobe_chosen": int(index.nprobe_),
        "target_recall": float(index.target_recall),
        "calibration": dict(index.calibration_),
        "head_dims": int(lists.head_dims),
        "store": lists.store,
        "n_samples": int(index.n_samples_fit_),
        "n_features": int(index.n_features_in_),
        "n_clusters": int(index.operator_.n_clusters),
        "sparse": bool(lists.sparse),
        "dtype": str(store.dtype),
        "y": "none",
    }
    y = index.y_
    if y is not None:
        if y.dtype.kind in "biuf":
            arrays["y"] = y
            metadata["y"] = "values"
        elif y.dtype.kind in "USO" and all(isinstance(v, str) for v in y.tolist()):
            classes, codes = np.unique(y.astype(str), return_inverse=True)
            arrays["y_codes"] = codes.astype(np.int64)
            metadata["y"] = "codes"
            metadata["classes"] = [str(c) for c in classes]
        else:
            raise TypeError(f"labels of dtype {y.dtype} cannot be exported: use numbers or strings.")
    return arrays, metadata


def _fail(message):
    raise ValueError(f"ClusterIndex state: {message}")


def _get(arrays, name):
    if name not in arrays:
        _fail(f"array {name!r} is missing.")
    return np.asarray(arrays[name])


def _int_vector(arrays, name, length=None):
    a = _get(arrays, name)
    if a.ndim != 1 or a.dtype.kind not in "iu" or (length is not None and a.shape[0] != length):
        want = f" of length {length}" if length is not None else ""
        _fail(f"{name!r} must be a 1-D integer array{want}; got {a.dtype} {a.shape}.")
    return a.astype(np.int64)


def _float_array(arrays, name, shape):
    a = _get(arrays, name)
    if a.dtype.kind != "f" or a.shape != shape:
        _fail(f"{name!r} must be a float array of shape {shape}; got {a.dtype} {a.shape}.")
    if not np.isfinite(a).all():
        _fail(f"{name!r} holds NaN or infinite values.")
    return a


def _rows(arrays, metadata, D):
    if metadata.get("sparse", False):
        shape = _int_vector(arrays, "fit_X_shape", 2)
        indptr = _int_vector(arrays, "fit_X_indptr")
        indices = _int_vector(arrays, "fit_X_indices")
        data = _get(arrays, "fit_X_data")
        n_rows = int(shape[0])
        if n_rows < 1 or shape[1] != D or indptr.shape[0] != n_rows + 1 or data.ndim != 1:
            _fail(f"CSR shape {tuple(shape)} / indptr {indptr.shape} do not match {D} features.")
        if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0] or \
                indices.shape[0] != data.shape[0]:
            _fail("malformed CSR arrays (indptr / indices / data).")
        if indices.size and (indices.min() < 0 or indices.max() >= D):
            _fail(f"CSR column indices outside [0, {D}).")
        if data.dtype.kind != "f":
            _fail(f"CSR data must be float; got {data.dtype}.")
        store = sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(n_rows, D))
    else:
        store = _get(arrays, "fit_X")
        if store.ndim != 2 or store.dtype.kind != "f" or store.shape[0] < 1 or store.shape[1] != D:
            _fail(f"'fit_X' must be a non-empty float (n, {D}) array; got {store.dtype} {store.shape}.")
    return check_data(store, dtype=store.dtype, what="ClusterIndex state: indexed rows")


def _labels(arrays, metadata, n):
    kind = metadata.get("y", "none")
    if kind == "none":
        return None
    if kind == "values":
        y = _get(arrays, "y")
        if y.ndim != 1 or y.shape[0] != n or y.dtype.kind not in "biuf":
            _fail(f"'y' must be a 1-D numeric array of length {n}.")
        return y
    if kind == "codes":
        classes = metadata.get("classes")
        codes = _int_vector(arrays, "y_codes", n)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) or not classes:
            _fail("string labels need metadata 'classes' (a list of str).")
        if codes.min() < 0 or codes.max() >= len(classes):
            _fail(f"'y_codes' outside [0, {len(classes)}).")
        return np.asarray(classes)[codes]
    _fail(f"unknown label kind {kind!r}.")


def _positive_int(value, name, high):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= value <= high:
        _fail(f"{name}={value!r} outside [1, {high}].")
    return int(value)


def import_state(cls, operator, arrays, metadata):
    """A fitted index of class ``cls`` from :func:`export_state` output and the model's operator.

    Raises
    ------
    ValueError
        When the arrays or metadata are inconsistent with each other or with ``operator``.
    """
    version = metadata.get("state_version", 1) if isinstance(metadata, dict) else None
    K, D = check_export_header("ClusterIndex", operator, metadata, version if version in (1, STATE_VERSION)
                               else STATE_VERSION)
    stored = _rows(arrays, metadata, D)
    n = stored.shape[0]
    if metadata.get("n_samples", n) != n:
        _fail(f"n_samples={metadata.get('n_samples')!r} but {n} rows are stored.")
    own = version == STATE_VERSION and metadata.get("partition") == "own"
    if version == STATE_VERSION and metadata.get("partition") not in ("own", "model"):
        _fail(f"partition={metadata.get('partition')!r}; expected 'own' or 'model'.")
    L = _positive_int(metadata.get("n_lists"), "n_lists", n) if own else K
    offsets = _int_vector(arrays, "list_offsets", L + 1)
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        _fail(f"'list_offsets' must rise from 0 to {n} in {L + 1} steps.")
    row_ids = _int_vector(arrays, "row_ids", n)
    if np.any(row_ids < 0) or np.any(row_ids >= n) or np.any(np.bincount(row_ids, minlength=n) != 1):
        _fail(f"'row_ids' must be a permutation of 0..{n - 1}.")
    y = _labels(arrays, metadata, n)
    X = stored[np.argsort(row_ids)]  # rows back in their original order
    lists = np.empty(n, dtype=np.int64)
    lists[row_ids] = np.repeat(np.arange(L), np.diff(offsets))
    if version == 1:
        nprobe = _positive_int(metadata.get("nprobe", 1), "nprobe", K)
        mean, basis = fit_basis(X, HEAD_DIMS + TAIL_BLOCKS * BLOCK_DIMS, np.random.RandomState(0))
        obj = cls(None, nprobe=nprobe, partition="model")
        centers, chosen, calibration = None, nprobe, {}
    else:
        mean = _float_array(arrays, "basis_mean", (D,)).astype(np.float64)
        basis = _get(arrays, "basis")
        if basis.ndim != 2 or basis.shape[0] != D or not 1 <= basis.shape[1] <= D:
            _fail(f"'basis' must be a (D={D}, m) array with 1 <= m <= D; got {basis.shape}.")
        basis = np.ascontiguousarray(_float_array(arrays, "basis", basis.shape), dtype=np.float32)
        h = min(HEAD_DIMS, basis.shape[1])
        if metadata.get("head_dims", h) != h:
            _fail(f"head_dims={metadata.get('head_dims')!r}; this qkm uses {h} with this basis.")
        centers = np.ascontiguousarray(_float_array(arrays, "list_centers", (L, h)), dtype=np.float32) if own \
            else None
        nprobe = metadata.get("nprobe", "auto")
        if nprobe != "auto":
            nprobe = _positive_int(nprobe, "nprobe", L)
        chosen = _positive_int(metadata.get("nprobe_chosen"), "nprobe_chosen", L)
        calibration = metadata.get("calibration", {})
        target = metadata.get("target_recall", 0.99)
        if not isinstance(calibration, dict) or not isinstance(target, numbers.Real) or not 0 < target <= 1:
            _fail("'calibration' must be a dict and 'target_recall' a float in (0, 1].")
        store = metadata.get("store", "float32")
        if store not in ("float32", "int8"):
            _fail(f"store={store!r}; expected 'float32' or 'int8'.")
        obj = cls(None, nprobe=nprobe, partition="auto" if own else "model", target_recall=float(target), store=store)
    obj._set_fitted(operator, X, lists, L, mean, basis, centers, nearest_clusters(operator, X), y)
    obj.nprobe_, obj.calibration_ = chosen, dict(calibration)
    return obj
