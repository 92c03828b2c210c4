"""The packed layout of a factor chain and its checks (private; see :mod:`qkm.operator._chain`).

:func:`check_factors` validates ``[S_1, ..., S_Q]`` into CSR of the storage
dtype; :func:`pack` lays the chain out for :mod:`qkm.operator._chain_kernels`
(rows of uniform length 3 or 5, or padded to multiples of 3, for branch-free
loops); :func:`fold` multiplies it out. :func:`random_chain` makes chains
with the QK-means supports for tests and benchmarks.
"""

import numpy as np
import scipy.sparse as sp

from . import _chain_block_kernels as CB

__all__ = ["FOLD_WIDTH", "check_factors", "check_mean", "fold", "pack", "random_chain", "row_norms"]

#: Columns of V per work unit when folding the chain.
FOLD_WIDTH = 64


def check_factors(factors, dtype):
    """Validated factors as CSR of the storage dtype (see FactorChainOperator)."""
    if not isinstance(factors, (list, tuple)) or len(factors) == 0:
        raise ValueError("factors must be a non-empty list [S_1, ..., S_Q] of 2-D matrices")
    mats = [f if sp.issparse(f) else np.asarray(f) for f in factors]
    for q, f in enumerate(mats):
        if f.ndim != 2:
            raise ValueError(f"factor {q} has {f.ndim} dimensions; every factor must be 2-D")
        if f.dtype.kind not in "biuf":
            raise ValueError(f"factor {q} has dtype {f.dtype}; expected real numbers")
        if 0 in f.shape:
            raise ValueError(f"factor {q} has an empty shape {f.shape}")
    for q in range(len(mats) - 1):
        if mats[q].shape[1] != mats[q + 1].shape[0]:
            raise ValueError(f"factor shapes do not chain: factor {q} is {mats[q].shape}, "
                             f"factor {q + 1} is {mats[q + 1].shape}")
    if dtype is None:
        dtype = np.float32 if all(f.dtype == np.float32 for f in mats) else np.float64
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    out = []
    for q, f in enumerate(mats):
        values = f.data if sp.issparse(f) else f
        if not np.all(np.isfinite(values)):
            raise ValueError(f"factor {q} has non-finite values")
        with np.errstate(over="ignore"):
            csr = sp.csr_matrix(f, dtype=dtype, copy=True)
        if not np.all(np.isfinite(csr.data)):
            raise ValueError(f"factor {q} overflows {dtype.name}")
        csr.sum_duplicates()
        csr.eliminate_zeros()
        csr.sort_indices()
        out.append(csr)
    return out


def check_mean(mean, n_features, dtype):
    """None, or the mean vector of a chain as a C-contiguous ``(n_features,)`` array of ``dtype``."""
    if mean is None:
        return None
    mean = mean.toarray() if sp.issparse(mean) else np.asarray(mean)
    if mean.dtype.kind not in "biuf":
        raise ValueError(f"mean has dtype {mean.dtype}; expected real numbers")
    mean = mean.reshape(-1) if mean.ndim == 2 and 1 in mean.shape else mean
    if mean.shape != (n_features,):
        raise ValueError(f"mean has shape {mean.shape}; expected ({n_features},) to match the last factor")
    if not np.all(np.isfinite(mean)):
        raise ValueError("mean has non-finite values")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(mean, dtype=dtype)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"mean overflows {np.dtype(dtype).name}")
    return out


def fold(meta, ptr, idx, val, n_clusters, n_features):
    """``S_1 ... S_Q`` as a dense float64 (K, D) array, from the packed chain."""
    V = np.empty((n_clusters, n_features), dtype=np.float64)
    CB.fold_chain(meta, ptr, idx, val.astype(np.float64), FOLD_WIDTH, V)
    return V


