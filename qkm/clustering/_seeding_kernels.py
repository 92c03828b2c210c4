"""numba kernels of the seedings in :mod:`qkm.clustering._seeding` (private; no validation here).

Conventions of :mod:`qkm._kernels`: arrays in, preallocated buffers out,
every argument marked ``# IN`` / ``# OUT``; work split into fixed chunks of
rows (``_config.CHUNK_SIZE``), never by thread, so every result is
bit-identical for any thread count.

Two layouts are built here for them: :class:`CenterBlock` (a block of
centres for the k-means|| chunk kernels) and :class:`SampleLayout` (a D^2
sample for the sample kernels).

``closest`` / ``nearest`` hold, for every row, the squared distance to its
nearest centre (or candidate) so far and that centre's id; the kernels below
lower them in place. A new centre only replaces the old one when it is
strictly closer, so ties keep the earlier (lower) id.
"""

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from .. import _config
from .._config import _JIT, _JIT_DOT
from .._kernels import centroid_sq_norms

_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def round_key(seed, round_id):
    """64-bit key of one k-means|| round (Python ints: exact on every machine)."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + (int(round_id) + 1) * 0xD1B54A32D192ED03) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    return np.uint64(z ^ (z >> 27))


@njit(inline="always", **_JIT)
def _uniform(key, i):
    """A uniform number in [0, 1) from (key, global row id): splitmix64, counter-based.

    A row's draw depends on nothing but its global id and the round's key, so
    the sample does not depend on how the rows are split into chunks.
    """
    z = key + (np.uint64(i) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return np.float64(z >> _S11) * (1.0 / 9007199254740992.0)


@njit(parallel=True, **_JIT)
def sample_rows(
    closest,                        # IN  (m,) squared distances of the chunk's rows
    key,                            # IN  uint64 round key (round_key)
    row_offset,                     # IN  global id of the chunk's first row
    scale,                          # IN  ell / phi: row i is kept with probability min(1, scale * closest[i])
    keep,                           # OUT (m,) bool
):
    m = closest.shape[0]
    chunk = _config.CHUNK_SIZE
    for ch in prange((m + chunk - 1) // chunk):
        for i in range(ch * chunk, min(m, (ch + 1) * chunk)):
            keep[i] = _uniform(key, row_offset + i) < scale * closest[i]


# --------------------------------------------------------------------------- #
# Distances to one new centre (D^2 updates)
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT_DOT)
def lower_to_center_dense(
    X,                              # IN  (m, D) dense rows
    c,                              # IN  (D,) float64 centre
    center_id,                      # IN  id written into `nearest`
    closest, nearest,               # IN/OUT (m,) float64, int64
):
    """closest[i] = min(closest[i], ||x_i - c||^2), by explicit differences (exact 0 on equal rows)."""
    m, D = X.shape
    chunk = _config.CHUNK_SIZE
    for ch in prange((m + chunk - 1) // chunk):
        for i in range(ch * chunk, min(m, (ch + 1) * chunk)):
            s = 0.0
            for k in range(D):
                d = np.float64(X[i, k]) - c[k]
                s += d * d
            if s < closest[i]:
                closest[i] = s
                nearest[i] = center_id


@njit(parallel=True, **_JIT)
def lower_to_center_sparse(
    data, indices, indptr,          # IN  CSR rows
    x_sq,                           # IN  (m,) float64 squared row norms
    c, c_sq,                        # IN  (D,) float64 centre and its squared norm
    err_rel,                        # IN  distances below err_rel * (|x|^2 + |c|^2) count as 0
    center_id,                      # IN
    closest, nearest,               # IN/OUT (m,)
):
    m = indptr.shape[0] - 1
    chunk = _config.CHUNK_SIZE
    for ch in prange((m + chunk - 1) // chunk):
        for i in range(ch * chunk, min(m, (ch + 1) * chunk)):
            s = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                s += np.float64(data[p]) * c[indices[p]]
            d = x_sq[i] + c_sq - 2.0 * s
            if d <= err_rel * (x_sq[i] + c_sq):
                d = 0.0
            if d < closest[i]:
                closest[i] = d
                nearest[i] = center_id


# --------------------------------------------------------------------------- #
# Distances to a block of sparse centres (k-means|| rounds, weighted Lloyd)
# --------------------------------------------------------------------------- #
# The dots of a row block with a block of B sparse centres are formed transposed,
# GT of shape (B, r): the frequent terms as ``c_dense`` times the rows' dense slab
# on those terms (axpys over the rows), the rare ones term-major (each centre's rare terms scatter a
# column of the rows' CSC copy into the centre's row of GT, a contiguous stream).
@njit(parallel=True, **_JIT)
def gather_slab_t(
    data, indices, indptr,          # IN  CSR rows
    row0,                           # IN  first row of the slab
    code,                           # IN  (D,) int32: s >= 0 the term is column s of the block's c_dense
    slab_t,                         # IN/OUT (F, r) float64 zeros: rows row0 .. row0 + r - 1 on the frequent terms
):
    r = slab_t.shape[1]
    chunk = _config.CHUNK_SIZE
    for ch in prange((r + chunk - 1) // chunk):
        for t in range(ch * chunk, min(r, (ch + 1) * chunk)):
            for p in range(indptr[row0 + t], indptr[row0 + t + 1]):
                s = code[indices[p]]
                if s >= 0:
                    slab_t[s, t] = data[p]


@njit(parallel=True, **_JIT)
def add_dense_dots(
    c_dense,                        # IN  (B, F) float64 the centres on the frequent terms
    slab_t,                         # IN  (F, r) float64 the rows on the frequent terms
    GT,                             # IN/OUT (B, r) float64 zeros: GT[j, t] = sum_s c_dense[j, s] slab_t[s, t]
):
    """The frequent terms' dots, one contiguous axpy over the rows per nonzero of a centre.

    Not BLAS: a BLAS product rounds an entry differently depending on where
    it falls in the call's tiles, while here every entry is summed in term
    order, so a row's dots do not depend on the rows beside it (chunked ==
    whole k-means||) nor on the thread count.
    """
    B, F = c_dense.shape
    r = GT.shape[1]
    for j in prange(B):
        g = GT[j]
        for s in range(F):
            v = c_dense[j, s]
            if v != 0.0:
                row = slab_t[s]
                for t in range(r):
                    g[t] += v * row[t]


@njit(parallel=True, **_JIT)
def add_rare_dots(
    csc_data, csc_indices, csc_indptr,  # IN  the row block in CSC (row ids 0 .. r - 1)
    r_ptr, r_idx, r_val,            # IN  CSR (B, D) of the centres' rare terms
    GT,                             # IN/OUT (B, r) dots over the frequent terms; the rare terms are added
):
    """GT[j, t] += sum over the rare terms k of c_{j, k} x_{t, k}, in the order of c_j's terms."""
    B = GT.shape[0]
    for j in prange(B):
        row = GT[j]
        for q in range(r_ptr[j], r_ptr[j + 1]):
            k = r_idx[q]
            v = r_val[q]
            for p in range(csc_indptr[k], csc_indptr[k + 1]):
                row[csc_indices[p]] += v * np.float64(csc_data[p])


