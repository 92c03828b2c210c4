"""qkm.ClusterIndex batch path A/B: this checkout against a git ref's (default ``main``), interleaved in one run.

Rerun (from the repository root, in a git checkout; reuses ``ann.py``'s saved index when it exists, else fits it)::

    .venv/bin/python benchmarks/studies/ann_batch_ab.py --out benchmarks/results/studies/ann_batch_int8

The ref's ``qkm`` package is extracted by ``git archive`` into a temporary
directory and imported under another name; its ``InvertedLists`` is built
from the same fitted state (rows, lists, principal axes, centroids) as this
checkout's, so both search the same lists. Batches of 1,000 Fashion-MNIST
test images against the 60,000 training images, 1 thread, the default
``nprobe`` and the path each side picks (``path="auto"``), k = 1 and 10:
``--rounds`` rounds, A then B, medians of wall-clock and process-CPU
queries/s. Answers of A, B and B's per-query path are checked identical.
Then ``--single`` test images one at a time (A's and B's one-row call in
turn): latency percentiles. Load averages are recorded with every row.
"""

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(REPO / "benchmarks"))


def import_ref(ref, where):
    """The ``qkm.approximate._index`` module of git ``ref``, imported as ``qkm_ref`` from ``where``."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", ref, "qkm"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(where, filter="data")
    root = Path(where) / "qkm_ref"
    (Path(where) / "qkm").rename(root)
    for f in root.rglob("*.py"):  # absolute self-imports point at the copy
        text = f.read_text()
        f.write_text(text.replace("from qkm.", "from qkm_ref.").replace("from qkm import", "from qkm_ref import"))
    sys.path.insert(0, str(where))
    return importlib.import_module("qkm_ref.approximate._index")


def timed_rounds(sides, batches, k, nprobe, rounds):
    wall = {s: [] for s in sides}
    cpu = {s: [] for s in sides}
    n = sum(len(b) for b in batches)
    for _ in range(rounds):
        for name, lists in sides.items():
            t, c = time.perf_counter(), time.process_time()
            for b in batches:
                lists.search(b, k, nprobe)
            wall[name].append(n / (time.perf_counter() - t))
            cpu[name].append(n / (time.process_time() - c))
    return wall, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="main", help="git ref of the A side")
    p.add_argument("--rounds", type=int, default=7)
    from _ann_peers import add_batch_study_args
    add_batch_study_args(p, REPO)
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    from ann import cached_fmnist_index, load_fashion
    from qkm._threads import numba_threads

    tmp = tempfile.TemporaryDirectory()
    ref_index = import_ref(args.ref, tmp.name)
    ref_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.ref], check=True,
                                capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    threadpool_limits(1)
    X, Q = load_fashion(args.data_dir)
    threadpool_limits(1)  # the libraries loaded since
    index = cached_fmnist_index(args.cache_dir, X)
    new = index._lists
    fitted = new.rows[np.argsort(new.row_ids)]
    old = ref_index.InvertedLists(fitted, index.list_of_row_, new.n_lists, new.mean, new.basis, new.centers, new.store)
    sides = {f"A {args.ref} ({ref_commit})": old, f"B this ({head})": new}
    a_name, b_name = sides
    nprobe = index.nprobe_
    batches = [np.ascontiguousarray(Q[s:s + 1000]) for s in range(0, min(args.queries, Q.shape[0]), 1000)]
    load_before = os.getloadavg()
    rows = []
    with numba_threads(1):
        for k in (1, 10):
            for b in batches:
                a, got, one = old.search(b, k, nprobe), new.search(b, k, nprobe), new.search(b, k, nprobe,
                                                                                             path="per-query")
                for g in (got, one):
                    assert np.array_equal(a[0], g[0]) and np.array_equal(a[1], g[1]), "answers differ"
            paths = {a_name: old.batch_path(1000, k, nprobe), b_name: new.batch_path(1000, k, nprobe)}
            wall, cpu = timed_rounds(sides, batches, k, nprobe, args.rounds)
            row = dict(k=k, nprobe=int(nprobe), paths=paths, load=[round(v, 2) for v in os.getloadavg()],
                       wall={s: float(np.median(v)) for s, v in wall.items()},
                       cpu={s: float(np.median(v)) for s, v in cpu.items()})
            row["ratio_wall"] = row["wall"][b_name] / row["wall"][a_name]
            row["ratio_cpu"] = row["cpu"][b_name] / row["cpu"][a_name]
            rows.append(row)
            print(row, flush=True)
        singles = [np.ascontiguousarray(Q[i:i + 1]) for i in range(min(args.single, Q.shape[0]))]
        lat = {s: [] for s in sides}
        for x in singles[:50]:
            for lists in sides.values():
                lists.search_row(x, 1, nprobe)
        for _ in range(args.rounds):
            for x in singles:
                for name, lists in sides.items():
                    t = time.perf_counter()
                    lists.search_row(x, 1, nprobe)
                    lat[name].append(time.perf_counter() - t)
    single = {s: dict(p50_us=float(np.median(v) * 1e6), p90_us=float(np.percentile(v, 90) * 1e6),
                      p99_us=float(np.percentile(v, 99) * 1e6)) for s, v in lat.items()}
    single_load = [round(v, 2) for v in os.getloadavg()]
    print(single, flush=True)
    result = dict(command="python benchmarks/studies/ann_batch_ab.py " + " ".join(sys.argv[1:]), ref=args.ref,
                  ref_commit=ref_commit, head=head, n_indexed=int(X.shape[0]),
                  n_queries=sum(len(b) for b in batches), n_lists=int(new.n_lists), nprobe_auto=int(nprobe),
                  rounds=args.rounds, load_before=[round(v, 2) for v in load_before], rows=rows,
                  single=single, single_n=len(singles), single_load=single_load,
                  index_bytes={a_name: old.nbytes(), b_name: new.nbytes()})
    if args.out:
        from _machine import stamp, stamp_md

        result = stamp(result)
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        lines = [f"# ClusterIndex batch path A/B: {args.ref} against this branch", "",
                 "Produced by `benchmarks/studies/ann_batch_ab.py`; rerun with:", "",
                 f"    .venv/bin/python benchmarks/studies/ann_batch_ab.py {' '.join(sys.argv[1:])}", "",
                 f"Fashion-MNIST, {result['n_indexed']:,} rows indexed, {result['n_queries']:,} queries in batches of "
                 f"1,000, 1 thread, {result['n_lists']} lists, default nprobe {nprobe}, `InvertedLists.search` "
                 f"(the path each side picks), A then B in each of {args.rounds} rounds, medians. A = `{args.ref}` "
                 f"({ref_commit}), B = this checkout ({head}); answers checked identical (A, B and B's per-query "
                 f"path). Load average before {result['load_before']} (2 shared cores): wall-clock q/s is "
                 "disturbed by other jobs, CPU q/s less; the ratios, measured side by side, are what count.", "",
                 "| k | path A / B | A q/s | B q/s | B/A wall | A CPU q/s | B CPU q/s | B/A CPU | load |",
                 "|---" * 9 + "|"]
        for r in rows:
            lines.append(f"| {r['k']} | {r['paths'][a_name]} / {r['paths'][b_name]} | {r['wall'][a_name]:,.0f} | "
                         f"{r['wall'][b_name]:,.0f} | {r['ratio_wall']:.3f} | {r['cpu'][a_name]:,.0f} | "
                         f"{r['cpu'][b_name]:,.0f} | {r['ratio_cpu']:.3f} | {r['load']} |")
        lines += ["", f"One query at a time (`InvertedLists.search_row`, nprobe {nprobe}, k = 1), {len(singles):,} "
                  f"test images x {args.rounds} rounds, A and B in turn; load after {single_load}:", "",
                  "| side | p50 us | p90 us | p99 us |", "|---|---|---|---|"]
        for s, v in single.items():
            lines.append(f"| {s} | {v['p50_us']:.0f} | {v['p90_us']:.0f} | {v['p99_us']:.0f} |")
        lines += ["", "Index memory (bytes): " + "; ".join(f"{s}: {json.dumps(v)}"
                                                           for s, v in result["index_bytes"].items())]
        Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", result))


if __name__ == "__main__":
    main()
