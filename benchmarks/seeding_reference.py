"""Seeding time of reference k-means|| and greedy k-means++ implementations beside qkm's, on the same CSR data.

The issue asks k-means|| (l = 2K, r = 5) to seed >= 3x faster than greedy k-means++ at K = 500 on the 20
Newsgroups tf-idf. This runs, per seed and interleaved, on one thread and the same float64 CSR matrix:

* ``sklearn greedy k-means++``: ``sklearn.cluster.kmeans_plusplus`` (2 + floor(log2 K) trials per step);
* ``qkm greedy k-means++`` and ``qkm k-means||``: ``run_seeding`` as ``benchmarks/seeding.py`` does;
* ``spark k-means||``: Spark MLlib ``KMeans(initMode="k-means||", initSteps=5)`` (l = 2K is Spark's fixed
  oversampling), ``local[1]``, sparse vectors, in a child process that stays up for the run. Its seeding time
  is Spark's own log line "Initialization with k-means|| took ... seconds"; the fit runs one Lloyd iteration
  (``maxIter=1``), whose training cost is the cost of the seeds;
* ``dask-ml k-means||``: ``dask_ml.cluster.KMeans(init="k-means||", init_max_iter=5, oversampling_factor=2)``
  on a dask array of scipy.sparse chunks; the error is recorded when it does not accept them.

A peer whose package is missing (``benchmarks/requirements.txt``) is skipped with a message. Seeding costs are
sums of squared distances over all rows (qkm's ``potential`` for the qkm and scikit-learn seeds, Spark's
training cost for Spark's).

Run: ``.venv/bin/python benchmarks/seeding_reference.py --seeds 3 --out benchmarks/results/seeding_reference``
"""

import argparse
import os
import sys

if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[_var] = "1"  # before numpy is imported

import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
# this folder last on the path: its distributed.py must not shadow the distributed package (dask-ml imports it)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

INIT_LINE = re.compile(r"Initialization with k-means\|\| took ([0-9.]+) seconds")

# ----------------------------------------------------------------------------- the Spark child process
SPARK_CHILD = r"""
import json, sys, time
import numpy as np, scipy.sparse as sp
from pyspark.sql import SparkSession
from pyspark.ml.linalg import Vectors
from pyspark.ml.clustering import KMeans

path, K = sys.argv[1], int(sys.argv[2])
X = sp.csr_matrix(sp.load_npz(path))
X.sort_indices()
spark = (SparkSession.builder.master("local[1]").appName("seeding_reference")
         .config("spark.driver.memory", "6g").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
jvm = spark.sparkContext._jvm
jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("org.apache.spark.mllib.clustering.KMeans",
                                                               jvm.org.apache.logging.log4j.Level.INFO)
D = X.shape[1]
rows = [(Vectors.sparse(D, X.indices[X.indptr[i]:X.indptr[i + 1]].tolist(),
                        X.data[X.indptr[i]:X.indptr[i + 1]].tolist()),) for i in range(X.shape[0])]
df = spark.createDataFrame(rows, ["features"]).cache()
n = df.count()
print(json.dumps({"ready": n, "spark": spark.version}), flush=True)
for line in sys.stdin:
    seed = int(line)
    km = KMeans(k=K, initMode="k-means||", initSteps=5, maxIter=1, tol=0.0, seed=seed, featuresCol="features")
    t = time.perf_counter()
    model = km.fit(df)
    wall = time.perf_counter() - t
    sys.stderr.flush()
    print(json.dumps({"seed": seed, "fit_s": wall, "cost": float(model.summary.trainingCost),
                      "k": int(model.summary.k)}), flush=True)
spark.stop()
"""


