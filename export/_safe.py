"""The safe model format: a zip of ``.npy`` arrays plus a JSON header, no pickle.

Layout of a model file::

    header.json        {"format": "qkm-model", "format_version": 4, "kind": "kmeans" | "factor-chain",
                        "checksum": "sha256:...",          # over the rest of this header (see below)
                        "arrays": {name: {"sha256": ..., "dtype": ..., "shape": ...}},
                        "metadata": {...},                 # K, D, nnz, algorithm, objective, ...
                        "parts": {"index": {...}, "nystroem": {...}}}   # optional
    arrays/<name>.npy  one entry per array, read with allow_pickle=False:
                       cluster_centers, or factor{i}_indptr/indices/data/shape and an
                       optional mean (centroids = mean + product of the factors);
                       sq_norms; index.<name> and nystroem.<name> for the parts

The content checksum (versions 3 and 4) is the SHA-256 of the header itself, without its
``checksum`` field, as canonical JSON: it covers the metadata and the parts, and through
the ``sha256`` of every array the arrays too. Versions 1 and 2 (checksum over the array
hashes only, or none) and 3 (no mean) still load; a mean in a file older than
version 4 is refused.

Loading checks the magic, the version, every checksum and every sparse index
and says which one failed. Every way a file can be damaged (any byte of the zip,
its headers included) ends in :class:`ModelFormatError` naming the file; only
the operating system's own errors (missing file, a directory, no permission)
pass through as they are. Writing goes through a temporary file and a rename,
so a failure never leaves a half-written model nor touches an existing one.
"""

import hashlib
import io
import json
import os
import zipfile

import numpy as np

from qkm._version import __version__
from qkm.io._atomic import atomic_open

from ._model import Model, content_checksum, operator_arrays

__all__ = ["FORMAT_VERSION", "ModelFormatError", "LoadedModel", "save_model", "load_model", "header_checksum"]

FORMAT_NAME = "qkm-model"
# 2: squared norms, content checksum, optional index / nystroem parts; 3: checksum over the header;
# 4: a factor chain's optional mean (arrays/mean.npy)
FORMAT_VERSION = 4


class ModelFormatError(ValueError):
    """A model file is truncated, corrupted, of another kind or of a newer format."""


