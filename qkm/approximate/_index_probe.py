"""Which lists of :class:`qkm.ClusterIndex` a query probes, for diagnostics and the calibration of ``nprobe="auto"``.

Split from :mod:`qkm.approximate._index` (which re-exports these names); the
search kernels' own choice is in :mod:`qkm.approximate._search_probe`.
"""

import math

import numpy as np

from .. import _config
from . import _search_probe as SP

__all__ = ["nearest_clusters", "cluster_sq_distances", "probe_lists", "calibrate_nprobe"]

#: One-sided confidence of the recall bound used by ``nprobe="auto"`` (Wilson score, z = 1.2816: 90 %).
CALIBRATION_Z = 1.2816


def nearest_clusters(operator, X):
    """Nearest centroid of every row (lowest index on ties), int64, from ``operator.sq_distances``."""
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int64)
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, n, step):
        labels[start:start + step] = np.argmin(operator.sq_distances(X[start:start + step]), axis=1)
    return labels


def cluster_sq_distances(operator, X):
    """Squared distances of every row of ``X`` to every centroid, (n, K) float64, in row blocks."""
    out = np.empty((X.shape[0], operator.n_clusters), dtype=np.float64)
    step = _config.DENSE_BLOCK_ROWS
    for start in range(0, X.shape[0], step):
        out[start:start + step] = operator.sq_distances(X[start:start + step])
    return out


def probe_lists(sq, sizes, nprobe, k):
    """Lists probed for every query (numpy mirror of the kernels' rule, for diagnostics).

    The ``nprobe`` nearest non-empty lists by ``sq`` (ties: lowest index),
    widened with the next nearest until they hold ``k`` rows; (n, p_max)
    int64, nearest first, padded with -1.
    """
    n, K = sq.shape
    out = []
    for i in range(n):
        order = [c for c in np.lexsort((np.arange(K), sq[i])) if sizes[c] > 0]
        total = np.cumsum(sizes[order])
        p = max(min(nprobe, len(order)), int(np.searchsorted(total, k)) + 1)
        out.append(order[:p])
    p_max = max(len(o) for o in out)
    probe = np.full((n, p_max), -1, dtype=np.int64)
    for i, o in enumerate(out):
        probe[i, :len(o)] = o
    return probe


def calibrate_nprobe(lists, X_held, held_ids, given, target, n_threads):
    """Smallest ``nprobe`` whose recall@1 on held-out indexed rows reaches ``target`` with 90 % confidence.

    The truth for a held-out row is its nearest indexed row other than
    itself (exact: every list searched). Its recall at ``nprobe = p`` is
    whether that row's list is among the row's ``p`` first probed lists.

    Returns
    -------
    nprobe : int
    report : dict
        ``held_out`` rows, ``recall`` measured at the chosen ``nprobe`` and
        its ``recall_lower_bound``.
    """
    n_held = X_held.shape[0]
    L = lists.n_lists
    _, ids = lists.search(X_held, 2, L, given, n_threads)
    nn = np.where(ids[:, 0] == held_ids, ids[:, 1], ids[:, 0])
    list_of = np.empty(lists.row_ids.shape[0], dtype=np.int64)
    list_of[lists.row_ids] = np.repeat(np.arange(L), lists.sizes)
    pd = lists.list_distances(X_held, n_threads) if given is None else given
    ranks = np.empty(n_held, dtype=np.int64)
    SP.list_ranks(np.ascontiguousarray(pd), lists.sizes, list_of[nn], ranks)
    hits = np.cumsum(np.bincount(ranks, minlength=L))  # hits[p - 1]: held-out rows found with nprobe = p
    z2 = CALIBRATION_Z ** 2
    for p in range(1, L + 1):
        rate = hits[p - 1] / n_held
        bound = (rate + z2 / (2 * n_held) - CALIBRATION_Z * math.sqrt(rate * (1 - rate) / n_held
                                                                        + z2 / (4 * n_held ** 2))) / (1 + z2 / n_held)
        if bound >= target or p == int((lists.sizes > 0).sum()):
            break
    return p, {"held_out": int(n_held), "recall": float(rate), "recall_lower_bound": float(bound)}
