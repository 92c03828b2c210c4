"""ONNX export (qkm.export.to_onnx): parity with in-process predict for every encoding, graph checks, metadata."""

import json
import os

import numpy as np
import onnx
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs

import qkm
from qkm.operator._chain_layout import random_chain
from qkm.export import Model, as_model, to_onnx
from qkm.export import onnx as qonnx
from qkm.export._onnx_graph import hybrid_plan, split_rows
from qkm.export.onnx import onnx_session
from qkm.operator import FactorChainOperator

ENCODINGS = ("sparse", "hybrid", "dense")


def _blobs(K, D, n=400, seed=0, dtype=np.float64):
    X, _ = make_blobs(n_samples=n, n_features=D, centers=K, cluster_std=1.0, center_box=(-8, 8), random_state=seed)
    return X.astype(dtype)


def _query(model, seed=1, n=300):
    """float32 rows around the centroids, without near-ties (top-2 squared distances >= 1e-3 apart, relative)."""
    rng = np.random.default_rng(seed)
    V = np.asarray(model.operator.to_dense(), dtype=np.float64)
    X = (V[rng.integers(0, V.shape[0], n)] + rng.normal(0, 1.0, size=(n, V.shape[1]))).astype(np.float32)
    d = model.operator.sq_distances(np.asarray(X, dtype=model.operator.dtype))
    top2 = np.sort(d, axis=1)[:, :2]
    keep = (top2[:, 1] - top2[:, 0]) > 1e-3 * np.maximum(top2[:, 1], 1.0)
    assert keep.sum() > n // 2
    return np.ascontiguousarray(X[keep])


def _custom_chain():
    """K=6 < D=40, Q=2, the wide factor has one row with 30 entries and others with 3 (forces a row split)."""
    rng = np.random.default_rng(3)
    S1 = sp.random(6, 6, density=0.5, random_state=3, format="csr") + sp.eye(6, format="csr")
    rows, cols = [], []
    for a in range(6):
        c = rng.choice(40, size=30 if a == 0 else 3, replace=False)
        rows += [a] * len(c)
        cols += list(c)
    S2 = sp.csr_matrix((rng.normal(size=len(rows)), (rows, cols)), shape=(6, 40))
    return Model(FactorChainOperator([sp.csr_matrix(S1), S2]), {"algorithm": "test"})


def _make(name):
    if name == "qk_K6_D20_Q1":
        return as_model(qkm.QKMeans(6, sparsity_level=3, n_factors=1, max_iter=5, palm_max_iter=30,
                                    random_state=0).fit(_blobs(6, 20)))
    if name == "qk_K6_D20_Q2":
        return as_model(qkm.QKMeans(6, sparsity_level=2, n_factors=2, max_iter=5, palm_max_iter=30,
                                    random_state=0).fit(_blobs(6, 20)))
    if name == "qk_K8_D32_Q5_f32":
        return as_model(qkm.QKMeans(8, sparsity_level=2, max_iter=5, palm_max_iter=30,
                                    random_state=0).fit(_blobs(8, 32, dtype=np.float32)))
    if name == "qk_K24_D8_Q3":  # K > D
        return as_model(qkm.QKMeans(24, sparsity_level=2, n_factors=3, max_iter=5, palm_max_iter=30,
                                    random_state=0).fit(_blobs(24, 8, n=1200)))
    if name == "chain_K64_D16":  # K > D random chain: the hybrid keeps S_1 sparse
        return Model(FactorChainOperator(random_chain(64, 16, s=3, seed=1)))
    if name == "chain_Q1":  # a single balanced factor: the hybrid is the sparse stage alone, no Gemm
        return Model(FactorChainOperator(random_chain(6, 30, s=2, n_factors=1, seed=2)))
    if name == "chain_split":
        return _custom_chain()
    if name == "lowrank":
        return as_model(qkm.LowRankKMeans(6, rank=2, random_state=0).fit(_blobs(6, 20)))
    if name == "km_K5_D12":
        return as_model(qkm.KMeans(5, random_state=0).fit(_blobs(5, 12)))
    if name == "km_K20_D4":  # K > D
        return as_model(qkm.KMeans(20, random_state=0).fit(_blobs(20, 4, n=600)))
    raise KeyError(name)


