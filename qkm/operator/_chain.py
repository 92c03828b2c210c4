"""Centroids as a product of sparse factors, ``V = S_1 S_2 ... S_Q`` (QK-means).

:class:`FactorChainOperator` implements :class:`qkm.operator.CentroidOperator`
for a chain of sparse factors. Assignment can run three ways, and the fastest
one for each batch size is chosen by *measured wall time*:

``fused-sample`` / ``fused-block``
    numba kernels over the packed chain with the argmin fused into the last
    factor (:mod:`qkm.operator._chain_kernels`, :mod:`qkm.operator._chain_block_kernels`): per sample for tiny batches, in
    blocks of 64 samples (parallel over blocks) for larger ones.
``scipy``
    CSR products applied right to left to ``X^T``.
``dense``
    The folded ``V`` through BLAS (dense batches) or through
    :class:`qkm.operator.DenseOperator` (CSR batches).

A small ``V`` (at most ``qkm._config.FOLD_MAX_BYTES`` in float64) is folded at
construction and its row norms taken from it. A larger one is folded only when
the dense path is timed or chosen, or :meth:`FactorChainOperator.to_dense` is
called, and dropped again when the measured choice does not use it; its norms
come from a streaming pass over the chain (same values up to rounding), or are
given (``norms=``, as the distributed workers get them with the factors).
Training operators (bit-identical calibration) never take the dense path, so a
wide QK-means fit never holds a folded ``V``.

All paths compute ``argmin_k (||v_k||^2 - 2 x.v_k)`` with the lowest index on
ties; the fused and scipy paths add the products of every factor row in the
same order, so they agree bit for bit (the dense path rounds like BLAS).

Examples
--------
>>> import numpy as np
>>> from qkm.operator import FactorChainOperator
>>> S1 = np.array([[1.0, 0.0], [0.0, 2.0]])
>>> S2 = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
>>> op = FactorChainOperator([S1, S2], path="fused")
>>> op.to_dense()
array([[0., 1., 0.],
       [2., 0., 2.]])
>>> op.assign(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]))[0].tolist()
[0, 1]
>>> op.nnz, op.flops, op.n_clusters, op.n_features
(5, 10, 2, 3)
"""

import time

import numba
import numpy as np
import scipy.sparse as sp

from . import _chain_block_kernels as CB
from . import _chain_kernels as CK
from .. import _config
from ._chain_calibration import PATHS, ChainCalibration, bucket_of, measure
from ._chain_layout import check_factors, check_mean, fold, pack, row_norms
from ._base import CentroidOperator, DenseOperator

__all__ = ["FactorChainOperator"]

#: Samples per block of the blocked kernel.
BLOCK_WIDTH = 64


#: Parallel blocked kernel: work units per thread (each allocates its buffers once).
CHUNKS_PER_THREAD = 2

#: Forcing "fused": batches of at most this many rows use the per-sample kernel.
SAMPLE_KERNEL_MAX_ROWS = 4


