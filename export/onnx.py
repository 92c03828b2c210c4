"""ONNX export of a fitted k-means / QK-means model (installed as ``qkm.export.onnx``).

:func:`to_onnx` writes a graph with standard ONNX operators only, which any
ONNX runtime can run (onnxruntime for Python, C/C++, C#, Java, Node.js, the
browser). :func:`onnx_session` opens one in onnxruntime with the thread
settings the benchmarks and the HTTP service use.

Graph contract
--------------
- input ``X``: float32 ``[batch, n_features]`` (symbolic batch dimension);
- output ``label``: int64 ``[batch]``, index of the closest centroid (the first
  one on exact ties, like ``predict``);
- output ``distance``: float32 ``[batch]``, *squared* Euclidean distance to that
  centroid, clipped at 0 (``||x||^2 - 2 x.v + ||v||^2`` can round below 0);
- output ``scores`` (``scores=True``): float32 ``[batch, n_clusters]``, squared
  Euclidean distances to every centroid, clipped at 0. skl2onnx's k-means
  graph names its second output ``scores`` too but returns Euclidean distances
  (``KMeans.transform``, a ``Sqrt`` of the same quantity); here they stay
  squared, like ``distance``, the k-means objective and
  ``model.operator.sq_distances``. Take ``sqrt`` for ``transform``.

Values are stored in float32; a float64 model is rounded to float32 at export
(the input is float32), so rows that are near-ties between two centroids may
get the other label than float64 ``predict``.

Encodings (``encoding=``)
-------------------------
``"dense"``
    one dense ``-2 V^T`` initializer (K x D floats) and one ``Gemm``: the graph
    skl2onnx makes for k-means, minus its ``[batch, K]`` ``||x||^2`` addition
    and ``Sqrt``. Needs no graph optimisation from the runtime.
``"sparse"``
    the factors ``S_1 ... S_Q`` stored in COO form (12 bytes per nonzero:
    float32 value + int64 index), multiplied into ``-2 V^T`` by constant
    ``MatMul`` nodes that onnxruntime folds once when the session is created:
    dense speed, file about ``compression / 3`` times smaller, slower session
    creation (the fold runs then; see docs/decisions.md, 'ONNX encodings'). The factors are ``Constant`` nodes
    with ``sparse_value`` (ONNX's standard way to embed a sparse constant used as
    a dense tensor): a raw ``graph.sparse_initializer`` is typed ``sparse_tensor``,
    which no standard operator accepts and ``onnx.checker`` (full check) rejects.
    A runtime that does not fold constants (onnxruntime with
    ``ORT_DISABLE_ALL``) multiplies the chain again at every call: use
    ``"dense"`` there.
``"hybrid"``
    the factor touching D (``S_Q``; ``S_1`` when that leaves a smaller dense
    part, e.g. K > D) applied as a sparse stage of standard ops on an ELL
    layout (``Gather`` on axis 0 + batched ``MatMul``; for a single row
    ``GatherElements`` + ``Mul`` + ``ReduceSum``, selected by an ``If`` on the
    batch size), the rest of the chain folded (as for ``"sparse"``) into one
    dense K x A matrix applied by ``Gemm``. Rows of ``S_Q`` holding many entries
    are split into virtual rows so the gather stage carries little padding.
    Fastest when K x D is large (fewer multiply-adds than the K x D ``Gemm``);
    for small models the per-node overhead makes it slower than ``dense``.
``"auto"`` (default)
    builds ``sparse``, ``hybrid`` and ``dense`` and times them in onnxruntime
    with ``n_threads`` threads on a sample batch at every size in
    ``batch_sizes`` (interleaved rounds, calls repeated for >= 1 ms per cell so
    caches are warm as in a serving loop, median per batch size). A candidate
    is *eligible* if at no batch size it is more than ``tolerance`` (5 %) slower
    than the dense ``Gemm`` graph (the faster of ``dense`` / ``sparse``, which
    run the same folded graph): ``auto`` never trades a loss at one batch size
    of interest for a gain at another, so pass the batch sizes you will use.
    Among eligible candidates the lowest geometric mean of the medians over the
    batch sizes wins (every batch size weighs the same in relative terms);
    candidates within ``tolerance`` of it are ties and the smallest file wins
    (``sparse`` and ``dense`` run the same graph, so the file decides between
    them: ``sparse`` unless the factors hold more than about a third of K x D
    values, 12 bytes per nonzero against 4 per dense entry). The timings, the
    eligible set and the rule are stored in ``metadata_props["qkm.auto_timings"]``.
    For a dense k-means model only ``dense`` applies and nothing is timed.
    Timings are noisy on shared machines; ``auto`` is a measurement, not a
    guarantee, and two exports of the same model can choose differently when
    candidates are close.

An explicit ``"sparse"`` or ``"hybrid"`` for a dense (``qkm.KMeans``) model
raises ``ValueError``: there are no factors to store.

``metadata_props``: ``qkm.encoding`` (the encoding used, also after ``auto``),
``qkm.encoding_requested``, ``qkm.version`` (qkm that exported the graph),
``qkm.model_version`` (qkm that trained the model), ``qkm.kind``, ``qkm.n_clusters``,
``qkm.n_features``, ``qkm.nnz``, ``qkm.n_factors``, ``qkm.sparsity_level`` (when
known), ``qkm.algorithm``, ``qkm.source_dtype``, ``qkm.outputs``,
``qkm.hybrid`` (JSON: side, slots, virtual rows, padding) and ``qkm.auto_timings``
(JSON, ``auto`` only).
"""