class SparkPeer:
    """Spark MLlib k-means|| in a child process (one JVM for the whole run); its log goes to a file we read."""

    def __init__(self, data_path, K, log_path):
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", SPARK_CHILD, str(data_path), str(K)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.info = json.loads(self._line())

    def _line(self):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the Spark child ended (log: {self.log_path})")
            if line.startswith("{"):
                return line

    def run(self, seed):
        seen = len(INIT_LINE.findall(self.log_path.read_text(errors="replace")))
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        out = json.loads(self._line())
        time.sleep(0.5)  # the log line is written before the fit returns; let the file catch up
        inits = INIT_LINE.findall(self.log_path.read_text(errors="replace"))
        # without Spark's log line, the whole fit (seeding + one Lloyd iteration) bounds the seeding time
        out["seeding_s"] = float(inits[seen]) if len(inits) > seen else None
        out["seeding_s_is_fit"] = out["seeding_s"] is None
        if out["seeding_s"] is None:
            out["seeding_s"] = out["fit_s"]
        return out

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.log.close()


# ----------------------------------------------------------------------------- the in-process methods
def sklearn_greedy(X, K, seed):
    from sklearn.cluster import kmeans_plusplus

    t = time.perf_counter()
    centers, _ = kmeans_plusplus(X, K, random_state=seed)
    return time.perf_counter() - t, centers


def qkm_method(data, K, seed, method):
    from qkm.clustering._seeding import Seeding, run_seeding

    seeding = Seeding("k-means++") if method == "greedy k-means++" else Seeding("k-means||", oversampling_factor=2.0,
                                                                               init_rounds=5)
    s = run_seeding(seeding, data, K, np.random.RandomState(seed))
    return s.seconds, s.cost


def onedal(X, K, seed, method):
    """oneDAL's k-means inits on CSR (daal4py, from scikit-learn-intelex): ``parallelPlusCSR`` is k-means||
    (``oversamplingFactor`` is l / K, ``nRounds`` r), ``plusPlusCSR`` with ``nTrials`` greedy k-means++."""
    import daal4py as d4p

    d4p.daalinit(1)
    engine = d4p.engines_mt19937(seed=seed)
    if method == "k-means||":
        algo = d4p.kmeans_init(K, method="parallelPlusCSR", fptype="double", oversamplingFactor=2.0, nRounds=5,
                               engine=engine)
    else:
        algo = d4p.kmeans_init(K, method="plusPlusCSR", fptype="double", nTrials=2 + int(np.log2(K)), engine=engine)
    t = time.perf_counter()
    centers = algo.compute(X).centroids
    return time.perf_counter() - t, centers


def _capped_child(conn, path, K, seed, method):
    import _bench_data as ts

    X = ts.load_array(path)
    conn.send(onedal(X, K, seed, method)[0])


def capped(path, K, seed, method, limit):
    """``onedal`` in a child process stopped after ``limit`` seconds: (seconds or None, note)."""
    import multiprocessing as mp

    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_capped_child, args=(child, path, K, seed, method))
    proc.start()
    seconds = parent.recv() if parent.poll(limit) else None
    if seconds is None:
        proc.kill()
    proc.join()
    return seconds


def dask_ml_probe(X, K, seed):
    """dask-ml's k-means|| on scipy.sparse chunks: the seconds, or the error it raises."""
    import dask
    import dask.array as da
    from dask_ml.cluster import KMeans

    dX = da.from_array(X, chunks=(4096, X.shape[1]), asarray=False)
    t = time.perf_counter()
    try:
        with dask.config.set(scheduler="synchronous"):
            KMeans(n_clusters=K, init="k-means||", init_max_iter=5, oversampling_factor=2, max_iter=0,
                   random_state=seed).fit(dX)
    except Exception as e:  # noqa: BLE001 - the error is the result
        return None, f"{type(e).__name__}: {e}"
    return time.perf_counter() - t, None


