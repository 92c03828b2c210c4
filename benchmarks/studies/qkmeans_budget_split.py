"""QK-means' budget split side by side: ``budget_split="wide"`` against ``"even"``.

Rerun (from the repository root; parts may run side by side and be merged with ``--render-from``)::

    .venv/bin/python benchmarks/studies/qkmeans_budget_split.py --out benchmarks/results/studies/qkmeans_budget_split

Both splits keep ``sum s * max(rows, cols)`` values in the chain. ``"even"``
gives every factor ``s * max(rows, cols)`` (the reference code's nominal
budget); ``"wide"`` gives every factor but the widest ``(s - 1) * max(rows,
cols)`` and the widest the rest (see ``qkm.factorization._shapes.factor_budgets``).
A variant ``split/n`` also runs ``n`` least-squares sweeps on the seeds after
the hierarchical start (the private ``_ChainFitter.INIT_SWEEPS``, 0 in the
package, patched for the run: an experiment only); without them the start is
only projected on the budgets, which can zero whole rows of the first factor
(centroids at the origin: clusters lost from the first assignment on).
``clusters`` counts the non-empty clusters at the end: AMI against 10 classes
rises when clusters are lost, so an AMI is only compared at equal counts.

The protocol of ``qkmeans_paper.py``: for every (data set, K, seed) one
seeding, scikit-learn's ``kmeans_plusplus(X - mean, K, random_state=seed)`` on
the centred float32 data plus the mean; ``qkm.KMeans`` and
``QKMeans(K, sparsity_level=s, init=seeds, max_iter=20, budget_split=...)``
run 20 Lloyd iterations on the raw data. The splits alternate their order from
seed to seed; ``ratio`` is the objective over K-means' after 20 iterations.
CPU seconds are ``time.process_time`` of the fit; threads are pinned to 1
before numpy is imported, and the one-minute load is recorded with every fit.

``--kmeans-ks 56,58,60,62,64`` runs K-means only, the check behind the
``clusters`` column: ``qkm.KMeans`` at each of these K (the protocol's seeds
drawn at that K, 20 Lloyd iterations) on every data set of ``--cells``, with
AMI and objective per K (does AMI against 10 classes rise as K falls?)::

    .venv/bin/python benchmarks/studies/qkmeans_budget_split.py --cells fashion-mnist:64:3,coil20:64:3 \\
        --kmeans-ks 56,58,60,62,64 --out benchmarks/results/studies/qkmeans_budget_split_kmeans_k
"""

