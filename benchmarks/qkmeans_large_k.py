"""QK-means at many clusters (K = 256 ... 4,096): fit time, objective, compression and assignment time.

Rerun (from the repository root; matplotlib draws the plot)::

    .venv/bin/pip install -r benchmarks/requirements.txt
    .venv/bin/python benchmarks/qkmeans_large_k.py --out benchmarks/results/qkmeans_large_k

The phases cache what they compute under ``--cache`` (git-ignored), so the
long ones can run in separate processes (one per core) and the report be
rebuilt from the cache: ``--phase seeds|kmeans|qkmeans|predict|report``
(default: all in order), ``--k`` restricts the K values of a phase.

Protocol (Fashion-MNIST, the 60,000 training images, pixels / 255, float64,
1 thread: ``n_jobs=1`` and BLAS pinned to one thread before numpy loads):

* ``seeds``: ``qkm.kmeans_plusplus(X, K, random_state=0)``, timed once per K:
  the same centres ``KMeans(n_clusters=K, random_state=0)`` and
  ``QKMeans(n_clusters=K, random_state=0)`` draw themselves (greedy
  k-means++, checked in the tests), computed once because at K = 4,096 it
  alone takes tens of minutes on one core;
* ``kmeans``: ``qkm.KMeans(n_clusters=K, init=seeds)``, every other
  parameter at its default, for every K of ``--dense-k`` (16 ... 4,096);
* ``qkmeans``: ``qkm.QKMeans(n_clusters=K, sparsity_level=3, init=seeds)``,
  every other parameter at its default, for every K of ``--qk-k``;
* fit time = the seeding's seconds + the fit's (both methods pay the same
  seeding); peak memory = tracemalloc's peak during the fit (numpy and
  numba arrays are traced; the data set itself is not counted);
* ``predict``: every model's ``predict`` on held-out rows (the 10,000 test
  images): one row per call (median over the rows of the best of 3 calls each)
  and per row of batches of 1,024 (best of 5), models interleaved; for the dense
  models also the BLAS floor (``argmin(||c||^2 - 2 X C^T)`` in numpy, no
  checks), so the ratio to plain numpy is there too.

The Markdown and JSON record every figure, the command, the commit and the
machine; the plot is objective against time per row (one row, and batches of
1,024) for the dense curve and the QK-means models.
"""

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]
DENSE_K = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QK_K = (256, 512, 1024, 2048, 4096)


def _pin_threads(n):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", default="all",
                   choices=("all", "seeds", "kmeans", "qkmeans", "predict", "index", "report"))
    p.add_argument("--k", default=None, help="comma-separated K values for this phase (default: all of its own)")
    p.add_argument("--dense-k", default=",".join(map(str, DENSE_K)))
    p.add_argument("--qk-k", default=",".join(map(str, QK_K)))
    p.add_argument("--rows", type=int, default=60000, help="training rows (the first ones)")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--cache", default=str(REPO / "benchmarks" / ".cache" / "qkmeans_large_k"))
    p.add_argument("--out", default=None, help="write <out>.json, <out>.md and <out>.png")
    return p.parse_args()


def _load(args):
    import numpy as np
    from _paper_data import load_dataset
    X, _ = load_dataset("fashion-mnist", args.data_dir)
    X = np.ascontiguousarray(X[:args.rows], dtype=np.float64)
    from qkm.io import load_data
    T, _ = load_data(str(Path(args.data_dir) / "fashion-mnist" / "t10k-images-idx3-ubyte.gz"))
    T = np.ascontiguousarray(T, dtype=np.float64) / 255.0
    return X, T


def _ks(args, default):
    own = [int(k) for k in default.split(",") if k]
    return [int(k) for k in args.k.split(",")] if args.k else own


def _cache(args):
    path = Path(args.cache)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _save_json(path, payload):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def phase_seeds(args, X, ks):
    import numpy as np
    from qkm import kmeans_plusplus
    cache = _cache(args)
    for K in ks:
        if (cache / f"seeds_{K}.json").exists():
            continue
        t0 = time.perf_counter()
        C = kmeans_plusplus(X, K, random_state=0, n_jobs=1)
        C = C[0] if isinstance(C, tuple) else C
        seconds = time.perf_counter() - t0
        np.save(cache / f"seeds_{K}.npy", C)
        _save_json(cache / f"seeds_{K}.json", {"K": K, "seconds": seconds})
        print(f"seeds K={K}: {seconds:.1f} s", flush=True)


