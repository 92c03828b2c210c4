"""The ``qkm`` command line: ``qkm train``, ``predict``, ``score``, ``export``, ``serve`` and ``shard``.

Run ``qkm COMMAND --help`` for the options of each command.
"""

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

from .._version import __version__
from ._distributed import add_scheduler_option, add_shard_command

_DATA_HELP = (
    "data file: .npy, .csv, .npz (scipy sparse or np.savez with X[, y]), svmlight/libsvm "
    "(.svm, .libsvm, .txt or no suffix; .gz/.bz2 allowed), Matrix Market .mtx, MNIST idx(.gz), "
    "or a shard directory written by 'qkm shard'"
)


class ProgressBar:
    """Progress on stderr: a redrawn line on a terminal, one summary line otherwise (logs, pipes)."""

    def __init__(self, total, stream=None, width=30):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.start = time.perf_counter()
        self.last = None
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()

    def _line(self, record):
        it = record["iteration"]
        filled = int(self.width * min(it, self.total) / self.total)
        wcss = record.get("wcss", record.get("objective"))
        step = f" {record['step']}" if "step" in record else ""
        wcss_txt = f"{step} WCSS {wcss:.6g}" if wcss is not None else step
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] iteration {it}/{self.total}"
                f"{wcss_txt} {time.perf_counter() - self.start:.1f}s")

    def __call__(self, record):
        self.last = record
        if self.interactive:
            self.stream.write("\r" + self._line(record))
            self.stream.flush()

    def close(self):
        if self.last is not None:
            self.stream.write(("\r" if self.interactive else "") + self._line(self.last) + "\n")
            self.stream.flush()


def _load(path, fmt=None, n_features=None):
    """Load a data file; sparse files whose last columns are all zero are widened to ``n_features``."""
    import scipy.sparse as sp

    from ..io import load_data

    X, y = load_data(path, format=fmt)
    if n_features is not None and sp.issparse(X) and X.shape[1] < n_features:
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], n_features))
    return X, y


def _timed_fit(est, data, args):
    """``est.fit(data)`` with a progress bar unless ``--verbose``/``--quiet``; returns the wall-clock seconds."""
    progress = None if (args.verbose or args.quiet) else ProgressBar(est.max_iter)
    t0 = time.perf_counter()
    try:
        est.fit(data, callback=progress)
    finally:
        if progress is not None:
            progress.close()
    return time.perf_counter() - t0


def _make_estimator(args, init):
    """The estimator ``qkm train`` fits, from its arguments."""
    from ..clustering import KMeans, LowRankKMeans, QKMeans

    common = dict(n_clusters=args.k, init=init, d2_samples=args.d2_samples, init_sample=args.init_sample,
                  oversampling_factor=args.oversampling_factor, init_rounds=args.init_rounds,
                  random_state=args.seed, n_jobs=args.n_jobs, verbose=args.verbose)
    if args.algorithm in ("lloyd", "elkan"):
        return KMeans(n_init=args.n_init if args.n_init is not None else "auto",
                      max_iter=args.max_iter if args.max_iter is not None else 300,
                      tol=args.tol if args.tol is not None else 1e-4,
                      tol_wcss=args.tol_wcss, algorithm=args.algorithm, **common)
    loop = dict(n_init=args.n_init if args.n_init is not None else 1,
                max_iter=args.max_iter if args.max_iter is not None else 50,
                tol=args.tol if args.tol is not None else 1e-4, center=args.center)
    if args.algorithm == "lowrank":
        return LowRankKMeans(rank=args.rank, **loop, **common)
    return QKMeans(sparsity_level=args.sparsity_level, n_factors=args.n_factors, budget_split=args.budget_split,
                   palm_max_iter=args.palm_max_iter, palm_warm_iter=args.palm_warm_iter, **loop, **common)


