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
import gc
import gzip
import io
import json
import platform
import resource
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

import numpy as np
import scipy.sparse as sp

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
CACHE_DIR = BENCH_DIR / ".cache"
DEFAULT_DATA_DIR = REPO_DIR.parent / "shared" / "data"
DEFAULT_OUT = BENCH_DIR / "results" / "train_sparse"

MAX_ITER = 300
TOL = 1e-4
INIT_SEED = 0
REFERENCE_METHOD = "sklearn-elkan"  # label diffs, relative inertia and extrapolation refer to it

DATASETS = {
    "news20": {"ks": (100, 500), "desc": "LIBSVM news20 term counts, rows L2-normalised (CSR)"},
    "20news-tfidf": {"ks": (100, 500), "desc": "20 Newsgroups bydate train+test, TfidfVectorizer() (CSR)"},
    "fashion-mnist": {"ks": (64,), "desc": "Fashion-MNIST train images / 255 (dense)"},
}

# Run order matters: the reference method goes first so later rows can be compared to it.
METHODS = ("sklearn-elkan", "sklearn-lloyd", "sparsekmeans-lloyd", "sparsekmeans-elkan", "qkm-lloyd", "qkm-elkan")
DEFAULT_METHODS = tuple(m for m in METHODS if m != "sparsekmeans-elkan")
DEFAULT_CAPS = ("sklearn-lloyd=6@500",)

ITER_UNITS = {
    "sklearn": "Lloyd/Elkan iterations (n_iter_)",
    "sparsekmeans": "assignment steps (= centre updates + 1 when converged)",
    "qkm": "iterations (n_iter_)",
}


# --------------------------------------------------------------------------- small I/O helpers


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; move it onto ``path`` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path, text):
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)


def save_array_atomic(path, array):
    """Save a dense ``.npy`` or an uncompressed sparse ``.npz`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            if sp.issparse(array):
                sp.save_npz(f, array, compressed=False)
            else:
                np.save(f, array)


def load_array(path):
    path = str(path)
    if path.endswith(".npz"):
        return sp.csr_matrix(sp.load_npz(path))
    return np.load(path)


# --------------------------------------------------------------------------- datasets


def load_news20(data_dir):
    """news20 libsvm term counts -> float64 CSR with L2-normalised rows."""
    from sklearn.datasets import load_svmlight_file
    from sklearn.preprocessing import normalize

    X, _ = load_svmlight_file(str(Path(data_dir) / "news20" / "news20.bz2"), n_features=62061, dtype=np.float64)
    return sp.csr_matrix(normalize(X, norm="l2", copy=False), dtype=np.float64)


def extract_20news(data_dir, cache_dir):
    """Extract 20news-bydate.tar.gz into the cache once; return the folder holding the two splits."""
    target = Path(cache_dir) / "20news-bydate"
    marker = target / ".extracted"
    if marker.exists():
        return target
    if target.exists():
        shutil.rmtree(target)  # a previous extraction was interrupted
    Path(cache_dir).mkdir(parents=True, exist_ok=True)  # a fresh clone has no cache yet
    tmp = Path(tempfile.mkdtemp(prefix=".20news-bydate.", dir=cache_dir))
    with tarfile.open(Path(data_dir) / "20newsgroups" / "20news-bydate.tar.gz") as tar:
        try:
            tar.extractall(tmp, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(tmp)
    os.replace(tmp, target)
    marker.touch()
    return target


def load_20news_tfidf(data_dir, cache_dir):
    """20 Newsgroups bydate train then test, TfidfVectorizer() defaults -> float64 CSR."""
    from sklearn.datasets import load_files
    from sklearn.feature_extraction.text import TfidfVectorizer

    root = extract_20news(data_dir, cache_dir)
    docs = []
    for split in ("20news-bydate-train", "20news-bydate-test"):
        docs.extend(load_files(str(root / split), encoding="latin1").data)
    X = TfidfVectorizer().fit_transform(docs)
    return sp.csr_matrix(X, dtype=np.float64)


def read_idx_images(path):
    """Parse an IDX3 (ubyte) image file, gzip or not, into a uint8 array (n, rows*cols)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    magic, n, rows, cols = np.frombuffer(raw, dtype=">u4", count=4)
    if magic != 0x00000803:
        raise ValueError(f"{path}: bad IDX3 magic {magic:#010x}, expected 0x00000803")
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16)
    if pixels.size != n * rows * cols:
        raise ValueError(f"{path}: {pixels.size} pixels, header says {n}x{rows}x{cols}")
    return pixels.reshape(int(n), int(rows) * int(cols))


