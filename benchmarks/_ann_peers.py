"""The peers of ``ann.py``: faiss, hnswlib, pynndescent and exact search, each skipped with a message if it does not
import. Every ``*_methods`` function appends its build (seconds, bytes) to ``rows`` and returns
``[(name, settings)]`` where a setting is ``(label, query(Q, k) -> indices)``.
"""

import os
import pickle
import tempfile
import time

_KEEP = []  # objects a faiss index points to without owning them


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def faiss_methods(model, X, args, rows, dense):
    try:
        import faiss
    except ImportError as exc:
        print(f"  faiss skipped: {exc}", flush=True)
        return []
    import numpy as np

    faiss.omp_set_num_threads(args.threads)
    if not dense:
        return []
    D = X.shape[1]
    out = []

    def add(name, index, settings, t):
        rows.append(dict(method=name, build_s=t, bytes=int(faiss.serialize_index(index).nbytes)))
        out.append((name, settings))

    def ivf_settings(index, probes):
        def q(Q, k, p):
            index.nprobe = p
            return index.search(Q, k)[1]
        return [(f"nprobe {p}", lambda Q, k, p=p: q(Q, k, p)) for p in probes]

    def model_ivf():
        quantizer = faiss.IndexFlatL2(D)
        quantizer.add(np.ascontiguousarray(model.operator_.to_dense(), dtype=np.float32))
        ivf = faiss.IndexIVFFlat(quantizer, D, model.operator_.n_clusters)
        ivf.is_trained = True  # the coarse centroids are the model's
        ivf.add(X)
        _KEEP.append(quantizer)  # the IVF index points to it
        return ivf

    ivf, t = timed(model_ivf)
    add("faiss IVFFlat, model's centroids", ivf, ivf_settings(ivf, (4, 8)), t)
    ivf1024, t = timed(lambda: _trained(faiss.index_factory(D, "IVF1024,Flat"), X))
    add("faiss IVF1024,Flat", ivf1024, ivf_settings(ivf1024, (8, 16, 32)), t)

    def hnsw():
        index = faiss.IndexHNSWFlat(D, 32)
        index.add(X)
        return index

    h, t = timed(hnsw)

    def hq(Q, k, ef):
        h.hnsw.efSearch = ef
        return h.search(Q, k)[1]

    add("faiss HNSWFlat M32", h, [(f"efSearch {ef}", lambda Q, k, ef=ef: hq(Q, k, ef)) for ef in (16, 32, 64)], t)
    flat, t = timed(lambda: _added(faiss.IndexFlatL2(D), X))
    add("exact (faiss IndexFlatL2)", flat, [("", lambda Q, k: flat.search(Q, k)[1])], t)
    return out


def _trained(index, X):
    index.train(X)
    index.add(X)
    return index


def _added(index, X):
    index.add(X)
    return index


def hnswlib_methods(X, args, rows, dense):
    if not dense:
        return []
    try:
        import hnswlib
    except ImportError as exc:
        print(f"  hnswlib skipped: {exc}", flush=True)
        return []

    def build():
        index = hnswlib.Index(space="l2", dim=X.shape[1])
        index.init_index(max_elements=X.shape[0], M=16, ef_construction=200, random_seed=0)
        index.set_num_threads(args.threads)
        index.add_items(X)
        return index

    index, t = timed(build)
    with tempfile.TemporaryDirectory() as tmp:
        index.save_index(os.path.join(tmp, "h.bin"))
        size = os.path.getsize(os.path.join(tmp, "h.bin"))
    rows.append(dict(method="hnswlib M16", build_s=t, bytes=size))

    def q(Q, k, ef):
        index.set_ef(max(ef, k))
        return index.knn_query(Q, k)[0]

    return [("hnswlib M16", [(f"ef {ef}", lambda Q, k, ef=ef: q(Q, k, ef)) for ef in (20, 40, 80)])]


def pynndescent_methods(X, args, rows):
    try:
        import pynndescent
    except ImportError as exc:
        print(f"  pynndescent skipped: {exc}", flush=True)
        return []

    def build():
        index = pynndescent.NNDescent(X, random_state=0, n_jobs=args.threads)
        index.prepare()
        return index

    index, t = timed(build)
    try:
        size = len(pickle.dumps(index))
    except Exception:  # noqa: BLE001 (a size we cannot measure is reported as missing)
        size = None
    rows.append(dict(method="pynndescent", build_s=t, bytes=size))
    # queried with k >= 10 (its search keeps k candidates: k = 1 finds the nearest row far less often)
    return [("pynndescent", [(f"k>=10, epsilon {e}",
                              lambda Q, k, e=e: index.query(Q, max(k, 10), epsilon=e)[0][:, :k])
                             for e in (0.0, 0.1, 0.2)])]


def sparse_exact(X, rows):
    import numpy as np

    x_sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()

    def q(Q, k):
        G = (Q @ X.T).toarray() * -2.0 + x_sq
        part = np.argpartition(G, k - 1, axis=1)[:, :k] if k < G.shape[1] else np.argsort(G, axis=1)
        return np.take_along_axis(part, np.argsort(np.take_along_axis(G, part, axis=1), axis=1), axis=1)

    rows.append(dict(method="exact (scipy sparse products)", build_s=0.0,
                     bytes=int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)))
    return [("exact (scipy sparse products)", [("", q)])]


def add_batch_study_args(p, repo):
    """The options shared by the batch-path studies (``studies/ann_batch_paths.py``, ``studies/ann_batch_ab.py``)."""
    p.add_argument("--queries", type=int, default=3000)
    p.add_argument("--single", type=int, default=1000, help="queries timed one at a time")
    p.add_argument("--data-dir", default=str(repo.parent / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(repo / "benchmarks" / ".cache"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
