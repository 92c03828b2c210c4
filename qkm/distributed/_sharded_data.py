"""`ShardedData`: data cut into shards on a shared directory, read by the workers of a Dask cluster.

An estimator's ``fit`` sees it through ``_qkm_fit`` and runs the same steps as
in memory, each pass a task per shard (see :mod:`qkm.distributed`).
"""

import collections
import itertools
import time
import uuid

import numpy as np
import scipy.sparse as sp

from .. import _config
from ..io._shards import check_layout, read_manifest
from . import _packs as PK
from . import _shard_tasks as T
from ._cluster import SchedulerUnreachable
from ._fit import fit_kmeans
from ._timeline import Timeline

__all__ = ["ShardedData", "StateLost"]

StateLost = T.StateLost


def _retryable():
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return (T.StateLost, FutureCancelledError, KilledWorker, CommClosedError)


def _balanced_slots(work, n_workers):
    """Worker slot of each shard: contiguous runs of shards, each worker's share of ``work`` as even as whole
    shards allow (a shard goes to the slot its middle falls in).

    Examples
    --------
    >>> _balanced_slots([4, 1, 1, 1, 1], 2).tolist()   # by work, not by shard count
    [0, 1, 1, 1, 1]
    """
    work = np.asarray(work, dtype=np.float64)
    total = float(work.sum())
    if total <= 0:
        work, total = np.ones_like(work), float(len(work))
    middle = np.cumsum(work) - work / 2.0
    return np.minimum((middle / total * n_workers).astype(np.int64), n_workers - 1)