def row_norms(meta, ptr, idx, val, n_clusters, n_features, mu=None):
    """``(||v_k||^2, v_k.mu)`` of ``V = S_1 ... S_Q`` in float64, without storing ``V`` (``v_k.mu`` None without ``mu``).

    Summed over the column blocks of :func:`fold` in block order: the same
    for any thread count, not bit-identical to norms of the folded ``V``.
    """
    n_blocks = -(-n_features // FOLD_WIDTH)
    sq = np.empty((n_blocks, n_clusters))
    dots = np.empty((n_blocks, n_clusters))
    mu_arg = np.zeros(0) if mu is None else np.ascontiguousarray(mu, dtype=np.float64)
    CB.chain_norms(meta, ptr, idx, val.astype(np.float64), FOLD_WIDTH, mu_arg, sq, dots)
    return sq.sum(axis=0), (None if mu is None else dots.sum(axis=0))


def pack(factors, dtype):
    """The chain in the layout of :mod:`qkm.operator._chain_kernels` (``meta, ptr, idx, val``)."""
    order = factors[::-1]  # order of application: S_Q first
    first_csc = order[0].tocsc()
    first_csc.sort_indices()
    parts = [_lane_rows(f.indptr, f.indices, f.data) for f in order]
    parts.append((first_csc.indptr, first_csc.indices, first_csc.data, -1))
    meta = np.full((len(parts), 4), -1, dtype=np.int64)
    ptrs, idxs, vals = [], [], []
    ptr_off = nnz_off = 0
    for q, (indptr, indices, data, w) in enumerate(parts):
        if q < len(order):
            meta[q] = (order[q].shape[0], order[q].shape[1], ptr_off, w)
        else:
            meta[q] = (order[0].shape[1], order[0].shape[0], ptr_off, -1)
        ptrs.append(indptr.astype(np.uint64) + np.uint64(nnz_off))
        idxs.append(indices.astype(np.uint32))
        vals.append(data.astype(dtype))
        ptr_off += indptr.shape[0]
        nnz_off += indices.shape[0]
    return meta, np.concatenate(ptrs), np.concatenate(idxs), np.concatenate(vals)


def _lane_rows(indptr, indices, data, max_padding=0.25):
    """CSR rows plus the row-shape code ``w`` of :mod:`qkm.operator._chain_kernels`.

    Rows of one uniform count 3 or 5 are kept (``w`` = 3 or 5). Otherwise,
    if that adds at most ``max_padding`` more entries, every row is padded
    with zeros (on its last column) to a nonzero multiple of 3 (``w`` = -3):
    the blocked kernel then runs one branch-free 3-term loop per group, with
    no remainder code (see docs/decisions.md, 'Operator kernels'). Adding ``0 * x`` leaves every sum
    bit-identical. Else the rows are kept as they are (``w`` = -1).
    """
    counts = np.diff(indptr)
    if counts.size and np.all(counts == counts[0]) and counts[0] in (3, 5):
        return indptr, indices, data, int(counts[0])
    padded = np.maximum(3, -(-counts // 3) * 3)
    if padded.sum() > (1.0 + max_padding) * max(counts.sum(), 1):
        return indptr, indices, data, -1
    new_ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(padded, out=new_ptr[1:])
    row_of = np.repeat(np.arange(counts.size), padded)
    pos = np.arange(new_ptr[-1]) - new_ptr[row_of]
    real = pos < counts[row_of]
    src = indptr[row_of] + np.minimum(pos, np.maximum(counts[row_of] - 1, 0))
    src = np.minimum(src, max(indices.size - 1, 0))
    new_idx = indices[src] if indices.size else np.zeros(src.size, dtype=np.int32)
    new_val = np.where(real, data[src] if data.size else 0, 0).astype(data.dtype)
    new_idx = np.where(real | (counts[row_of] > 0), new_idx, 0)
    return new_ptr, new_idx, new_val, -3


def random_chain(n_clusters, n_features, s=3, n_factors=None, dtype=np.float32, seed=0):
    """A random chain ``[S_1, ..., S_Q]`` with the QK-means supports (tests and benchmarks).

    With ``A = min(K, D)``: square A x A factors have exactly ``s`` nonzeros per
    row and per column (a permuted circulant); the rectangular factor
    (``S_Q`` if K <= D, ``S_1`` otherwise) has ``s`` per line of its longer
    side. ``n_factors`` defaults to ``ceil(log2(max(K, D)))``; values are
    normal with variance ``1 / nonzeros per row``.
    """
    rng = np.random.default_rng(seed)
    K, D = int(n_clusters), int(n_features)
    A = min(K, D)
    Q = n_factors if n_factors is not None else max(1, int(np.ceil(np.log2(max(K, D, 2)))))
    s = min(s, A)

    def square(n):
        shifts = rng.choice(n, size=s, replace=False)
        rows = np.repeat(np.arange(n), s)
        cols = (rows + np.tile(shifts, n)) % n
        return rows, cols, n, n

    def rect(r, c):
        if c >= r:
            cols = np.repeat(np.arange(c), s)
            rows = (cols * s + np.tile(np.arange(s), c)) % r
        else:
            rows = np.repeat(np.arange(r), s)
            cols = (rows * s + np.tile(np.arange(s), r)) % c
        return rows, cols, r, c

    out = []
    for q in range(Q):
        if Q == 1:
            rows, cols, r, c = rect(K, D)
        elif K <= D:
            rows, cols, r, c = rect(A, D) if q == Q - 1 else square(A)
        else:
            rows, cols, r, c = rect(K, A) if q == 0 else square(A)
        rows = rng.permutation(r)[rows]
        cols = rng.permutation(c)[cols]
        per_row = max(1.0, len(rows) / r)
        vals = rng.standard_normal(len(rows)) / np.sqrt(per_row)
        M = sp.csr_matrix((vals, (rows, cols)), shape=(r, c))
        M.sum_duplicates()
        out.append(sp.csr_matrix(M, dtype=dtype))
    return out