@njit(parallel=True, **_JIT)
def lower_to_block_t(
    GT,                             # IN  (B, r) dots of the centres with rows row0 .. row0 + r - 1
    row0,                           # IN
    x_sq,                           # IN  (m,) float64 squared norms of the chunk's rows
    c_sq, err_rel, first_id,        # IN
    closest, nearest,               # IN/OUT (m,)
):
    """:func:`lower_to_block_dense` from transposed dots (the same arithmetic and ties: the first nearest centre)."""
    B, r = GT.shape
    chunk = _config.CHUNK_SIZE
    for ch in prange((r + chunk - 1) // chunk):
        a = ch * chunk
        b = min(r, a + chunk)
        best = np.full(b - a, np.inf)
        best_j = np.zeros(b - a, dtype=np.int64)
        for j in range(B):
            cs = c_sq[j]
            g = GT[j]
            for t in range(a, b):
                xs = x_sq[row0 + t]
                d = xs + cs - 2.0 * g[t]
                if d <= err_rel * (xs + cs):
                    d = 0.0
                if d < best[t - a]:
                    best[t - a] = d
                    best_j[t - a] = j
        for t in range(a, b):
            i = row0 + t
            if best[t - a] < closest[i]:
                closest[i] = best[t - a]
                nearest[i] = first_id + best_j[t - a]


@njit(parallel=True, **_JIT)
def lower_to_block_dense(
    G,                              # IN  (b, B) dot products of a row block with the centres (BLAS)
    row0,                           # IN  chunk row of G's first row
    x_sq,                           # IN  (m,) float64 squared norms of the chunk's rows
    c_sq, err_rel, first_id,        # IN
    closest, nearest,               # IN/OUT (m,)
):
    b, B = G.shape
    chunk = _config.CHUNK_SIZE
    for ch in prange((b + chunk - 1) // chunk):
        acc = np.empty(B, dtype=np.float64)
        for t in range(ch * chunk, min(b, (ch + 1) * chunk)):
            for j in range(B):
                acc[j] = G[t, j]
            i = row0 + t
            _lower_from_dots(i, acc, x_sq[i], c_sq, err_rel, first_id, closest, nearest)


@njit(inline="always", **_JIT)
def _lower_from_dots(i, acc, xs, c_sq, err_rel, first_id, closest, nearest):
    best = np.inf
    best_j = 0
    for j in range(acc.shape[0]):
        d = xs + c_sq[j] - 2.0 * acc[j]
        if d <= err_rel * (xs + c_sq[j]):
            d = 0.0
        if d < best:
            best = d
            best_j = j
    if best < closest[i]:
        closest[i] = best
        nearest[i] = first_id + best_j


# --------------------------------------------------------------------------- #
# Weighted k-means of a D^2 sample (D^2-seeding). The sample is either dense
# (Xd, u x D) or CSR with its columns renumbered 0..U-1 (the sample's support);
# group centres are kept transposed, GT of shape (U or D, g), so that every
# nonzero of a row updates all g dot products with one contiguous axpy.
# --------------------------------------------------------------------------- #
@njit(parallel=True, **_JIT)
def sample_dots_to_row(
    data, indices, indptr, Xd, sparse,  # IN  the sample (CSR with renumbered columns, or dense Xd)
    xs_sq,                          # IN  (u,) float64 squared norms
    s,                              # IN  sample row to measure from
    buf,                            # IN/OUT (U,) float64 zeros (left zeroed)
    out,                            # OUT (u,) squared distances to row s, clipped at 0 (exactly 0 at s)
):
    u = xs_sq.shape[0]
    if sparse:
        for p in range(indptr[s], indptr[s + 1]):
            buf[indices[p]] = data[p]
    chunk = _config.CHUNK_SIZE
    for ch in prange((u + chunk - 1) // chunk):
        for i in range(ch * chunk, min(u, (ch + 1) * chunk)):
            acc = 0.0
            if sparse:
                for p in range(indptr[i], indptr[i + 1]):
                    acc += data[p] * buf[indices[p]]
            else:
                for k in range(Xd.shape[1]):
                    acc += Xd[i, k] * Xd[s, k]
            d = xs_sq[i] + xs_sq[s] - 2.0 * acc
            out[i] = d if d > 0.0 else 0.0
        if ch == s // chunk:
            out[s] = 0.0
    if sparse:
        for p in range(indptr[s], indptr[s + 1]):
            buf[indices[p]] = 0.0


@njit(parallel=True, **_JIT)
def sample_assign(
    data, indices, indptr, Xd, sparse,  # IN  the sample
    xs_sq,                          # IN  (u,)
    GT, g_sq,                       # IN  (U, g) group centres transposed, (g,) their squared norms
    outside,                        # IN  (u,) squared distance to the nearest existing centre (inf: none)
    labels,                         # OUT (u,) int64 nearest group, -1 when an existing centre is nearer
    best_sq,                        # OUT (u,) squared distance to the nearest group
):
    u = xs_sq.shape[0]
    g = g_sq.shape[0]
    chunk = _config.CHUNK_SIZE
    for ch in prange((u + chunk - 1) // chunk):
        acc = np.empty(g, dtype=np.float64)
        for i in range(ch * chunk, min(u, (ch + 1) * chunk)):
            acc[:] = 0.0
            if sparse:
                for p in range(indptr[i], indptr[i + 1]):
                    v = data[p]
                    row = GT[indices[p]]
                    for j in range(g):
                        acc[j] += v * row[j]
            else:
                for k in range(Xd.shape[1]):
                    v = Xd[i, k]
                    if v != 0.0:
                        row = GT[k]
                        for j in range(g):
                            acc[j] += v * row[j]
            best = np.inf
            best_j = 0
            for j in range(g):
                d = xs_sq[i] + g_sq[j] - 2.0 * acc[j]
                if d < best:
                    best = d
                    best_j = j
            best = best if best > 0.0 else 0.0
            best_sq[i] = best
            labels[i] = best_j if best < outside[i] else -1


@njit(**_JIT)
def sample_means(
    data, indices, indptr, Xd, sparse,  # IN  the sample
    weights,                        # IN  (u,) float64 multiplicities
    labels,                         # IN  (u,) int64 groups (-1: none)
    GT,                             # IN/OUT (U, g): weighted means of the groups; empty groups keep theirs
    g_sq,                           # IN/OUT (g,) squared norms of the columns of GT
    totals,                         # OUT (g,) float64 weight of every group
):
    """Sequential (row order) sums: the same result on any thread count."""
    U, g = GT.shape
    sums = np.zeros((U, g), dtype=np.float64)
    totals[:] = 0.0
    for i in range(labels.shape[0]):
        l = labels[i]
        if l < 0:
            continue
        wi = weights[i]
        totals[l] += wi
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                sums[indices[p], l] += wi * data[p]
        else:
            for k in range(Xd.shape[1]):
                sums[k, l] += wi * Xd[i, k]
    for j in range(g):
        if totals[j] > 0.0:
            g_sq[j] = 0.0
    for t in range(U):
        for j in range(g):
            if totals[j] > 0.0:
                v = sums[t, j] / totals[j]
                GT[t, j] = v
                g_sq[j] += v * v


# --------------------------------------------------------------------------- #
# Layouts the kernels read
# --------------------------------------------------------------------------- #
class CenterBlock:
    """Centres ``first_id ... first_id + n - 1`` in the layout the chunk kernels read (arrays only).

    CSR centres: the terms that occur in more than
    ``_config.SEEDING_DENSE_TERM_FRACTION`` of the block's centres
    (``dense_terms``, F of them) as a dense ``(B, F)`` matrix ``c_dense``
    (:func:`add_dense_dots`), ``code[t]`` = column of term t in it (-1:
    not a frequent term); the other terms of every centre as CSR ``(B, D)``
    arrays ``r_ptr, r_idx, r_val`` (sorted terms; :func:`add_rare_dots`).
    """

    def __init__(self, rows, first_id):
        self.first_id = int(first_id)
        self.sparse = sp.issparse(rows)
        self.n = rows.shape[0]
        if not self.sparse:
            self.C = np.ascontiguousarray(rows)
            self.c_sq = centroid_sq_norms(self.C)
            return
        rows = sp.csr_matrix(rows, dtype=np.float64)
        rows.sum_duplicates()
        rows.sort_indices()
        self.c_sq = np.asarray(rows.multiply(rows).sum(axis=1), dtype=np.float64).ravel()
        counts = np.bincount(rows.indices, minlength=rows.shape[1])
        dense = counts > _config.SEEDING_DENSE_TERM_FRACTION * self.n
        self.dense_terms = np.flatnonzero(dense)
        self.code = np.full(rows.shape[1], -1, dtype=np.int32)
        self.code[dense] = np.arange(self.dense_terms.shape[0], dtype=np.int32)
        self.c_dense = np.ascontiguousarray(rows[:, self.dense_terms].toarray())
        rare = ~dense[rows.indices]
        owner = np.repeat(np.arange(self.n), np.diff(rows.indptr))
        self.r_ptr = np.concatenate([[0], np.cumsum(np.bincount(owner[rare], minlength=self.n))]).astype(np.int64)
        self.r_idx = rows.indices[rare].astype(np.int64)
        self.r_val = rows.data[rare]


class SampleLayout:
    """Distinct rows of a D^2 sample (float64), their weights and distances to the existing centres.

    CSR samples keep only their own columns (renumbered ``0 .. width-1``);
    :meth:`subset` keeps that numbering, so group centres of every node of a
    tree live in one space.
    """

    def __init__(self, data, rows, weights, outside, ids=None, X=None, ranks=None):
        self.sparse = data.sparse if data is not None else sp.issparse(X)
        self.weights, self.outside = weights, outside
        self.ids = np.arange(rows.shape[0]) if ids is None else ids  # positions in the full sample
        if X is None:
            X = data.X[rows]
            self.x_sq = data.x_sq[rows]
            if self.sparse:
                # columns renumbered by the data's document frequency (``ranks``: (order, rank)), so the
                # frequent terms' rows of a transposed centre matrix sit together and stay in cache
                order, rank = ranks
                r = rank[X.indices]
                present = np.zeros(X.shape[1], dtype=np.bool_)
                present[r] = True
                self.columns = order[np.flatnonzero(present)]
                X = sp.csr_matrix((X.data.astype(np.float64), (np.cumsum(present, dtype=np.int32) - 1)[r],
                                   X.indptr), shape=(X.shape[0], self.columns.shape[0]))
            else:
                X = np.ascontiguousarray(X, dtype=np.float64)
        self.X = X
        self.width = X.shape[1]
        if self.sparse:
            self.arrays = (X.data, X.indices, X.indptr, np.zeros((0, 0)), True)
        else:
            self.arrays = (np.zeros(0), np.zeros(0, np.int32), np.zeros(1, np.int64), X, False)

    def subset(self, members):
        sub = SampleLayout(None, members, self.weights[members], self.outside[members], self.ids[members], self.X[members])
        sub.x_sq = self.x_sq[members]
        sub.columns = getattr(self, "columns", None)
        return sub

    def transposed_rows(self, ids):
        """(width, len(ids)) float64: the rows ``ids`` as columns."""
        rows = self.X[np.asarray(ids)]
        return np.ascontiguousarray((rows.toarray() if self.sparse else rows).T)

    def expand(self, column, n_features):
        """A group centre (a column of GT) back in the data's feature space."""
        if not self.sparse:
            return column.copy()
        c = np.zeros(n_features)
        c[self.columns] = column
        return c