def _seeds(args, K):
    import numpy as np
    cache = _cache(args)
    return np.load(cache / f"seeds_{K}.npy"), json.loads((cache / f"seeds_{K}.json").read_text())["seconds"]


def _fit(make, X, progress=None):
    import tracemalloc
    tracemalloc.start()
    t0 = time.perf_counter()
    model = make().fit(X, callback=progress)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return model, seconds, peak


def phase_fit(args, X, ks, kind):
    import pickle
    from qkm import KMeans, QKMeans
    cache = _cache(args)
    warm = KMeans if kind == "kmeans" else QKMeans          # compile (or load) the kernels before any timing
    warm(n_clusters=8, random_state=0, n_jobs=1, max_iter=3).fit(X[:500])
    warm(n_clusters=8, random_state=0, n_jobs=1, max_iter=3, init=X[:8]).fit(X[:500])
    for K in ks:
        out = cache / f"{kind}_{K}.json"
        if out.exists():
            continue
        seeds, seed_seconds = _seeds(args, K)
        if kind == "kmeans":
            def make():
                return KMeans(n_clusters=K, init=seeds, random_state=0, n_jobs=1)
        else:
            def make():
                return QKMeans(n_clusters=K, sparsity_level=3, init=seeds, random_state=0, n_jobs=1)
        t_start = time.perf_counter()

        def progress(rec):
            print(f"  K={K} {kind} {time.perf_counter() - t_start:8.1f} s  {rec.get('step')} "
                  f"objective={rec.get('objective')}", file=sys.stderr, flush=True)

        model, seconds, peak = _fit(make, X, progress)
        rec = {"K": K, "kind": kind, "fit_seconds": seconds, "seed_seconds": seed_seconds,
               "total_seconds": seconds + seed_seconds, "peak_bytes": peak, "objective": float(model.inertia_),
               "n_iter": int(model.n_iter_)}
        if kind == "qkmeans":
            rec.update(nnz=int(model.nnz_), compression=float(model.compression_),
                       factor_shapes=[list(f.shape) for f in model.factors_],
                       factor_nnz=[int(f.nnz) for f in model.factors_],
                       step_seconds=_step_seconds(model.history_))
        with open(cache / f"{kind}_{K}.pkl", "wb") as fh:
            pickle.dump(model, fh)
        _save_json(out, rec)
        print(json.dumps(rec), flush=True)


def _step_seconds(history):
    out = {}
    for rec in history:
        step = rec.get("step")
        if step is not None:
            out[step] = out.get(step, 0.0) + float(rec.get("seconds") or 0.0)
    return out


def _models(args, dense_k, qk_k):
    import pickle
    cache = _cache(args)
    out = []
    for kind, ks in (("kmeans", dense_k), ("qkmeans", qk_k)):
        for K in ks:
            path = cache / f"{kind}_{K}.pkl"
            if path.exists():
                with open(path, "rb") as fh:
                    out.append((kind, K, pickle.load(fh)))
    return out