import json
import os

import numpy as np

from ._onnx_graph import DEFAULT_OPSET, MIN_OPSET, build_graph, check, hybrid_plan

__all__ = ["ENCODINGS", "onnx_session", "to_onnx"]

ENCODINGS = ("auto", "sparse", "hybrid", "dense")
_PROTOBUF_LIMIT = 2**31 - 1


def onnx_session(proto_or_path, n_threads=1):
    """An ``onnxruntime.InferenceSession`` on the CPU with ``n_threads`` intra-op threads.

    Parameters
    ----------
    proto_or_path : onnx.ModelProto, bytes, str or os.PathLike
        The model, serialised bytes or a file.
    n_threads : int, default=1
        ``intra_op_num_threads``; inter-op threads are 1 (the graphs are
        sequential). Graph optimisations are all on: the ``sparse`` and
        ``hybrid`` encodings rely on constant folding.

    Returns
    -------
    onnxruntime.InferenceSession

    Examples
    --------
    >>> import numpy as np, qkm
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0, 0], [1, 0], [10, 0], [11, 0]]))
    >>> sess = onnx_session(to_onnx(km))
    >>> sess.run(["label"], {"X": np.array([[0.5, 0], [10.5, 0]], dtype=np.float32)})[0].tolist()
    [1, 0]
    """
    import onnxruntime as ort

    if not (isinstance(n_threads, (int, np.integer)) and not isinstance(n_threads, bool) and n_threads >= 1):
        raise ValueError(f"n_threads must be a positive integer; got {n_threads!r}.")
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(n_threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if hasattr(proto_or_path, "SerializeToString"):
        source = proto_or_path.SerializeToString()
    elif isinstance(proto_or_path, (bytes, bytearray)):
        source = bytes(proto_or_path)
    else:
        source = os.fspath(proto_or_path)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _check_args(encoding, opset, batch_sizes, n_threads, tolerance):
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(map(repr, ENCODINGS))}; got {encoding!r}.")
    import onnx

    top = onnx.defs.onnx_opset_version()
    if not (isinstance(opset, (int, np.integer)) and not isinstance(opset, bool) and MIN_OPSET <= opset <= top):
        raise ValueError(f"opset must be an integer from {MIN_OPSET} to {top}; got {opset!r}.")
    sizes = tuple(batch_sizes) if np.ndim(batch_sizes) else (batch_sizes,)
    if not sizes or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1
                            for b in sizes):
        raise ValueError(f"batch_sizes must be positive integers; got {batch_sizes!r}.")
    if not (isinstance(n_threads, (int, np.integer)) and not isinstance(n_threads, bool) and n_threads >= 1):
        raise ValueError(f"n_threads must be a positive integer; got {n_threads!r}.")
    if not (0.0 <= float(tolerance) < 1.0):
        raise ValueError(f"tolerance must be in [0, 1); got {tolerance!r}.")
    return tuple(sorted({int(b) for b in sizes}))


