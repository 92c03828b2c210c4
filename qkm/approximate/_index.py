"""Searching the inverted lists of :class:`qkm.ClusterIndex` (building: :mod:`qkm.approximate._index_build`).

:class:`InvertedLists` holds the indexed rows list by list, contiguous, with
their coordinates on the principal axes of the data (``basis``) for the
bounds that prune the scan. The lists are the index's own (a k-means of the
rows' head coordinates, ranked per query by the kernels) or the clusters of
the model (ranked by the model's centroid operator, the QK-means paper's
protocol). :func:`calibrate_nprobe` picks ``nprobe`` for a target recall on
held-out rows.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from .. import _config
from . import _search_batch as SB
from . import _search_prefilter as SF
from . import _search_kernels as SK
from . import _search_probe as SP
from .._threads import numba_threads, one_blas_thread
from .._validation import check_data
from ._index_build import BLOCK_DIMS, HEAD_DIMS, TAIL_BLOCKS, centred_sq_norms, coordinate_codec, coordinates

__all__ = ["BATCH_MIN_QUERIES_PER_LIST", "GROUPED_MIN_K", "InvertedLists"]

#: Batches of at least this many queries get their deeper coordinates from BLAS (and run in threads).
BATCH_MIN_ROWS = 8
#: Queries per work unit of a batch (threads take them in turn; answers do not depend on the split).
BATCH_CHUNK = 64
#: Which path answers a batch (:meth:`InvertedLists.batch_path`). The pre-filtered path
#: (:mod:`qkm.approximate._search_prefilter`) runs for dense rows with float32 coordinates when the batch has at least
#: ``BATCH_MIN_QUERIES_PER_LIST`` queries per list on average (``n_q * nprobe >= 8 * n_lists``); the grouped path
#: (:mod:`qkm.approximate._search_batch`) for int8 coordinates when also ``k >= GROUPED_MIN_K`` and
#: ``nprobe <= GROUPED_MAX_NPROBE``; else the per-query path. The rule depends only on the batch shape
#: (docs/decisions.md, 'Batch search paths').
BATCH_MIN_QUERIES_PER_LIST = 8
GROUPED_MIN_K = 8
GROUPED_MAX_NPROBE = 16

_EMPTY_F64 = np.zeros(0, dtype=np.float64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_ZERO_PTR = np.zeros(2, dtype=np.int64)
_NO_GIVEN = np.zeros((1, 1), dtype=np.float64)
_NO_TAIL = np.zeros((0, 0), dtype=np.float64)


def _run_grouped(scan, finish, grp_ptr, n_q, n_threads):
    """A grouped batch: ``scan(c0, c1)`` over lists cut into ``n_threads`` parts of about equal work, then
    ``finish(i0, i1)`` over chunks of ``BATCH_CHUNK`` queries (threads take them in turn; same answers)."""
    L = grp_ptr.shape[0] - 1
    if n_threads <= 1:
        if scan is not None:
            scan(0, L)
        finish(0, n_q)
        return
    parts = max(1, min(n_threads, L))
    cuts = np.searchsorted(grp_ptr, np.linspace(0, grp_ptr[-1], parts + 1)[1:-1])
    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        if scan is not None:
            list(pool.map(lambda b: scan(*b), zip([0, *cuts], [*cuts, L])))
        list(pool.map(lambda b: finish(*b), [(s, min(s + BATCH_CHUNK, n_q)) for s in range(0, n_q, BATCH_CHUNK)]))


class InvertedLists:
    """The indexed rows list by list, with their coordinates, as the search kernels read them.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n, D)
        Validated rows, in their original order.
    lists : ndarray of shape (n,), int
        List of every row, in ``[0, n_lists)``.
    n_lists : int
    mean, basis : from :func:`fit_basis`
    centers : ndarray of shape (n_lists, h) float32, or None
        The lists' centroids in the head space (the index's own lists), or
        None when the lists are ranked by given distances (the model's clusters).
    store : {"float32", "int8"}
        How the coordinates (and the centroids) are stored: see :func:`coordinate_codec`.
    """

    def __init__(self, X, lists, n_lists, mean, basis, centers=None, store="float32"):
        n, D = X.shape
        m = basis.shape[1]
        h = min(HEAD_DIMS, m)
        self.sparse = sp.issparse(X)
        self.dtype = X.dtype
        self.n_lists = int(n_lists)
        self.head_dims, self.n_coords, self.block = h, m, BLOCK_DIMS
        order = np.argsort(lists, kind="stable").astype(np.int64)
        sizes = np.bincount(lists, minlength=n_lists).astype(np.int64)
        offsets = np.zeros(n_lists + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        rows = X[order]
        if self.sparse:
            rows = sp.csr_matrix(rows)
            rows.sort_indices()
        else:
            rows = np.ascontiguousarray(rows)
        Z = coordinates(rows, mean, basis)
        levels = [h] + [min(h + b * BLOCK_DIMS, m) for b in range(1, TAIL_BLOCKS + 1) if h + (b - 1) * BLOCK_DIMS < m]
        ny = centred_sq_norms(rows, mean)
        cum = np.cumsum(Z * Z, axis=1) if m else np.zeros((n, 1))
        resid = np.sqrt(np.maximum(ny[:, None] - (cum[:, np.array(levels) - 1] if m else 0.0), 0.0))
        codec, encode = coordinate_codec(Z, store)
        S = encode(Z)
        coords_t = np.zeros(n * m + SK.HEAD_PAD, dtype=S.dtype)  # spare entries: the kernels read whole vectors
        for c in range(n_lists):
            lo, hi = offsets[c], offsets[c + 1]
            coords_t[m * lo:m * hi] = S[lo:hi].T.ravel()
        self.rows, self.row_ids, self.sizes, self.offsets = rows, order, sizes, offsets
        self.mean, self.basis, self.store = mean, basis, store
        self.centers = centers
        self.nmax = float(ny.max()) if n else 0.0
        centers_t = np.zeros((h, 0), dtype=S.dtype) if centers is None else np.ascontiguousarray(encode(centers).T)
        tail = np.ascontiguousarray(S[:, h:])
        if self.sparse:
            dense, data, indices, indptr = np.zeros((1, 1), dtype=rows.dtype), rows.data, rows.indices, rows.indptr
        else:
            dense, data, indices, indptr = rows, np.zeros(0, dtype=rows.dtype), _EMPTY_I32, _ZERO_PTR
        shift = np.asarray(basis, dtype=np.float64).T @ mean
        self.ix = (mean, basis, shift, codec, centers_t, sizes, offsets, coords_t, tail, resid.astype(np.float32), dense,
                   data, indices, indptr.astype(np.int64), order)
        self._top_sizes = np.cumsum(np.sort(sizes)[::-1])
        self._caps = {}
        self._largest = int(sizes.max()) if n_lists else 0

    @property
    def own(self):
        return self.centers is not None

    def nbytes(self):
        """Bytes held: ``{"rows": ..., "coordinates": ..., "other": ...}``."""
        rows = self.rows.data.nbytes + self.rows.indices.nbytes + self.rows.indptr.nbytes if self.sparse \
            else self.rows.nbytes
        coords = self.ix[7].nbytes + self.ix[8].nbytes + self.ix[9].nbytes
        other = sum(a.nbytes for a in (self.mean, self.basis, self.ix[3], self.ix[4], self.sizes, self.offsets,
                                       self.row_ids))
        return {"rows": int(rows), "coordinates": int(coords), "other": int(other)}

    def _most_probed(self, nprobe, k):
        """Most lists a query can probe: ``nprobe``, widened until any that many non-empty lists hold ``k`` rows."""
        sizes = np.sort(self.sizes[self.sizes > 0])
        widened = int(np.searchsorted(np.cumsum(sizes), k)) + 1
        return max(1, min(max(int(nprobe), widened), sizes.shape[0]))

    def _capacity(self, nprobe, k):
        """Most rows the probed lists can hold (the kernels' buffer size)."""
        cap = self._caps.get((nprobe, k))
        if cap is None:
            n = self.row_ids.shape[0]
            p = min(nprobe, self.n_lists)
            cap = self._caps[nprobe, k] = int(min(n, max(self._top_sizes[p - 1] if p else 0, k + self._largest)))
        return cap

    def search_row(self, x, k, nprobe):
        """``search`` of one dense C-contiguous float row (1, D) in the index's own lists: the leanest call."""
        out_d, out_i = SK.search_row(x, self.ix, nprobe, self.head_dims, self.block, self.nmax,
                                     self._capacity(nprobe, k), k)
        if out_d[0, 0] != out_d[0, 0]:  # NaN: the row is not finite
            check_data(x)
            raise ValueError("X holds values too large to square in float64.")
        return out_d, out_i

    def _queries(self, X):
        """``(Q, qdata, qind, qptr)`` as the kernels take them (float64: one compiled kernel per rows dtype)."""
        if self.sparse:
            X = sp.csr_matrix(X, dtype=np.float64)
            if not X.has_sorted_indices:
                X = X.sorted_indices()
            return _NO_GIVEN, X.data, X.indices.astype(np.int32), X.indptr.astype(np.int64)
        if sp.issparse(X):
            X = X.toarray()
        return np.ascontiguousarray(X, dtype=np.float64), _EMPTY_F64, _EMPTY_I32, _ZERO_PTR

    def search(self, X, k, nprobe, given=None, n_threads=1, path="auto"):
        """``(distances, row ids)`` (n_q, k) of the ``k`` nearest rows in the ``nprobe`` nearest lists.

        ``given`` (n_q, n_lists) float64: the queries' distances to the lists
        when they are not the index's own. ``path``: ``"per-query"``,
        ``"prefiltered"`` (dense rows, float32 coordinates), ``"grouped"``
        (dense rows) or ``"auto"`` (:meth:`batch_path`); the path that ran is
        left in ``last_path``. All give the same answers.
        """
        n_q = X.shape[0]
        if path == "auto":
            path = self.batch_path(n_q, k, nprobe)
        if path == "grouped":
            self.last_path = "grouped"
            return self.search_grouped(X, k, nprobe, given, n_threads)
        if path == "prefiltered":
            self.last_path = "prefiltered"
            return self.search_prefiltered(X, k, nprobe, given, n_threads)
        self.last_path = "per-query"
        out_d = np.empty((n_q, k))
        out_i = np.empty((n_q, k), dtype=np.int64)
        if n_q == 0:
            return out_d, out_i
        Q, qdata, qind, qptr = self._queries(X)
        given = _NO_GIVEN if given is None else np.ascontiguousarray(given, dtype=np.float64)
        cap = self._capacity(nprobe, k)
        common = (self.sparse, given, self.own, int(nprobe), self.ix, self.head_dims, self.block, self.nmax, cap)
        if n_q < BATCH_MIN_ROWS:
            SK.search(Q, qdata, qind, qptr, *common, _NO_TAIL, out_d, out_i)
        else:
            tail = coordinates(X if self.sparse else Q, self.mean, self.basis, self.head_dims)

            def run(start, stop):
                if self.sparse:
                    lo, hi = qptr[start], qptr[stop]
                    q = (Q, qdata[lo:hi], qind[lo:hi], qptr[start:stop + 1] - lo)
                else:
                    q = (Q[start:stop], qdata, qind, qptr)
                g = given[start:stop] if given.shape[0] == n_q else given
                SK.search(*q, self.sparse, g, *common[2:], tail[start:stop], out_d[start:stop], out_i[start:stop])

            chunks = [(s, min(s + BATCH_CHUNK, n_q)) for s in range(0, n_q, BATCH_CHUNK)]
            if n_threads > 1 and len(chunks) > 1:
                with ThreadPoolExecutor(max_workers=n_threads) as pool:
                    list(pool.map(lambda c: run(*c), chunks))
            else:
                run(0, n_q)
        if np.isnan(out_d[:, 0]).any():  # rows that were not validated (the one-row fast path) and not finite
            check_data(X)
            raise ValueError("X holds values too large to square in float64.")
        return out_d, out_i

    def batch_path(self, n_q, k, nprobe):
        """The path :meth:`search` takes for ``n_q`` queries with ``path="auto"``: ``"per-query"``,
        ``"prefiltered"`` or ``"grouped"`` (the rule of ``BATCH_MIN_QUERIES_PER_LIST``)."""
        if self.sparse or n_q * min(nprobe, self.n_lists) < BATCH_MIN_QUERIES_PER_LIST * self.n_lists:
            return "per-query"
        if self.store == "float32":
            return "prefiltered"
        return "grouped" if k >= GROUPED_MIN_K and nprobe <= GROUPED_MAX_NPROBE else "per-query"

    def _row_norms(self):
        """Squared norms of the stored rows (list order, float64) and their maximum, computed once."""
        if getattr(self, "_yn", None) is None:
            self._yn = centred_sq_norms(self.rows, np.zeros(self.rows.shape[1]))
            self._ynmax = float(self._yn.max()) if self._yn.shape[0] else 0.0
        return self._yn, self._ynmax

    def _grouped_plan(self, X, k, nprobe, given, n_threads):
        """``(out_d, out_i, Q, plan)`` of a grouped batch (:func:`~qkm.approximate._search_batch.plan`, or None)."""
        n_q = X.shape[0]
        out_d = np.empty((n_q, k))
        out_i = np.empty((n_q, k), dtype=np.int64)
        if n_q == 0:
            return out_d, out_i, None, None
        Q = self._queries(X)[0]
        pd = self.list_distances(Q, n_threads) if given is None else np.ascontiguousarray(given, dtype=np.float64)
        return out_d, out_i, Q, SB.plan(pd, self.sizes, int(nprobe), int(k))

    def search_grouped(self, X, k, nprobe, given=None, n_threads=1):
        """``search`` by the grouped batch path (dense rows): every list read once for all its queries.

        Same answers as :meth:`search` (see :mod:`qkm.approximate._search_batch`).
        """
        if self.sparse:
            raise ValueError("the grouped batch path needs dense rows.")
        n_q = X.shape[0]
        out_d, out_i, Q, plan = self._grouped_plan(X, k, nprobe, given, n_threads)
        if plan is None:
            return out_d, out_i
        base, grp_ptr, grp_q, grp_slot = plan
        approx = np.empty(base[-1])
        pos = np.empty(base[-1], dtype=np.int64)
        qn = np.einsum("ij,ij->i", Q, Q)
        yn, ynmax = self._row_norms()
        rows = self.rows
        n_terms = rows.shape[1] + 4
        unit = np.finfo(rows.dtype).eps / 2
        gamma = 2.0 * n_terms * unit / (1.0 - n_terms * unit)
        Qc = Q.astype(rows.dtype)

        def scan(c0, c1):
            SB.scan_lists(c0, c1, Qc, qn, rows, yn, self.offsets, grp_ptr, grp_q, grp_slot, approx, pos)

        def finish(i0, i1):
            SB.finish(i0, i1, Q, qn, gamma, ynmax, base, approx, pos, rows, self.row_ids, out_d, out_i)

        _run_grouped(scan, finish, grp_ptr, n_q, n_threads)
        if np.isnan(out_d[:, 0]).any():
            check_data(X)
            raise ValueError("X holds values too large to square in float64.")
        return out_d, out_i

    def _coordinate_norms(self):
        """``||y||^2`` of the rows' stored coordinates (list order, float64) and their maximum, computed once."""
        if getattr(self, "_zn", None) is None:
            m, n = self.n_coords, self.row_ids.shape[0]
            coords_t = self.ix[7]
            zn = np.zeros(n)
            for c in range(self.n_lists):
                lo, hi = self.offsets[c], self.offsets[c + 1]
                Y = coords_t[m * lo:m * hi].reshape(m, hi - lo)
                zn[lo:hi] = np.einsum("ij,ij->j", Y, Y, dtype=np.float64)
            self._zn, self._znmax = zn, float(zn.max()) if n else 0.0
        return self._zn, self._znmax

    def batch_probe(self, Q, k, nprobe, given=None, n_threads=1):
        """The lists probed by dense float64 queries ``Q``, chosen by the single-query path's code.

        Returns ``(zh, nq, chosen, n_chosen)``: the head coordinates (n_q, h),
        ``||q - mean||^2``, and query ``i``'s lists ``chosen[i, :n_chosen[i]]``,
        nearest first (none for a query that is not finite).
        """
        n_q = Q.shape[0]
        zh, nq = np.empty((n_q, self.head_dims)), np.empty(n_q)
        chosen = np.empty((n_q, self._most_probed(nprobe, k)), dtype=np.int64)
        n_chosen = np.empty(n_q, dtype=np.int64)
        given = _NO_GIVEN if given is None else np.ascontiguousarray(given, dtype=np.float64)
        own, ix = self.own, self.ix

        def probe(i0, i1):
            SP.probe_batch(i0, i1, Q, ix, given, own, int(nprobe), int(k), zh, nq, chosen, n_chosen)

        _run_grouped(None, probe, np.zeros(2, dtype=np.int64), n_q, n_threads)
        return zh, nq, chosen, n_chosen

    def _plain_codec(self):
        """Whether the coordinates and centroids are stored as float32 values (the index's own lists)."""
        codec = self.ix[3]
        return self.own and self.store == "float32" and bool(np.all(codec[:, 0] == 0) and np.all(codec[:, 1] == 1))

    def _center_block(self):
        """``[centers_t; float32(||c||^2)]`` (h + 1, n_lists) float32, the non-empty lists, the largest ``||c||`` and
        ``||mean||``, computed once (:func:`qkm.approximate._search_prefilter.choose_lists`)."""
        if getattr(self, "_cblock", None) is None:
            C = self.ix[4]
            cn = np.einsum("ij,ij->j", C, C, dtype=np.float64)
            self._cblock = (np.ascontiguousarray(np.vstack([C, cn[None, :].astype(np.float32)])),
                            np.flatnonzero(self.sizes > 0).astype(np.int64),
                            float(np.sqrt(cn.max())) * 1.0001 if cn.shape[0] else 0.0,
                            float(np.sqrt(self.mean @ self.mean)) * 1.0001)
        return self._cblock

    def batch_choose(self, Q, k, nprobe, n_threads=1):
        """The lists probed by dense float64 queries ``Q`` (own lists, float32 coordinates), from BLAS products.

        The same lists as the single-query path chooses
        (:func:`qkm.approximate._search_prefilter.choose_lists`: decided from
        one matrix product with the centroids when a rounding bound settles
        them, else by the single-query path's own code). Returns ``(Z, nq,
        chosen, n_chosen)``: the queries' coordinates (n_q, m) float64,
        ``||q - mean||^2``, and the lists as :meth:`batch_probe` gives them
        (as a set).
        """
        n_q = Q.shape[0]
        h = self.head_dims
        B = np.asarray(self.basis, dtype=np.float64)
        Z = np.empty((n_q, self.n_coords))
        nq = np.empty(n_q)
        step = _config.DENSE_BLOCK_ROWS
        with np.errstate(invalid="ignore", over="ignore"):  # a query that is not finite: no lists (see the kernel)
            for s in range(0, n_q, step):
                A = Q[s:s + step] - self.mean
                Z[s:s + step] = A @ B
                nq[s:s + step] = np.einsum("ij,ij->i", A, A)
            V = np.empty((n_q, h + 1), dtype=np.float32)
            V[:, :h] = Z[:, :h]
            V[:, :h] *= -2.0
            V[:, h] = 1.0
            cblock, listed, cmax, mnorm = self._center_block()
            dots = V @ cblock
            if listed.shape[0] < self.n_lists:
                dots[:, self.sizes == 0] = np.inf
            V = np.ascontiguousarray(Z[:, :h], dtype=np.float32)
        chosen = np.empty((n_q, self._most_probed(nprobe, k)), dtype=np.int64)
        n_chosen = np.empty(n_q, dtype=np.int64)
        ix = self.ix

        def probe(i0, i1):
            SF.choose_lists(i0, i1, Q, ix, Z, V, nq, dots, listed.shape[0], cmax, mnorm, int(nprobe), int(k), chosen, n_chosen)

        _run_grouped(None, probe, np.zeros(2, dtype=np.int64), n_q, n_threads)
        return Z, nq, chosen, n_chosen

    def _last_residuals(self):
        """The rows' norms beyond all their stored coordinates (list order, float32), contiguous, computed once."""
        if getattr(self, "_ry", None) is None:
            resid = self.ix[9]
            self._ry = np.ascontiguousarray(resid[:, resid.shape[1] - 1])
        return self._ry

    def prefilter_plan(self, Q, k, nprobe, given=None, n_threads=1):
        """Everything the pre-filtered path's bounds and re-ranking take, before the lists are read.

        ``Q`` (n_q, D) float64 queries. Returns ``(base, (grp_ptr, grp_q,
        grp_slot), U, un, rq, nq, err, bounds, pos)``: the slots and groups of
        :func:`qkm.approximate._search_batch.group`, the queries' float32
        coordinates ``U``, ``||U||^2``, their norms beyond them ``rq``,
        ``||q - mean||^2``, the rounding allowance of their bounds, and the
        (unset) bounds and row positions of every slot.
        """
        n_q = Q.shape[0]
        h = self.head_dims
        if given is None and self._plain_codec():  # every coordinate from BLAS, the lists chosen from BLAS products
            Z, nq, chosen, n_chosen = self.batch_choose(Q, k, nprobe, n_threads)
            with np.errstate(invalid="ignore", over="ignore"):
                U = Z.astype(np.float32)
                rq = np.sqrt(np.maximum(nq - np.einsum("ij,ij->i", Z, Z), 0.0))
        else:
            zh, nq, chosen, n_chosen = self.batch_probe(Q, k, nprobe, given, n_threads)
            with np.errstate(invalid="ignore", over="ignore"):
                Zt = coordinates(Q, self.mean, self.basis, h)
                U = np.empty((n_q, self.n_coords), dtype=np.float32)
                U[:, :h], U[:, h:] = zh, Zt
                rq = np.sqrt(np.maximum(nq - np.einsum("ij,ij->i", zh, zh) - np.einsum("ij,ij->i", Zt, Zt), 0.0))
        base, grp_ptr, grp_q, grp_slot = SB.group(chosen, n_chosen, self.sizes)
        with np.errstate(invalid="ignore", over="ignore"):
            un = np.einsum("ij,ij->i", U, U, dtype=np.float64)
        znmax = self._coordinate_norms()[1]
        terms = self.n_coords + 4
        unit = np.finfo(np.float32).eps / 2
        err = 2.0 * terms * unit / (1.0 - terms * unit) * (un + znmax) * 1.0001
        # the bounds are kept in float32: |b| <= 2 (||u||^2 + max ||y||^2) + r_q^2 + max r_y^2, rounded by 2^-24 |b|
        err += 2.0 ** -23 * (2.0 * (un + znmax) + nq + self.nmax)
        bounds = np.empty(base[-1], dtype=np.float32)
        pos = np.empty(base[-1], dtype=np.int32 if self.row_ids.shape[0] < 2 ** 31 else np.int64)
        return base, (grp_ptr, grp_q, grp_slot), U, un, rq, nq, err, bounds, pos

    def search_prefiltered(self, X, k, nprobe, given=None, n_threads=1):
        """``search`` by the pre-filtered batch path (dense rows, float32 coordinates).

        Every list is read once for all its queries: one BLAS product per list
        bounds every probed row on all the stored coordinates, and only the
        rows the bounds leave in reach get their exact distance. Same answers
        as :meth:`search` (see :mod:`qkm.approximate._search_prefilter`).
        """
        if self.sparse or self.store != "float32":
            raise ValueError("the pre-filtered batch path needs dense rows and store='float32'.")
        n_q = X.shape[0]
        out_d = np.empty((n_q, k))
        out_i = np.empty((n_q, k), dtype=np.int64)
        if n_q == 0:
            return out_d, out_i
        Q = self._queries(X)[0]
        plan = self.prefilter_plan(Q, k, nprobe, given, n_threads)
        base, (grp_ptr, grp_q, grp_slot), U, un, rq, nq, err, bounds, pos = plan
        ix = self.ix
        zn, ry = self._coordinate_norms()[0], self._last_residuals()
        most = int(np.diff(base).max())

        def scan(c0, c1):
            with one_blas_thread():  # small products per list: BLAS threads would only wait for each other
                SF.bound_lists(c0, c1, U, un, rq, ix[7], zn, ry, self.offsets, grp_ptr, grp_q, grp_slot, bounds, pos)

        def finish(i0, i1):
            SF.finish(i0, i1, Q, nq, err, self.nmax, base, bounds, pos, np.empty(most, dtype=np.int64), self.rows,
                      self.row_ids, out_d, out_i)

        _run_grouped(scan, finish, grp_ptr, n_q, n_threads)
        if np.isnan(out_d[:, 0]).any():
            check_data(X)
            raise ValueError("X holds values too large to square in float64.")
        return out_d, out_i

    def list_distances(self, X, n_threads=1):
        """The kernels' own distances of every query to every list, (n_q, n_lists) float64."""
        Q, qdata, qind, qptr = self._queries(X)
        out = np.empty((X.shape[0], self.n_lists))
        with numba_threads(n_threads):
            SP.probe_distances(Q, qdata, qind, qptr, self.sparse, self.ix, out)
        return out