CHAINS = ["qk_K6_D20_Q1", "qk_K6_D20_Q2", "qk_K8_D32_Q5_f32", "qk_K24_D8_Q3", "chain_K64_D16", "chain_Q1",
          "chain_split", "lowrank"]
DENSE = ["km_K5_D12", "km_K20_D4"]
_CACHE = {}


@pytest.fixture(scope="module", params=CHAINS + DENSE)
def case(request):
    if request.param not in _CACHE:
        model = _make(request.param)
        _CACHE[request.param] = (model, _query(model))
    return (request.param,) + _CACHE[request.param]


def _run(proto, X):
    return onnx_session(proto).run(None, {"X": X})


def _props(proto):
    return {p.key: p.value for p in proto.metadata_props}


def test_parity_every_encoding(case):
    name, model, X = case
    labels_ref, dist_ref = model.assign(X)
    encodings = ENCODINGS if model.kind == "factor-chain" else ("dense",)
    for enc in encodings:
        proto = to_onnx(model, encoding=enc)
        onnx.checker.check_model(proto, full_check=True)
        labels, dist = _run(proto, X)
        assert labels.dtype == np.int64 and dist.dtype == np.float32, enc
        assert labels.shape == dist.shape == (X.shape[0],)
        np.testing.assert_array_equal(labels, labels_ref, err_msg=f"{name} {enc}")
        np.testing.assert_allclose(dist, dist_ref, rtol=1e-4, atol=1e-6 * float(dist_ref.max()),
                                   err_msg=f"{name} {enc}")
        assert _props(proto)["qkm.encoding"] == enc
        sess = onnx_session(proto)
        for i in range(4):  # single rows take another branch of the hybrid's sparse stage
            label, d = sess.run(None, {"X": X[i:i + 1]})
            assert label.tolist() == [labels_ref[i]], f"{name} {enc} row {i}"
            np.testing.assert_allclose(d, dist_ref[i:i + 1], rtol=1e-4, atol=1e-6 * float(dist_ref.max()))


def test_scores_are_squared_distances(case):
    name, model, X = case
    ref = model.operator.sq_distances(np.asarray(X, dtype=model.operator.dtype))
    encodings = ENCODINGS if model.kind == "factor-chain" else ("dense",)
    for enc in encodings:
        proto = to_onnx(model, encoding=enc, scores=True)
        onnx.checker.check_model(proto, full_check=True)
        labels, dist, scores = _run(proto, X)
        assert scores.shape == (X.shape[0], model.n_clusters) and scores.dtype == np.float32
        np.testing.assert_allclose(scores, ref, rtol=1e-4, atol=1e-6 * float(ref.max()), err_msg=f"{name} {enc}")
        assert (scores >= 0).all()
        np.testing.assert_array_equal(dist, scores.min(axis=1))
        np.testing.assert_array_equal(labels, model.predict(X))
        np.testing.assert_allclose(np.sqrt(scores), model.transform(X), rtol=1e-3, atol=1e-3)