# ----------------------------------------------------------------------------- report
def write_report(out, meta, rows, notes):
    by = {}
    for r in rows:
        if r.get("seeding_s") is not None:
            by.setdefault(r["method"], []).append(r)
    med = {m: float(np.median([r["seeding_s"] for r in v])) for m, v in by.items()}
    title = f"reference k-means|| and greedy k-means++ beside qkm's (20 Newsgroups tf-idf, K = {meta['K']})"
    lines = [f"# Seeding: {title}", "",
             f"Command: `{meta['command']}`", "",
             f"Machine: {meta['machine']}; 1 thread everywhere; load average (1 min) "
             f"at start {meta['load_start']:.2f}, at end {meta['load_end']:.2f} (before each row in the JSON); "
             f"{meta['versions']}.", "",
             "Methods run interleaved per seed (one row of each per seed, same CSR float64 matrix). Seeding time "
             "only: scikit-learn's `kmeans_plusplus` call; oneDAL's `kmeans_init(...).compute` (`plusPlusCSR` with "
             "2 + floor(log2 K) trials; `parallelPlusCSR`, oversamplingFactor 2 = l / K, nRounds 5); qkm's "
             "`run_seeding` seconds (dense K x D output, as in benchmarks/seeding.py)"
             + ("; Spark's own log line for its k-means|| initialisation" if "spark k-means||" in by else "")
             + ". Costs: sums of squared distances of all rows to the seeds.", "",
             "| method | seeding s (median) | per seed | seeding cost (mean) | / sklearn greedy s |",
             "|---|---:|---:|---:|---:|"]
    base = med.get("sklearn greedy k-means++")
    for m, v in by.items():
        costs = [r["seeding_cost"] for r in v if r.get("seeding_cost") is not None]
        per = ", ".join(f"{r['seeding_s']:.2f}" for r in v)
        ratio = f"{med[m] / base:.3f}" if base else "–"
        cost = f"{np.mean(costs):.4e}" if costs else "–"
        lines.append(f"| {m.replace('|', chr(92) + '|')} | {med[m]:.2f} | {per} | {cost} | {ratio} |")
    lines += ["", "## Ratios (greedy k-means++ seconds / k-means|| seconds, medians; the issue's goal is >= 3)", ""]
    for greedy, kmpar in (("sklearn greedy k-means++", "oneDAL k-means||"),
                          ("oneDAL greedy k-means++", "oneDAL k-means||"),
                          ("sklearn greedy k-means++", "spark k-means||"),
                          ("qkm greedy k-means++", "qkm k-means||"),
                          ("sklearn greedy k-means++", "qkm k-means||")):
        if greedy in med and kmpar in med:
            lines.append(f"- {greedy} / {kmpar}: **{med[greedy] / med[kmpar]:.2f}**".replace("||", "\\|\\|"))
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    from _machine import stamp, stamp_md

    payload = stamp(dict(meta=meta, rows=rows, notes=notes, **{k: meta[k] for k in ("commit", "machine") if k in meta}))
    Path(out + ".md").write_text(stamp_md("\n".join(lines) + "\n", payload))
    Path(out + ".json").write_text(json.dumps(payload, indent=1) + "\n")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--n-clusters", type=int, default=500)
    p.add_argument("--data-dir", default=str(HERE.parent / ".." / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(HERE / ".cache"))
    p.add_argument("--methods", default="sklearn greedy k-means++,oneDAL greedy k-means++,oneDAL k-means||,"
                                        "qkm greedy k-means++,qkm k-means||,dask-ml k-means||",
                   help="comma-separated; also 'spark k-means||' (not by default: see the notes of the results)")
    p.add_argument("--capped", default="", help="METHOD=SECONDS: run an oneDAL method on the first seed only, in a "
                   "child process stopped after SECONDS (recorded as a lower bound)")
    p.add_argument("--quick-rows", type=int, default=None, help="a row sample of the data (a quick check)")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    p.add_argument("--report-only", action="store_true", help="rebuild OUT.md from OUT.json")
    args = p.parse_args()
    if args.report_only:
        saved = json.loads(Path(args.out + ".json").read_text())
        meta = dict(saved["meta"], **{k: saved[k] for k in ("commit", "machine") if k in saved})  # the run's, kept
        print(write_report(args.out, meta, saved["rows"], saved["notes"]))
        return
    import scipy
    import sklearn
    import _bench_data as ts
    from _machine import cpu_name

    from qkm._data import KMeansData
    from qkm._validation import check_data
    from qkm.clustering._seeding import Seeding, potential, run_seeding

    methods = [m.strip() for m in args.methods.split(",")]
    cap = dict((c.rsplit("=", 1)[0], float(c.rsplit("=", 1)[1])) for c in args.capped.split(",") if c)
    methods += [m for m in cap if m not in methods]
    K = args.n_clusters
    path = ts.ensure_matrix("20news-tfidf", args.data_dir, args.cache_dir, args.quick_rows)
    X = check_data(ts.load_array(path))
    data = KMeansData(X)
    versions = [f"numpy {np.__version__}", f"scipy {scipy.__version__}", f"scikit-learn {sklearn.__version__}"]
    notes = []
    for init in ("k-means++", "k-means||"):  # compile qkm's kernels outside the timings
        run_seeding(Seeding(init), KMeansData(X[:300]), 5, np.random.RandomState(0))
    spark = None
    if "spark k-means||" in methods:
        try:
            import pyspark

            spark = SparkPeer(path, K, Path(args.cache_dir) / "seeding_reference_spark.log")
            versions.append(f"pyspark {pyspark.__version__} (Spark {spark.info['spark']}, local[1])")
        except Exception as e:  # noqa: BLE001 - a missing peer is skipped with a message
            notes.append(f"spark k-means|| skipped: {type(e).__name__}: {e}")
            print(notes[-1], flush=True)
            methods.remove("spark k-means||")
    if any(m.startswith("oneDAL ") for m in methods):
        try:
            import daal4py

            from importlib.metadata import version

            versions.append(f"oneDAL via scikit-learn-intelex {version('scikit-learn-intelex')} ({daal4py.__name__})")
        except ImportError as e:
            notes.append(f"oneDAL skipped: {e}")
            methods = [m for m in methods if not m.startswith("oneDAL ")]
    if "dask-ml k-means||" in methods:
        try:
            import dask_ml

            versions.append(f"dask-ml {dask_ml.__version__}")
        except ImportError as e:
            notes.append(f"dask-ml k-means|| skipped: {e}")
            methods.remove("dask-ml k-means||")
    meta = dict(command=".venv/bin/python benchmarks/seeding_reference.py " + " ".join(sys.argv[1:]),
                machine=f"{cpu_name()}, {os.cpu_count()} logical cores", python=platform.python_version(),
                load_start=os.getloadavg()[0], versions=", ".join(versions), K=K, shape=list(X.shape))
    rows = []
    try:
        for seed in range(args.seeds):
            for m in list(methods):
                row = dict(method=m, seed=seed, load1=os.getloadavg()[0])
                if m == "sklearn greedy k-means++":
                    row["seeding_s"], centers = sklearn_greedy(X, K, seed)
                    row["seeding_cost"] = float(potential(data, centers))
                elif m in cap:
                    if seed > 0:
                        continue
                    row["seeding_s"] = capped(path, K, seed, m[7:], cap[m])
                    if row["seeding_s"] is None:
                        row["stopped_after_s"] = cap[m]
                        notes.append(f"{m} (seed 0 only) was stopped after {cap[m]:.0f} s without a result")
                elif m.startswith("oneDAL "):
                    row["seeding_s"], centers = onedal(X, K, seed, m[7:])
                    row["seeding_cost"] = float(potential(data, centers))
                elif m.startswith("qkm "):
                    row["seeding_s"], row["seeding_cost"] = qkm_method(data, K, seed, m[4:])
                elif m == "spark k-means||":
                    out = spark.run(seed)
                    row.update(seeding_s=out["seeding_s"], seeding_cost=out["cost"], spark_fit_s=out["fit_s"],
                               seeding_s_is_fit=out["seeding_s_is_fit"])
                elif m == "dask-ml k-means||":
                    row["seeding_s"], err = dask_ml_probe(X, K, seed)
                    if err:
                        row["error"] = err
                        note = f"dask-ml k-means|| on scipy.sparse chunks fails: `{err[:300]}`"
                        if note not in notes:
                            notes.append(note)
                        methods.remove(m)  # the same error on every seed
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if spark is not None:
            spark.close()
    meta["load_end"] = os.getloadavg()[0]
    if args.out:
        print(write_report(args.out, meta, rows, notes))


if __name__ == "__main__":
    main()
