"""Build time of the default ``qkm.ClusterIndex`` against the model's own fit, A/B with an older build.

Rerun (from the repository root)::

    .venv/bin/python benchmarks/studies/ann_build.py --baseline d95a66f --rounds 3 --out benchmarks/results/studies/ann_build

Fashion-MNIST (60,000 x 784, float32 in [0, 1], as ``ann.py``), 1 thread
everywhere. The model ``qkm.QKMeans(64, sparsity_level=3, random_state=0)``
is fitted (and timed) once in this process; then, for every round, the
default ``qkm.ClusterIndex(model, random_state=0).fit(X)`` is built in a
fresh process by this tree (``new``) and by ``--baseline`` (``old``: that
commit's ``qkm/`` extracted with ``git archive``), in turn, and each
process also measures its index: the chosen ``nprobe``, recall@1 on the
first ``--queries`` test rows against ``ann.py``'s cached exact truth,
batches of 1,000 queries (q/s, median of 3) and one query at a time
(median latency over ``--single`` rows). The build phases of ``new`` are
timed by wrapping the functions ``qkm.neighbors`` calls. Medians over the
rounds; the machine load is recorded with every measurement.
"""

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository (this study is in benchmarks/studies/)
MODEL = "qkm.QKMeans(64, sparsity_level=3, random_state=0)"
PHASES = ("nearest_clusters", "fit_basis", "coordinates", "fit_quantizer", "InvertedLists", "calibrate_nprobe")


def load():
    return [round(v, 2) for v in os.getloadavg()]


def worker(args):
    """One build and its queries, by the ``qkm`` found first on ``sys.path``; prints one JSON line."""
    sys.path.insert(0, args.src)
    sys.path.insert(1, str(REPO / "benchmarks"))
    import numpy as np
    import qkm
    import qkm.neighbors as nb
    from ann import load_fashion
    from qkm.export import load_model

    X, Q = load_fashion(args.data_dir)
    truth = np.load(Path(args.cache_dir) / "ann_truth_fashion-mnist_10000.npy")[:args.queries, 0]
    Q = np.ascontiguousarray(Q[:args.queries])
    operator = load_model(args.model).operator
    times = {}

    def timed(name, f):
        @functools.wraps(f)
        def run(*a, **kw):
            t = time.perf_counter()
            out = f(*a, **kw)
            times[name] = times.get(name, 0.0) + time.perf_counter() - t
            return out
        return run

    for name in PHASES:
        if hasattr(nb, name):
            setattr(nb, name, timed(name, getattr(nb, name)))
    small = X[:3000]  # compiles (or loads) every kernel the build and the queries use
    warm = qkm.ClusterIndex(operator, random_state=0, n_jobs=1).fit(small)
    warm.query(Q[:1])
    warm.query(Q[:1000])
    times.clear()
    before = load()
    t = time.perf_counter()
    index = qkm.ClusterIndex(operator, random_state=0, n_jobs=1).fit(X)
    build = time.perf_counter() - t
    after = load()
    found = index.query(Q)[1][:, 0]
    batch = []
    for _ in range(3):
        t = time.perf_counter()
        for s in range(0, Q.shape[0], 1000):
            index.query(Q[s:s + 1000])
        batch.append(Q.shape[0] / (time.perf_counter() - t))
    single = []
    for i in range(args.single):
        q = Q[i:i + 1]
        t = time.perf_counter()
        index.query(q)
        single.append(time.perf_counter() - t)
    print(json.dumps(dict(qkm=str(Path(qkm.__file__).parent), build_s=build, phases=times, load_before=before,
                          load_after=after, nprobe=int(index.nprobe_), n_lists=int(index.n_lists_),
                          calibration=index.calibration_, recall1=float(np.mean(found == truth)),
                          batch_qps=float(np.median(batch)), single_us=float(np.median(single) * 1e6))))


