"""Lloyd iterations with a structured centroid matrix (QK-means, low-rank k-means).

Algorithm 1 of the QuickK-means paper: assign every point with the current
centroid operator ``V``; recompute the cluster means ``U`` and sizes ``n_k``;
refit ``V`` to ``diag(sqrt(n_k)) U`` under the structure (sparse factors, or
a rank). For fixed labels the k-means objective splits exactly as

    sum_i ||x_i - v_{l_i}||^2 = [sum_i ||x_i||^2 - sum_k n_k ||u_k||^2] + sum_k n_k ||u_k - v_k||^2,

so the refit minimises the k-means objective for the current labels. Both
steps are recorded in the objective history; a refit that would raise the
objective is discarded (best-iterate guard), and an empty cluster is given a
far point only when that lowers the objective (a structure fitted to a
one-point cluster may not follow it), so the history never increases (up to
the rounding of the assignment in the operator's precision).

A *fitter* supplies the structure: ``initial(U, rng)`` gives a state,
``refit(U, weights, state, max_iter, polish)`` a new state (``max_iter`` None: the
fitter's own count, which may differ for the polish), its weighted error
``||W(U - V)||_F^2`` and that of the given state (the guard compares them:
no dense ``V`` is formed here), ``operator(state, dtype, previous, mean)`` the
:class:`~qkm.operator.CentroidOperator`, and ``describe(state)`` a dict for
the log.

Data passes. The loop never touches the rows itself: a *data pass* does
(:class:`InMemoryPass` here, :class:`qkm.distributed._factored.ShardPass` over
shards on a Dask cluster, so both paths run this one loop):

- ``x_sq_total()``: ``sum_i ||x_i||^2`` in the fixed block-tree order;
- ``assign(operator)``: labels of every row with the operator, kept by the
  pass; returns ``(objective, labels changed, info)``, ``info`` a dict for
  the log (the execution path that ran, and so on);
- ``means(U, repair, counts)``: the cluster means of those labels (rows of
  empty clusters kept from ``U``; with ``repair`` an empty cluster takes the
  point farthest from its centre, as :func:`qkm._empty.relocate_empty_clusters`),
  ``counts`` (OUT) the sizes after the repair; returns ``(U_new, relocated)``
  (``U`` may be overwritten when no cluster is empty: one K x D buffer; a CSR
  ``U`` gives CSR means, see below);
- ``refit_done(relocated)``: the means just kept (unless ``relocated``) are
  those of the current labels (the in-memory pass then recomputes only the
  clusters whose members change);
- ``labels()``: the labels of the last assignment.

The guard needs no pass of its own: the objective of a refit is the closed
form above, from the sums ``x_sq_total``, the means and the counts.

Wide sparse data. When the pass holds sparse rows (``sparse_rows``), no
``mean`` is kept and the fitter ``keeps_sparse(K, D)`` (QK-means: at least
2,048 columns, :func:`qkm.factorization._factorize.wide_target`, the width rule
of the sparse sweeps), the seeds and the means stay CSR from the sparse rows
through the refit, the guard (norms from the nonzeros) and the empty-cluster
repair (:meth:`qkm._data.KMeansData.update_csr`): no dense ``K x D`` buffer.
The values are those of the dense means (the same bits); the refit and polish
records say which ran (``means``: "csr" or "dense").

Centring. With a ``mean`` ``mu`` the centroids are ``mu + V``: the fitter only
ever sees centred means ``U - mu`` (the structure is spent on what the
clusters do not share), the operator keeps ``mu`` beside the chain, and the
data themselves are never centred (sparse data stay sparse).
"""

import time

import numpy as np
import scipy.sparse as sp

from ..operator import DenseOperator
from ._stopping import IterationLog

__all__ = ["factored_lloyd", "InMemoryPass", "keeps_csr_means"]


def keeps_csr_means(fitter, sparse_rows, mean, n_clusters, n_features):
    """Whether the loop keeps the seeds and means as CSR: sparse rows, no mean kept beside the structure, and a
    fitter that keeps them sparse (``keeps_sparse``: wide data). Then no dense ``K x D`` array is ever formed."""
    return mean is None and bool(sparse_rows) and getattr(fitter, "keeps_sparse", lambda k, d: False)(
        n_clusters, n_features)


