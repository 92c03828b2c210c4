"""The driver side of a fit over shards: O(K x D) work per iteration (private).

It runs the single-machine loops of :mod:`qkm.clustering._lloyd` and :mod:`qkm.clustering._elkan`
with the data-sized work sent to the shards: means from the combined sums,
empty-cluster repair from the farthest-point candidates the shards return,
the stopping rules, Elkan's centre-centre bounds. An iteration whose tasks
fail because a worker was lost is run again (the shards are reloaded from
disk by the scheduler, their state rebuilt from the previous centres), so the
numbers do not depend on the failure.
"""

import time

import numpy as np
import scipy.sparse as sp

from .. import _config
from ..clustering._elkan import _half_center_distances
from .._empty import apply_relocations, apply_relocations_csr, plan_relocations
from .._data import csr_means
from .._kernels import centroid_sq_norms
from .._reduce import means_from_csr_sums, means_from_sums
from ..clustering._stopping import IterationLog, StoppingRule
from . import _packs as PK
from . import _shard_tasks as T

__all__ = ["run_lloyd", "run_elkan", "update_means", "update_means_csr"]


class _Update:
    def __init__(self, C, shift_sq, c_sq, relocated, counts):
        self.C, self.shift_sq, self.c_sq, self.relocated, self.counts = C, shift_sq, c_sq, relocated, counts


def update_means(sd, part, C, key, it, elkan, C_new, repair=True):
    """Means from the combined sums into ``C_new``; empty clusters repaired from the shards' farthest points.

    ``C_new`` may be ``C`` itself (the means written in place: one ``K x D``
    array on the driver instead of two); the repair's candidates are fetched
    first, so a lost worker leaves ``C`` intact for the iteration's rerun.
    Rows of empty clusters keep ``C`` when not repaired (``repair=False``, or
    no candidate); ``counts`` of the result are the sizes after the repair
    (moved points counted in their new cluster).
    """
    k = C.shape[0]
    counts = part.counts.copy()
    moves, rows = [], None
    if (counts == 0).any() and repair:
        moves, rows = _relocations(sd, counts, key, it, elkan)
    # the rows the repair measures its moves from, before the means overwrite them (in place)
    C_old = {c: C[c].copy() for move in moves for c in (move[0], move[2])} if C_new is C else C
    shift_sq = np.empty(k, dtype=np.float64)
    sums = part.sums
    if sp.issparse(sums):
        sums = sp.csr_matrix(sums)
        means_from_csr_sums(sums.indptr, sums.indices, sums.data, part.counts, C, C_new, shift_sq)
    else:
        np.copyto(C_new, C)
        means_from_sums(sums, part.counts, C_new, shift_sq)
    c_sq = centroid_sq_norms(C_new)
    if moves:
        apply_relocations(moves, rows, C_new, shift_sq, c_sq, C_old)
    return _Update(C_new, shift_sq, c_sq, len(moves), counts)


def update_means_csr(sd, part, C, key, it, repair=True):
    """:func:`update_means` with CSR means (QK-means on wide sparse shards): no dense ``K x D`` on the driver.

    The shards' CSR sums, combined in the fixed order, become the means as
    :meth:`qkm._data.KMeansData.update_csr` makes them in memory (the same
    bits); ``C`` (CSR, the previous means) gives the rows of clusters left
    empty and is not modified. The squared moves and norms are not kept.
    """
    counts = part.counts.copy()
    C_new = csr_means(part.sums, counts, C, sd.dtype)
    relocated = 0
    if (counts == 0).any() and repair:
        moves, rows = _relocations(sd, counts, key, it, False)
        if moves:
            C_new = apply_relocations_csr(moves, rows, C_new, sd.dtype)
        relocated = len(moves)
    return _Update(C_new, None, None, relocated, counts)


def _relocations(sd, counts, key, it, elkan):
    """Moves of the empty-cluster repair (``counts`` updated) and the chosen rows (dense float64), from the
    shards' farthest points."""
    m = int((counts == 0).sum()) + counts.shape[0]  # enough: each cluster makes at most one candidate be skipped
    found = sd.gather_each(T.candidates, key, it, m, elkan)
    sq = np.concatenate([f[0] for f in found])
    rows = np.concatenate([f[1] for f in found])
    labels = np.concatenate([f[2] for f in found])
    order = np.lexsort((rows, -sq))[:m]
    moves = plan_relocations(counts, labels[order], sq[order])
    if not moves:
        return moves, None
    return moves, sd.fetch_rows(rows[order[[pos for _, pos, _, _ in moves]]])


def _final(sd, C, c_sq, key, it, strict, elkan, C_last, rebuild):
    """Inertia of the final labels (a last E-step unless the labels had stopped changing).

    Also makes sure every shard holds the final labels (rebuilt from ``C_last``, the centres of the last
    assignment, after a lost worker).
    """
    return sd.map_reduce(T.final_step, (C, c_sq), key, it, strict, elkan, rebuild=C_last if rebuild else None).wcss


def _first_centers(sd, centers_init, own):
    """The run's centre array: ``centers_init`` itself when the run owns it (seeds made by the driver), else a copy."""
    if own:
        return np.ascontiguousarray(centers_init, dtype=sd.dtype)
    return np.array(centers_init, dtype=sd.dtype, order="C", copy=True)