def test_metadata_and_standard_ops(case):
    name, model, X = case
    proto = to_onnx(model, encoding="dense" if model.kind == "kmeans" else "hybrid")
    props = _props(proto)
    for key in ("qkm.encoding", "qkm.version", "qkm.n_clusters", "qkm.n_features", "qkm.nnz"):
        assert key in props, key
    assert props["qkm.version"] == qkm.__version__
    assert int(props["qkm.n_clusters"]) == model.n_clusters
    assert int(props["qkm.n_features"]) == model.n_features
    assert int(props["qkm.nnz"]) == model.operator.nnz
    if "sparsity_level" in model.metadata:
        assert props["qkm.sparsity_level"] == str(model.metadata["sparsity_level"])
    assert [o.domain for o in proto.opset_import] == [""]
    assert all(n.domain == "" for n in proto.graph.node)
    # float32 everywhere, whatever the model's dtype
    assert all(t.data_type != onnx.TensorProto.DOUBLE for t in proto.graph.initializer)
    (x,) = proto.graph.input
    dims = x.type.tensor_type.shape.dim
    assert x.name == "X" and x.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert dims[0].dim_param and dims[1].dim_value == model.n_features
    assert [o.name for o in proto.graph.output] == ["label", "distance"]


def test_hybrid_plans():
    assert hybrid_plan(_make("chain_K64_D16").operator.factors)["side"] == "head"
    single = hybrid_plan(_make("chain_Q1").operator.factors)
    assert single["side"] == "tail" and single["virtual_rows"] == 6
    assert "Gemm" not in {n.op_type for n in to_onnx(_make("chain_Q1"), encoding="hybrid").graph.node}
    split = _make("chain_split")
    plan = hybrid_plan(split.operator.factors)
    assert plan["side"] == "tail" and plan["slots"] < 30 and plan["virtual_rows"] > 6
    proto = to_onnx(split, encoding="hybrid")
    assert json.loads(_props(proto)["qkm.hybrid"]) == plan
    assert "Gather" in {n.op_type for n in proto.graph.node}


def test_split_rows_reconstructs_the_matrix():
    rng = np.random.default_rng(0)
    S = sp.random(7, 50, density=0.3, random_state=0, format="lil")
    S[2] = 0
    S = sp.csr_matrix(S)
    for slots in (1, 2, 5, 50):
        idx, val, merge = split_rows(S, slots)
        x = rng.normal(size=50)
        virtual = (val * x[idx]).sum(axis=1)
        got = virtual if merge is None else merge @ virtual
        np.testing.assert_allclose(got, S @ x, rtol=1e-5, atol=1e-6)
        assert (merge is None) == (slots >= np.diff(S.indptr).max())


def test_sparse_file_is_smaller_than_dense():
    model = Model(FactorChainOperator(random_chain(64, 512, s=2)))
    sizes = {enc: len(to_onnx(model, encoding=enc).SerializeToString()) for enc in ENCODINGS}
    assert sizes["sparse"] < sizes["dense"] / 3
    assert sizes["hybrid"] < sizes["dense"] / 3


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_opsets(opset):
    model, X = _CACHE.get("qk_K6_D20_Q2") or (lambda m: (m, _query(m)))(_make("qk_K6_D20_Q2"))
    for enc in ENCODINGS:
        proto = to_onnx(model, encoding=enc, scores=True, opset=opset)
        onnx.checker.check_model(proto, full_check=True)
        assert proto.opset_import[0].version == opset
        labels, dist, scores = _run(proto, X)
        np.testing.assert_array_equal(labels, model.predict(X))


def test_auto_picks_a_timed_candidate_and_records_it():
    model, X = _CACHE.get("qk_K8_D32_Q5_f32") or (lambda m: (m, _query(m)))(_make("qk_K8_D32_Q5_f32"))
    proto = to_onnx(model, sample=X, batch_sizes=(1, 16), timing_rounds=3)
    onnx.checker.check_model(proto, full_check=True)
    props = _props(proto)
    assert props["qkm.encoding"] in ENCODINGS and props["qkm.encoding_requested"] == "auto"
    report = json.loads(props["qkm.auto_timings"])
    assert report["chosen"] == props["qkm.encoding"]
    assert set(report["median_seconds"]) == set(ENCODINGS)
    assert report["batch_sizes"] == [1, 16] and report["rounds"] == 3
    assert all(t > 0 for per in report["median_seconds"].values() for t in per.values())
    assert report["chosen"] in report["eligible"] and {"sparse", "dense"} <= set(report["eligible"])
    best = min(report["score_seconds"][name] for name in report["eligible"])
    assert report["score_seconds"][report["chosen"]] <= best * 1.05 + 1e-12
    labels, _ = _run(proto, X)
    np.testing.assert_array_equal(labels, model.predict(X))
    # no sample: synthetic rows; a single batch size is accepted
    props = _props(to_onnx(model, batch_sizes=4, timing_rounds=3))
    assert json.loads(props["qkm.auto_timings"])["sample"].startswith("random")


