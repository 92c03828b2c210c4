"""Input validation for every qkm estimator and kernel entry point (one place).

Kernels downstream assume what these functions guarantee: a C-contiguous
float32/float64 ndarray, or a CSR matrix with sorted, unique, in-range int32
indices and finite values.
"""

import math
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_is_fitted

__all__ = [
    "check_data",
    "check_n_clusters",
    "check_feature_count",
    "check_init_array",
    "as_float_dtype",
    "check_int",
    "check_float",
    "check_matrix",
    "check_weights",
]

_FLOAT_DTYPES = (np.float64, np.float32)


def as_float_dtype(dtype):
    """float32 stays float32; everything else becomes float64 (scikit-learn's rule)."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def _check_finite(values, what):
    if values.size and not np.isfinite(values).all():
        n_nan = int(np.isnan(values).sum())
        n_inf = int(np.isinf(values).sum())
        raise ValueError(
            f"{what} contains {n_nan} NaN and {n_inf} infinite value(s); "
            "remove or impute them before clustering."
        )


def row_norm_bound(dtype, centroid_sq_norms=None, accumulate_dtype=np.float64):
    """Largest Euclidean row norm whose distances ``||x||^2 - 2 x.v + ||v||^2`` stay finite.

    The squares are accumulated in ``accumulate_dtype`` and the products ``x.v`` are
    formed in ``dtype``. A margin of 64 covers the sums. Without ``centroid_sq_norms``
    (at fit time), the centres are means of the rows, so ``||v||`` is at most the bound.
    Realistic data are orders of magnitude below the bound.

    Examples
    --------
    >>> import numpy as np
    >>> f"{row_norm_bound(np.float32):.3g}", f"{row_norm_bound(np.float64):.3g}"
    ('2.31e+18', '1.68e+153')
    """
    accumulate = float(np.finfo(accumulate_dtype).max)
    products = float(np.finfo(dtype).max)
    if centroid_sq_norms is None or np.size(centroid_sq_norms) == 0:
        return min(math.sqrt(accumulate / 64), math.sqrt(products / 64))
    largest = math.sqrt(float(np.max(centroid_sq_norms)))
    return min(math.sqrt(accumulate / 64), products / 64 / max(largest, 1.0))


def check_row_norms(X, max_norm, dtype, what="X"):
    """``ValueError`` naming the first row whose Euclidean norm exceeds ``max_norm``.

    Examples
    --------
    >>> import numpy as np
    >>> check_row_norms(np.array([[3.0, 4.0]]), 10.0, np.float64)
    >>> check_row_norms(np.array([[3.0, 4.0], [1e200, 0.0]]), 10.0, np.float64)
    Traceback (most recent call last):
    ...
    ValueError: numeric overflow: row 1 has Euclidean norm 1e+200, too large for float64 arithmetic (distances would overflow above 10); scale the data down.
    """
    values = X.data if sp.issparse(X) else X
    if values.size == 0 or max(float(values.max()), -float(values.min())) * math.sqrt(X.shape[1]) <= max_norm:
        return  # the common case: no norm needed
    # norms without overflow: each row scaled by its largest magnitude first
    X = (sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64))
    scale = (abs(X).max(axis=1).toarray().ravel() if sp.issparse(X) else np.abs(X).max(axis=1))
    scale[scale == 0] = 1.0
    scaled = sp.diags(1.0 / scale) @ X if sp.issparse(X) else X / scale[:, None]
    sums = np.asarray(scaled.multiply(scaled).sum(axis=1)).ravel() if sp.issparse(X) else (scaled**2).sum(axis=1)
    with np.errstate(over="ignore"):
        norms = scale * np.sqrt(sums)
    bad = np.flatnonzero(~(norms <= max_norm))
    if bad.size:
        where = "row" if what == "X" else f"{what} row"
        raise ValueError(f"numeric overflow: {where} {int(bad[0])} has Euclidean norm {float(norms[bad[0]]):.3g}, "
                         f"too large for {np.dtype(dtype)} arithmetic (distances would overflow above "
                         f"{max_norm:.3g}); scale the data down.")


def _check_csr(X, what):
    X = sp.csr_matrix(X) if not isinstance(X, sp.csr_matrix) else X
    n_rows, n_cols = X.shape
    indptr, indices = X.indptr, X.indices
    if indptr.shape[0] != n_rows + 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError(f"{what}: malformed CSR indptr (length {indptr.shape[0]}, expected {n_rows + 1}, non-decreasing from 0).")
    if indptr[-1] != indices.shape[0] or indices.shape[0] != X.data.shape[0]:
        raise ValueError(
            f"{what}: malformed CSR arrays (indptr[-1]={int(indptr[-1])}, "
            f"len(indices)={indices.shape[0]}, len(data)={X.data.shape[0]})."
        )
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_cols:
            raise ValueError(
                f"{what}: sparse column index out of range: indices span [{lo}, {hi}] "
                f"but the matrix has {n_cols} columns."
            )
    if n_cols > np.iinfo(np.int32).max:
        raise ValueError(f"{what}: {n_cols} columns exceed the int32 index range.")
    return X


def check_data(X, *, dtype=None, what="X", min_samples=1, copy=False):
    """Validate ``X`` and return it in the layout the kernels need.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        Input data. Any scipy sparse format is converted to CSR.
    dtype : {np.float32, np.float64}, default=None
        Target dtype; ``None`` keeps float32 and turns anything else into float64.
    what : str, default="X"
        Name used in error messages.
    min_samples : int, default=1
        Fewest rows accepted.
    copy : bool, default=False
        Always copy, even when no conversion is needed.

    Returns
    -------
    X : ndarray or scipy.sparse.csr_matrix
        C-contiguous float ndarray, or CSR with sorted, duplicate-free int32 indices.

    Raises
    ------
    ValueError
        Empty data, NaN/inf, not 2-D, out-of-range sparse indices.
    TypeError
        Non-numeric data.

    Examples
    --------
    >>> import numpy as np
    >>> check_data([[1, 2], [3, 4]]).dtype
    dtype('float64')
    >>> check_data(np.array([[np.nan, 1.0]]))
    Traceback (most recent call last):
    ...
    ValueError: X contains 1 NaN and 0 infinite value(s); remove or impute them before clustering.
    """
    if sp.issparse(X):
        X = _check_csr(X, what)
        target = as_float_dtype(X.dtype if dtype is None else dtype)
        if X.data.dtype.kind == "c":
            raise ValueError(f"Complex data not supported in {what}.")
        if X.data.dtype.kind not in "fiub":
            raise TypeError(f"{what} has non-numeric dtype {X.dtype}; convert it with .astype(np.float64).")
        needs_copy = copy or X.dtype != target or X.indices.dtype != np.int32
        X = X.astype(target, copy=needs_copy) if needs_copy else X
        if X.indices.dtype != np.int32 or X.indptr.dtype not in (np.int32, np.int64):
            X.indices = X.indices.astype(np.int32)
        if not X.has_canonical_format:
            if not needs_copy:
                X = X.copy()
            X.sum_duplicates()  # sorts indices and merges duplicates
        _check_finite(X.data, what)
    else:
        arr = np.asarray(X)
        if arr.dtype.kind == "c":
            raise ValueError(f"Complex data not supported in {what}; pass the real part or the magnitude.")
        if arr.dtype == object or arr.dtype.kind not in "fiub":
            try:
                arr = np.asarray(X, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"{what} must be numeric; got dtype {arr.dtype} ({exc}). Convert it with .astype(np.float64)."
                ) from None
        if arr.ndim != 2:
            hint = " Reshape your data: X.reshape(1, -1) for a single sample, X.reshape(-1, 1) for a single feature." if arr.ndim == 1 else ""
            raise ValueError(f"{what} must be 2-D (n_samples, n_features); got {arr.ndim}-D with shape {arr.shape}.{hint}")
        target = as_float_dtype(arr.dtype if dtype is None else dtype)
        X = np.array(arr, dtype=target, order="C", copy=True) if copy else np.ascontiguousarray(arr, dtype=target)
        _check_finite(X, what)
    n_samples, n_features = X.shape
    if n_samples < min_samples:
        raise ValueError(f"{what} has {n_samples} sample(s); at least {min_samples} required.")
    if n_features < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 is required ({what}).")
    check_row_norms(X, row_norm_bound(X.dtype), X.dtype, what)
    return X


def check_n_clusters(n_clusters):
    """``n_clusters`` must be an integer >= 1."""
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, numbers.Integral):
        raise TypeError(f"n_clusters must be an integer, got {n_clusters!r} of type {type(n_clusters).__name__}.")
    if n_clusters < 1:
        raise ValueError(f"n_clusters={n_clusters} must be >= 1.")
    return int(n_clusters)


def check_feature_count(X, n_features_expected, what="X", estimator="the model"):
    """Raise a clear error when ``X`` has a different number of columns than at fit."""
    if X.shape[1] != n_features_expected:
        raise ValueError(
            f"{what} has {X.shape[1]} features, but {estimator} is expecting {n_features_expected} features "
            "as input (the number it was fitted with)."
        )


def check_fitted_data(estimator, X, attribute, dtype=None):
    """Test-time data of a fitted ``estimator``: fitted (``attribute`` set), valid, with the fitted feature count.

    ``dtype=None`` keeps float32 input as float32 (else float64), as :func:`check_data` does.
    """
    check_is_fitted(estimator, attribute)
    X = check_data(X, dtype=dtype)
    check_feature_count(X, estimator.n_features_in_, estimator=type(estimator).__name__)
    return X


def check_init_array(init, n_clusters, n_features, dtype, sparse=False):
    """A user-given initial centre array must be finite and of shape (n_clusters, n_features).

    Returned dense, or CSR with ``sparse`` (wide sparse data): a dense array
    is then read once into CSR before any conversion of its dtype, so no dense
    copy of it is made.
    """
    if sparse and not sp.issparse(init):
        arr = np.asarray(init)
        if arr.ndim == 2 and arr.dtype.kind in "fiub":
            init = sp.csr_matrix(arr)
    init = check_data(init, dtype=dtype, what="init")
    if sp.issparse(init) and not sparse:
        init = np.ascontiguousarray(init.toarray())
    if init.shape != (n_clusters, n_features):
        raise ValueError(
            f"init array has shape {init.shape}, expected (n_clusters, n_features) = ({n_clusters}, {n_features})."
        )
    return init


# --------------------------------------------------------------------------- #
# Scalars, matrices and weights of the palm4MSA functions
# --------------------------------------------------------------------------- #
def check_int(name, value, minimum):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    return int(value)


def check_choice(name, value, choices):
    """``value`` if it is one of the strings ``choices``, else a clear error."""
    if not (isinstance(value, str) and value in choices):
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}.")
    return value


def check_float(name, value, minimum=None):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number; got {value!r}.") from None
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be a finite number{bound}; got {value!r}.")
    return v


def check_matrix(name, a):
    """float64 C-contiguous copy of a finite 2-D array (float32 accepted)."""
    try:
        arr = np.array(a, dtype=np.float64, order="C", copy=True)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 2-D array of real numbers.") from None
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array; got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    return arr


def check_weights(weights, n_rows):
    """None, or a float64 (K,) vector of finite non-negative weights, not all zero."""
    if weights is None:
        return None
    try:
        w = np.array(weights, dtype=np.float64, copy=True)
    except (TypeError, ValueError):
        raise ValueError("weights must be a 1-D array of non-negative numbers.") from None
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"weights must have shape ({n_rows},) (one per row of target); got {w.shape}.")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or infinite values.")
    if (w < 0).any():
        raise ValueError("weights must be non-negative.")
    if not (w > 0).any():
        raise ValueError("weights must not all be zero.")
    return w
