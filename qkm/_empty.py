"""Empty-cluster repair (Algorithm E.1 of the SparseKmeans supplement).

Each empty cluster takes the point farthest from its own centre, skipping any
point that is the last member of its cluster, so a repair never empties
another cluster. The donor cluster's mean is updated to exclude the point.
"""

import numpy as np

from ._kernels import centroid_sq_norms

__all__ = ["relocate_empty_clusters"]


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
    empty = np.flatnonzero(counts == 0)
    if empty.size == 0:
        return 0
    far_first = np.argsort(-sq_dist, kind="stable")
    cursor = 0
    moved = 0
    for j in empty:
        donor_point = -1
        while cursor < far_first.shape[0]:
            i = far_first[cursor]
            cursor += 1
            if counts[labels[i]] > 1 and sq_dist[i] > 0.0:
                donor_point = i
                break
        if donor_point < 0:
            break
        i = donor_point
        l = labels[i]
        x = data.row(i)
        n_l = counts[l]
        donor_mean = (C_new[l].astype(np.float64) * n_l - x) / (n_l - 1)
        C_new[l] = donor_mean
        C_new[j] = x
        counts[l] -= 1
        counts[j] += 1
        for c in (l, j):
            shift_sq[c] = float(((C_new[c].astype(np.float64) - C_old[c]) ** 2).sum())
        c_sq[[l, j]] = centroid_sq_norms(C_new[[l, j]])
        moved += 1
    return moved
