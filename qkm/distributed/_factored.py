"""QK-means (and low-rank k-means) over shards: the in-memory loop with a data pass on the cluster (private).

:func:`qkm.clustering._factored_lloyd.factored_lloyd` runs unchanged on the
driver; :class:`ShardPass` is its data pass. Each assignment sends the
factors (a :class:`~qkm.distributed._shard_tasks.ChainPack`: the sparse
factors and the mean, never the dense ``V``) to the shards, which assign
their rows with the same chain kernels, keep their labels and return
per-cluster sums, counts, the objective and the changed labels, added in the
fixed tree order. The driver does the O(K x D) work: means from the sums,
empty-cluster repair from the shards' farthest points (as
:func:`qkm.distributed._driver.update_means` for k-means), the factor refit
and its guard (the closed form, from ``sum ||x||^2``, the means and the
counts: no extra pass). On wide CSR shards (``keeps_csr_means``) the seeds
and means stay CSR on the driver (:func:`qkm.distributed._driver.update_means_csr`):
no dense ``K x D`` there. Labels, objective history and factors are those of
``QKMeans.fit`` on the whole data in memory.
"""

import uuid

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state

from ..clustering._base import seeding_of, warn_if_clusters_lost
from ..clustering._factored_lloyd import factored_lloyd, keeps_csr_means
from ..clustering._stopping import IterationLog
from ..operator import DenseOperator
from .._threads import effective_n_threads, numba_threads, single_threaded_blas
from . import _packs as PK
from . import _shard_tasks as T
from ._driver import update_means, update_means_csr
from ._fit import column_mean, resolve_n_clusters
from ._seeding import initial_seeds

__all__ = ["ShardPass", "fit_factored"]


class ShardPass:
    """The data pass of :func:`~qkm.clustering._factored_lloyd.factored_lloyd` over the shards of ``sd``.

    Parameters
    ----------
    sd : ShardedData
    key : hashable
        Names this run's state (labels, partials) on the shards.
    """

    def __init__(self, sd, key):
        self.sd, self.key = sd, key
        self.n_samples, self.n_features, self.dtype = sd.n_rows, sd.n_features, sd.dtype
        self.round = -1             # assignments so far - 1: the shard state's iteration
        self.packs = (None, None)   # (previous, current) ChainPack: the previous one rebuilds a lost state
        self.part = None
        self.sparse_rows = sd.sparse  # wide CSR shards: the means stay CSR on the driver (update_means_csr)

    def x_sq_total(self):
        return self.sd.retrying(lambda rebuild: self.sd.map_reduce(T.row_sq_total, None).wcss)

    def _run(self, rebuild):
        previous, current = self.packs
        return self.sd.map_reduce(T.lloyd_step, current, self.key, self.round,
                                  rebuild=previous if rebuild and previous is not None else None)

    def assign(self, operator):
        self.round += 1
        if isinstance(operator, DenseOperator):     # the seeds' own assignment (dense centres)
            pack = (operator.C, operator.c_sq)
        else:
            pack = PK.ChainPack(operator.factors, operator.mean, self.dtype, getattr(operator, "norms", None))
        self.packs = (self.packs[1], pack)
        self.sd.end_round()  # the previous iteration's refit and means end there
        self.part = part = self.sd.retrying(self._run)
        info = {"path": "+".join(sorted(set(part.paths))), "storage": "shards", "shard_seconds": part.seconds}
        return part.wcss, part.n_changed, {**info, **self.sd.traffic_since_last()}

    def means(self, U, repair, counts):
        def attempt(rebuild):
            if rebuild:  # a worker was lost since the assignment: its shards' labels are rebuilt first
                self.part = self._run(True)
            with self.sd.timeline.phase("means"):
                if sp.issparse(U):
                    return update_means_csr(self.sd, self.part, U, self.key, self.round, repair)
                return update_means(self.sd, self.part, U, self.key, self.round, False, np.empty_like(U), repair)

        up = self.sd.retrying(attempt)
        counts[:] = up.counts
        return up.C, up.relocated

    def refit_done(self, relocated):
        pass  # the means always come from the sums of the last assignment

    def labels(self):
        return self.sd.labels(self.key)


def fit_factored(est, sd, callback=None):
    """Fit ``est`` (a :class:`qkm.QKMeans` or :class:`qkm.LowRankKMeans`, parameters checked) on the shards."""
    sd.load()
    est.n_features_in_ = sd.n_features
    n_clusters = resolve_n_clusters(sd, est.n_clusters, isinstance(est.init, str))
    rng = check_random_state(est.random_state)
    seeding = seeding_of(est)
    n_runs = est.n_init if isinstance(est.init, str) else 1
    token = uuid.uuid4().hex
    best = None
    with numba_threads(effective_n_threads(est.n_jobs)), single_threaded_blas():
        mean = column_mean(sd) if est.center else None
        for run_id in range(n_runs):
            key = (token, run_id)
            fitter = est._make_fitter(n_clusters, sd.n_features)
            # wide CSR shards: seeds and means CSR on the driver, as in memory (no dense K x D there)
            wide = keeps_csr_means(fitter, sd.sparse, mean, n_clusters, sd.n_features)
            seeds = initial_seeds(seeding, sd, n_clusters, rng, key, sparse_centers=wide)
            log = IterationLog(est.verbose, prefix=f"run {run_id + 1}: " if est.verbose else "",
                               callback=callback, first=seeds.record)
            sd.reset_traffic()
            result = factored_lloyd(ShardPass(sd, key), seeds.centers, fitter, max_iter=est.max_iter, tol=est.tol,
                                    rng=rng, polish_iter=est._polish_iter(), log=log, mean=mean)
            if best is None or result["inertia"] < best[0]["inertia"]:
                best = (result, log.records, key)
            sd.client.gather(sd._submit_each(T.keep_only, [best[2]]))
    result, records, key = best
    counts = sd.map_reduce(T.label_counts, None, key, n_clusters).counts
    warn_if_clusters_lost(np.flatnonzero(counts), n_clusters, stacklevel=4)
    est._set_fitted(result, records, n_clusters)
    sd.fit_key = key  # whose labels write_labels() writes
    return est
