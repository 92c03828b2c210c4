"""What runs on the workers: one shard, its per-fit state and the k-means steps on it (private).

Nothing here imports dask: these are plain functions of a :class:`Shard`, run
by tasks. A shard is loaded by the worker from the shard directory (shared
storage) and keeps the per-fit state of its rows (labels, partials, Elkan
bounds). The state is never pickled: a shard moved to, or reloaded on,
another worker starts without it, and the step that finds it missing either
rebuilds it from the previous centres (when the driver sends them) or raises
:class:`StateLost`, upon which the driver repeats the iteration.

How centres reach the workers (packs, one operator per worker) is in :mod:`._packs`.
Every step uses the single-machine kernels through :class:`qkm._data.KMeansData`
built with the shard's global first row, so its sums are nodes of the fixed
summation tree (:mod:`qkm._reduce`).
"""

import contextlib
import hashlib
import time

import numpy as np
import scipy.sparse as sp

from .. import _kernels as K_
from .. import _reduce
from .._data import KMeansData
from ..clustering._elkan import _own_sq_distances, _pairs_pass, _set_upper
from ..clustering._init import distinct_row_indices
from ..io._shards import check_fingerprint, load_shard, shard_fingerprint
from .._threads import numba_threads
from ._timeline import task_timeline
from ._packs import ChainPack, _nbytes, _operator, fresh_operator

__all__ = ["Shard", "StateLost", "Partial", "combine"]

_NO_PHASE = contextlib.nullcontext()


class StateLost(RuntimeError):
    """A shard's per-fit state is gone (worker lost or shard moved); the driver repeats the iteration."""


class WorkerLost(StateLost):
    """A worker holding shards left the cluster during a round."""


class Shard:
    """One shard on a worker.

    Parameters
    ----------
    manifest : dict
        From :func:`qkm.io._shards.read_manifest`.
    index : int
    settings : dict
        ``block_rows``, ``dense_block_rows`` and ``n_threads`` of the driver.
    """

    def __init__(self, manifest, index, settings):
        from .. import _config

        self.manifest, self.index, self.settings = manifest, int(index), dict(settings)
        entry = manifest["shards"][self.index]
        self.row0, self.n_rows = int(entry["row_start"]), int(entry["n_rows"])
        _config.DENSE_BLOCK_ROWS = int(settings["dense_block_rows"])
        X, self.y = load_shard(manifest, self.index, verify=settings.get("verify", True))
        self.fingerprint = shard_fingerprint(manifest, self.index)
        self.data = KMeansData(X, row0=self.row0, block_rows=settings["block_rows"])
        self.state = {}

    def __reduce__(self):  # moved to another worker: reload from disk there, without the state
        return Shard, (self.manifest, self.index, self.settings)

    def check(self):
        check_fingerprint(self.manifest, self.index, self.fingerprint)

    def threads(self):
        return numba_threads(self.settings["n_threads"])


class Partial:
    """Sums of one shard (or of a node of shards): added by :func:`combine` in the fixed tree order."""

    def __init__(self, counts=None, sums=None, wcss=0.0, n_changed=0, n_pairs=0, vector=None, seconds=0.0,
                 paths=(), events=()):
        self.counts, self.sums, self.wcss = counts, sums, float(wcss)
        self.n_changed, self.n_pairs, self.vector = int(n_changed), int(n_pairs), vector
        self.seconds = float(seconds)  # time spent in the shard tasks (diagnostics)
        self.paths = tuple(sorted(set(paths)))  # execution paths of a factor chain's assignment (diagnostics)
        self.events = tuple(events)  # phases of the tasks that made it (diagnostics, :mod:`._timeline`)

    @property
    def nbytes(self):
        return sum(_nbytes(a) for a in (self.counts, self.sums, self.vector))



def _add(a, b):
    if a is None:
        return None
    if sp.issparse(a) != sp.issparse(b):  # mixed: add into a dense copy (the same additions)
        a = a.toarray() if sp.issparse(a) else a
        b = b.toarray() if sp.issparse(b) else b
    return a + b


def combine(a, b):
    """``a + b`` term by term (new arrays: task inputs are never modified)."""
    with task_timeline() as tl, tl.phase("combine"):
        out = Partial(_add(a.counts, b.counts), _add(a.sums, b.sums), a.wcss + b.wcss, a.n_changed + b.n_changed,
                      a.n_pairs + b.n_pairs, _add(a.vector, b.vector), a.seconds + b.seconds, a.paths + b.paths)
    out.events = a.events + b.events + tuple(tl.events)
    return out


# --------------------------------------------------------------------------- #
# Data-set level questions
# --------------------------------------------------------------------------- #
def distinct_digests(shard, stop_at):
    """Digests of the first ``stop_at`` distinct rows of the shard, in row order."""
    X = shard.data.X
    idx = distinct_row_indices(X, stop_at=stop_at)
    return [_row_digest(X, i) for i in idx.tolist()]


def row_digests(shard):
    """Digest of every row (the rare fallback of random init: rows not all distinct)."""
    X = shard.data.X
    return [_row_digest(X, i) for i in range(X.shape[0])]


