"""k-means training benchmark: qkm vs scikit-learn vs SparseKmeans, same init.

Every method starts from the SAME initial centres (scikit-learn's
``kmeans_plusplus(X, K, random_state=0)``, computed once per dataset/K and
cached), runs in a fresh subprocess with pinned thread counts, and is scored
on the SAME objective, recomputed by this script at the method's final
centres (sum over rows of the squared distance to the nearest centre, float64).

Datasets (read from ``--data-dir``, default ``<repo>/../shared/data``):

* ``news20``        LIBSVM news20 term counts, 15,935 x 62,061, rows L2-normalised, CSR. K = 100, 500.
* ``20news-tfidf``  20 Newsgroups bydate train+test, ``TfidfVectorizer()`` defaults,
                    18,846 x ~173k, CSR. K = 100, 500.
* ``fashion-mnist`` Fashion-MNIST train images, 60,000 x 784, dense, scaled to [0, 1]. K = 64.

Methods: sklearn-elkan, sklearn-lloyd, sparsekmeans-lloyd, sparsekmeans-elkan
(opt-in: ``--sparsekmeans-elkan``), qkm-lloyd, qkm-elkan.  A method whose import
fails is reported as ``skipped: <reason>``.

Rerun (from the repository root)::

    .venv/bin/python benchmarks/train_sparse.py                 # full run, tens of minutes
    .venv/bin/python benchmarks/train_sparse.py --quick         # smoke test, ~1 min once cached
    .venv/bin/python benchmarks/train_sparse.py --check-sparsekmeans-init

Results: ``<out>.json`` (raw rows + machine info) and ``<out>.md`` (tables);
``--out`` defaults to ``benchmarks/results/train_sparse`` (``..._quick`` with
``--quick``).  Caches (extracted 20 Newsgroups, matrices, initial centres) go
to ``benchmarks/.cache/``; delete it to rebuild them.

Benchmark-only dependencies: ``benchmarks/requirements.txt``.
"""

from __future__ import annotations

import os
import sys

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "_child":
    # Pin the thread pools BEFORE numpy (or anything linking BLAS/OpenMP) is imported.
    # The parent also passes these in the child's environment; this is a second guard.
    import json as _json

    with open(sys.argv[2]) as _f:
        _threads = str(_json.load(_f)["threads"])
    for _var in THREAD_ENV_VARS:
        os.environ[_var] = _threads

import argparse
import contextlib
import datetime
import json
import shlex
import shutil
import subprocess
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_data import (  # noqa: E402
    BENCH_DIR,
    CACHE_DIR,
    DATASETS,
    DEFAULT_DATA_DIR,
    INIT_SEED,
    MemoryWindow,
    assign_and_objective,
    load_array,
    load_average,
    prepare_main,
    write_text_atomic,
)
from _train_sparse_methods import (  # noqa: E402
    DEFAULT_METHODS,
    ITER_UNITS,
    MAX_ITER,
    METHODS,
    REFERENCE_METHOD,
    TOL,
    check_sparsekmeans_init,
    make_fit,
    method_family,
    method_input,
)
from _train_sparse_report import format_table, machine_info, write_results  # noqa: E402

DEFAULT_OUT = BENCH_DIR / "results" / "train_sparse"

DEFAULT_CAPS = ("sklearn-lloyd=6@500",)


# --------------------------------------------------------------------------- child: one timed fit


def warm_up(fit, X, C0):
    """One short fit on the first rows, so one-off costs (JIT compilation, lazy imports) are not timed."""
    m = min(X.shape[0], max(2 * C0.shape[0], 1000))
    t0 = time.perf_counter()
    fit(X[:m], C0, 2)
    return time.perf_counter() - t0


