"""Where QK-means' AMI stands on Fashion-MNIST (the AMI goal of the paper's protocol), and what moves it.

Rerun (from the repository root)::

    .venv/bin/python benchmarks/studies/qkmeans_ami.py --out benchmarks/results/studies/qkmeans_ami

The protocol of ``qkmeans_paper.py`` (K = 64, 20 Lloyd iterations, the same
k-means++ seeds on the centred float32 data for every method, seeds 0, 1, 2):

* ``qkm.KMeans`` against scikit-learn's ``KMeans(algorithm="lloyd")`` from the
  same seeds, in float32 and float64: labels that differ, objective, AMI. Our
  K-means' AMI is the yardstick of the goal, so it must be scikit-learn's.
* ``QKMeans(64, sparsity_level=3, init=seeds, max_iter=20)`` with the defaults
  and with one change each (``--variants``, indices into :data:`VARIANTS`;
  default the first four): 40 Lloyd iterations (``tol=0``), 30 warm sweeps per
  refit, per-factor budgets scaled by 1.19 (4,623 values: just under the
  reference's 4,638), Lloyd until the labels stop changing, the reference's
  whole allowance (4,638 values) spread evenly, to the last (wide) factor or
  to the inner ones, the same 3,888 values with one value per row moved from
  every inner factor to the last, longer hierarchical starts, and s = 5 with
  the same per-row move. Budgets and the hierarchical sweeps are not public
  parameters, so those variants patch the private ``factor_budgets`` /
  ``HIERARCHICAL_SWEEPS`` for the run (an experiment only).

Parts run side by side (``--seeds``, ``--variants``, ``--quick``: the
K-means check in float32 only) are merged into one table with
``--render-from part1.json,part2.json --out ...``; the budget study::

    .venv/bin/python benchmarks/studies/qkmeans_ami.py --render-from <parts> --out benchmarks/results/studies/qkmeans_ami_budgets

Objective ratios are over our K-means after 20 iterations from the same seeds.
Threads are pinned to 1 before numpy is imported; the load is recorded.
"""

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _paper_data import load_dataset  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
K = 64
ITERATIONS = 20
#: the reference's value count at s = 3 (its projection keeps the union of per-row and per-column budgets)
REFERENCE_VALUES = 4638
CONVERGE = {"max_iter": 200, "tol": 0.0}  # Lloyd until the labels stop changing (the loop stops there)


def _scaled(scale):
    return lambda budgets: [(kind, int(round(v * scale))) for kind, v in budgets]


def _extra(where, total=REFERENCE_VALUES):
    """The nominal budgets plus the values up to ``total``, to the last factor or spread over the others."""
    def change(budgets):
        extra = total - sum(v for _, v in budgets)
        out = [list(b) for b in budgets]
        targets = [len(out) - 1] if where == "last" else list(range(len(out) - 1))
        for i, t in enumerate(targets):
            out[t][1] += extra // len(targets) + (i < extra % len(targets))
        return [tuple(b) for b in out]
    return change


def _split(inner, last):
    """``inner`` values for every factor but the last, ``last`` for the last (a wide one, K < D)."""
    return lambda budgets: [(kind, inner) for kind, _ in budgets[:-1]] + [(budgets[-1][0], last)]


