"""The active columns of a wide factorisation (private; used by :mod:`qkm.factorization._lsq`).

On tf-idf data the target of a QK-means refit, ``W U`` (``K x D`` cluster
means), and the seeds (``K`` documents) touch a fraction of the ``D`` words.
In a column ``j`` where both the target and the last factor ``S_Q`` are zero,
every sweep leaves ``S_Q[:, j]`` at zero (the last factor's columns are
independent: its gradient and its least-squares solution there are zero, and
greedy orthogonal least squares gives it no atom), and that column adds
nothing to the products the inner factors see (``S_Q WT^T``, ``S_Q S_Q^T``).
So the factorisation can run on the *active* columns only (the nonzero
columns of the target and of the last factor) and put the last factor back in
place: the same factors (up to the order of floating-point sums) for work and
memory in the active count ``D'`` instead of ``D``. The budgets stay those of
the full shapes (the caller passes them).

The compressed path pays a gather of the target and a scatter of the last
factor; it runs when ``D' <= COMPRESS_MAX_FRACTION * D`` (the cost of a sweep
is linear in the number of columns, so below that fraction it saves more than
the copies cost), else the dense path runs. Which ran is reported to the caller
(``"columns"`` or ``"dense"``, QK-means records it in ``history_``).
"""

import numpy as np
import scipy.sparse as sp

__all__ = ["COMPRESS_MAX_FRACTION", "ColumnMap", "nonzero_columns"]

#: Run on the active columns when they are at most this fraction of all columns.
COMPRESS_MAX_FRACTION = 0.9


def nonzero_columns(M):
    """Boolean mask of the columns of ``M`` (ndarray or scipy sparse) holding a nonzero."""
    if sp.issparse(M):
        M = sp.csr_matrix(M)
        mask = np.zeros(M.shape[1], dtype=np.bool_)
        mask[M.indices[M.data != 0.0]] = True
        return mask
    return np.asarray(M != 0.0).any(axis=0)


class ColumnMap:
    """The active columns ``cols`` of an ``n_rows x n_cols`` problem, or all of them (``cols is None``).

    Parameters
    ----------
    mask : ndarray of bool, shape (n_cols,)
        Active columns.
    mode : {"auto", "columns", "dense"}
        "auto" compresses when the active columns are at most
        :data:`COMPRESS_MAX_FRACTION` of all; the others force a path.
    """

    def __init__(self, mask, mode="auto"):
        self.n_cols = int(mask.shape[0])
        n_active = int(np.count_nonzero(mask))
        compress = mode == "columns" or (mode == "auto" and n_active <= COMPRESS_MAX_FRACTION * self.n_cols)
        self.cols = np.flatnonzero(mask) if compress else None
        self.n_active = n_active if compress else self.n_cols
        self.path = "columns" if compress else "dense"

    @classmethod
    def of(cls, *matrices, mode="auto"):
        """The union of the nonzero columns of ``matrices`` (None entries ignored)."""
        mask = None
        for M in matrices:
            if M is None:
                continue
            m = nonzero_columns(M)
            mask = m if mask is None else mask | m
        return cls(mask, mode)

    def take(self, M):
        """``M[:, cols]`` as a dense float64 C-contiguous array (``M`` ndarray or sparse)."""
        if sp.issparse(M):
            M = sp.csr_matrix(M)
            sub = M if self.cols is None else M[:, self.cols]
            return np.ascontiguousarray(sub.toarray(), dtype=np.float64)
        M = np.asarray(M)
        sub = M if self.cols is None else M[:, self.cols]
        return np.ascontiguousarray(sub, dtype=np.float64)

    def put(self, Mc):
        """The full-width matrix whose active columns are ``Mc`` (CSR when compressed, else ``Mc`` itself)."""
        if self.cols is None:
            return Mc
        Mc = sp.csr_matrix(Mc)
        return sp.csr_matrix((Mc.data, self.cols[Mc.indices], Mc.indptr), shape=(Mc.shape[0], self.n_cols))
