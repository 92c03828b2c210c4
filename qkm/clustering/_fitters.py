"""The fitters of QK-means and low-rank k-means: how a structure is fitted to weighted means (private).

See :mod:`qkm.clustering._factored_lloyd` for the protocol (``initial``,
``refit``, ``operator``, ``describe`` and, optionally, ``keeps_sparse``).
"""

import numpy as np
import scipy.sparse as sp

from ..operator._chain_calibration import ChainCalibration
from ..factorization._factorize import factorize_weighted, lsq_refit, sparse_target, wide_target
from ..factorization._shapes import MANY_CLUSTERS, factor_budgets
from ..factorization._shapes import chain_shapes
from ..operator import FactorChainOperator

__all__ = ["DENSE_POLISH_SWEEPS", "DENSE_WARM_SWEEPS", "SPARSE_POLISH_SWEEPS", "SPARSE_WARM_SWEEPS"]


def _weighted_sq_error(U, V, weights):
    diff = (U - V) * weights[:, None]
    return float(np.einsum("ij,ij->", diff, diff))


def _training_operator(factors, dtype, previous, mean=None):
    """The chain for a training step: timings reused from ``previous``, bit-identical paths only.

    Excluding the BLAS-rounded dense path makes a fit reproducible from
    ``random_state`` whatever the measured timings choose.
    """
    calibration = previous.calibration if previous is not None else ChainCalibration(bit_identical=True)
    return FactorChainOperator(factors, dtype=dtype, calibration=calibration, mean=mean)


#: Least-squares sweeps per warm refit and in the final polish when ``palm_warm_iter`` / ``palm_max_iter`` are
#: None, for dense targets and for sparse ones (wide sparse data, qkm.factorization._lsq_sparse; see
#: docs/decisions.md, 'Sweeps per refit').
DENSE_WARM_SWEEPS, DENSE_POLISH_SWEEPS = 10, 300
SPARSE_WARM_SWEEPS, SPARSE_POLISH_SWEEPS = 1, 3

#: Sweeps of a warm refit that move the supports (greedy OLS) when ``K > D``: the first only; the others
#: solve the values on them. At K = 1,024 on Fashion-MNIST a refit costs 3 s instead of 18 s and the fit ends
#: at 1.09x K-means' objective (docs/decisions.md, 'Many clusters'). ``K <= D`` moves them in every sweep.
MANY_CLUSTERS_SUPPORT_SWEEPS = 1

#: From this many clusters on, QK-means' first chain fits the means of the seeds' clusters (one assignment with
#: the dense seeds) instead of the seeds: Fashion-MNIST K = 256: 1.13x K-means' objective instead of 1.22x;
#: K = 64 (the paper's protocol, 20 iterations): 1.088x instead of 1.065x, hence not below (docs/decisions.md,
#: 'Seed assignment').
SEED_ASSIGN_MIN_CLUSTERS = MANY_CLUSTERS


