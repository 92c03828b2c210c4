"""Building the inverted lists of :class:`qkm.ClusterIndex`: principal axes, coordinates, quantiser, storage codec.

Used by :mod:`qkm.approximate._index` (which re-exports these names).
"""

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.exceptions import ConvergenceWarning

from .. import _config

__all__ = ["HEAD_DIMS", "BLOCK_DIMS", "TAIL_BLOCKS", "fit_basis", "coordinates", "centred_sq_norms", "fit_quantizer",
           "coordinate_codec"]

#: Coordinates of the head (quantiser space and first bound) and of each refinement block.
HEAD_DIMS = 64
BLOCK_DIMS = 64
#: Refinement blocks after the head (coordinates kept per row: ``HEAD_DIMS + TAIL_BLOCKS * BLOCK_DIMS``).
TAIL_BLOCKS = 2
#: Rows of the sample the principal axes are fitted on.
BASIS_SAMPLE = 20000
#: Lloyd iterations of the index's own quantiser (on all the rows; see docs/decisions.md, 'Index build').
QUANTIZER_ITER = 20
#: The quantiser's greedy k-means++ seeding runs on a sample of about this many rows per list
#: (:class:`qkm.KMeans`' ``init_sample``; see docs/decisions.md, 'Index build').
QUANTIZER_SEED_ROWS = 8

def fit_basis(X, n_coords, rng):
    """Mean (D,) float64 and orthonormal principal axes (D, m) float32 of a row sample of ``X``.

    Dense rows: :class:`sklearn.decomposition.PCA`, ``m = min(n_coords, D)``
    (fewer if the sample is smaller). CSR rows: the head only
    (``m = min(HEAD_DIMS, D - 1)``), from
    :class:`~sklearn.decomposition.TruncatedSVD` (no centring, mean 0): on
    sparse text-like data the deeper axes bound little and a dense basis of
    ``D x m`` would cost more than the rows.
    """
    n, D = X.shape
    sample = X[np.sort(rng.choice(n, size=min(n, BASIS_SAMPLE), replace=False))]
    seed = int(rng.randint(np.iinfo(np.int32).max))
    if sp.issparse(X):
        m = min(n_coords, HEAD_DIMS, D - 1, sample.shape[0] - 1)
        if m < 1:  # too small to fit axes: the first coordinate axes (orthonormal all the same)
            return np.zeros(D), np.ascontiguousarray(np.eye(D, min(D, HEAD_DIMS), dtype=np.float32))
        svd = TruncatedSVD(n_components=m, algorithm="randomized", n_iter=3, random_state=seed).fit(sample)
        components, mean = svd.components_, np.zeros(D)
    else:
        m = min(n_coords, D, sample.shape[0])
        pca = PCA(n_components=m, random_state=seed).fit(np.asarray(sample, dtype=np.float64))
        components, mean = pca.components_, np.asarray(pca.mean_, dtype=np.float64)
    return mean, np.ascontiguousarray(np.asarray(components, dtype=np.float64).T, dtype=np.float32)


def coordinates(X, mean, basis, start=0, stop=None):
    """``(X - mean) @ basis[:, start:stop]`` in float64 (BLAS; the rows' coordinates and a batch's deeper ones)."""
    B = np.asarray(basis[:, start:stop], dtype=np.float64)
    if sp.issparse(X):
        return np.asarray(X @ B, dtype=np.float64)
    out = np.empty((X.shape[0], B.shape[1]))
    step = _config.DENSE_BLOCK_ROWS
    for s in range(0, X.shape[0], step):
        out[s:s + step] = (np.asarray(X[s:s + step], dtype=np.float64) - mean) @ B
    return out


def centred_sq_norms(X, mean):
    """``||x - mean||^2`` of every row, float64."""
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()
    out = np.empty(X.shape[0])
    step = _config.DENSE_BLOCK_ROWS
    for s in range(0, X.shape[0], step):
        A = np.asarray(X[s:s + step], dtype=np.float64) - mean
        out[s:s + step] = np.einsum("ij,ij->i", A, A)
    return out


def fit_quantizer(head, n_lists, random_state, n_jobs):
    """The index's own lists: :class:`qkm.KMeans` of the rows' head coordinates; its centroids (L, h) float32.

    Seeded by greedy k-means++ on a sample of about ``QUANTIZER_SEED_ROWS``
    rows per list, then ``QUANTIZER_ITER`` Lloyd iterations on all the rows.
    """
    from ..clustering._kmeans import KMeans

    with warnings.catch_warnings():  # fewer distinct heads than lists: fewer lists
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        km = KMeans(n_clusters=n_lists, init="k-means++", init_sample=QUANTIZER_SEED_ROWS, n_init=1,
                    max_iter=QUANTIZER_ITER, random_state=random_state, n_jobs=n_jobs).fit(np.ascontiguousarray(head, dtype=np.float32))
    return np.ascontiguousarray(km.operator_.to_dense(), dtype=np.float32)


def coordinate_codec(Z, store):
    """How the rows' coordinates are stored: ``(codec, encode)``.

    ``codec`` (m, 4) float32 holds per coordinate ``lo``, ``1 / step``,
    ``step^2`` and the slack: a stored value ``c`` says the coordinate ``z``
    satisfies ``|(z - lo) / step - c| <= slack``. ``"float32"``: the
    coordinates themselves (lo 0, step 1, slack 0); ``"int8"``: 255 steps over
    each coordinate's range on the indexed rows (slack 1/2 plus rounding).
    """
    m = Z.shape[1]
    codec = np.zeros((m, 4), dtype=np.float32)
    if store == "float32":
        codec[:, 1:3] = 1.0
        return codec, lambda A: np.asarray(A, dtype=np.float32)
    low, high = (Z.min(axis=0), Z.max(axis=0)) if Z.shape[0] else (np.zeros(m), np.zeros(m))
    lo = ((low + high) / 2).astype(np.float32)
    span = (high - low) / 254.0
    inv = np.where(span > 0, 1.0 / np.where(span > 0, span, 1.0), 1.0).astype(np.float32)
    codec[:, 0], codec[:, 1] = lo, inv
    codec[:, 2] = 1.0 / (inv.astype(np.float64) ** 2)
    codec[:, 3] = 0.5 + 2.0 ** -10

    def encode(A):
        w = A.shape[1]  # the centroids have the head coordinates only
        units = (np.asarray(A, dtype=np.float64) - lo[:w]) * inv[:w].astype(np.float64)
        return np.clip(np.rint(units), -127, 127).astype(np.int8)

    return codec, encode