def _row_digest(X, i):
    if hasattr(X, "indptr"):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        data = np.asarray(X.data[lo:hi]) + 0.0
        keep = data != 0
        key = np.asarray(X.indices[lo:hi])[keep].tobytes() + b"|" + data[keep].tobytes()
    else:
        key = (np.asarray(X[i]) + 0.0).tobytes()
    return hashlib.sha1(key).digest()


def column_node(shard, mean, n_lev):
    """Column sums (``mean`` None) or squared deviations of the shard: a node of the summation tree."""
    shard.check()
    d = shard.data
    with shard.threads():
        if mean is None:
            v = _reduce.column_sums_node(d.X, d.row0, d.block_rows, n_lev)
        else:
            v = _reduce.column_sq_deviations_node(d.X, mean, d.row0, d.block_rows, n_lev)
    return Partial(vector=v)


def row_sq_total(shard, pack):
    """``sum ||x_i||^2`` over the shard's rows: a node of the summation tree (``pack`` unused)."""
    shard.check()
    return Partial(wcss=shard.data.total(shard.data.x_sq))


def rows(shard, local_rows, sparse=False):
    """Dense float64 rows (as ``KMeansData.row`` gives them), or the CSR rows of a CSR shard with ``sparse``."""
    if sparse and shard.data.sparse:
        return shard.data.X[np.asarray(local_rows, dtype=np.int64)]
    return np.stack([shard.data.row(int(i)) for i in local_rows]) if len(local_rows) else None


def sample_rows(shard, count, seed):
    """``count`` rows drawn without replacement, seeded by ``seed`` (driver's seed, round, shard)."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(shard.n_rows, size=int(count), replace=False))
    return shard.data.X[idx]


def all_rows(shard):
    return shard.data.X[np.arange(shard.n_rows)]


# --------------------------------------------------------------------------- #
# Lloyd
# --------------------------------------------------------------------------- #
class _State:
    def __init__(self, n):
        self.it = -1
        self.labels = np.full(n, -1, dtype=np.int32)
        self.partial = np.empty(n, dtype=np.float64)
        self.sq = None
        self.own_sq = None
        self.layouts = None


def _state(shard, key, it, rebuild):
    """The shard's state after iteration ``it - 1``, rebuilt from ``rebuild`` (the pack of ``it - 1``) if lost."""
    st = shard.state.get(key)
    if st is not None and st.it == it - 1:
        return st
    if it > 0 and rebuild is None:
        raise StateLost(f"shard {shard.index}: state of iteration {it - 1} not on this worker")
    st = _State(shard.n_rows)
    if it > 0:
        shard.data.assign(fresh_operator(rebuild), st.labels, st.partial)
        st.rebuilt = True
    st.it = it - 1
    shard.state[key] = st
    return st


def _finish_step(shard, st, labels_old, it, wcss, extra=None, tl=None):
    n_changed = int(np.count_nonzero(st.labels != labels_old))
    k = st.layouts.n_clusters
    with tl.phase("sums", shard.index) if tl is not None else _NO_PHASE:
        counts, sums = shard.data.cluster_sums(st.labels, k)
    st.it = it
    return Partial(counts=counts, sums=sums, wcss=wcss, n_changed=n_changed, **(extra or {}))


def lloyd_step(shard, pack, key, it, rebuild=None):
    """Assign with ``pack`` (``(C, c_sq)`` or a :class:`ChainPack`), then the shard's cluster sums, sizes, WCSS and changed labels."""
    t0 = time.perf_counter()
    with task_timeline() as tl:
        with tl.phase("check", shard.index):
            shard.check()
        with shard.threads():
            st = _state(shard, key, it, rebuild)
            labels_old = st.labels.copy()
            with tl.phase("operator", shard.index):
                st.layouts = _operator(pack)
            st.it = -2  # mid-update
            with tl.phase("assign", shard.index):
                shard.data.assign(st.layouts, st.labels, st.partial)
            with tl.phase("sq_distances", shard.index):
                st.sq = shard.data.sq_distances(st.partial)
                wcss = shard.data.total(st.sq)
            st.own_sq = None
            paths = (st.layouts.execution_path(shard.n_rows),) if isinstance(pack, ChainPack) else ()
            part = _finish_step(shard, st, labels_old, it, wcss, {"paths": paths}, tl)
    part.seconds = time.perf_counter() - t0
    part.events = tuple(tl.events)
    return part


def candidates(shard, key, it, m, elkan):
    """The shard's ``m`` farthest points from their centre: (squared distance, global row, label)."""
    st = shard.state.get(key)
    if st is None or st.it != it:
        raise StateLost(f"shard {shard.index}: state of iteration {it} not on this worker")
    with shard.threads():
        sq = _own_sq_distances(shard.data, st.layouts, st.labels) if elkan else st.sq
    order = np.lexsort((np.arange(sq.shape[0]), -sq))[:m]
    return sq[order], order.astype(np.int64) + shard.row0, st.labels[order]


