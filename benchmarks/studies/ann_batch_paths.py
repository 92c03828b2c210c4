"""qkm.ClusterIndex batch paths side by side (per query, grouped, pre-filtered) and one-query latency (Fashion-MNIST).

Rerun (from the repository root; reuses ``ann.py``'s saved index when it exists, else fits and saves it)::

    .venv/bin/python benchmarks/studies/ann_batch_paths.py --out benchmarks/results/studies/ann_batch_paths

Batches of 1,000 test images against the 60,000 training images, 1 thread,
``ClusterIndex`` default settings (the index of ``ann.py``). For every
(k, nprobe) both paths of ``InvertedLists.search`` (``path="per-query"``, ``"grouped"`` and
``"prefiltered"``) run on the same batches in turn, ``--rounds`` rounds;
medians of wall-clock queries/s and of process CPU queries/s (the CPU figure is
less disturbed by other jobs on a shared machine). ``auto`` is the path
``query`` picks. Answers of the paths are checked identical. Then
``--single`` test images one at a time through ``ClusterIndex.query`` (default
settings, k = 1, ``--rounds`` rounds): latency percentiles.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(REPO / "benchmarks"))
PATHS = ("per-query", "grouped", "prefiltered")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    from _ann_peers import add_batch_study_args
    add_batch_study_args(p, REPO)
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    from ann import cached_fmnist_index, load_fashion
    from qkm._threads import numba_threads

    threadpool_limits(1)
    X, Q = load_fashion(args.data_dir)
    index = cached_fmnist_index(args.cache_dir, X)
    lists = index._lists
    batches = [np.ascontiguousarray(Q[s:s + 1000]) for s in range(0, min(args.queries, Q.shape[0]), 1000)]
    load_before = os.getloadavg()
    rows = []
    with numba_threads(1):
        lists.search(batches[0][:50], 10, 13, path="grouped")  # compile
        for k in (1, 10):
            for nprobe in sorted({index.nprobe_, 2 * index.nprobe_, 4 * index.nprobe_}):
                for b in batches:
                    a, *others = (lists.search(b, k, nprobe, path=pth) for pth in PATHS)
                    for g in others:
                        assert np.array_equal(a[0], g[0]) and np.array_equal(a[1], g[1]), "paths disagree"
                wall = {pth: [] for pth in PATHS}
                cpu = {pth: [] for pth in wall}
                for _ in range(args.rounds):
                    for pth in wall:
                        t, c = time.perf_counter(), time.process_time()
                        for b in batches:
                            lists.search(b, k, nprobe, path=pth)
                        n = sum(len(b) for b in batches)
                        wall[pth].append(n / (time.perf_counter() - t))
                        cpu[pth].append(n / (time.process_time() - c))
                chosen = lists.batch_path(1000, k, nprobe)
                row = dict(k=k, nprobe=int(nprobe), auto=chosen, load=[round(v, 2) for v in os.getloadavg()],
                           **{f"{pth} q/s": float(np.median(wall[pth])) for pth in wall},
                           **{f"{pth} CPU q/s": float(np.median(cpu[pth])) for pth in cpu})
                rows.append(row)
                print(row, flush=True)
    singles = [np.ascontiguousarray(Q[i:i + 1]) for i in range(min(args.single, Q.shape[0]))]
    with numba_threads(1):
        for x in singles[:50]:
            index.query(x)
        lat = []
        for _ in range(args.rounds):
            for x in singles:
                t = time.perf_counter()
                index.query(x)
                lat.append(time.perf_counter() - t)
    lat = np.asarray(lat) * 1e6
    single = dict(n=len(singles), rounds=args.rounds, path=index.query_path(1),
                  p50_us=float(np.median(lat)), p90_us=float(np.percentile(lat, 90)),
                  p99_us=float(np.percentile(lat, 99)), load=[round(v, 2) for v in os.getloadavg()])
    print(single, flush=True)
    result = dict(command="python benchmarks/studies/ann_batch_paths.py " + " ".join(sys.argv[1:]),
                  n_indexed=int(X.shape[0]), n_queries=sum(len(b) for b in batches), n_lists=int(lists.n_lists),
                  nprobe_auto=int(index.nprobe_), rounds=args.rounds,
                  load_before=[round(v, 2) for v in load_before], load_after=[round(v, 2) for v in os.getloadavg()],
                  rows=rows, single=single)
    if args.out:
        from _machine import stamp, stamp_md

        result = stamp(result)
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        lines = ["# ClusterIndex batch paths (per query, grouped, pre-filtered) and one-query latency", "",
                 "Produced by `benchmarks/studies/ann_batch_paths.py`; rerun with:", "",
                 f"    .venv/bin/python benchmarks/studies/ann_batch_paths.py {' '.join(sys.argv[1:])}", "",
                 f"Fashion-MNIST, {result['n_indexed']:,} rows indexed, {result['n_queries']:,} queries in batches of "
                 f"1,000, 1 thread, {result['n_lists']} lists (nprobe auto = {result['nprobe_auto']}), median of "
                 f"{args.rounds} interleaved rounds. Load average before {result['load_before']}, after "
                 f"{result['load_after']} (2 shared cores): wall-clock q/s is disturbed by other jobs, CPU q/s less.",
                 "", "| k | nprobe | per-query q/s | grouped q/s | pre-filtered q/s | per-query CPU q/s "
                 "| grouped CPU q/s | pre-filtered CPU q/s | auto picks | load |", "|---" * 10 + "|"]
        for r in rows:
            lines.append(f"| {r['k']} | {r['nprobe']} | {r['per-query q/s']:,.0f} | {r['grouped q/s']:,.0f} | "
                         f"{r['prefiltered q/s']:,.0f} | {r['per-query CPU q/s']:,.0f} | {r['grouped CPU q/s']:,.0f} | "
                         f"{r['prefiltered CPU q/s']:,.0f} | {r['auto']} | {r['load']} |")
        lines += ["", f"One query at a time (`ClusterIndex.query`, default nprobe {result['nprobe_auto']}, k = 1, path "
                  f"{single['path']}): {single['n']:,} test images x {single['rounds']} rounds, median "
                  f"{single['p50_us']:.0f} us, p90 {single['p90_us']:.0f} us, p99 {single['p99_us']:.0f} us; load "
                  f"after {single['load']}."]
        Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", result))


if __name__ == "__main__":
    main()
