"""Where k-means|| spends its seeding time: wall seconds per phase (``time.perf_counter``), CSR data, 1 thread.

Phases: the rounds' block products (slab gather, dense-term axpys, rare-term scatter from the CSC copy, the CSC
copy itself), lowering the state, the per-round sampling and de-duplication, the centre blocks' layout, the
counts, the candidates' Gram matrix, recluster's weighted k-means++ and its weighted Lloyd (with its iteration
count). Timers wrap the module's functions, so the phases add up to the seeding time up to the wrappers' cost.

Run: ``.venv/bin/python benchmarks/studies/kmpar_phases.py --seeds 0 1 2`` (20 Newsgroups tf-idf, K = 500, l = 2K,
r = 5); ``--threads 2`` for two numba threads.
"""

import argparse
import os
import sys


def _pin_threads(argv):
    threads = "1"
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = threads


if __name__ == "__main__":
    _pin_threads(sys.argv)  # before numpy is imported

import json  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _bench_data as ts  # noqa: E402

from qkm._data import KMeansData  # noqa: E402
from qkm.clustering import _seeding_kernels as S_  # noqa: E402
from qkm.clustering import _seeding_kmpar as KP  # noqa: E402

TIMES = defaultdict(float)
CALLS = defaultdict(int)


def _timed(owner, name, label=None):
    fn = getattr(owner, name, None)
    if fn is None:  # not in this version of the code
        return
    label = label or name

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[label] += time.perf_counter() - t0
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def instrument():
    for name in ("gather_slab_t", "add_dense_dots", "add_rare_dots", "lower_to_block_t", "sample_rows",
                 "lower_to_sparse_block", "sparse_block_dots_t"):
        _timed(S_, name, "kernel " + name)
    _timed(KP, "_csc", "csc copy")
    _timed(KP, "KMParChunk", "Lloyd passes (KMParChunk)")
    _timed(S_, "CenterBlock", "CenterBlock layout")
    for name in ("chunk_lower", "chunk_sample", "chunk_counts", "distinct_row_indices", "kmeans_plusplus",
                 "_lloyd_on_gram", "_lloyd", "recluster", "KMeansData", "_rows", "_stack"):
        _timed(KP, name)
    _gram = KP.block_dots

    def block_dots(X, start, stop, block, *csc):
        # the Gram build is the call without a CSC copy over the candidates (start 0, stop = all of them)
        label = "block_dots (rounds)" if csc and csc[0] is not None else "block_dots (Gram)"
        t0 = time.perf_counter()
        try:
            return _gram(X, start, stop, block, *csc)
        finally:
            TIMES[label] += time.perf_counter() - t0
            CALLS[label] += 1

    KP.block_dots = block_dots


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="20news-tfidf")
    p.add_argument("--n-clusters", type=int, default=500)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", default="1")
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / ".." / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(Path(__file__).resolve().parents[1] / ".cache"))
    p.add_argument("--json", default=None, help="write the per-seed phase times here")
    p.add_argument("--no-phases", action="store_true", help="total time only (no timers)")
    p.add_argument("--save-centers", default=None, help="save the seed-s centres as PREFIX_s.npy")
    args = p.parse_args()
    X = ts.load_array(ts.ensure_matrix(args.dataset, args.data_dir, args.cache_dir, None))
    data = KMeansData(X)
    # compile outside the timings
    KP.kmeans_parallel([KP.KMParChunk(KMeansData(X[:2000]))], 20, np.random.RandomState(0))
    Chunk = KP.KMParChunk
    if not args.no_phases:
        instrument()
    rows = []
    for seed in args.seeds:
        TIMES.clear()
        CALLS.clear()
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        C = KP.kmeans_parallel([Chunk(data)], args.n_clusters, np.random.RandomState(seed))
        total = time.perf_counter() - t0
        if args.save_centers:
            np.save(f"{args.save_centers}_{seed}.npy", C)
        rows.append(dict(seed=seed, total=total, load=load, times=dict(TIMES), calls=dict(CALLS)))
        print(f"seed {seed}: {total:.2f} s (load {load:.2f}), checksum {float(abs(C).sum()):.12g}", flush=True)
    labels = sorted({k for r in rows for k in r["times"]},
                    key=lambda k: -np.median([r["times"].get(k, 0) for r in rows]))
    med_total = float(np.median([r["total"] for r in rows]))
    print(f"\nmedian over {len(rows)} seeds, threads {args.threads}: total {med_total:.2f} s")
    for k in labels:
        t = float(np.median([r["times"].get(k, 0.0) for r in rows]))
        c = int(np.median([r["calls"].get(k, 0) for r in rows]))
        print(f"  {k:28s} {t:7.3f} s  {100 * t / med_total:5.1f} %  calls {c}")
    if args.json:
        from _machine import stamp

        Path(args.json).write_text(json.dumps(stamp(dict(command=" ".join(sys.argv), rows=rows)), indent=1))


if __name__ == "__main__":
    main()
