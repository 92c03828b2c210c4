"""Where the time of a qkm.ClusterIndex pre-filtered batch goes, phase by phase (process CPU time per query).

Rerun (from the repository root; reuses ``ann.py``'s saved index when it exists, else fits it)::

    .venv/bin/python benchmarks/studies/ann_batch_profile.py --out benchmarks/results/studies/ann_batch_profile

Batches of 1,000 Fashion-MNIST test images against the 60,000 training
images, 1 thread, the default ``nprobe``, k = 1 and 10, the phases of
``InvertedLists.search_prefiltered`` run one after the other: the queries'
coordinates and list choice (``batch_choose``), the rest of the plan
(the choice again, grouping by list, rounding allowances), the bounds (one BLAS product per
list, ``bound_lists``) and the exact re-ranking (``finish``); then the whole
``search`` call. ``--rounds`` rounds, medians, in microseconds of process CPU
time per query (what other jobs on a shared machine disturb least). Load
averages are recorded with every row.
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


def phases(lists, Q, k, nprobe):
    """CPU seconds of every phase of one pre-filtered batch, and its slots per query."""
    from qkm._threads import one_blas_thread
    from qkm.approximate import _search_prefilter as SF

    t0 = time.process_time()
    lists.batch_choose(Q, k, nprobe)
    t1 = time.process_time()
    base, (grp_ptr, grp_q, grp_slot), U, un, rq, nq, err, bounds, pos = lists.prefilter_plan(Q, k, nprobe)
    t2 = time.process_time()
    with one_blas_thread():
        SF.bound_lists(0, lists.n_lists, U, un, rq, lists.ix[7], lists._coordinate_norms()[0],
                       lists._last_residuals(), lists.offsets, grp_ptr, grp_q, grp_slot, bounds, pos)
    t3 = time.process_time()
    out_d, out_i = np.empty((Q.shape[0], k)), np.empty((Q.shape[0], k), dtype=np.int64)
    SF.finish(0, Q.shape[0], Q, nq, err, lists.nmax, base, bounds, pos, np.empty(int(np.diff(base).max()),
              dtype=np.int64), lists.rows, lists.row_ids, out_d, out_i)
    t4 = time.process_time()
    lists.search(Q, k, nprobe, path="prefiltered")
    t5 = time.process_time()
    return {"choose": t1 - t0, "plan": t2 - t1, "bounds": t3 - t2, "rerank": t4 - t3,
            "search": t5 - t4}, base[-1] / Q.shape[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    from _ann_peers import add_batch_study_args
    add_batch_study_args(p, REPO)
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    from ann import cached_fmnist_index, load_fashion
    from qkm._threads import numba_threads

    threadpool_limits(1)
    X, Q = load_fashion(args.data_dir)
    threadpool_limits(1)  # the libraries loaded since
    index = cached_fmnist_index(args.cache_dir, X)
    lists = index._lists
    nprobe = index.nprobe_
    batches = [np.ascontiguousarray(Q[s:s + 1000], dtype=np.float64) for s in range(0, min(args.queries, len(Q)), 1000)]
    rows = []
    with numba_threads(1):
        for k in (1, 10):
            phases(lists, batches[0], k, nprobe)  # compiled, caches filled
            got = {}
            for _ in range(args.rounds):
                for b in batches:
                    t, slots = phases(lists, b, k, nprobe)
                    for name, v in t.items():
                        got.setdefault(name, []).append(v / b.shape[0] * 1e6)
            row = dict(k=k, us_per_query={n: round(float(np.median(v)), 1) for n, v in got.items()},
                       slots_per_query=round(float(slots), 1), load=[round(v, 2) for v in os.getloadavg()])
            rows.append(row)
            print(row, flush=True)
    result = dict(command="python benchmarks/studies/ann_batch_profile.py " + " ".join(sys.argv[1:]), n_lists=int(lists.n_lists),
                  nprobe=int(nprobe), n_coords=int(lists.n_coords), n_queries=sum(len(b) for b in batches),
                  rounds=args.rounds, rows=rows)
    if args.out:
        from _machine import stamp, stamp_md

        result = stamp(result)
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        lines = ["# ClusterIndex pre-filtered batch path, phase by phase", "",
                 "Produced by `benchmarks/studies/ann_batch_profile.py`; rerun with:", "",
                 f"    .venv/bin/python benchmarks/studies/ann_batch_profile.py {' '.join(sys.argv[1:])}", "",
                 f"Fashion-MNIST, 60,000 rows indexed, {result['n_queries']:,} queries in batches of 1,000, 1 thread, "
                 f"{result['n_lists']} lists, nprobe {nprobe}, {result['n_coords']} coordinates per row; medians of "
                 f"{args.rounds} rounds, microseconds of process CPU time per query. `plan`: the choice again, the grouping by "
                 "list and the rounding allowances; `search`: the whole call, timed apart (about the sum of the phases).", "",
                 "| k | choose | plan | bounds | re-rank | search | slots per query | load |", "|---" * 8 + "|"]
        for r in rows:
            u = r["us_per_query"]
            lines.append(f"| {r['k']} | {u['choose']} | {u['plan']} | {u['bounds']} | {u['rerank']} | "
                         f"{u['search']} | {r['slots_per_query']} | {r['load']} |")
        Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", result))


if __name__ == "__main__":
    main()