def _write_proto(proto, f):
    f.write(proto.SerializeToString())


def to_onnx(model, path=None, *, encoding="auto", scores=False, opset=None, sample=None,
            batch_sizes=(1, 64, 1024), n_threads=1, timing_rounds=None, tolerance=0.05):
    """ONNX graph of a fitted model's centroid operator: ``X`` -> ``label``, ``distance`` (, ``scores``).

    See the module documentation for the graph contract and the encodings.

    Parameters
    ----------
    model : fitted qkm.KMeans, QKMeans, LowRankKMeans, or qkm.export.Model
        Anything :func:`qkm.export.as_model` accepts (a loaded model too).
    path : str or os.PathLike, optional
        Write the model there, atomically (temporary file + rename: a failed
        export leaves an existing file as it was).
    encoding : {"auto", "sparse", "hybrid", "dense"}, default="auto"
    scores : bool, default=False
        Add the ``scores`` output: squared distances to every centroid, [batch, K].
    opset : int, optional
        ONNX opset of the default domain; default 17 (onnxruntime >= 1.13).
    sample : array-like of shape (n, n_features), optional
        Rows to time ``auto`` on (cycled to the batch sizes); default: random
        rows near the centroids.
    batch_sizes : sequence of int, default=(1, 64, 1024)
        Batch sizes ``auto`` times (the ones the graph will be run with).
    n_threads : int, default=1
        onnxruntime intra-op threads for ``auto``'s timings.
    timing_rounds : int, optional
        Interleaved timing rounds for ``auto``; default as many as fit in about
        2 s (3 to 25).
    tolerance : float, default=0.05
        ``auto``: allowed slowdown against the dense graph at any batch size,
        and the score difference under which the smaller file wins.

    Returns
    -------
    onnx.ModelProto
        Passes ``onnx.checker.check_model(proto, full_check=True)``.

    Raises
    ------
    ValueError
        Unknown encoding, bad opset / batch sizes / sample, or ``"sparse"`` /
        ``"hybrid"`` for a dense k-means model; a graph over the 2 GB protobuf limit.
    TypeError
        ``model`` is not a fitted qkm estimator or model.

    Examples
    --------
    >>> import numpy as np, qkm
    >>> from qkm.export import to_onnx
    >>> from qkm.export.onnx import onnx_session
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(3 * c, 0.3, size=(40, 16)) for c in range(4)]).astype(np.float32)
    >>> est = qkm.QKMeans(4, sparsity_level=2, max_iter=5, random_state=0).fit(X)
    >>> proto = to_onnx(est, encoding="sparse")
    >>> labels, sq_dist = onnx_session(proto).run(None, {"X": X[::20]})
    >>> bool((labels == est.predict(X[::20])).all())
    True
    >>> meta = {p.key: p.value for p in proto.metadata_props}
    >>> meta["qkm.encoding"], meta["qkm.n_clusters"], meta["qkm.n_features"]
    ('sparse', '4', '16')
    >>> auto = to_onnx(est, batch_sizes=(1, 8), timing_rounds=3)
    >>> {p.key: p.value for p in auto.metadata_props}["qkm.encoding"] in ("sparse", "hybrid", "dense")
    True
    """
    from qkm._version import __version__
    from qkm.io._atomic import atomic_open

    from ._model import as_model

    opset = DEFAULT_OPSET if opset is None else opset
    batch_sizes = _check_args(encoding, opset, batch_sizes, n_threads, tolerance)
    m = as_model(model)
    op = m.operator
    chain = m.kind == "factor-chain"
    if not chain and encoding in ("sparse", "hybrid"):
        raise ValueError(f"encoding={encoding!r} needs a factor-chain model (QKMeans, LowRankKMeans); this is a "
                         "dense k-means model: use encoding='dense' or 'auto'.")
    plan = hybrid_plan(op.factors) if chain else None
    auto_report = None
    if encoding == "auto" and chain:
        from ._onnx_auto import choose, sample_batches

        names = ("sparse", "hybrid", "dense")
        if 4 * op.n_clusters * op.n_features > _PROTOBUF_LIMIT - 2**24:  # a dense graph cannot be written
            names = names[:2]
        protos = {name: build_graph(op, name, scores=scores, opset=opset, plan=plan) for name in names}
        batches, origin = sample_batches(op, sample, batch_sizes)
        blobs = {name: p.SerializeToString() for name, p in protos.items()}
        chosen, auto_report = choose(blobs, batches, n_threads=n_threads, rounds=timing_rounds,
                                     tolerance=tolerance, session=onnx_session)
        auto_report["sample"] = origin
        proto = protos[chosen]
    elif encoding == "auto":
        chosen = "dense"
        auto_report = {"chosen": "dense", "rule": "dense k-means model: dense is the only candidate, not timed"}
        proto = build_graph(op, "dense", scores=scores, opset=opset)
    else:
        chosen = encoding
        proto = build_graph(op, encoding, scores=scores, opset=opset, plan=plan)

    meta = m.metadata
    props = {
        "qkm.encoding": chosen,
        "qkm.encoding_requested": encoding,
        "qkm.version": __version__,
        "qkm.model_version": str(meta.get("qkm_version", __version__)),
        "qkm.kind": m.kind,
        "qkm.n_clusters": str(int(op.n_clusters)),
        "qkm.n_features": str(int(op.n_features)),
        "qkm.nnz": str(int(op.nnz)),
        "qkm.source_dtype": str(np.dtype(op.dtype)),
        "qkm.outputs": ("label: int64 index of the closest centroid; distance: float32 squared Euclidean distance "
                        "to it; scores: float32 squared Euclidean distances to every centroid" if scores else
                        "label: int64 index of the closest centroid; distance: float32 squared Euclidean "
                        "distance to it"),
    }
    if chain:
        props["qkm.n_factors"] = str(len(op.factors))
        if chosen == "hybrid":
            props["qkm.hybrid"] = json.dumps(plan)
    if meta.get("sparsity_level") is not None:
        props["qkm.sparsity_level"] = str(meta["sparsity_level"])
    if meta.get("algorithm") is not None:
        props["qkm.algorithm"] = str(meta["algorithm"])
    if auto_report is not None:
        props["qkm.auto_timings"] = json.dumps(auto_report, sort_keys=True)
    from onnx import helper

    helper.set_model_props(proto, props)
    proto.producer_version = props["qkm.version"]
    proto.doc_string = (f"qkm {m.kind} model, K={op.n_clusters}, D={op.n_features}, encoding {chosen}. "
                        "Input X float32 [batch, D]; outputs " + props["qkm.outputs"] + ".")
    if proto.ByteSize() > _PROTOBUF_LIMIT:
        hint = "use encoding='sparse' or 'hybrid'" if chain and chosen == "dense" else "the model is too large"
        raise ValueError(f"the {chosen!r} graph is {proto.ByteSize() / 2**30:.1f} GiB, over protobuf's 2 GiB "
                         f"limit: {hint}.")
    check(proto)
    if path is not None:
        with atomic_open(path, "wb") as f:
            _write_proto(proto, f)
    return proto
