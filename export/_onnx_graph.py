"""ONNX graphs of a centroid operator: the three encodings behind :func:`qkm.export.to_onnx`.

Every graph computes, for a float32 batch ``X`` of shape ``[N, D]`` (minus the
operator's ``mean`` first when it keeps one, ``V`` then being the chain alone),

    Z = c_sq - 2 X V^T            (shape [N, K]; ``||x||^2`` left out: it does not move the argmin)
    label    = ArgMin(Z, axis=1)                       (int64, first index on ties)
    distance = Relu(ReduceMin(Z, axis=1) + ||x||^2)    (squared distance to the chosen centroid)
    scores   = Relu(Z + ||x||^2)                       (optional: squared distances to every centroid)

and differs only in how ``-2 V^T`` is stored and applied:

``dense``
    one dense ``[D, K]`` initializer and one ``Gemm`` (what skl2onnx does for k-means).
``sparse``
    the factors as COO sparse constants (``Constant`` nodes with ``sparse_value``)
    and a chain of ``MatMul`` nodes whose inputs are all constants; onnxruntime
    densifies sparse constants when the session is created and constant-folds
    the chain into the same ``[D, K]`` matrix, so the run time equals ``dense``
    with a much smaller file. A runtime without constant folding
    (``ORT_DISABLE_ALL``) re-multiplies the chain at every call.
``hybrid``
    the factor at one end of the chain is applied as a sparse stage made of
    standard ops on an ELL layout (``Gather`` on axis 0 of the transposed
    operand + a batched ``MatMul`` by the values; for a single row
    ``GatherElements`` + ``Mul`` + ``ReduceSum``, chosen by an ``If`` on the batch
    size), the rest of the chain is one dense ``Gemm`` whose matrix is stored
    as COO constants and constant-folded at load. Which end: the one whose
    dense remainder is smaller (``S_Q`` when K <= D). Unbalanced rows of
    ``S_Q`` (QK-means' wide factor has ``s`` entries per *column*, rows may
    hold hundreds) are split into virtual rows of at most ``slots`` entries,
    merged back by a 0/1 matrix folded into the dense part, so padding stays small.

Values are stored in float32 whatever the model's dtype (the input is float32).
"""

import numpy as np
import onnx
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "build_graph", "hybrid_plan", "split_rows"]

DEFAULT_OPSET = 17  # loads in onnxruntime >= 1.13 (and onnxruntime-node)
MIN_OPSET = 13

# Relative cost of one padded entry of the gather stage against one multiply-add
# of the dense Gemm (per batch row); only used to pick the row split. The gather
# stage touches every entry through several memory-bound kernels while MLAS's
# Gemm runs many multiply-adds per cycle (see docs/decisions.md, 'ONNX encodings').
GATHER_COST = 8.0


class _Builder:
    """Nodes and initializers of one graph, with opset-aware reduce ops."""

    def __init__(self, opset):
        self.opset = opset
        self.nodes = []
        self.initializers = []
        self._count = 0

    def name(self, prefix):
        self._count += 1
        return f"{prefix}_{self._count}"

    def node(self, op, inputs, prefix=None, outputs=None, **attrs):
        outputs = outputs or [self.name(prefix or op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.name("n_" + op), **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, array, prefix):
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def sparse_const(self, matrix, prefix):
        """A dense-typed constant stored in COO form: ``Constant(sparse_value=...)``.

        Float32 values and sorted linear int64 indices (12 bytes per entry).
        Unlike a ``graph.sparse_initializer`` (typed ``sparse_tensor``, which no
        standard operator accepts, so ``check_model(full_check=True)`` rejects
        it), the output of ``Constant`` is an ordinary tensor; onnxruntime
        densifies it when the session is created.
        """
        name = self.name(prefix)
        coo = sp.csr_matrix(matrix, dtype=np.float32)
        coo.eliminate_zeros()
        coo.sort_indices()
        coo = coo.tocoo()
        rows, cols = coo.shape
        linear = coo.row.astype(np.int64) * cols + coo.col.astype(np.int64)
        order = np.argsort(linear, kind="stable")
        values = numpy_helper.from_array(coo.data[order].astype(np.float32), name + "_values")
        indices = numpy_helper.from_array(linear[order], name + "_indices")
        sparse = helper.make_sparse_tensor(values, indices, [rows, cols])
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.name("n_Constant"), sparse_value=sparse))
        return name

    def reduce(self, op, data, axes, keepdims, prefix=None, outputs=None):
        """ReduceSum (axes input since opset 13) / ReduceMin, ReduceSumSquare (input since 18)."""
        if op == "ReduceSum" or self.opset >= 18:
            return self.node(op, [data, self.const(np.asarray(axes, dtype=np.int64), "axes")], prefix,
                             outputs, keepdims=keepdims)
        return self.node(op, [data], prefix, outputs, axes=list(axes), keepdims=keepdims)