def _next_buffer(sent, C, ring):
    """Where this iteration's means go: ``C`` itself when the workers got the centres as CSR (a copy, which is
    also the next iteration's rebuild pack: the dense ``C`` is the driver's alone), else a buffer of ``ring``
    (``C`` and the previous ``C`` stay intact: the dense pack was scattered as is and rebuilds a lost shard's
    state)."""
    return C if sp.issparse(sent[0]) else ring.get(C.shape, C.dtype)


def run_lloyd(sd, centers_init, *, max_iter, tol, tol_wcss=0.0, verbose=0, log=None, key=None, own=False):
    """Lloyd over shards; the contract of :func:`qkm.clustering._lloyd.kmeans_single_lloyd` (labels stay on the shards).

    ``own``: ``centers_init`` belongs to the run (it may become the returned centres). On CSR shards whose centres
    travel as CSR the driver holds one dense ``K x D`` array (the means are written in place) plus the CSR packs;
    otherwise up to three, reused in turn.
    """
    C = _first_centers(sd, centers_init, own)
    del centers_init
    c_sq = centroid_sq_norms(C)
    rule = StoppingRule(tol, tol_wcss)
    log = log if log is not None else IterationLog(verbose)
    ring = PK.BufferRing()  # this run's dense K x D buffers (dense packs only), freed with it
    strict, n_iter, wcss = False, 0, None
    prev = None  # the previous iteration's pack (as sent): it rebuilds the state of a shard that was lost
    for it in range(max_iter):
        n_iter = it + 1
        t0 = time.perf_counter()
        sent = sd.compact((C, c_sq))
        out = _next_buffer(sent, C, ring)

        def attempt(rebuild, it=it, C=C, sent=sent, prev=prev, out=out):
            part = sd.map_reduce(T.lloyd_step, sent, key, it, rebuild=prev if rebuild else None)
            with sd.timeline.phase("means"):
                return part, update_means(sd, part, C, key, it, False, out)

        part, up = sd.retrying(attempt)
        wcss = part.wcss
        shift_total = float(up.shift_sq.sum())
        log.record(it, wcss=wcss, shift=shift_total, storage="shards", relocated=up.relocated,
                   seconds=time.perf_counter() - t0, shard_seconds=part.seconds, **sd.traffic_since_last())
        sd.end_round()
        strict, stop = rule.check_changed(part.n_changed, shift_total, wcss)
        prev, C, c_sq = sent, up.C, up.c_sq
        del sent, part, up
        if stop:
            break
    inertia = sd.retrying(lambda rebuild: _final(sd, C, c_sq, key, n_iter - 1, strict, False, prev, rebuild))
    return inertia, C, n_iter


def run_elkan(sd, centers_init, *, max_iter, tol, tol_wcss=0.0, verbose=0, log=None, key=None, own=False):
    """Elkan over shards: the bounds stay on the workers; the driver keeps the K x K centre bounds (``K x D``
    arrays as :func:`run_lloyd`)."""
    n, k = sd.n_rows, centers_init.shape[0]
    C = _first_centers(sd, centers_init, own)
    del centers_init
    c_sq = centroid_sq_norms(C)
    err = sd.err_rel
    rule = StoppingRule(tol, tol_wcss)
    log = log if log is not None else IterationLog(verbose)
    ring = PK.BufferRing()
    cc_exact_every_iter = k * sd.n_features <= 0.25 * sd.nnz
    half_cc, shift = None, np.zeros(k)
    want_wcss = rule.tol_wcss > 0 or bool(verbose)
    strict, n_iter = False, 0
    prev = None
    for it in range(max_iter):
        n_iter = it + 1
        t0 = time.perf_counter()
        if it > 0 and (half_cc is None or cc_exact_every_iter):
            half_cc = _half_center_distances(C, c_sq, err)
        s = half_cc.min(axis=1) if half_cc is not None else None
        sent = sd.compact((C, c_sq, half_cc, s, shift))
        out = _next_buffer(sent, C, ring)

        def attempt(rebuild, it=it, sent=sent, C=C, prev=prev, out=out):
            counted = sd.map_reduce(T.elkan_count, sent, key, it, rebuild=prev if rebuild else None)
            if it == 0:
                mode, n_pairs = "full", n * k
            else:
                n_pairs = counted.n_pairs
                mode = "full" if n_pairs > _config.ELKAN_FULL_PASS_FRACTION * n * k else "pairs"
            part = sd.map_reduce(T.elkan_step, sent, key, it, mode, want_wcss, same_pack=True)
            if mode == "pairs":
                n_pairs = part.n_pairs
            return part, mode, n_pairs, update_means(sd, part, C, key, it, True, out)

        part, mode, n_pairs, up = sd.retrying(attempt)
        wcss = part.wcss if want_wcss else None
        log.record(it, wcss=wcss, shift=float(up.shift_sq.sum()), mode=mode, pairs=n_pairs, storage="shards",
                   relocated=up.relocated, seconds=time.perf_counter() - t0, **sd.traffic_since_last())
        shift = np.sqrt(up.shift_sq)
        if half_cc is not None and not cc_exact_every_iter:
            half_cc = np.maximum(half_cc - 0.5 * (shift[:, None] + shift[None, :]), 0.0)
            np.fill_diagonal(half_cc, np.inf)
        strict, stop = rule.check_changed(part.n_changed, float(up.shift_sq.sum()), wcss)
        prev, C, c_sq = sent[:2], up.C, up.c_sq
        del sent, part, up
        if stop:
            break
    inertia = sd.retrying(lambda rebuild: _final(sd, C, c_sq, key, n_iter - 1, strict, True, prev, rebuild))
    return inertia, C, n_iter