import argparse
import json
import os
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _paper_data import load_dataset  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 20
CELLS = "fashion-mnist:64:3,fashion-mnist:64:5,coil20:64:3,coil20:64:5,kddcup99:256:3"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default=CELLS, help="comma-separated dataset:K:s")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--splits", default="wide,even,wide/10,even/10", help="budget_split[/init sweeps]")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument("--render-from", default=None, help="comma-separated JSONs of parts run side by side: merge them")
    p.add_argument("--kmeans-ks", default=None,
                   help="K-means only: comma-separated K to fit on the data sets of --cells (AMI and objective per K)")
    args = p.parse_args()
    if args.render_from:
        parts = [json.loads(Path(f).read_text()) for f in args.render_from.split(",")]
        merge = ".venv/bin/python benchmarks/studies/qkmeans_budget_split.py " + shlex.join(sys.argv[1:])
        return write(args.out, [r for part in parts for r in part["rows"]], [e for part in parts for e in part["env"]],
                     [c for part in parts for c in part["command"]] + [merge], parts=parts)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    import numpy as np
    from sklearn.cluster import kmeans_plusplus
    from sklearn.metrics import adjusted_mutual_info_score

    sys.path.insert(0, str(REPO))
    import qkm
    from qkm.clustering._qkmeans import _ChainFitter

    load_before = os.getloadavg()
    if args.kmeans_ks:
        return kmeans_by_k(args, load_before)
    splits = args.splits.split(",")
    rows, data = [], {}
    for cell in args.cells.split(","):
        name, K, s = cell.split(":")
        K, s = int(K), int(s)
        if name not in data:
            data = {name: load_dataset(name, args.data_dir, dtype=np.float32)}
        X, y = data[name]
        mean = X.mean(axis=0, dtype=np.float64)
        for seed in [int(v) for v in args.seeds.split(",")]:
            init = (kmeans_plusplus((X - mean).astype(np.float32), K, random_state=seed)[0] + mean).astype(np.float32)
            km = qkm.KMeans(K, init=init, n_init=1, max_iter=ITERATIONS, tol=0.0).fit(X)
            order = splits if seed % 2 == 0 else splits[::-1]
            for variant in order:
                split, _, sweeps = variant.partition("/")
                _ChainFitter.INIT_SWEEPS = int(sweeps or 0)
                c = time.process_time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")             # lost clusters are counted below
                    qk = qkm.QKMeans(K, sparsity_level=s, init=init, max_iter=ITERATIONS, budget_split=split).fit(X)
                cpu = time.process_time() - c
                _ChainFitter.INIT_SWEEPS = 0
                rows.append(dict(dataset=name, K=K, s=s, seed=seed, split=variant, ratio=float(qk.inertia_ / km.inertia_),
                                 ami=float(adjusted_mutual_info_score(y, qk.labels_)),
                                 kmeans_ami=float(adjusted_mutual_info_score(y, km.labels_)),
                                 clusters=int(np.unique(qk.labels_).size), values=int(qk.nnz_with_mean_), cpu=cpu, load=os.getloadavg()[0]))
                print(rows[-1], flush=True)
    env = dict(python=platform.python_version(), numpy=np.__version__, qkm=qkm.__version__, cpus=os.cpu_count(),
               threads=1, loadavg_before=load_before, loadavg_after=os.getloadavg())
    write(args.out, rows, [env], [_command()])


def _command():
    return ".venv/bin/python benchmarks/studies/qkmeans_budget_split.py" + (
        "" if len(sys.argv) <= 1 else " " + shlex.join(sys.argv[1:]))