#: (name, QKMeans parameters, budget change or None[, hierarchical sweeps]). Budgets and the sweeps of the
#: hierarchical start are not public parameters, so a change patches the private ``factor_budgets`` /
#: ``HIERARCHICAL_SWEEPS`` for the run (an experiment only).
VARIANTS = [
    ("defaults", {}, None),
    ("max_iter=40, tol=0", {"max_iter": 40, "tol": 0.0}, None),
    ("palm_warm_iter=30", {"palm_warm_iter": 30}, None),
    ("budgets x1.19", {}, _scaled(1.19)),
    ("Lloyd to label convergence", CONVERGE, None),
    ("budgets x4638/3888", {}, _scaled(REFERENCE_VALUES / 3888)),
    ("budgets x4638/3888 + label convergence", CONVERGE, _scaled(REFERENCE_VALUES / 3888)),
    ("+750 values to the last factor", {}, _extra("last")),
    ("+750 values to the inner factors", {}, _extra("inner")),
    ("+750 values to the last factor + label convergence", CONVERGE, _extra("last")),
    ("3,888 values: inner 128, last 2,864", {}, _split(128, 2864)),
    ("4,638 values: inner 128, last 3,614", {}, _split(128, 3614)),
    ("4,638 values: inner 160, last 3,358", {}, _split(160, 3358)),
    ("+750 values to the last factor, max_iter=40, tol=0", {"max_iter": 40, "tol": 0.0}, _extra("last")),
    ("hierarchical sweeps 100/100/300", {}, None, (100, 100, 300)),
    ("+750 values to the last factor, hierarchical sweeps 100/100/300", {}, _extra("last"), (100, 100, 300)),
    ("s=5 defaults", {"sparsity_level": 5}, None),
    ("s=5, 6,480 values: inner 256, last 4,432", {"sparsity_level": 5}, _split(256, 4432)),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument("--render-from", default=None,
                   help="comma-separated JSON files of earlier runs (parts run side by side): merge and render them")
    p.add_argument("--quick", action="store_true", help="check K-means against scikit-learn in float32 only")
    p.add_argument("--variants", default="0,1,2,3", help="comma-separated indices into VARIANTS")
    args = p.parse_args()
    if args.render_from:
        return merge(args.render_from.split(","), args.out)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"

    import json

    import numpy as np
    import sklearn
    from sklearn.cluster import KMeans as SKKMeans
    from sklearn.cluster import kmeans_plusplus
    from sklearn.metrics import adjusted_mutual_info_score

    sys.path.insert(0, str(REPO))
    import qkm
    import qkm.clustering._qkmeans as qkmeans_module
    import qkm.factorization._factorize as factorize_module
    import qkm.factorization._lsq as lsq_module

    load_before = os.getloadavg()
    X, y = load_dataset("fashion-mnist", args.data_dir, dtype=np.float32)
    X64 = X.astype(np.float64)
    mean = X.mean(axis=0, dtype=np.float64)
    nominal = lsq_module.factor_budgets
    kmeans_rows, qk_rows = [], []
    for seed in [int(v) for v in args.seeds.split(",")]:
        init = (kmeans_plusplus((X - mean).astype(np.float32), K, random_state=seed)[0] + mean).astype(np.float32)
        ours = {}
        for dtype, data in (("float32", X), ("float64", X64))[:1 if args.quick else 2]:
            km = qkm.KMeans(K, init=init.astype(data.dtype), n_init=1, max_iter=ITERATIONS, tol=0.0).fit(data)
            sk = SKKMeans(K, init=init.astype(data.dtype), n_init=1, max_iter=ITERATIONS, tol=0.0,
                          algorithm="lloyd").fit(data)
            ours[dtype] = km
            kmeans_rows.append(dict(seed=seed, dtype=dtype, objective=float(km.inertia_), sk_objective=float(sk.inertia_),
                                    labels_differ=int(np.sum(km.labels_ != sk.labels_)),
                                    max_center_diff=float(np.abs(km.cluster_centers_ - sk.cluster_centers_).max()),
                                    ami=float(adjusted_mutual_info_score(y, km.labels_)),
                                    sk_ami=float(adjusted_mutual_info_score(y, sk.labels_))))
            print(kmeans_rows[-1], flush=True)
        base = ours["float32"].inertia_
        chosen = [VARIANTS[int(i)] for i in args.variants.split(",")]
        modules = (lsq_module, qkmeans_module, factorize_module)
        sweeps = factorize_module.HIERARCHICAL_SWEEPS
        for name, params, change, *hier in chosen:
            def budgets(shapes, s, change=change):
                return change(nominal(shapes, s))

            for module in modules:
                module.factor_budgets = nominal if change is None else budgets
            factorize_module.HIERARCHICAL_SWEEPS = hier[0] if hier else sweeps
            try:
                c = time.process_time()
                qk = qkm.QKMeans(K, init=init, **dict(dict(max_iter=ITERATIONS, sparsity_level=3), **params)).fit(X)
                cpu = time.process_time() - c
            finally:
                for module in modules:
                    module.factor_budgets = nominal
                factorize_module.HIERARCHICAL_SWEEPS = sweeps
            qk_rows.append(dict(seed=seed, variant=name, ratio=float(qk.inertia_ / base), values=int(qk.nnz_with_mean_),
                                ami=float(adjusted_mutual_info_score(y, qk.labels_)), cpu=cpu, n_iter=int(qk.n_iter_),
                                load=os.getloadavg()[0]))
            print(qk_rows[-1], flush=True)

    env = dict(python=platform.python_version(), numpy=np.__version__, sklearn=sklearn.__version__,
               qkm=qkm.__version__, cpus=os.cpu_count(), threads=1, loadavg_before=load_before,
               loadavg_after=os.getloadavg())
    command = ".venv/bin/python benchmarks/studies/qkmeans_ami.py" + ("" if len(sys.argv) <= 1 else
                                                             " " + shlex.join(sys.argv[1:]))
    text = render(kmeans_rows, qk_rows, env, command)
    print(text)
    if args.out:
        from _machine import stamp, stamp_md

        text = stamp_md(text)
        Path(args.out + ".json").write_text(json.dumps(stamp(dict(env=env, command=command, kmeans=kmeans_rows,
                                                                  qkmeans=qk_rows)), indent=1))
        Path(args.out + ".md").write_text(text)


def merge(paths, out):
    """One table from parts run side by side (each keeps its command and environment)."""
    import json

    parts = [json.loads(Path(path).read_text()) for path in paths]
    kmeans_rows = sorted({(r["seed"], r["dtype"]): r for p in parts for r in p["kmeans"]}.values(),
                         key=lambda r: (r["seed"], r["dtype"]))
    order = {v[0]: i for i, v in enumerate(VARIANTS)}
    qk_rows = sorted((r for p in parts for r in p["qkmeans"]), key=lambda r: (order.get(r["variant"], 99), r["seed"]))
    text = render(kmeans_rows, qk_rows, [p["env"] for p in parts], [p["command"] for p in parts])
    print(text)
    if out:
        from _machine import stamp, stamp_md

        payload = stamp(dict(parts=parts), parts=parts)  # the merge records its parts' commits and machines
        Path(out + ".json").write_text(json.dumps(payload, indent=1))
        Path(out + ".md").write_text(stamp_md(text, payload))


def render(kmeans_rows, qk_rows, env, command):
    import numpy as np

    envs, commands = (env, command) if isinstance(command, list) else ([env], [command])

    lines = ["# QK-means AMI on Fashion-MNIST (K = 64, s = 3, 20 iterations): K-means check and variants", "",
             "Produced by `benchmarks/studies/qkmeans_ami.py`; rerun with (parts run side by side, then merged with "
             "`--render-from`):", ""] + ["    " + c for c in commands] + [""] + \
            [f"Environment{'' if len(envs) == 1 else f' (part {i + 1})'}: {e}." for i, e in enumerate(envs)] + ["",
             "## qkm.KMeans vs scikit-learn KMeans (lloyd) from the same seeds, 20 iterations", "",
             "| seed | dtype | objective (qkm) | objective (sklearn) | labels differing | max centre difference "
             "| AMI (qkm) | AMI (sklearn) |", "|---|---|---|---|---|---|---|---|"]
    for r in kmeans_rows:
        lines.append(f"| {r['seed']} | {r['dtype']} | {r['objective']:.1f} | {r['sk_objective']:.1f} | "
                     f"{r['labels_differ']} | {r['max_center_diff']:.2g} | {r['ami']:.4f} | {r['sk_ami']:.4f} |")
    lines += ["", "## QKMeans(64) variants (sparsity_level=3 unless named; goal at s = 3: AMI >= 0.484)", "",
              "| variant | ratio (mean) | AMI (mean) | AMI per seed (seed: AMI) | values | CPU s (mean) | load |",
              "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["variant"] for r in qk_rows):
        rows = [r for r in qk_rows if r["variant"] == name]
        lines.append(f"| {name} | {np.mean([r['ratio'] for r in rows]):.4f} | {np.mean([r['ami'] for r in rows]):.4f} | "
                     f"{', '.join(str(r['seed']) + ': ' + format(r['ami'], '.4f') for r in rows)} | "
                     f"{rows[0]['values']} | "
                     f"{np.mean([r['cpu'] for r in rows]):.1f} | "
                     f"{', '.join(format(r['load'], '.1f') for r in rows)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
