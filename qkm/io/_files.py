"""Data I/O: load data sets (npy, csv, npz, svmlight, mtx, idx; text and idx files may
be .gz/.bz2 compressed) and labels; save labels and centroids atomically.

A malformed file raises :class:`DataFormatError`, whose message names the file and,
where it makes sense, the 1-based line number and the problem.
"""

import contextlib
import functools
import os

import numpy as np
import scipy.sparse as sp

from ._atomic import atomic_open
from ._readers import (_LOADERS, _OPENERS, FORMATS, DataFormatError, _guess_format, _labels, _load_csv, _read_idx,
                       _read_npy, _reading, _split_name)

__all__ = ["DataFormatError", "load_data", "load_labels", "save_labels", "save_centroids"]


@contextlib.contextmanager
def _atomic_write(path):
    """Yield ``(binary file, format suffix)``; the file replaces ``path`` atomically on success
    and is compressed if ``path`` ends in ``.gz`` or ``.bz2``."""
    name, compression = _split_name(path)
    suffix = os.path.splitext(name)[1]
    if compression and suffix == ".npy":
        raise ValueError(f"cannot write a compressed .npy file: {os.fspath(path)!r}")
    with atomic_open(path, "wb") as raw:
        with _OPENERS[compression](raw, "wb") if compression else contextlib.nullcontext(raw) as f:
            yield f, suffix


# ---------------------------------------------------------------- public API

def load_data(path, *, format=None, dtype=np.float64, n_features=None, zero_based="auto"):
    """Load a data matrix, and labels where the file holds them.

    Parameters
    ----------
    path : str or os.PathLike
        File to read; csv, svmlight, mtx and idx files may be ``.gz``/``.bz2``.
        A shard directory written by ``qkm shard`` (or its ``manifest.json``)
        is read whole, every shard checked against the manifest.
    format : {"npy", "csv", "npz", "svmlight", "mtx", "idx"} or None, default=None
        None guesses from the suffix (``.svm``, ``.libsvm`` or none: svmlight;
        ``.idx`` or ``-idx3-ubyte``: idx). A csv file may start with one
        non-numeric header line.
    dtype : numpy dtype, default=np.float64
    n_features : int or None, default=None
        For svmlight, the number of columns (an error if a feature index is
        beyond it). For other formats, the number of columns the file must have.
    zero_based : bool or "auto", default="auto"
        Whether svmlight feature indices start at 0. "auto" means 0-based if
        the file contains index 0, else 1-based (as in scikit-learn).

    Returns
    -------
    X : ndarray or scipy.sparse.csr_matrix of shape (n_samples, n_features)
        C-contiguous array for npy, csv, idx and dense npz (``np.savez``);
        CSR matrix with sorted, unique int32 indices for sparse npz
        (``scipy.sparse.save_npz``), svmlight and mtx.
    y : ndarray of shape (n_samples,) or None
        Labels (svmlight, or npz written by ``np.savez(X=..., y=...)``);
        integral labels are returned as int64.

    Raises
    ------
    DataFormatError
        If the file is malformed, holds no rows, or does not match its format.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "toy.svm")
    >>> with open(path, "w") as f:
    ...     _ = f.write("1 1:0.5 3:2\\n2 2:1\\n")
    >>> X, y = load_data(path)
    >>> X.toarray()
    array([[0.5, 0. , 2. ],
           [0. , 1. , 0. ]])
    >>> y
    array([1, 2])
    """
    from ._shards import is_sharded, load_sharded

    if is_sharded(path):
        X, y = load_sharded(path, dtype=dtype, n_features=n_features)
        return X, (None if y is None else _labels(path, y))
    fmt = _guess_format(_split_name(path)[0]) if format is None else format
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    loader = _LOADERS[fmt]
    if fmt == "svmlight":
        zero_based = zero_based if zero_based == "auto" else bool(zero_based)
        loader = functools.partial(loader, n_features=n_features, zero_based=zero_based)
    with _reading(path, fmt) as f:
        X, y = loader(f, path, np.dtype(dtype))
    if n_features is not None and X.shape[1] != n_features:
        raise DataFormatError(path, f"has {X.shape[1]} features, n_features={n_features} "
                                    "was requested")
    return X, y


def load_labels(path):
    """Load a labels vector.

    Parameters
    ----------
    path : str or os.PathLike
        An ``.npy`` file, an IDX file (e.g. ``train-labels-idx1-ubyte.gz``),
        or a text file (``.txt``, ``.csv``, ..., optionally ``.gz`` / ``.bz2``)
        with one number per line.

    Returns
    -------
    labels : ndarray of shape (n_samples,)
        Integral labels are returned as int64.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "labels.txt")
    >>> save_labels(path, [0, 2, 1])
    >>> load_labels(path)
    array([0, 2, 1])
    """
    fmt = {"npy": "npy", "idx": "idx"}.get(_guess_format(_split_name(path)[0]), "csv")
    with _reading(path, fmt) as f:
        if fmt == "npy":
            y = _read_npy(f, path)
        elif fmt == "idx":
            y = _read_idx(f, path)
        else:
            y = _load_csv(f, path, np.float64)[0]
            if y.shape[1] != 1:
                raise DataFormatError(path, f"has {y.shape[1]} columns; a labels file holds "
                                            "one label per line")
    return _labels(path, y)


def save_labels(path, labels):
    """Write labels atomically: ``.npy`` via ``np.save``, else text, one integer per line.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; text is compressed if it ends in ``.gz`` or ``.bz2``.
        An existing file is replaced only once the write succeeded.
    labels : array-like of shape (n_samples,)
        Labels; for text output they must be integers.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "labels.txt")
    >>> save_labels(path, [3, 1, 2])
    >>> open(path).read().split()
    ['3', '1', '2']
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    with _atomic_write(path) as (f, suffix):
        if suffix == ".npy":
            np.save(f, labels, allow_pickle=False)
        else:
            ints = labels.astype(np.int64)
            if not np.array_equal(ints, labels):
                raise ValueError("labels must be integers to be saved as text; use a .npy file")
            f.write("".join(f"{v}\n" for v in ints.tolist()).encode())


def save_centroids(path, centers):
    """Write cluster centers atomically as ``.npy`` or ``.csv`` (repr-exact ``%.17g``).

    Parameters
    ----------
    path : str or os.PathLike
        Destination ending in ``.npy`` or ``.csv`` (``.csv.gz``, ``.csv.bz2``).
        An existing file is replaced only once the write succeeded.
    centers : array-like of shape (n_clusters, n_features)

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "centers.csv")
    >>> save_centroids(path, [[0.1, 2.0], [1/3, -4.5]])
    >>> X, _ = load_data(path)
    >>> X.tolist() == [[0.1, 2.0], [1/3, -4.5]]
    True
    """
    centers = centers.toarray() if sp.issparse(centers) else np.asarray(centers)
    if centers.ndim != 2:
        raise ValueError(f"centers must be 2-D, got shape {centers.shape}")
    if os.path.splitext(_split_name(path)[0])[1] not in (".npy", ".csv"):
        raise ValueError(f"centroids can be saved as .npy or .csv, got {os.fspath(path)!r}")
    with _atomic_write(path) as (f, suffix):
        if suffix == ".npy":
            np.save(f, centers, allow_pickle=False)
        else:
            np.savetxt(f, centers, fmt="%.17g", delimiter=",")
