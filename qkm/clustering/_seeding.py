"""Seedings: k-means++, D^2-seeding, k-means|| and SystemML's sampled seeding.

One entry point, :func:`run_seeding`, gives the initial centres of one run
with their potential (the *seeding cost*, ``sum_i min_j ||x_i - c_j||^2``)
and the time the seeding took.

* ``"k-means++"``: greedy k-means++ (:mod:`qkm.clustering._init`); ``n_local_trials=1``
  is plain k-means++.
* ``"d2-seeding"`` (Fast Parallel Initialisation for k-means): K sequential
  steps; each draws N points independently from the D^2 distribution of the
  centres so far, clusters that sample and takes the weighted mean of its
  heaviest group as the next centre. The supplement leaves the clustering
  open. Here the sample (its distinct rows, weighted by how often they were
  drawn) is clustered by a weighted k-means (groups seeded by k-means++
  inside the sample, up to ``SAMPLE_LLOYD_ITER`` Lloyd iterations) in which
  a sample point nearer to an existing centre than to every group joins no
  group. It uses K groups, as the supplement says, while that costs at most
  ``FLAT_BUDGET`` (10) greedy k-means++ steps, else ``2 + floor(log2 K)``
  groups (:func:`_flat_is_affordable`).
  One step costs one pass over the data with one centre (the D^2 weights are
  kept and lowered incrementally) plus ``O(N * groups)`` on the sample. A
  centre that would lower no point's distance (it sits on an existing one)
  is replaced by its group's seed row, so the K centres are distinct.
* ``"k-means||"`` (Bahmani et al. 2012): rounds of independent D^2 sampling
  with ``ell = oversampling_factor * K`` expected new candidates per round,
  candidates weighted by the number of points nearest to them, then greedy
  k-means++ and ``KMPAR_LLOYD_ITER`` weighted Lloyd iterations on the weighted
  candidates. See :mod:`qkm.clustering._seeding_kmpar` ("k-means|| in chunks").
* ``"random"``: distinct rows drawn uniformly.
* ``init_sample=SAMP`` (SystemML's ``samp``): the seeding runs on a sample of
  about ``K * SAMP`` rows drawn by geometric skips (:func:`geometric_sample`).
"""

import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from . import _seeding_kernels as S_
from ._seeding_kernels import SampleLayout
from .._data import KMeansData
from ._init import _rows, distinct_row_indices, greedy_kmeanspp, n_local_trials_for, random_rows
from ._seeding_kmpar import KMParChunk, chunk_lower, kmeans_parallel
from ..operator import DenseOperator

__all__ = ["SEEDINGS", "Seeding", "Seeds", "run_seeding", "potential", "d2_seeding", "geometric_sample"]

SEEDINGS = ("k-means++", "d2-seeding", "k-means||", "random")

#: Lloyd iterations clustering one D^2 sample.
SAMPLE_LLOYD_ITER = 10
#: D^2-seeding ("auto") clusters a sample into K groups while that costs at most FLAT_BUDGET greedy k-means++
#: steps (counting FLAT_ITERS Lloyd iterations), else into 2 + log2 K groups; see _flat_is_affordable.
FLAT_BUDGET = 10
FLAT_ITERS = 4


@dataclasses.dataclass(frozen=True)
class Seeding:
    """A validated seeding request: the estimators' init parameters (see :func:`qkm.clustering._base.seeding_of`).

    ``n_local_trials`` (k-means++ candidates per step, 1 = plain) and
    ``d2_groups`` (see :func:`d2_seeding`) are not estimator parameters; the
    benchmark sets them.
    """

    init: object = "k-means++"
    d2_samples: int = None
    oversampling_factor: float = 2.0
    init_rounds: int = 5
    init_sample: float = None
    n_local_trials: int = None
    d2_groups: str = "auto"


@dataclasses.dataclass
class Seeds:
    """Initial centres of one run, their potential on the training data and the seeding time."""

    centers: object          # ndarray of shape (n_clusters, n_features), or CSR (``sparse_centers``)
    cost: float
    seconds: float
    method: str
    n_seeded_rows: int

    @property
    def record(self):
        """The fields added to ``history_[0]``."""
        return {"seeding": self.method, "seeding_cost": self.cost, "seeding_seconds": self.seconds,
                "seeding_rows": self.n_seeded_rows}


