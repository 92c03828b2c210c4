"""Fit k-means past one machine on a Dask cluster, with the single-machine result.

The one place in qkm that imports dask (``pip install qkm[distributed]``).
Cut the data into shards once (``qkm shard DATA -o DIR``), then::

    from distributed import Client
    import qkm
    from qkm.distributed import ShardedData

    client = Client("tcp://scheduler:8786")
    km = qkm.KMeans(n_clusters=100, random_state=0).fit(ShardedData("DIR", client))
    km.cluster_centers_, km.inertia_          # as from an in-memory fit
    km.labels_                                # a dask array, one chunk per shard
    qk = qkm.QKMeans(n_clusters=100, random_state=0).fit(ShardedData("DIR", client))
    qk.factors_, qk.objective_history_        # as from an in-memory fit

Workers load their shards from the shared directory by tasks (lost shards are
reloaded by the scheduler) and run the single-machine numba kernels on them;
the driver only does O(K x D) work per iteration (for QK-means: the means,
the factor refit and its guard; the workers get the factors, not ``V``). Sums are added in the fixed
order of :mod:`qkm._reduce` and random draws are seeded by (seed, round,
shard), so labels, centres and inertia are those of ``KMeans.fit`` on the
whole data in memory, for any number of workers.
"""

from ._cluster import SchedulerUnreachable, VersionMismatch, check_versions, connect
from ._sharded_data import ShardedData, StateLost

__all__ = ["ShardedData", "connect", "check_versions", "SchedulerUnreachable", "VersionMismatch", "StateLost"]
