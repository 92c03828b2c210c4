"""Seedings over shards: k-means|| where the rows live, the others on the driver from a sample (private).

k-means|| (:func:`qkm.clustering._seeding.kmeans_parallel`) reaches its chunks only
through a ``map_chunks`` function; here each chunk is a shard, its state (the
nearest candidate of each row) kept on the worker holding the shard, and the
driver does the O(candidates) work. Rows are sampled by a draw keyed by
(round, global row id), so the candidates do not depend on the sharding.

k-means++, D^2-seeding and random rows run on the driver as on one machine,
on the whole data when it holds at most ``ShardedData.init_sample_size`` rows
(then the seeds are those of the in-process fit) and on a uniform sample of
that many rows otherwise.
"""

import time

import numpy as np
import scipy.sparse as sp

from .._data import KMeansData
from ..clustering._init import distinct_row_indices
from ..clustering._seeding_kmpar import KMParChunk, chunk_lower, kmeans_parallel
from ..clustering._seeding import Seeds, run_seeding
from ..clustering._seeding_kernels import CenterBlock
from .._validation import check_init_array
from . import _shard_tasks as T

__all__ = ["initial_seeds"]


class _ChunkRef:
    """What the k-means|| driver sees of a shard's chunk: its position and row count."""

    class _Rows:
        def __init__(self, n):
            self.n_samples = int(n)

    def __init__(self, position, n_rows):
        self.position = int(position)
        self.data = self._Rows(n_rows)


def kmpar_call(shard, key, fn, *args):
    """``fn(chunk, *args)`` on the shard's k-means|| chunk (made on first use, kept under ``key``)."""
    from ..clustering._seeding_kmpar import KMParChunk

    chunk = shard.state.get(key)
    if chunk is None:
        chunk = shard.state[key] = KMParChunk(shard.data, shard.row0)
    with shard.threads():
        return fn(chunk, *args)


def drop_state(shard, key):
    shard.state.pop(key, None)


def potential_task(shard, pack):
    """The shard's part of :func:`potential` for the centres ``pack = (C, c_sq)``.

    CSR centres of CSR shards go through :func:`qkm.clustering._seeding.chunk_lower`
    (as the in-memory :func:`qkm.clustering._seeding.potential`), never densified.
    """
    shard.check()
    d = shard.data
    if sp.issparse(pack[0]) and d.sparse:
        with shard.threads():
            return T.Partial(wcss=chunk_lower(KMParChunk(d), CenterBlock(pack[0], 0)))
    labels = np.empty(shard.n_rows, dtype=np.int32)
    partial = np.empty(shard.n_rows, dtype=np.float64)
    with shard.threads():
        d.assign(T._operator(pack), labels, partial)
        return T.Partial(wcss=d.total(d.sq_distances(partial)))


def _map_chunks(sd, key):
    """A ``map_chunks`` for :func:`kmeans_parallel` whose chunks are the shards of ``sd``."""

    def map_chunks(fn, refs, *args):
        futures = sd.load()
        shipped = []
        sent = 0
        for a in args:  # arrays and centre blocks sent once, not once per shard
            if isinstance(a, (int, float, np.integer, np.floating)):
                shipped.append(a)
            else:
                sent += sum(T._nbytes(v) for v in getattr(a, "__dict__", {"a": a}).values())
                shipped.append(sd.client.scatter(a, hash=False, direct=sd.direct))
        sd._sent += sent
        tasks = [sd.client.submit(kmpar_call, futures[r.position], key, fn, *shipped,
                                  workers=[sd.owners[r.position]], allow_other_workers=False, pure=False)
                 for r in refs]
        sd._wait(tasks)
        out = sd.gather(tasks)
        received = sum(T._nbytes(o) for o in out)
        sd._received += received
        sd.seeding_steps.append({"step": getattr(fn, "__name__", str(fn)), "sent_bytes": sent,
                                 "received_bytes": received})
        return out

    return map_chunks


def _kmeans_parallel(seeding, sd, n_clusters, rng, key, sparse_centers=False):
    refs = [_ChunkRef(p, n) for p, n in enumerate(sd.sizes)]
    state = rng.get_state()

    def attempt(rebuild):
        sd.seeding_steps = []  # bytes of each step of the seeding (diagnostics)
        if rebuild:  # a worker was lost mid-seeding: start the seeding again with the same draws
            rng.set_state(state)
        tag = (key, "kmpar", time.perf_counter_ns())
        try:
            return kmeans_parallel(refs, n_clusters, rng, seeding.oversampling_factor, seeding.init_rounds,
                                   n_local_trials=seeding.n_local_trials, map_chunks=_map_chunks(sd, tag),
                                   sparse_centers=sparse_centers)
        finally:
            sd.client.gather(sd._submit_each(drop_state, tag))

    return sd.retrying(attempt)