def potential(data, centers):
    """Sum over the rows of the squared distance to the nearest centre (one pass; CSR centres of CSR data
    through :func:`chunk_lower`, never densified)."""
    if sp.issparse(centers):
        if data.sparse:
            return chunk_lower(KMParChunk(data), S_.CenterBlock(centers, 0))
        centers = centers.toarray()
    labels = np.empty(data.n_samples, dtype=np.int32)
    partial = np.empty(data.n_samples, dtype=np.float64)
    data.assign(DenseOperator(np.ascontiguousarray(centers, dtype=data.dtype)), labels, partial)
    return float(data.sq_distances(partial).sum())


def run_seeding(seeding, data, n_clusters, rng, sparse_centers=False):
    """Seeds of one run (``seeding.init`` a string of :data:`SEEDINGS`).

    ``seconds`` times the seeding itself; seedings that do not know the
    potential of their result (random rows, k-means||, a sample) get it from
    one extra assignment pass, outside that time. With ``sparse_centers``
    (sparse data) the centres are CSR rows (the same values), and no seeding
    nor the extra pass forms a dense ``K x D`` array.
    """
    t0 = time.perf_counter()
    target = data
    if seeding.init_sample is not None and seeding.init != "random":
        rows = geometric_sample(data.n_samples, n_clusters * seeding.init_sample, rng)
        if rows.shape[0] < data.n_samples and len(distinct_row_indices(data.X[rows], stop_at=n_clusters)) == n_clusters:
            target = KMeansData(data.X[rows])
    cost = None
    sparse_centers = sparse_centers and data.sparse
    if seeding.init == "k-means++" and sparse_centers:
        chosen, cost = greedy_kmeanspp(target, n_clusters, rng, seeding.n_local_trials, rows_only=True)
        centers = target.X[chosen]
    elif seeding.init == "k-means++":
        centers, _, cost = greedy_kmeanspp(target, n_clusters, rng, seeding.n_local_trials, return_potential=True)
    elif seeding.init == "d2-seeding":
        centers, cost = d2_seeding(target, n_clusters, rng, seeding.d2_samples, seeding.d2_groups, sparse_centers)
    elif seeding.init == "k-means||":
        centers = kmeans_parallel([KMParChunk(target)], n_clusters, rng, seeding.oversampling_factor,
                                  seeding.init_rounds, n_local_trials=seeding.n_local_trials,
                                  sparse_centers=sparse_centers)
    else:
        centers = random_rows(target, n_clusters, rng, sparse_centers)[0]
    seconds = time.perf_counter() - t0
    if cost is None or target is not data:
        cost = potential(data, centers)
    if sparse_centers:
        centers = sp.csr_matrix(centers, dtype=data.dtype)  # CSR already: the dtype only
    return Seeds(centers, float(cost), seconds, seeding.init, target.n_samples)


def geometric_sample(n, size, rng):
    """Rows kept independently with probability ``p = size / n``, drawn by geometric skips (SystemML).

    The gap to the next kept row is ``ceil(log(u) / log(1 - p))`` for a
    uniform ``u`` in (0, 1), so only about ``size`` random numbers are drawn
    (in batches of ``size + 10 sqrt(size)``, SystemML's bound). ``p >= 1``
    keeps every row.

    Examples
    --------
    >>> rows = geometric_sample(100000, 500, np.random.RandomState(0))
    >>> 400 < rows.size < 600, bool(np.all(np.diff(rows) > 0))
    (True, True)
    """
    p = size / n
    if p >= 1:
        return np.arange(n, dtype=np.int64)
    batch = int(size + 10 * np.sqrt(size)) + 1
    log_q = np.log1p(-p)
    picked, last = [], -1
    while last < n:
        u = 1.0 - rng.uniform(size=batch)  # in (0, 1]
        gaps = np.maximum(np.ceil(np.log(u) / log_q), 1).astype(np.int64)
        pos = last + np.cumsum(gaps)
        picked.append(pos[pos < n])
        last = int(pos[-1])
    return np.concatenate(picked)