def _cmd_train(args):
    from ..io._atomic import check_destination
    from ..clustering._init import distinct_row_indices
    from ..export import data_fingerprint, save_model
    from ..io import save_centroids, save_labels

    from ..clustering._seeding import SEEDINGS

    # before the work, not after it (with --scheduler, --labels names the per-shard files)
    for path in (args.output, None if args.scheduler else args.labels, args.centroids):
        if path is not None:
            check_destination(path)
    if args.scheduler:  # on a Dask cluster, over the shards of a `qkm shard` directory
        from ._distributed import train_sharded

        return train_sharded(args, _make_estimator, _timed_fit)
    X, y_file = _load(args.data, args.format)
    init = args.init
    if init not in SEEDINGS:
        init = np.load(init, allow_pickle=False)
    elif args.k >= 1 and min(X.shape) > 0 and (n_distinct := len(distinct_row_indices(X, stop_at=args.k))) < args.k:
        # the estimators would fit fewer clusters (with a warning); asked on the command line, it is an error
        raise ValueError(f"{args.data} holds {n_distinct} distinct row(s), fewer than the {args.k} clusters "
                         f"asked for: choose -k {n_distinct} or less.")
    est = _make_estimator(args, init)
    elapsed = _timed_fit(est, X, args)
    if args.verbose:  # the best run's seeding: its potential on the training data and its time
        first = est.history_[0]
        print(f"seeding: {first['seeding']} cost={first['seeding_cost']:.10g} "
              f"seconds={first['seeding_seconds']:.3f} rows={first['seeding_rows']}", file=sys.stderr)
    index = nystroem = None
    if args.with_index:  # inverted lists of the training rows, for approximate 1-NN search (/search)
        from ..approximate._cluster_index import ClusterIndex

        index = ClusterIndex(est, random_state=args.seed, n_jobs=args.n_jobs).fit(X, y_file)
    if args.with_features:  # Nyström RBF features with the trained centres as landmarks (/features)
        from ..approximate._nystroem import Nystroem

        nystroem = Nystroem(n_components=est.n_clusters_, landmarks=est, gamma=args.gamma).fit(X)
    save_model(est, args.output, index=index, nystroem=nystroem,
               extra_metadata={"train_seconds": elapsed, "data": os.path.basename(args.data),
                               "n_samples": int(X.shape[0]), "data_fingerprint": data_fingerprint(X)})
    args.written.append(args.output)
    if args.labels:
        save_labels(args.labels, est.labels_)
        args.written.append(args.labels)
    if args.centroids:
        save_centroids(args.centroids, est.cluster_centers_)
        args.written.append(args.centroids)
    summary = {
        "model": args.output,
        "algorithm": args.algorithm,
        "n_samples": int(X.shape[0]),
        "n_features": int(X.shape[1]),
        "n_clusters": int(est.n_clusters_),
        "n_iter": int(est.n_iter_),
        "inertia": float(est.inertia_),
        "nnz": int(est.operator_.nnz),
        "compression": round(float(est.operator_.compression), 3),
        "seconds": round(elapsed, 3),
    }
    paths = est.operator_.describe().get("execution_paths")
    if paths:  # which code path the centroid operator measured fastest, per batch kind/size
        summary["execution_paths"] = paths
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


def _load_any_model(path, trust_pickle):
    """A safe-format model, or a joblib artefact when the user trusts it."""
    from ..export import ModelFormatError, as_model, load_joblib, load_model

    try:
        return load_model(path)
    except ModelFormatError:
        if not trust_pickle:
            raise
    return as_model(load_joblib(path))


def _cmd_export(args):
    from ..export import save_joblib, save_model, to_onnx

    model = _load_any_model(args.model, args.trust_pickle)
    if args.format == "onnx":
        proto = to_onnx(model, args.output, encoding=args.encoding, scores=args.scores)
        props = {p.key: p.value for p in proto.metadata_props}
        summary = {"output": args.output, "format": "onnx", "encoding": props.get("qkm.encoding"),
                   "bytes": os.path.getsize(args.output)}
    elif args.format == "joblib":
        save_joblib(model, args.output)
        summary = {"output": args.output, "format": "joblib", "bytes": os.path.getsize(args.output)}
    else:
        save_model(model, args.output)
        summary = {"output": args.output, "format": "safe", "bytes": os.path.getsize(args.output)}
    args.written.append(args.output)
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


