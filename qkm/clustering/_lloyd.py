"""One Lloyd run: assign with the fused kernels, update means, repeat.

Mirrors scikit-learn's ``_kmeans_single_lloyd``: same loop, same stopping
rules, a final E-step when the run stopped on the centre shift.
"""

import time

import numpy as np

from ..operator._base import DenseOperator
from ._stopping import IterationLog, StoppingRule


def loop_state(data, centers_init, tol, tol_wcss, verbose, log):
    """What every exact Lloyd-type loop starts from: a private copy of the centres as a
    :class:`DenseOperator`, label buffers (current and previous), the per-row partial distances,
    the stopping rule and the iteration log."""
    n = data.n_samples
    layouts = DenseOperator(np.array(centers_init, dtype=data.dtype, order="C", copy=True))
    labels = np.zeros(n, dtype=np.int32)
    labels_old = np.full(n, -1, dtype=np.int32)
    partial = np.empty(n, dtype=np.float64)
    return (layouts, labels, labels_old, partial, StoppingRule(tol, tol_wcss),
            log if log is not None else IterationLog(verbose))


def kmeans_single_lloyd(data, centers_init, *, max_iter, tol, tol_wcss=0.0, verbose=0, log=None):
    """Run Lloyd's algorithm from ``centers_init``.

    Parameters
    ----------
    data : KMeansData
        IN  validated data.
    centers_init : ndarray of shape (n_clusters, n_features)
        IN  initial centres (copied).
    max_iter : int
    tol : float
        Absolute tolerance on the total squared centre shift (already scaled).
    tol_wcss : float, default=0.0
        Relative WCSS decrease below which the run stops (SystemML); 0 disables.
    verbose : int, default=0
    log : IterationLog, default=None
        Receives one record per iteration.

    Returns
    -------
    labels : ndarray of shape (n_samples,), int32
    inertia : float
    centers : ndarray of shape (n_clusters, n_features)
    n_iter : int
    """
    layouts, labels, labels_old, partial, rule, log = loop_state(data, centers_init, tol, tol_wcss, verbose, log)
    strict = False
    n_iter = 0
    means_of = None  # labels whose exact means C holds (None: C is not such a mean)
    for it in range(max_iter):
        n_iter = it + 1
        t0 = time.perf_counter()
        data.assign(layouts, labels, partial)
        sq_dist = data.sq_distances(partial)
        wcss = data.total(sq_dist)
        storage = layouts.storage
        C, shift_sq, c_sq, relocated = data.update(labels, layouts.C, lambda: sq_dist, means_of)
        layouts = DenseOperator(C, c_sq)
        shift_total = float(shift_sq.sum())
        log.record(it, wcss=wcss, shift=shift_total, storage=storage, relocated=relocated,
                   seconds=time.perf_counter() - t0)
        strict, stop = rule.check(labels, labels_old, shift_total, wcss)
        if stop:
            break
        labels_old[:] = labels
        means_of = None if relocated else labels_old
    if not strict:
        data.assign(layouts, labels, partial)
    inertia = data.total(data.sq_distances(partial))
    return labels, inertia, layouts.C, n_iter
