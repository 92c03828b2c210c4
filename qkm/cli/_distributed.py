"""``qkm shard`` and the ``--scheduler`` paths of ``qkm train`` / ``qkm predict`` (private).

Kept out of :mod:`qkm.cli` so that the command line stays importable without
dask; dask is imported only when ``--scheduler`` is given.
"""

import hashlib
import json
import os
import sys
import time

import numpy as np

__all__ = ["add_shard_command", "add_scheduler_option", "train_sharded", "predict_sharded"]

_SCHEDULER_HELP = ("run on a Dask cluster: 'local:N' (N worker processes on this machine, 127.0.0.1 only) or "
                   "'tcp://HOST:PORT' (an existing scheduler); DATA must then be a shard directory written by "
                   "'qkm shard', at the same path on every worker")


def add_scheduler_option(parser):
    parser.add_argument("--scheduler", default=None, metavar="local:N|tcp://HOST:PORT", help=_SCHEDULER_HELP)


def add_shard_command(sub, data_help):
    p = sub.add_parser("shard", help="cut a data file into shards on disk (for --scheduler and out-of-core use)",
                       description="Stream a data file into a shard directory: manifest.json (format version, "
                                   "shape, nnz, dtype, per-shard rows/nnz/sha256) plus one .npy per dense shard "
                                   "or three (indptr, indices, data) per CSR shard, all loadable with "
                                   "mmap_mode='r'. Written under a temporary name and renamed at the end.")
    p.add_argument("data", help=data_help)
    p.add_argument("-o", "--output", required=True, help="shard directory to create")
    p.add_argument("--rows-per-shard", type=int, default=None,
                   help="rows per shard, rounded up to 4096 x 2^m so that sums over shards follow the "
                        "single-machine order (default: about 128 MB per shard)")
    p.add_argument("--format", default=None, help="force the data format (npy, csv, npz, svmlight, mtx, idx)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="default: float64")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists (once the new one is done)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.set_defaults(func=_cmd_shard)
    return p


def _print(summary, as_json):
    print(json.dumps(summary) if as_json else "\n".join(f"{k}: {v}" for k, v in summary.items()))


def _cmd_shard(args):
    from ..io._shard_writer import write_shards

    t0 = time.perf_counter()
    m = write_shards(args.data, args.output, rows_per_shard=args.rows_per_shard, format=args.format,
                     dtype=np.dtype(args.dtype), overwrite=args.overwrite)
    _print({"output": os.path.abspath(args.output), "layout": m["layout"], "n_rows": m["n_rows"],
            "n_features": m["n_features"], "nnz": m["nnz"], "shards": len(m["shards"]),
            "seconds": round(time.perf_counter() - t0, 3)}, args.json)
    return 0


def _manifest_fingerprint(manifest):
    """One digest of every shard file's sha256: which shards trained a model."""
    h = hashlib.sha256()
    for e in manifest["shards"]:
        for role in sorted(e["files"]):
            h.update(f"{e['name']}.{role}:{e['files'][role]['sha256']};".encode())
    return "shards-sha256:" + h.hexdigest()


def _labels_name(path):
    """``--labels labels.npy`` on shards writes ``<shard>.labels.npy`` next to every shard."""
    name = os.path.basename(os.fspath(path))
    for suffix in (".npy", ".txt", ".csv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if not name or os.sep in name:
        raise ValueError(f"--labels {path!r}: give a name for the per-shard label files, e.g. 'labels'.")
    return name


def _sharded_only(args):
    from ..io._shards import is_sharded

    if not is_sharded(args.data):
        raise ValueError(f"--scheduler needs a shard directory (write one with `qkm shard {args.data} -o DIR`).")


def _failing(func):
    """Errors of the cluster (lost scheduler, version mismatch) end the command with status 2, no file written."""
    def run(args, *more):
        from ..distributed import SchedulerUnreachable, StateLost, VersionMismatch

        try:
            return func(args, *more)
        except (VersionMismatch, StateLost, SchedulerUnreachable) as exc:
            print(f"qkm {args.command}: error: {exc}", file=sys.stderr)
            return 2
    return run


@_failing
def train_sharded(args, make_estimator, timed_fit):
    """``qkm train DIR --scheduler ...``: fit on the cluster, then write the model like ``qkm train``.

    ``make_estimator(args, init)`` and ``timed_fit(est, data, args)`` are the ones of :mod:`qkm.cli`.
    """
    from ..export import save_model
    from ..io import save_centroids

    _sharded_only(args)
    if args.with_index or args.with_features:
        raise ValueError("--with-index and --with-features need the data in memory; drop --scheduler.")
    from ..clustering._seeding import SEEDINGS

    init = args.init if args.init in SEEDINGS else np.load(args.init, allow_pickle=False)
    est = make_estimator(args, init)
    from ..distributed import ShardedData, connect

    with connect(args.scheduler) as client:
        sd = ShardedData(args.data, client)
        elapsed = timed_fit(est, sd, args)
        labels_paths = sd.write_labels(_labels_name(args.labels)) if args.labels else []
        workers = len(client.scheduler_info()["workers"])
    save_model(est, args.output, extra_metadata={
        "train_seconds": elapsed, "data": os.path.basename(os.path.abspath(args.data)),
        "n_samples": sd.n_rows, "data_fingerprint": _manifest_fingerprint(sd.manifest),
        "scheduler": "local" if args.scheduler.startswith("local") else "remote"})
    if args.centroids:
        save_centroids(args.centroids, est.cluster_centers_)
    _print({"model": args.output, "algorithm": args.algorithm, "n_samples": sd.n_rows,
            "n_features": sd.n_features, "n_clusters": int(est.n_clusters_), "n_iter": int(est.n_iter_),
            "inertia": float(est.inertia_), "shards": len(sd.manifest["shards"]), "workers": workers,
            "labels_files": len(labels_paths), "seconds": round(elapsed, 3)}, args.json)
    return 0


@_failing
def predict_sharded(args):
    """``qkm predict MODEL DIR --scheduler ... -o NAME``: labels written next to every shard."""
    from ..export import load_model

    _sharded_only(args)
    if not args.output:
        raise ValueError("qkm predict on shards writes one label file per shard: give -o NAME (e.g. -o labels).")
    model = load_model(args.model)
    from ..distributed import ShardedData, connect

    with connect(args.scheduler) as client:
        sd = ShardedData(args.data, client)
        paths = sd.predict(model.operator.to_dense(), name=_labels_name(args.output))
    print("\n".join(paths))
    return 0