def _cmd_predict(args):
    from ..export import load_model
    from ..io import save_labels

    if args.scheduler:
        from ._distributed import predict_sharded

        return predict_sharded(args)

    model = load_model(args.model)
    X, _ = _load(args.data, args.format, n_features=model.n_features)
    labels = model.predict(X)
    if args.output:
        save_labels(args.output, labels)
        args.written.append(args.output)
    else:
        sys.stdout.write("\n".join(map(str, labels.tolist())) + "\n")
    return 0


def _cmd_score(args):
    from ..export import load_model
    from ..io import load_labels
    from ..metrics import clustering_scores, format_scores

    model = load_model(args.model) if args.model else None
    X, y_file = _load(args.data, args.format, n_features=model.n_features if model else None)
    labels_true = load_labels(args.true) if args.true else y_file
    if args.pred:
        labels_pred = load_labels(args.pred)
    elif model is not None:
        labels_pred = model.predict(X)
    else:
        raise SystemExit("qkm score: give --model or --pred so that there are predicted labels to score.")
    centers = model.operator.to_dense() if model is not None else None
    scores = clustering_scores(X, labels_pred=labels_pred, labels_true=labels_true, centers=centers)
    if args.json:
        print(json.dumps(scores, default=float))
    else:
        print(format_scores(scores))
    return 0


def _cmd_serve(args):
    from ..serve import ServeSettings, demo_model_path, run

    api_key = args.api_key or os.environ.get("QKM_API_KEY") or None
    limits = {name: getattr(args, name) for name in ("max_batch_rows", "max_body_bytes", "max_in_flight",
                                                     "inference_threads", "model_name")
              if getattr(args, name) is not None}
    settings = ServeSettings(model_path=args.model or demo_model_path(), backend=args.backend, api_key=api_key,
                             trust_pickle=args.trust_pickle, **limits)
    return run(settings, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level,
               access_log=not args.no_access_log)


