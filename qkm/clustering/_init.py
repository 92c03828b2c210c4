"""Centroid initialisation: greedy k-means++ (sparse-aware) and random rows.

Greedy k-means++ (Arthur & Vassilvitskii 2007, the variant scikit-learn and
SparseKmeans use) draws ``2 + floor(log2 K)`` candidates per step with
probability proportional to D^2 and keeps the one that lowers the potential
most. Candidate distances come from one product per step: BLAS for dense
data; for CSR data a numba kernel over the CSC copy of X, whose cost is the
sum of the document frequencies of the candidates' terms.
"""

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from .._config import _JIT


@njit(parallel=True, **_JIT)
def _candidate_dots_csc(
    csc_data, csc_indices, csc_indptr,  # IN  X in CSC
    cand_data, cand_indices, cand_indptr,  # IN  candidate rows, CSR
    out,                                # OUT (L, n) x_c . x_i
):
    L = cand_indptr.shape[0] - 1
    for c in prange(L):
        row = out[c]
        row[:] = 0.0
        for q in range(cand_indptr[c], cand_indptr[c + 1]):
            k = cand_indices[q]
            v = np.float64(cand_data[q])
            for p in range(csc_indptr[k], csc_indptr[k + 1]):
                row[csc_indices[p]] += v * csc_data[p]


def n_local_trials_for(n_clusters):
    """Candidates per greedy step: ``2 + floor(log2 K)``."""
    return 2 + int(np.log2(n_clusters))


def greedy_kmeanspp(data, n_clusters, random_state, n_local_trials=None, sample_weight=None,
                    return_potential=False, rows_only=False, dots=None):
    """Greedy k-means++ seeding.

    Parameters
    ----------
    data : KMeansData
        IN  validated data with squared row norms.
    n_clusters : int
    random_state : numpy.random.RandomState
    n_local_trials : int, default=None
        ``None`` gives ``2 + floor(log2 n_clusters)``; 1 is plain k-means++.
    sample_weight : ndarray of shape (n_samples,), default=None
        Row weights (k-means|| candidates): rows are drawn with probability
        proportional to ``weight * D^2`` (the first one to ``weight``) and the
        potential is weighted. ``None`` (all ones) draws exactly as before.
    return_potential : bool, default=False
        Also return the potential (weighted sum of squared distances to the
        nearest chosen row) of the result.
    rows_only : bool, default=False
        Return only ``(indices, potential)``, without building the centres.
    dots : callable, default=None
        ``dots(rows)`` gives the ``(len(rows), n_samples)`` float64 dot
        products of the rows ``rows`` with every row (e.g. rows of a
        precomputed Gram matrix, :func:`qkm.clustering._seeding_kmpar.recluster`);
        ``None`` computes them per step (BLAS, or the CSC copy of CSR data).

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features)
    indices : ndarray of shape (n_clusters,)
        Row of X chosen for each centre.
    potential : float
        Only with ``return_potential``.
    """
    X = data.X
    n = data.n_samples
    L = n_local_trials_for(n_clusters) if n_local_trials is None else int(n_local_trials)
    x_sq = data.x_sq
    csc = X.tocsc() if data.sparse and dots is None else None
    if csc is not None:
        csc.sort_indices()

    def sq_dist_to(rows):
        if dots is not None:
            g = dots(rows)
        elif csc is not None:
            cand = X[rows]
            g = np.empty((len(rows), n), dtype=np.float64)
            _candidate_dots_csc(csc.data, csc.indices, csc.indptr, cand.data, cand.indices, cand.indptr, g)
        else:
            g = np.asarray(X[rows] @ X.T, dtype=np.float64)
        d = x_sq[rows][:, None] + x_sq[None, :] - 2.0 * g
        np.maximum(d, 0.0, out=d)
        d[np.arange(len(rows)), rows] = 0.0
        return d

    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    indices = np.empty(n_clusters, dtype=np.int64)
    # drawn like scikit-learn (uniform weights passed as p), so equal seeds give equal seeds
    indices[0] = random_state.choice(n, p=np.full(n, 1.0 / n) if w is None else w / w.sum())
    closest = sq_dist_to(np.array([indices[0]]))[0]
    potential = closest.sum() if w is None else closest @ w
    for c in range(1, n_clusters):
        cum = np.cumsum(closest if w is None else closest * w)
        rand_vals = random_state.uniform(size=L) * (potential if w is None else cum[-1])
        cand = np.searchsorted(cum, rand_vals)
        np.clip(cand, None, n - 1, out=cand)
        d = sq_dist_to(cand)
        np.minimum(closest, d, out=d)
        pots = d.sum(axis=1) if w is None else d @ w
        best = int(np.argmin(pots))
        potential = pots[best]
        closest = d[best]
        indices[c] = cand[best]
    if rows_only:
        return indices, float(potential)
    if return_potential:
        return _rows(X, indices), indices, float(potential)
    return _rows(X, indices), indices


def random_rows(data, n_clusters, random_state, sparse=False):
    """``n_clusters`` rows with distinct values, drawn uniformly without replacement (CSR rows of CSR data
    with ``sparse``)."""
    indices = random_state.choice(data.n_samples, size=n_clusters, replace=False)
    if len(distinct_row_indices(data.X[indices])) < n_clusters:
        pool = distinct_row_indices(data.X)
        indices = pool[random_state.choice(pool.shape[0], size=n_clusters, replace=False)]
    return _rows(data.X, indices, sparse), indices


def _rows(X, indices, sparse=False):
    """Rows ``indices`` of ``X`` in its dtype: dense, or CSR when ``X`` is CSR and ``sparse``."""
    rows = X[indices]
    if sp.issparse(rows):
        if sparse:
            return sp.csr_matrix(rows, dtype=X.dtype)
        rows = rows.toarray()
    return np.ascontiguousarray(rows, dtype=X.dtype)


def distinct_row_indices(X, stop_at=None):
    """Index of the first occurrence of each distinct row of ``X`` (dense or CSR).

    Exact comparison of values (``-0.0 == 0.0``; explicit sparse zeros
    ignored). Stops once ``stop_at`` distinct rows were found, so the usual
    question "are there at least K distinct rows?" reads about K rows.
    """
    seen = set()
    first = []
    if sp.issparse(X):
        Xc = X.copy()
        Xc.eliminate_zeros()
        Xc.sort_indices()
        data = Xc.data + 0.0  # -0.0 -> 0.0
        keys = (
            (Xc.indices[Xc.indptr[i]:Xc.indptr[i + 1]].tobytes(), data[Xc.indptr[i]:Xc.indptr[i + 1]].tobytes())
            for i in range(Xc.shape[0])
        )
    else:
        keys = ((X[i] + 0.0).tobytes() for i in range(X.shape[0]))
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            first.append(i)
            if stop_at is not None and len(first) >= stop_at:
                break
    return np.asarray(first, dtype=np.int64)