# --------------------------------------------------------------------------- #
# D^2-seeding
# --------------------------------------------------------------------------- #
def d2_seeding(data, n_clusters, rng, n_samples=None, groups="auto", sparse_centers=False):
    """D^2-seeding (see the module docstring).

    Parameters
    ----------
    data : KMeansData
    n_clusters : int
    rng : numpy.random.RandomState
    n_samples : int, default=None
        Points drawn per step (N); None gives ``10 * n_clusters``.
    groups : {"auto", "flat", "few", "tree", "k"} or int, default="auto"
        How the sample is clustered. "flat": K groups; "few" (or an int g):
        ``2 + floor(log2 K)`` (or g) groups; "auto": flat when that costs at
        most ``FLAT_BUDGET`` greedy k-means++ steps, else few; "tree": the heaviest
        leaf of a hierarchical k-means with K leaves. In all of these a
        sample point nearer to an existing centre than to every group joins
        none. "k": the supplement read literally, K groups that every sample
        point joins.
    sparse_centers : bool, default=False
        CSR data: the centres as CSR rows (never a ``K x D`` array).

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features), data dtype (CSR with ``sparse_centers``)
    potential : float
    """
    n = data.n_samples
    N = 10 * n_clusters if n_samples is None else int(n_samples)
    if groups == "auto":
        groups = "flat" if _flat_is_affordable(data, n_clusters, N) else "few"
    sparse_centers = sparse_centers and data.sparse
    centers = [] if sparse_centers else np.empty((n_clusters, data.n_features), dtype=data.dtype)
    closest = np.full(n, np.inf)
    nearest = np.zeros(n, dtype=np.int64)
    m = n_local_trials_for(n_clusters)
    ranks = None
    if data.sparse:
        order = np.argsort(-data.doc_freq, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0])
        ranks = (order, rank)
    for step in range(n_clusters):
        if step == 0:
            draws = rng.randint(n, size=N)
        else:
            cum = np.cumsum(closest)
            draws = np.minimum(np.searchsorted(cum, rng.uniform(size=N) * cum[-1]), n - 1)
        rows, counts = np.unique(draws, return_counts=True)
        sample = SampleLayout(data, rows, counts.astype(np.float64),
                         closest[rows] if groups != "k" else np.full(rows.shape[0], np.inf), ranks=ranks)
        best = [0.0, None, 0]  # weight, centre (transposed column), seed row of the heaviest group so far
        if groups == "tree":
            _heaviest_leaf(sample, n_clusters, m, rng, best)
        else:
            n_groups = {"k": n_clusters, "flat": n_clusters, "few": m}.get(groups, groups)
            _heaviest_leaf(sample, n_groups, n_groups, rng, best, recurse=False)
        center = sample.expand(best[1], data.n_features).astype(data.dtype)
        if not _lower_to_center(data, center, step, closest, nearest):
            # the mean helps no point (it sits on an existing centre): take the group's seed row
            center = _rows(data.X, np.array([rows[best[2]]]))[0]
            _lower_to_center(data, center, step, closest, nearest)
        if sparse_centers:
            centers.append(sp.csr_matrix(center[None, :]))
        else:
            centers[step] = center
    return (sp.vstack(centers, format="csr", dtype=data.dtype) if sparse_centers else centers), float(closest.sum())


