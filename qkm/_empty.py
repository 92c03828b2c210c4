"""Empty-cluster repair (Algorithm E.1 of the SparseKmeans supplement).

Each empty cluster takes the point farthest from its own centre, skipping any
point that is the last member of its cluster, so a repair never empties
another cluster. The donor cluster's mean is updated to exclude the point.
"""

import numpy as np
import scipy.sparse as sp

from ._kernels import centroid_sq_norms

__all__ = ["relocate_empty_clusters", "relocate_empty_clusters_csr", "plan_relocations", "apply_relocations",
           "apply_relocations_csr", "replace_rows"]


def relocate_empty_clusters(data, labels, sq_dist, counts, C_new, shift_sq, c_sq, C_old):
    """Repair every empty cluster in place.

    Parameters
    ----------
    data : KMeansData
        IN  the training data.
    labels : ndarray of shape (n_samples,)
        IN  current assignment (left unchanged, as in scikit-learn).
    sq_dist : ndarray of shape (n_samples,)
        IN  squared distance of each point to its assigned centre.
    counts : ndarray of shape (n_clusters,)
        IN/OUT cluster sizes; moved points are counted in their new cluster.
    C_new : ndarray of shape (n_clusters, n_features)
        IN/OUT new centres (means).
    shift_sq, c_sq : ndarray of shape (n_clusters,)
        IN/OUT squared moves against ``C_old`` and squared norms, kept in step.
    C_old : ndarray of shape (n_clusters, n_features)
        IN  the centres before this update.

    Returns
    -------
    n_relocated : int
        Clusters repaired. Fewer than the empty count only when every
        remaining point is alone in its cluster or sits on its centre.
    """
    if not (counts == 0).any():
        return 0
    far_first = np.argsort(-sq_dist, kind="stable")
    moves = plan_relocations(counts, labels[far_first], sq_dist[far_first])
    rows = [data.row(far_first[pos]) for _, pos, _, _ in moves]
    apply_relocations(moves, rows, C_new, shift_sq, c_sq, C_old)
    return len(moves)


def relocate_empty_clusters_csr(data, labels, sq_dist, counts, C_new):
    """:func:`relocate_empty_clusters` with the means kept as CSR (wide sparse data: no ``K x D`` buffer).

    ``C_new`` (CSR, float64 values of the data's precision) is not modified;
    returns ``(C_repaired, n_relocated)``. The moves and the values are those
    of the dense repair (the same float64 operations on the nonzeros, rounded
    to the data's precision); the squared moves and norms are not kept.
    """
    if not (counts == 0).any():
        return C_new, 0
    far_first = np.argsort(-sq_dist, kind="stable")
    moves = plan_relocations(counts, labels[far_first], sq_dist[far_first])
    return apply_relocations_csr(moves, [data.X[far_first[pos]] for _, pos, _, _ in moves], C_new, data.dtype), \
        len(moves)


def apply_relocations_csr(moves, rows, C_new, dtype):
    """:func:`apply_relocations` on CSR means: returns the repaired CSR (``C_new`` is not modified).

    ``rows``: the chosen points, each a CSR row or a dense float64 row (a
    distributed fit fetches them from the shards); the values are the same
    either way (zeros dropped), rounded to ``dtype`` as the dense repair stores them.
    """
    out = {}
    for (j, _, l, n_l), row in zip(moves, rows):
        x = sp.csr_matrix(row, dtype=np.float64)
        donor = out[l] if l in out else C_new[l]
        rest = sp.csr_matrix(donor * n_l - x)
        rest.data /= n_l - 1                    # a true division, as the dense repair (scipy's "/" multiplies)
        out[l] = _rounded(rest, dtype)
        out[j] = _rounded(x, dtype)
    return replace_rows(C_new, out)


def _rounded(row, dtype):
    """A CSR row with its values rounded to ``dtype`` (kept float64), zeros dropped, indices sorted."""
    row = sp.csr_matrix(row, dtype=np.float64)
    row.data = row.data.astype(dtype).astype(np.float64)
    row.eliminate_zeros()
    row.sort_indices()
    return row


def replace_rows(M, rows):
    """CSR ``M`` with row ``i`` replaced by ``rows[i]`` (a 1 x D CSR) for every key of ``rows``."""
    if not rows:
        return M
    pieces = [rows[i] if i in rows else M[i] for i in range(M.shape[0])]
    return sp.csr_matrix(sp.vstack(pieces, format="csr", dtype=np.float64))


def plan_relocations(counts, cand_labels, cand_sq):
    """Which candidate fills which empty cluster (bookkeeping only; no data needed).

    Parameters
    ----------
    counts : ndarray of shape (n_clusters,)
        IN/OUT cluster sizes; moved points are counted in their new cluster.
    cand_labels, cand_sq : ndarray
        IN  label and squared distance of the candidate points, farthest
        first (ties by row). A merged top list of ``n_empty + n_clusters``
        candidates per shard decides exactly as the full list would: each
        cluster makes at most one candidate be skipped.

    Returns
    -------
    moves : list of (empty cluster, candidate position, donor cluster, donor size before)
    """
    moves = []
    cursor = 0
    for j in np.flatnonzero(counts == 0):
        donor = -1
        while cursor < cand_labels.shape[0]:
            pos = cursor
            cursor += 1
            if counts[cand_labels[pos]] > 1 and cand_sq[pos] > 0.0:
                donor = pos
                break
        if donor < 0:
            break
        l = int(cand_labels[donor])
        moves.append((int(j), donor, l, int(counts[l])))
        counts[l] -= 1
        counts[j] += 1
    return moves


def apply_relocations(moves, rows, C_new, shift_sq, c_sq, C_old):
    """Move each chosen point (its row as float64) into its empty cluster; update the donor's mean."""
    for (j, _, l, n_l), x in zip(moves, rows):
        donor_mean = (C_new[l].astype(np.float64) * n_l - x) / (n_l - 1)
        C_new[l] = donor_mean
        C_new[j] = x
        for c in (l, j):
            shift_sq[c] = float(((C_new[c].astype(np.float64) - C_old[c]) ** 2).sum())
        c_sq[[l, j]] = centroid_sq_norms(C_new[[l, j]])