def load_fashion_mnist(data_dir):
    """Fashion-MNIST train images -> float64 (60000, 784) in [0, 1]."""
    images = read_idx_images(Path(data_dir) / "fashion-mnist" / "train-images-idx3-ubyte.gz")
    return np.ascontiguousarray(images, dtype=np.float64) / 255.0


def build_dataset(name, data_dir, cache_dir):
    if name == "news20":
        return load_news20(data_dir)
    if name == "20news-tfidf":
        return load_20news_tfidf(data_dir, cache_dir)
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    raise ValueError(f"unknown dataset {name!r}")


def dataset_tag(name, quick_rows):
    return name if not quick_rows else f"{name}_quick{quick_rows}"


def matrix_cache_path(cache_dir, name, quick_rows):
    ext = ".npy" if name == "fashion-mnist" else ".npz"
    return Path(cache_dir) / (dataset_tag(name, quick_rows) + ext)


def init_cache_path(cache_dir, name, quick_rows, k):
    return Path(cache_dir) / f"init_{dataset_tag(name, quick_rows)}_k{k}_rs{INIT_SEED}.npy"


def subsample_rows(X, n_rows, seed=0):
    """Fixed random subset of rows (sorted, so the original order is kept)."""
    if n_rows >= X.shape[0]:
        return X
    rows = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=n_rows, replace=False))
    return X[rows]


def ensure_matrix(name, data_dir, cache_dir, quick_rows):
    """Return the cached matrix path for a dataset (or its quick subsample), building it if needed."""
    path = matrix_cache_path(cache_dir, name, quick_rows)
    if path.exists():
        return path
    full_path = matrix_cache_path(cache_dir, name, None)
    if full_path.exists():
        X = load_array(full_path)
    else:
        print(f"  building {full_path.name} from {data_dir} ...", flush=True)
        X = build_dataset(name, data_dir, cache_dir)
        save_array_atomic(full_path, X)
    if quick_rows:
        save_array_atomic(path, subsample_rows(X, quick_rows))
    return path


def ensure_init(name, matrix_path, cache_dir, quick_rows, k):
    """Return the cached kmeans++ initial centres (k, n_features) for a dataset, computing them once."""
    path = init_cache_path(cache_dir, name, quick_rows, k)
    if not path.exists():
        from sklearn.cluster import kmeans_plusplus

        X = load_array(matrix_path)
        print(f"  computing kmeans_plusplus({dataset_tag(name, quick_rows)}, K={k}, random_state={INIT_SEED}) ...", flush=True)
        centers, _ = kmeans_plusplus(X, k, random_state=INIT_SEED)
        save_array_atomic(path, np.ascontiguousarray(centers, dtype=np.float64))
    return path


def describe_matrix(path):
    X = load_array(path)
    info = {"n_samples": int(X.shape[0]), "n_features": int(X.shape[1]), "sparse": bool(sp.issparse(X))}
    if sp.issparse(X):
        info["nnz"] = int(X.nnz)
        info["density"] = X.nnz / (X.shape[0] * X.shape[1])
    return info