def test_auto_on_a_dense_model_is_dense():
    model = _make("km_K5_D12")
    props = _props(to_onnx(model))
    assert props["qkm.encoding"] == "dense"
    assert json.loads(props["qkm.auto_timings"])["chosen"] == "dense"


@pytest.mark.parametrize("enc", ["sparse", "hybrid"])
def test_sparse_encodings_of_a_dense_model_are_refused(enc):
    with pytest.raises(ValueError, match="factor-chain"):
        to_onnx(_make("km_K5_D12"), encoding=enc)


@pytest.mark.parametrize("kwargs, match", [
    (dict(encoding="fast"), "encoding must be one of"),
    (dict(encoding=None), "encoding must be one of"),
    (dict(opset=11), "opset must be"),
    (dict(batch_sizes=()), "batch_sizes"),
    (dict(batch_sizes=(0, 4)), "batch_sizes"),
    (dict(n_threads=0), "n_threads"),
    (dict(sample=np.zeros((3, 5))), "sample must be"),
])
def test_bad_arguments(kwargs, match, tmp_path):
    model = Model(FactorChainOperator(random_chain(4, 12, s=2)))
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match=match):
        to_onnx(model, target, **kwargs)
    assert target.read_bytes() == b"old"


def test_not_a_model():
    with pytest.raises(TypeError):
        to_onnx(object(), encoding="dense")


def test_write_is_atomic(tmp_path, monkeypatch):
    model = Model(FactorChainOperator(random_chain(4, 12, s=2)))
    target = tmp_path / "m.onnx"
    proto = to_onnx(model, target, encoding="sparse")
    assert target.read_bytes() == proto.SerializeToString()
    assert _props(onnx.load(str(target)))["qkm.encoding"] == "sparse"
    before = target.read_bytes()

    def broken(proto, f):
        f.write(proto.SerializeToString()[:10])
        raise OSError("disk full")

    monkeypatch.setattr(qonnx, "_write_proto", broken)
    with pytest.raises(OSError, match="disk full"):
        to_onnx(model, target, encoding="dense")
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_session_from_path_bytes_and_proto(tmp_path):
    model = Model(FactorChainOperator(random_chain(4, 12, s=2)))
    X = np.random.default_rng(0).normal(size=(5, 12)).astype(np.float32)
    proto = to_onnx(model, tmp_path / "m.onnx", encoding="hybrid")
    outs = [onnx_session(src, n_threads=2).run(["label"], {"X": X})[0]
            for src in (proto, proto.SerializeToString(), tmp_path / "m.onnx", str(tmp_path / "m.onnx"))]
    for out in outs:
        np.testing.assert_array_equal(out, model.predict(X))
    with pytest.raises(ValueError, match="n_threads"):
        onnx_session(proto, n_threads=0)


def test_batch_dimension_is_symbolic():
    model = Model(FactorChainOperator(random_chain(4, 12, s=2)))
    X = np.random.default_rng(0).normal(size=(33, 12)).astype(np.float32)
    for enc in ENCODINGS:
        sess = onnx_session(to_onnx(model, encoding=enc))
        for n in (1, 2, 33):
            labels, dist = sess.run(None, {"X": X[:n]})
            np.testing.assert_array_equal(labels, model.predict(X[:n]))
        labels, dist = sess.run(None, {"X": X[:0]})
        assert labels.shape == dist.shape == (0,)