def kmeans_by_k(args, load_before):
    """``qkm.KMeans`` at every K of ``--kmeans-ks`` from the protocol's seeds: AMI and objective per K."""
    import numpy as np
    from sklearn.cluster import kmeans_plusplus
    from sklearn.metrics import adjusted_mutual_info_score

    import qkm

    ks = [int(v) for v in args.kmeans_ks.split(",")]
    rows = []
    for name in dict.fromkeys(cell.split(":")[0] for cell in args.cells.split(",")):
        X, y = load_dataset(name, args.data_dir, dtype=np.float32)
        mean = X.mean(axis=0, dtype=np.float64)
        for seed in [int(v) for v in args.seeds.split(",")]:
            for K in ks if seed % 2 == 0 else ks[::-1]:
                init = (kmeans_plusplus((X - mean).astype(np.float32), K, random_state=seed)[0] + mean).astype(np.float32)
                c = time.process_time()
                km = qkm.KMeans(K, init=init, n_init=1, max_iter=ITERATIONS, tol=0.0).fit(X)
                cpu = time.process_time() - c
                rows.append(dict(dataset=name, K=K, seed=seed, objective=float(km.inertia_),
                                 ami=float(adjusted_mutual_info_score(y, km.labels_)),
                                 clusters=int(np.unique(km.labels_).size), cpu=cpu, load=os.getloadavg()[0]))
                print(rows[-1], flush=True)
    env = dict(python=platform.python_version(), numpy=np.__version__, qkm=qkm.__version__, cpus=os.cpu_count(),
               threads=1, loadavg_before=load_before, loadavg_after=os.getloadavg())
    lines = ["# K-means AMI and objective against K (the protocol of `qkmeans_budget_split.py`)", "",
             "Produced by `benchmarks/studies/qkmeans_budget_split.py`; rerun with:", "", "    " + _command(), "",
             f"Environment: {env}.", "",
             "`qkm.KMeans(K, init=seeds, max_iter=20, tol=0)` from scikit-learn's `kmeans_plusplus` seeds drawn at "
             "each K on the centred float32 data (plus the mean); `objective` is the inertia after 20 iterations, "
             f"`/ K={ks[-1]}` its ratio to the mean at K = {ks[-1]}, `load` the one-minute load after each fit.", "",
             "| data set | K | AMI (mean) | per seed | objective (mean) | per seed | "
             f"/ K={ks[-1]} | clusters per seed | CPU s (mean) | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        last = np.mean([r["objective"] for r in rows if r["dataset"] == name and r["K"] == ks[-1]])
        for K in ks:
            rs = sorted((r for r in rows if r["dataset"] == name and r["K"] == K), key=lambda r: r["seed"])
            obj = np.mean([r["objective"] for r in rs])
            lines.append(f"| {name} | {K} | {np.mean([r['ami'] for r in rs]):.4f} | "
                         f"{', '.join(format(r['ami'], '.4f') for r in rs)} | {obj:.1f} | "
                         f"{', '.join(format(r['objective'], '.1f') for r in rs)} | {obj / last:.4f} | "
                         f"{', '.join(str(r['clusters']) for r in rs)} | {np.mean([r['cpu'] for r in rs]):.1f} | "
                         f"{', '.join(format(r['load'], '.1f') for r in rs)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from _machine import stamp, stamp_md

        Path(args.out + ".json").write_text(json.dumps(stamp(dict(env=[env], command=[_command()], rows=rows)), indent=1))
        Path(args.out + ".md").write_text(stamp_md(text))


def write(out, rows, envs, commands, parts=None):
    import numpy as np

    lines = ["# QK-means budget split: `budget_split=\"wide\"` vs `\"even\"` (same values, same seeds)", "",
             "Produced by `benchmarks/studies/qkmeans_budget_split.py`; rerun with:", ""]
    lines += ["    " + c for c in commands] + [""]
    lines += [f"Environment{'' if len(envs) == 1 else f' (part {i + 1})'}: {e}." for i, e in enumerate(envs)]
    lines += ["", "20 Lloyd iterations from the same k-means++ seeds; `ratio` is the objective over K-means' after 20 "
              "iterations (mean over the seeds), `values` the chain's nonzeros, `load` the one-minute load at the "
              "end of each fit.", "",
              "| data set | K | s | split[/init sweeps] | ratio (mean) | per seed | AMI (mean) | per seed | K-means AMI "
              "| clusters per seed | values | CPU s (mean) | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["dataset"], r["K"], r["s"], r["split"]) for r in rows))
    for key in keys:
        rs = sorted((r for r in rows if (r["dataset"], r["K"], r["s"], r["split"]) == key), key=lambda r: r["seed"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {np.mean([r['ratio'] for r in rs]):.4f} | "
                     f"{', '.join(format(r['ratio'], '.4f') for r in rs)} | {np.mean([r['ami'] for r in rs]):.4f} | "
                     f"{', '.join(format(r['ami'], '.4f') for r in rs)} | "
                     f"{np.mean([r['kmeans_ami'] for r in rs]):.4f} | "
                     f"{', '.join(str(r['clusters']) for r in rs)} | {rs[0]['values']} | "
                     f"{np.mean([r['cpu'] for r in rs]):.1f} | {', '.join(format(r['load'], '.1f') for r in rs)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        from _machine import stamp, stamp_md

        payload = stamp(dict(env=envs, command=commands, rows=rows), parts=parts)  # a merge records its parts'
        Path(out + ".json").write_text(json.dumps(payload, indent=1))
        Path(out + ".md").write_text(stamp_md(text, payload))


if __name__ == "__main__":
    main()