# --------------------------------------------------------------------------- #
# Fitters: how a structure is fitted to weighted means (see _factored_lloyd)
# --------------------------------------------------------------------------- #
class _ChainFitter:
    """``V = lam S_1 ... S_Q``, factor ``q`` keeping at most its budget (:func:`factor_budgets`, ``budget_split``).

    The seeds are factorised by :func:`qkm.factorization._factorize.factorize_weighted` (hierarchical
    palm4MSA, then least-squares sweeps within the budgets); every refit runs
    ``max_iter`` least-squares sweeps warm from the current factors, each
    factor solved exactly on a support chosen afresh (greedy orthogonal least
    squares under the budget for the first and last factor, the support of a
    projected gradient step for the inner ones) and kept only if the weighted
    error goes down (:mod:`qkm.factorization._lsq`), rather than PALM's single gradient
    step per factor, which rarely moves a support (see docs/decisions.md, 'Least-squares sweeps').
    """

    #: Least-squares sweeps on the seeds after the hierarchical start.
    INIT_SWEEPS = 0

    @staticmethod
    def assigns_seeds(n_clusters):
        """Whether the Lloyd loop first assigns with the (dense) seeds and fits the first chain to their
        clusters' means, weighted by the cluster sizes, rather than to the seeds: from
        :data:`SEED_ASSIGN_MIN_CLUSTERS` clusters on (dense means only; docs/decisions.md, 'Seed assignment')."""
        return n_clusters >= SEED_ASSIGN_MIN_CLUSTERS

    def __init__(self, n_factors, sparsity_level, warm_iter, tol, budget_split="even"):
        self.n_factors = n_factors
        self.budget_split = budget_split
        self.sparsity_level = sparsity_level
        self.warm_iter = warm_iter
        self.tol = tol
        self.budgets = None

    def initial(self, U, rng, weights=None):
        K, D = U.shape
        self.budgets = factor_budgets(chain_shapes(K, D, self.n_factors), self.sparsity_level, self.budget_split)
        return factorize_weighted(U, weights, self.n_factors, self.sparsity_level, self.INIT_SWEEPS, self.tol,
                         budget_split=self.budget_split)

    def keeps_sparse(self, n_clusters, n_features):
        """Whether the Lloyd loop keeps the means of sparse data as CSR (wide data: see ``wide_target``)."""
        return wide_target(n_features, self.n_factors)

    def refit(self, U, weights, state, max_iter, polish=False):
        # on the active columns of U and of the last factor only (qkm.factorization._columns), and with U kept
        # sparse when it is (qkm.factorization._lsq_sparse): there the supports move in the first sweep only
        sparse = sparse_target(U, self.n_factors)
        if max_iter is None:
            max_iter = (SPARSE_POLISH_SWEEPS if sparse else DENSE_POLISH_SWEEPS) if polish else \
                (SPARSE_WARM_SWEEPS if sparse else DENSE_WARM_SWEEPS)
        support_iter = self.support_sweeps(U.shape, sparse, max_iter)
        state = lsq_refit(U, weights, list(state.factors), state.lam, self.budgets, max_iter, self.tol,
                          support_iter, target="sparse" if sparse else "dense")
        state.support_iter = support_iter
        return state, state.objective, state.start_objective

    @staticmethod
    def support_sweeps(shape, sparse, max_iter):
        """Sweeps of a refit that move the supports: the first only for sparse means or ``K > D``, else all."""
        if sparse:
            return 1
        return min(MANY_CLUSTERS_SUPPORT_SWEEPS, max_iter) if shape[0] > shape[1] else max_iter

    def factors(self, state):
        """Factors with the scale folded into the first one."""
        return [state.lam * state.factors[0]] + list(state.factors[1:])

    def operator(self, state, dtype, previous, mean=None):
        return _training_operator(self.factors(state), dtype, previous, mean)

    def describe(self, state):
        out = {"nnz": int(sum(_count_nonzero(f) for f in state.factors)), "columns": state.path,
               "n_columns": int(state.n_columns), "target": state.target, "sweeps": int(state.n_iter)}
        if state.start:
            out["start"] = state.start
            out["shapes"] = [list(f.shape) for f in state.factors]
            out["budgets"] = [int(k) for _, k in self.budgets]
            out["budget_split"] = self.budget_split
        if getattr(state, "support_iter", None) is not None:
            out["support_sweeps"] = int(state.support_iter)
        return out


def _count_nonzero(f):
    return int(np.count_nonzero(f.data)) if sp.issparse(f) else int(np.count_nonzero(f))


class _LowRankFitter:
    """``V = P Q`` with ``P`` of shape (K, r) and ``Q`` of shape (r, D), fitted by truncated SVD."""

    warm_iter = 1

    def __init__(self, rank):
        self.rank = rank

    def _fit(self, U, weights):
        r = min(self.rank, *U.shape)
        M = U * weights[:, None]
        left, sing, right = np.linalg.svd(M, full_matrices=False)
        Q = right[:r]
        P = np.empty((U.shape[0], r))
        positive = weights > 0
        P[positive] = left[positive, :r] * sing[:r] / weights[positive, None]
        P[~positive] = U[~positive] @ Q.T  # rows that do not count: their projection on the basis
        return P, Q

    def initial(self, U, rng):
        return self._fit(U, np.ones(U.shape[0]))

    def refit(self, U, weights, state, max_iter, polish=False):
        P, Q = self._fit(U, weights)
        before = np.inf if state is None else _weighted_sq_error(U, state[0] @ state[1], weights)
        return (P, Q), _weighted_sq_error(U, P @ Q, weights), before

    def factors(self, state):
        return [state[0], state[1]]

    def operator(self, state, dtype, previous, mean=None):
        return _training_operator(self.factors(state), dtype, previous, mean)

    def describe(self, state):
        return {"nnz": int(state[0].size + state[1].size)}