def run_worker(src, args):
    cmd = [sys.executable, __file__, "--worker", "--src", src, "--model", args.model, "--data-dir", args.data_dir,
           "--cache-dir", args.cache_dir, "--queries", str(args.queries), "--single", str(args.single)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", default=None, help="commit whose qkm/ builds the 'old' index (git archive)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--single", type=int, default=300)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache"))
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--src", default=str(REPO), help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(REPO))
    sys.path.insert(1, str(REPO / "benchmarks"))
    import qkm
    from ann import load_fashion, warm_up
    from qkm.export import save_model

    X, Q = load_fashion(args.data_dir)
    warm_up(X, Q, lambda: qkm.QKMeans(8, sparsity_level=3, max_iter=2, random_state=0), argparse.Namespace(threads=1))
    fit_load = load()
    t = time.perf_counter()
    model = qkm.QKMeans(64, sparsity_level=3, random_state=0, n_jobs=1).fit(X)
    fit_s = time.perf_counter() - t
    fit_load = [fit_load, load()]
    print(f"model {MODEL} fit in {fit_s:.1f} s (load {fit_load})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        args.model = str(Path(tmp) / "model.qkm")
        save_model(model, args.model)
        sides = {"new": str(REPO)}
        if args.baseline:
            old = Path(tmp) / "old"
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "qkm"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            sides = {"old": str(old), "new": str(REPO)}
        runs = {side: [] for side in sides}
        for r in range(args.rounds):
            for side, src in sides.items():
                res = run_worker(src, args)
                assert Path(res.pop("qkm")).resolve() == (Path(src) / "qkm").resolve()  # that side's package ran
                runs[side].append(res)
                print(f"round {r} {side}: build {res['build_s']:.1f} s, nprobe {res['nprobe']}, recall@1 "
                      f"{res['recall1']:.4f}, batch {res['batch_qps']:,.0f} q/s, one query {res['single_us']:.0f} us, "
                      f"load {res['load_before']} -> {res['load_after']}", flush=True)
    summary = {}
    for side, rs in runs.items():
        summary[side] = dict(build_s=median([r["build_s"] for r in rs]), nprobe=[r["nprobe"] for r in rs],
                             recall1=[r["recall1"] for r in rs], batch_qps=median([r["batch_qps"] for r in rs]),
                             single_us=median([r["single_us"] for r in rs]),
                             phases={k: median([r["phases"].get(k, 0.0) for r in rs]) for k in PHASES})
    payload = dict(command=" ".join([".venv/bin/python", "benchmarks/studies/ann_build.py", *sys.argv[1:]]),
                   model=MODEL, model_fit_s=fit_s, model_fit_load=fit_load, baseline=args.baseline,
                   machine=dict(platform=platform.platform(), cpus=os.cpu_count()), runs=runs, summary=summary)
    if args.out:
        from _machine import stamp, stamp_md

        payload = stamp(payload)
        Path(args.out + ".json").write_text(json.dumps(payload, indent=1))
        Path(args.out + ".md").write_text(stamp_md(render(payload), payload))
    print(render(payload))


def render(payload):
    s, fit = payload["summary"], payload["model_fit_s"]
    lines = ["# ClusterIndex build time against the model's fit (Fashion-MNIST, 1 thread)", "",
             "Produced by `benchmarks/studies/ann_build.py`; rerun with:", "", f"    {payload['command']}", "",
             f"Model `{payload['model']}` fitted in {fit:.1f} s in the same run (load average before/after "
             f"{payload['model_fit_load']}). Each side builds the default `qkm.ClusterIndex(model, random_state=0)` "
             "in its own process, interleaved (old, new, old, new, ...); medians over the rounds. `old`: "
             f"`{payload['baseline']}`'s `qkm/`; `new`: this tree. Queries: the first 2,000 Fashion-MNIST test rows, "
             "k = 1, default nprobe; batch: batches of 1,000 (median of 3); one query: median latency.", "",
             "| build | build s (median) | build / model fit | nprobe (auto) | recall@1 | batch q/s | one query µs |",
             "|---|---|---|---|---|---|---|"]
    for side, r in s.items():
        lines.append(f"| {side} | {r['build_s']:.1f} | {r['build_s'] / fit:.2f}x | {', '.join(map(str, r['nprobe']))} "
                     f"| {', '.join(f'{v:.4f}' for v in r['recall1'])} | {r['batch_qps']:,.0f} | "
                     f"{r['single_us']:.0f} |")
    lines += ["", "Build phases (s, medians; the functions `qkm.neighbors` calls, both sides):", "",
              "| build | " + " | ".join(PHASES) + " |", "|---" * (len(PHASES) + 1) + "|"]
    for side, r in s.items():
        lines.append(f"| {side} | " + " | ".join(f"{r['phases'][k]:.2f}" for k in PHASES) + " |")
    lines += ["", "Every run (load average: 1, 5, 15 min, before and after the build):", ""]
    for side, rs in payload["runs"].items():
        for r in rs:
            lines.append(f"- {side}: build {r['build_s']:.1f} s, load {r['load_before']} -> {r['load_after']}, "
                         f"calibration {json.dumps(r['calibration'])}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