class InMemoryPass:
    """The data pass of an in-memory fit (see the module docstring): labels and partials held here.

    Parameters
    ----------
    data : KMeansData
        IN  validated data.
    """

    def __init__(self, data):
        self.data = data
        n = data.n_samples
        self._labels = np.zeros(n, dtype=np.int32)
        self._labels_old = np.full(n, -1, dtype=np.int32)
        self._partial = np.empty(n, dtype=np.float64)
        self._means_of = None  # labels whose exact means the last kept U holds (None: not such means)
        self.sparse_rows = data.sparse

    n_samples = property(lambda self: self.data.n_samples)
    n_features = property(lambda self: self.data.n_features)
    dtype = property(lambda self: self.data.dtype)

    def x_sq_total(self):
        return self.data.total(self.data.x_sq)

    def assign(self, operator):
        data = self.data
        data.assign(operator, self._labels, self._partial)
        objective = data.total(data.sq_distances(self._partial))
        changed = int((self._labels != self._labels_old).sum())
        self._labels_old[:] = self._labels
        return objective, changed, {"path": operator.execution_path(data.n_samples)}

    def means(self, U, repair, counts):
        data = self.data
        if sp.issparse(U):      # wide sparse data: CSR means from the sparse rows, no K x D buffer
            return data.update_csr(self._labels, U, lambda: data.sq_distances(self._partial), counts=counts,
                                   repair=repair)
        # in place unless a cluster is empty (then U is left as it was for a retry without the repair)
        U_new, _, _, relocated = data.update(self._labels, U, lambda: data.sq_distances(self._partial),
                                             self._means_of, counts=counts, repair=repair)
        return U_new, relocated

    def refit_done(self, relocated):
        self._means_of = None if relocated else self._labels.copy()

    def labels(self):
        return self._labels


def _row_sq_norms(U):
    """``||u_k||^2`` of an ndarray or of a CSR matrix (from its nonzeros)."""
    if not sp.issparse(U):
        return np.einsum("ij,ij->i", U, U)
    return np.bincount(np.repeat(np.arange(U.shape[0]), np.diff(U.indptr)), weights=U.data * U.data,
                       minlength=U.shape[0])


