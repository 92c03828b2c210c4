"""The fixed summation order (qkm._reduce): one pass over all rows == shards of whole tree nodes, bit for bit."""

import numpy as np
import pytest
import scipy.sparse as sp

from qkm import _reduce
from qkm._data import KMeansData

B = 16


def naive_tree_sum(rows_values, rows, block_rows):
    """Oracle: block sums in row order, then the aligned binary tree over block ids (absent halves skipped)."""
    blocks = {}
    for i in rows:
        blocks.setdefault(int(i) // block_rows, []).append(i)
    sums = {}
    for b, members in blocks.items():
        s = np.zeros_like(rows_values[0], dtype=np.float64)
        for i in members:
            s = s + rows_values[i]
        sums[b] = s

    def node(level, index):
        if level == 0:
            return sums.get(index)
        left, right = node(level - 1, 2 * index), node(level - 1, 2 * index + 1)
        if left is None or right is None:
            return right if left is None else left
        return left + right

    return node(max(sums).bit_length() if sums else 0, 0)


def dense(a):
    return a.toarray() if sp.issparse(a) else a


@pytest.fixture(params=["dense", "csr"])
def data(request):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 9)) * (rng.random((300, 9)) < 0.4)
    labels = rng.integers(0, 5, 300).astype(np.int32)
    labels[labels == 3] = 2  # one empty cluster
    return (sp.csr_matrix(X) if request.param == "csr" else X), labels


def test_cluster_sums_follow_the_block_tree(data):
    X, labels = data
    counts, sums = KMeansData(X, block_rows=B).cluster_sums(labels, 5)
    Xd = dense(X)
    for j in range(5):
        members = np.flatnonzero(labels == j)
        assert counts[j] == members.size
        ref = naive_tree_sum(Xd, members, B)
        np.testing.assert_array_equal(dense(sums)[j], 0.0 if ref is None else ref)


@pytest.mark.parametrize("bounds", [[0, 300], [0, 128, 256, 300], [0, 16, 32, 64, 64, 128, 256, 300]])
def test_shards_of_whole_nodes_add_up_to_the_same_bits(data, bounds):
    X, labels = data
    whole = KMeansData(X, block_rows=B)
    values = np.random.default_rng(1).random(X.shape[0])
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a < b:
            d = KMeansData(X[a:b], row0=a, block_rows=B)
            parts.append([a // B, dense(d.cluster_sums(labels[a:b], 5)[1]), d.total(values[a:b]),
                          _reduce.column_sums_node(d.X, a, B, _reduce.n_levels(300, B))])
    for a, b in _reduce.merge_plan([p[0] for p in parts]):
        for i in (1, 2, 3):
            parts[a][i] = parts[a][i] + parts[b][i]
    np.testing.assert_array_equal(parts[0][1], dense(whole.cluster_sums(labels, 5)[1]))
    assert parts[0][2] == whole.total(values)
    np.testing.assert_array_equal(parts[0][3], _reduce.column_sums_node(X, 0, B, _reduce.n_levels(300, B)))


def test_update_means_equal_sums_over_counts(data):
    X, _ = data
    labels = (np.arange(X.shape[0]) % 5).astype(np.int32)  # no empty cluster (no relocation)
    d = KMeansData(X, block_rows=B)
    C = np.zeros((5, X.shape[1]))
    C_new, shift_sq, c_sq, _ = d.update(labels, C.copy(), lambda: np.ones(X.shape[0]))
    counts, sums = d.cluster_sums(labels, 5)
    C_ref, shift_ref = C.copy(), np.empty(5)
    _reduce.means_from_sums(dense(sums), counts, C_ref, shift_ref)
    np.testing.assert_array_equal(C_new, C_ref)
    np.testing.assert_array_equal(shift_sq, shift_ref)


def test_column_variances_and_row_sums(data):
    X, _ = data
    np.testing.assert_allclose(_reduce.column_variances(X, block_rows=B), dense(X).var(axis=0), rtol=1e-12, atol=1e-15)
    v = np.arange(300, dtype=np.float64) / 7
    assert _reduce.tree_sum_rows(v, block_rows=B) == pytest.approx(v.sum(), rel=1e-14)
    assert _reduce.tree_sum_rows(v, block_rows=1000) == float(np.cumsum(v)[-1])  # one block: plain order