class FactorChainOperator(CentroidOperator):
    """Centroids ``V = S_1 S_2 ... S_Q`` kept as sparse factors.

    Parameters
    ----------
    factors : list of {ndarray, scipy.sparse matrix}
        ``[S_1, ..., S_Q]`` with shapes ``(K, A_1), (A_1, A_2), ..., (A_{Q-1}, D)``.
    dtype : {np.float32, np.float64}, default=None
        Storage and accumulation precision; default float32 if every factor
        is float32, else float64.
    calibration : ChainCalibration or FactorChainOperator, default=None
        Measurements to reuse (see :class:`ChainCalibration`); the QK-means
        trainer passes the previous iteration's operator so paths are timed
        once, not every iteration.
    path : {"auto", "fused", "fused-sample", "fused-block", "scipy", "dense"}, default="auto"
        Execution path; "auto" measures (see :meth:`force_path`).
    mean : array-like of shape (n_features,), default=None
        A vector ``mu`` added to every centroid: ``V = mu + S_1 ... S_Q``
        (a model fitted on centred data keeps the data mean here). The chain
        paths use ``argmin_k (||w_k||^2 + 2 mu.w_k - 2 x.w_k)`` (no ``x.mu`` for
        the labels; sparse samples stay sparse) and add ``||mu||^2 - 2 x.mu``
        for the distances.
    norms : tuple of two ndarrays of shape (n_clusters,), default=None
        :attr:`norms` of an operator of the same factors, dtype and mean:
        taken as they are (no pass over the chain, no fold; the distributed
        workers get them with the factors). ``V`` is then folded only when a
        path or :meth:`to_dense` needs it.

    Attributes
    ----------
    factors : list of scipy.sparse.csr_matrix
        The factors, of ``dtype``, explicit zeros removed, indices sorted.
    n_clusters, n_features : int
    dtype : numpy dtype
    c_sq : ndarray of shape (n_clusters,), float64
        ``||v_k||^2`` from ``V`` folded in float64 (mean included).
    mean : ndarray of shape (n_features,) of ``dtype``, or None
    calibration : ChainCalibration
    timings_ : dict
        What was measured and chosen (``calibration.entries``).
    """

    def __init__(self, factors, dtype=None, calibration=None, path="auto", mean=None, norms=None):
        self.factors = check_factors(factors, dtype)
        self.dtype = self.factors[0].dtype
        self.n_clusters = self.factors[0].shape[0]
        self.n_features = self.factors[-1].shape[1]
        self.mean = check_mean(mean, self.n_features, self.dtype)
        self._nnz = int(sum(f.nnz for f in self.factors))
        self._meta, self._ptr, self._idx, self._val = pack(self.factors, self.dtype)
        if self.mean is not None:
            self._mu64 = self.mean.astype(np.float64)
            self._mu_sq = float(self._mu64 @ self._mu64)
        # A small V is folded now (its norms from the folded rows); a large one only when a
        # path or to_dense() needs it, its norms from a streaming pass (never a K x D buffer).
        self._lazy = norms is not None or self.n_clusters * self.n_features * 8 > _config.FOLD_MAX_BYTES
        self._V = None
        if norms is not None:
            self.c_sq, chain_norms = (np.array(a, dtype=np.float64).reshape(self.n_clusters) for a in norms)
        elif self._lazy:
            sq, dots = row_norms(self._meta, self._ptr, self._idx, self._val, self.n_clusters, self.n_features,
                                 None if self.mean is None else self._mu64)
            chain_norms = self.c_sq = sq
            if self.mean is not None:       # the chain holds W = V - mu: adjusted norms ||w||^2 + 2 mu.w
                chain_norms = sq + 2.0 * dots
                self.c_sq = chain_norms + self._mu_sq
        else:
            V64 = self._fold64()
            chain_norms = self.c_sq = np.einsum("ij,ij->i", V64, V64)
            if self.mean is not None:
                chain_norms = np.einsum("ij,ij->i", V64, V64) + 2.0 * (V64 @ self._mu64)
                V64 += self._mu64
                self.c_sq = np.einsum("ij,ij->i", V64, V64)
            self._V = V64 if self.dtype == np.float64 else np.ascontiguousarray(V64, dtype=self.dtype)
            del V64
        self._chain = (self._meta, self._ptr, self._idx, self._val, chain_norms)
        self._small_paths = {}  # (n, sparse) -> path, for batches of at most 16 rows
        self._dense_op = None
        if isinstance(calibration, FactorChainOperator):
            calibration = calibration.calibration
        signature = self._signature()
        if calibration is None or not calibration.accepts(signature):
            bit_identical = calibration is not None and calibration.bit_identical
            calibration = ChainCalibration(bit_identical=bit_identical)
        if calibration.signature is None:
            calibration.signature = signature
        self.calibration = calibration
        self._forced = None
        self._last_sparse = False
        self.force_path(path)

    # -- CentroidOperator -------------------------------------------------- #
    @property
    def nnz(self):
        return self._nnz

    @property
    def n_factors(self):
        return len(self.factors)

    @property
    def timings_(self):
        return self.calibration.entries

    def to_dense(self):
        """The folded ``V`` (mean included) of ``dtype``; kept once built (see :attr:`holds_dense`)."""
        if self._V is None:
            V64 = self._fold64()
            if self.mean is not None:
                V64 += self._mu64
            self._V = V64 if self.dtype == np.float64 else np.ascontiguousarray(V64, dtype=self.dtype)
        return self._V

    @property
    def norms(self):
        """``(c_sq, chain_norms)``: ``||v_k||^2`` and what the chain paths add (``||w_k||^2 + 2 mu.w_k``); see ``norms=``."""
        return self.c_sq, self._chain[-1]

    @property
    def holds_dense(self):
        """Whether the operator holds the folded ``V`` now (a large ``V`` only while a chosen path uses it)."""
        return self._V is not None

    def _fold64(self):
        return fold(self._meta, self._ptr, self._idx, self._val, self.n_clusters, self.n_features)

    def _release_dense(self):
        """Drop a lazily folded ``V`` unless a measured choice uses it."""
        if self._lazy and not any(e["path"] == "dense" for e in self.calibration.entries.values()):
            self._V = None
            self._dense_op = None

    def apply(self, X):
        """``X @ V.T`` as an (n, n_clusters) array of ``dtype``: the CSR chain or the folded ``V``, whichever is measured faster.

        The full product (Nyström features, index probes, ``sq_distances``)
        has two paths: the CSR factors applied right to left ("scipy") and one
        BLAS product with the folded ``V`` ("dense"). The first batch of each
        batch-size bucket times both and the faster is kept
        (``describe()["execution_paths"]``, keys ``apply:...``). With a
        bit-identical calibration (training) only the chain is used.
        """
        X = self._prepare(X)
        n = X.shape[0]
        if n == 0:
            return np.zeros((0, self.n_clusters), dtype=self.dtype)
        if self._apply_path(n, sp.issparse(X), X) == "dense":
            return self._dense_apply(X)
        out = np.ascontiguousarray(self._scipy_dots(X).T)
        if self.mean is not None:
            out += self._mean_dots(X)[:, None].astype(self.dtype)
        return out

    def _dense_apply(self, X):
        out = X @ self.to_dense().T
        return np.ascontiguousarray(out, dtype=self.dtype)

    def _apply_path(self, n, sparse, X):
        if self._forced in ("scipy", "dense"):
            return self._forced
        if self._forced is not None or self.calibration.bit_identical:
            return "scipy"
        name, _, n_timed, _ = bucket_of(n)
        key = "apply:" + self._key(name, sparse)
        entry = self.calibration.entries.get(key)
        if entry is None:
            X = X[:min(n, n_timed)]
            t0 = time.perf_counter()
            seconds = measure({"scipy": lambda: self._scipy_dots(X), "dense": lambda: self._dense_apply(X)})
            m = X.shape[0]
            per_row = {c: t / m for c, t in seconds.items()}
            entry = {"path": min(per_row, key=per_row.get), "seconds_per_row": per_row, "rows_timed": int(m),
                     "threads": numba.get_num_threads(), "timing_seconds": time.perf_counter() - t0}
            self.calibration.entries[key] = entry
            self._release_dense()
        return entry["path"]

    def partials(self, X, labels, partial_best):
        n = X.shape[0]
        if n == 0:
            return
        if not (type(X) is np.ndarray and X.dtype == self.dtype and X.flags.c_contiguous):
            X = self._prepare(X)
        elif X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X has shape {X.shape}; expected (n_samples, {self.n_features})")
        sparse = self._last_sparse = type(X) is not np.ndarray
        path = self._small_paths.get((n, sparse)) if n <= 16 else None
        if path is None:
            path = self._path_for(n, sparse, X)
            if n <= 16:
                self._small_paths[n, sparse] = path
        direct = (labels.dtype == np.int32 and partial_best.dtype == np.float64
                  and labels.flags.c_contiguous and partial_best.flags.c_contiguous)
        if path == "fused-sample" and direct and not sparse:  # the latency path: one jitted call
            CK.chain_sample_dense(X, *self._chain, labels, partial_best)
            if self.mean is not None:
                partial_best += self._mean_offsets(X)
            return
        lab, best = (labels, partial_best) if direct else (np.empty(n, dtype=np.int32), np.empty(n))
        self._run(path, X, lab, best)
        if not direct:
            labels[:] = lab
            partial_best[:] = best

    def _small_partials(self, X, labels, partial_best):
        # X is C-contiguous, of this dtype and width (CentroidOperator.labels_small): straight to the
        # per-sample kernel when that is the path measured for this size
        if self._small_paths.get((X.shape[0], False)) == "fused-sample":
            self._last_sparse = False
            CK.chain_sample_dense(X, *self._chain, labels, partial_best)
            if self.mean is not None:
                partial_best += self._mean_offsets(X)
            return
        self.partials(X, labels, partial_best)

    def execution_path(self, n_samples, sparse=None):
        """Path used for a batch of ``n_samples`` rows, dense or CSR (``sparse``).

        ``sparse=None`` means the kind of the last batch given to
        :meth:`partials` (dense if none yet). Measures the candidates on a
        synthetic batch first if that batch-size bucket has not been timed
        yet; "none" for an empty batch.
        """
        if n_samples == 0:
            return "none"
        sparse = self._last_sparse if sparse is None else bool(sparse)
        return self._path_for(int(n_samples), sparse, None)

    # -- path control ------------------------------------------------------ #
    def force_path(self, path):
        """Use ``path`` for every batch ("auto" or None: the measured choice)."""
        self._small_paths = {}
        if path is None or path == "auto":
            self._forced = None
            return
        if path not in PATHS + ("fused",):
            raise ValueError(f"unknown path {path!r}; expected 'auto', 'fused' or one of {PATHS}")
        self._forced = path

    @property
    def forced_path(self):
        return self._forced

    def calibrate(self, n_samples, sparse=False, X=None):
        """Time the candidate paths for the bucket of ``n_samples`` (on ``X`` or synthetic rows)."""
        name, _, n_timed, candidates = bucket_of(n_samples)
        if self.calibration.bit_identical:
            candidates = tuple(c for c in candidates if c != "dense")
        self._small_paths = {}
        if X is None:
            X = self._synthetic(min(n_samples, n_timed), sparse)
        else:
            X = X[:min(X.shape[0], n_timed)]
        t0 = time.perf_counter()
        seconds = measure({c: self._runner(c, X) for c in candidates})
        m = X.shape[0]
        per_row = {c: s / m for c, s in seconds.items()}
        entry = {
            "path": min(per_row, key=per_row.get),
            "seconds_per_row": per_row,
            "rows_timed": int(m),
            "threads": numba.get_num_threads(),
            "timing_seconds": time.perf_counter() - t0,
        }
        self.calibration.entries[self._key(name, sparse)] = entry
        self._release_dense()
        return entry

    def describe(self):
        out = super().describe()
        out["n_factors"] = self.n_factors
        out["factor_shapes"] = [list(f.shape) for f in self.factors]
        out["execution_paths"] = {k: e["path"] for k, e in self.calibration.entries.items()}
        out["holds_dense"] = self.holds_dense
        return out

    # -- internals --------------------------------------------------------- #
    def _signature(self):
        return {"n_clusters": self.n_clusters, "n_features": self.n_features, "dtype": np.dtype(self.dtype).name,
                "n_factors": self.n_factors, "nnz": self.nnz}

    def _key(self, bucket_name, sparse):
        return f"{'csr' if sparse else 'dense'}/{bucket_name}"

    def _path_for(self, n, sparse, X):
        if self._forced is not None:
            if self._forced == "fused":
                return "fused-sample" if n <= SAMPLE_KERNEL_MAX_ROWS else "fused-block"
            return self._forced
        entry = self.calibration.entries.get(self._key(bucket_of(n)[0], sparse))
        if entry is None:
            entry = self.calibrate(n, sparse, X)
        return entry["path"]

    def _prepare(self, X):
        if sp.issparse(X):
            if X.format != "csr" or X.dtype != self.dtype:
                X = sp.csr_matrix(X, dtype=self.dtype)
            if not X.has_sorted_indices:
                X = X.sorted_indices()
        else:
            X = np.ascontiguousarray(X, dtype=self.dtype)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X has shape {X.shape}; expected (n_samples, {self.n_features})")
        return X

    def _synthetic(self, m, sparse):
        rng = np.random.default_rng(0)
        if sparse:
            X = sp.random(m, self.n_features, density=0.05, format="csr", random_state=rng, dtype=self.dtype)
            return X.sorted_indices()
        return rng.standard_normal((m, self.n_features)).astype(self.dtype)

    def _runner(self, path, X):
        m = X.shape[0]
        lab = np.empty(m, dtype=np.int32)
        best = np.empty(m, dtype=np.float64)
        return lambda: self._run(path, X, lab, best)

    def _run(self, path, X, labels, best):
        if path == "fused-sample" or path == "fused-block":
            self._run_fused(path == "fused-sample", X, labels, best)
        elif path == "scipy":
            CK.argmin_cols(self._scipy_dots(X), self._chain[-1], labels, best)
        elif path == "dense":
            self._run_dense(X, labels, best)     # the folded V holds the mean
            return
        else:
            raise ValueError(f"unknown path {path!r}")
        if self.mean is not None:
            best += self._mean_offsets(X)

    def _mean_dots(self, X):
        """``x.mu`` for every row of prepared ``X``, accumulated in float64."""
        out = np.empty(X.shape[0])
        if sp.issparse(X):
            CK.row_dots_csr(X.data, X.indices, X.indptr, self._mu64, out)
        else:
            CK.row_dots_dense(X, self._mu64, out)
        return out

    def _mean_offsets(self, X):
        """``||mu||^2 - 2 x.mu``: turns the chain's partials into ``||v_k||^2 - 2 x.v_k``."""
        out = self._mean_dots(X)
        out *= -2.0
        out += self._mu_sq
        return out

    def without_mean(self):
        """The chain alone (``V - mu``) as an operator sharing the factors and the timings."""
        if self.mean is None:
            return self
        return FactorChainOperator(self.factors, dtype=self.dtype, calibration=self.calibration,
                                   path=self._forced or "auto")

    def _run_fused(self, per_sample, X, labels, best):
        chain = self._chain
        sparse = sp.issparse(X)
        if per_sample:
            if sparse:
                CK.chain_sample_csr(X.data, X.indices, X.indptr, *chain, labels, best)
            else:
                CK.chain_sample_dense(X, *chain, labels, best)
            return
        n = X.shape[0]
        width = min(BLOCK_WIDTH, n)
        # Every sample is computed on its own (bit-identical in any block), so the work
        # units may follow the thread count: a few per thread, each allocating its
        # block buffers once (about 1.5 MB at D = 4096: per-256-row buffers cost page
        # faults that two threads serialise on).
        threads = numba.get_num_threads()
        chunk = max(CB.chunk_rows(width), -(-n // (CHUNKS_PER_THREAD * threads * width)) * width)
        parallel = n > chunk and threads > 1
        if sparse:
            kernel = CB.chain_block_csr_par if parallel else CB.chain_block_csr
            kernel(X.data, X.indices, X.indptr, width, chunk, *chain, labels, best)
        else:
            kernel = CB.chain_block_dense_par if parallel else CB.chain_block_dense
            kernel(X, width, chunk, *chain, labels, best)

    def _run_dense(self, X, labels, best):
        if sp.issparse(X):
            if self._dense_op is None:
                self._dense_op = DenseOperator(self.to_dense(), c_sq=self.c_sq)
            self._dense_op.partials(X, labels, best)
            return
        VT = self.to_dense().T
        step = _config.DENSE_BLOCK_ROWS
        for start in range(0, X.shape[0], step):
            CK.argmin_rows(X[start:start + step] @ VT, self.c_sq, start, labels, best)

    def _scipy_dots(self, X):
        """``V X^T`` as a (K, n) C-contiguous array: the CSR factors applied right to left."""
        Y = self.factors[-1] @ X.T
        if sp.issparse(Y):
            Y = Y.toarray()
        for f in reversed(self.factors[:-1]):
            Y = f @ Y
        return np.ascontiguousarray(Y, dtype=self.dtype)