def _stack(parts):
    return sp.vstack(parts, format="csr") if sp.issparse(parts[0]) else np.concatenate(parts)


def _sample(sd, rng):
    """The rows the driver-side seedings run on: all of them, or a uniform sample of ``sd.init_sample_size``."""
    if sd.n_rows <= sd.init_sample_size:
        return _stack(sd.gather_each(T.all_rows))
    seed = int(rng.randint(np.iinfo(np.int32).max))
    counts = np.random.default_rng([seed, 0]).multivariate_hypergeometric(sd.sizes, sd.init_sample_size)
    futures = sd.load()
    parts = [sd.client.submit(T.sample_rows, f, int(c), [seed, 1, int(i)], workers=[w],
                              allow_other_workers=False, pure=False)
             for f, c, i, w in zip(futures, counts, sd.shards, sd.owners) if c > 0]
    sd._wait(parts)
    return _stack(sd.gather(parts))


def _random_rows(sd, n_clusters, rng, sparse=False):
    """:func:`qkm.clustering._init.random_rows` over shards (the same draws; CSR rows with ``sparse``)."""
    idx = rng.choice(sd.n_rows, size=n_clusters, replace=False)
    rows = sd.fetch_rows(idx, sparse)
    if len(distinct_row_indices(rows if sp.issparse(rows) else rows + 0.0)) < n_clusters:  # rare: equal rows
        digests = [d for part in sd.gather_each(T.row_digests) for d in part]
        first = {}
        for i, d in enumerate(digests):
            first.setdefault(d, i)
        pool = np.sort(np.fromiter(first.values(), dtype=np.int64))
        rows = sd.fetch_rows(pool[rng.choice(pool.shape[0], size=n_clusters, replace=False)], sparse)
    return _as_centers(rows, sd.dtype)


def _as_centers(C, dtype):
    """Centres in the data's dtype: C-contiguous, or CSR when they are CSR."""
    return sp.csr_matrix(C, dtype=dtype) if sp.issparse(C) else np.ascontiguousarray(C, dtype=dtype)


def potential(sd, centers):
    """Sum over the shards' rows of the squared distance to the nearest centre (fixed summation order)."""
    from .._kernels import centroid_sq_norms

    C = _as_centers(centers, sd.dtype)
    if sp.issparse(C):  # sent as CSR (as compact_pack sends sparse centres), dense only on the workers
        c_sq = np.asarray(C.multiply(C).sum(axis=1), dtype=np.float64).ravel()
    else:
        c_sq = centroid_sq_norms(C)
    # a worker lost meanwhile: the same sum again on the shards' new owners
    return float(sd.retrying(lambda rebuild: sd.map_reduce(potential_task, (C, c_sq)).wcss))


def initial_seeds(seeding, sd, n_clusters, rng, key, sparse_centers=False):
    """:func:`qkm.clustering._base.initial_centers` over shards: :class:`qkm.clustering._seeding.Seeds` of one run.

    ``seeding`` is a :class:`qkm.clustering._seeding.Seeding`; ``key`` names the run
    (the k-means|| chunk states on the workers are kept under it, then dropped).
    ``sparse_centers`` (CSR shards): the centres as CSR, never a dense ``K x D``
    array on the driver (as :func:`qkm.clustering._seeding.run_seeding`).
    """
    sparse_centers = sparse_centers and sd.sparse
    if not isinstance(seeding.init, str):
        centers = check_init_array(seeding.init, n_clusters, sd.n_features, sd.dtype, sparse=sparse_centers)
        return Seeds(centers, potential(sd, centers), 0.0, "array", sd.n_rows)
    if seeding.init_sample is not None and seeding.init != "random":
        raise ValueError("init_sample is not supported on shards: the seeding runs on the whole data up to "
                         "ShardedData(init_sample_size=...) rows, on a uniform sample of that size past it.")
    t0 = time.perf_counter()
    if seeding.init == "k-means||":  # retried inside, round by round state on the workers
        centers, rows = _kmeans_parallel(seeding, sd, n_clusters, rng, key, sparse_centers), sd.n_rows
    else:
        state = rng.get_state()

        def attempt(rebuild):
            if rebuild:  # a worker was lost while rows were fetched: the same draws again
                rng.set_state(state)
            if seeding.init == "random":
                return _random_rows(sd, n_clusters, rng, sparse_centers), sd.n_rows
            # k-means++ or D^2-seeding on the driver, on the whole data or a sample of it
            data = KMeansData(_sample(sd, rng))
            return run_seeding(seeding, data, n_clusters, rng, sparse_centers).centers, data.n_samples

        centers, rows = sd.retrying(attempt)
    seconds = time.perf_counter() - t0
    centers = _as_centers(centers, sd.dtype)
    return Seeds(centers, potential(sd, centers), seconds, seeding.init, rows)
