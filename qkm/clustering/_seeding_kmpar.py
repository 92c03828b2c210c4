"""k-means|| (Bahmani et al. 2012): per-chunk work and the driver, for :mod:`qkm.clustering._seeding`.

k-means|| in chunks
-------------------
The data are a list of *chunks* (row blocks; in-process: one chunk holding
every row; a distributed backend: one per shard). A chunk's state
(:class:`KMParChunk`) keeps, per row, the squared distance to the nearest
candidate and that candidate's id. Per-chunk work, O(rows of the chunk):

* :func:`chunk_lower` - distances to a block of new candidates only (a
  :class:`qkm.clustering._seeding_kernels.CenterBlock`); updates the state, returns the
  chunk's cost;
* :func:`chunk_sample` - the rows kept this round (round key and scale in);
* :func:`chunk_rows` - given rows (the first centre);
* :func:`chunk_counts` - rows nearest to each candidate (the weights).

The driver step (:func:`kmeans_parallel`), O(candidates): draw the first row,
sum the chunk costs in chunk order, gather and de-duplicate the sampled rows,
build the next block, sum the counts, and recluster the weighted candidates
(:func:`recluster`). It reaches the chunks only through its ``map_chunks``
argument, which a distributed backend replaces. A row is kept according to a
counter-based draw keyed by (round, global row id), so the sample does not
depend on the chunking; the total cost does, in its last bits (sum order).

The arithmetic (CSR data)
-------------------------
A round costs the dots of every row with the round's ~ell new candidates,
``sum_t df_X(t) df_C(t)`` multiply-adds over the terms t (``df``: rows with
term t), most of it on a few frequent terms. :func:`block_dots` forms them
transposed, ``(B, rows)``: the block's frequent terms as dense axpys over the
rows (a dense slab of the rows on those terms), the rare ones term-major
from the chunk's CSC copy (kept across rounds), each summed in a fixed term
order, so a row's dots depend on neither its neighbours nor the thread count.
:func:`recluster` computes the candidates' Gram matrix once with the same
product and runs both its weighted k-means++ and its weighted Lloyd on it.
"""

import numpy as np
import scipy.sparse as sp

from .. import _config
from . import _seeding_kernels as S_
from .._data import KMeansData
from ._init import _rows, distinct_row_indices, greedy_kmeanspp

__all__ = ["KMPAR_LLOYD_ITER", "KMPAR_EXTRA_ROUNDS", "kmeans_parallel", "KMParChunk", "chunk_lower", "chunk_sample",
           "chunk_rows", "chunk_counts", "recluster", "block_dots"]

#: Weighted Lloyd iterations on the k-means|| candidates.
KMPAR_LLOYD_ITER = 5
#: k-means|| rounds run past ``init_rounds`` at most this many times while fewer than K candidates exist.
KMPAR_EXTRA_ROUNDS = 100


# --------------------------------------------------------------------------- #
# k-means||: per-chunk work
# --------------------------------------------------------------------------- #
class KMParChunk:
    """One chunk of rows in k-means||: its data, global offset and per-row nearest candidate.

    Parameters
    ----------
    data : KMeansData
        The chunk's rows.
    row_offset : int, default=0
        Global id of its first row (keys the sampling draws).
    """

    def __init__(self, data, row_offset=0):
        self.data = data
        self.row_offset = int(row_offset)
        self.closest = np.full(data.n_samples, np.inf)
        self.nearest = np.zeros(data.n_samples, dtype=np.int64)
        self._csc = {}

    def csc_rows(self, start, stop):
        """The CSR chunk's rows ``start:stop`` in CSC (sorted; kept for the next rounds)."""
        if (start, stop) not in self._csc:
            self._csc[start, stop] = _csc(self.data.X[start:stop])
        return self._csc[start, stop]


def _csc(X):
    csc = X.tocsc()
    csc.sort_indices()
    return csc