# --------------------------------------------------------------------------- #
# Sparse matrix helpers
# --------------------------------------------------------------------------- #
def _csr32(matrix, scale=1.0):
    m = sp.csr_matrix(matrix, dtype=np.float64) * scale
    m = sp.csr_matrix(m, dtype=np.float32)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def _chain_cost(shapes, left_to_right):
    """Multiply-adds of a dense product of matrices of these shapes in one association order."""
    cost = 0
    if left_to_right:
        rows = shapes[0][0]
        for inner, cols in shapes[1:]:
            cost += rows * inner * cols
    else:
        cols = shapes[-1][1]
        for rows, inner in reversed(shapes[:-1]):
            cost += rows * inner * cols
    return cost


def _folded_product(b, mats, prefix):
    """Name of a tensor equal to ``mats[0] @ mats[1] @ ...``, every operand a sparse initializer.

    All inputs are constants, so onnxruntime folds the chain into one dense
    tensor at session load; the association order with fewer multiply-adds is used.
    """
    names = [b.sparse_const(m, f"{prefix}{i}") for i, m in enumerate(mats)]
    if len(names) == 1:
        return names[0]
    shapes = [m.shape for m in mats]
    if _chain_cost(shapes, True) <= _chain_cost(shapes, False):
        acc = names[0]
        for n in names[1:]:
            acc = b.node("MatMul", [acc, n], prefix + "_fold")
    else:
        acc = names[-1]
        for n in reversed(names[:-1]):
            acc = b.node("MatMul", [n, acc], prefix + "_fold")
    return acc


