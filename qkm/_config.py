"""Tunables shared by the numba kernels (one place, like stumpy's ``config.py``).

Change them before the first fit in a process; ``_reset()`` restores the defaults.
"""

#: Rows per work unit in the parallel kernels. Work is split by rows, never by
#: threads, so results do not depend on the thread count.
CHUNK_SIZE = 256

#: Rows per BLAS call when the data are dense (bounds the ``rows x K`` buffer).
DENSE_BLOCK_ROWS = 4096

#: fastmath flags for the numba kernels. Distance kernels stay IEEE-exact so
#: that Lloyd and Elkan compute bit-identical distances.
FASTMATH = False

#: fastmath flags for the dense (point, centroid) dot products of Elkan: their
#: results are only ever compared with BLAS results, which are not bit-exact
#: either, so the reduction may be reassociated (vectorised).
FASTMATH_DENSE_DOT = {"reassoc", "contract", "nsz"}

#: Rows per block of the fixed summation order (:mod:`qkm._reduce`): block sums
#: in row order, then an aligned binary tree over blocks, so that a fit over
#: shards of whole tree nodes gives the same bits as one pass. Also the rows
#: per BLAS call of dense data must divide it (shards then see the same blocks).
REDUCE_BLOCK_ROWS = 4096

#: Cache compiled kernels on disk (``@njit(cache=True)``).
CACHE = True

#: Sparse data, sparse centroids: the scatter through a CSR copy of C^T costs
#: about this many times more per multiply-add than streaming a dense row of
#: C^T. The sparse path is used when its estimated cost is lower.
SPARSE_CENTROID_COST_FACTOR = 4.0

#: Elkan: when more than this fraction of (point, centroid) pairs survive the
#: bounds, one fused full pass is cheaper than pair-by-pair distances.
ELKAN_FULL_PASS_FRACTION = 0.25

#: Seedings (k-means|| rounds, weighted Lloyd on the candidates): a term is
#: kept as a dense column of the block (its dots: contiguous axpys over a dense
#: slab of the rows on those terms) when it occurs in more than this fraction of
#: the block's sparse centres; rarer terms are added term-major from the rows' CSC copy.
SEEDING_DENSE_TERM_FRACTION = 0.1

#: Seedings: dots of CSR rows with a block of B sparse centres are formed for at
#: most this many (row, centre) pairs at a time (rows per pass: this // B).
SEEDING_DOTS_BLOCK = 1 << 22

#: k-means|| recluster: the weighted k-means++ on the m candidates reads their
#: Gram matrix (one hybrid product) while it takes at most this many bytes
#: (8 m^2); beyond, each step's dots go through the candidates' CSC copy.
SEEDING_GRAM_MAX_BYTES = 1 << 29

#: A factor-chain operator folds its dense ``V`` (float64) at construction when
#: it takes at most this many bytes; a larger ``V`` is folded only when an
#: execution path or ``to_dense()`` needs it (its row norms come from a
#: streaming pass over the chain). Wide sparse fits never hold it.
FOLD_MAX_BYTES = 16 * 2**20

_DEFAULTS = dict(
    CHUNK_SIZE=CHUNK_SIZE,
    DENSE_BLOCK_ROWS=DENSE_BLOCK_ROWS,
    FASTMATH=FASTMATH,
    FASTMATH_DENSE_DOT=FASTMATH_DENSE_DOT,
    REDUCE_BLOCK_ROWS=REDUCE_BLOCK_ROWS,
    CACHE=CACHE,
    SPARSE_CENTROID_COST_FACTOR=SPARSE_CENTROID_COST_FACTOR,
    ELKAN_FULL_PASS_FRACTION=ELKAN_FULL_PASS_FRACTION,
    SEEDING_DENSE_TERM_FRACTION=SEEDING_DENSE_TERM_FRACTION,
    SEEDING_DOTS_BLOCK=SEEDING_DOTS_BLOCK,
    SEEDING_GRAM_MAX_BYTES=SEEDING_GRAM_MAX_BYTES,
    FOLD_MAX_BYTES=FOLD_MAX_BYTES,
)

#: The options every numba kernel of qkm is compiled with (``@njit(**_JIT)``; the style test checks it):
#: cached, releasing the GIL, ``fastmath`` from :data:`FASTMATH`. ``_JIT_DOT`` is for dense dot products
#: that may be reassociated (:data:`FASTMATH_DENSE_DOT`). Read once, when a kernel module is imported.
_JIT = dict(cache=CACHE, nogil=True, fastmath=FASTMATH)
_JIT_DOT = dict(_JIT, fastmath=FASTMATH_DENSE_DOT)


def _reset():
    """Restore every tunable to its default value."""
    globals().update(_DEFAULTS)
