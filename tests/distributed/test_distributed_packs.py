"""qkm.distributed._packs: the operator a worker builds from a compact (CSR) pack is the dense one, bit for bit.

Oracle: :class:`qkm.operator.DenseOperator` on the dense centres (its C^T layouts and its assignment with each
layout forced). No Dask needed: the packs are plain objects. Also the phase timeline of the shard tasks.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from qkm._data import KMeansData
from qkm.distributed import _packs, _timeline
from qkm._kernels import centroid_sq_norms
from qkm.operator import DenseOperator


@pytest.fixture
def centres():
    rng = np.random.default_rng(7)
    C = np.where(rng.random((6, 400)) < 0.05, rng.standard_normal((6, 400)), 0.0)
    C[0, :3] = -0.0  # signed zeros are zeros in every layout
    C[2] = 0.0  # an all-zero centre
    return C


@pytest.mark.parametrize("tile", [None, 7, 64])
@pytest.mark.parametrize("unsorted", [False, True])
def test_compact_pack_operator_has_the_dense_layouts(centres, tile, unsorted, monkeypatch):
    """The C^T layouts built from the CSR in column blocks (one block, several, a ragged last one; rows with
    unsorted indices) are those made from the dense centres."""
    if tile is not None:
        monkeypatch.setattr(_packs, "_tile", lambda n_clusters: tile)
    pack = _packs.compact_pack((centres, centroid_sq_norms(centres)))
    assert sp.issparse(pack[0])
    C_csr = pack[0]
    if unsorted:
        C_csr = C_csr.copy()
        for j in range(C_csr.shape[0]):
            lo, hi = C_csr.indptr[j], C_csr.indptr[j + 1]
            C_csr.indices[lo:hi] = C_csr.indices[lo:hi][::-1].copy()
            C_csr.data[lo:hi] = C_csr.data[lo:hi][::-1].copy()
        C_csr.has_sorted_indices = False
    got = _packs._SharedCSROperator(C_csr, pack[1])
    ref = DenseOperator(_packs._unpack(pack)[0].copy(), pack[1])
    np.testing.assert_array_equal(got.column_nnz(), ref.column_nnz())
    for a, b in zip(got.sparse_transpose(), ref.sparse_transpose()):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.dense_transpose(), ref.dense_transpose())
    assert got._C is None  # no dense K x D was made for the layouts
    np.testing.assert_array_equal(got.C, ref.C)


@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_compact_pack_operator_assigns_as_the_dense_one(centres, storage):
    rng = np.random.default_rng(8)
    X = sp.random(300, 400, density=0.03, random_state=rng, format="csr")
    pack = _packs.compact_pack((centres, centroid_sq_norms(centres)))
    out = []
    for op in (_packs._SharedCSROperator(pack[0], pack[1]), DenseOperator(centres, pack[1])):
        data = KMeansData(X)
        data.storage_chooser.choose = lambda dense_work, sparse_work: storage
        labels, partial = np.empty(300, dtype=np.int32), np.empty(300)
        data.assign(op, labels, partial)
        assert op.storage == storage
        out.append((labels, partial))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_timeline_nests_inside_a_task_only_and_stays_bounded(monkeypatch):
    with _timeline.nested_phase("assign/transpose"):  # no task: nothing recorded, no error
        pass
    with _timeline.task_timeline() as tl:
        with tl.phase("assign", 3), _timeline.nested_phase("assign/transpose"):
            pass
    assert [(e[1], e[2]) for e in tl.events] == [(-1, "assign/transpose"), (3, "assign")]
    assert all(e[3] <= e[4] for e in tl.events)
    monkeypatch.setattr(_timeline.Timeline, "MAX_EVENTS", 10)
    tl = _timeline.Timeline()
    tl.add([(0, i, "sums", 0.0, 1.0) for i in range(25)])
    assert len(tl.events) <= 10 and tl.events[-1][1] == 24  # the newest kept