def split_rows(matrix, slots):
    """Split the rows of a CSR matrix into virtual rows of at most ``slots`` entries.

    Returns ``(indices, values, merge)``: ``indices`` int32 and ``values`` float32
    of shape ``(n_virtual, slots)`` (ELL layout, padding: index 0, value 0) and
    ``merge``, the ``(n_rows, n_virtual)`` 0/1 CSR matrix with
    ``matrix = merge @ virtual``, or None when no row was split (then virtual
    row ``a`` is row ``a``, empty rows kept as padding).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> S = sp.csr_matrix(np.array([[1.0, 2.0, 3.0], [0.0, 4.0, 0.0]]))
    >>> idx, val, merge = split_rows(S, 2)
    >>> idx.tolist(), val.tolist(), merge.toarray().tolist()
    ([[0, 1], [2, 0], [1, 0]], [[1.0, 2.0], [3.0, 0.0], [4.0, 0.0]], [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    """
    m = sp.csr_matrix(matrix)
    n_rows = m.shape[0]
    counts = np.diff(m.indptr)
    slots = max(1, int(slots))
    split = counts.max(initial=0) > slots
    if split:
        pieces = -(-counts // slots)  # ceil; empty rows get no virtual row
        starts = np.concatenate([np.arange(m.indptr[a], m.indptr[a + 1], slots) for a in range(n_rows)]
                                + [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        owner = np.repeat(np.arange(n_rows), pieces)
        stops = np.minimum(starts + slots, m.indptr[owner + 1])
    else:
        starts, stops, owner = m.indptr[:-1].astype(np.int64), m.indptr[1:].astype(np.int64), np.arange(n_rows)
    n_virtual = max(1, len(starts))
    idx = np.zeros((n_virtual, slots), dtype=np.int32)
    val = np.zeros((n_virtual, slots), dtype=np.float32)
    for v, (lo, hi) in enumerate(zip(starts, stops)):
        idx[v, : hi - lo] = m.indices[lo:hi]
        val[v, : hi - lo] = m.data[lo:hi]
    if not split:
        return idx, val, None
    merge = sp.csr_matrix((np.ones(len(starts)), (owner, np.arange(len(starts)))), shape=(n_rows, n_virtual))
    return idx, val, merge


def _best_slots(counts, n_out):
    """Slots per virtual row minimising ``GATHER_COST * slots * rows + n_out * rows`` (see module notes)."""
    counts = np.asarray(counts)
    top = int(counts.max(initial=0))
    if top <= 1:
        return 1
    n_rows = len(counts)
    best, best_cost = top, (GATHER_COST * top + n_out) * n_rows
    for p in range(1, top):
        rows = int((-(-counts // p)).sum())
        cost = (GATHER_COST * p + n_out) * rows
        if cost < best_cost:
            best, best_cost = p, cost
    return best


def hybrid_plan(factors):
    """Which end of the chain the hybrid encoding keeps sparse, and how.

    Returns a dict with ``side`` ("tail": ``S_Q``, the factor touching D, is the
    sparse stage; "head": ``S_1``, the factor touching K), ``slots`` (entries
    per virtual row), ``virtual_rows`` and ``padding`` (stored / true entries).
    """
    K, D = factors[0].shape[0], factors[-1].shape[1]
    tail, head = factors[-1], factors[0]
    dense_tail_side = K * tail.shape[0]  # the K x A_{Q-1} remainder when S_Q is the sparse stage
    dense_head_side = head.shape[1] * D  # the A_1 x D remainder when S_1 is
    if len(factors) == 1 or dense_tail_side <= dense_head_side:
        counts = np.diff(sp.csr_matrix(tail).indptr)
        slots = _best_slots(counts, K)
        n_virtual = len(counts) if counts.max(initial=0) <= slots else int((-(-counts // slots)).sum())
        nnz = int(counts.sum())
        return {"side": "tail", "slots": int(slots), "virtual_rows": max(1, n_virtual),
                "padding": float(slots * max(1, n_virtual) / max(nnz, 1))}
    counts = np.diff(sp.csr_matrix(head).indptr)
    slots = max(1, int(counts.max(initial=0)))
    return {"side": "head", "slots": slots, "virtual_rows": len(counts),
            "padding": float(slots * len(counts) / max(int(counts.sum()), 1))}


# --------------------------------------------------------------------------- #
# The three encodings: each returns the name of Z ([N, K], c_sq - 2 X V^T)
# --------------------------------------------------------------------------- #
def _z_dense(b, x, operator, c_sq):
    V = np.asarray(operator.to_dense(), dtype=np.float64)
    W = (-2.0 * V.T).astype(np.float32)
    return b.node("Gemm", [x, b.const(W, "minus2_Vt"), c_sq], "z")


def _z_sparse(b, x, factors, c_sq):
    # -2 V^T = S_Q^T ... S_2^T (-2 S_1^T)
    mats = [_csr32(f.T) for f in reversed(factors[1:])] + [_csr32(factors[0].T, -2.0)]
    W = _folded_product(b, mats, "factor_t")
    return b.node("Gemm", [x, W, c_sq], "z")


def _z_hybrid(b, x, factors, c_sq, plan):
    if plan["side"] == "tail":
        # Y' = virtual rows of S_Q applied to X^T ([A', N]); Z = Y'^T (merge^T S_{Q-1}^T ... S_1^T (-2)) + c_sq
        scale = -2.0 if len(factors) == 1 else 1.0
        idx, val, merge = split_rows(_csr32(factors[-1], scale), plan["slots"])
        y = _ell(b, x, idx, val, batch_axis=0)
        head = [_csr32(merge.T)] if merge is not None else []
        if len(factors) > 1:
            head += [_csr32(f.T) for f in reversed(factors[1:-1])] + [_csr32(factors[0].T, -2.0)]
        if not head:  # Q = 1, nothing to fold: Z = Y^T + c_sq
            return b.node("Add", [b.node("Transpose", [y], "yt", perm=[1, 0]), c_sq], "z")
        H = _folded_product(b, head, "head_t")
        return b.node("Gemm", [y, H, c_sq], "z", transA=1)
    # side "head": U^T = (S_2 ... S_Q) X^T ([A_1, N]); Z^T = (-2 S_1) U^T by the sparse stage
    rest = _folded_product(b, [_csr32(f) for f in factors[1:]], "tail")
    ut = b.node("Gemm", [rest, x], "ut", transB=1)
    idx, val, _ = split_rows(_csr32(factors[0], -2.0), plan["slots"])
    zt = _ell(b, ut, idx, val, batch_axis=1)
    return b.node("Add", [b.node("Transpose", [zt], "zt_t", perm=[1, 0]), c_sq], "z")


def _ell(b, operand, idx, val, batch_axis):
    """``out[r, n] = sum_j val[r, j] * M[idx[r, j], n]`` ([R, N]) with ``M = operand`` (batch_axis 1) or its transpose.

    Two branches under an ``If`` on the batch size N, same result (why these
    forms: docs/decisions.md, 'ONNX encodings'):

    - N > 1: ``Gather`` on axis 0 of ``M`` (every index copies one contiguous
      row of N values) -> [R, slots, N], then a batched ``MatMul`` by the values
      [R, 1, slots] (not ``Mul`` + ``ReduceSum`` over the slots);
    - N == 1: ``GatherElements`` on the 1-D row (one element per index, not
      one block per index as ``Gather``) -> ``Mul`` -> ``ReduceSum``
      over the trailing slots axis.
    """
    rows, slots = idx.shape
    flat_idx = b.const(idx.reshape(-1), "ell_idx")
    flat_val = b.const(val.reshape(-1), "ell_val")
    n = b.node("Gather", [b.node("Shape", [operand], "shape_of"), b.const(np.array(batch_axis, np.int64), "axis")],
               "batch", axis=0)
    single = b.node("Equal", [n, b.const(np.array(1, np.int64), "one")], "single_row")

    def branch(build, tag):
        outer = b.nodes
        b.nodes = []
        out = build()
        nodes, b.nodes = b.nodes, outer
        return helper.make_graph(nodes, b.name(tag), [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    def one_row():
        v = b.node("Reshape", [operand, b.const(np.array([-1], np.int64), "shape")], "row")
        g = b.node("GatherElements", [v, flat_idx], "ell1_gather", axis=0)
        m = b.node("Mul", [g, flat_val], "ell1_mul")
        m = b.node("Reshape", [m, b.const(np.array([rows, slots], np.int64), "shape")], "ell1_rows")
        return b.reduce("ReduceSum", m, [1], keepdims=1, prefix="ell1_out")

    def batched():
        m_t = b.node("Transpose", [operand], "xt", perm=[1, 0]) if batch_axis == 0 else operand
        idx2 = b.node("Reshape", [flat_idx, b.const(np.array([rows, slots], np.int64), "shape")], "ell_idx2")
        val3 = b.node("Reshape", [flat_val, b.const(np.array([rows, 1, slots], np.int64), "shape")], "ell_val3")
        g = b.node("Gather", [m_t, idx2], "ell_gather", axis=0)
        y = b.node("MatMul", [val3, g], "ell_dot")
        return b.node("Squeeze", [y, b.const(np.array([1], np.int64), "axes")], "ell_out")

    return b.node("If", [single], "ell_out", then_branch=branch(one_row, "ell_single_row"),
                  else_branch=branch(batched, "ell_batched"))


def build_graph(operator, encoding, *, scores=False, opset=DEFAULT_OPSET, plan=None):
    """A ModelProto (no metadata yet) of ``operator`` in ``encoding`` ("dense", "sparse", "hybrid")."""
    b = _Builder(opset)
    x = "X"
    if operator.mean is not None:  # a centred chain: distances of X - mean to the chain's rows
        x = b.node("Sub", ["X", b.const(np.asarray(operator.mean, dtype=np.float32), "mean")], "x_centred")
        operator = operator.without_mean()
    c_sq = b.const(np.asarray(operator.row_sq_norms(), dtype=np.float64).astype(np.float32), "c_sq")
    if encoding == "dense":
        z = _z_dense(b, x, operator, c_sq)
    elif encoding == "sparse":
        z = _z_sparse(b, x, operator.factors, c_sq)
    else:
        z = _z_hybrid(b, x, operator.factors, c_sq, plan or hybrid_plan(operator.factors))
    b.node("ArgMin", [z], outputs=["label"], axis=1, keepdims=0)
    K, D = int(operator.n_clusters), int(operator.n_features)
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
               helper.make_tensor_value_info("distance", TensorProto.FLOAT, ["batch"])]
    if scores:
        x2 = b.reduce("ReduceSumSquare", x, [1], keepdims=1, prefix="x_sq")
        b.node("Relu", [b.node("Add", [z, x2], "sq_dist")], outputs=["scores"])
        b.reduce("ReduceMin", "scores", [1], keepdims=0, outputs=["distance"])
        outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", K]))
    else:
        x2 = b.reduce("ReduceSumSquare", x, [1], keepdims=0, prefix="x_sq")
        zmin = b.reduce("ReduceMin", z, [1], keepdims=0, prefix="z_min")
        b.node("Relu", [b.node("Add", [zmin, x2], "min_sq_dist")], outputs=["distance"])
    graph = helper.make_graph(
        b.nodes, "qkm_" + encoding,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", D])],
        outputs, initializer=b.initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="qkm")
    model.ir_version = max(helper.find_min_ir_version_for(opsets), 7)
    return model


def check(model):
    """``onnx.checker.check_model(model, full_check=True)``."""
    onnx.checker.check_model(model, full_check=True)
