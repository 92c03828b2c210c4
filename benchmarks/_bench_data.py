"""Data, caches, atomic writes, the common objective and the memory window shared by the benchmarks.

Split from ``train_sparse.py``; the benchmarks import it as ``ts``: the datasets they read from
``../shared/data`` (news20, the 20 Newsgroups tf-idf, Fashion-MNIST) and their caches in
``benchmarks/.cache/``, scikit-learn's cached k-means++ starts, atomic writes of results and arrays, the one
objective every k-means method is scored on, and the peak-RSS window around a fit.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import resource
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
CACHE_DIR = BENCH_DIR / ".cache"
DEFAULT_DATA_DIR = REPO_DIR.parent / "shared" / "data"

INIT_SEED = 0  # scikit-learn's kmeans_plusplus(X, K, random_state=INIT_SEED): the cached starts

DATASETS = {
    "news20": {"ks": (100, 500), "desc": "LIBSVM news20 term counts, rows L2-normalised (CSR)"},
    "20news-tfidf": {"ks": (100, 500), "desc": "20 Newsgroups bydate train+test, TfidfVectorizer() (CSR)"},
    "fashion-mnist": {"ks": (64,), "desc": "Fashion-MNIST train images / 255 (dense)"},
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


def load_average():
    """1-minute load average (other busy processes make timings unreliable), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
