"""``KMeans.fit`` on :class:`~qkm.distributed.ShardedData`: the estimator's steps, over shards (private)."""

import uuid
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from .._base import warn_if_clusters_lost
from .._data import KMeansData
from .._init import distinct_row_indices, kmeans_plusplus
from .._reduce import n_levels
from .._stopping import IterationLog
from .._validation import check_init_array, check_n_clusters
from .. import _config
from . import _shard_tasks as T
from ._driver import run_elkan, run_lloyd

__all__ = ["fit_kmeans"]

_RUNS = {"lloyd": run_lloyd, "elkan": run_elkan}


def resolve_n_clusters(sd, n_clusters, seeded_from_data):
    """:func:`qkm._base.resolve_n_clusters` over shards: distinct rows counted in row order, up to K."""
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


def scaled_tolerance(sd, tol):
    """``tol`` times the mean feature variance, summed as :func:`qkm._reduce.column_variances` does."""
    if tol == 0:
        return 0.0
    n_lev = n_levels(sd.n_rows, _config.REDUCE_BLOCK_ROWS)
    mean = sd.map_reduce(T.column_node, None, n_lev).vector / sd.n_rows
    variances = sd.map_reduce(T.column_node, mean, n_lev).vector / sd.n_rows
    return float(np.mean(variances) * tol)


def _stack(parts):
    return sp.vstack(parts, format="csr") if sp.issparse(parts[0]) else np.concatenate(parts)


def initial_centers(init, sd, n_clusters, rng):
    """:func:`qkm._base.initial_centers` over shards (k-means++ on a sample of ``sd.init_sample_size`` rows)."""
    if not isinstance(init, str):
        return check_init_array(init, n_clusters, sd.n_features, sd.dtype)
    if init == "random":
        idx = rng.choice(sd.n_rows, size=n_clusters, replace=False)
        rows = sd.fetch_rows(idx)
        if len(distinct_row_indices(rows + 0.0)) < n_clusters:  # rare: some drawn rows are equal
            digests = [d for part in sd.gather_each(T.row_digests) for d in part]
            first = {}
            for i, d in enumerate(digests):
                first.setdefault(d, i)
            pool = np.sort(np.fromiter(first.values(), dtype=np.int64))
            rows = sd.fetch_rows(pool[rng.choice(pool.shape[0], size=n_clusters, replace=False)])
        return np.ascontiguousarray(rows, dtype=sd.dtype)
    if sd.n_rows <= sd.init_sample_size:  # the whole data: exactly the single-machine seeding
        sample = _stack(sd.gather_each(T.all_rows))
    else:
        seed = int(rng.randint(np.iinfo(np.int32).max))
        counts = np.random.default_rng([seed, 0]).multivariate_hypergeometric(sd.sizes, sd.init_sample_size)
        futures = sd.load()
        parts = [sd.client.submit(T.sample_rows, f, int(c), [seed, 1, int(i)], workers=[w],
                                  allow_other_workers=False, pure=False)
                 for f, c, i, w in zip(futures, counts, sd.shards, sd.owners) if c > 0]
        sd._wait(parts)
        sample = _stack(sd.client.gather(parts))
    return kmeans_plusplus(KMeansData(sample), n_clusters, rng)[0]


def fit_kmeans(est, sd, callback=None):
    """Fit ``est`` (a :class:`qkm.KMeans`, parameters checked) on the shards of ``sd``."""
    sd.load()
    est.n_features_in_ = sd.n_features
    n_clusters = resolve_n_clusters(sd, est.n_clusters, isinstance(est.init, str))
    rng = check_random_state(est.random_state)
    tol = scaled_tolerance(sd, est.tol)
    run = _RUNS[est.algorithm]
    token = uuid.uuid4().hex
    best = None
    for run_id in range(est._n_runs()):
        centers0 = initial_centers(est.init, sd, n_clusters, rng)
        sd.reset_traffic()
        log = IterationLog(est.verbose, prefix=f"run {run_id + 1}: " if est.verbose else "", callback=callback)
        key = (token, run_id)
        inertia, centers, n_iter = run(sd, centers0, max_iter=est.max_iter, tol=tol, tol_wcss=est.tol_wcss,
                                       verbose=est.verbose, log=log, key=key)
        if best is None or inertia < best[1]:
            best = (key, inertia, centers, n_iter, log.records)
        sd.client.gather(sd._submit_each(T.keep_only, [best[0]]))
    key, inertia, centers, n_iter, records = best
    counts = sd.map_reduce(T.label_counts, None, key, n_clusters).counts
    warn_if_clusters_lost(np.flatnonzero(counts), n_clusters, stacklevel=4)
    est._set_fitted(sd.labels(key), inertia, centers, n_iter, n_clusters, records)
    sd.fit_key = key  # whose labels write_labels() writes
    return est