def _flat_is_affordable(data, n_clusters, n_samples):
    """Whether clustering a sample into K groups costs at most FLAT_BUDGET greedy k-means++ steps.

    Flat clustering: about ``(1 + FLAT_ITERS) * K * (nonzeros of the sample +
    its width)`` multiply-adds (k-means++ seeds, then Lloyd iterations, each a
    pass over the sample per group plus the means). A greedy step: ``2 +
    floor(log2 K)`` candidates, each ``sum_t df_t^2 / n`` (the expected cost
    of a random row through the CSC copy; ``n * D`` for data without zeros).
    Both count the nonzeros of the data (``df_t``: rows with a nonzero in
    column t), so a dense array and its CSR copy decide alike.
    """
    n = data.n_samples
    if data.sparse:
        doc_freq, nnz = data.doc_freq, data.nnz
    else:
        doc_freq = np.count_nonzero(data.X, axis=0).astype(np.float64)
        nnz = float(doc_freq.sum())
    sample_nnz = n_samples * nnz / n
    flat = (1 + FLAT_ITERS) * n_clusters * (sample_nnz + min(data.n_features, sample_nnz))
    candidate = float(doc_freq @ doc_freq) / n
    return flat <= FLAT_BUDGET * n_local_trials_for(n_clusters) * candidate


def _lower_to_center(data, center, center_id, closest, nearest):
    """Lower the D^2 weights with one new centre; True if some row got strictly closer (now nearest to it)."""
    c = np.asarray(center, dtype=np.float64)
    X = data.X
    if data.sparse:
        S_.lower_to_center_sparse(X.data, X.indices, X.indptr, data.x_sq, c, float(c @ c), data.err_rel,
                                  center_id, closest, nearest)
    else:
        S_.lower_to_center_dense(X, c, center_id, closest, nearest)
    return bool(np.any(nearest == center_id))


def _cluster(sample, n_groups, rng):
    """Weighted k-means of a sample: seeds by k-means++ inside it, Lloyd until stable.

    D^2 for the seeds counts the existing centres (``sample.outside``); a
    point nearer to an existing centre than to every group joins none.
    Returns labels (-1: none), GT (width, g) group means, totals (g,), seeds.
    """
    u = sample.x_sq.shape[0]
    seeds = []
    dmin = sample.outside.copy()
    d = np.empty(u)
    buf = np.zeros(sample.width)
    for g in range(min(n_groups, u)):
        p = sample.weights if g == 0 else sample.weights * np.where(np.isfinite(dmin), dmin, 0.0)
        total = p.sum()
        if not total > 0:
            break
        seeds.append(int(rng.choice(u, p=p / total)))
        S_.sample_dots_to_row(*sample.arrays, sample.x_sq, seeds[-1], buf, d)
        np.minimum(dmin, d, out=dmin)
    GT = sample.transposed_rows(seeds)
    labels = np.full(u, -2, dtype=np.int64)
    new = np.empty(u, dtype=np.int64)
    totals = np.zeros(len(seeds))
    g_sq = np.einsum("ij,ij->j", GT, GT)
    for _ in range(SAMPLE_LLOYD_ITER):
        S_.sample_assign(*sample.arrays, sample.x_sq, GT, g_sq, sample.outside, new, d)
        if np.array_equal(new, labels):
            break
        labels[:] = new
        S_.sample_means(*sample.arrays, sample.weights, labels, GT, g_sq, totals)
    inside = labels >= 0
    sse = np.bincount(labels[inside], weights=(sample.weights * d)[inside], minlength=len(seeds))
    return labels, GT, totals, seeds, sse


def _heaviest_leaf(sample, target, n_groups, rng, best, recurse=True):
    """Split ``sample`` into ``min(n_groups, ceil(target))`` groups, each child into its share of
    ``target`` leaves, and so on; ``best`` = [weight, centre, seed row] of the heaviest leaf.

    Children are visited heaviest first and never when lighter than the best
    leaf so far (a leaf weighs at most its parent), so most of the tree is
    never built. ``recurse=False`` is a flat clustering into ``min(n_groups, target)`` groups.
    """
    labels, GT, totals, seeds, sse = _cluster(sample, int(min(n_groups, max(np.ceil(target), 1))), rng)
    for c in np.argsort(-totals, kind="stable"):
        if totals[c] <= best[0]:
            break
        members = np.flatnonzero(labels == c)
        share = target * sse[c] / sse.sum() if sse.sum() > 0 else 0.0
        if recurse and share > 1 and members.shape[0] > 1:
            _heaviest_leaf(sample.subset(members), share, n_groups, rng, best, recurse)
        else:  # a leaf
            best[:] = [totals[c], GT[:, c].copy(), int(sample.ids[seeds[c]])]