def child_main(spec_path):
    """Subprocess entry point: load data, import the method, warm up, time one fit, score it."""
    spec = json.loads(Path(spec_path).read_text())
    result = {"status": "failed", "reason": None}
    try:
        result.update(run_one_fit(spec))
    except Exception as exc:  # report, don't crash: the parent carries on with other methods
        result["reason"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    write_text_atomic(spec["result_path"], json.dumps(result))


def run_one_fit(spec):
    method, threads, max_iter = spec["method"], spec["threads"], spec["max_iter"]
    try:
        fit = make_fit(method, threads)
    except Exception as exc:  # ImportError, missing attribute (qkm.KMeans not written yet), ...
        return {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
    X = method_input(method, load_array(spec["matrix_path"]))
    C0 = np.load(spec["init_path"])
    warmup_s = warm_up(fit, X, C0) if spec["warmup"] else 0.0

    with MemoryWindow() as mem:
        cpu0, t0 = time.process_time(), time.perf_counter()
        out = fit(X, C0, max_iter)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0

    _, objective, not_nearest = assign_and_objective(X, out["centers"], labels=out["labels"])
    row = {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": cpu,
        "n_iter": out["n_iter"],
        "n_updates": out.get("n_updates"),
        "iter_unit": ITER_UNITS[method_family(method)],
        "s_per_iter": wall / max(out["n_iter"], 1),
        "inertia": objective,
        "reported_inertia": out["reported_inertia"],
        "labels_not_nearest": not_nearest,  # returned labels vs final centres (ties allowed)
        "peak_mb": mem.peak_mb,
        "peak_mb_source": mem.source,
        "ru_maxrss_growth_mb": mem.ru_growth_mb,
        "rss_before_fit_mb": mem.rss_before_mb,
        "warmup_s": warmup_s,
        "max_iter": max_iter,
    }
    if out.get("first_labels") is not None:  # sparsekmeans: did it start from C0?
        row["first_step_labels_not_nearest_C0"] = assign_and_objective(X, C0, labels=out["first_labels"])[2]
    np.save(spec["labels_path"], np.asarray(out["labels"], dtype=np.int32))
    return row


# --------------------------------------------------------------------------- parent: orchestration


def thread_env(threads):
    env = dict(os.environ)
    for var in THREAD_ENV_VARS:
        env[var] = str(threads)
    return env


def run_subprocess(mode, spec, workdir, env=None, timeout=None):
    """Run this script as ``mode`` (``_child`` / ``_prepare``) on a JSON spec; return its JSON result."""
    workdir = Path(workdir)
    fd, spec_path = tempfile.mkstemp(prefix=mode, suffix=".json", dir=workdir)
    os.close(fd)
    spec = dict(spec, result_path=spec_path + ".result")
    Path(spec_path).write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), mode, spec_path]
    # _prepare prints its progress live; a fit child's stdout (library chatter) is captured.
    stdout_pipe = subprocess.PIPE if mode == "_child" else None
    proc = subprocess.Popen(cmd, env=env, stdout=stdout_pipe, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # the child's own process group (start_new_session)
        stdout, stderr = proc.communicate()
        return {"status": "failed", "reason": f"timeout after {timeout} s", "stderr_tail": stderr[-2000:]}
    result_path = Path(spec["result_path"])
    if not result_path.exists():
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return {"status": "failed", "reason": f"child {how} without a result (out of memory?)",
                "stderr_tail": stderr[-2000:]}
    result = json.loads(result_path.read_text())
    if result.get("status") == "failed":
        result["stderr_tail"] = stderr[-2000:]
    return result


def prepare_dataset(name, ks, args, workdir):
    spec = {"dataset": name, "ks": ks, "data_dir": str(args.data_dir), "cache_dir": str(args.cache_dir),
            "quick_rows": args.quick_rows if args.quick else None}
    result = run_subprocess("_prepare", spec, workdir)
    if "matrix_path" not in result:
        raise RuntimeError(f"preparing {name} failed: {result.get('reason')}\n{result.get('stderr_tail', '')}")
    return result


def parse_caps(cap_args):
    """``METHOD=N`` or ``METHOD=N@KMIN`` -> {method: (N, KMIN)}."""
    caps = {}
    for item in cap_args:
        if item.lower() == "none":
            caps.clear()
            continue
        method, _, value = item.partition("=")
        n, _, kmin = value.partition("@")
        if method not in METHODS or not n.isdigit() or (kmin and not kmin.isdigit()):
            raise argparse.ArgumentTypeError(f"bad --cap-iter {item!r}; expected METHOD=N or METHOD=N@KMIN")
        caps[method] = (int(n), int(kmin or 0))
    return caps


def cap_for(method, k, caps):
    if method in caps and k >= caps[method][1]:
        return caps[method][0]
    return None


def run_method(method, name, k, prep, args, workdir):
    cap = cap_for(method, k, args.caps)
    spec = {"method": method, "dataset": name, "k": k, "threads": args.threads,
            "matrix_path": prep["matrix_path"], "init_path": prep["inits"][str(k)],
            "max_iter": cap or MAX_ITER, "warmup": not args.no_warmup,
            "labels_path": str(Path(workdir) / f"labels_{name}_k{k}_{method}.npy")}
    load_before = load_average()
    row = run_subprocess("_child", spec, workdir, env=thread_env(args.threads), timeout=args.timeout or None)
    row.update({"dataset": name, "k": k, "method": method, "threads": args.threads, "cap_iter": cap,
                "loadavg_1min_before": load_before,
                "labels_path": spec["labels_path"] if row.get("status") == "ok" else None})
    return row


def add_comparisons(rows):
    """Fill label diffs / relative inertia vs the reference, capped-run extrapolation, time ratios."""
    ref = next((r for r in rows if r["method"] == REFERENCE_METHOD and r["status"] == "ok"), None)
    ref_labels = np.load(ref["labels_path"]) if ref else None
    for r in rows:
        if r["status"] != "ok":
            continue
        r["capped"] = bool(r["cap_iter"] and r["n_iter"] >= r["cap_iter"])
        r["effective_s"] = r["wall_s"]
        r["extrapolated_s"] = None
        if r["capped"] and ref is not None:
            r["extrapolated_to_iter"] = ref["n_iter"]
            r["extrapolated_s"] = r["s_per_iter"] * ref["n_iter"]
            r["effective_s"] = r["extrapolated_s"]
        elif r["capped"]:
            r["effective_s"] = None  # cannot extrapolate without the reference's iteration count
        if ref is not None:
            r["labels_diff_vs_ref"] = int(np.count_nonzero(np.load(r["labels_path"]) != ref_labels))
            r["inertia_rel_vs_ref"] = (r["inertia"] - ref["inertia"]) / ref["inertia"]
    qkm = [r for r in rows if r["status"] == "ok" and method_family(r["method"]) == "qkm" and r["effective_s"]]
    best = min(qkm, key=lambda r: r["effective_s"]) if qkm else None
    for r in rows:
        if r["status"] == "ok" and best and r.get("effective_s"):
            r["time_over_qkm_best"] = r["effective_s"] / best["effective_s"]
    return summarize_ratios(rows, best)


def summarize_ratios(rows, best):
    ok = [r for r in rows if r["status"] == "ok" and r.get("effective_s")]
    sk = [r for r in ok if method_family(r["method"]) == "sklearn"]
    fastest_sk = min(sk, key=lambda r: r["effective_s"]) if sk else None
    skm = next((r for r in ok if r["method"] == "sparsekmeans-lloyd"), None)
    summary = {"qkm_best": best and best["method"], "qkm_best_s": best and best["effective_s"],
               "fastest_sklearn": fastest_sk and fastest_sk["method"],
               "fastest_sklearn_s": fastest_sk and fastest_sk["effective_s"],
               "sparsekmeans_lloyd_s": skm and skm["effective_s"]}
    if best:
        if fastest_sk:
            summary["speedup_vs_fastest_sklearn"] = fastest_sk["effective_s"] / best["effective_s"]
        if skm:
            summary["speedup_vs_sparsekmeans_lloyd"] = skm["effective_s"] / best["effective_s"]
    return summary


# --------------------------------------------------------------------------- CLI


def csv_list(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser():
    p = argparse.ArgumentParser(
        description="Benchmark k-means training (qkm vs scikit-learn vs SparseKmeans) from the same\n"
                    "kmeans++ initial centres on news20, 20 Newsgroups tf-idf and Fashion-MNIST.\n"
                    "Each fit runs in a fresh subprocess; wall/CPU time, iterations, inertia recomputed\n"
                    "by the benchmark, peak memory growth and label differences vs sklearn-elkan are\n"
                    "reported, plus time ratios to the best qkm method.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples (from the repository root):\n"
               "  .venv/bin/python benchmarks/train_sparse.py                  # full run (tens of minutes)\n"
               "  .venv/bin/python benchmarks/train_sparse.py --quick          # smoke test\n"
               "  .venv/bin/python benchmarks/train_sparse.py --datasets news20 --ks 100 --methods sklearn-elkan\n"
               "  .venv/bin/python benchmarks/train_sparse.py --check-sparsekmeans-init")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                   help="folder holding news20/, 20newsgroups/ and fashion-mnist/ (default: <repo>/../shared/data)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help="cache for the extracted 20 Newsgroups, the matrices and the initial centres "
                        "(default: benchmarks/.cache; delete it to rebuild)")
    p.add_argument("--datasets", type=csv_list, default=list(DATASETS),
                   help=f"comma-separated subset of: {','.join(DATASETS)} (default: all)")
    p.add_argument("--ks", type=lambda s: [int(k) for k in csv_list(s)], default=None,
                   help="comma-separated K values used for every selected dataset (default: 100,500 for the "
                        "text datasets, 64 for fashion-mnist)")
    p.add_argument("--methods", type=csv_list, default=list(DEFAULT_METHODS),
                   help=f"comma-separated subset of: {','.join(METHODS)} (default: all but sparsekmeans-elkan). "
                        f"{REFERENCE_METHOD} always runs first when selected: it is the reference for label "
                        "differences, relative inertia and the extrapolation of capped runs")
    p.add_argument("--sparsekmeans-elkan", action="store_true",
                   help="also run sparsekmeans-elkan (memory hungry: K x n lower bounds, dense centres)")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per fit: OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS in the child's environment, qkm "
                        "n_jobs and SparseKmeans n_threads (default: 1)")
    p.add_argument("--cap-iter", action="append", default=None, metavar="METHOD=N[@KMIN]",
                   help="run METHOD with max_iter=N (only when K >= KMIN); its time is then extrapolated to "
                        f"{REFERENCE_METHOD}'s converged iteration count and labelled as such in the tables. "
                        f"Repeatable; 'none' removes all caps (default: {' '.join(DEFAULT_CAPS)})")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: fixed random subsample of --quick-rows rows, K divided by 5, only the "
                        "smallest K of each dataset unless --ks is given")
    p.add_argument("--quick-rows", type=int, default=3000, help="rows kept by --quick (default: 3000)")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up fit done before each timed fit (then one-off costs such as "
                        "numba JIT compilation are included in the fit time)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds per fit subprocess before it is killed and reported as failed; 0 = no limit "
                        "(default: 3600)")
    p.add_argument("--out", type=Path, default=None,
                   help="output prefix: writes <out>.json and <out>.md (default: benchmarks/results/train_sparse, "
                        "or benchmarks/results/train_sparse_quick with --quick)")
    p.add_argument("--check-sparsekmeans-init", action="store_true",
                   help="only check, on a small random sparse problem, that the SparseKmeans init override is "
                        "used (first-step labels = nearest C0 centre) and matches scikit-learn, then exit")
    return p