class ShardedData:
    """A shard directory (``qkm shard``) seen through a Dask client; pass it to ``KMeans.fit``.

    Parameters
    ----------
    path : str or os.PathLike
        Shard directory or its ``manifest.json``, at the same path on every worker.
    client : distributed.Client, default=None
        ``None``: the current default client (``distributed.get_client()``).
    verify : bool, default=True
        Check every shard's sha256 when a worker loads it.
    init_sample_size : int, default=100_000
        k-means++ runs on a uniform sample of this many rows (all rows when
        the data hold fewer, which gives the single-machine seeds exactly).
    threads_per_task : int, default=1
        numba threads of each shard task.
    max_retries : int, default=3
        Times an iteration is run again after a worker was lost.
    direct_to_workers : bool, default=None
        Send the centres to, and fetch the combined sums from, the workers
        directly instead of through the scheduler (one hop less each way,
        as Dask's ``Client(direct_to_workers=True)``). ``None``: the client's
        ``direct_to_workers`` if set, else True. Set False when the workers
        are not reachable from this process.

    Attributes
    ----------
    manifest : dict
    shape : tuple of int
    rounds : collections.deque
        Per iteration of the last fit (the last ``ROUNDS_KEPT``): ``(start, end, events)``, each event
        ``(process id, shard or -1, phase, start, end)`` in wall-clock seconds, from the driver and the shard
        tasks (diagnostics; ``benchmarks/distributed_phases.py`` tabulates them).
    """

    ROUNDS_KEPT = 50

    def __init__(self, path, client=None, *, verify=True, init_sample_size=100_000, threads_per_task=1,
                 max_retries=3, direct_to_workers=None):
        if client is None:
            from distributed import get_client

            client = get_client()
        self.manifest = m = read_manifest(path)
        self.client = client
        self.verify = bool(verify)
        self.init_sample_size = int(init_sample_size)
        self.threads_per_task = int(threads_per_task)
        self.max_retries = int(max_retries)
        if direct_to_workers is None:
            direct_to_workers = getattr(client, "direct_to_workers", None)
        self.direct = True if direct_to_workers is None else bool(direct_to_workers)
        sizes = [int(e["n_rows"]) for e in m["shards"]]
        check_layout(sizes, _config.REDUCE_BLOCK_ROWS)
        self.n_rows, self.n_features, self.nnz = int(m["n_rows"]), int(m["n_features"]), int(m["nnz"])
        self.shape = (self.n_rows, self.n_features)
        self.dtype = np.dtype(m["dtype"])
        self.sparse = m["layout"] == "csr"
        self.err_rel = 1e-12 if (self.sparse or self.dtype == np.float64) else 64 * float(np.finfo(np.float32).eps)
        self.shards = [i for i, s in enumerate(sizes) if s > 0]  # empty shards take no part
        self.starts = np.array([int(m["shards"][i]["row_start"]) for i in self.shards], dtype=np.int64)
        self.sizes = np.array([sizes[i] for i in self.shards], dtype=np.int64)
        self._futures = None
        self._pack = None
        self._sent = self._received = 0
        self.fit_key = None
        self.n_retries = 0
        self.poll_seconds = 1.0
        self.timeline = Timeline()  # phases of the driver and of the shard tasks (diagnostics)
        self.rounds = collections.deque(maxlen=self.ROUNDS_KEPT)  # phases of the last fit's iterations
        self.seeding_steps = []  # bytes sent and received by each step of the last k-means|| seeding

    # ------------------------------------------------------------------ #
    # the protocol KMeans.fit looks for
    def _qkm_fit(self, estimator, callback=None):
        if hasattr(estimator, "_make_fitter"):  # QKMeans, LowRankKMeans
            from ._factored import fit_factored

            return fit_factored(estimator, self, callback)
        return fit_kmeans(estimator, self, callback)

    def __repr__(self):
        return (f"ShardedData({self.manifest['directory']!r}, {len(self.manifest['shards'])} shards, "
                f"shape={self.shape}, {self.manifest['layout']})")

    # ------------------------------------------------------------------ #
    # shards on the workers
    def settings(self):
        return {"block_rows": _config.REDUCE_BLOCK_ROWS, "dense_block_rows": _config.DENSE_BLOCK_ROWS,
                "n_threads": self.threads_per_task, "verify": self.verify}

    def work(self):
        """Work of each nonempty shard in an iteration: stored entries plus rows (CSR), rows (dense)."""
        if not self.sparse:
            return self.sizes.astype(np.float64)
        nnz = [int(self.manifest["shards"][i].get("nnz", 0)) for i in self.shards]
        return np.asarray(nnz, dtype=np.float64) + self.sizes

    def _owners(self):
        """Contiguous ranges of shards per worker, balanced on :meth:`work` (neighbours in the sum tree stay
        together); the same for the same workers and manifest."""
        workers = sorted(self.client.scheduler_info()["workers"])
        if not workers:
            raise SchedulerUnreachable("the Dask cluster has no workers.")
        return [workers[s] for s in _balanced_slots(self.work(), len(workers))]

    def load(self):
        """Submit the shard-loading tasks once (workers read their shards themselves; never scattered)."""
        if self._futures is None:
            self.owners = self._owners()
            settings = self.settings()
            token = uuid.uuid4().hex[:8]
            self._futures = [
                self.client.submit(T.Shard, self.manifest, i, settings, key=f"qkm-shard-{token}-{i}",
                                   workers=[w], allow_other_workers=True)
                for i, w in zip(self.shards, self.owners)]
            from distributed import wait

            wait(self._futures)
            for f in self._futures:
                if f.status == "error":
                    f.result()  # raises the worker's error (e.g. ShardError)
        return self._futures

    def close(self):
        """Release the shards on the workers."""
        self._futures = self._pack = None

    # ------------------------------------------------------------------ #
    # one round: the same function on every shard, results added in the fixed tree order
    def compact(self, pack):
        """A centre pack ``(C, c_sq, ...)`` as the workers get it: on CSR shards, ``C`` as CSR when that is at most
        half its dense size (:func:`~qkm.distributed._packs.compact_pack`); the result is sent as is."""
        if self.sparse:
            with self.timeline.phase("compact"):
                pack = PK.compact_pack(pack)
        return PK.Compacted(pack)

    def _scatter(self, obj):
        if isinstance(obj, PK.Compacted):
            obj = tuple(obj)
        elif isinstance(obj, tuple) and self.sparse:
            with self.timeline.phase("compact"):
                obj = PK.compact_pack(obj)
        self._sent += sum(PK._nbytes(a) for a in (obj if isinstance(obj, tuple) else (obj,)))
        with self.timeline.phase("scatter"):
            return self.client.scatter([obj], hash=False, direct=self.direct)[0]

    def gather(self, futures):
        """``client.gather`` straight from the workers unless ``direct_to_workers=False``."""
        return self.client.gather(futures, direct=self.direct)

    def _submit_each(self, fn, *args, **kwargs):
        """``fn(shard, ...)`` on every shard, pinned to the worker holding it and its state (no work stealing:
        a shard moved to another worker arrives without its state)."""
        futures = self.load()
        return [self.client.submit(fn, f, *args, **kwargs, workers=[w], allow_other_workers=False, pure=False)
                for f, w in zip(futures, self.owners)]

    def _wait(self, futures):
        """Wait for ``futures``; raise :class:`WorkerLost` (the iteration is repeated) if a shard's worker left."""
        from distributed import wait

        while True:
            try:
                wait(futures, timeout=self.poll_seconds)
                return
            except TimeoutError:
                pass
            alive = set(self.client.scheduler_info()["workers"])
            gone = sorted(set(self.owners) - alive)
            if gone:
                self.client.cancel(futures)
                raise T.WorkerLost(f"worker(s) {', '.join(gone)} left the cluster")

    def map_reduce(self, fn, pack, *args, rebuild=None, same_pack=False):
        """``fn(shard, pack, *args)`` on every shard, combined along :func:`qkm._reduce.merge_plan`."""
        from .._reduce import merge_plan

        if not same_pack or self._pack is None:
            self._pack = self._scatter(pack)
        kwargs = {} if rebuild is None else {"rebuild": self._scatter(rebuild)}
        tl = self.timeline
        with tl.phase("submit"):
            values = self._submit_each(fn, self._pack, *args, **kwargs)
            for a, b in merge_plan((self.starts // _config.REDUCE_BLOCK_ROWS).tolist()):
                values[a] = self.client.submit(T.combine, values[a], values[b], pure=False)
        with tl.phase("wait"):
            self._wait([values[0]])
        with tl.phase("result"):
            out = self.gather(values[0])
        tl.add(out.events)
        self._received += out.nbytes
        return out

    def gather_each(self, fn, *args):
        futures = self._submit_each(fn, *args)
        self._wait(futures)
        out = self.gather(futures)
        self._received += sum(PK._nbytes(a) for r in out for a in (r if isinstance(r, tuple) else (r,)))
        return out

    def fetch_rows(self, global_rows, sparse=False):
        """Dense float64 rows by global index, in the given order (CSR rows of the data's dtype with ``sparse``
        on CSR shards)."""
        global_rows = np.asarray(global_rows, dtype=np.int64)
        where = np.searchsorted(self.starts, global_rows, side="right") - 1
        futures = self.load()
        sparse = sparse and self.sparse
        out = None if sparse else np.empty((len(global_rows), self.n_features))
        picks, parts = [], []
        for s in np.unique(where):
            pick = np.flatnonzero(where == s)
            local = global_rows[pick] - self.starts[s]
            fut = self.client.submit(T.rows, futures[s], local, sparse, workers=[self.owners[s]],
                                     allow_other_workers=False, pure=False)
            self._wait([fut])
            if sparse:
                picks.append(pick)
                parts.append(self.gather(fut))
            else:
                out[pick] = self.gather(fut)
        if sparse:  # the shards' rows back in the given order
            position = np.empty(len(global_rows), dtype=np.int64)
            position[np.concatenate(picks)] = np.arange(len(global_rows))
            out = sp.csr_matrix(sp.vstack(parts, format="csr")[position])
        self._received += PK._nbytes(out)
        return out

    def retrying(self, attempt):
        """Run ``attempt(rebuild)``; after a lost worker, run it again with ``rebuild=True``."""
        errors = _retryable()
        for n in itertools.count():
            try:
                return attempt(n > 0)
            except errors:
                if n >= self.max_retries:
                    raise
                self.n_retries += 1
                self._pack = None
                self._refresh_owners()

    def _refresh_owners(self):
        """After a loss: each shard goes to a live worker holding it, else to the live worker with least work."""
        alive = sorted(self.client.scheduler_info()["workers"])
        if not alive:
            raise SchedulerUnreachable("the Dask cluster has no workers left.")
        who = self.client.who_has(self._futures)
        load = {w: 0.0 for w in alive}
        work = self.work()
        for i, f in enumerate(self._futures):
            holders = [w for w in sorted(who.get(f.key) or ()) if w in load]
            if self.owners[i] not in load:
                self.owners[i] = holders[0] if holders else min(load, key=load.get)
            load[self.owners[i]] += float(work[i])

    def reset_traffic(self):
        self._sent = self._received = 0
        self.timeline.take()
        self.rounds.clear()
        self._round_start = time.time()

    def end_round(self):
        """Keep the phases recorded since the last call as one iteration's: ``(start, end, events)`` (the last
        :attr:`ROUNDS_KEPT` iterations only: their events grow with the number of shards)."""
        now = time.time()
        self.rounds.append((getattr(self, "_round_start", now), now, self.timeline.take()))
        self._round_start = now

    def traffic_since_last(self):
        out = {"sent_bytes": self._sent, "received_bytes": self._received}
        self._sent = self._received = 0
        return out

    # ------------------------------------------------------------------ #
    # labels
    def labels(self, key):
        """The fitted labels as a dask array (one chunk per shard; empty shards give empty chunks)."""
        import dask.array as da

        futures = iter(self._submit_each(T.labels_of, key))
        chunks = []
        for e in self.manifest["shards"]:
            n = int(e["n_rows"])
            chunks.append(da.from_delayed(next(futures), (n,), dtype=np.int32) if n else
                          da.zeros((0,), dtype=np.int32))
        return da.concatenate(chunks)

    def predict(self, centers, name=None):
        """Labels of every row for ``centers``; written next to each shard as ``<shard>.<name>.npy`` if ``name``.

        Returns
        -------
        labels : dask.array.Array, or the list of written paths when ``name`` is given
        """
        import dask.array as da

        from .._kernels import centroid_sq_norms

        C = np.ascontiguousarray(centers, dtype=self.dtype)
        if C.ndim != 2 or C.shape[1] != self.n_features:
            raise ValueError(f"centers have shape {C.shape}; the shards have {self.n_features} features.")
        pack = self._scatter((C, centroid_sq_norms(C)))
        labels = self._submit_each(T.predict, pack)
        if name is not None:
            futures = self.load()
            writes = [self.client.submit(T.write_labels, f, lab, name, workers=[w], allow_other_workers=False,
                                         pure=False) for f, lab, w in zip(futures, labels, self.owners)]
            return self.client.gather(writes)
        it = iter(labels)
        return da.concatenate([da.from_delayed(next(it), (int(e["n_rows"]),), dtype=np.int32)
                               if int(e["n_rows"]) else da.zeros((0,), dtype=np.int32)
                               for e in self.manifest["shards"]])

    def write_labels(self, name="labels", key=None):
        """Write the labels of the last fit next to each shard as ``<shard>.<name>.npy``; returns the paths."""
        key = self.fit_key if key is None else key
        futures = self.load()
        labels = self._submit_each(T.labels_of, key)
        writes = [self.client.submit(T.write_labels, f, lab, name, workers=[w], allow_other_workers=False,
                                     pure=False) for f, lab, w in zip(futures, labels, self.owners)]
        return self.client.gather(writes)