def chunk_lower(chunk, block):
    """Lower the chunk's distances with a block of new centres; returns the chunk's cost (float).

    The dots come in row blocks: BLAS for dense rows; for CSR rows
    :func:`block_dots` (transposed), then one pass lowers the state.
    """
    data = chunk.data
    X = data.X
    m = data.n_samples
    if data.sparse:
        step = max(_config.CHUNK_SIZE, min(_config.DENSE_BLOCK_ROWS, _config.SEEDING_DOTS_BLOCK // max(block.n, 1)))
        for start in range(0, m, step):
            GT = block_dots(X, start, min(m, start + step), block, chunk.csc_rows(start, min(m, start + step)))
            S_.lower_to_block_t(GT, start, data.x_sq, block.c_sq, data.err_rel, block.first_id,
                                chunk.closest, chunk.nearest)
    else:
        CT = np.asarray(block.C, dtype=data.dtype).T
        step = _config.DENSE_BLOCK_ROWS
        for start in range(0, m, step):
            S_.lower_to_block_dense(X[start:start + step] @ CT, start, data.x_sq, block.c_sq, data.err_rel,
                                    block.first_id, chunk.closest, chunk.nearest)
    return float(chunk.closest.sum())


def block_dots(X, start, stop, block, csc=None):
    """``C . X[start:stop]^T`` (float64, ``(B, stop - start)``) for CSR rows X and a CSR block (hybrid product).

    The block's frequent terms (``block.dense_terms``: a term costs its
    document frequency in X times that in C, so most of the work sits on a
    few terms) as ``block.c_dense`` times a dense slab of the rows on those
    terms (contiguous axpys, :func:`qkm.clustering._seeding_kernels.add_dense_dots`);
    the rare ones are then added term by term from the
    rows' CSC copy (:func:`qkm.clustering._seeding_kernels.add_rare_dots`).
    Each row's dots depend on that row only, not on ``start``/``stop``.
    ``csc``: ``X[start:stop]`` in CSC with sorted indices, if at hand.
    """
    slab_t = np.zeros((block.dense_terms.shape[0], stop - start))
    S_.gather_slab_t(X.data, X.indices, X.indptr, start, block.code, slab_t)
    GT = np.zeros((block.n, stop - start))
    S_.add_dense_dots(block.c_dense, slab_t, GT)
    csc = _csc(X[start:stop]) if csc is None else csc
    S_.add_rare_dots(csc.data, csc.indices, csc.indptr, block.r_ptr, block.r_idx, block.r_val, GT)
    return GT


def chunk_sample(chunk, key, scale):
    """The rows kept this round (dense ndarray or CSR): row i with probability ``min(1, scale * closest[i])``."""
    keep = np.empty(chunk.data.n_samples, dtype=np.bool_)
    S_.sample_rows(chunk.closest, key, chunk.row_offset, float(scale), keep)
    return chunk_rows(chunk, np.flatnonzero(keep))


def chunk_rows(chunk, local_ids):
    """The chunk's rows ``local_ids`` (dense ndarray or CSR)."""
    return chunk.data.X[local_ids]


def chunk_counts(chunk, n_candidates):
    """Rows nearest to each candidate, float64 (the candidates' weights)."""
    return np.bincount(chunk.nearest, minlength=n_candidates).astype(np.float64)


# --------------------------------------------------------------------------- #
# k-means||: driver
# --------------------------------------------------------------------------- #
def _in_process_map(fn, chunks, *args):
    return [fn(chunk, *args) for chunk in chunks]


def _stack(blocks):
    return sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.vstack(blocks)


def kmeans_parallel(chunks, n_clusters, rng, oversampling_factor=2.0, n_rounds=5, n_local_trials=None,
                    map_chunks=_in_process_map, sparse_centers=False):
    """k-means|| over chunks (see "k-means|| in chunks"): centres of the data dtype, dense or CSR (:func:`recluster`).

    ``map_chunks(fn, chunks, *args)`` runs a per-chunk function on every
    chunk and returns the results in chunk order (in-process by default); it
    is the only way the driver touches the chunks. ``chunk_lower`` updates a
    chunk's state in place, so a distributed ``map_chunks`` keeps the states
    where the chunks live.
    """
    sizes = [c.data.n_samples for c in chunks]
    first = int(rng.randint(sum(sizes)))
    owner = int(np.searchsorted(np.cumsum(sizes), first, side="right"))
    candidates = map_chunks(chunk_rows, [chunks[owner]], np.array([first - sum(sizes[:owner])]))
    phi = sum(map_chunks(chunk_lower, chunks, S_.CenterBlock(candidates[0], 0)))
    n_cand = 1
    ell = oversampling_factor * n_clusters
    key0 = int(rng.randint(2 ** 31 - 1)) * (2 ** 31) + int(rng.randint(2 ** 31 - 1))
    r = 0
    while phi > 0 and (r < n_rounds or (n_cand < n_clusters and r < n_rounds + KMPAR_EXTRA_ROUNDS)):
        key = S_.round_key(key0, r)
        r += 1
        new = _stack(map_chunks(chunk_sample, chunks, key, ell / phi))
        if new.shape[0] == 0:
            continue
        new = new[distinct_row_indices(new)]
        phi = sum(map_chunks(chunk_lower, chunks, S_.CenterBlock(new, n_cand)))
        candidates.append(new)
        n_cand += new.shape[0]
    weights = np.sum(map_chunks(chunk_counts, chunks, n_cand), axis=0)
    return recluster(_stack(candidates), weights, n_clusters, rng, n_local_trials, sparse_centers=sparse_centers)


def _weighted_sums(X, weights, labels, n_groups):
    """Per-group sums of the weighted rows ((g, D), sparse for CSR X) and the groups' total weights."""
    M = sp.csr_matrix((weights, (labels, np.arange(X.shape[0]))), shape=(n_groups, X.shape[0]))
    return M @ X, np.bincount(labels, weights=weights, minlength=n_groups)


def recluster(candidates, weights, n_clusters, rng, n_local_trials=None, lloyd_iter=KMPAR_LLOYD_ITER,
              sparse_centers=False):
    """Greedy weighted k-means++ then weighted Lloyd on the candidates; dense (n_clusters, D) centres, or CSR
    ones (the same values) for CSR candidates with ``sparse_centers``.

    Candidates of zero weight are never drawn. If fewer than ``n_clusters``
    candidates carry weight (only when the rounds ran out), the missing
    centres come from greedy k-means++ on all candidates.

    CSR candidates whose Gram matrix takes at most
    ``_config.SEEDING_GRAM_MAX_BYTES`` get it once (:func:`block_dots`):
    k-means++ reads its rows, and Lloyd keeps every centre as a weighted sum
    of candidates (a sparse ``(K, m)`` matrix W), so a Lloyd pass is
    ``W . Gram`` (a sparse times dense product) and
    the centres ``W . candidates`` are formed once at the end. The same
    arithmetic as explicit centres up to float rounding.
    """
    dtype = candidates.dtype
    if np.count_nonzero(weights) < n_clusters:
        weights = weights + (weights == 0)
    cdata = KMeansData(candidates if sp.issparse(candidates) else np.ascontiguousarray(candidates))
    m = cdata.n_samples
    gram = None
    if cdata.sparse and 8 * m * m <= _config.SEEDING_GRAM_MAX_BYTES:
        gram = block_dots(cdata.X, 0, m, S_.CenterBlock(cdata.X, 0))
    idx, _ = greedy_kmeanspp(cdata, n_clusters, rng, n_local_trials, sample_weight=weights, rows_only=True,
                             dots=None if gram is None else gram.__getitem__)
    if gram is not None:
        C = _lloyd_on_gram(cdata, gram, weights, idx, n_clusters, lloyd_iter).astype(dtype)
        C.eliminate_zeros()
    else:
        C = _lloyd(candidates, cdata, weights, candidates[idx], lloyd_iter)
    if len(distinct_row_indices(C)) < n_clusters:
        C = candidates[idx]  # Lloyd merged two centres: keep the distinct seeds
    return _rows(C, np.arange(n_clusters), sparse_centers)


def _lloyd(candidates, cdata, weights, C, lloyd_iter):
    """Weighted Lloyd on the candidates from centres C (explicit centres, data dtype)."""
    dtype = candidates.dtype
    labels = None
    for _ in range(lloyd_iter):
        state = KMParChunk(cdata)
        chunk_lower(state, S_.CenterBlock(C, 0))
        if labels is not None and np.array_equal(state.nearest, labels):
            break
        labels = state.nearest
        sums, totals = _weighted_sums(candidates, weights, labels, C.shape[0])
        inv, empty = _mean_scales(totals)
        if sp.issparse(sums):
            C = (sp.diags(inv) @ sums + sp.diags(empty) @ C).tocsr().astype(dtype)
            C.eliminate_zeros()
        else:
            C = np.ascontiguousarray(sums * inv[:, None] + C * empty[:, None], dtype=dtype)
    return C


def _mean_scales(totals):
    """1 / total weight of each group (0 for empty groups), and 1.0 for the empty groups (they keep their centre)."""
    inv = np.where(totals > 0, 1.0 / np.where(totals > 0, totals, 1.0), 0.0)
    return inv, (totals == 0).astype(np.float64)


def _lloyd_on_gram(cdata, gram, weights, idx, n_clusters, lloyd_iter):
    """Weighted Lloyd on the candidates through their Gram matrix (see :func:`recluster`); CSR float64 centres."""
    m = cdata.n_samples
    W = sp.csr_matrix((np.ones(n_clusters), (np.arange(n_clusters), idx)), shape=(n_clusters, m))
    labels = None
    for _ in range(lloyd_iter):
        DT = np.ascontiguousarray(W @ gram)  # (K, m): centre j . candidate i
        c_sq = np.asarray(W.multiply(DT).sum(axis=1)).ravel()
        state = KMParChunk(cdata)
        S_.lower_to_block_t(DT, 0, cdata.x_sq, c_sq, cdata.err_rel, 0, state.closest, state.nearest)
        if labels is not None and np.array_equal(state.nearest, labels):
            break
        labels = state.nearest
        M = sp.csr_matrix((weights, (labels, np.arange(m))), shape=(n_clusters, m))
        inv, empty = _mean_scales(np.bincount(labels, weights=weights, minlength=n_clusters))
        W = (sp.diags(inv) @ M + sp.diags(empty) @ W).tocsr()
        W.eliminate_zeros()
        W.sort_indices()
    return (W @ cdata.X).tocsr()