def final_step(shard, pack, key, it, strict, elkan, rebuild=None):
    """Inertia of the final labels against ``pack`` (the final centres); a last E-step unless ``strict``.

    ``it`` is the last iteration; its labels are rebuilt from ``rebuild`` (its centres) if the state is gone.
    """
    shard.check()
    d = shard.data
    with shard.threads():
        st = _state(shard, key, it + 1, rebuild)  # the labels of the last iteration
        layouts = _operator(pack)
        if strict and not elkan:
            pass  # the last assignment's partials are the final ones
        elif not strict:
            d.assign(layouts, st.labels, st.partial)
        elif elkan:
            st.partial[:] = d.pair_partials(layouts, d.all_rows, st.labels.astype(np.int64))
        return Partial(wcss=d.total(d.sq_distances(st.partial)))


def labels_of(shard, key):
    st = shard.state.get(key)
    if st is None:
        raise StateLost(f"shard {shard.index}: labels of this fit are no longer on the cluster (worker lost); "
                        "recompute them with predict")
    return st.labels.copy()


def keep_only(shard, keys):
    """Drop the states of other runs/fits."""
    for k in list(shard.state):
        if k not in keys:
            del shard.state[k]


def predict(shard, pack):
    """Labels of the shard's rows for the centres ``pack = (C, c_sq)`` (no state)."""
    shard.check()
    labels = np.empty(shard.n_rows, dtype=np.int32)
    partial = np.empty(shard.n_rows, dtype=np.float64)
    with shard.threads():
        shard.data.assign(_operator(pack), labels, partial)
    return labels


def write_labels(shard, labels, name):
    """Write ``labels`` next to the shard's files as ``<shard>.<name>.npy`` (atomically); returns the path."""
    import os

    from ..io import save_labels

    entry = shard.manifest["shards"][shard.index]
    path = os.path.join(shard.manifest["directory"], f"{entry['name']}.{name}.npy")
    save_labels(path, labels)
    return path


# --------------------------------------------------------------------------- #
# Elkan: bounds stay on the worker holding the shard
# --------------------------------------------------------------------------- #
def elkan_count(shard, pack, key, it, rebuild=None):
    """Move the bounds by the last shifts, then count the candidate pairs (the driver picks the mode)."""
    shard.check()
    C, c_sq, half_cc, s, shift = pack
    with shard.threads():
        st = _state(shard, key, it, rebuild)
        n, k = shard.n_rows, C.shape[0]
        if getattr(st, "lb", None) is None:
            st.upper = np.empty(n, dtype=np.float64)
            st.lb = np.zeros((n, k), dtype=np.float64)
            st.counts_i = np.empty(n, dtype=np.int64)
            st.bounds_at = None if (it == 0 or getattr(st, "rebuilt", False)) else -1
        if it == 0 or st.bounds_at is None:
            return Partial(n_pairs=0)
        if st.bounds_at == it - 1:
            K_.elkan_shift_bounds(st.labels, shift, st.upper, st.lb)
            K_.elkan_count_candidates(st.labels, st.upper, st.lb, half_cc, s, st.counts_i)
            st.bounds_at = it
        return Partial(n_pairs=int(st.counts_i.sum()))


def elkan_step(shard, pack, key, it, mode, want_wcss):
    """One Elkan assignment (``mode`` chosen by the driver from the global pair count), then the sums."""
    shard.check()
    _, c_sq, half_cc, s, _ = pack
    st = shard.state.get(key)
    if st is None or st.it != it - 1 or getattr(st, "lb", None) is None:
        raise StateLost(f"shard {shard.index}: Elkan state of iteration {it - 1} not on this worker")
    d = shard.data
    err = d.err_rel
    with shard.threads():
        labels_old = st.labels.copy()
        layouts = st.layouts = _operator(pack)
        n_pairs = 0
        st.it = -2
        if it == 0 or st.bounds_at is None:  # first pass, or bounds lost with a worker: one exact full pass
            d.assign(layouts, st.labels, st.partial, lb=st.lb)
            _set_upper(d, st.partial, c_sq, st.labels, err, st.upper, None)
        else:
            active = np.flatnonzero(st.counts_i).astype(np.int64)
            if mode == "full":
                d.assign(layouts, st.labels, st.partial, rows=active, lb=st.lb)
                _set_upper(d, st.partial, c_sq, st.labels, err, st.upper, active)
            else:
                n_pairs = _pairs_pass(d, layouts, st.labels, st.partial, st.upper, st.lb, st.counts_i, active,
                                      half_cc, s)
        st.bounds_at = it
        wcss = d.total(_own_sq_distances(d, layouts, st.labels)) if want_wcss else 0.0
        return _finish_step(shard, st, labels_old, it, wcss, {"n_pairs": n_pairs})


def label_counts(shard, pack, key, n_clusters):
    """Cluster sizes of the fitted labels (``pack`` unused)."""
    return Partial(counts=np.bincount(labels_of(shard, key), minlength=n_clusters).astype(np.int64))