def header_checksum(header):
    """Content checksum of a version-3 or -4 header: SHA-256 of its canonical JSON without the ``checksum`` field.

    The header lists the SHA-256 of every array, so this one value covers the
    arrays, the metadata and the parts.

    Examples
    --------
    >>> a = header_checksum({"metadata": {"objective": 1.5}, "checksum": "ignored"})
    >>> a == header_checksum({"metadata": {"objective": 1.5}}), a == header_checksum({"metadata": {"objective": 2}})
    (True, False)
    """
    rest = {key: value for key, value in header.items() if key != "checksum"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _array_bytes(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


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



def _operator_from_arrays(kind, arrays, metadata, path, version):
    from qkm.operator import DenseOperator, FactorChainOperator

    if kind == "kmeans":
        centers = arrays.get("cluster_centers")
        if centers is None or centers.ndim != 2 or centers.dtype.kind != "f" or 0 in centers.shape:
            raise ModelFormatError(f"{path}: 'cluster_centers' is missing or not a non-empty 2-D float array.")
        if not np.all(np.isfinite(centers)):
            raise ModelFormatError(f"{path}: 'cluster_centers' holds NaN or infinite values.")
        return DenseOperator(np.ascontiguousarray(centers))
    if kind == "factor-chain":
        n_factors = metadata.get("n_factors")
        if not isinstance(n_factors, int) or n_factors < 1:
            raise ModelFormatError(f"{path}: metadata 'n_factors' must be a positive integer, got {n_factors!r}.")
        factors = _factors_from_arrays(arrays, n_factors, path)
        if any(f.dtype.kind != "f" or not np.all(np.isfinite(f.data)) for f in factors):
            raise ModelFormatError(f"{path}: factor values must be finite floats.")
        mean = arrays.get("mean")
        if mean is not None and version < 4:
            raise ModelFormatError(f"{path}: a 'mean' array in a version-{version} file (means came with version 4).")
        if mean is not None and (mean.ndim != 1 or mean.dtype.kind != "f" or not np.all(np.isfinite(mean))):
            raise ModelFormatError(f"{path}: 'mean' is not a 1-D float array.")
        try:
            return FactorChainOperator(factors, dtype=factors[0].dtype, mean=mean)
        except ValueError as exc:
            raise ModelFormatError(f"{path}: the factors do not form a valid chain ({exc}).") from exc
    raise ModelFormatError(f"{path}: model kind {kind!r} is not supported by this qkm (version {__version__}).")


_PARTS = {"index": "ClusterIndex", "nystroem": "Nystroem"}


def save_model(estimator, path, *, index=None, nystroem=None, extra_metadata=None):
    """Write a fitted model in the safe format, atomically.

    Parameters
    ----------
    estimator : fitted qkm.KMeans, QKMeans, LowRankKMeans, ClusterIndex, Nystroem or qkm.export.Model
        What to save. A ClusterIndex or Nystroem is saved with its centroid operator.
    path : str or os.PathLike
        Destination; an existing file is replaced only once the new one is complete.
    index : qkm.ClusterIndex, optional
        A fitted search index built on the same operator, saved alongside.
    nystroem : qkm.Nystroem, optional
        A fitted Nyström map whose landmarks are the same operator, saved alongside.
    extra_metadata : dict, optional
        JSON-serialisable facts to keep with the model (data fingerprint, command, ...).

    Returns
    -------
    model : qkm.export.Model
        The record written, with its content ``checksum`` set.

    Examples
    --------
    >>> import numpy as np, os, tempfile, qkm
    >>> from qkm.export import save_model, load_model
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0], [1.0], [10.0], [11.0]]))
    >>> path = os.path.join(tempfile.mkdtemp(), "m.qkm")
    >>> written = save_model(km, path)
    >>> loaded = load_model(path)
    >>> loaded.predict(np.array([[0.2], [10.5]])).tolist() == km.predict([[0.2], [10.5]]).tolist()
    True
    >>> loaded.checksum == written.checksum
    True
    """
    model = Model.from_estimator(estimator, index=index, nystroem=nystroem, extra_metadata=extra_metadata)
    kind, arrays = operator_arrays(model.operator)
    arrays["sq_norms"] = np.asarray(model.sq_norms, dtype=np.float64)
    parts = {}
    for part, cls_name in _PARTS.items():
        obj = getattr(model, part)
        if obj is None:
            continue
        part_arrays, part_metadata = obj._export_state()
        for name, arr in part_arrays.items():
            arr = np.asarray(arr)
            if arr.dtype.hasobject:
                raise TypeError(f"{cls_name} exported an object array {name!r}; the safe format stores numbers only.")
            arrays[f"{part}.{name}"] = arr
        parts[part] = {"class": cls_name, "metadata": part_metadata}
    payload = {name: _array_bytes(arr) for name, arr in arrays.items()}
    hashes = {name: hashlib.sha256(blob).hexdigest() for name, blob in payload.items()}
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "qkm_version": __version__,
        "kind": kind,
        "arrays": {name: {"sha256": hashes[name], "dtype": str(arrays[name].dtype), "shape": list(arrays[name].shape)}
                   for name in payload},
        "metadata": model.metadata,
        "parts": parts,
    }
    try:
        header = json.loads(json.dumps(header, allow_nan=False))  # exactly what a reader will parse and hash
    except (TypeError, ValueError) as exc:
        raise TypeError(f"model metadata must be JSON-serialisable numbers and strings ({exc}).") from exc
    header["checksum"] = model.checksum = header_checksum(header)
    model.format_version = FORMAT_VERSION
    header_bytes = json.dumps(header, indent=1, sort_keys=True).encode()
    with atomic_open(path, "wb") as f:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr("header.json", header_bytes)
            for name, blob in payload.items():
                zf.writestr(f"arrays/{name}.npy", blob)
    return model


#: Compression methods of the entries a model file may hold: qkm writes stored entries; re-zipped files may deflate.
_COMPRESSIONS = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}  # method -> largest expansion ratio


def _entries(zf, path, archive_size):
    """``name -> ZipInfo`` of the archive, each entry's sizes checked against the file's size before any read."""
    entries = {}
    for info in zf.infolist():
        ratio = _COMPRESSIONS.get(info.compress_type)
        if ratio is None:
            raise ModelFormatError(f"{path}: entry {info.filename!r} uses zip compression method "
                                   f"{info.compress_type}; qkm model files are stored or deflated.")
        if info.compress_size > archive_size or info.file_size > ratio * info.compress_size + 64:
            raise ModelFormatError(f"{path}: entry {info.filename!r} claims {info.file_size} bytes in a "
                                   f"{archive_size}-byte file: the zip directory is corrupted.")
        entries[info.filename] = info
    return entries