def build_parser():
    """The argument parser of the ``qkm`` command."""
    parser = argparse.ArgumentParser(
        prog="qkm",
        description="Fast-transform k-means: train, predict and score k-means models on dense or sparse data.",
    )
    parser.add_argument("--version", action="version", version=f"qkm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="fit k-means on a data file and write a model file",
                       description="Fit k-means (Lloyd or Elkan) or QK-means (sparse-factor centroids) on dense "
                                   "or sparse data and write the model in qkm's safe format (atomically, with "
                                   "a format version).")
    p.add_argument("data", help=_DATA_HELP)
    p.add_argument("-k", "--n-clusters", dest="k", type=int, required=True, help="number of clusters K")
    p.add_argument("-o", "--output", required=True, help="model file to write (safe format, e.g. model.qkm)")
    p.add_argument("--algorithm", choices=["lloyd", "elkan", "qkmeans", "lowrank"], default="lloyd",
                   help="lloyd or elkan: exact k-means (same result from the same init); qkmeans: centroids as a "
                        "product of sparse factors (QK-means); lowrank: rank-constrained centroids; default: lloyd")
    p.add_argument("--init", default="k-means++",
                   help="'k-means++' (greedy, default), 'd2-seeding' (lowest seeding cost), 'k-means||' (fewest "
                        "passes over the data), 'random', or a .npy file of K x D initial centres")
    p.add_argument("--d2-samples", type=int, default=None,
                   help="d2-seeding: points drawn per step (default: 10 K)")
    p.add_argument("--oversampling-factor", type=float, default=2.0,
                   help="k-means||: candidates drawn per round, in multiples of K (default: 2)")
    p.add_argument("--init-rounds", type=int, default=5, help="k-means||: sampling rounds (default: 5)")
    p.add_argument("--init-sample", type=float, default=None, metavar="SAMP",
                   help="seed on a sample of about SAMP x K rows (SystemML's samp, 50 there; default: all rows)")
    p.add_argument("--n-init", type=int, default=None,
                   help="runs from different seeds, keeping the lowest WCSS (default: 1 for k-means++, 10 for random)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="iterations per run (default: 300 for lloyd/elkan, 50 for qkmeans/lowrank)")
    p.add_argument("--tol", type=float, default=None,
                   help="lloyd/elkan: stop when the total squared centre shift <= tol x mean feature variance; "
                        "qkmeans/lowrank: when an iteration lowers the objective by <= tol x its value "
                        "(default: 1e-4)")
    p.add_argument("--tol-wcss", type=float, default=0.0,
                   help="also stop when WCSS falls by <= this fraction in one iteration (SystemML); 0 = off")
    g = p.add_argument_group("QK-means (--algorithm qkmeans) and low-rank (--algorithm lowrank)")
    g.add_argument("--sparsity-level", type=int, default=3,
                   help="s: the model keeps at most the values of the paper's chain, s * max(r, c) per factor of "
                        "shape (r, c) over its floor(log2(max(K, D))) factors (default: 3)")
    g.add_argument("--n-factors", type=int, default=None,
                   help="number of sparse factors (default: 2 holding the values of the paper's floor(log2(max(K, D))) "
                        "when K <= D, else the paper's)")
    g.add_argument("--budget-split", choices=("auto", "total", "even", "wide"), default="auto",
                   help="how the factors share the values: 'total' (the paper chain's total on any number of "
                        "factors, the widest keeping s * max(r, c)), 'even' (s * max(r, c) each) or 'wide'; "
                        "'auto' (default): 'total' on the default chain, 'even' with --n-factors")
    g.add_argument("--palm-warm-iter", type=int, default=None,
                   help="factorisation sweeps per Lloyd iteration (default: 10, or 1 when the means are sparse)")
    g.add_argument("--palm-max-iter", type=int, default=None,
                   help="factorisation sweeps of the final polish (default: 300, or 3 when the means are sparse)")
    g.add_argument("--center", action="store_true",
                   help="keep the data mean beside the structure and fit the structure to the centred means")
    g.add_argument("--rank", type=int, default=8, help="rank of the centroid matrix for --algorithm lowrank (default: 8)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh entropy)")
    p.add_argument("--n-jobs", type=int, default=None, help="threads (default: all)")
    p.add_argument("--format", default=None, help="force the data format (npy, csv, npz, svmlight, mtx, idx)")
    p.add_argument("--labels", default=None, help="also write the training labels (.npy or text)")
    p.add_argument("--centroids", default=None, help="also write the centres (.npy or .csv)")
    p.add_argument("--with-index", action="store_true",
                   help="also store a search index of the training rows (approximate 1-NN, 'qkm serve' /search); "
                        "the model file then holds the training data")
    p.add_argument("--with-features", action="store_true",
                   help="also store Nyström RBF features with the centres as landmarks ('qkm serve' /features)")
    p.add_argument("--gamma", type=float, default=None,
                   help="RBF gamma for --with-features (default: qkm.Nystroem's default)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="print the WCSS of every iteration on stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    add_scheduler_option(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("export", help="convert a model file to ONNX, a joblib artefact or the safe format",
                       description="Write a model as an ONNX graph (inputs X float32 [batch, D]; outputs label "
                                   "int64 and distance float32, optionally scores [batch, K]), as a joblib "
                                   "artefact (pickle) or again in the safe format.")
    p.add_argument("model", help="model file (safe format; a joblib artefact only with --trust-pickle)")
    p.add_argument("-o", "--output", required=True, help="file to write (atomically)")
    p.add_argument("--format", choices=["onnx", "joblib", "safe"], default="onnx", help="default: onnx")
    p.add_argument("--encoding", choices=["auto", "sparse", "hybrid", "dense"], default="auto",
                   help="ONNX encoding of the centroid operator: sparse initializers, a sparse first stage plus "
                        "a folded dense rest, or one dense matrix; auto times them in onnxruntime and keeps "
                        "the fastest (default)")
    p.add_argument("--scores", action="store_true", help="ONNX: also output the [batch, K] scores")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow MODEL to be a joblib artefact (pickle runs code: only for trusted files)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("predict", help="assign the rows of a data file to the clusters of a model",
                       description="Print (or write) the index of the closest centre of every row.")
    p.add_argument("model", help="model file written by 'qkm train'")
    p.add_argument("data", help=_DATA_HELP)
    p.add_argument("-o", "--output", default=None, help="write labels here (.npy or text) instead of stdout")
    p.add_argument("--format", default=None, help="force the data format")
    add_scheduler_option(p)
    p.set_defaults(func=_cmd_predict)
    add_shard_command(sub, _DATA_HELP)

    p = sub.add_parser("score", help="SystemML-style clustering statistics, AMI and ARI",
                       description="Print SystemML's k-means statistics (TSS, WCSS, BCSS, pair counts with "
                                   "precision and recall, per-class and per-cluster purity) plus AMI and ARI.")
    p.add_argument("data", help=_DATA_HELP + "; svmlight files carry the true labels")
    p.add_argument("--model", default=None, help="model file: predicts the labels and scores the centres")
    p.add_argument("--pred", default=None, help="predicted labels file (instead of --model)")
    p.add_argument("--true", default=None, help="true labels file (default: the labels in an svmlight data file)")
    p.add_argument("--format", default=None, help="force the data format")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=_cmd_score)

    p = sub.add_parser("serve", help="serve a model over HTTP: /assign, /search, /features, /metrics, OIP v2",
                       description="Serve a model file with FastAPI on uvicorn: POST /assign (nearest centroid), "
                                   "/search (approximate k-NN, needs --with-index at training), /features "
                                   "(Nystroem, needs --with-features); GET /healthz, /readyz, /model, /metrics "
                                   "(Prometheus) and the Open Inference Protocol v2 routes. Rows as JSON (dense or "
                                   "sparse), raw float32 (X-Shape: B,D) or .npy. API docs at /docs. SIGINT or "
                                   "SIGTERM stops it gracefully (exit status 0).")
    p.add_argument("model", nargs="?", default=None,
                   help="model file (safe format; a joblib artefact only with --trust-pickle); default: the demo "
                        "model models/fashion_mnist_qkmeans.qkm")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes, each loading its own copy of the model (default: 1)")
    p.add_argument("--backend", choices=["numba", "onnx"], default="numba",
                   help="what computes /assign: the centroid operator (numba/BLAS) or onnxruntime on the model "
                        "exported to ONNX at start-up (default: numba)")
    p.add_argument("--model-name", default=None,
                   help="name in the /v2/models/{name} routes (default: the file name without suffix)")
    p.add_argument("--max-batch-rows", type=int, default=None, help="413 above this many rows (default: 4096)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="413 above this body size (default: 32 MiB)")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="inference requests one worker admits at once; more get 503 + Retry-After (default: 64)")
    p.add_argument("--inference-threads", type=int, default=None,
                   help="inference calls one worker runs at once (default: 2)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (health probes and docs stay "
                        "open); better set QKM_API_KEY, since command lines are visible to other users")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow MODEL to be a joblib artefact (pickle runs code: only for trusted files)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (default: info)")
    p.add_argument("--no-access-log", action="store_true",
                   help="no line per request (the access log never holds bodies or headers)")
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv=None):
    """Entry point of the ``qkm`` console script; returns the exit status.

    Bad input is one line on stderr and status 2; Ctrl-C (SIGINT) one line and
    status 130 (128 + SIGINT, as shells report it). Files are written
    atomically, so an interrupted or failed command leaves any existing file
    as it was.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.written = []  # files a command completed, for the message of an interrupted run

    def show_warning(message, category, filename, lineno, file=None, line=None):  # one line, no source
        print(f"qkm {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = show_warning
            return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, OSError) as exc:
        print(f"qkm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        done = f"already written: {', '.join(args.written)}" if args.written else "nothing written"
        print(f"qkm {args.command}: interrupted, {done}", file=sys.stderr)
        return 130