def factored_lloyd(data, centers_init, fitter, *, max_iter, tol, rng, polish_iter, log=None, mean=None):
    """Run QK-means style Lloyd iterations from ``centers_init``.

    Parameters
    ----------
    data : KMeansData or data pass
        IN  validated data (run through an :class:`InMemoryPass`), or a data
        pass (see the module docstring).
    centers_init : ndarray or CSR matrix of shape (n_clusters, n_features)
        IN  initial centres (seeds), factorised by ``fitter.initial`` (CSR seeds
        stay CSR on the CSR path, :func:`keeps_csr_means`).
    fitter : object
        The centroid structure (see the module docstring).
    max_iter : int
        Assignment + refit rounds.
    tol : float
        Stop when the objective decreased by at most ``tol`` times its value
        over one round, or when the labels did not change.
    rng : numpy.random.RandomState
    polish_iter : int or None
        Refit iterations of the final polish (0: none; None: the fitter's choice). The polish is guarded
        like every refit and followed by a last assignment.
    log : IterationLog, default=None
    mean : ndarray of shape (n_features,), default=None
        Kept beside the structure (see the module docstring); rounded to the
        data's precision first, so training and the operator use the same one.

    Returns
    -------
    result : dict
        labels (what the pass's ``labels()`` gives), inertia, state, operator,
        n_iter, objective_history
    """
    passes = data if hasattr(data, "refit_done") else InMemoryPass(data)
    k = centers_init.shape[0]
    log = log if log is not None else IterationLog(0)
    x_sq_total = float(passes.x_sq_total())
    if mean is not None:
        mean = np.asarray(mean, dtype=passes.dtype).astype(np.float64)

    def centred(U64):
        return U64 if mean is None else U64 - mean

    # wide sparse data: the means (and the seeds) stay CSR from the sparse rows to the refit (no K x D buffer)
    csr = keeps_csr_means(fitter, getattr(passes, "sparse_rows", False), mean, k, passes.n_features)
    U = sp.csr_matrix((k, passes.n_features), dtype=np.float64) if csr else \
        np.zeros((k, passes.n_features), dtype=passes.dtype)
    counts = np.zeros(k, dtype=np.int64)
    t0 = time.perf_counter()
    if getattr(fitter, "assigns_seeds", lambda n: False)(k) and not csr:
        # one assignment with the seeds themselves: the first structure fits the means of their clusters,
        # not single rows (docs/decisions.md, 'Seed assignment')
        seed_op = DenseOperator(np.ascontiguousarray(centers_init, dtype=passes.dtype))
        obj_seed, _, info = passes.assign(seed_op)
        U, relocated = passes.means(U, True, counts)
        passes.refit_done(relocated)
        log.record(-1, step="seed-assign", objective=obj_seed, relocated=relocated,
                   seconds=time.perf_counter() - t0, **info)
        t0 = time.perf_counter()
        state = fitter.initial(centred(np.asarray(U, dtype=np.float64)), rng, np.sqrt(counts.astype(np.float64)))
    else:
        seeds = sp.csr_matrix(centers_init, dtype=np.float64) if csr else np.asarray(centers_init, dtype=np.float64)
        state = fitter.initial(centred(seeds), rng)
    operator = fitter.operator(state, passes.dtype, None, mean)
    log.record(-1, step="init", objective=None, seconds=time.perf_counter() - t0, **fitter.describe(state))
    history = []
    n_iter = 0
    objective_prev = np.inf
    tried = {}

    def attempt(U, max_palm, polish):
        """A guarded refit to the means ``U``: ``(objective, kept, new state or None, before, after)``."""
        U64 = U if sp.issparse(U) else np.asarray(U, dtype=np.float64)
        weights = np.sqrt(counts.astype(np.float64))
        within = x_sq_total - float(counts @ _row_sq_norms(U64))
        new_state, after, before = fitter.refit(centred(U64), weights, state, max_palm, polish)
        tried.clear()
        tried.update(fitter.describe(new_state))    # what ran, kept or not (e.g. the columns path)
        tried["means"] = "csr" if sp.issparse(U64) else "dense"
        kept = after <= before
        return within + min(after, before), kept, new_state if kept else None, before, after

    def refit(objective_now, max_palm, polish=False):
        """Means then a guarded refit; returns ``(objective, kept, relocated, before, after)``.

        An empty cluster is given the point farthest from its centre, unless the
        structure cannot follow that point well enough to lower the objective
        (a one-point cluster weighs little in the fit): then it stays empty.
        """
        nonlocal U, state, operator
        U_prev = U
        U, relocated = passes.means(U_prev, True, counts)
        if not relocated:
            U_prev = None       # only a retry without the repair needs the old means: one K x D buffer less
        result = attempt(U, max_palm, polish)
        if relocated and result[0] > objective_now:
            U, _ = passes.means(U_prev, False, counts)
            result, relocated = attempt(U, max_palm, polish), 0
        passes.refit_done(relocated)
        objective, kept, new_state, before, after = result
        if kept:
            state = new_state
            operator = fitter.operator(state, passes.dtype, operator, mean)
        return objective, kept, relocated, before, after

    for it in range(max_iter):
        n_iter = it + 1
        t0 = time.perf_counter()
        obj_assign, changed, info = passes.assign(operator)
        history.append(obj_assign)
        t1 = time.perf_counter()
        log.record(it, step="assign", objective=obj_assign, changed=changed, seconds=t1 - t0, **info)
        if changed == 0:
            break
        obj_refit, kept, relocated, before, after = refit(obj_assign, fitter.warm_iter)
        history.append(obj_refit)
        log.record(it, step="refit", objective=obj_refit, kept=kept, relocated=relocated,
                   seconds=time.perf_counter() - t1, **tried)
        converged = objective_prev - obj_refit <= tol * obj_refit
        objective_prev = obj_refit
        if converged:
            break

    if polish_iter is None or polish_iter > 0:
        t1 = time.perf_counter()
        obj_polish, kept, relocated, _, _ = refit(history[-1], polish_iter, polish=True)
        history.append(obj_polish)
        log.record(n_iter - 1, step="polish", objective=obj_polish, kept=kept, relocated=relocated,
                   seconds=time.perf_counter() - t1, **tried)
    t1 = time.perf_counter()
    inertia, _, info = passes.assign(operator)
    history.append(inertia)
    log.record(n_iter - 1, step="final-assign", objective=inertia, seconds=time.perf_counter() - t1, **info)
    return dict(labels=passes.labels(), inertia=inertia, state=state, operator=operator, n_iter=n_iter,
                objective_history=np.asarray(history, dtype=np.float64))