def validate_args(args, parser):
    unknown = [d for d in args.datasets if d not in DATASETS] + [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown dataset/method: {', '.join(unknown)}")
    if args.sparsekmeans_elkan and "sparsekmeans-elkan" not in args.methods:
        args.methods.append("sparsekmeans-elkan")
    args.methods = [m for m in METHODS if m in args.methods]  # reference first
    try:
        args.caps = parse_caps(args.cap_iter if args.cap_iter is not None else list(DEFAULT_CAPS))
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.out is None:
        args.out = DEFAULT_OUT.with_name(DEFAULT_OUT.name + ("_quick" if args.quick else ""))
    if args.threads < 1:
        parser.error("--threads must be >= 1")


def ks_for(name, args):
    """K values for a dataset; --quick divides them by 5 and, without --ks, keeps only the smallest."""
    ks = args.ks or list(DATASETS[name]["ks"])
    if not args.quick:
        return ks
    return [max(2, k // 5) for k in (ks if args.ks else ks[:1])]


def print_row(name, k, r):
    tag = f"[{name} K={k}] {r['method']}:"
    if r["status"] == "skipped":
        print(f"{tag} skipped: {r['reason']}", flush=True)
    elif r["status"] != "ok":
        print(f"{tag} FAILED: {r['reason']}", flush=True)
        detail = r.get("traceback") or r.get("stderr_tail")
        if detail:
            tail = "\n".join(detail.strip().splitlines()[-12:])
            print("    " + tail.replace("\n", "\n    "), flush=True)
    else:
        extra = f" (capped at {r['cap_iter']})" if r.get("cap_iter") and r["n_iter"] >= r["cap_iter"] else ""
        print(f"{tag} {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, {r['n_iter']} it{extra}, "
              f"{r['s_per_iter']:.3f} s/it, inertia {r['inertia']:.6f}, peak +{r['peak_mb']:.0f} MB", flush=True)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    validate_args(args, parser)
    if args.check_sparsekmeans_init:
        return check_sparsekmeans_init()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(sys.orig_argv), "rerun": shlex.join(["python", "benchmarks/train_sparse.py", *sys.argv[1:]]),
            "threads": args.threads, "quick": args.quick, "max_iter": MAX_ITER, "tol": TOL, "init_seed": INIT_SEED,
            "reference_method": REFERENCE_METHOD, "caps": {m: {"n": n, "k_min": kmin} for m, (n, kmin) in args.caps.items()},
            "machine": machine_info()}
    sections, all_rows = [], []
    workdir = Path(tempfile.mkdtemp(prefix="train_sparse."))
    try:
        for name in args.datasets:
            ks = ks_for(name, args)
            print(f"== {name} ({'quick ' if args.quick else ''}K = {ks}) ==", flush=True)
            prep = prepare_dataset(name, ks, args, workdir)
            for k in ks:
                rows = []
                for method in args.methods:
                    row = run_method(method, name, k, prep, args, workdir)
                    print_row(name, k, row)
                    rows.append(row)
                summary = dict(add_comparisons(rows), dataset=name, k=k, data=prep["info"])
                table = format_table(name, k, prep["info"], rows, summary)
                print("\n" + table, flush=True)
                sections.append({"table": table, "summary": summary})
                all_rows.extend(rows)
                write_results(args.out, meta, sections, all_rows)  # partial results survive a crash
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_child":
        child_main(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "_prepare":
        prepare_main(sys.argv[2])
    else:
        sys.exit(main())