def _read_archive(f, path):
    """The header, arrays and array hashes of an open model file; any damage raises from the zip or npy readers."""
    try:
        zf = zipfile.ZipFile(f)
    except zipfile.BadZipFile as exc:
        raise ModelFormatError(
            f"{path}: not a qkm model file (not a zip archive: truncated, or another kind of file"
            " - a joblib artefact loads with qkm.export.load_joblib)."
        ) from exc
    with zf:
        entries = _entries(zf, path, os.fstat(f.fileno()).st_size)
        if "header.json" not in entries:
            raise ModelFormatError(f"{path}: not a qkm model file (no header.json).")
        header = json.loads(zf.read(entries["header.json"]))
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{path}: not a qkm model file (format {header.get('format') if isinstance(header, dict) else None!r}).")
        version = header.get("format_version")
        if not isinstance(version, int) or version < 1 or version > FORMAT_VERSION:
            raise ModelFormatError(
                f"{path}: model format version {version!r} is not one this qkm reads (1 to {FORMAT_VERSION}); "
                f"the file was written by qkm {header.get('qkm_version')}, this is qkm {__version__}: upgrade qkm."
            )
        if version >= 3 and header.get("checksum") != header_checksum(header):
            raise ModelFormatError(f"{path}: the content checksum does not match the header: the file is "
                                   "corrupted or was edited.")
        arrays, hashes = {}, {}
        for name, info in (header.get("arrays") or {}).items():
            entry = entries.get(f"arrays/{name}.npy")
            if entry is None:
                raise ModelFormatError(f"{path}: array {name!r} is missing.")
            blob = zf.read(entry)
            hashes[name] = hashlib.sha256(blob).hexdigest()
            if not isinstance(info, dict) or hashes[name] != info.get("sha256"):
                raise ModelFormatError(f"{path}: checksum mismatch for array {name!r}: the file is corrupted.")
            try:
                arrays[name] = np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise ModelFormatError(f"{path}: array {name!r} is not a plain numeric .npy ({exc}).") from exc
    return header, arrays, hashes


def load_model(path):
    """Read a model written by :func:`save_model`, verifying format, checksums and indices.

    Returns
    -------
    model : qkm.export.Model
        With ``predict``, ``transform``, ``operator``, ``metadata`` and, when
        saved with them, ``index`` / ``search`` and ``nystroem`` / ``features``.

    Raises
    ------
    ModelFormatError
        Not a qkm model, truncated or corrupted (any damaged byte, zip headers
        included), edited after writing, inconsistent, or written by a newer format.
    OSError
        The system's own errors: no such file, a directory, no permission.
    """
    with open(path, "rb") as f:  # the system's errors (no such file, a directory, no permission) stay as they are
        try:
            return _load(f, path)
        except ModelFormatError:
            raise
        except Exception as exc:  # whatever the zip, json or npy readers make of damaged bytes
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ModelFormatError(f"{path}: the file is damaged ({detail}).") from exc


def _load(f, path):
    header, arrays, hashes = _read_archive(f, path)
    metadata = header.get("metadata")
    if not isinstance(metadata, dict):
        raise ModelFormatError(f"{path}: the header has no metadata object.")
    operator = _operator_from_arrays(header.get("kind"), arrays, metadata, path, header["format_version"])
    if "sq_norms" in arrays:
        stored = arrays["sq_norms"]
        if stored.shape != (operator.n_clusters,) or not np.allclose(stored, operator.row_sq_norms(), rtol=1e-6, atol=0):
            raise ModelFormatError(f"{path}: stored squared norms do not match the centroids: the file is inconsistent.")
    if header["format_version"] >= 3:
        checksum = header["checksum"]  # verified against the header, which holds every array's hash
    else:  # versions 1 and 2: a checksum over the array hashes only (if any)
        checksum = content_checksum(hashes)
        if "checksum" in header and header["checksum"] != checksum:
            raise ModelFormatError(f"{path}: the content checksum does not match the arrays: the file is corrupted.")
    extras = {}
    parts = header.get("parts") or {}
    for part, info in parts.items():
        if part not in _PARTS or not isinstance(info, dict):
            raise ModelFormatError(f"{path}: unknown model part {part!r}; it needs a newer qkm.")
        from qkm import approximate

        cls = getattr(approximate, _PARTS[part])
        prefix = part + "."
        part_arrays = {name[len(prefix):]: arr for name, arr in arrays.items() if name.startswith(prefix)}
        try:
            extras[part] = cls._from_export_state(operator, part_arrays, info.get("metadata") or {})
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelFormatError(f"{path}: the saved {_PARTS[part]} is inconsistent ({exc}).") from exc
    return Model(operator, metadata, checksum=checksum, format_version=header["format_version"], **extras)


LoadedModel = Model  # the name used before the Model record existed
