"""``KMeans.fit`` on :class:`~qkm.distributed.ShardedData`: the estimator's steps, over shards (private)."""

import uuid
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from ..clustering._base import run_random_states, seeding_of, warn_if_clusters_lost
from .._reduce import n_levels
from ..clustering._stopping import IterationLog
from .._validation import check_n_clusters
from .. import _config
from . import _shard_tasks as T
from ._driver import run_elkan, run_lloyd
from ._seeding import initial_seeds

__all__ = ["fit_kmeans", "column_mean", "resolve_n_clusters"]

_RUNS = {"lloyd": run_lloyd, "elkan": run_elkan}


def resolve_n_clusters(sd, n_clusters, seeded_from_data):
    """:func:`qkm.clustering._base.resolve_n_clusters` over shards: distinct rows counted in row order, up to K."""
    n_clusters = check_n_clusters(n_clusters)
    if n_clusters > sd.n_rows:
        raise ValueError(f"n_samples={sd.n_rows} should be >= n_clusters={n_clusters}.")
    if not seeded_from_data:
        return n_clusters
    seen = set()
    for digests in sd.gather_each(T.distinct_digests, n_clusters):
        seen.update(digests[:n_clusters - len(seen)] if len(seen) < n_clusters else [])
        if len(seen) >= n_clusters:
            break
    if len(seen) < n_clusters:
        warnings.warn(f"The data hold {len(seen)} distinct point(s), fewer than n_clusters={n_clusters}; "
                      f"using n_clusters_={len(seen)}.", ConvergenceWarning, stacklevel=4)
        return len(seen)
    return n_clusters


def column_mean(sd):
    """The mean row in float64, as :meth:`qkm._data.KMeansData.column_mean` sums it."""
    n_lev = n_levels(sd.n_rows, _config.REDUCE_BLOCK_ROWS)
    return sd.map_reduce(T.column_node, None, n_lev).vector / max(sd.n_rows, 1)


def scaled_tolerance(sd, tol):
    """``tol`` times the mean feature variance, summed as :func:`qkm._reduce.column_variances` does."""
    if tol == 0:
        return 0.0
    n_lev = n_levels(sd.n_rows, _config.REDUCE_BLOCK_ROWS)
    mean = column_mean(sd)
    variances = sd.map_reduce(T.column_node, mean, n_lev).vector / sd.n_rows
    return float(np.mean(variances) * tol)


def fit_kmeans(est, sd, callback=None):
    """Fit ``est`` (a :class:`qkm.KMeans`, parameters checked) on the shards of ``sd``."""
    sd.load()
    est.n_features_in_ = sd.n_features
    n_clusters = resolve_n_clusters(sd, est.n_clusters, isinstance(est.init, str))
    rng = check_random_state(est.random_state)
    tol = scaled_tolerance(sd, est.tol)
    run = _RUNS[est.algorithm]
    seeding = seeding_of(est)
    n_runs = est._n_runs()
    rngs = run_random_states(rng, n_runs)  # as KMeans.fit in memory
    token = uuid.uuid4().hex
    best = None
    for run_id in range(n_runs):
        key = (token, run_id)
        seeds = initial_seeds(seeding, sd, n_clusters, rngs[run_id], key)
        sd.reset_traffic()
        log = IterationLog(est.verbose, prefix=f"run {run_id + 1}: " if est.verbose else "", callback=callback,
                           first=seeds.record)
        # seeds made here belong to the run (their array becomes its centres); a user's init array is copied
        inertia, centers, n_iter = run(sd, seeds.centers, max_iter=est.max_iter, tol=tol, tol_wcss=est.tol_wcss,
                                       verbose=est.verbose, log=log, key=key, own=isinstance(seeding.init, str))
        if best is None or inertia < best[1]:
            best = (key, inertia, centers, n_iter, log.records)
        sd.client.gather(sd._submit_each(T.keep_only, [best[0]]))
    key, inertia, centers, n_iter, records = best
    counts = sd.map_reduce(T.label_counts, None, key, n_clusters).counts
    warn_if_clusters_lost(np.flatnonzero(counts), n_clusters, stacklevel=4)
    est._set_fitted(sd.labels(key), inertia, centers, n_iter, n_clusters, records)
    sd.fit_key = key  # whose labels write_labels() writes
    return est
