"""qkm.distributed._driver: means written in place equal means written into a new buffer, bit for bit, and a Lloyd
run over CSR shards whose centres travel as CSR holds one dense K x D array on the driver.

Oracles: :func:`~qkm.distributed._driver.update_means` into a separate buffer (the path every fit over shards took
before, compared with the in-memory fit by ``test_distributed.py``) and the run with the centres sent dense (the
buffer ring); ``tracemalloc``'s count of the bytes the run allocates. No Dask needed: the shard side is a stand-in
computing the partial sums with scipy.
"""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from qkm.distributed import ShardedData, _driver, _packs
from qkm.distributed import _shard_tasks as T
from qkm.distributed._timeline import Timeline

pytestmark = pytest.mark.distributed


class FakeShards:
    """The driver's view of :class:`~qkm.distributed.ShardedData` over one CSR shard; the shard work done here."""

    compact = ShardedData.compact

    def __init__(self, X):
        self.X, self.sparse, self.dtype, self.err_rel = X, True, X.dtype, 1e-12
        self.n_rows, self.n_features = X.shape
        self.nnz = X.nnz
        self.timeline = Timeline(enabled=False)
        self.x_sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
        self.labels = np.full(X.shape[0], -1)
        self.candidates = None  # (squared distance, global row, label) of the repair's candidates

    def retrying(self, attempt):
        return attempt(False)

    def traffic_since_last(self):
        return {}

    def end_round(self):
        pass

    def gather_each(self, fn, *args):
        assert fn is T.candidates
        return [self.candidates]

    def fetch_rows(self, rows):
        return self.X[np.asarray(rows)].toarray()

    def map_reduce(self, fn, pack, *args, rebuild=None, same_pack=False):
        if not isinstance(pack, _packs.Compacted):  # as ShardedData._scatter sends it
            pack = _packs.compact_pack(pack)
        C, c_sq = pack[0], pack[1]
        d2 = self.x_sq[:, None] - 2 * np.asarray((self.X @ C.T).todense() if sp.issparse(C) else self.X @ C.T) + c_sq
        labels = d2.argmin(axis=1)
        wcss = float(d2[np.arange(len(labels)), labels].sum())
        if fn is T.final_step:
            return T.Partial(wcss=wcss)
        k = C.shape[0]
        onehot = sp.csr_matrix((np.ones(len(labels)), (labels, np.arange(len(labels)))), shape=(k, len(labels)))
        part = T.Partial(counts=np.bincount(labels, minlength=k).astype(np.int64), sums=sp.csr_matrix(onehot @ self.X),
                         wcss=wcss, n_changed=int((labels != self.labels).sum()))
        self.labels = labels
        return part


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sums_kind", ["csr", "dense"])
def test_means_in_place_equal_means_into_a_new_buffer(dtype, sums_kind):
    """Two empty clusters filled from one donor (twice): the donor's move is measured from its old centre."""
    rng = np.random.default_rng(3)
    k, d = 6, 30
    X = sp.csr_matrix(np.where(rng.random((40, d)) < 0.3, rng.standard_normal((40, d)), 0.0))
    sd = FakeShards(X)
    C = rng.standard_normal((k, d)).astype(dtype)
    counts = np.array([5, 0, 3, 0, 7, 2], dtype=np.int64)
    sums = np.where(rng.random((k, d)) < 0.4, rng.standard_normal((k, d)), 0.0) * (counts > 0)[:, None]
    part = T.Partial(counts=counts, sums=sp.csr_matrix(sums) if sums_kind == "csr" else sums)
    sd.candidates = (np.array([9.0, 8.0, 7.0]), np.array([11, 4, 30], dtype=np.int64), np.array([4, 4, 2]))
    ref = _driver.update_means(sd, part, C.copy(), None, 0, False, np.empty_like(C))
    C_in = C.copy()
    got = _driver.update_means(sd, part, C_in, None, 0, False, C_in)
    assert got.C is C_in and ref.relocated == got.relocated == 2
    for name in ("C", "shift_sq", "c_sq", "counts"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    assert got.counts.tolist() == [5, 1, 3, 1, 5, 2]  # both moves took from cluster 4
    assert part.counts.tolist() == [5, 0, 3, 0, 7, 2]  # the combined partial is not modified


@pytest.fixture
def wide_csr():
    rng = np.random.default_rng(5)
    n, d = 300, 40_000
    rows = np.repeat(np.arange(n), 4)
    cols = rng.integers(0, 500, size=n * 4) + (rows % 10) * 4000
    X = sp.csr_matrix((rng.random(n * 4) + 0.5, (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    return X


def test_lloyd_driver_holds_one_dense_kxd_array(wide_csr, monkeypatch):
    """Centres sent as CSR: the means are written in place (tracemalloc peak of the run near one K x D array;
    the buffer ring and the final copy made five); the result is the one with the centres sent dense."""
    k = 10
    init = wide_csr[:k].toarray()
    kxd = init.nbytes
    kw = dict(max_iter=4, tol=0.0, key=None)
    with monkeypatch.context() as m:  # centres sent dense: the buffer ring (and the kernels compiled or loaded)
        m.setattr(_packs, "compact_pack", lambda pack: pack)
        inertia_ref, C_ref, n_iter_ref = _driver.run_lloyd(FakeShards(wide_csr), init, **kw)
    tracemalloc.start()
    try:
        inertia, C, n_iter = _driver.run_lloyd(FakeShards(wide_csr), init, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * kxd, (peak, kxd)
    assert C is not C_ref and n_iter == n_iter_ref >= 2
    np.testing.assert_array_equal(C, C_ref)
    assert inertia == inertia_ref
    np.testing.assert_array_equal(init, wide_csr[:k].toarray())  # the caller's array is not modified
