"""qkm.ClusterIndex one query at a time: ``index.query(x)`` of this checkout against a git ref's, interleaved.

Rerun (from the repository root, in a git checkout; reuses ``ann.py``'s saved index when it exists, else fits it)::

    .venv/bin/python benchmarks/studies/ann_single_ab.py --ref c928f7f --single 1000 --rounds 5 --out benchmarks/results/studies/ann_single_ab

The ref's ``qkm`` package is extracted by ``git archive`` and imported under
another name (as ``ann_batch_ab.py`` does); its ``ClusterIndex`` gets the
same fitted state as this checkout's, with its own ``InvertedLists`` built
from copies of the same rows, lists, principal axes and centroids (no array
shared between the sides). ``--single`` Fashion-MNIST test images (float32
rows of shape (1, 784)), one ``query`` call each, k = 1 (and k = 10), the
default ``nprobe``, 1 thread: every round times every query on both sides,
A then B on even rounds and B then A on odd ones. Answers are checked
identical first. Reported: latency percentiles per side and the median of
the per-query ratios B / A; the load average is recorded with every round.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(REPO / "benchmarks"))


def ref_index(index, ref_module, cls):
    """A ref ``ClusterIndex`` with ``index``'s fitted state and the ref's ``InvertedLists`` over copies of it."""
    new = index._lists
    fitted = new.rows[np.argsort(new.row_ids)]
    lists = ref_module.InvertedLists(np.array(fitted), np.array(index.list_of_row_), new.n_lists, np.array(new.mean),
                                     np.array(new.basis), np.array(new.centers), new.store)
    old = cls.__new__(cls)
    old.__dict__.update({key: copy.copy(v) for key, v in index.__dict__.items() if key != "_lists"})
    old.__dict__["_lists"] = lists
    return old


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="main", help="git ref of the A side")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--k", default="1,10", help="neighbours per query, comma-separated")
    from _ann_peers import add_batch_study_args
    add_batch_study_args(p, REPO)
    args = p.parse_args()
    import importlib

    from threadpoolctl import threadpool_limits

    from ann import cached_fmnist_index, load_fashion
    from ann_batch_ab import import_ref
    from qkm._threads import numba_threads

    tmp = tempfile.TemporaryDirectory()
    ref_mod = import_ref(args.ref, tmp.name)
    ref_cls = importlib.import_module("qkm_ref.neighbors").ClusterIndex

    def git(*a):
        return subprocess.run(["git", "-C", str(REPO), *a], check=True, capture_output=True, text=True).stdout.strip()

    ref_commit, head = git("rev-parse", "--short", args.ref), git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    threadpool_limits(1)
    X, Q = load_fashion(args.data_dir)
    threadpool_limits(1)
    new = cached_fmnist_index(args.cache_dir, X)
    old = ref_index(new, ref_mod, ref_cls)
    a_name, b_name = f"A {args.ref} ({ref_commit})", f"B this ({head}{' + changes' if dirty else ''})"
    sides = {a_name: old, b_name: new}
    singles = [np.ascontiguousarray(Q[i:i + 1]) for i in range(min(args.single, Q.shape[0]))]
    load_before = [round(v, 2) for v in os.getloadavg()]
    out = {}
    with numba_threads(1):
        for k in [int(v) for v in args.k.split(",")]:
            for x in singles:
                a, b = old.query(x, k), new.query(x, k)
                assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), "answers differ"
            lat = {s: np.empty((args.rounds, len(singles))) for s in sides}
            cpu = {s: np.empty((args.rounds, len(singles))) for s in sides}
            loads = []
            for r in range(args.rounds):
                order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
                for i, x in enumerate(singles):
                    for name, index in order:
                        t, c = time.perf_counter(), time.thread_time()
                        index.query(x, k)
                        lat[name][r, i] = time.perf_counter() - t
                        cpu[name][r, i] = time.thread_time() - c
                loads.append([round(v, 2) for v in os.getloadavg()])
            ratio = lat[b_name] / lat[a_name]
            out[k] = dict(sides={s: dict(p50_us=float(np.median(v) * 1e6), p90_us=float(np.percentile(v, 90) * 1e6),
                                         p99_us=float(np.percentile(v, 99) * 1e6),
                                         round_p50_us=[float(np.median(row) * 1e6) for row in v],
                                         cpu_p50_us=float(np.median(cpu[s]) * 1e6))
                                 for s, v in lat.items()},
                          ratio_p50=float(np.median(ratio)),
                          cpu_ratio_p50=float(np.median(cpu[b_name] / np.maximum(cpu[a_name], 1e-9))), loads=loads)
            print(k, json.dumps(out[k]), flush=True)
    result = dict(command="python benchmarks/studies/ann_single_ab.py " + " ".join(sys.argv[1:]), ref=args.ref,
                  ref_commit=ref_commit, head=head, n_indexed=int(X.shape[0]), n_lists=int(new.n_lists_),
                  nprobe=int(new.nprobe_), single=len(singles), rounds=args.rounds, load_before=load_before,
                  results={str(k): v for k, v in out.items()})
    if args.out:
        from _machine import stamp, stamp_md

        result = stamp(result)
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        lines = [f"# ClusterIndex one query at a time: {args.ref} against this branch", "",
                 "Produced by `benchmarks/studies/ann_single_ab.py`; rerun with:", "",
                 f"    .venv/bin/python benchmarks/studies/ann_single_ab.py {' '.join(sys.argv[1:])}", "",
                 f"Fashion-MNIST, {result['n_indexed']:,} rows indexed, {result['n_lists']} lists, default nprobe "
                 f"{result['nprobe']}, 1 thread; `index.query(x)` on {len(singles):,} test images (float32 (1, 784)) "
                 f"x {args.rounds} rounds, A and B in turn on every query (order swapped every round); answers "
                 f"checked identical. A = `{args.ref}` ({ref_commit}), B = this checkout ({b_name[8:-1]}). "
                 "Load average "
                 f"before {load_before} (2 shared cores): absolute latencies are disturbed by other jobs; the "
                 "ratio B / A, measured query by query side by side, is what counts.", "",
                 "| k | side | p50 us | p90 us | p99 us | p50 per round us | thread CPU p50 us | median B/A per query "
                 "(wall, CPU) | load after rounds |",
                 "|---" * 9 + "|"]
        for k, v in out.items():
            for s, w in v["sides"].items():
                lines.append(f"| {k} | {s} | {w['p50_us']:.1f} | {w['p90_us']:.1f} | {w['p99_us']:.1f} | "
                             f"{', '.join(f'{x:.0f}' for x in w['round_p50_us'])} | {w['cpu_p50_us']:.1f} | "
                             f"{v['ratio_p50']:.3f}, {v['cpu_ratio_p50']:.3f} | {v['loads'][-1]} |")
        Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", result))


if __name__ == "__main__":
    main()