def _best(f, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def phase_predict(args, T, dense_k, qk_k, n_rows=200, batch=1024):
    """One-row and batch timings of every model, interleaved (see the module docstring)."""
    import numpy as np
    from qkm.export.onnx import onnx_session, to_onnx
    models = _models(args, dense_k, qk_k)
    rows = [np.ascontiguousarray(T[i:i + 1]) for i in range(n_rows)]
    B = np.ascontiguousarray(T[:batch])
    floors, sessions = {}, {}
    for kind, K, m in models:
        if kind == "kmeans":
            C = np.ascontiguousarray(m.cluster_centers_)
            c_sq = np.einsum("ij,ij->i", C, C)
            floors[K] = (lambda x, C=C, c_sq=c_sq: np.argmin(c_sq - 2.0 * (x @ C.T), axis=1))
        if kind == "qkmeans" or K in qk_k:           # ONNX: the QK-means graphs and the dense ones they face
            proto = to_onnx(m, sample=T[:2048], batch_sizes=(1, batch))
            sess = onnx_session(proto, n_threads=1)
            enc = proto.metadata_props
            sessions[kind, K] = (sess, len(proto.SerializeToString()),
                                 {p.key: p.value for p in enc}.get("qkm.encoding", ""))
        assert np.array_equal(m.predict(B), m.operator_.assign(B)[0])      # the fast path gives assign's labels
    timings = {(kind, K): {"one": [], "kernel": [], "floor": [], "onnx_one": []} for kind, K, _ in models}
    for i, x in enumerate(rows):                       # interleaved: every model on the same row in turn
        for kind, K, m in models:
            t = timings[kind, K]
            t["one"].append(_best(lambda: m.predict(x), 3))
            lab, best = np.empty(1, dtype=np.int32), np.empty(1)
            t["kernel"].append(_best(lambda: m.operator_.partials(x, lab, best), 3))
            if kind == "kmeans":
                t["floor"].append(_best(lambda: floors[K](x), 3))
            if (kind, K) in sessions:
                sess = sessions[kind, K][0]
                feed = {"X": x.astype(np.float32)}
                t["onnx_one"].append(_best(lambda: sess.run(["label"], feed), 3))
    out = []
    Bf = B.astype(np.float32)
    warm = {}
    x = rows[0]
    for kind, K, m in models:            # the fixed cost: predict against its bare kernel, both in a warm loop
        op = m.operator_
        lab, best = np.empty(1, dtype=np.int32), np.empty(1)
        if kind == "kmeans":
            from qkm import _kernels
            C_T = op.C.T
            bare = (lambda op=op, C_T=C_T, lab=lab, best=best:
                    _kernels.assign_dense_small(x @ C_T, x, 1e-12, op.c_sq, lab, best))
        else:
            from qkm.operator import _chain_kernels
            bare = (lambda op=op, lab=lab, best=best:
                    _chain_kernels.chain_sample_dense(x, *op._chain, lab, best))
        loop = [(_best(lambda: [m.predict(x) for _ in range(200)], 7) / 200,
                 _best(lambda: [bare() for _ in range(200)], 7) / 200) for _ in range(1)][0]
        warm[kind, K] = loop
    for kind, K, m in models:
        t = timings[kind, K]
        rec = {"kind": kind, "K": K, "one_row_us": 1e6 * float(np.median(t["one"])),
               "kernel_one_row_us": 1e6 * float(np.median(t["kernel"])),
               "batch_us_per_row": 1e6 * _best(lambda: m.predict(B), 5) / batch,
               "execution_path_one": m.operator_.execution_path(1), "execution_path_batch":
               m.operator_.execution_path(batch)}
        rec["fixed_us"] = rec["one_row_us"] - rec["kernel_one_row_us"]
        rec["warm_predict_us"], rec["warm_bare_kernel_us"] = (1e6 * v for v in warm[kind, K])
        rec["warm_fixed_us"] = rec["warm_predict_us"] - rec["warm_bare_kernel_us"]
        if kind == "kmeans":
            rec["floor_one_row_us"] = 1e6 * float(np.median(t["floor"]))
            rec["floor_batch_us_per_row"] = 1e6 * _best(lambda: floors[K](B), 5) / batch
        if (kind, K) in sessions:
            sess, size, encoding = sessions[kind, K]
            rec.update(onnx_one_row_us=1e6 * float(np.median(t["onnx_one"])), onnx_bytes=size,
                       onnx_encoding=encoding,
                       onnx_batch_us_per_row=1e6 * _best(lambda: sess.run(["label"], {"X": Bf}), 5) / batch)
        out.append(rec)
        print(json.dumps(rec), flush=True)
    _save_json(_cache(args) / "predict.json", out)


def phase_index(args, X, T, K=1024, n_queries=1000):
    """ClusterIndex over the K = 1,024 QK-means model: the model's clusters as lists against the index's own
    partition (recall@1 on held-out queries, one query, a batch, build time). A report, no goal."""
    import pickle
    import numpy as np
    from qkm import ClusterIndex
    with open(_cache(args) / f"qkmeans_{K}.pkl", "rb") as fh:
        model = pickle.load(fh)
    Q = np.ascontiguousarray(T[:n_queries])
    x_sq = np.einsum("ij,ij->i", X, X)
    exact = np.empty(n_queries, dtype=np.int64)
    for start in range(0, n_queries, 250):                     # brute force, BLAS in blocks
        d = x_sq[None, :] - 2.0 * (Q[start:start + 250] @ X.T)
        exact[start:start + 250] = np.argmin(d, axis=1)
    out = []
    for partition in ("model", "auto"):
        t0 = time.perf_counter()
        index = ClusterIndex(model, partition=partition, random_state=0, n_jobs=1).fit(X)
        build = time.perf_counter() - t0
        _, got = index.query(Q, k=1)
        recall = float(np.mean(got[:, 0] == exact))
        one = [_best(lambda i=i: index.query(Q[i:i + 1], k=1), 3) for i in range(200)]
        batch = _best(lambda: index.query(Q, k=1), 3)
        rec = {"partition": partition, "K": K, "n_lists": int(index.n_lists_), "nprobe": int(index.nprobe_),
               "build_seconds": build, "recall_at_1": recall, "one_query_us": 1e6 * float(np.median(one)),
               "batch_us_per_query": 1e6 * batch / n_queries, "calibration": index.calibration_}
        out.append(rec)
        print(json.dumps(rec, default=float), flush=True)
    _save_json(_cache(args) / "index.json", json.loads(json.dumps(out, default=float)))


def _read(cache, name):
    path = cache / name
    return json.loads(path.read_text()) if path.exists() else None


def _below_curve(qk_obj, qk_time, dense):
    """Whether every dense model at least as fast as ``qk_time`` has a higher objective (goal: QK-means below
    dense K-means' curve on the (time, objective) plane); also the dense models that are that fast."""
    faster = [d for d in dense if d[1] <= qk_time]
    return all(d[2] > qk_obj for d in faster), [d[0] for d in faster]


def phase_report(args, dense_k, qk_k):
    """Tables, JSON and the plot from the cache."""
    from _machine import stamp, stamp_md
    cache = _cache(args)
    km = {K: _read(cache, f"kmeans_{K}.json") for K in dense_k}
    qk = {K: _read(cache, f"qkmeans_{K}.json") for K in qk_k}
    km = {K: r for K, r in km.items() if r}
    qk = {K: r for K, r in qk.items() if r}
    pred = {(r["kind"], r["K"]): r for r in (_read(cache, "predict.json") or [])}
    lines = ["# QK-means at many clusters: fit time, objective, compression and assignment time", "",
             "Fashion-MNIST, the 60,000 training images (/ 255, float64), 1 thread; `QKMeans(n_clusters=K, "
             "sparsity_level=3)` and `KMeans(n_clusters=K)`, every other parameter at its default, from the same "
             "k-means++ seeds (`random_state=0`, computed once and counted in both fit times). Timings on a shared "
             "2-core VM: the fits ran two to four at a time (one thread each; the phases below were started as "
             "separate processes), so a row's K-means and QK-means fits did not always run under the same load; "
             "the `predict` timings ran alone with at most one other process. See the script's docstring for "
             "the protocol.", "",
             "## Fit", "",
             "| K | K-means fit (s) | QK-means fit (s) | QK / K-means time | K-means iterations | QK-means "
             "iterations | objective / K-means' | compression | peak memory QK / K-means (MB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    fit_rows = []
    for K in sorted(qk):
        q, k = qk[K], km.get(K)
        if k is None:
            continue
        row = {"K": K, "kmeans_seconds": k["total_seconds"], "qkmeans_seconds": q["total_seconds"],
               "time_ratio": q["total_seconds"] / k["total_seconds"], "objective_ratio": q["objective"] /
               k["objective"], "compression": q["compression"], "kmeans_peak_mb": k["peak_bytes"] / 1e6,
               "qkmeans_peak_mb": q["peak_bytes"] / 1e6, "kmeans_iter": k["n_iter"], "qkmeans_iter": q["n_iter"],
               "seed_seconds": k["seed_seconds"]}
        fit_rows.append(row)
        lines.append(f"| {K:,} | {row['kmeans_seconds']:.0f} | {row['qkmeans_seconds']:.0f} | "
                     f"{row['time_ratio']:.2f}x | {row['kmeans_iter']} | {row['qkmeans_iter']} | "
                     f"{row['objective_ratio']:.3f} | {row['compression']:.1f}x | "
                     f"{row['qkmeans_peak_mb'] / row['kmeans_peak_mb']:.2f}x ({row['qkmeans_peak_mb']:.0f} / "
                     f"{row['kmeans_peak_mb']:.0f}) |")
    lines += ["", "Fit time includes the shared seeding (k-means++: " + ", ".join(
        f"{r['seed_seconds']:.0f} s at K = {r['K']:,}" for r in fit_rows) + ").", "",
        "QK-means' chain (from `history_`): " + "; ".join(
            f"K = {K:,}: shapes {qk[K]['factor_shapes']}, nonzeros {qk[K]['factor_nnz']}" for K in sorted(qk)) + ".",
        ""]
    dense = [(K, pred[("kmeans", K)], km[K]["objective"]) for K in sorted(km) if ("kmeans", K) in pred]
    pred_rows = []
    if pred:
        lines += ["## Assignment (`predict`)", "",
                  "Held-out rows (the 10,000 test images). One row: median over 200 rows of the best of 3 calls; "
                  "batch: per row of a batch of 1,024, best of 5. *kernel*: the operator's own `partials` call on "
                  "the row; *fixed*: `predict` minus *kernel*. *warm fixed*: `predict` minus its bare jitted kernel "
                  "(the chain's per-sample kernel, or BLAS plus the argmin kernel), both called 200 times in a row "
                  "on one row (best of 7): the checks and dispatch `predict` adds. *numpy*: "
                  "`argmin(||c||^2 - 2 x C^T)` on the dense centroids, no checks.", "",
                  "| model | K | objective | one row (us) | kernel (us) | fixed (us) | warm fixed (us) | batch (us/row) "
                  "| numpy one row (us) | numpy batch (us/row) | ONNX one row (us) | ONNX batch (us/row) | ONNX "
                  "encoding, size |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for (kind, K), r in sorted(pred.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            obj = (km if kind == "kmeans" else qk).get(K, {}).get("objective", float("nan"))
            name = "K-means" if kind == "kmeans" else "QK-means"
            onnx = (f"{r['onnx_one_row_us']:.1f} | {r['onnx_batch_us_per_row']:.2f} | {r['onnx_encoding']}, "
                    f"{r['onnx_bytes'] / 1024:.0f} KiB") if "onnx_bytes" in r else "- | - | -"
            floor = (f"{r['floor_one_row_us']:.1f} | {r['floor_batch_us_per_row']:.2f}"
                     if "floor_one_row_us" in r else "- | -")
            lines.append(f"| {name} | {K:,} | {obj:,.0f} | {r['one_row_us']:.1f} | {r['kernel_one_row_us']:.1f} | "
                         f"{r['fixed_us']:.1f} | {r.get('warm_fixed_us', float('nan')):.1f} | "
                         f"{r['batch_us_per_row']:.2f} | {floor} | {onnx} |")
        lines += ["", "| K | one row: dense / QK (predict) | batch: dense / QK (predict) | one row: numpy dense / QK "
                  "| ONNX one row: dense / QK | ONNX batch: dense / QK | QK below the dense curve (one row; "
                  "batch) |", "|---|---|---|---|---|---|---|"]
        for K in sorted(qk):
            q, d = pred.get(("qkmeans", K)), pred.get(("kmeans", K))
            if q is None or d is None:
                continue
            one = _below_curve(qk[K]["objective"], q["one_row_us"],
                               [(Kd, p["one_row_us"], o) for Kd, p, o in dense])
            bat = _below_curve(qk[K]["objective"], q["batch_us_per_row"],
                               [(Kd, p["batch_us_per_row"], o) for Kd, p, o in dense])
            row = {"K": K, "one_row_ratio": d["one_row_us"] / q["one_row_us"],
                   "batch_ratio": d["batch_us_per_row"] / q["batch_us_per_row"],
                   "numpy_one_row_ratio": d["floor_one_row_us"] / q["one_row_us"],
                   "onnx_one_row_ratio": d.get("onnx_one_row_us", float("nan")) / q.get("onnx_one_row_us",
                                                                                      float("nan")),
                   "onnx_batch_ratio": d.get("onnx_batch_us_per_row", float("nan")) / q.get(
                       "onnx_batch_us_per_row", float("nan")),
                   "below_one_row": one[0], "dense_as_fast_one_row": one[1], "below_batch": bat[0],
                   "dense_as_fast_batch": bat[1]}
            pred_rows.append(row)
            lines.append(f"| {K:,} | {row['one_row_ratio']:.1f}x | {row['batch_ratio']:.1f}x | "
                         f"{row['numpy_one_row_ratio']:.1f}x | {row['onnx_one_row_ratio']:.1f}x | "
                         f"{row['onnx_batch_ratio']:.1f}x | {'yes' if one[0] else 'no'} (dense K as fast: "
                         f"{one[1]}); {'yes' if bat[0] else 'no'} ({bat[1]}) |")
        lines.append("")
    index = _read(cache, "index.json")
    if index:
        lines += ["## ClusterIndex over the K = 1,024 QK-means model (a report)", "",
                  "`ClusterIndex(model, partition=..., random_state=0, n_jobs=1).fit(X)` on the 60,000 training "
                  "rows; recall@1 of the first 1,000 test images against brute force; one query: median over "
                  "200 queries of the best of 3; batch: the 1,000 queries at once. `model`: the QK-means "
                  "clusters are the lists, ranked per query through the factor chain; `auto`: the index's own "
                  "lists (a K-means of the rows' principal coordinates).", "",
                  "| partition | lists | nprobe | build (s) | recall@1 | one query (us) | batch (us/query) |",
                  "|---|---|---|---|---|---|---|"]
        for r in index:
            lines.append(f"| {r['partition']} | {r['n_lists']:,} | {r['nprobe']} | {r['build_seconds']:.1f} | "
                         f"{r['recall_at_1']:.4f} | {r['one_query_us']:.0f} | {r['batch_us_per_query']:.1f} |")
        lines.append("")
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    lines += ["Commands (all phases in one process: the first line; this file's runs split the phases into "
              "processes as below, the report reads the cache):", "", "```",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --qk-k 256,512,1024,2048,4096 "
              "--out benchmarks/results/qkmeans_large_k", "",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase seeds --k 4096",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase seeds --k 16,32,64,128,256,512,1024,2048",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase kmeans --k 4096",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase kmeans --k 256,1024",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase kmeans --k 16,32,64,128,512,2048",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase qkmeans --k 4096",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase qkmeans --k 1024",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase qkmeans --k 2048",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase qkmeans --k 256,512",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase predict --qk-k 256,512,1024,2048,4096",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase index",
              ".venv/bin/python benchmarks/qkmeans_large_k.py --phase report --qk-k 256,512,1024,2048,4096 "
              "--out benchmarks/results/qkmeans_large_k", "```", ""]
    payload = stamp({"command": command, "fit": fit_rows, "assignment": pred_rows, "index": index,
                     "kmeans": list(km.values()), "qkmeans": list(qk.values()), "predict": list(pred.values())})
    text = stamp_md("\n".join(lines), payload)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(payload, indent=1))
        Path(args.out + ".md").write_text(text)
        _plot(args.out + ".png", km, qk, pred)
    print(text)


def _plot(path, km, qk, pred):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "one_row_us", "one row per call"),
                           (axes[1], "batch_us_per_row", "batches of 1,024")):
        dk = [K for K in sorted(km) if ("kmeans", K) in pred]
        ax.plot([pred["kmeans", K][key] for K in dk], [km[K]["objective"] for K in dk], "o-", color="tab:blue",
                label="K-means (dense), K = 16 ... 4,096")
        for K in dk:
            ax.annotate(f"{K}", (pred["kmeans", K][key], km[K]["objective"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points", color="tab:blue")
        qkk = [K for K in sorted(qk) if ("qkmeans", K) in pred]
        ax.plot([pred["qkmeans", K][key] for K in qkk], [qk[K]["objective"] for K in qkk], "s", color="tab:red",
                label="QK-means, s = 3")
        for K in qkk:
            ax.annotate(f"{K}", (pred["qkmeans", K][key], qk[K]["objective"]), fontsize=8, xytext=(4, -10),
                        textcoords="offset points", color="tab:red")
        ax.set_xscale("log")
        ax.set_xlabel(f"predict time, {title} (us per row, log)")
        ax.set_ylabel("k-means objective (training set)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Fashion-MNIST, 60,000 x 784, 1 thread: lower left is better")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = _parse()
    _pin_threads(1)
    X, T = _load(args)
    phases = ("seeds", "kmeans", "qkmeans", "predict", "index", "report") if args.phase == "all" else (args.phase,)
    dense_k, qk_k = _ks(args, args.dense_k), _ks(args, args.qk_k)
    for phase in phases:
        if phase == "seeds":
            phase_seeds(args, X, sorted(set(dense_k) | set(qk_k)) if not args.k else dense_k)
        elif phase == "kmeans":
            phase_fit(args, X, dense_k, "kmeans")
        elif phase == "qkmeans":
            phase_fit(args, X, qk_k, "qkmeans")
        elif phase == "predict":
            phase_predict(args, T, dense_k, qk_k)
        elif phase == "index":
            phase_index(args, X, T)
        elif phase == "report":
            phase_report(args, dense_k, qk_k)


if __name__ == "__main__":
    main()