def prepare_main(spec_path):
    """Subprocess entry point: build caches and initial centres (kept out of the parent's memory)."""
    spec = json.loads(Path(spec_path).read_text())
    cache_dir = Path(spec["cache_dir"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    name, quick_rows = spec["dataset"], spec["quick_rows"]
    matrix_path = ensure_matrix(name, spec["data_dir"], cache_dir, quick_rows)
    inits = {str(k): str(ensure_init(name, matrix_path, cache_dir, quick_rows, k)) for k in spec["ks"]}
    result = {"matrix_path": str(matrix_path), "inits": inits, "info": describe_matrix(matrix_path)}
    write_text_atomic(spec["result_path"], json.dumps(result))


# --------------------------------------------------------------------------- common objective


def assign_and_objective(X, centers, labels=None, tie_rtol=1e-10, block_bytes=64 * 2**20):
    """Nearest-centre labels and k-means objective: the SAME function scores every method.

    objective = sum over rows of min_j ||x - c_j||^2, computed in float64 as
    ||x||^2 - 2 x.c + ||c||^2 (clipped at 0) over row blocks of ~``block_bytes``;
    ``X`` may be dense or CSR.

    If ``labels`` is given, also count rows whose label is not a nearest centre, ties
    allowed: ``d(x, c_label) - min_j d(x, c_j) > tie_rtol * (||x||^2 + max_j ||c_j||^2)``.
    Returns ``(nearest_labels, objective, n_not_nearest or None)``.
    """
    C = centers.toarray() if sp.issparse(centers) else np.asarray(centers)
    C = np.ascontiguousarray(C, dtype=np.float64)
    CT = np.ascontiguousarray(C.T)
    c_sq = np.einsum("ij,ij->i", C, C)
    n, k = X.shape[0], C.shape[0]
    rows_per_block = max(1, block_bytes // (8 * max(k, 1)))
    nearest = np.empty(n, dtype=np.int64)
    total, not_nearest = 0.0, 0
    for start in range(0, n, rows_per_block):
        Xb = X[start : start + rows_per_block]
        if sp.issparse(Xb):
            Xb = sp.csr_matrix(Xb, dtype=np.float64)
            x_sq = np.asarray(Xb.multiply(Xb).sum(axis=1)).ravel()
            D = np.asarray(Xb @ CT)
        else:
            Xb = np.asarray(Xb, dtype=np.float64)
            x_sq = np.einsum("ij,ij->i", Xb, Xb)
            D = Xb @ CT
        D *= -2.0
        D += x_sq[:, None]
        D += c_sq[None, :]
        np.maximum(D, 0.0, out=D)
        rows = np.arange(D.shape[0])
        lab = np.argmin(D, axis=1)
        d_min = D[rows, lab]
        nearest[start : start + len(lab)] = lab
        total += float(d_min.sum())
        if labels is not None:
            given = np.asarray(labels[start : start + len(lab)], dtype=np.int64)
            slack = tie_rtol * (x_sq + c_sq.max(initial=0.0))
            not_nearest += int(np.count_nonzero(D[rows, given] - d_min > slack))
    return nearest, total, (not_nearest if labels is not None else None)


# --------------------------------------------------------------------------- memory measurement


def _proc_status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def ru_maxrss_kb():
    """Peak RSS of this process in KiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value // 1024 if sys.platform == "darwin" else value


def reset_peak_rss():
    """Reset the kernel's RSS high-water mark (Linux >= 4.0). Returns True if it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryWindow:
    """Peak RSS growth over a block of code.

    ``peak_mb`` = VmHWM after the block - VmRSS before it, with VmHWM reset just before the
    block. ru_maxrss growth is recorded too, but on Linux a child's ru_maxrss starts at its
    parent's peak RSS (inherited at exec), which can hide the growth; hence the HWM reset.
    """

    def __enter__(self):
        gc.collect()
        self.hwm_reset = reset_peak_rss()
        self.rss0 = _proc_status_kb("VmRSS")
        self.ru0 = ru_maxrss_kb()
        return self

    def __exit__(self, *exc):
        hwm = _proc_status_kb("VmHWM")
        self.ru_growth_mb = max(0, ru_maxrss_kb() - self.ru0) / 1024
        if self.hwm_reset and hwm is not None and self.rss0 is not None:
            self.peak_mb = max(0, hwm - self.rss0) / 1024
            self.source = "VmHWM-VmRSS"
        else:
            self.peak_mb = self.ru_growth_mb
            self.source = "ru_maxrss"
        self.rss_before_mb = (self.rss0 or self.ru0) / 1024
        return False


# --------------------------------------------------------------------------- methods


def method_family(method):
    return method.split("-", 1)[0]


def method_algorithm(method):
    return method.split("-", 1)[1]


def make_sklearn_fit(algorithm, threads):
    from sklearn.cluster import KMeans

    def fit(X, C0, max_iter):
        km = KMeans(n_clusters=C0.shape[0], init=C0, n_init=1, max_iter=max_iter, tol=TOL, algorithm=algorithm)
        km.fit(X)
        return {"labels": km.labels_, "centers": km.cluster_centers_, "n_iter": int(km.n_iter_),
                "reported_inertia": float(km.inertia_)}

    return fit


def sparsekmeans_fixed_init_class(algorithm):
    """Subclass of sparsekmeans.LloydKmeans / ElkanKmeans that starts from given centres.

    sparsekmeans has no ``init=`` parameter: ``SparseKmeans.fit`` calls
    ``self._initialize_centroids(X: graphblas.Matrix) -> graphblas.Matrix`` (FP64,
    n_clusters x n_features; its own kmeans++ builds it row by row from rows of X, i.e. a
    sparse-format matrix) and then ``_single_kmeans``. We override ``_initialize_centroids`` to
    return C0 in that same form, and wrap ``_assign_cluster`` / ``_update_centroids`` to count
    steps and keep the first assignment's labels (to check that C0 really was used). The counts
    live in ``self.bench_stats``, a dict the caller keeps a reference to: ``fit`` ends with
    ``_cleanup()``, which deletes every attribute not on its keep-list.
    """
    import graphblas as gb
    import sparsekmeans

    base = {"lloyd": sparsekmeans.LloydKmeans, "elkan": sparsekmeans.ElkanKmeans}[algorithm]

    class FixedInitKmeans(base):
        def __init__(self, init_centers, **kwargs):
            super().__init__(**kwargs)
            self.bench_init = np.ascontiguousarray(init_centers, dtype=np.float64)
            self.bench_stats = {"init_calls": 0, "assign_steps": 0, "updates": 0, "first_labels": None}

        def _initialize_centroids(self, X):
            C0 = self.bench_init
            if C0.shape != (self.n_clusters, X.shape[1]):
                raise ValueError(f"init centres {C0.shape} != ({self.n_clusters}, {X.shape[1]})")
            self.bench_stats["init_calls"] += 1
            return gb.io.from_scipy_sparse(sp.csr_matrix(C0))  # FP64, explicit zeros dropped

        def _assign_cluster(self, X):
            super()._assign_cluster(X)
            stats = self.bench_stats
            if stats["assign_steps"] == 0:
                stats["first_labels"] = np.array(self.labels, copy=True)
            stats["assign_steps"] += 1

        def _update_centroids(self, X):
            self.bench_stats["updates"] += 1
            return super()._update_centroids(X)

    return FixedInitKmeans


def make_sparsekmeans_fit(algorithm, threads):
    import graphblas as gb

    gb.ss.config["nthreads"] = threads  # global default; per-call n_threads is set below too
    cls = sparsekmeans_fixed_init_class(algorithm)

    def fit(X, C0, max_iter):
        model = cls(C0, n_clusters=C0.shape[0], n_threads=threads, max_iter=max_iter, tol=TOL,
                    random_state=INIT_SEED, verbose=False)
        stats = model.bench_stats
        with contextlib.redirect_stdout(io.StringIO()):  # fit() prints "Total samples: n"
            labels = model.fit(X)
        if stats["init_calls"] != 1:
            raise RuntimeError(f"init override called {stats['init_calls']} times, expected 1")
        return {"labels": np.asarray(labels, dtype=np.int64), "centers": model.centroids.to_dense(fill_value=0.0),
                "n_iter": stats["assign_steps"], "n_updates": stats["updates"], "reported_inertia": None,
                "first_labels": stats["first_labels"]}

    return fit


def make_qkm_fit(algorithm, threads):
    sys.path.insert(0, str(REPO_DIR))  # use the working tree's qkm even if not pip-installed
    from qkm import KMeans

    def fit(X, C0, max_iter):
        km = KMeans(n_clusters=C0.shape[0], init=C0, n_init=1, max_iter=max_iter, tol=TOL, algorithm=algorithm,
                    n_jobs=threads)
        km.fit(X)
        centers = km.cluster_centers_
        centers = centers.toarray() if sp.issparse(centers) else np.asarray(centers)
        return {"labels": np.asarray(km.labels_, dtype=np.int64), "centers": centers, "n_iter": int(km.n_iter_),
                "reported_inertia": float(km.inertia_)}

    return fit


def make_fit(method, threads):
    """Import the method's library and return ``fit(X, C0, max_iter) -> dict`` (ImportError propagates)."""
    family, algorithm = method_family(method), method_algorithm(method)
    factory = {"sklearn": make_sklearn_fit, "sparsekmeans": make_sparsekmeans_fit, "qkm": make_qkm_fit}[family]
    return factory(algorithm, threads)


def method_input(method, X):
    """sparsekmeans only takes CSR: dense data is converted before (outside) the timed fit."""
    if method_family(method) == "sparsekmeans" and not sp.issparse(X):
        return sp.csr_matrix(X)
    return X


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


def load_average():
    """1-minute load average (other busy processes make timings unreliable), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:
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


# --------------------------------------------------------------------------- reporting


def one_line(text, width=150):
    """First line of a message, safe inside a markdown table cell."""
    line = str(text).strip().splitlines()[0] if text else ""
    line = line.replace("|", "/")
    return line if len(line) <= width else line[: width - 3] + "..."


def fmt(value, spec=".3g", none="-"):
    if value is None:
        return none
    return format(value, spec)


def cap_note(r):
    if not r.get("cap_iter"):
        return ""
    if not r.get("capped"):
        return f"cap {r['cap_iter']} not reached"
    if r.get("extrapolated_s") is None:
        return f"capped at {r['cap_iter']} it; no {REFERENCE_METHOD} run to extrapolate to"
    return (f"capped at {r['cap_iter']} iterations, time extrapolated to the converged iteration count of "
            f"{REFERENCE_METHOD} ({r['extrapolated_to_iter']} it): {r['extrapolated_s']:.1f} s; inertia and "
            f"labels are after {r['cap_iter']} iterations (not converged)")


def format_table(name, k, info, rows, summary):
    shape = f"{info['n_samples']} x {info['n_features']}"
    dens = f", density {info['density']:.2e}" if info.get("sparse") else ", dense"
    lines = [f"### {name}, K = {k} ({shape}{dens})", "",
             "| method | fit wall s | CPU s | iters | s/iter | inertia (recomputed) | rel. vs "
             f"{REFERENCE_METHOD} | labels != {REFERENCE_METHOD} | peak MB | t / qkm-best | capped / extrapolated |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['method']} | {r['status']}: {one_line(r.get('reason'))} | | | | | | | | | |")
            continue
        iters = f"{r['n_iter']}" + ("*" if method_family(r["method"]) == "sparsekmeans" else "")
        ratio = r.get("time_over_qkm_best")
        ratio_s = ("~" if r.get("extrapolated_s") else "") + fmt(ratio, ".2f") if ratio else "n/a"
        lines.append(
            f"| {r['method']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {iters} | {r['s_per_iter']:.3f} | "
            f"{r['inertia']:.6f} | {fmt(r.get('inertia_rel_vs_ref'), '+.2e')} | {fmt(r.get('labels_diff_vs_ref'), 'd')} | "
            f"{r['peak_mb']:.0f} | {ratio_s} | {cap_note(r)} |")
    lines += ["", *summary_lines(summary), ""]
    return "\n".join(lines)


def summary_lines(s):
    if not s["qkm_best"]:
        return ["Ratios: no qkm method ran successfully, so no qkm ratios in this run."]
    out = [f"qkm-best = {s['qkm_best']} ({s['qkm_best_s']:.2f} s). Speed-up of qkm-best (other time / qkm-best "
           "time, > 1 means qkm is faster):"]
    if s.get("speedup_vs_fastest_sklearn"):
        out.append(f"vs fastest scikit-learn ({s['fastest_sklearn']}, {s['fastest_sklearn_s']:.2f} s) "
                   f"**{s['speedup_vs_fastest_sklearn']:.2f}x**;")
    if s.get("speedup_vs_sparsekmeans_lloyd"):
        out.append(f"vs SparseKmeans Lloyd ({s['sparsekmeans_lloyd_s']:.2f} s) "
                   f"**{s['speedup_vs_sparsekmeans_lloyd']:.2f}x**.")
    return [" ".join(out)]


NOTES = """Notes:
- All methods start from the same `kmeans_plusplus(X, K, random_state=0)` centres; max_iter=300, tol=1e-4.
- Each fit runs in a fresh subprocess after one untimed warm-up fit (2 iterations on the first rows).
- inertia = sum of squared distances to the nearest final centre, recomputed by the benchmark (float64).
- peak MB = RSS high-water mark during fit minus RSS before fit (VmHWM reset via /proc/self/clear_refs).
- iters*: SparseKmeans counts assignment steps (one more than its centre updates when it converges).
- t / qkm-best uses the extrapolated time for capped rows (marked ~)."""


def machine_info():
    import psutil  # benchmark-only dependency

    cpu_model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions = {"python": platform.python_version()}
    for pkg in ("numpy", "scipy", "scikit-learn", "numba", "sparsekmeans", "python-graphblas",
                "suitesparse-graphblas", "threadpoolctl", "psutil", "qkm"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpu_model": cpu_model, "logical_cores": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "loadavg_1min_at_start": load_average(),
            "versions": versions}


def write_results(out, meta, sections, all_rows):
    rows = [{k: v for k, v in r.items() if k != "labels_path"} for r in all_rows]
    payload = dict(meta, rows=rows, summaries=[s["summary"] for s in sections])
    write_text_atomic(str(out) + ".json", json.dumps(payload, indent=1, default=str) + "\n")
    v = meta["machine"]["versions"]
    md = [f"# train_sparse benchmark ({meta['date']})", "",
          f"Machine: {meta['machine']['cpu_model']}, {meta['machine']['logical_cores']} logical cores, "
          f"{meta['machine']['memory_gb']} GB; threads = {meta['threads']}; 1-min load average at start "
          f"{fmt(meta['machine']['loadavg_1min_at_start'], '.2f')} (per-run values in the JSON).",
          "Versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]), "",
          "Rerun:", "", "```", meta["rerun"], "```", "", *[s["table"] for s in sections], NOTES, ""]
    write_text_atomic(str(out) + ".md", "\n".join(md))


# --------------------------------------------------------------------------- sparsekmeans init self-check


def check_sparsekmeans_init(n=2000, d=3000, k=20, density=0.02, seed=0):
    """Show that the override is used: first-step labels are nearest-C0 labels; a control run is not."""
    import sparsekmeans
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.preprocessing import normalize

    X = normalize(sp.random(n, d, density=density, format="csr", random_state=seed, dtype=np.float64))
    C0, _ = kmeans_plusplus(X, k, random_state=INIT_SEED)
    nearest_C0, _, _ = assign_and_objective(X, C0)
    print(f"random sparse problem {n} x {d}, density {density}, K={k}; C0 = kmeans_plusplus(random_state={INIT_SEED})")
    ok = True
    for algorithm in ("lloyd", "elkan"):
        fit = make_sparsekmeans_fit(algorithm, 1)
        one = fit(X, C0, 1)
        exact = int(np.count_nonzero(one["first_labels"] != nearest_C0))
        not_nearest = assign_and_objective(X, C0, labels=one["first_labels"])[2]
        full = fit(X, C0, MAX_ITER)
        sk = KMeans(n_clusters=k, init=C0, n_init=1, max_iter=MAX_ITER, tol=TOL, algorithm=algorithm).fit(X)
        obj_skm = assign_and_objective(X, full["centers"])[1]
        obj_sk = assign_and_objective(X, sk.cluster_centers_)[1]
        print(f"sparsekmeans-{algorithm}: first-step labels not nearest to C0: {not_nearest} of {n} "
              f"({exact} differ from numpy argmin; such rows are ties); converged inertia {obj_skm:.10f} "
              f"({full['n_iter']} assignment steps, {full['n_updates']} updates) vs sklearn-{algorithm} "
              f"{obj_sk:.10f} ({sk.n_iter_} it); final labels differ: {int(np.count_nonzero(full['labels'] != sk.labels_))}")
        ok &= not_nearest == 0
    own = sparsekmeans.LloydKmeans(n_clusters=k, n_threads=1, max_iter=1, random_state=123)
    with contextlib.redirect_stdout(io.StringIO()):
        own_labels = np.asarray(own.fit(X))
    print(f"control, its own kmeans++ (no override), max_iter=1: labels not nearest to C0: "
          f"{assign_and_objective(X, C0, labels=own_labels)[2]} of {n}")
    print("init override OK" if ok else "init override FAILED")
    return 0 if ok else 1


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
